"""LayerNorm + GELU (+ dropout) in plain PyTorch: the CPU path and the test oracle.

The backward is written out by hand (so the formulas the GPU kernels use are themselves checked
against autograd and ``gradcheck`` on the CPU). Dropout masks: see ``pcops.reference._dropout``.
"""

from __future__ import annotations

import math

import torch

from ._dropout import compute_dtype, dropout_keep_mask  # noqa: F401  (dropout_keep_mask: re-exported for tests)

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_K = 0.044715
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def gelu(z: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU (Hendrycks & Gimpel, 2016): exact ``z·Φ(z)`` (``"none"``) or its tanh form (``"tanh"``)."""
    if approximate == "tanh":
        return 0.5 * z * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (z + _GELU_TANH_K * z * z * z)))
    return 0.5 * z * (1.0 + torch.erf(z * _INV_SQRT_2))


def gelu_grad(z: torch.Tensor, approximate: str) -> torch.Tensor:
    """d gelu / dz."""
    if approximate == "tanh":
        t = torch.tanh(_SQRT_2_OVER_PI * (z + _GELU_TANH_K * z * z * z))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_K * z * z)
    return 0.5 * (1.0 + torch.erf(z * _INV_SQRT_2)) + z * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI


def layer_norm_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    approximate: str,
    dropout_p: float = 0.0,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``gelu(layer_norm(x)) · keep / (1 - p)`` over the last dim of ``x (M, N)``.

    Returns ``(y (M, N) x.dtype, mean (M,), rstd (M,))`` with statistics in float32 (float64
    for float64 input); ``rstd = 1 / sqrt(var + eps)`` with the biased variance, as ``F.layer_norm``.
    """
    acc = compute_dtype(x.dtype)
    xf = x.to(acc)
    mean = xf.mean(-1)
    var = (xf - mean[:, None]).square().mean(-1)
    rstd = torch.rsqrt(var + eps)
    z = (xf - mean[:, None]) * rstd[:, None] * weight.to(acc) + bias.to(acc)
    y = gelu(z, approximate)
    if keep is not None:
        y = y * keep.to(acc) / (1.0 - dropout_p)
    return y.to(x.dtype), mean, rstd


def layer_norm_gelu_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    approximate: str,
    dropout_p: float = 0.0,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact gradients ``(dx, dweight, dbias)`` of ``layer_norm_gelu`` (all three derivatives).

    With ``x̂ = (x - μ)·r``, ``z = x̂·w + b``, ``y = gelu(z)·m/(1-p)``:
    ``dz = g·m/(1-p)·gelu'(z)``, ``dw = Σ_rows dz·x̂``, ``db = Σ_rows dz``,
    ``dx = r·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂))`` with ``dx̂ = dz·w``.
    """
    acc = compute_dtype(x.dtype)
    xhat = (x.to(acc) - mean[:, None]) * rstd[:, None]
    w = weight.to(acc)
    z = xhat * w + bias.to(acc)
    g = grad_y.to(acc)
    if keep is not None:
        g = g * keep.to(acc) / (1.0 - dropout_p)
    dz = g * gelu_grad(z, approximate)
    dweight = (dz * xhat).sum(0)
    dbias = dz.sum(0)
    dxhat = dz * w
    dx = rstd[:, None] * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dweight.to(weight.dtype), dbias.to(bias.dtype)
