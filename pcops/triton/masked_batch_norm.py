"""Triton kernels of ``pcops.masked_batch_norm``: column sums over fixed chunks of rows, finished
by one small reduction kernel (deterministic: the sum order depends on the shape alone; no atomics,
no torch ops between the launches, no host sync).

Forward, 5 launches: Σ x and the count over the valid rows per 512-row chunk → mean and count;
Σ (x − mean)² → var and 1/sqrt(var + eps); the normalisation. Backward, 3 launches: Σ g and
Σ g·x̂ over all rows per chunk → their totals (∂bias, ∂weight); ∂x."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _launch

_ROWS = 512  # rows per partial sum (fixed: the sum order depends on N alone)
_BLOCK_R = 64
_BLOCK_S = 64


def _block_c(c: int) -> int:
    return max(16, min(64, _launch.next_power_of_2(c)))


@triton.jit
def _sums_kernel(x_ptr, valid_ptr, mean_ptr, part_ptr, cnt_ptr, N, C, ROWS: tl.constexpr, SQUARE: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # part[s, c] = Σ_{valid rows of chunk s} x (SQUARE: (x - mean)²), float32; cnt[s] = their count
    s = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    n = tl.zeros((BLOCK_R,), tl.float32)
    if SQUARE:
        mu = tl.load(mean_ptr + cols, mask=cm, other=0.0)
    for r0 in range(0, ROWS, BLOCK_R):
        rows = s * ROWS + r0 + tl.arange(0, BLOCK_R)
        rm = rows < N
        v = rm & (tl.load(valid_ptr + rows, mask=rm, other=0) != 0)
        m = v[:, None] & cm[None, :]
        xv = tl.load(x_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        if SQUARE:
            d = tl.where(m, xv - mu[None, :], 0.0)
            acc += d * d
        else:
            acc += xv
            n += v.to(tl.float32)
    tl.store(part_ptr + s * C + cols, tl.sum(acc, axis=0), mask=cm)
    if not SQUARE:
        if tl.program_id(1) == 0:
            tl.store(cnt_ptr + s, tl.sum(n, axis=0))


@triton.jit
def _finish_kernel(part_ptr, cntpart_ptr, cnt_ptr, out_ptr, rstd_ptr, S, C, eps, COUNT: tl.constexpr,
                   DIVIDE: tl.constexpr, RSQRT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # out[plane, c] = Σ_s part[plane, s, c] (DIVIDE: / max(count, 1)); COUNT: count = Σ_s cntpart[s]
    # first, written to cnt; RSQRT: rstd = 1 / sqrt(out + eps)
    plane = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    acc = tl.zeros((BLOCK_S, BLOCK_C), tl.float32)
    for s0 in range(0, S, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        off = (plane * S + ss).to(tl.int64)[:, None] * C + cols[None, :]
        acc += tl.load(part_ptr + off, mask=(ss < S)[:, None] & cm[None, :], other=0.0)
    tot = tl.sum(acc, axis=0)
    if COUNT:
        nacc = tl.zeros((BLOCK_S,), tl.float32)
        for s0 in range(0, S, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            nacc += tl.load(cntpart_ptr + ss, mask=ss < S, other=0.0)
        n = tl.sum(nacc, axis=0)
        if tl.program_id(0) == 0:
            tl.store(cnt_ptr, n)
    else:
        n = tl.load(cnt_ptr)
    if DIVIDE:
        tot = tot / tl.maximum(n, 1.0)
    tl.store(out_ptr + plane * C + cols, tot, mask=cm)
    if RSQRT:
        tl.store(rstd_ptr + cols, tl.rsqrt(tot + eps), mask=cm)


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
    mu = tl.load(mean_ptr + cols, mask=cm, other=0.0)
    y = (tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) - mu[None, :]) * scale[None, :]
    if HAS_B:
        y += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _grad_sums_kernel(g_ptr, x_ptr, mean_ptr, var_ptr, part_ptr, N, C, S, eps, ROWS: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # part[0, s, c] = Σ_{rows of chunk s} g, part[1, s, c] = Σ g · (x - mean) · rstd
    s = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    mu = tl.load(mean_ptr + cols, mask=cm, other=0.0)
    r = tl.rsqrt(tl.load(var_ptr + cols, mask=cm, other=0.0) + eps)
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
def _dx_kernel(g_ptr, x_ptr, valid_ptr, mean_ptr, var_ptr, w_ptr, sums_ptr, cnt_ptr, dx_ptr, N, C, eps,
               HAS_W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    # dx = w·r·(g − valid·(Σg + x̂·Σg·x̂)/n)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rm = rows < N
    cm = cols < C
    m = rm[:, None] & cm[None, :]
    off = rows.to(tl.int64)[:, None] * C + cols[None, :]
    r = tl.rsqrt(tl.load(var_ptr + cols, mask=cm, other=0.0) + eps)
    wr = r * tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32) if HAS_W else r
    sg = tl.load(sums_ptr + cols, mask=cm, other=0.0)
    sgx = tl.load(sums_ptr + C + cols, mask=cm, other=0.0)
    n = tl.maximum(tl.load(cnt_ptr), 1.0)
    v = (tl.load(valid_ptr + rows, mask=rm, other=0) != 0).to(tl.float32)
    mu = tl.load(mean_ptr + cols, mask=cm, other=0.0)
    xhat = (tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) - mu[None, :]) * r[None, :]
    g = tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32)
    dx = wr[None, :] * (g - v[:, None] * (sg[None, :] + xhat * sgx[None, :]) / n)
    tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)


def masked_batch_norm(x, valid, weight, bias, eps: float):
    """``(y, mean, var, count)`` (float32 statistics, count of valid rows as a float32 0-d
    tensor); ``x (N, C)`` contiguous, ``valid (N,)`` bool."""
    rows, c = x.shape
    s = max(1, _launch.cdiv(rows, _ROWS))
    bc = _block_c(c)
    dev = x.device
    part = torch.empty((2, s, c), dtype=torch.float32, device=dev)
    cnt_part = torch.empty(s, dtype=torch.float32, device=dev)
    stats = torch.empty((3, c), dtype=torch.float32, device=dev)  # mean, var, rstd
    count = torch.empty((), dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    if c == 0:
        return y, stats[0], stats[1], count.zero_()
    grid = (s, _launch.cdiv(c, bc))
    fin = (_launch.cdiv(c, bc), 1)
    common = dict(ROWS=_ROWS, BLOCK_R=_BLOCK_R, BLOCK_C=bc)
    _launch.launch(_sums_kernel, grid, x, valid, stats[0], part[0], cnt_part, rows, c, SQUARE=False, **common)
    _launch.launch(_finish_kernel, fin, part[0], cnt_part, count, stats[0], stats[2], s, c, float(eps), COUNT=True,
                   DIVIDE=True, RSQRT=False, BLOCK_S=_BLOCK_S, BLOCK_C=bc)  # fmt: skip
    _launch.launch(_sums_kernel, grid, x, valid, stats[0], part[1], cnt_part, rows, c, SQUARE=True, **common)
    _launch.launch(_finish_kernel, fin, part[1], cnt_part, count, stats[1], stats[2], s, c, float(eps), COUNT=False,
                   DIVIDE=True, RSQRT=True, BLOCK_S=_BLOCK_S, BLOCK_C=bc)  # fmt: skip
    if rows:
        _launch.launch(_apply_kernel, (_launch.cdiv(rows, _BLOCK_R), _launch.cdiv(c, bc)), x, stats[0], stats[2],
                       weight if weight is not None else x, bias if bias is not None else x, y, rows, c,
                       HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    return y, stats[0], stats[1], count


def masked_batch_norm_backward(grad_y, x, valid, weight, mean, var, count, eps: float):
    """``(∂x, ∂weight, ∂bias)``, the last two float32."""
    rows, c = x.shape
    s = max(1, _launch.cdiv(rows, _ROWS))
    bc = _block_c(c)
    part = torch.empty((2, s, c), dtype=torch.float32, device=x.device)
    sums = torch.empty((2, c), dtype=torch.float32, device=x.device)  # Σg, Σg·x̂
    dx = torch.empty_like(x)
    if c == 0:
        return dx, sums[1], sums[0]
    _launch.launch(_grad_sums_kernel, (s, _launch.cdiv(c, bc)), grad_y, x, mean, var, part, rows, c, s, float(eps),
                   ROWS=_ROWS, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    _launch.launch(_finish_kernel, (_launch.cdiv(c, bc), 2), part, part, count, sums, sums, s, c, 0.0, COUNT=False,
                   DIVIDE=False, RSQRT=False, BLOCK_S=_BLOCK_S, BLOCK_C=bc)  # fmt: skip
    if rows:
        _launch.launch(_dx_kernel, (_launch.cdiv(rows, _BLOCK_R), _launch.cdiv(c, bc)), grad_y, x, valid, mean, var,
                       weight if weight is not None else x, sums, count, dx, rows, c, float(eps),
                       HAS_W=weight is not None, BLOCK_R=_BLOCK_R, BLOCK_C=bc)  # fmt: skip
    return dx, sums[1], sums[0]
