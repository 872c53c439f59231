"""Helpers shared by the fused Triton ops: Philox dropout, the keep-mask launcher, autotune timing.

Dropout draws ``tl.rand(seed, i)`` (Philox-4x32-10) for the flat element index ``i`` of the
output, so a backward regenerates the forward's mask from the seed instead of storing it; the
seed is a 1-element int64 tensor read in the kernel (CUDA-graph friendly).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
import triton.testing
from . import _launch

# elementwise kernels: elements per program (8 per thread with 4 warps: 32 B per load)
ELEMENTWISE_BLOCK = 1024

# tests only: False makes the launchers use their fixed default configs instead of
# ``triton.autotune`` (every config of a new row length is compiled and timed on first use; the
# GPU tests, which see many row lengths, switch it off and check the autotuned paths on a few)
AUTOTUNE = True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def autotuning() -> bool:
    return AUTOTUNE and not interpreting()


def quick_bench(kernel_call, quantiles):
    """Autotune timing: a short ``do_bench`` (5 ms warm-up, 20 ms of runs) per config."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def seed_arg(seed: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The seed pointer argument: any tensor when there is no dropout (never read)."""
    return like if seed is None else seed


@triton.jit
def dropout_params(seed_ptr, dropout_p, HAS_DROPOUT: tl.constexpr):
    """``(seed, 1/(1-p))`` for ``dropout``, read once per program (placeholders without dropout)."""
    if HAS_DROPOUT:
        seed = tl.load(seed_ptr)
        keep_scale = 1.0 / (1.0 - dropout_p)
    else:
        seed = 0
        keep_scale = 1.0
    return seed, keep_scale


@triton.jit
def dropout(v, seed, offs, dropout_p, keep_scale, HAS_DROPOUT: tl.constexpr):
    """``v`` kept (scaled by 1/(1-p)) or zeroed by Philox on the flat element index ``offs``:
    the forward and the backward regenerate the same mask from the same seed."""
    if HAS_DROPOUT:
        keep = tl.rand(seed, offs) >= dropout_p
        v = tl.where(keep, v * keep_scale, 0.0)
    return v


@triton.jit
def _dropout_keep_kernel(
    seed_ptr,  # (1,) int64 Philox seed
    keep_ptr,  # (numel,) int8 output: 1 = kept
    numel,
    dropout_p,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = tl.rand(tl.load(seed_ptr), offs) >= dropout_p
    tl.store(keep_ptr + offs, keep.to(tl.int8), mask=offs < numel)


def dropout_keep_mask(seed: torch.Tensor, shape, dropout_p: float) -> torch.Tensor:
    """The keep-mask the fused kernels draw for an output of ``shape`` (bool, on seed's device).

    Element ``i`` of the flattened output is kept when ``tl.rand(seed, i) >= dropout_p``.
    Used by the tests to feed the reference the very mask of the kernels.
    """
    numel = math.prod(shape)
    keep = torch.empty(numel, dtype=torch.int8, device=seed.device)
    if numel:
        _launch.launch(
            _dropout_keep_kernel,
            (_launch.cdiv(numel, ELEMENTWISE_BLOCK),),
            seed,
            keep,
            numel,
            float(dropout_p),
            BLOCK=ELEMENTWISE_BLOCK,
        )
    return keep.view(shape).bool()
