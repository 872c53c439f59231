"""Triton kernels for the fused LayerNorm + GELU (+ dropout) forward; the backward is in
``layer_norm_gelu_backward.py``.

Memory-bound: the kernel reads ``x`` once and writes ``y`` and the per-row float32 ``mean``/``rstd``
once (bytes ``2·M·N·size + 8·M``), with the statistics, GELU and Philox dropout in float32
registers. ``TILES`` consecutive tiles of ``BLOCK_M`` rows × ``BLOCK_N ≥ N`` columns per program,
the next tile's load in flight while one is computed; rows wider than ``_MAX_BLOCK_N`` are walked
in chunks (three passes, the later ones mostly from L2). The tanh GELU of 16-bit rows takes the
hardware ``tanh.approx.f32`` (``FAST_TANH_FWD_DTYPES``); float32 and the interpreter keep the
exact formula.

Tuning: ``triton.autotune`` keyed on the row length, timed with CUDA-graph replays
(``_graph_bench``) and pinned for the benchmark shapes (``FWD_PINNED``). The launcher takes
``block_m``/``num_warps``/``tiles``/``max_block_n`` to bypass autotuning, and does so by itself
under ``TRITON_INTERPRET=1``. Design measurements: ``benchmarks/NOTES.md``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
import triton.testing
from triton.language.extra.cuda import libdevice

from .. import _backend
from . import _fused_common as _common
from ._fused_common import dropout, dropout_params, quick_bench, seed_arg
from . import _launch

# GELU constants (globals read by @triton.jit code must be tl.constexpr)
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)
# tanh GELU: u = c·(z + k·z³), folded for exp2 in the forward: sigmoid(2u) = 1 / (1 + 2^(z·(A0 + A1·z²)))
_C, _K, _LOG2E = tl.constexpr(0.7978845608028654), tl.constexpr(0.044715), 1.4426950408889634
_GELU_A0 = tl.constexpr(-2.0 * _C * _LOG2E)
_GELU_A1 = tl.constexpr(-2.0 * _C * _K * _LOG2E)
_CK = tl.constexpr(_C * _K)  # the hardware-tanh form: u = z·(c + c·k·z²)

# widest row held in registers as one tile; wider rows are processed in chunks of this width
_MAX_BLOCK_N = 8192
# read by @triton.jit code: the interpreter lacks libdevice (fixed at import, as Triton itself is)
_INTERPRET = tl.constexpr(_common.interpreting())


def _m_class(m_rows: int) -> int:
    """The forward's row-count class (part of its autotune key): 1 for ≥ 65,536 rows, where the
    multi-tile configs keep ≥ 2,048 programs in flight; 0 below, where they are pruned (too few
    programs: a 4-tile config ran at half the speed of one tile on 4,096 rows)."""
    return 1 if m_rows >= _MULTI_TILE_MIN_ROWS else 0


# --- autotuning search space ----------------------------------------------------------------
# A program handles (BLOCK_M, BLOCK_N) tiles, BLOCK_N = next_pow2(N) fixed by the launcher; the
# forward program walks TILES consecutive tiles, loading tile t + 1 before computing tile t.
# Search space: BLOCK_M ∈ 1..256 (powers of two) × num_warps ∈ 1..16 (× TILES ∈ {1, 4} for the
# forward), pruned per N (and dtype, through the autotune key) to
# - forward, TILES = 1: tiles of 2K-8K elements, 4, 8 or 16 warps, 4-16 elements per thread;
# - forward, TILES = 4 (rows that fit one tile): tiles of 1K-2K elements, 8 or 16 per thread,
#   2, 4 or 8 warps: the prefetched tile doubles the live values, and a program with a second
#   tile in flight overlaps its loads with its own maths;
# - backward (the row-range kernel): tiles of 1K-4K elements, 4 or 8 warps, 4-16 per thread.
# Why: memory-bound kernels need bytes in flight per SM: big tiles and 16 values per thread give
# the most per register; the backward keeps ~5 live float32 values per element and spills beyond
# 16 per thread, so its tiles are half the size; fewer values per thread let more programs share
# an SM, which the tuner weighs against the first. That leaves 1-10 forward configs and 1-6
# backward ones per N, so the first call for a new N costs a few seconds.
_ROW_CONFIGS = [
    triton.Config({"BLOCK_M": m}, num_warps=w) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256) for w in (1, 2, 4, 8, 16)
]
_FWD_CONFIGS = [
    triton.Config({"BLOCK_M": m, "TILES": t}, num_warps=w)
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256)
    for w in (1, 2, 4, 8, 16)
    for t in (1, 4)
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
        c
        for c in configs
        if c.kwargs["BLOCK_M"] in wanted
        and c.num_warps in warps
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


# Pinned forward configs: (BLOCK_N, dtype, M_CLASS) → (BLOCK_M, TILES, num_warps). A pinned shape
# autotunes over that one config only, so its choice cannot change between runs (the timing
# noise on a ≈ 5 µs kernel); from the graph-timed autotune recorded in benchmarks/NOTES.md.
FWD_PINNED: dict = {
    (1024, torch.float32, 0): (2, 1, 4),  # L1 (4,096 × 768 float32) and its class
    (256, torch.bfloat16, 1): (8, 4, 4),  # L2 (131,072 × 256 bfloat16) and its class
}


def _prune_fwd(configs, named_args, **kwargs):
    block_n = kwargs["BLOCK_N"]
    x = named_args.get("x_ptr")
    pin = FWD_PINNED.get((block_n, getattr(x, "dtype", None), kwargs.get("M_CLASS", 1)))
    if pin is not None:
        keep = [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["TILES"], c.num_warps) == tuple(pin)]
        if keep:
            return keep
    one = _row_space([c for c in configs if c.kwargs["TILES"] == 1], block_n, **_FWD_SPACE)
    if not kwargs["ONE_TILE"] or not kwargs.get("M_CLASS", 1):
        return one  # wide rows (the chunked path walks one tile per program) or few rows
    multi = _row_space([c for c in configs if c.kwargs["TILES"] > 1], block_n, **_FWD_MULTI_SPACE, fallback=False)
    m_rows = named_args.get("M", _MULTI_TILE_MIN_ROWS)
    multi = [
        c for c in multi if _launch.cdiv(m_rows, c.kwargs["BLOCK_M"] * c.kwargs["TILES"]) >= _MULTI_TILE_MIN_PROGRAMS
    ]
    return one + [c for c in multi if c not in one]


def _graph_bench(kernel_call, quantiles):
    """Autotune timing of the forward: replays of a CUDA graph of back-to-back launches
    (``do_bench_cudagraph``, ≈ 10 ms per config), falling back to ``quick_bench`` where a graph
    cannot be captured. Why: ``do_bench`` times each launch alone after flushing the L2 cache;
    on a ≈ 5 µs kernel the spread between configs is then within the noise and the choice
    changed from run to run. Graph replays time what a captured training step sees."""
    try:
        return triton.testing.do_bench_cudagraph(kernel_call, rep=10, quantiles=quantiles)
    except Exception:  # noqa: BLE001 - e.g. a capture already in progress: time it the plain way
        return quick_bench(kernel_call, quantiles)


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
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _gelu(z, APPROX_TANH: tl.constexpr, FAST_TANH: tl.constexpr = False):
    if APPROX_TANH and FAST_TANH:
        # 0.5·z·(1 + tanh(u)), u = z·(c + c·k·z²), tanh in hardware: one MUFU instead of the
        # exp2 form's MUFU.EX2 + MUFU.RCP
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
):
    pid = tl.program_id(0)
    seed, keep_scale = dropout_params(seed_ptr, dropout_p, HAS_DROPOUT)
    if ONE_TILE:
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
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
            h = dropout(h, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
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
            h = dropout(h, seed, offs, dropout_p, keep_scale, HAS_DROPOUT)
            tl.store(y_ptr + offs, h.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


_layer_norm_gelu_fwd_tuned = triton.autotune(
    configs=_FWD_CONFIGS,
    key=["N", "M_CLASS", "FAST_TANH"],
    prune_configs_by={"early_config_prune": _prune_fwd},
    do_bench=_graph_bench,
)(_layer_norm_gelu_fwd_kernel)


# --- launcher -------------------------------------------------------------------------------

# The hardware tanh (``tanh.approx.f32``, relative error ≈ 2^-11) for the tanh GELU where the
# output is 16-bit: far below one bfloat16 rounding (2^-8), about one float16 rounding (2^-11).
# Forward (0.5·z·(1 + t): t's error scaled by |z|/2): bfloat16 and float16. Backward: bfloat16
# only: gelu' needs 1 - t², whose error near |t| = 1 is t's amplified by up to ≈ 10, beyond the
# float16 gradient tolerance in the worst case (bfloat16 dx measured within one rounding of the
# exact form: benchmarks/NOTES.md). float32 and the interpreter (no inline PTX on the CPU) keep it exact.
FAST_TANH_FWD_DTYPES: tuple = (torch.bfloat16, torch.float16)
FAST_TANH_BWD_DTYPES: tuple = (torch.bfloat16,)
_TANH_APPROX_MIN_CAPABILITY = (7, 5)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _fast_tanh(
    dtype: torch.dtype,
    device: torch.device,
    approximate: str,
    dtypes,
    interpreting: bool | None = None,
    capability: tuple[int, int] | None = None,
) -> bool:
    """The ``FAST_TANH`` flag of a launch on rows of ``dtype``: the tanh GELU, ``dtype in dtypes``
    and a CUDA device of sm_75 or newer, never under the interpreter (``interpreting`` and
    ``capability`` override the probes, for tests)."""
    if approximate != "tanh" or dtype not in dtypes:
        return False
    if _common.interpreting() if interpreting is None else interpreting:
        return False
    if device.type != "cuda":
        return False
    if capability is None:
        capability = _capability(device.index if device.index is not None else torch.cuda.current_device())
    return tuple(capability) >= _TANH_APPROX_MIN_CAPABILITY


def _row_block_n(n: int, max_block_n: int | None) -> tuple[int, bool]:
    cap = _MAX_BLOCK_N if max_block_n is None else max_block_n
    block_n = _launch.next_power_of_2(max(1, n))
    return (block_n, True) if block_n <= cap else (cap, False)


_NATIVE_DONE: set = set()  # (plan key, device, M's class): registered, or found not registrable


def _native_register(key: tuple, args: tuple, plan: tuple, tanh: bool) -> None:
    """Hand the kernel this call launched to the native host path (``pcops._native``), once per
    shape class and Triton specialisation, so later calls of the class take it (the C++ side
    passes the arguments in ``layer_norm_gelu``'s order: ``csrc/host/layer_norm_gelu.cpp``).
    Starts the module's build on the first call."""
    from .. import _native

    host = _native.loaded()
    if host is None:
        return
    x, weight, bias = args[0], args[1], args[2]
    m_rows = args[7]
    done = (key, x.device.index, _native.spec(m_rows))
    if done in _NATIVE_DONE or not _native.registrable(x, weight, bias):
        return
    _NATIVE_DONE.add(done)
    grid = (_launch.cdiv(m_rows, plan[0]),)
    bound = _native.bind(_layer_norm_gelu_fwd_kernel, grid, args, plan[1], "pppppppiiff")
    if bound is not None:
        host.lng_register(x, weight, bias, tanh, _MULTI_TILE_MIN_ROWS, *bound, plan[0])


# the autotuner's choice per (N, row class, dtypes, dropout, flags): later calls launch the kernel
# with it directly (the autotuner's run() rebuilds its key from every argument on each call)
_FWD_TUNED: dict = {}
_FWD_PLANS: dict = {}  # the same key -> (rows per program, launch keywords)


def layer_norm_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    approximate: str,
    dropout_p: float = 0.0,
    seed: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    num_warps: int | None = None,
    max_block_n: int | None = None,
    tiles: int | None = None,
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
    Returns:
        ``(y (M, N) x.dtype, mean (M,) float32, rstd (M,) float32)``; one launch, no host sync.
    """
    m_rows, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(m_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m_rows, dtype=torch.float32, device=x.device)
    if m_rows == 0:
        return y, mean, rstd
    block_n, one_tile = _row_block_n(n, max_block_n)
    args = (x, weight, bias, y, mean, rstd, seed_arg(seed, x), m_rows, n, float(eps), float(dropout_p))
    meta = dict(
        APPROX_TANH=approximate == "tanh",
        HAS_DROPOUT=seed is not None,
        ONE_TILE=one_tile,
        EVEN_N=n == block_n,
        BLOCK_N=block_n,
        FAST_TANH=_fast_tanh(x.dtype, x.device, approximate, FAST_TANH_FWD_DTYPES),
    )
    if block_m is None and tiles is None and max_block_n is None and _common.autotuning():
        m_class = _m_class(m_rows)
        key = (n, m_class, x.dtype, weight.dtype, bias.dtype, seed is None, *meta.values())
        cfg = _FWD_TUNED.get(key)
        if cfg is None:  # first call of this shape class: the autotuner times its configs (or finds its cache)
            _layer_norm_gelu_fwd_tuned[lambda c: (_launch.cdiv(m_rows, c["BLOCK_M"] * c["TILES"]),)](
                *args, **meta, M_CLASS=m_class
            )
            cfg = _FWD_TUNED[key] = _layer_norm_gelu_fwd_tuned.best_config
            launched = True
        else:  # its choice, launched below without the autotuner's per-call work (≈ 40 µs of host time)
            launched = False
        plan = _FWD_PLANS.get(key)
        if plan is None:  # rows per program and the launch keywords, built once per shape class
            plan = _FWD_PLANS[key] = (
                cfg.kwargs["BLOCK_M"] * cfg.kwargs["TILES"],
                {**meta, "M_CLASS": m_class, **cfg.all_kwargs()},
            )
        if not launched:
            _launch.launch(_layer_norm_gelu_fwd_kernel, (_launch.cdiv(m_rows, plan[0]),), *args, **plan[1])
        if seed is None and x.is_cuda:
            _native_register(key, args, plan, approximate == "tanh")
    else:
        bm = block_m or min(_default_block_m(block_n, _FWD_SPACE["tiles"][1]), _launch.next_power_of_2(m_rows))
        t = (tiles or 1) if one_tile else 1
        # M_CLASS as the autotuner passes it: a fixed config it has timed reuses its compiled kernel
        _launch.launch(
            _layer_norm_gelu_fwd_kernel,
            (_launch.cdiv(m_rows, bm * t),),
            *args,
            **meta,
            BLOCK_M=bm,
            TILES=t,
            num_warps=num_warps or _default_warps(bm, block_n),
            M_CLASS=_m_class(m_rows),
        )
    _backend.log_kernel("layer_norm_gelu", f"_layer_norm_gelu_fwd_kernel FAST_TANH={meta['FAST_TANH']}")
    return y, mean, rstd
