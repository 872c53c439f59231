"""Triton kernels of ``pcops.masked_batch_norm``: column sums over fixed chunks of rows
(deterministic: partial sums per chunk, added by one ``torch.sum`` in a fixed order), then one
elementwise pass. Forward: Σ x over the valid rows → mean, Σ (x − mean)² → var (two passes, float32),
the normalisation; backward: Σ g and Σ g·x̂ over all rows, then ∂x. No atomics, no host sync."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _launch

_ROWS = 512  # rows per partial sum (fixed: the sum order depends on N alone)
_BLOCK_R = 64


def _block_c(c: int) -> int:
    return max(16, min(64, triton.next_power_of_2(c)))


@triton.jit
def _stats_kernel(x_ptr, valid_ptr, mean_ptr, part_ptr, N, C, ROWS: tl.constexpr, SQUARE: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # part[s, c] = Σ_{valid rows of chunk s} x (SQUARE: (x - mean)²), float32
    s = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    mu = tl.load(mean_ptr + cols, mask=cm, other=0.0)
    acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for r0 in range(0, ROWS, BLOCK_R):
        rows = s * ROWS + r0 + tl.arange(0, BLOCK_R)
        rm = rows < N
        v = tl.load(valid_ptr + rows, mask=rm, other=0) != 0
        m = (rm & v)[:, None] & cm[None, :]
        xv = tl.load(x_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        if SQUARE:
            d = tl.where(m, xv - mu[None, :], 0.0)
            acc += d * d
        else:
            acc += xv
    tl.store(part_ptr + s * C + cols, tl.sum(acc, axis=0), mask=cm)


@triton.jit
def _grad_sums_kernel(g_ptr, x_ptr, mean_ptr, rstd_ptr, part_ptr, N, C, S, ROWS: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # part[0, s, c] = Σ_{rows of chunk s} g, part[1, s, c] = Σ g · (x - mean) · rstd
    s = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    mu = tl.load(mean_ptr + cols, mask=cm, other=0.0)
    r = tl.load(rstd_ptr + cols, mask=cm, other=0.0)
    acc_g = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    acc_gx = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for r0 in range(0, ROWS, BLOCK_R):
        rows = s * ROWS + r0 + tl.arange(0, BLOCK_R)
        m = (rows < N)[:, None] & cm[None, :]
        off = rows.to(tl.int64)[:, None] * C + cols[None, :]
        g = tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32)
        xv = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        acc_g += g
        acc_gx += g * ((xv - mu[None, :]) * r[None, :])
    tl.store(part_ptr + s * C + cols, tl.sum(acc_g, axis=0), mask=cm)
    tl.store(part_ptr + (S + s) * C + cols, tl.sum(acc_gx, axis=0), mask=cm)


@triton.jit
def _apply_kernel(x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, y_ptr, N, C, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    m = (rows < N)[:, None] & cm[None, :]
    off = rows.to(tl.int64)[:, None] * C + cols[None, :]
    scale = tl.load(rstd_ptr + cols, mask=cm, other=0.0)
    if HAS_W:
        scale *= tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    y = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) - tl.load(mean_ptr + cols, mask=cm, other=0.0)[None, :]
    y = y * scale[None, :]
    if HAS_B:
        y += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _dx_kernel(g_ptr, x_ptr, valid_ptr, mean_ptr, rstd_ptr, w_ptr, sums_ptr, n_ptr, dx_ptr, N, C,
               HAS_W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # dx = w·r·(g − valid·(Σg + x̂·Σg·x̂)/n)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rm = rows < N
    cm = cols < C
    m = rm[:, None] & cm[None, :]
    off = rows.to(tl.int64)[:, None] * C + cols[None, :]
    r = tl.load(rstd_ptr + cols, mask=cm, other=0.0)
    wr = r * tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32) if HAS_W else r
    sg = tl.load(sums_ptr + cols, mask=cm, other=0.0)
    sgx = tl.load(sums_ptr + C + cols, mask=cm, other=0.0)
    n = tl.load(n_ptr)
    v = (tl.load(valid_ptr + rows, mask=rm, other=0) != 0).to(tl.float32)
    xhat = (
        tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) - tl.load(mean_ptr + cols, mask=cm, other=0.0)[None, :]
    ) * r[None, :]
    g = tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32)
    dx = wr[None, :] * (g - v[:, None] * (sg[None, :] + xhat * sgx[None, :]) / n)
    tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)


def _count(valid: torch.Tensor) -> torch.Tensor:
    return valid.sum().to(torch.float32).clamp(min=1)


def _column_sum(x, valid, mean, n, square: bool) -> torch.Tensor:
    rows, c = x.shape
    s = triton.cdiv(rows, _ROWS)
    part = torch.empty((s, c), dtype=torch.float32, device=x.device)
    if s:
        bc = _block_c(c)
        _launch.launch(_stats_kernel, (s, triton.cdiv(c, bc)), x, valid, mean, part, rows, c, ROWS=_ROWS,
                       SQUARE=square, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    return part.sum(0) / n


def masked_batch_norm(x, valid, weight, bias, eps: float):
    """``(y, mean, var)`` (float32 statistics); ``x (N, C)`` contiguous, ``valid (N,)`` bool."""
    rows, c = x.shape
    n = _count(valid)
    zero = torch.zeros(c, dtype=torch.float32, device=x.device)
    mean = _column_sum(x, valid, zero, n, False)
    var = _column_sum(x, valid, mean, n, True)
    rstd = torch.rsqrt(var + eps)
    y = torch.empty_like(x)
    if rows and c:
        bc = _block_c(c)
        _launch.launch(_apply_kernel, (triton.cdiv(rows, _BLOCK_R), triton.cdiv(c, bc)), x, mean, rstd,
                       weight if weight is not None else x, bias if bias is not None else x, y, rows, c,
                       HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    return y, mean, var


def masked_batch_norm_backward(grad_y, x, valid, weight, mean, var, eps: float):
    """``(∂x, ∂weight, ∂bias)``, the last two float32."""
    rows, c = x.shape
    rstd = torch.rsqrt(var + eps)
    s = triton.cdiv(rows, _ROWS)
    part = torch.empty((2, s, c), dtype=torch.float32, device=x.device)
    bc = _block_c(c)
    if s:
        _launch.launch(_grad_sums_kernel, (s, triton.cdiv(c, bc)), grad_y, x, mean, rstd, part, rows, c, s,
                       ROWS=_ROWS, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    sums = part.sum(1)  # (2, C): Σg, Σg·x̂
    dx = torch.empty_like(x)
    if rows and c:
        _launch.launch(_dx_kernel, (triton.cdiv(rows, _BLOCK_R), triton.cdiv(c, bc)), grad_y, x, valid, mean, rstd,
                       weight if weight is not None else x, sums, _count(valid), dx, rows, c,
                       HAS_W=weight is not None, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    return dx, sums[1], sums[0]
