"""Swish + dropout + residual in plain PyTorch: the CPU path and the test oracle (masks: ``pcops.reference._dropout``)."""

from __future__ import annotations

import torch

from ._dropout import compute_dtype


def swish_dropout_residual(
    x: torch.Tensor, residual: torch.Tensor, dropout_p: float, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """``dropout(x · sigmoid(x)) + residual`` (Swish/SiLU: Ramachandran et al., 2017)."""
    acc = compute_dtype(x.dtype)
    xf = x.to(acc)
    y = xf * torch.sigmoid(xf)
    if keep is not None:
        y = y * keep.to(acc) / (1.0 - dropout_p)
    return (y + residual.to(acc)).to(x.dtype)


def swish_dropout_backward(
    grad: torch.Tensor, x: torch.Tensor, dropout_p: float, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """Gradient w.r.t. ``x``: ``g·m/(1-p)·s·(1 + x·(1 - s))`` with ``s = sigmoid(x)`` (the residual's is ``g``)."""
    acc = compute_dtype(x.dtype)
    xf = x.to(acc)
    s = torch.sigmoid(xf)
    g = grad.to(acc)
    if keep is not None:
        g = g * keep.to(acc) / (1.0 - dropout_p)
    return (g * s * (1.0 + xf * (1.0 - s))).to(x.dtype)
