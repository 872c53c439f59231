"""Launchers for ``csrc/sparse_softmax.cu`` (CSR row softmax, CUDA C++ compiled at run time with NVRTC).

Group shapes (``VARIANTS``): a group of ``SUB`` lanes owns a row of at most ``SUB · VPT``
entries (held in registers); ``32 / SUB`` rows per warp, 8 warps per block; longer rows are
done by the whole block. ``variant=None`` picks, from the mean row length (``nnz / rows``,
known on the host: no synchronisation), the smallest group whose capacity covers
``1.9·mean`` (≈ the longest row when lengths are uniform on ``1..L``: ``2·mean − 1``, with
room for the sample mean's noise): Q1 (lengths 1..64, mean ≈ 32.5) → ``"g8x8"``, 4 rows of
≤ 64 per warp (the shapes' Q1 times are in ``benchmarks/NOTES.md``). One entry point per
direction and value type; the shape and the crow index type are run-time arguments.
"""

from __future__ import annotations

import ctypes

import torch

from .._backend import log_kernel
from .._nvrtc import get_kernel

_WARPS = 8  # warps per block; must match WARPS in the .cu source
_THREADS = 32 * _WARPS
_VALUE_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# name → (SUB lanes per row, VPT values per lane): the kernels' ``sub`` argument selects g{SUB}x{VPT}
VARIANTS = {"g32x4": (32, 4), "g4x8": (4, 8), "g8x8": (8, 8), "g16x8": (16, 8)}
# the automatic choice, smallest capacity first (g32x4, capacity 128, for the longest rows)
_AUTO_ORDER = ("g4x8", "g8x8", "g16x8", "g32x4")
# the longest row expected per unit of mean length (uniform lengths: 2·mean − 1, less a margin
# for the sample mean's noise: Q1's is 32.52, which 2·mean − 1 would send to g16x8)
_LONGEST_PER_MEAN = 1.9


def choose_variant(rows: int, nnz: int) -> str:
    """The group shape for ``rows`` rows and ``nnz`` entries (see the module docstring)."""
    longest = _LONGEST_PER_MEAN * nnz / max(rows, 1)
    for name in _AUTO_ORDER:
        sub, vpt = VARIANTS[name]
        if sub * vpt >= longest:
            return name
    return _AUTO_ORDER[-1]


def _kernel(direction: str, values: torch.Tensor, crow: torch.Tensor, variant: str):
    if values.dtype not in _VALUE_SUFFIX:
        raise TypeError(f"values: the CUDA C++ backend takes float32/float16/bfloat16, got {values.dtype}")
    if crow.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"crow_indices: expected int32 or int64, got {crow.dtype}")
    name = f"sparse_softmax_{direction}_{_VALUE_SUFFIX[values.dtype]}"
    log_kernel("sparse_softmax", f"{name} {variant}")
    return get_kernel("sparse_softmax.cu", name, values.device)


def _shape_args(crow: torch.Tensor, variant: str) -> list:
    return [ctypes.c_int(crow.dtype == torch.int64), ctypes.c_int(VARIANTS[variant][0])]


def _plan(rows: int, nnz: int, variant: str | None) -> tuple[str, tuple[int]]:
    if variant is None:
        variant = choose_variant(rows, nnz)
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected None or one of {tuple(VARIANTS)}, got {variant!r}")
    rows_per_block = _WARPS * 32 // VARIANTS[variant][0]
    return variant, ((rows + rows_per_block - 1) // rows_per_block,)


def sparse_softmax(values: torch.Tensor, crow: torch.Tensor, *, variant: str | None = None) -> torch.Tensor:
    """Same contract as ``pcops.triton.sparse_softmax.sparse_softmax``: one launch, no host synchronisation.

    Args:
        values: ``(nnz,)`` contiguous float32/float16/bfloat16 on a CUDA device.
        crow: ``(rows + 1,)`` int32/int64 contiguous (row ranges clamped to ``[0, nnz]``).
        variant: a key of ``VARIANTS`` or None (chosen from the mean row length).
    Returns:
        ``(nnz,)`` like ``values``.
    """
    out = torch.empty_like(values)
    rows, nnz = crow.numel() - 1, values.numel()
    if rows > 0 and nnz > 0:
        variant, grid = _plan(rows, nnz, variant)
        _kernel("fwd", values, crow, variant)(
            grid,
            (_THREADS,),
            [values, crow, out, ctypes.c_longlong(rows), ctypes.c_longlong(nnz), *_shape_args(crow, variant)],
        )
    return out


def sparse_softmax_backward(
    grad: torch.Tensor, y: torch.Tensor, crow: torch.Tensor, *, variant: str | None = None
) -> torch.Tensor:
    """``dx = y·(g - Σ_row g·y)``; grad and y ``(nnz,)`` contiguous, same dtype. One launch."""
    dx = torch.empty_like(y)
    rows, nnz = crow.numel() - 1, y.numel()
    if rows > 0 and nnz > 0:
        variant, grid = _plan(rows, nnz, variant)
        _kernel("bwd", y, crow, variant)(
            grid,
            (_THREADS,),
            [grad, y, crow, dx, ctypes.c_longlong(rows), ctypes.c_longlong(nnz), *_shape_args(crow, variant)],
        )
    return dx
