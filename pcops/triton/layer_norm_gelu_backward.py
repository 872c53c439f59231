"""Triton kernels for the backward of the fused LayerNorm + GELU (+ dropout).

Exact gradients w.r.t. ``x``, ``weight`` and ``bias``: x̂ and gelu'(z) recomputed from ``x`` and
the forward's ``mean``/``rstd``, the dropout mask regenerated from the seed. ``dweight``/``dbias``
are summed over rows in two fixed-order stages (per-program partial rows, then
``_column_sum_kernel``): no atomics, reproducible. 2 launches, no host sync.

- Rows ≤ ``_TILED_MAX_N`` wide: ``_layer_norm_gelu_bwd_tiled_kernel``, a persistent grid of row
  tiles (below). Bytes: ``3·M·N·size`` plus ``2·G·N·4`` twice for the partials.
- Wider rows: ``_layer_norm_gelu_bwd_kernel``, ``G`` = 8 per SM contiguous row ranges, autotuned
  (rows wider than the forward's ``_MAX_BLOCK_N`` in two passes of chunks).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import _backend
from . import _launch
from . import _fused_common as _common
from ._fused_common import dropout, dropout_params, quick_bench, seed_arg
from .layer_norm_gelu_column_sum import _column_sum, _column_sum_kernel, column_sum_config
from .layer_norm_gelu import (
    _BWD_SPACE,
    _C,
    _CK,
    _GELU_A0,
    _GELU_A1,
    _INV_SQRT_2,
    _K,
    _ROW_CONFIGS,
    FAST_TANH_BWD_DTYPES,
    _default_block_m,
    _default_warps,
    _fast_div,
    _fast_tanh,
    _prune_rows,
    _row_block_n,
    _tanh_approx,
)

_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
_GELU_B0 = tl.constexpr(2.0 * _C)  # 2u' = B0 + B1·z²
_GELU_B1 = tl.constexpr(6.0 * _C * _K)
_CK3 = tl.constexpr(3.0 * _C * _K)  # the hardware-tanh form: u' = c + 3·c·k·z²

# backward programs per SM: each walks a contiguous range of rows, so G is bounded and the
# partial sums stay small (G·N·8 bytes, ≈ 2 MB for N = 256 on 132 SMs, 1 % of L2's traffic);
# 8 per SM lets low-register configs keep all programs resident (no tail wave) while
# high-register ones run in 2-3 even waves
_BWD_PROGRAMS_PER_SM = 8


@triton.jit
def _gelu_grad(z, APPROX_TANH: tl.constexpr, LEAN: tl.constexpr = False, FAST_TANH: tl.constexpr = False):
    if APPROX_TANH and FAST_TANH:
        # t = tanh(u) in hardware: gelu' = 0.5·(1 + t) + 0.5·z·(1 - t²)·u', u' = c + 3·c·k·z²
        # (one MUFU instead of ex2 + rcp; 1 - t² as fma(-t, t, 1))
        z2 = z * z
        t = _tanh_approx(z * (_C + _CK * z2))
        hz = 0.5 * z
        d = (0.5 + 0.5 * t) + (hz * (_C + _CK3 * z2)) * (1.0 - t * t)
    elif APPROX_TANH and LEAN:
        # the forward's folded exp2 form and 2u' = B0 + B1·z²: gelu' = s + (z·s)·(1 - s)·(B0 + B1·z²)
        # (z·s first: 0 for very negative z, never 0·inf). Fewer instructions than the form
        # below; ptxas keeps 8 more registers live, hence the tiled backward's register cap.
        z2 = z * z
        s = _fast_div(1.0, 1.0 + tl.exp2(z * (_GELU_A0 + _GELU_A1 * z2)))
        d = s + (z * s) * (1.0 - s) * (_GELU_B0 + _GELU_B1 * z2)
    elif APPROX_TANH:
        # with s = sigmoid(2u): 0.5·(1 + t) = s and 1 - t² = 4·s·(1 - s)
        u = _C * (z + _K * z * z * z)
        s = _fast_div(1.0, 1.0 + tl.exp(-2.0 * u))
        d = s + 2.0 * z * s * (1.0 - s) * _C * (1.0 + 3.0 * _K * z * z)
    else:
        d = 0.5 * (1.0 + tl.math.erf(z * _INV_SQRT_2)) + z * tl.exp(-0.5 * z * z) * _INV_SQRT_2PI
    return d


@triton.jit
def _bwd_tile(
    x,
    g,
    offs,
    mean,
    rstd,
    w,
    b,
    seed,
    dropout_p,
    keep_scale,
    HAS_DROPOUT: tl.constexpr,
    APPROX_TANH: tl.constexpr,
    LEAN: tl.constexpr = False,
    FAST_TANH: tl.constexpr = False,
):
    """One backward tile (float32 ``x``, ``g``): ``(x̂, dz)`` with x̂ recomputed from the saved
    statistics and ``dz = g·gelu'(z)`` at the recomputed pre-activation ``z = x̂·w + b``
    (``g`` first goes back through the dropout mask). Masked-off elements (loaded as ``x = g =
    0``, ``w = b = 0``, ``mean = rstd = 0`` past the last row) get a finite x̂ and ``dz = 0``, so
    they add nothing to the row sums ``Σ dz·w·x̂``, ``Σ dz·w`` or the column sums: no mask needed."""
    g = dropout(g, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
    xhat = (x - mean[:, None]) * rstd[:, None]
    dz = g * _gelu_grad(xhat * w[None, :] + b[None, :], APPROX_TANH, LEAN, FAST_TANH)
    return xhat, dz


@triton.jit
def _bwd_dx(dz, xhat, w, rstd, N, inv_n, LEAN: tl.constexpr = False):
    """``dx = rstd·(dx̂ - x̂·mean(dx̂·x̂) - mean(dx̂))`` with ``dx̂ = dz·w`` (row sums over axis 1);
    ``LEAN``: as ``dx̂·rstd - (x̂·a + c)`` with the per-row ``a = rstd·mean(dx̂·x̂)``, ``c = rstd·mean(dx̂)``,
    the means through ``inv_n = 1/N`` computed once per program (a division by the run-time N
    costs ~8 instructions per tile)."""
    dxhat = dz * w[None, :]
    if LEAN:
        r = rstd * inv_n
        a = tl.sum(dxhat * xhat, axis=1) * r
        c = tl.sum(dxhat, axis=1) * r
        dx = dxhat * rstd[:, None] - (xhat * a[:, None] + c[:, None])
    else:
        c1 = tl.sum(dxhat * xhat, axis=1) / N
        c2 = tl.sum(dxhat, axis=1) / N
        dx = (dxhat - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    return dx


@triton.jit
def _layer_norm_gelu_bwd_kernel(
    dy_ptr,  # (M, N) upstream gradient, dtype of x
    x_ptr,  # (M, N) forward input
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    mean_ptr,  # (M,) float32 saved by the forward
    rstd_ptr,  # (M,) float32 saved by the forward
    seed_ptr,  # (1,) int64 Philox seed of the forward (read only when HAS_DROPOUT)
    dx_ptr,  # (M, N) output
    dw_part_ptr,  # (G, N) float32 output: this program's column sums of dz·x̂
    db_part_ptr,  # (G, N) float32 output: this program's column sums of dz
    M,  # rows
    N,  # row length (the autotune key)
    rows_per_program,  # each of the G programs owns rows [pid·rpp, (pid+1)·rpp)
    dropout_p,
    APPROX_TANH: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    ONE_TILE: tl.constexpr,  # BLOCK_N >= N
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per step (autotuned)
):
    pid = tl.program_id(0)
    row_begin = pid * rows_per_program
    row_end = tl.minimum(row_begin + rows_per_program, M)
    part_off = pid.to(tl.int64) * N
    seed, keep_scale = dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
    if ONE_TILE:
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for r0 in range(row_begin, row_end, BLOCK_M):
            rows = r0 + tl.arange(0, BLOCK_M)
            row_ok = rows < row_end
            mask = row_ok[:, None] & col_ok[None, :]
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            xhat, dz = _bwd_tile(x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale, HAS_DROPOUT, APPROX_TANH)
            dw_acc += tl.sum(dz * xhat, axis=0)
            db_acc += tl.sum(dz, axis=0)
            # the normalisation derivative: dx = rstd · (dx̂ - mean(dx̂) - x̂ · mean(dx̂ · x̂))
            dx = _bwd_dx(dz, xhat, w, rstd, N, 0.0)
            tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dw_part_ptr + part_off + cols, dw_acc, mask=col_ok)
        tl.store(db_part_ptr + part_off + cols, db_acc, mask=col_ok)
    else:
        # wide rows: the program's partial-sum row lives in memory (owned by this program only)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            zero = tl.zeros([BLOCK_N], dtype=tl.float32)
            tl.store(dw_part_ptr + part_off + cols, zero, mask=cols < N)
            tl.store(db_part_ptr + part_off + cols, zero, mask=cols < N)
        for r0 in range(row_begin, row_end, BLOCK_M):
            rows = r0 + tl.arange(0, BLOCK_M)
            row_ok = rows < row_end
            row_off = rows.to(tl.int64) * N
            mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
            # pass 1: the two row sums of the normalisation derivative
            s1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            s2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for c0 in range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                mask = row_ok[:, None] & col_ok[None, :]
                offs = row_off[:, None] + cols[None, :]
                w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                xhat, dz = _bwd_tile(
                    x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale, HAS_DROPOUT, APPROX_TANH
                )
                dxhat = dz * w[None, :]
                s1 += dxhat * xhat
                s2 += dxhat
            c1 = tl.sum(s1, axis=1) / N
            c2 = tl.sum(s2, axis=1) / N
            # pass 2: dx and the column partial sums
            for c0 in range(0, N, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                mask = row_ok[:, None] & col_ok[None, :]
                offs = row_off[:, None] + cols[None, :]
                w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                xhat, dz = _bwd_tile(
                    x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale, HAS_DROPOUT, APPROX_TANH
                )
                dxhat = dz * w[None, :]
                dx = (dxhat - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                pw = tl.load(dw_part_ptr + part_off + cols, mask=col_ok, other=0.0)
                pb = tl.load(db_part_ptr + part_off + cols, mask=col_ok, other=0.0)
                tl.store(dw_part_ptr + part_off + cols, pw + tl.sum(dz * xhat, axis=0), mask=col_ok)
                tl.store(db_part_ptr + part_off + cols, pb + tl.sum(dz, axis=0), mask=col_ok)


_layer_norm_gelu_bwd_tuned = triton.autotune(
    configs=_ROW_CONFIGS,
    key=["N"],
    prune_configs_by={"early_config_prune": _prune_rows(**_BWD_SPACE)},
    do_bench=quick_bench,
)(_layer_norm_gelu_bwd_kernel)


# --- backward, rows ≤ _TILED_MAX_N: persistent row tiles ----------------------------------------
# Faster than the row-range kernel on rows that fit one tile (benchmarks/NOTES.md):
# - few registers (4-8 values per thread) so many programs share an SM, and a persistent grid:
#   G = SMs × as many programs as can reside at once (from the loaded kernel's register count),
#   each walking the aligned row tiles pid, pid + G, … (no ragged ranges, no second wave);
# - the x/dy tiles of the next step are loaded before the current one is computed, so every
#   program keeps a tile of loads in flight;
# - dweight/dbias partials accumulate in a [BLOCK_M, BLOCK_N] float32 register tile, reduced
#   over rows once per program (no cross-warp reduction every step); the column-sum kernel adds
#   the G partial rows. The result is deterministic for a given device (G depends on the SMs).
# - the lean maths (the forward's folded exp2 GELU form, a fast division, 1/N hoisted), held
#   to the plain maths' 72 registers on 16-bit rows of 8 values per thread without dropout
#   (``_TILED_MAXNREG16``; checked spill-free with ptxas for sm_90 by the compile test).
# Tile: 4 values per thread (raised up to 8 so a warp spans a row: the row sums are warp
# shuffles), 4 warps (more for rows wider than 4 · 32 · 4), BLOCK_M = per_thread · 32 · warps / BLOCK_N.
_TILED_MAX_N = 1024
_TILED_PER_THREAD = 4
_TILED_WARPS = 4
_TILED_MAXNREG16 = 72


@triton.jit
def _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs, rows, col_ok, M):
    """Raw ``x``, ``dy`` tiles at element offsets ``offs`` of ``rows`` and the rows' ``mean``,
    ``rstd`` (zeros past row M / column N). (A column mask dropped when N == BLOCK_N costs
    ptxas 16 more registers here, so the mask stays.)"""
    row_ok = rows < M
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    g = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    return x, g, mean, rstd


@triton.jit(do_not_specialize=["num_programs"])
def _layer_norm_gelu_bwd_tiled_kernel(
    dy_ptr,  # (M, N) upstream gradient, dtype of x
    x_ptr,  # (M, N) forward input
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    mean_ptr,  # (M,) float32 saved by the forward
    rstd_ptr,  # (M,) float32 saved by the forward
    seed_ptr,  # (1,) int64 Philox seed of the forward (read only when HAS_DROPOUT)
    dx_ptr,  # (M, N) output
    dw_part_ptr,  # (G, N) float32 output: this program's column sums of dz·x̂
    db_part_ptr,  # (G, N) float32 output: this program's column sums of dz
    M,  # rows
    N,  # row length, ≤ BLOCK_N
    num_programs,  # G: program pid owns the row tiles pid, pid + G, … (G ≤ cdiv(M, BLOCK_M))
    dropout_p,
    APPROX_TANH: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK_N: tl.constexpr,  # next_pow2(N)
    BLOCK_M: tl.constexpr,  # rows per tile
    FAST_TANH: tl.constexpr = False,  # GELU derivative through the hardware tanh (CUDA only)
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    seed, keep_scale = dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    num_tiles = tl.cdiv(M, BLOCK_M)
    inv_n = 1.0 / N  # (N may arrive as the constexpr 1: Triton specialises an int argument equal to 1)
    step = num_programs * BLOCK_M  # rows from a tile to the program's next tile
    stride = step.to(tl.int64) * N  # the same in elements
    first = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_first = first.to(tl.int64)[:, None] * N + cols[None, :]
    # the prefetch: tile pid loaded ahead (fully masked past the last row)
    x_a, g_a, mean_a, rstd_a = _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs_first, first, col_ok, M)
    for tile in tl.range(pid, num_tiles, num_programs, num_stages=1):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        x_raw, g_raw, mean, rstd = x_a, g_a, mean_a, rstd_a
        x_a, g_a, mean_a, rstd_a = _bwd_tiled_load(
            x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs + stride, rows + step, col_ok, M
        )
        # the row-range kernel's maths: dz = g · gelu'(z), dx = rstd · (dx̂ - x̂ · mean(dx̂ · x̂) - mean(dx̂))
        xhat, dz = _bwd_tile(
            x_raw.to(tl.float32),
            g_raw.to(tl.float32),
            offs,
            mean,
            rstd,
            w,
            b,
            seed,
            dropout_p,
            keep_scale,
            HAS_DROPOUT,
            APPROX_TANH,
            True,
            FAST_TANH,
        )
        dw_acc += dz * xhat
        db_acc += dz
        dx = _bwd_dx(dz, xhat, w, rstd, N, inv_n, True)
        mask = (rows < M)[:, None] & col_ok[None, :]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    part_off = pid.to(tl.int64) * N
    tl.store(dw_part_ptr + part_off + cols, tl.sum(dw_acc, axis=0), mask=col_ok)
    tl.store(db_part_ptr + part_off + cols, tl.sum(db_acc, axis=0), mask=col_ok)


# --- launchers ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _num_sms_cuda(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _num_sms_cuda(device.index if device.index is not None else torch.cuda.current_device())
    return 1  # the interpreter: a few programs are enough to exercise the partial sums


def layer_norm_gelu_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    approximate: str,
    dropout_p: float = 0.0,
    seed: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    num_warps: int | None = None,
    max_block_n: int | None = None,
    num_programs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact gradients of ``layer_norm_gelu`` w.r.t. ``x``, ``weight`` and ``bias``.

    Args:
        grad_y: ``(M, N)`` contiguous, dtype of ``x``; x, weight, bias: as the forward.
        mean, rstd: ``(M,)`` float32 from the forward; dropout_p, seed: the forward's.
        block_m, num_warps, max_block_n: as the forward (rows of ``N ≤ 1024`` that fit one tile
            take the tiled kernel, others the row-range kernel); num_programs: ``G`` (default:
            as many as fit on the SMs at once for the tiled kernel, 8 per SM for the other).
    Returns:
        ``(dx (M, N), dweight (N,), dbias (N,))``. dweight/dbias are summed over rows in two
        fixed-order stages (per-program partials, then a column sum): deterministic.
        No host synchronisation; 2 launches (backward kernel, column sum).
    """
    m_rows, n = x.shape
    dx = torch.empty_like(x)
    dweight = torch.empty_like(weight)
    dbias = torch.empty_like(bias)
    block_n, one_tile = _row_block_n(n, max_block_n)
    if one_tile and block_n <= _TILED_MAX_N:
        return _backward_tiled(
            grad_y,
            x,
            weight,
            bias,
            mean,
            rstd,
            approximate,
            dropout_p,
            seed,
            dx,
            dweight,
            dbias,
            block_n,
            block_m,
            num_warps,
            num_programs,
        )
    if num_programs is None:
        num_programs = _num_sms(x.device) * (_BWD_PROGRAMS_PER_SM if x.device.type == "cuda" else 3)
    rows_per_program = _launch.cdiv(max(m_rows, 1), max(1, min(num_programs, m_rows)))
    g = _launch.cdiv(m_rows, rows_per_program)
    dw_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    db_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    if g:
        args = (
            grad_y,
            x,
            weight,
            bias,
            mean,
            rstd,
            seed_arg(seed, x),
            dx,
            dw_part,
            db_part,
            m_rows,
            n,
            rows_per_program,
            float(dropout_p),
        )
        meta = dict(APPROX_TANH=approximate == "tanh", HAS_DROPOUT=seed is not None, ONE_TILE=one_tile, BLOCK_N=block_n)
        if block_m is None and max_block_n is None and _common.autotuning():
            _layer_norm_gelu_bwd_tuned[(g,)](*args, **meta)
        else:
            bm = block_m or min(
                _default_block_m(block_n, _BWD_SPACE["tiles"][1]), _launch.next_power_of_2(rows_per_program)
            )
            _launch.launch(
                _layer_norm_gelu_bwd_kernel,
                (g,),
                *args,
                **meta,
                BLOCK_M=bm,
                num_warps=num_warps or _default_warps(bm, block_n),
            )
        _backend.log_kernel("layer_norm_gelu_backward", f"_layer_norm_gelu_bwd_kernel ONE_TILE={one_tile} G={g}")
    _column_sum(dw_part, db_part, dweight, dbias, g, n)
    return dx, dweight, dbias


