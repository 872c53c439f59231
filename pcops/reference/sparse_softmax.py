"""Softmax over the stored values of CSR rows in plain PyTorch: the CPU path and the test oracle."""

from __future__ import annotations

import math

import torch

from ._dropout import compute_dtype


def _row_ids(crow: torch.Tensor, nnz: int) -> torch.Tensor:
    lengths = (crow[1:] - crow[:-1]).long()
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=crow.device), lengths, output_size=nnz)


def sparse_softmax(values: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """Softmax of each CSR row's stored values: ``exp(v - max_row) / Σ_row exp(v - max_row)``.

    Empty rows have no output; a row whose stored values are all −inf gives zeros (not NaN); a
    row holding a NaN or +inf gives NaN in every entry (as ``torch.softmax``).
    ``crow (rows + 1,)`` must be valid (checked by the public function).
    """
    rows = crow.numel() - 1
    acc = compute_dtype(values.dtype)
    v = values.to(acc)
    row = _row_ids(crow, values.numel())
    vmax = torch.full((rows,), -math.inf, dtype=acc, device=v.device)
    vmax = vmax.scatter_reduce(0, row, v, reduce="amax", include_self=True)
    # an all −inf row has max −inf: subtract 0 instead, so exp gives 0 rather than NaN
    vmax = torch.where(torch.isneginf(vmax), torch.zeros_like(vmax), vmax)
    e = torch.exp(v - vmax[row])
    total = torch.zeros(rows, dtype=acc, device=v.device).index_add_(0, row, e)
    # an all −inf row sums to 0 and gives zeros; a NaN or +inf value makes the sum NaN, and the
    # whole row NaN (as torch.softmax)
    y = torch.where(total[row] == 0, torch.zeros_like(e), e / total[row])
    return y.to(values.dtype)


def sparse_softmax_backward(grad: torch.Tensor, y: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """``dx = y · (g - Σ_row g·y)``."""
    rows = crow.numel() - 1
    acc = compute_dtype(y.dtype)
    g, yf = grad.to(acc), y.to(acc)
    row = _row_ids(crow, y.numel())
    dot = torch.zeros(rows, dtype=acc, device=y.device).index_add_(0, row, g * yf)
    return (yf * (g - dot[row])).to(y.dtype)
