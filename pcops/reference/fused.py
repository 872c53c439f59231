"""Fused-kernel ops in plain PyTorch: the CPU path and the test oracle.

LayerNorm+GELU(+dropout), Swish+dropout+residual and CSR sparse softmax, each with its
exact backward written out by hand (so the hand-derived formulas the GPU kernels use are
themselves checked against autograd and ``gradcheck`` on the CPU).

Dropout: the GPU kernels draw their keep-mask with Triton's Philox (``tl.rand(seed, i)``
for flat element ``i``); plain torch cannot reproduce that stream, so here the mask is
either given (``keep``, a bool tensor: the tests pass the mask the Triton kernels draw) or
drawn from a CPU ``torch.Generator`` seeded with ``seed`` (``dropout_keep_mask``), which the
backward regenerates the same way. Same seed → same mask on one device; the CPU and GPU
masks differ.
"""
from __future__ import annotations

import math

import torch

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_K = 0.044715
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics and arithmetic dtype: float64 for float64 inputs, float32 for the rest."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dropout_keep_mask(seed: int, shape, p: float, device="cpu") -> torch.Tensor:
    """The CPU path's keep-mask: ``uniform(0, 1) >= p`` drawn from a generator seeded with ``seed``."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return (torch.rand(shape, generator=g) >= p).to(device)


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
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, approximate: str,
    dropout_p: float = 0.0, keep: torch.Tensor | None = None,
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
    grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
    mean: torch.Tensor, rstd: torch.Tensor, approximate: str,
    dropout_p: float = 0.0, keep: torch.Tensor | None = None,
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


def _row_ids(crow: torch.Tensor, nnz: int) -> torch.Tensor:
    lengths = (crow[1:] - crow[:-1]).long()
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=crow.device), lengths, output_size=nnz)


def sparse_softmax(values: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """Softmax of each CSR row's stored values: ``exp(v - max_row) / Σ_row exp(v - max_row)``.

    Empty rows have no output; a row whose stored values are all −inf gives zeros (not NaN).
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
    y = torch.where(total[row] > 0, e / total[row], torch.zeros_like(e))
    return y.to(values.dtype)


def sparse_softmax_backward(grad: torch.Tensor, y: torch.Tensor, crow: torch.Tensor) -> torch.Tensor:
    """``dx = y · (g - Σ_row g·y)``."""
    rows = crow.numel() - 1
    acc = compute_dtype(y.dtype)
    g, yf = grad.to(acc), y.to(acc)
    row = _row_ids(crow, y.numel())
    dot = torch.zeros(rows, dtype=acc, device=y.device).index_add_(0, row, g * yf)
    return (yf * (g - dot[row])).to(y.dtype)
