"""Reference of ``pcops.masked_batch_norm``: training-mode batch norm with the statistics of the
valid rows only (plain torch, any device; statistics in float32, float64 kept)."""

from __future__ import annotations

from typing import Optional

import torch


def _acc(x: torch.Tensor) -> torch.dtype:
    """The statistics' dtype: float64 for float64 ``x``, else float32 (also the fake functions')."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def masked_batch_norm(
    x: torch.Tensor, valid: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, mean, var, count)``: ``mean``/``var`` (biased) over the ``count`` rows where ``valid``
    (a 0-d tensor of the statistics' dtype); every row normalised with them,
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``."""
    xf = x.to(_acc(x))
    w = valid.to(xf.dtype)[:, None]
    count = valid.sum().to(xf.dtype)
    n = count.clamp(min=1)
    mean = (xf * w).sum(0) / n
    var = ((xf - mean).square() * w).sum(0) / n
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype), mean, var, count


def masked_batch_norm_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    valid: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    var: torch.Tensor,
    count: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(∂x, ∂weight, ∂bias)`` of the forward above. Every row's output depends on the valid rows'
    statistics, so the sums run over all rows and the statistics' share goes to the valid rows:
    ``∂x = w·r·(g − valid·(Σg + x̂·Σg·x̂)/n)`` with ``r = 1/sqrt(var + eps)``, ``x̂ = (x − mean)·r``;
    ``∂weight = Σg·x̂``, ``∂bias = Σg``."""
    acc = _acc(x)
    r = torch.rsqrt(var + eps)
    xhat = (x.to(acc) - mean) * r
    g = grad_y.to(acc)
    n = count.to(acc).clamp(min=1)
    sg, sgx = g.sum(0), (g * xhat).sum(0)
    wr = r * weight.to(acc) if weight is not None else r
    dx = wr * (g - valid.to(acc)[:, None] * (sg + xhat * sgx) / n)
    return dx.to(x.dtype), sgx, sg
