"""Triton kernels for ``dropout(x · sigmoid(x)) + residual`` and its backward (Swish/SiLU).

Elementwise and memory-bound: each kernel reads its inputs once and writes its output once, in
float32 registers; dropout draws Philox on the flat element index (``_fused_common``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._fused_common import ELEMENTWISE_BLOCK, seed_arg
from . import _launch


@triton.jit
def _swish_dropout_residual_kernel(
    x_ptr,  # (numel,) contiguous
    res_ptr,  # (numel,) residual, dtype of x
    y_ptr,  # (numel,) output
    seed_ptr,  # (1,) int64 Philox seed (read only when HAS_DROPOUT)
    numel,
    dropout_p,
    HAS_DROPOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.sigmoid(x)
    if HAS_DROPOUT:
        keep = tl.rand(tl.load(seed_ptr), offs) >= dropout_p
        y = tl.where(keep, y / (1.0 - dropout_p), 0.0)
    y += tl.load(res_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _swish_dropout_bwd_kernel(
    dy_ptr,  # (numel,) upstream gradient
    x_ptr,  # (numel,) forward input
    dx_ptr,  # (numel,) output
    seed_ptr,  # (1,) int64 Philox seed of the forward
    numel,
    dropout_p,
    HAS_DROPOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        keep = tl.rand(tl.load(seed_ptr), offs) >= dropout_p
        g = tl.where(keep, g / (1.0 - dropout_p), 0.0)
    s = tl.sigmoid(x)
    # d(x·s)/dx = s + x·s·(1 - s)
    tl.store(dx_ptr + offs, (g * s * (1.0 + x * (1.0 - s))).to(dx_ptr.dtype.element_ty), mask=ok)


def swish_dropout_residual(
    x: torch.Tensor, residual: torch.Tensor, dropout_p: float, seed: torch.Tensor | None
) -> torch.Tensor:
    """``dropout(x·sigmoid(x)) + residual`` elementwise.

    Args:
        x, residual: contiguous, same shape and dtype (float32/float16/bfloat16).
        dropout_p: in [0, 1); seed: ``(1,)`` int64 on x's device, or None for no dropout.
    Returns:
        a tensor like ``x``; one launch, no host synchronisation.
    """
    y = torch.empty_like(x)
    numel = x.numel()
    if numel:
        _launch.launch(
            _swish_dropout_residual_kernel,
            (_launch.cdiv(numel, ELEMENTWISE_BLOCK),),
            x,
            residual,
            y,
            seed_arg(seed, x),
            numel,
            float(dropout_p),
            HAS_DROPOUT=seed is not None,
            BLOCK=ELEMENTWISE_BLOCK,
            num_warps=4,
        )
    return y


def swish_dropout_backward(
    grad: torch.Tensor, x: torch.Tensor, dropout_p: float, seed: torch.Tensor | None
) -> torch.Tensor:
    """Gradient of ``swish_dropout_residual`` w.r.t. ``x`` (the mask regenerated from ``seed``)."""
    dx = torch.empty_like(x)
    numel = x.numel()
    if numel:
        _launch.launch(
            _swish_dropout_bwd_kernel,
            (_launch.cdiv(numel, ELEMENTWISE_BLOCK),),
            grad,
            x,
            dx,
            seed_arg(seed, x),
            numel,
            float(dropout_p),
            HAS_DROPOUT=seed is not None,
            BLOCK=ELEMENTWISE_BLOCK,
            num_warps=4,
        )
    return dx
