"""Launchers for ``csrc/sparse_softmax.cu`` (CSR row softmax, CUDA C++ compiled at run time with NVRTC)."""
from __future__ import annotations

import ctypes

import torch

from .._nvrtc import get_kernel

_WARPS = 8  # rows per block (one warp each); must match WARPS in the .cu source
_THREADS = 32 * _WARPS
_VALUE_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_INDEX_SUFFIX = {torch.int32: "i32", torch.int64: "i64"}


def _kernel(direction: str, values: torch.Tensor, crow: torch.Tensor):
    if values.dtype not in _VALUE_SUFFIX:
        raise TypeError(f"values: the CUDA C++ backend takes float32/float16/bfloat16, got {values.dtype}")
    name = f"sparse_softmax_{direction}_{_VALUE_SUFFIX[values.dtype]}_{_INDEX_SUFFIX[crow.dtype]}"
    return get_kernel("sparse_softmax.cu", name, values.device)


def sparse_softmax(values: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """Same contract as ``pcops.triton.fused.sparse_softmax``: one launch, no host synchronisation.

    Args:
        values: ``(nnz,)`` contiguous float32/float16/bfloat16 on a CUDA device.
        crow: ``(rows + 1,)`` int32/int64 contiguous (row ranges clamped to ``[0, nnz]``).
    Returns:
        ``(nnz,)`` like ``values``.
    """
    out = torch.empty_like(values)
    rows, nnz = crow.numel() - 1, values.numel()
    if rows > 0 and nnz > 0:
        _kernel("fwd", values, crow)(
            ((rows + _WARPS - 1) // _WARPS,), (_THREADS,),
            [values, crow, out, ctypes.c_longlong(rows), ctypes.c_longlong(nnz)],
        )
    return out


def sparse_softmax_backward(grad: torch.Tensor, y: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """``dx = y·(g - Σ_row g·y)``; grad and y ``(nnz,)`` contiguous, same dtype. One launch."""
    dx = torch.empty_like(y)
    rows, nnz = crow.numel() - 1, y.numel()
    if rows > 0 and nnz > 0:
        _kernel("bwd", y, crow)(
            ((rows + _WARPS - 1) // _WARPS,), (_THREADS,),
            [grad, y, crow, dx, ctypes.c_longlong(rows), ctypes.c_longlong(nnz)],
        )
    return dx
