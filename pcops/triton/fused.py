"""Triton kernels for the fused ops: LayerNorm+GELU(+dropout), Swish+dropout+residual, CSR softmax.

Every kernel is memory-bound: it reads each input once and writes each output once, with the
arithmetic (statistics, GELU and its derivative, Philox dropout) done in float32 registers.

- LayerNorm+GELU forward: ``TILES`` consecutive tiles of ``BLOCK_M`` rows × ``BLOCK_N ≥ N``
  columns per program (the next tile's load in flight while one is computed) read ``x`` once,
  write ``y`` and the per-row ``mean``/``rstd`` (float32) for the backward. Bytes:
  ``2·M·N·size + 8·M``. Rows wider than ``_MAX_BLOCK_N`` are walked in chunks (three passes
  over the row, the later ones mostly from L2). ``FWD_VARIANTS`` / ``FWD_VARIANT``: a
  persistent grid with the x loads pipelined through shared memory (selectable, not default).
- tanh GELU: 16-bit rows take the hardware ``tanh.approx.f32`` in the forward
  (``FAST_TANH_FWD_DTYPES``; one MUFU instead of ex2 + rcp), bfloat16 rows in the backward too
  (``FAST_TANH_BWD_DTYPES``); float32 and the interpreter keep the exact formula (``_fast_tanh``
  says who gets which).
- LayerNorm+GELU backward (default, rows ≤ 1024 wide): a persistent grid of ``G`` programs
  (as many as fit on the SMs at once) walks aligned row tiles with the next tile prefetched,
  writes ``dx`` and one row of column partial sums of ``dz·x̂`` and ``dz`` per program; one
  small kernel adds the ``G`` partial rows in a fixed order. No atomics, so
  ``dweight``/``dbias`` are bit-for-bit reproducible. Bytes: ``3·M·N·size`` plus ``2·G·N·4``
  twice for the partials. 2 launches. ``BWD_VARIANTS`` / ``BWD_VARIANT`` name its configs;
  wider rows (or ``variant="rowrange"``) take the row-range kernel (``G`` = 8 per SM
  contiguous row ranges, autotuned).
- Dropout draws ``tl.rand(seed, i)`` (Philox-4x32-10) for the flat element index ``i`` of the
  ``(M, N)`` output, so the backward regenerates the same mask from the seed instead of
  storing it; the seed is a 1-element int64 tensor read in the kernel (CUDA-graph friendly).
- CSR softmax (default ``CSR_LAYOUT = "grouped"``): groups of ``SUB`` lanes per row, 32/SUB
  rows per warp, ``SUB·VPT`` entries of a row in registers (rows that fit are read once and
  written once), longer rows walked in chunks (online max and sum, then a second pass that
  writes); the row reductions are log2(SUB) shuffles for all rows of a warp at once. The
  ``"tile"`` layout: a ``(BLOCK_R, BLOCK_L)`` tile of rows, a warp across each row.

Tuning: the row-wise kernels go through ``triton.autotune`` keyed on the row length (``N``; the
mean row length for the CSR softmax), timed with a short ``do_bench`` (5 + 20 ms per config);
the LayerNorm+GELU forward with CUDA-graph replays (``_graph_bench``) and ``FWD_PINNED``.
Launchers take ``block_m``/``block_r`` (and ``num_warps``, ``tiles``, ``sub``) to bypass
autotuning; they do so by themselves under ``TRITON_INTERPRET=1``, where every config would
be run in Python.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl
import triton.testing
from triton.language.extra.cuda import libdevice

# GELU constants (globals read by @triton.jit code must be tl.constexpr)
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
# tanh GELU: u = c·(z + k·z³), folded for exp2 in the forward: sigmoid(2u) = 1 / (1 + 2^(z·(A0 + A1·z²)))
_C, _K, _LOG2E = tl.constexpr(0.7978845608028654), tl.constexpr(0.044715), 1.4426950408889634
_LOG2E_C = tl.constexpr(_LOG2E)
_GELU_A0 = tl.constexpr(-2.0 * _C * _LOG2E)
_GELU_A1 = tl.constexpr(-2.0 * _C * _K * _LOG2E)
_GELU_B0 = tl.constexpr(2.0 * _C)  # 2u' = B0 + B1·z²
_GELU_B1 = tl.constexpr(6.0 * _C * _K)
_CK = tl.constexpr(_C * _K)  # the hardware-tanh forms: u = z·(c + c·k·z²), u' = c + 3·c·k·z²
_CK3 = tl.constexpr(3.0 * _C * _K)

# widest row held in registers as one tile; wider rows are processed in chunks of this width
_MAX_BLOCK_N = 8192
# elementwise kernel (Swish): elements per program (8 per thread with 4 warps: 32 B per load)
_ELEMENTWISE_BLOCK = 1024
# column-sum kernel (``_column_sum``): BLOCK_G = next_pow2(G) ≤ 4096 partial rows × BLOCK_N =
# 4096 / BLOCK_G columns per program (at most 8): the G ≈ 5-10·SMs partial rows in one step
_SUM_MAX_BLOCK_G = 4096
_SUM_ELEMENTS = 4096
# backward programs per SM: each walks a contiguous range of rows, so G is bounded and the
# partial sums stay small (G·N·8 bytes, ≈ 2 MB for N = 256 on 132 SMs, 1 % of L2's traffic);
# 8 per SM lets low-register configs keep all programs resident (no tail wave) while
# high-register ones run in 2-3 even waves
_BWD_PROGRAMS_PER_SM = 8


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# read by @triton.jit code: the interpreter lacks libdevice (fixed at import, as Triton itself is)
_INTERPRET = tl.constexpr(_interpreting())

# False: the launchers use their fixed default configs instead of ``triton.autotune`` (every
# config of a new row length is compiled and timed on first use: the GPU tests, which see many
# row lengths, switch it off and check the autotuned paths on a few shapes)
AUTOTUNE = True


def _autotuning() -> bool:
    return AUTOTUNE and not _interpreting()


def _m_class(m_rows: int) -> int:
    """The forward's row-count class (part of its autotune key): 1 for ≥ 65,536 rows, where the
    multi-tile configs keep ≥ 2,048 programs in flight; 0 below, where they are pruned (L1,
    4,096 rows: a 4-tile config left 512 programs and ran at half the speed of one tile)."""
    return 1 if m_rows >= _MULTI_TILE_MIN_ROWS else 0


# --- autotuning search space ----------------------------------------------------------------
# A program handles (BLOCK_M, BLOCK_N) tiles, BLOCK_N = next_pow2(N) fixed by the launcher; the
# forward program walks TILES consecutive tiles, loading tile t + 1 before computing tile t.
# Search space: BLOCK_M (rows per tile) ∈ 1..256 (powers of two) × num_warps ∈ 1..16 (× TILES
# ∈ {1, 4} for the forward), pruned per N (and dtype, through the autotune key) to
# - forward, TILES = 1: tiles of 2K-8K elements, 4, 8 or 16 warps, 4-16 elements per thread
#   (the configs the H200 has measured: L1 0.011 ms, L2 0.053, floor 0.031);
# - forward, TILES = 4 (rows that fit one tile): tiles of 1K-2K elements with 8 or 16 per
#   thread and 2, 4 or 8 warps: the prefetched tile doubles the live values (L2, ptxas: 48-56
#   registers at 8 per thread, 80 at 16), and programs with a second tile in flight overlap
#   their loads with their own maths instead of relying on other resident programs; 16 per
#   thread also amortises the row reductions (L2: 21.8 SASS instructions per element against
#   24 at 8 per thread and 26 for one tile) (L2: 4×2, 4×4, 8×4 and 8×8 rows×warps);
# - backward (the row-range kernel): tiles of 1K-4K elements, 4 or 8 warps, 4-16 per thread.
# Why: these kernels are memory-bound, so what matters is the bytes each SM has in flight:
# big tiles and 16 values per thread give the most per register; the backward keeps ~5 live
# float32 values per element (x, g, x̂, dz, dx) and spills beyond 16 per thread, so its tiles
# are half the size; fewer values per thread lower the register count and let more programs
# share an SM, which the tuner weighs against the first. Row layout (the "2-D block"): Triton
# lays a tile out as 16-byte vectors along a row, a warp across ≤ 32 vectors of a row and the
# warps over rows, so BLOCK_N / 8 (16-bit) or / 4 (fp32) lanes share a row and BLOCK_M picks
# the rows per warp; rows wider than a warp split across warps (cross-warp sums).
# That leaves 1-10 forward configs and 1-6 backward ones per N, timed with a short
# ``do_bench`` (5 ms warm-up, 20 ms of runs) so the first call for a new N costs a few seconds.
_ROW_CONFIGS = [
    triton.Config({"BLOCK_M": m}, num_warps=w) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256) for w in (1, 2, 4, 8, 16)
]
_FWD_CONFIGS = [
    triton.Config({"BLOCK_M": m, "TILES": t}, num_warps=w)
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256) for w in (1, 2, 4, 8, 16) for t in (1, 4)
]
_FWD_SPACE = dict(tiles=(2048, 4096, 8192), warps=(4, 8, 16), per_thread=(4, 16))
_FWD_MULTI_SPACE = dict(tiles=(1024, 2048), warps=(2, 4, 8), per_thread=(8, 16))
_BWD_SPACE = dict(tiles=(1024, 2048, 4096), warps=(4, 8), per_thread=(4, 16))
_FWD_MULTI_TILES = 4
_MULTI_TILE_MIN_ROWS = 65536
_MULTI_TILE_MIN_PROGRAMS = 2048


def _row_space(configs, block_n, tiles, warps, per_thread, fallback=True):
    wanted = {min(256, max(1, t // block_n)) for t in tiles}
    keep = [
        c for c in configs
        if c.kwargs["BLOCK_M"] in wanted and c.num_warps in warps
        and per_thread[0] <= c.kwargs["BLOCK_M"] * block_n / (32 * c.num_warps) <= per_thread[1]
    ]
    if not keep and fallback:  # very narrow or very wide rows: the largest tile, ~8-16 values per thread
        m = max(wanted)
        w = min(16, max(1, m * block_n // 512))
        keep = [c for c in configs if c.kwargs["BLOCK_M"] == m and c.num_warps == w]
    return keep


def _prune_rows(tiles, warps, per_thread):
    def prune(configs, named_args, **kwargs):
        return _row_space(configs, kwargs["BLOCK_N"], tiles, warps, per_thread)

    return prune


# Pinned forward configs: (BLOCK_N, dtype, M_CLASS) → (BLOCK_M, TILES, num_warps). A pinned
# shape autotunes over that one config only, so its choice cannot change between runs (the
# autotuner's timing noise on a ≈ 5 µs kernel). Filled from the H200's graph-timed autotune and
# the benchmark's fixed-config sweep (``fwd=cfg BMxTxW`` rows); other shapes are tuned over
# their pruned space.
FWD_PINNED: dict = {
    # L1 (4,096 × 768 float32) and its class (float32 rows of 513-1024, < 65,536 rows): the
    # H200's graph-timed autotune (04:05 run) 6.9 µs back to back, the next config 7.8, the
    # other four 7.9-11.4; the config the 0.015 ms run (gpu11) had taken. (The 0.011 ms run,
    # gpu7, did not record its config.)
    (1024, torch.float32, 0): (2, 1, 4),
    # L2 (131,072 × 256 bfloat16) and its class (bfloat16 rows of 129-256, ≥ 65,536 rows): graph-
    # timed autotune 37.6 µs, 4×4×2 38.1, 8×1×4 39.4, the other seven 39.9-65.7; [graph] rows of
    # the same run: 0.0431 ms, 0.0437, 0.0450 (8×1×16: 0.072)
    (256, torch.bfloat16, 1): (8, 4, 4),
}


def _prune_fwd(configs, named_args, **kwargs):
    block_n = kwargs["BLOCK_N"]
    x = named_args.get("x_ptr")
    pin = FWD_PINNED.get((block_n, getattr(x, "dtype", None), kwargs.get("M_CLASS", 1)))
    if pin is not None:
        keep = [c for c in configs
                if (c.kwargs["BLOCK_M"], c.kwargs["TILES"], c.num_warps) == tuple(pin)]
        if keep:
            return keep
    one = _row_space([c for c in configs if c.kwargs["TILES"] == 1], block_n, **_FWD_SPACE)
    if not kwargs["ONE_TILE"] or not kwargs.get("M_CLASS", 1):
        return one  # wide rows (the chunked path walks one tile per program) or few rows
    multi = _row_space([c for c in configs if c.kwargs["TILES"] > 1], block_n, **_FWD_MULTI_SPACE, fallback=False)
    m_rows = named_args.get("M", _MULTI_TILE_MIN_ROWS)
    multi = [c for c in multi
             if triton.cdiv(m_rows, c.kwargs["BLOCK_M"] * c.kwargs["TILES"]) >= _MULTI_TILE_MIN_PROGRAMS]
    return one + [c for c in multi if c not in one]


def _quick_bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _graph_bench(kernel_call, quantiles):
    """Autotune timing of the LayerNorm+GELU forward: replays of a CUDA graph of back-to-back
    launches (``do_bench_cudagraph``, ≈ 10 ms per config), falling back to ``_quick_bench``
    where a graph cannot be captured.

    Why: ``do_bench`` times each launch alone after flushing the L2 cache. For L1 (4,096 × 768
    float32, a ≈ 5 µs kernel) that measures cold-cache launches whose spread between configs is
    within the noise, so the choice changed from run to run (H200: 0.011 ms with one config,
    0.015 and 0.023 with others). Graph replays time what the benchmark and a captured training
    step see (no launch gaps; inputs that fit the 50 MB L2 stay there, as between layers)."""
    try:
        return triton.testing.do_bench_cudagraph(kernel_call, rep=10, quantiles=quantiles)
    except Exception:  # noqa: BLE001 - e.g. a capture already in progress: time it the plain way
        return _quick_bench(kernel_call, quantiles)


def _default_block_m(block_n: int, tile: int) -> int:
    return min(256, max(1, tile // block_n))


def _default_warps(block_m: int, block_n: int) -> int:
    return min(16, max(1, block_m * block_n // (32 * 16)))


@triton.jit
def _fast_div(a, b):
    """``a / b`` as ``a · rcp.approx(b)`` (2 instructions instead of div.full's ~6; 2 ulp; 0 for
    2^126 < |b| < 2^128 and b = inf, the right limit where it is used: 1 + e ≥ 1, a finite).
    Plain division under the interpreter (which has no libdevice)."""
    if _INTERPRET:
        q = a / b
    else:
        q = libdevice.fast_dividef(a, b)
    return q


@triton.jit
def _tanh_approx(u):
    """The hardware tanh: ``tanh.approx.f32`` (one MUFU.TANH, sm_75+; relative error ≈ 2^-11, far
    below a bfloat16 rounding, 2^-8). Never traced under the interpreter (the launchers pass
    ``FAST_TANH=False`` there: no inline PTX on the CPU)."""
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _gelu(z, APPROX_TANH: tl.constexpr, FAST_TANH: tl.constexpr = False):
    if APPROX_TANH and FAST_TANH:
        # 0.5·z·(1 + tanh(u)), u = z·(c + c·k·z²), tanh in hardware: two mul, one fma, one MUFU,
        # one mul, one fma per element (the exp2 form below: one MUFU.EX2, one MUFU.RCP, ~3 more)
        hz = 0.5 * z
        t = _tanh_approx(z * (_C + _CK * (z * z)))
        h = hz + hz * t
    elif APPROX_TANH:
        # 0.5·(1 + tanh(u)) = sigmoid(2u) with u = c·(z + k·z³): h = z / (1 + 2^(z·(A0 + A1·z²)))
        # (the constants fold -2·c·log2(e) in): one fma, two mul, one ex2, one fast division;
        # exact limits when the power over/underflows (z / inf = 0, z / 1 = z)
        h = _fast_div(z, 1.0 + tl.exp2(z * (_GELU_A0 + _GELU_A1 * (z * z))))
    else:
        h = 0.5 * z * (1.0 + tl.math.erf(z * _INV_SQRT_2))
    return h


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
        # (z·s first: 0 for very negative z, never 0·inf). Fewer instructions (the tiled
        # backward's loop on L2: 288 instead of 365 SASS instructions per 8 elements a thread);
        # ptxas would keep 8 more registers live (80 instead of 72), hence the variants' cap.
        z2 = z * z
        s = _fast_div(1.0, 1.0 + tl.exp2(z * (_GELU_A0 + _GELU_A1 * z2)))
        d = s + (z * s) * (1.0 - s) * (_GELU_B0 + _GELU_B1 * z2)
    elif APPROX_TANH:
        # with s = sigmoid(2u): 0.5·(1 + t) = s and 1 - t² = 4·s·(1 - s) (the tiled backward's loop
        # on L2: 365 SASS instructions per 8-element step, 72 registers)
        u = _C * (z + _K * z * z * z)
        s = _fast_div(1.0, 1.0 + tl.exp(-2.0 * u))
        d = s + 2.0 * z * s * (1.0 - s) * _C * (1.0 + 3.0 * _K * z * z)
    else:
        d = 0.5 * (1.0 + tl.math.erf(z * _INV_SQRT_2)) + z * tl.exp(-0.5 * z * z) * _INV_SQRT_2PI
    return d


@triton.jit
def _dropout_params(seed_ptr, dropout_p, HAS_DROPOUT: tl.constexpr):
    """``(seed, 1/(1-p))`` for ``_dropout``, read once per program (placeholders without dropout)."""
    if HAS_DROPOUT:
        seed = tl.load(seed_ptr)
        keep_scale = 1.0 / (1.0 - dropout_p)
    else:
        seed = 0
        keep_scale = 1.0
    return seed, keep_scale


@triton.jit
def _dropout(v, seed, offs, dropout_p, keep_scale, HAS_DROPOUT: tl.constexpr):
    """``v`` kept (scaled by 1/(1-p)) or zeroed by Philox on the flat element index ``offs``:
    the forward and the backward regenerate the same mask from the same seed."""
    if HAS_DROPOUT:
        keep = tl.rand(seed, offs) >= dropout_p
        v = tl.where(keep, v * keep_scale, 0.0)
    return v


@triton.jit
def _bwd_tile(x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale,
              HAS_DROPOUT: tl.constexpr, APPROX_TANH: tl.constexpr, LEAN: tl.constexpr = False,
              FAST_TANH: tl.constexpr = False):
    """One backward tile (float32 ``x``, ``g``): ``(x̂, dz)`` with x̂ recomputed from the saved
    statistics and ``dz = g·gelu'(z)`` at the recomputed pre-activation ``z = x̂·w + b``
    (``g`` first goes back through the dropout mask). Masked-off elements (loaded as ``x = g =
    0``, ``w = b = 0``, ``mean = rstd = 0`` past the last row) get a finite x̂ and ``dz = 0``, so
    they add nothing to the row sums ``Σ dz·w·x̂``, ``Σ dz·w`` or the column sums: no mask needed."""
    g = _dropout(g, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
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
def _fwd_tile_load(x_ptr, rows, cols, M, N, EVEN_N: tl.constexpr):
    """The raw ``(BLOCK_M, BLOCK_N)`` tile of ``x`` at ``rows`` (zeros past row M / column N)."""
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if EVEN_N:
        mask = (rows < M)[:, None]
    else:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
    return tl.load(x_ptr + offs, mask=mask, other=0.0)


@triton.jit
def _layer_norm_gelu_fwd_kernel(
    x_ptr,  # (M, N) contiguous, float32/float16/bfloat16
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    y_ptr,  # (M, N) output, dtype of x
    mean_ptr,  # (M,) float32 output
    rstd_ptr,  # (M,) float32 output, 1 / sqrt(biased var + eps)
    seed_ptr,  # (1,) int64 Philox seed (read only when HAS_DROPOUT)
    M,  # rows
    N,  # row length (the autotune key)
    eps,  # variance epsilon
    dropout_p,  # drop probability in [0, 1)
    APPROX_TANH: tl.constexpr,  # tanh GELU, else exact erf GELU
    HAS_DROPOUT: tl.constexpr,
    ONE_TILE: tl.constexpr,  # BLOCK_N >= N: the row stays in registers
    EVEN_N: tl.constexpr,  # N == BLOCK_N: no column mask
    BLOCK_N: tl.constexpr,  # columns per tile (>= N when ONE_TILE, else the chunk width)
    BLOCK_M: tl.constexpr,  # rows per tile (autotuned)
    TILES: tl.constexpr,  # consecutive tiles per program (autotuned; 1 unless ONE_TILE)
    M_CLASS: tl.constexpr = 1,  # _m_class(M): part of the autotune key only
    FAST_TANH: tl.constexpr = False,  # tanh GELU through the hardware tanh (CUDA, 16-bit outputs)
    WB_TILE: tl.constexpr = False,  # weight/bias loaded in the tile's layout (see FWD_VARIANTS)
):
    pid = tl.program_id(0)
    seed, keep_scale = _dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
    if ONE_TILE:
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
        if WB_TILE:
            # weight and bias loaded as whole (BLOCK_M, BLOCK_N) tiles in the layout of x (each row
            # the same: L1 hits): no shared-memory layout conversion and barriers per program
            wb = cols[None, :] + 0 * tl.arange(0, BLOCK_M)[:, None]
            wb_ok = wb < N
            w = tl.load(w_ptr + wb, mask=wb_ok, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + wb, mask=wb_ok, other=0.0).to(tl.float32)
        else:
            w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        first = pid * (TILES * BLOCK_M)
        x_next = _fwd_tile_load(x_ptr, first + tl.arange(0, BLOCK_M), cols, M, N, EVEN_N)
        for t in tl.static_range(TILES):
            rows = first + t * BLOCK_M + tl.arange(0, BLOCK_M)
            x = x_next.to(tl.float32)
            if t + 1 < TILES:  # the next tile's load is in flight while this one is computed
                x_next = _fwd_tile_load(x_ptr, rows + BLOCK_M, cols, M, N, EVEN_N)
            row_ok = rows < M
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            # statistics in float32 (two-pass variance: no cancellation)
            mean = tl.sum(x, axis=1) / N
            if EVEN_N:
                xc = x - mean[:, None]
                mask = row_ok[:, None]
            else:
                xc = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
                mask = row_ok[:, None] & col_ok[None, :]
            rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
            h = _gelu(xc * rstd[:, None] * w + b, APPROX_TANH, FAST_TANH)
            h = _dropout(h, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
            tl.store(y_ptr + offs, h.to(y_ptr.dtype.element_ty), mask=mask)
            tl.store(mean_ptr + rows, mean, mask=row_ok)
            tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    else:
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        row_off = rows.to(tl.int64) * N
        # wide rows: pass 1 the mean, pass 2 the variance, pass 3 the output
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            mask = row_ok[:, None] & (cols < N)[None, :]
            acc += tl.load(x_ptr + row_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=1) / N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            mask = row_ok[:, None] & (cols < N)[None, :]
            x = tl.load(x_ptr + row_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, x - mean[:, None], 0.0)
            acc += xc * xc
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            offs = row_off[:, None] + cols[None, :]
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            h = _gelu((x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :], APPROX_TANH, FAST_TANH)
            h = _dropout(h, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
            tl.store(y_ptr + offs, h.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit(do_not_specialize=["num_programs"])
def _layer_norm_gelu_fwd_persistent_kernel(
    x_ptr,  # (M, N) contiguous, float32/float16/bfloat16
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    y_ptr,  # (M, N) output, dtype of x
    mean_ptr,  # (M,) float32 output
    rstd_ptr,  # (M,) float32 output
    seed_ptr,  # (1,) int64 Philox seed (read only when HAS_DROPOUT)
    M,  # rows
    N,  # row length, ≤ BLOCK_N
    eps,
    dropout_p,
    num_programs,  # G: program pid owns the row tiles pid, pid + G, …
    APPROX_TANH: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    EVEN_N: tl.constexpr,  # N == BLOCK_N: no column mask
    BLOCK_N: tl.constexpr,  # next_pow2(N)
    BLOCK_M: tl.constexpr,  # rows per tile
    FAST_TANH: tl.constexpr,
    STAGES: tl.constexpr,  # Triton's loop pipelining of the x loads (cp.async into shared memory)
):
    """The forward of ``_layer_norm_gelu_fwd_kernel`` (rows that fit one tile) on a persistent
    grid (``FWD_VARIANTS``): weight and bias are loaded once per program and the x tiles of the
    program's next steps stream into shared memory while the current one is computed."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    seed, keep_scale = _dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
    inv_n = 1.0 / N  # (N may arrive as the constexpr 1: Triton specialises an int argument equal to 1)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in tl.range(pid, num_tiles, num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        if EVEN_N:
            mask = row_ok[:, None]
        else:
            mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) * inv_n
        if EVEN_N:
            xc = x - mean[:, None]
        else:
            xc = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) * inv_n + eps)
        h = _gelu(xc * rstd[:, None] * w[None, :] + b[None, :], APPROX_TANH, FAST_TANH)
        h = _dropout(h, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
        tl.store(y_ptr + offs, h.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


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
    seed, keep_scale = _dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
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
            xhat, dz = _bwd_tile(x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale,
                                 HAS_DROPOUT, APPROX_TANH)
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
                xhat, dz = _bwd_tile(x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale,
                                     HAS_DROPOUT, APPROX_TANH)
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
                xhat, dz = _bwd_tile(x, g, offs, mean, rstd, w, b, seed, dropout_p, keep_scale,
                                     HAS_DROPOUT, APPROX_TANH)
                dxhat = dz * w[None, :]
                dx = (dxhat - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                pw = tl.load(dw_part_ptr + part_off + cols, mask=col_ok, other=0.0)
                pb = tl.load(db_part_ptr + part_off + cols, mask=col_ok, other=0.0)
                tl.store(dw_part_ptr + part_off + cols, pw + tl.sum(dz * xhat, axis=0), mask=col_ok)
                tl.store(db_part_ptr + part_off + cols, pb + tl.sum(dz, axis=0), mask=col_ok)


@triton.jit
def _column_sum_kernel(
    dw_part_ptr,  # (G, N) float32 partial sums
    db_part_ptr,  # (G, N) float32 partial sums
    dw_ptr,  # (N,) output, dtype of weight
    db_ptr,  # (N,) output, dtype of bias
    G,  # partial rows
    N,  # columns
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc_w = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    # a fixed summation order: the result does not depend on scheduling
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        mask = (g < G)[:, None] & col_ok[None, :]
        offs = g.to(tl.int64)[:, None] * N + cols[None, :]
        acc_w += tl.load(dw_part_ptr + offs, mask=mask, other=0.0)
        acc_b += tl.load(db_part_ptr + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
    tl.store(db_ptr + cols, tl.sum(acc_b, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)


_layer_norm_gelu_fwd_tuned = triton.autotune(
    configs=_FWD_CONFIGS, key=["N", "M_CLASS", "FAST_TANH", "WB_TILE"],
    prune_configs_by={"early_config_prune": _prune_fwd}, do_bench=_graph_bench,
)(_layer_norm_gelu_fwd_kernel)
_layer_norm_gelu_bwd_tuned = triton.autotune(
    configs=_ROW_CONFIGS, key=["N"], prune_configs_by={"early_config_prune": _prune_rows(**_BWD_SPACE)},
    do_bench=_quick_bench,
)(_layer_norm_gelu_bwd_kernel)


# --- LayerNorm+GELU backward, default: persistent row tiles ----------------------------------
# The default for rows with N ≤ ``_TILED_MAX_N`` (the H200 measured it 3.7× faster than the
# row-range kernel above on L2 and 1.3× on L1/L3: L2 bwd kernel 0.093 vs 0.339 ms); wider rows
# (and ``variant="rowrange"``) take the row-range kernel. ``BWD_VARIANTS`` names the configs
# of this kernel; the launcher's ``variant`` or the module-level ``BWD_VARIANT`` picks one
# (the benchmark sweeps them).
#
# What differs from the row-range kernel, and why it is faster:
# - few registers (4-8 values per thread, below) so many programs share an SM, and a
#   persistent grid: G = SMs × as many programs as can reside at once (from the loaded
#   kernel's register count), each walking the row tiles pid, pid + G, pid + 2G, … (aligned
#   BLOCK_M-row tiles, no ragged per-program row ranges, no second wave);
# - software prefetch (``prefetch`` = 1 or 2 tiles ahead): the x/dy tiles of the next steps are
#   loaded before the current one is computed, so every program keeps one or two tiles of loads
#   in flight instead of stalling on a full memory latency per step (launched with
#   num_stages=1; the "async" variants pipeline the loop instead: ``stages`` below);
# - dweight/dbias partials accumulate in a [BLOCK_M, BLOCK_N] float32 register tile and are
#   reduced over rows once per program, not with a cross-warp (shared memory + barrier)
#   reduction every step;
# - the column-sum kernel (shared with the row-range kernel) adds the G partial rows.
# The maths is the row-range kernel's (x̂ and gelu'(z) recomputed from x, mean, rstd; dropout
# mask regenerated from the seed); only the float32 summation order of dweight/dbias differs,
# and the result is deterministic for a given device (G depends only on the SM count).
#
# Registers and layout (sm_90, Triton 3.6, measured without a GPU with the launch-time
# divisibility hints): each value per thread costs ~8-12 registers (x, dy, x̂, dz, two
# accumulators), so the configs keep 4-8 per thread. Triton lays a [BLOCK_M, BLOCK_N] tile out
# as 16-byte (or 8-byte) vectors along a row, 32 lanes along the row, warps over rows: with a
# warp spanning a whole row (values per thread raised up to 8 for that) the two row sums are
# warp shuffles. L2 (bf16, BLOCK_N 256): 8 per thread, 4 rows × 4 warps, 72 registers (7
# programs = 28 warps per SM), 16-byte loads. L3 (fp32, BLOCK_N 64): 48 registers.
#
# Measured (H200, graph-captured, before the 2-deep prefetch):
# L2 bwd kernel 0.093 ms "tiled" / 0.105 "tiled-noprefetch" (floor 0.045: x, dy, dx); L1
# 0.019 / 0.022; L3 0.043 / 0.041. The kernel reaches ≈ 2.3 TB/s where torch's elementwise
# add of the same traffic reaches 4.2: not enough bytes in flight (≈ 28 KB per SM with one
# tile of prefetch against the ≈ 30 KB Little's law asks), hence "tiled-pf2" (two tiles
# ahead: 80 registers on L2, 6 programs per SM, 2 tiles each) — to be measured. The default
# also runs leaner maths (the forward's folded exp2 GELU form and a fast division: 288 instead
# of 393 SASS instructions per 8-element step on L2, the loop being close to issue-bound at
# ≈ 49 instructions per element, ≈ 49 µs of issue for L2 on 132 SMs), capped at the plain
# maths' 72 registers. (Registers checked with ptxas for every change here: dropping the
# column mask when N == BLOCK_N costs 16 more, so the mask stays.)
#
# Each entry: ``per_thread`` values per thread per step (raised up to 8 so a warp spans a row)
# and ``warps`` (rows wider than per_thread · 32 · warps get more warps, up to 16; BLOCK_M =
# per_thread · 32 · warps / BLOCK_N, at least 1); ``prefetch``: tiles loaded ahead (0, 1, 2);
# ``lean``: the fewer-instruction maths (``_gelu_grad``/``_bwd_dx`` with LEAN); ``regs16``: a
# register cap (ptxas maxrregcount) for 16-bit rows of 8 values per thread without dropout
# (L2's shape), where ptxas otherwise spends 8 registers more on the lean maths than the plain
# ones need and one program per SM less fits (checked spill-free with ptxas for sm_90; the
# sm_90 compile test re-checks); ``per_sm``: programs per SM of the persistent grid, None = as many as the compiled kernel's
# registers let reside at once (read from the loaded kernel on first use, cached), an int =
# that many; ``fast_tanh``: the GELU derivative through the hardware tanh (``_tanh_approx``)
# — None = where the output dtype is in ``FAST_TANH_BWD_DTYPES``, True = every 16-bit dtype,
# False = never (float32 never: its tolerances ask for the exact form); ``stages``: Triton's
# software pipelining of the x/dy loads (``tl.range(num_stages=...)``: cp.async into
# ``stages - 1`` shared-memory buffers per program, no registers held), 1 = off.
# (Dropped after the H200 sweep: 4 values per thread with rows split across warps, and 8
# warps per program: never better than "tiled" by more than 1 %.)
#
# Why the "async" variants (no H200 figures yet): ptxas sinks the prefetch loads of
# ``prefetch = 1/2`` to the end of the loop body (sm_90 SASS: the next tile's LDG.128 sit just
# before the dx store and the back edge), so a warp has only its one current tile in flight and
# then waits a full memory latency: ≈ 28 warps × 1 KB per SM in flight, ≈ 2 TB/s by Little's law at
# ≈ 2 µs loaded latency — what the H200 measured (2.2-2.6 TB/s, insensitive to prefetch depth,
# warps and instruction count). The pipelined loop keeps ``stages - 1`` tiles per program in
# shared memory (4 KB each on L2; 4 stages: 12 KB per program, ≈ 84 KB per SM) at the cost of
# two barriers per tile (sm_90 SASS on L2: 298-316 instructions per 8-element step, 72
# registers, LDGSTS.128); the copies for tile i + stages - 1 are issued at the end of step i,
# so ``stages - 2`` tiles are in flight while one is computed.
BWD_VARIANTS = {
    # a warp per row (up to 256 bf16/fp16 or fp32 values), 4 warps, one tile ahead, the lean
    # maths held to the plain maths' 72 registers on L2 (279 SASS instructions per 8-element
    # step, 264 with the hardware tanh; no spills): the default
    "tiled": dict(per_thread=4, warps=4, prefetch=1, lean=True, regs16=72, per_sm=None, fast_tanh=None, stages=1),
    # the kernel the H200 measured (L2 bwd 0.093 ms): plain maths, ptxas' own register count
    "tiled-plain": dict(per_thread=4, warps=4, prefetch=1, lean=False, regs16=None, per_sm=None, fast_tanh=False,
                        stages=1),
    # no prefetch: more resident programs hide the latency instead (L3: -5 % measured, plain)
    "tiled-noprefetch": dict(per_thread=4, warps=4, prefetch=0, lean=True, regs16=64, per_sm=None, fast_tanh=False,
                             stages=1),  # (exact maths: at its 64-register cap the hardware-tanh form spills)
    # two tiles ahead: twice the bytes in flight per program
    "tiled-pf2": dict(per_thread=4, warps=4, prefetch=2, lean=True, regs16=80, per_sm=None, fast_tanh=None,
                      stages=1),
    # "tiled" with the exact GELU derivative on every dtype (the default before the H200's 04:05
    # run: L2 backward kernel 74.1 µs against 72.8 with the hardware tanh)
    "tiled-exact": dict(per_thread=4, warps=4, prefetch=1, lean=True, regs16=72, per_sm=None, fast_tanh=False,
                        stages=1),
    # "tiled" with the hardware tanh for every 16-bit dtype (264 instead of 279 instructions per
    # step; "tiled" itself takes it for bfloat16, FAST_TANH_BWD_DTYPES)
    "tiled-fast": dict(per_thread=4, warps=4, prefetch=1, lean=True, regs16=72, per_sm=None, fast_tanh=True,
                       stages=1),
    # the x/dy loads pipelined through shared memory (see above): stages - 2 tiles in flight
    # while one is computed (3: one, as a working prefetch would be; 4: two; 6: four, 20 KB per
    # program on L2, 80 registers)
    "tiled-async3": dict(per_thread=4, warps=4, prefetch=0, lean=True, regs16=None, per_sm=None, fast_tanh=None,
                         stages=3),
    "tiled-async4": dict(per_thread=4, warps=4, prefetch=0, lean=True, regs16=None, per_sm=None, fast_tanh=None,
                         stages=4),
    "tiled-async6": dict(per_thread=4, warps=4, prefetch=0, lean=True, regs16=None, per_sm=None, fast_tanh=None,
                         stages=6),
    "tiled-async4-fast": dict(per_thread=4, warps=4, prefetch=0, lean=True, regs16=None, per_sm=None,
                              fast_tanh=True, stages=4),
    # 16 values per thread on 16-bit rows without dropout (L2: 8 rows × 4 warps, 8 KB per
    # stage): the per-tile costs (barriers, statistics loads, addresses) over twice the elements
    # (L2: 37.8 instead of 39.5 instructions per element, 96 registers, 5 programs per SM);
    # float32 rows and dropout as "tiled-async4" (160-192 registers otherwise)
    "tiled-async4-16": dict(per_thread=4, per_thread16=16, warps=4, prefetch=0, lean=True, regs16=None,
                            per_sm=None, fast_tanh=None, stages=4),
}
# the variant ``layer_norm_gelu_backward`` runs when its ``variant`` is None ("rowrange": the
# row-range kernel). The benchmark sets it to sweep the variants through the public op.
BWD_VARIANT: str = "tiled"
_ROWRANGE = "rowrange"
_TILED_MAX_N = 1024


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
    PREFETCH: tl.constexpr,  # tiles loaded ahead of the one being computed: 0, 1 or 2
    LEAN: tl.constexpr,  # fewer-instruction GELU-derivative and dx maths (more registers)
    BLOCK_N: tl.constexpr,  # next_pow2(N)
    BLOCK_M: tl.constexpr,  # rows per tile
    FAST_TANH: tl.constexpr = False,  # GELU derivative through the hardware tanh (CUDA only)
    STAGES: tl.constexpr = 1,  # Triton's loop pipelining of the x/dy loads (cp.async into shared memory) when > 1
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    seed, keep_scale = _dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    num_tiles = tl.cdiv(M, BLOCK_M)
    inv_n = 1.0 / N  # (N may arrive as the constexpr 1: Triton specialises an int argument equal to 1)
    step = num_programs * BLOCK_M  # rows from a tile to the program's next tile
    stride = step.to(tl.int64) * N  # the same in elements
    first = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_first = first.to(tl.int64)[:, None] * N + cols[None, :]
    # the prefetch queue: tiles pid (+G) loaded ahead (fully masked past the last row)
    if PREFETCH >= 1:
        x_a, g_a, mean_a, rstd_a = _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs_first, first, col_ok, M)
    if PREFETCH >= 2:
        x_b, g_b, mean_b, rstd_b = _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs_first + stride,
                                                   first + step, col_ok, M)
    for tile in tl.range(pid, num_tiles, num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        if PREFETCH == 2:
            x_raw, g_raw, mean, rstd = x_a, g_a, mean_a, rstd_a
            x_a, g_a, mean_a, rstd_a = x_b, g_b, mean_b, rstd_b
            x_b, g_b, mean_b, rstd_b = _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs + 2 * stride,
                                                       rows + 2 * step, col_ok, M)
        elif PREFETCH == 1:
            x_raw, g_raw, mean, rstd = x_a, g_a, mean_a, rstd_a
            x_a, g_a, mean_a, rstd_a = _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs + stride, rows + step,
                                                       col_ok, M)
        else:
            x_raw, g_raw, mean, rstd = _bwd_tiled_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, offs, rows, col_ok, M)
        # the row-range kernel's maths: dz = g · gelu'(z), dx = rstd · (dx̂ - x̂ · mean(dx̂ · x̂) - mean(dx̂))
        xhat, dz = _bwd_tile(x_raw.to(tl.float32), g_raw.to(tl.float32), offs, mean, rstd, w, b, seed,
                             dropout_p, keep_scale, HAS_DROPOUT, APPROX_TANH, LEAN, FAST_TANH)
        dw_acc += dz * xhat
        db_acc += dz
        dx = _bwd_dx(dz, xhat, w, rstd, N, inv_n, LEAN)
        mask = (rows < M)[:, None] & col_ok[None, :]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    part_off = pid.to(tl.int64) * N
    tl.store(dw_part_ptr + part_off + cols, tl.sum(dw_acc, axis=0), mask=col_ok)
    tl.store(db_part_ptr + part_off + cols, tl.sum(db_acc, axis=0), mask=col_ok)


@triton.jit
def _swish_dropout_residual_kernel(
    x_ptr,  # (numel,) contiguous
    res_ptr,  # (numel,) residual, dtype of x
    y_ptr,  # (numel,) output
    seed_ptr,  # (1,) int64 Philox seed (read only when HAS_DROPOUT)
    numel,
    dropout_p,
    HAS_DROPOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.sigmoid(x)
    if HAS_DROPOUT:
        keep = tl.rand(tl.load(seed_ptr), offs) >= dropout_p
        y = tl.where(keep, y / (1.0 - dropout_p), 0.0)
    y += tl.load(res_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _swish_dropout_bwd_kernel(
    dy_ptr,  # (numel,) upstream gradient
    x_ptr,  # (numel,) forward input
    dx_ptr,  # (numel,) output
    seed_ptr,  # (1,) int64 Philox seed of the forward
    numel,
    dropout_p,
    HAS_DROPOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        keep = tl.rand(tl.load(seed_ptr), offs) >= dropout_p
        g = tl.where(keep, g / (1.0 - dropout_p), 0.0)
    s = tl.sigmoid(x)
    # d(x·s)/dx = s + x·s·(1 - s)
    tl.store(dx_ptr + offs, (g * s * (1.0 + x * (1.0 - s))).to(dx_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _dropout_keep_kernel(
    seed_ptr,  # (1,) int64 Philox seed
    keep_ptr,  # (numel,) int8 output: 1 = kept
    numel,
    dropout_p,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = tl.rand(tl.load(seed_ptr), offs) >= dropout_p
    tl.store(keep_ptr + offs, keep.to(tl.int8), mask=offs < numel)


# --- CSR softmax ----------------------------------------------------------------------------
# Search space: BLOCK_L (columns per step) ∈ {16..256} and BLOCK_R (rows per program) so that
# a tile has 1K or 2K elements, × num_warps ∈ {2, 4, 8, 16}; pruned by the mean row length
# (the key: nnz // rows, known on the host without a sync) to BLOCK_L ∈ {p, 2p} with
# p = next_pow2(mean length) clamped to [16, 256], and 8 elements per thread (4 configs). Why:
# a step as wide as a typical row reads it in one go (a narrower one loops, a wider one idles
# lanes: the tuner weighs the two), and many rows per program amortise the crow loads and give
# enough bytes in flight; the two-pass loop keeps few live values, so 8 per thread suffices.
_CSR_CONFIGS = [
    triton.Config({"BLOCK_R": t // bl, "BLOCK_L": bl}, num_warps=w)
    for bl in (16, 32, 64, 128, 256) for t in (1024, 2048) for w in (2, 4, 8, 16)
]


_CSR_PER_THREAD = 8


def _csr_width(avg_len: int) -> int:
    return min(256, max(16, triton.next_power_of_2(max(1, avg_len))))


def _prune_csr(configs, named_args, **kwargs):
    p = _csr_width(named_args["AVG_LEN"])
    keep = [
        c for c in configs
        if c.kwargs["BLOCK_L"] in (p, min(256, 2 * p))
        and c.kwargs["BLOCK_R"] * c.kwargs["BLOCK_L"] == 32 * c.num_warps * _CSR_PER_THREAD
    ]
    return keep or configs[:1]


@triton.jit
def _sparse_softmax_kernel(
    values_ptr,  # (nnz,) stored values, float32/float16/bfloat16
    crow_ptr,  # (rows + 1,) int32/int64 CSR row pointers
    out_ptr,  # (nnz,) output, dtype of values
    rows,
    nnz,  # row ranges are clamped to [0, nnz]: a malformed crow never reads out of bounds
    AVG_LEN,  # nnz // rows: the autotune key
    BLOCK_R: tl.constexpr,  # rows per program
    BLOCK_L: tl.constexpr,  # columns per step of the row loop
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < rows
    start = tl.minimum(tl.load(crow_ptr + r, mask=r_ok, other=0).to(tl.int64), nnz)
    end = tl.minimum(tl.load(crow_ptr + r + 1, mask=r_ok, other=0).to(tl.int64), nnz)
    length = tl.maximum(end - start, 0)
    max_len = tl.max(length, axis=0).to(tl.int32)  # rows shorter than 2^31
    # the first BLOCK_L entries of every row stay in registers: rows that fit (the common
    # case when BLOCK_L ≥ the typical length) are read once; longer rows loop over the rest
    cols0 = tl.arange(0, BLOCK_L)
    mask0 = cols0[None, :] < length[:, None]
    offs0 = start[:, None] + cols0[None, :]
    v0 = tl.load(values_ptr + offs0, mask=mask0, other=float("-inf")).to(tl.float32)
    m = tl.max(v0, axis=1)
    ref = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(v0 - ref[:, None]), axis=1)
    # pass 1 over the rest: online max and sum of exp (rows still at max −inf contribute nothing)
    for c0 in range(BLOCK_L, max_len, BLOCK_L):
        cols = c0 + tl.arange(0, BLOCK_L)
        mask = cols[None, :] < length[:, None]
        v = tl.load(values_ptr + start[:, None] + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(v, axis=1))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(v - ref[:, None]), axis=1)
        m = m_new
    # an all −inf (or empty) row: subtract 0, exp gives 0 and the row's outputs are 0
    ref = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(s > 0, 1.0 / tl.where(s > 0, s, 1.0), 0.0)
    tl.store(out_ptr + offs0, (tl.exp(v0 - ref[:, None]) * inv[:, None]).to(out_ptr.dtype.element_ty), mask=mask0)
    # pass 2 over the rest: write (the values are read again, mostly from L2)
    for c0 in range(BLOCK_L, max_len, BLOCK_L):
        cols = c0 + tl.arange(0, BLOCK_L)
        mask = cols[None, :] < length[:, None]
        offs = start[:, None] + cols[None, :]
        v = tl.load(values_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(v - ref[:, None]) * inv[:, None]
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sparse_softmax_bwd_kernel(
    grad_ptr,  # (nnz,) upstream gradient
    y_ptr,  # (nnz,) forward output
    dx_ptr,  # (nnz,) output
    crow_ptr,  # (rows + 1,) int32/int64
    rows,
    nnz,
    AVG_LEN,  # nnz // rows: the autotune key
    BLOCK_R: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < rows
    start = tl.minimum(tl.load(crow_ptr + r, mask=r_ok, other=0).to(tl.int64), nnz)
    end = tl.minimum(tl.load(crow_ptr + r + 1, mask=r_ok, other=0).to(tl.int64), nnz)
    length = tl.maximum(end - start, 0)
    max_len = tl.max(length, axis=0).to(tl.int32)  # rows shorter than 2^31
    # the first BLOCK_L entries of every row stay in registers (rows that fit are read once)
    cols0 = tl.arange(0, BLOCK_L)
    mask0 = cols0[None, :] < length[:, None]
    offs0 = start[:, None] + cols0[None, :]
    g0 = tl.load(grad_ptr + offs0, mask=mask0, other=0.0).to(tl.float32)
    y0 = tl.load(y_ptr + offs0, mask=mask0, other=0.0).to(tl.float32)
    dot = tl.sum(g0 * y0, axis=1)
    # pass 1 over the rest: dot = Σ_row g·y
    for c0 in range(BLOCK_L, max_len, BLOCK_L):
        cols = c0 + tl.arange(0, BLOCK_L)
        mask = cols[None, :] < length[:, None]
        offs = start[:, None] + cols[None, :]
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dot += tl.sum(g * y, axis=1)
    # dx = y · (g - dot)
    tl.store(dx_ptr + offs0, (y0 * (g0 - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask0)
    for c0 in range(BLOCK_L, max_len, BLOCK_L):
        cols = c0 + tl.arange(0, BLOCK_L)
        mask = cols[None, :] < length[:, None]
        offs = start[:, None] + cols[None, :]
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offs, (y * (g - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask)


_sparse_softmax_tuned = triton.autotune(
    configs=_CSR_CONFIGS, key=["AVG_LEN"], prune_configs_by={"early_config_prune": _prune_csr}, do_bench=_quick_bench,
)(_sparse_softmax_kernel)
_sparse_softmax_bwd_tuned = triton.autotune(
    configs=_CSR_CONFIGS, key=["AVG_LEN"], prune_configs_by={"early_config_prune": _prune_csr}, do_bench=_quick_bench,
)(_sparse_softmax_bwd_kernel)


# --- CSR softmax, grouped rows (several short rows per warp) ---------------------------------
# The tile is [BLOCK_R, VPT, SUB]: element (r, k, s) is entry s + SUB·k of row r. Triton orders
# a layout's dimensions by the contiguity of the addresses (s: SUB consecutive entries; r and
# k: none, ties in dimension order: [2, 0, 1]), so SUB lanes share a row, 32 / SUB rows share
# a warp, the warps take further rows and the VPT entries of a lane stay in its registers — the
# CUDA C++ group shape (csrc/sparse_softmax.cu, g{SUB}x{VPT}) in Triton: the row max and sum
# are VPT in-thread steps then log2(SUB) shuffles for all the warp's rows at once (the
# [BLOCK_R, BLOCK_L] kernel above shuffles 5 times per row and register). Rows longer than
# CAP = SUB·VPT loop over CAP-wide chunks as the kernel above does. Checked on the sm_90
# lowering (tests: the layout of the loads is threadsPerWarp [1, 32/SUB, SUB]). The row sums
# reduce the in-thread axis first, then the lanes, and come back to the tile's layout through
# the matching expand_dims (no layout conversion).
# Config: SUB and VPT from the mean row length as the CUDA C++ launcher picks them (smallest
# CAP ≥ 1.9·mean, VPT = 8; the H200 run at 2·mean − 1 gave Q1 SUB 16: fwd 0.022 ms, fwd+bwd
# 0.045, and the CUDA C++ g8x8 beat g16x8 by 25 %); search space BLOCK_R = 32 / SUB · num_warps · rows per thread,
# num_warps ∈ {2, 4, 8} × rows per thread ∈ {1, 2}, pruned to 4 warps (1 or 2 rows per
# thread) and 8 warps (1 or 2): 4 configs, keyed on the mean length and SUB (each first use
# compiles them all, so the space stays small). Why: one or two rows per thread keeps 8-16
# values per thread per tensor (the CSR kernels' 8 per thread above), and the warps per
# program trade the crow loads' reuse against more, smaller programs in flight.
_GROUP_SHAPES = ((4, 8), (8, 8), (16, 8), (32, 4))  # (SUB, VPT), smallest capacity first (≤ 32, 64, 128, 128)
_GROUPED_CONFIGS = [triton.Config({"BLOCK_R": r}, num_warps=w) for r in (2, 4, 8, 16, 32, 64, 128) for w in (2, 4, 8)]
_GROUPED_WARPS = (4, 8)


def _prune_grouped(configs, named_args, **kwargs):
    per_warp = 32 // kwargs["SUB"]
    keep = [c for c in configs if c.num_warps in _GROUPED_WARPS
            and c.kwargs["BLOCK_R"] in (per_warp * c.num_warps, 2 * per_warp * c.num_warps)]
    return keep or configs[:1]


def _group_shape(rows: int, nnz: int) -> tuple[int, int]:
    """``(SUB, VPT)`` for the mean row length ``nnz / rows`` (no host sync): as the CUDA C++
    launcher, the smallest capacity ≥ 1.9·mean."""
    longest = 1.9 * nnz / max(rows, 1)
    for sub, vpt in _GROUP_SHAPES:
        if sub * vpt >= longest:
            return sub, vpt
    return _GROUP_SHAPES[-1]


@triton.jit
def _group_rows(crow_ptr, rows, nnz, BLOCK_R: tl.constexpr, SUB: tl.constexpr, VPT: tl.constexpr):
    """This program's rows: ``(start (BLOCK_R, 1, 1) int64, length (BLOCK_R, 1, 1) int32, col (1, VPT,
    SUB) int32, longest row length)``, row ranges clamped to [0, nnz] (rows shorter than 2^31).
    Addresses are ``ptr + start`` per row plus the 32-bit ``col`` per entry, masks 32-bit compares."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < rows
    start = tl.minimum(tl.load(crow_ptr + r, mask=r_ok, other=0).to(tl.int64), nnz)
    end = tl.minimum(tl.load(crow_ptr + r + 1, mask=r_ok, other=0).to(tl.int64), nnz)
    length = tl.maximum(end - start, 0).to(tl.int32)
    max_len = tl.max(length, axis=0)
    col = tl.arange(0, SUB)[None, None, :] + SUB * tl.arange(0, VPT)[:, None][None, :, :]
    return start[:, None, None], length[:, None, None], col, max_len


@triton.jit
def _row_max(v):
    """``(BLOCK_R, VPT, SUB)`` → the row maxima ``(BLOCK_R, 1, 1)`` (in-thread axis first, then the lanes)."""
    return tl.max(tl.max(v, axis=1), axis=1)[:, None][:, None, :]


@triton.jit
def _row_sum(v):
    """``(BLOCK_R, VPT, SUB)`` → the row sums ``(BLOCK_R, 1, 1)``."""
    return tl.sum(tl.sum(v, axis=1), axis=1)[:, None][:, None, :]


@triton.jit
def _sparse_softmax_grouped_kernel(
    values_ptr,  # (nnz,) stored values, float32/float16/bfloat16
    crow_ptr,  # (rows + 1,) int32/int64 CSR row pointers
    out_ptr,  # (nnz,) output, dtype of values
    rows,
    nnz,  # row ranges are clamped to [0, nnz]
    AVG_LEN,  # nnz // rows: the autotune key
    SUB: tl.constexpr,  # lanes per row
    VPT: tl.constexpr,  # entries per lane per chunk (a chunk: SUB·VPT entries of a row)
    BLOCK_R: tl.constexpr,  # rows per program: a multiple of 32 / SUB · num_warps
):
    start, length, col, max_len = _group_rows(crow_ptr, rows, nnz, BLOCK_R, SUB, VPT)
    v_row = values_ptr + start
    o_row = out_ptr + start
    mask0 = col < length
    v0 = tl.load(v_row + col, mask=mask0, other=float("-inf")).to(tl.float32)
    m0 = _row_max(v0)
    ref0 = tl.where(m0 == float("-inf"), 0.0, m0)
    # exp(v - ref) as 2^(v·log2e - ref·log2e): one fma and one ex2 (flushing results below 2^-126
    # to 0) per entry; kept: the output is e0 rescaled per row, no second exp
    e0 = tl.exp2(v0 * _LOG2E_C - ref0 * _LOG2E_C)
    s = _row_sum(e0)
    m = m0
    # rows longer than one chunk: online max and sum over the rest (only when the program has one)
    for c0 in range(SUB * VPT, max_len, SUB * VPT):
        mask = col + c0 < length
        v = tl.load(v_row + (col + c0), mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, _row_max(v))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + _row_sum(tl.exp2(v * _LOG2E_C - ref * _LOG2E_C))
        m = m_new
    # an all −inf (or empty) row: subtract 0, exp gives 0 and the row's outputs are 0
    ref = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(s > 0, 1.0 / tl.where(s > 0, s, 1.0), 0.0)
    # e0 was taken against ref0 ≤ ref (equal unless a later chunk raised the max); a first chunk
    # of only −inf has e0 = 0 and must not meet exp(0 − ref) = inf
    scale0 = tl.where(m0 == float("-inf"), 0.0, tl.exp(ref0 - ref) * inv)
    tl.store(o_row + col, (e0 * scale0).to(out_ptr.dtype.element_ty), mask=mask0)
    for c0 in range(SUB * VPT, max_len, SUB * VPT):
        mask = col + c0 < length
        v = tl.load(v_row + (col + c0), mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.exp2(v * _LOG2E_C - ref * _LOG2E_C)
        tl.store(o_row + (col + c0), (e * inv).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sparse_softmax_grouped_bwd_kernel(
    grad_ptr,  # (nnz,) upstream gradient
    y_ptr,  # (nnz,) forward output
    dx_ptr,  # (nnz,) output
    crow_ptr,  # (rows + 1,) int32/int64
    rows,
    nnz,
    AVG_LEN,  # nnz // rows: the autotune key
    SUB: tl.constexpr,
    VPT: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    start, length, col, max_len = _group_rows(crow_ptr, rows, nnz, BLOCK_R, SUB, VPT)
    g_row = grad_ptr + start
    y_row = y_ptr + start
    d_row = dx_ptr + start
    mask0 = col < length
    g0 = tl.load(g_row + col, mask=mask0, other=0.0).to(tl.float32)
    y0 = tl.load(y_row + col, mask=mask0, other=0.0).to(tl.float32)
    dot = _row_sum(g0 * y0)
    for c0 in range(SUB * VPT, max_len, SUB * VPT):
        mask = col + c0 < length
        g = tl.load(g_row + (col + c0), mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_row + (col + c0), mask=mask, other=0.0).to(tl.float32)
        dot += _row_sum(g * y)
    tl.store(d_row + col, (y0 * (g0 - dot)).to(dx_ptr.dtype.element_ty), mask=mask0)
    for c0 in range(SUB * VPT, max_len, SUB * VPT):
        mask = col + c0 < length
        g = tl.load(g_row + (col + c0), mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_row + (col + c0), mask=mask, other=0.0).to(tl.float32)
        tl.store(d_row + (col + c0), (y * (g - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


_sparse_softmax_grouped_tuned = triton.autotune(
    configs=_GROUPED_CONFIGS, key=["AVG_LEN", "SUB"], prune_configs_by={"early_config_prune": _prune_grouped},
    do_bench=_quick_bench,
)(_sparse_softmax_grouped_kernel)
_sparse_softmax_grouped_bwd_tuned = triton.autotune(
    configs=_GROUPED_CONFIGS, key=["AVG_LEN", "SUB"], prune_configs_by={"early_config_prune": _prune_grouped},
    do_bench=_quick_bench,
)(_sparse_softmax_grouped_bwd_kernel)


# --- launchers ------------------------------------------------------------------------------

# The hardware tanh (``tanh.approx.f32``, relative error ≈ 2^-11) for the tanh GELU where the
# output is 16-bit: its error is far below one bfloat16 rounding (2^-8) and about one float16
# rounding (2^-11). Forward (0.5·z·(1 + t): the error of t scaled by |z|/2): on for bfloat16
# and float16 (H200, 4,096 × 256 of the tests' inputs: within the float16 tolerance, 2e-3, as
# well as the bfloat16 one; L2 forward kernel 36.7 µs with it and the 8×4×4 config, 38.7
# before). Backward (``BWD_VARIANTS``' ``fast_tanh``, None = this list): bfloat16 only. gelu'
# needs 1 - t², whose absolute error near |t| = 1 is the error of t amplified by z·u' (up to
# ≈ 10 for |z| ≈ 4): a worst-case bound (every t off by 2^-11) exceeds the float16 gradient
# tolerance (5e-3) and reaches the bfloat16 one, but the H200 measured dx within one bfloat16
# rounding of the exact form (max |Δdx| 0.031 at |dx| ≤ 6.5) and the bfloat16 gradient test
# passing; L2 backward kernel 72.8 instead of 74.1 µs. float32 keeps the exact formula
# everywhere, and the interpreter (no inline PTX on the CPU) always does.
FAST_TANH_FWD_DTYPES: tuple = (torch.bfloat16, torch.float16)
FAST_TANH_BWD_DTYPES: tuple = (torch.bfloat16,)
# The forward kernel loads weight and bias as whole (BLOCK_M, BLOCK_N) tiles in the layout of x
# (``WB_TILE``) instead of (BLOCK_N,) vectors broadcast through a shared-memory layout
# conversion: 3 instead of 7 barriers per program on L2 (sm_90 SASS), 16 more conversions per
# thread. Off until measured (the benchmark sweeps it).
FWD_WB_TILE: bool = False
_TANH_APPROX_MIN_CAPABILITY = (7, 5)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _fast_tanh_allowed(device: torch.device, interpreting: bool | None = None,
                       capability: tuple[int, int] | None = None) -> bool:
    """Whether ``tanh.approx.f32`` can be used on ``device``: a CUDA device of sm_75 or newer, and
    not under the Triton interpreter (``interpreting``/``capability`` override the probes, for tests)."""
    if _interpreting() if interpreting is None else interpreting:
        return False
    if device.type != "cuda":
        return False
    if capability is None:
        capability = _capability(device.index if device.index is not None else torch.cuda.current_device())
    return tuple(capability) >= _TANH_APPROX_MIN_CAPABILITY


def _fast_tanh(requested: bool | None, dtype: torch.dtype, device: torch.device, approximate: str, default_dtypes,
               interpreting: bool | None = None, capability: tuple[int, int] | None = None) -> bool:
    """The ``FAST_TANH`` flag of a launch on rows of ``dtype``: only for the tanh GELU on a device
    that has ``tanh.approx`` (never under the interpreter); ``requested`` None → ``dtype in
    default_dtypes``; True → 16-bit dtypes only (float32 keeps the exact form); False → off."""
    if approximate != "tanh" or not requested and requested is not None:
        return False
    if requested is None:
        wanted = dtype in default_dtypes
    else:
        wanted = dtype in (torch.float16, torch.bfloat16)
    return wanted and _fast_tanh_allowed(device, interpreting, capability)



def _row_block_n(n: int, max_block_n: int | None) -> tuple[int, bool]:
    cap = _MAX_BLOCK_N if max_block_n is None else max_block_n
    block_n = triton.next_power_of_2(max(1, n))
    return (block_n, True) if block_n <= cap else (cap, False)


def _seed_arg(seed: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return like if seed is None else seed


_FWD_LAST: dict = {}  # the last forward launch's variant and flags (read by tests and the benchmark)
# the autotuner's choice per (N, row class, dtypes, dropout, flags): later calls launch the kernel
# with it directly (the autotuner's run() rebuilds its key from every argument on each call)
_FWD_TUNED: dict = {}

# --- LayerNorm+GELU forward variants ----------------------------------------------------------
# "tiles" (default): ``_layer_norm_gelu_fwd_kernel``, one program per TILES tiles, autotuned
# (H200, L2: 38.7 µs of kernel for a 31 µs floor). The persistent variants run
# ``_layer_norm_gelu_fwd_persistent_kernel``: G = SMs × resident programs (from the compiled
# kernel's registers and shared memory, as the backward's tiled grid), each walking the row
# tiles pid, pid + G, … with the x loads pipelined ``stages - 1`` tiles ahead through shared
# memory (cp.async), weight and bias loaded once per program, 1/N hoisted (sm_90 SASS on L2:
# 20.8 instructions per element at 16 values per thread against 25 for the tile kernel's
# BLOCK_M 8 × 4 warps, where each program pays its weight/bias layout conversion and barriers
# for one tile). Entries as ``BWD_VARIANTS``: ``per_thread`` x values per thread per tile,
# ``warps``, ``stages``, ``per_sm`` (None: from the compiled kernel).
FWD_VARIANTS = {
    "persistent-s3": dict(per_thread=16, warps=4, stages=3, per_sm=None),
    "persistent-s2": dict(per_thread=16, warps=4, stages=2, per_sm=None),
    "persistent-s4": dict(per_thread=16, warps=4, stages=4, per_sm=None),
    "persistent8-s3": dict(per_thread=8, warps=4, stages=3, per_sm=None),
}
_FWD_TILES = "tiles"
FWD_VARIANT: str = _FWD_TILES


def _layer_norm_gelu_forward_persistent(args, meta, config, device: torch.device, block_m=None,
                                        num_warps=None) -> None:
    """Launch ``_layer_norm_gelu_fwd_persistent_kernel`` for a ``FWD_VARIANTS`` config (one-tile
    rows); ``block_m``/``num_warps`` override the config's tile shape."""
    m_rows, block_n = args[7], meta["BLOCK_N"]
    bm, warps = _tiled_shape(block_n, config)
    bm = min(block_m or bm, triton.next_power_of_2(max(m_rows, 1)))
    warps = num_warps or warps
    tiles = triton.cdiv(m_rows, bm)
    kmeta = dict(APPROX_TANH=meta["APPROX_TANH"], HAS_DROPOUT=meta["HAS_DROPOUT"], EVEN_N=meta["EVEN_N"],
                 BLOCK_N=block_n, BLOCK_M=bm, FAST_TANH=meta["FAST_TANH"], STAGES=config["stages"],
                 num_warps=warps, num_stages=1)
    if device.type == "cuda" and not _interpreting():
        probe = (*args, 2)
        per_sm = _tiled_programs_per_sm(probe, kmeta, config, device, _layer_norm_gelu_fwd_persistent_kernel)
        programs = _num_sms(device) * per_sm
    else:
        programs = 3  # the interpreter: a few programs, several tiles each
    g = max(1, min(programs, tiles))
    _FWD_LAST.update(block_m=bm, num_warps=warps, programs=g, stages=config["stages"])
    _layer_norm_gelu_fwd_persistent_kernel[(g,)](*args, g, **kmeta)


def layer_norm_gelu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, approximate: str,
    dropout_p: float = 0.0, seed: torch.Tensor | None = None, *,
    block_m: int | None = None, num_warps: int | None = None, max_block_n: int | None = None,
    tiles: int | None = None, fast_tanh: bool | None = None, wb_tile: bool | None = None,
    variant: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dim, GELU, optional dropout, in one pass over ``x``.

    Args:
        x: ``(M, N)`` contiguous float32/float16/bfloat16.
        weight, bias: ``(N,)`` contiguous.
        eps: variance epsilon; approximate: ``"tanh"`` or ``"none"``.
        dropout_p: drop probability in [0, 1), used when ``seed`` is given.
        seed: ``(1,)`` int64 tensor on ``x``'s device (the Philox seed), or None for no dropout.
        block_m, num_warps, tiles: a fixed config: rows per tile, warps, consecutive tiles per
            program (prefetched; rows that fit one tile only) — bypasses autotuning (automatic
            under the interpreter, with ``tiles`` 1 unless given).
        max_block_n: widest single tile (default 8192); wider rows take the chunked path. Giving
            it also bypasses autotuning (the tuned config belongs to the default tiling).
        fast_tanh: the tanh GELU through the hardware tanh: None (default) where ``x.dtype`` is in
            ``FAST_TANH_FWD_DTYPES``, True for any 16-bit ``x``, False never; never under the
            interpreter or for float32 (see ``_fast_tanh``).
        wb_tile: load weight/bias in the tile's layout (default ``FWD_WB_TILE``).
        variant: ``"tiles"`` (the autotuned tile kernel), a key of ``FWD_VARIANTS`` (the
            persistent pipelined kernel for rows that fit one tile, unless ``tiles`` or
            ``max_block_n`` is given; ``block_m``/``num_warps`` then override its tile shape), or
            None: the module-level ``FWD_VARIANT``.
    Returns:
        ``(y (M, N) x.dtype, mean (M,) float32, rstd (M,) float32)``; no host synchronisation.
    """
    m_rows, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(m_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m_rows, dtype=torch.float32, device=x.device)
    if m_rows == 0:
        return y, mean, rstd
    block_n, one_tile = _row_block_n(n, max_block_n)
    args = (x, weight, bias, y, mean, rstd, _seed_arg(seed, x), m_rows, n, float(eps), float(dropout_p))
    meta = dict(APPROX_TANH=approximate == "tanh", HAS_DROPOUT=seed is not None, ONE_TILE=one_tile,
                EVEN_N=n == block_n, BLOCK_N=block_n,
                FAST_TANH=_fast_tanh(fast_tanh, x.dtype, x.device, approximate, FAST_TANH_FWD_DTYPES),
                WB_TILE=FWD_WB_TILE if wb_tile is None else bool(wb_tile))
    if variant is None:
        variant = FWD_VARIANT
    if variant != _FWD_TILES and variant not in FWD_VARIANTS:
        raise ValueError(f"variant: expected {_FWD_TILES!r} or one of {tuple(FWD_VARIANTS)}, got {variant!r}")
    _FWD_LAST.clear()
    _FWD_LAST.update(variant=variant, fast_tanh=meta["FAST_TANH"], wb_tile=meta["WB_TILE"])
    if variant != _FWD_TILES and one_tile and tiles is None and max_block_n is None:
        _layer_norm_gelu_forward_persistent(args, meta, FWD_VARIANTS[variant], x.device, block_m, num_warps)
    elif block_m is None and tiles is None and max_block_n is None and _autotuning():
        m_class = _m_class(m_rows)
        key = (n, m_class, x.dtype, weight.dtype, bias.dtype, seed is None, *meta.values())
        cfg = _FWD_TUNED.get(key)
        if cfg is None:  # first call of this shape class: the autotuner times its configs (or finds its cache)
            _layer_norm_gelu_fwd_tuned[lambda c: (triton.cdiv(m_rows, c["BLOCK_M"] * c["TILES"]),)](
                *args, **meta, M_CLASS=m_class)
            _FWD_TUNED[key] = _layer_norm_gelu_fwd_tuned.best_config
        else:  # its choice, launched without the autotuner's per-call work (≈ 40 µs of host time)
            _layer_norm_gelu_fwd_kernel[(triton.cdiv(m_rows, cfg.kwargs["BLOCK_M"] * cfg.kwargs["TILES"]),)](
                *args, **meta, M_CLASS=m_class, **cfg.all_kwargs())
    else:
        bm = block_m or min(_default_block_m(block_n, _FWD_SPACE["tiles"][1]), triton.next_power_of_2(m_rows))
        t = (tiles or 1) if one_tile else 1
        # M_CLASS as the autotuner passes it: a fixed config it has timed reuses its compiled kernel
        _layer_norm_gelu_fwd_kernel[(triton.cdiv(m_rows, bm * t),)](
            *args, **meta, BLOCK_M=bm, TILES=t, num_warps=num_warps or _default_warps(bm, block_n),
            M_CLASS=_m_class(m_rows),
        )
    return y, mean, rstd


@functools.lru_cache(maxsize=None)
def _num_sms_cuda(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _num_sms_cuda(device.index if device.index is not None else torch.cuda.current_device())
    return 1  # the interpreter: a few programs are enough to exercise the partial sums


def layer_norm_gelu_backward(
    grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
    mean: torch.Tensor, rstd: torch.Tensor, approximate: str,
    dropout_p: float = 0.0, seed: torch.Tensor | None = None, *,
    block_m: int | None = None, num_warps: int | None = None, max_block_n: int | None = None,
    num_programs: int | None = None, variant: str | None = None, fast_tanh: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact gradients of ``layer_norm_gelu`` w.r.t. ``x``, ``weight`` and ``bias``.

    Args:
        grad_y: ``(M, N)`` contiguous, dtype of ``x``; x, weight, bias: as the forward.
        mean, rstd: ``(M,)`` float32 from the forward; dropout_p, seed: the forward's.
        block_m, num_warps, max_block_n: as the forward; num_programs: ``G`` (default: a few per SM).
        variant: a key of ``BWD_VARIANTS`` (the persistent row-tile kernel with that config;
            rows wider than 1024 take the row-range kernel), ``"rowrange"`` (the autotuned
            row-range kernel), or None (default): the module-level ``BWD_VARIANT`` ("tiled").
            ``block_m``/``num_warps``/``num_programs`` override the variant's config.
        fast_tanh: overrides the variant's ``fast_tanh`` (the tiled kernels only): None keeps it,
            True/False as the forward's argument (16-bit rows only, never under the interpreter).
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
    if variant is None:
        variant = BWD_VARIANT or _ROWRANGE
    if variant != _ROWRANGE:
        if variant not in BWD_VARIANTS:
            raise ValueError(f"variant: expected {_ROWRANGE!r} or one of {tuple(BWD_VARIANTS)}, got {variant!r}")
        if one_tile and block_n <= _TILED_MAX_N:
            config = BWD_VARIANTS[variant]
            if fast_tanh is not None:
                config = dict(config, fast_tanh=bool(fast_tanh))
            return _layer_norm_gelu_backward_tiled(
                grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed, dx, dweight, dbias,
                config, block_n, block_m, num_warps, num_programs,
            )
    if num_programs is None:
        num_programs = _num_sms(x.device) * (_BWD_PROGRAMS_PER_SM if x.device.type == "cuda" else 3)
    rows_per_program = triton.cdiv(max(m_rows, 1), max(1, min(num_programs, m_rows)))
    g = triton.cdiv(m_rows, rows_per_program)
    dw_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    db_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    if g:
        args = (grad_y, x, weight, bias, mean, rstd, _seed_arg(seed, x), dx, dw_part, db_part,
                m_rows, n, rows_per_program, float(dropout_p))
        meta = dict(APPROX_TANH=approximate == "tanh", HAS_DROPOUT=seed is not None, ONE_TILE=one_tile, BLOCK_N=block_n)
        if block_m is None and max_block_n is None and _autotuning():
            _layer_norm_gelu_bwd_tuned[(g,)](*args, **meta)
        else:
            bm = block_m or min(_default_block_m(block_n, _BWD_SPACE["tiles"][1]), triton.next_power_of_2(rows_per_program))
            _layer_norm_gelu_bwd_kernel[(g,)](*args, **meta, BLOCK_M=bm, num_warps=num_warps or _default_warps(bm, block_n))
    _column_sum(dw_part, db_part, dweight, dbias, g, n)
    return dx, dweight, dbias


def _column_sum(dw_part, db_part, dweight, dbias, g: int, n: int) -> None:
    """``dweight = Σ_g dw_part[g]``, ``dbias = Σ_g db_part[g]`` (fixed order), cast on store.

    One launch. Each program owns ``BLOCK_N`` columns and reads all ``G`` partial rows in one
    step when ``G ≤ 4096`` (``BLOCK_G = next_pow2(G)``, 8 values per thread: every load
    independent, one L2 round trip; narrow column blocks give ``N / BLOCK_N`` programs, e.g.
    64 for L2's N = 256, G = 924, where 8 columns × 512 rows gave 32 programs and 2 steps).
    The partials were just written, so the reads hit L2 and the partly used sectors cost little.
    """
    if not n:
        return
    block_g = min(_SUM_MAX_BLOCK_G, triton.next_power_of_2(max(g, 16)))
    block_n = max(1, min(8, _SUM_ELEMENTS // block_g))
    warps = max(1, min(16, block_g * block_n // (32 * 8)))
    _column_sum_kernel[(triton.cdiv(n, block_n),)](
        dw_part, db_part, dweight, dbias, g, n, BLOCK_G=block_g, BLOCK_N=block_n, num_warps=warps
    )


_TILED_PER_SM: dict = {}  # compiled-kernel key → programs per SM (occupancy from its registers)
_TILED_LAST: dict = {}  # the last tiled launch's BLOCK_M, num_warps, programs (read by the benchmark)


def _tiled_programs_per_sm(args, meta, config, device: torch.device, kernel=None) -> int:
    """Programs of ``_layer_norm_gelu_bwd_tiled_kernel`` that fit on one SM at once.

    ``config["per_sm"]`` when given; else from the compiled kernel's registers (compiled and
    loaded once per specialisation by ``warmup``, no launch, no sync): 64K registers, 64 warps,
    32 programs and 228 KB of shared memory per SM (sm_80/sm_90), registers allocated per warp in
    units of 256. Falls back to 4 when the kernel cannot be inspected.
    """
    if config["per_sm"] is not None:
        return config["per_sm"]
    kernel = kernel or _layer_norm_gelu_bwd_tiled_kernel
    key = (kernel.__name__, device.index, args[0].dtype, args[1].dtype, args[2].dtype, args[3].dtype,
           tuple(sorted(meta.items())))
    if key not in _TILED_PER_SM:
        try:
            k = kernel.warmup(*args, grid=(1,), **meta)
            if hasattr(k, "result"):
                k = k.result()
            k._init_handles()
            warps = meta["num_warps"]
            regs_per_warp = -(-max(1, k.n_regs) * 32 // 256) * 256
            fit = min(65536 // (regs_per_warp * warps), 64 // warps, 32,
                      (228 * 1024) // (k.metadata.shared + 1024))
            _TILED_PER_SM[key] = max(1, fit)
        except Exception:  # noqa: BLE001 - an inspection failure only costs occupancy
            _TILED_PER_SM[key] = 4
    return _TILED_PER_SM[key]


def _tiled_maxnreg(config: dict, x_dtype: torch.dtype, has_dropout: bool, block_n: int, block_m: int,
                   warps: int) -> int | None:
    """The register cap of a ``BWD_VARIANTS`` config for this launch (``regs16``), or None."""
    if config["regs16"] is None or has_dropout or x_dtype.itemsize != 2:
        return None
    return config["regs16"] if block_m * block_n == 8 * 32 * warps else None


def _tiled_shape(block_n: int, config: dict, itemsize: int = 4) -> tuple[int, int]:
    """``(BLOCK_M, num_warps)`` for a ``BWD_VARIANTS``/``FWD_VARIANTS`` config, row block
    ``block_n`` and element size (``per_thread16``, when the config has it, for 16-bit rows)."""
    per_thread, warps = config["per_thread"], config["warps"]
    if itemsize == 2:
        per_thread = config.get("per_thread16", per_thread)
    per_thread = max(per_thread, min(8, block_n // 32))  # a warp spans a row (up to 8 values per thread)
    while per_thread * 32 * warps < block_n and warps < 16:
        warps *= 2
    return max(1, per_thread * 32 * warps // block_n), warps


def _layer_norm_gelu_backward_tiled(
    grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed, dx, dweight, dbias,
    config, block_n, block_m, num_warps, num_programs,
):
    """``layer_norm_gelu_backward`` with ``_layer_norm_gelu_bwd_tiled_kernel`` (a ``BWD_VARIANTS`` config)."""
    m_rows, n = x.shape
    # (per_thread16: 16-bit rows without dropout; Philox per element doubles the registers)
    bm, warps = _tiled_shape(block_n, config, x.element_size() if seed is None else 4)
    bm = min(block_m or bm, triton.next_power_of_2(max(m_rows, 1)))
    warps = num_warps or warps
    tiles = triton.cdiv(m_rows, bm)
    fast = _fast_tanh(config["fast_tanh"], x.dtype, x.device, approximate, FAST_TANH_BWD_DTYPES)
    meta = dict(APPROX_TANH=approximate == "tanh", HAS_DROPOUT=seed is not None, PREFETCH=config["prefetch"],
                LEAN=config["lean"], BLOCK_N=block_n, BLOCK_M=bm, FAST_TANH=fast, STAGES=config["stages"],
                num_warps=warps, num_stages=1)
    cap = _tiled_maxnreg(config, x.dtype, seed is not None, block_n, bm, warps)
    if cap is not None:
        meta["maxnreg"] = cap
    if num_programs is None and tiles:
        if x.device.type == "cuda" and not _interpreting():
            probe = (grad_y, x, weight, bias, mean, rstd, _seed_arg(seed, x), dx, mean, mean, m_rows, n, 2, float(dropout_p))
            num_programs = _num_sms(x.device) * _tiled_programs_per_sm(probe, meta, config, x.device)
        else:
            num_programs = 3  # the interpreter: a few programs, several tiles each
    g = min(max(1, num_programs or 1), tiles)  # 0 without rows: the column sum then writes zeros
    _TILED_LAST.update(block_m=bm, num_warps=warps, programs=g, maxnreg=cap, fast_tanh=fast, stages=config["stages"])
    dw_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    db_part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    if g:
        _layer_norm_gelu_bwd_tiled_kernel[(g,)](
            grad_y, x, weight, bias, mean, rstd, _seed_arg(seed, x), dx, dw_part, db_part,
            m_rows, n, g, float(dropout_p), **meta,
        )
    _column_sum(dw_part, db_part, dweight, dbias, g, n)
    return dx, dweight, dbias


def swish_dropout_residual(
    x: torch.Tensor, residual: torch.Tensor, dropout_p: float, seed: torch.Tensor | None
) -> torch.Tensor:
    """``dropout(x·sigmoid(x)) + residual`` elementwise.

    Args:
        x, residual: contiguous, same shape and dtype (float32/float16/bfloat16).
        dropout_p: in [0, 1); seed: ``(1,)`` int64 on x's device, or None for no dropout.
    Returns:
        a tensor like ``x``; one launch, no host synchronisation.
    """
    y = torch.empty_like(x)
    numel = x.numel()
    if numel:
        _swish_dropout_residual_kernel[(triton.cdiv(numel, _ELEMENTWISE_BLOCK),)](
            x, residual, y, _seed_arg(seed, x), numel, float(dropout_p),
            HAS_DROPOUT=seed is not None, BLOCK=_ELEMENTWISE_BLOCK, num_warps=4,
        )
    return y


def swish_dropout_backward(
    grad: torch.Tensor, x: torch.Tensor, dropout_p: float, seed: torch.Tensor | None
) -> torch.Tensor:
    """Gradient of ``swish_dropout_residual`` w.r.t. ``x`` (the mask regenerated from ``seed``)."""
    dx = torch.empty_like(x)
    numel = x.numel()
    if numel:
        _swish_dropout_bwd_kernel[(triton.cdiv(numel, _ELEMENTWISE_BLOCK),)](
            grad, x, dx, _seed_arg(seed, x), numel, float(dropout_p),
            HAS_DROPOUT=seed is not None, BLOCK=_ELEMENTWISE_BLOCK, num_warps=4,
        )
    return dx


def dropout_keep_mask(seed: torch.Tensor, shape, dropout_p: float) -> torch.Tensor:
    """The keep-mask the fused kernels draw for an output of ``shape`` (bool, on seed's device).

    Element ``i`` of the flattened output is kept when ``tl.rand(seed, i) >= dropout_p``.
    Used by the tests to feed the reference the very mask of the kernels.
    """
    numel = math.prod(shape)
    keep = torch.empty(numel, dtype=torch.int8, device=seed.device)
    if numel:
        _dropout_keep_kernel[(triton.cdiv(numel, _ELEMENTWISE_BLOCK),)](
            seed, keep, numel, float(dropout_p), BLOCK=_ELEMENTWISE_BLOCK
        )
    return keep.view(shape).bool()


def _csr_launch(tuned, kernel, args, rows, avg_len, block_r, block_l, num_warps):
    if block_r is None and _autotuning():
        tuned[lambda c: (triton.cdiv(rows, c["BLOCK_R"]),)](*args, avg_len)
    else:
        bl = block_l or _csr_width(avg_len)
        br = block_r or max(1, min(1024 // bl, triton.next_power_of_2(rows)))
        kernel[(triton.cdiv(rows, br),)](*args, avg_len, BLOCK_R=br, BLOCK_L=bl, num_warps=num_warps or 4)


# the CSR softmax kernel the launchers run when ``layout`` is None: "grouped" (several short rows
# per warp, ``_sparse_softmax_grouped_kernel``) or "tile" (``_sparse_softmax_kernel``)
CSR_LAYOUT = "grouped"
_CSR_LAYOUTS = ("grouped", "tile")


def _grouped_launch(tuned, kernel, args, rows, nnz, avg_len, block_r, num_warps, sub, vpt):
    if sub is None:
        sub, vpt = _group_shape(rows, nnz)
    vpt = vpt or 8
    if block_r is None and num_warps is None and _autotuning():
        tuned[lambda c: (triton.cdiv(rows, c["BLOCK_R"]),)](*args, avg_len, SUB=sub, VPT=vpt)
    else:
        w = num_warps or 4
        br = block_r or 32 // sub * w
        kernel[(triton.cdiv(rows, br),)](*args, avg_len, SUB=sub, VPT=vpt, BLOCK_R=br, num_warps=w)


def _check_layout(layout):
    layout = layout or CSR_LAYOUT
    if layout not in _CSR_LAYOUTS:
        raise ValueError(f"layout: expected None or one of {_CSR_LAYOUTS}, got {layout!r}")
    return layout


def sparse_softmax(
    values: torch.Tensor, crow: torch.Tensor, *, layout: str | None = None,
    block_r: int | None = None, block_l: int | None = None, num_warps: int | None = None,
    sub: int | None = None, vpt: int | None = None,
) -> torch.Tensor:
    """Softmax of each CSR row's stored values.

    Args:
        values: ``(nnz,)`` contiguous float32/float16/bfloat16.
        crow: ``(rows + 1,)`` int32/int64 row pointers (not checked here: row ranges are clamped
            to ``[0, nnz]`` so a malformed crow cannot read or write out of bounds).
        layout: ``"grouped"`` (groups of ``sub`` lanes per row, ``vpt`` entries per lane),
            ``"tile"`` (a ``(block_r, block_l)`` tile of rows), or None: ``CSR_LAYOUT``.
        block_r, num_warps (both layouts), block_l ("tile"), sub, vpt ("grouped"; power-of-two
            ``sub`` ≤ 32; default from the mean row length): a fixed config, bypassing
            autotuning (automatic under the interpreter).
    Returns:
        ``(nnz,)`` like ``values``; empty rows write nothing, all −inf rows give 0. One launch,
        no host sync.
    """
    out = torch.empty_like(values)
    rows, nnz = crow.numel() - 1, values.numel()
    layout = _check_layout(layout)
    if rows > 0 and nnz > 0:
        args = (values, crow, out, rows, nnz)
        if layout == "grouped":
            _grouped_launch(_sparse_softmax_grouped_tuned, _sparse_softmax_grouped_kernel, args, rows, nnz,
                            _avg_len(nnz, rows), block_r, num_warps, sub, vpt)
        else:
            _csr_launch(_sparse_softmax_tuned, _sparse_softmax_kernel, args, rows, _avg_len(nnz, rows),
                        block_r, block_l, num_warps)
    return out


def sparse_softmax_backward(
    grad: torch.Tensor, y: torch.Tensor, crow: torch.Tensor, *, layout: str | None = None,
    block_r: int | None = None, block_l: int | None = None, num_warps: int | None = None,
    sub: int | None = None, vpt: int | None = None,
) -> torch.Tensor:
    """``dx = y·(g - Σ_row g·y)`` per CSR row; arguments as ``sparse_softmax`` (grad, y: ``(nnz,)``)."""
    dx = torch.empty_like(y)
    rows, nnz = crow.numel() - 1, y.numel()
    layout = _check_layout(layout)
    if rows > 0 and nnz > 0:
        args = (grad, y, dx, crow, rows, nnz)
        if layout == "grouped":
            _grouped_launch(_sparse_softmax_grouped_bwd_tuned, _sparse_softmax_grouped_bwd_kernel, args, rows, nnz,
                            _avg_len(nnz, rows), block_r, num_warps, sub, vpt)
        else:
            _csr_launch(_sparse_softmax_bwd_tuned, _sparse_softmax_bwd_kernel, args, rows, _avg_len(nnz, rows),
                        block_r, block_l, num_warps)
    return dx


def _avg_len(nnz: int, rows: int) -> int:
    # bucketed to a power of two, so nearby sizes share one autotuning result
    return triton.next_power_of_2(max(1, nnz // max(rows, 1)))