_TILED_PER_SM: dict = {}  # compiled-kernel key → programs per SM (occupancy from its registers)


def _tiled_programs_per_sm(args, meta, device: torch.device) -> int:
    """Programs of ``_layer_norm_gelu_bwd_tiled_kernel`` that fit on one SM at once.

    From the compiled kernel's registers (compiled and loaded once per specialisation by
    ``warmup``, no launch, no sync): 64K registers, 64 warps, 32 programs and 228 KB of shared
    memory per SM (sm_80/sm_90), registers allocated per warp in units of 256. Falls back to 4
    when the kernel cannot be inspected.
    """
    kernel = _layer_norm_gelu_bwd_tiled_kernel
    key = (
        kernel.__name__,
        device.index,
        args[0].dtype,
        args[1].dtype,
        args[2].dtype,
        args[3].dtype,
        tuple(meta.items()),  # (built in one order by the one caller)
    )
    if key not in _TILED_PER_SM:
        try:
            k = kernel.warmup(*args, grid=(1,), **meta)
            if hasattr(k, "result"):
                k = k.result()
            k._init_handles()
            warps = meta["num_warps"]
            regs_per_warp = -(-max(1, k.n_regs) * 32 // 256) * 256
            fit = min(65536 // (regs_per_warp * warps), 64 // warps, 32, (228 * 1024) // (k.metadata.shared + 1024))
            _TILED_PER_SM[key] = max(1, fit)
        except Exception:  # noqa: BLE001 - an inspection failure only costs occupancy
            _TILED_PER_SM[key] = 4
    return _TILED_PER_SM[key]


def _tiled_maxnreg(x_dtype: torch.dtype, has_dropout: bool, block_n: int, block_m: int, warps: int) -> int | None:
    """The register cap of this launch (16-bit rows of 8 values per thread without dropout), or None."""
    if has_dropout or x_dtype.itemsize != 2:
        return None
    return _TILED_MAXNREG16 if block_m * block_n == 8 * 32 * warps else None


def _tiled_shape(block_n: int) -> tuple[int, int]:
    """``(BLOCK_M, num_warps)`` of the tiled kernel for row block ``block_n``."""
    per_thread, warps = _TILED_PER_THREAD, _TILED_WARPS
    per_thread = max(per_thread, min(8, block_n // 32))  # a warp spans a row (up to 8 values per thread)
    while per_thread * 32 * warps < block_n and warps < 16:
        warps *= 2
    return max(1, per_thread * 32 * warps // block_n), warps


def _backward_tiled(
    grad_y,
    x,
    weight,
    bias,
    mean,
    rstd,
    approximate,
    dropout_p,
    seed,
    dx,
    dweight,
    dbias,
    block_n,
    block_m,
    num_warps,
    num_programs,
):
    """``layer_norm_gelu_backward`` with ``_layer_norm_gelu_bwd_tiled_kernel``."""
    m_rows, n = x.shape
    default = num_programs is None and block_m is None and num_warps is None  # (the native path's plan)
    full_bm, warps = _tiled_shape(block_n)
    bm = min(block_m or full_bm, _launch.next_power_of_2(max(m_rows, 1)))
    warps = num_warps or warps
    tiles = _launch.cdiv(m_rows, bm)
    fast = _fast_tanh(x.dtype, x.device, approximate, FAST_TANH_BWD_DTYPES)
    meta = dict(
        APPROX_TANH=approximate == "tanh",
        HAS_DROPOUT=seed is not None,
        BLOCK_N=block_n,
        BLOCK_M=bm,
        FAST_TANH=fast,
        num_warps=warps,
        num_stages=1,
    )
    cap = _tiled_maxnreg(x.dtype, seed is not None, block_n, bm, warps)
    if cap is not None:
        meta["maxnreg"] = cap
    if num_programs is None and tiles:
        if x.device.type == "cuda" and not _common.interpreting():
            probe = (
                grad_y,
                x,
                weight,
                bias,
                mean,
                rstd,
                seed_arg(seed, x),
                dx,
                mean,
                mean,
                m_rows,
                n,
                2,
                float(dropout_p),
            )
            num_programs = _num_sms(x.device) * _tiled_programs_per_sm(probe, meta, x.device)
        else:
            num_programs = 3  # the interpreter: a few programs, several tiles each
    g = min(max(1, num_programs or 1), tiles)  # 0 without rows: the column sum then writes zeros
    dw_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    db_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    if g:
        _launch.launch(
            _layer_norm_gelu_bwd_tiled_kernel,
            (g,),
            grad_y,
            x,
            weight,
            bias,
            mean,
            rstd,
            seed_arg(seed, x),
            dx,
            dw_part,
            db_part,
            m_rows,
            n,
            g,
            float(dropout_p),
            **meta,
        )
        _backend.log_kernel(
            "layer_norm_gelu_backward",
            f"_layer_norm_gelu_bwd_tiled_kernel BLOCK_M={bm} warps={warps} G={g} FAST_TANH={fast}",
        )
    _column_sum(dw_part, db_part, dweight, dbias, g, n)
    if default and g and seed is None and x.is_cuda:
        targs = (grad_y, x, weight, bias, mean, rstd, x, dx, dw_part, db_part, m_rows, n, g, float(dropout_p))
        sums = (dw_part, db_part, dweight, dbias)
        _native_register_backward(targs, meta, full_bm, bm, num_programs, approximate == "tanh", sums)
    return dx, dweight, dbias


_NATIVE_DONE: set = set()  # (device, dtypes, N, GELU form, M's and G's classes): registered or not registrable


def _native_register_backward(
    targs: tuple, meta: dict, full_bm: int, bm: int, programs: int, tanh: bool, sums: tuple
) -> None:
    """Hand the tiled backward and column-sum kernels this call launched to the native host path
    (``pcops._native``; ``csrc/host/layer_norm_gelu.cpp`` passes the arguments in this order),
    once per shape class and Triton specialisation of M and G."""
    from .. import _native

    host = _native.MODULE
    if host is None:
        return
    grad_y, x, weight, bias = targs[:4]
    m_rows, n, g = targs[10], targs[11], targs[12]
    sum_kw = column_sum_config(g)
    done = (x.device.index, x.dtype, weight.dtype, bias.dtype, n, tanh, bm, sum_kw["BLOCK_G"], _native.spec(m_rows),
            _native.spec(g))  # fmt: skip
    if done in _NATIVE_DONE or not _native.registrable(*targs[:10]):
        return
    _NATIVE_DONE.add(done)
    tiled = _native.bind(_layer_norm_gelu_bwd_tiled_kernel, (g,), targs, meta, "ppppppppppiiif")
    column_sum = _native.bind(
        _column_sum_kernel, (_launch.cdiv(n, sum_kw["BLOCK_N"]),), (*sums, g, n), sum_kw, "ppppii"
    )
    if tiled is not None and column_sum is not None:
        host.lng_register_backward(
            x, weight, bias, tanh, full_bm, bm, programs, g, *tiled, *column_sum, sum_kw["BLOCK_N"]
        )
