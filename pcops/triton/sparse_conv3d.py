"""Triton kernels of ``pcops.sparse_conv3d``: implicit GEMM on the out-in table, forward, dgrad
and wgrad, deterministic (no atomics; bit-identical whatever tile configuration the tuner picks).

- ``gather_gemm``: ``out[m] = bias + Σ_k x[table[m, k]] @ W[k]`` (then ``max(·, 0)`` with the
  ReLU epilogue); a program owns a tile of ``BLOCK_M`` output rows × ``BLOCK_N`` channels and,
  for each kernel offset in order, gathers its rows' inputs (``BLOCK_C`` channels at a time; −1
  rows masked to zero) into a ``tl.dot`` on tensor cores (fp16/bf16; fp32 as IEEE or TF32 by
  ``torch.backends.cuda.matmul.allow_tf32``), float32 accumulation. The forward runs it on
  ``out_in``; the feature gradient runs it on the inverse table with ``Wᵀ``, or, for a
  submanifold map (its own inverse with the offsets mirrored), on ``out_in`` itself with the
  offsets of ``Wᵀ`` reversed.
- ``inverse_table``: the ``(N, K)`` inverse of an out-in table in one launch (each cell is
  written by at most one output row: no atomics).
- ``wgrad``: ``∂W[k] = Σ_m x[out_in[m, k]]ᵀ @ g[m]``, split over fixed chunks of rows into
  partial sums that one ``torch.sum`` adds in a fixed order.

Tiles: ``BLOCK_M`` rows, ``num_warps``, ``U`` offsets per step (their gathers issued before their
dots), ``BLOCK_C`` channels per gather and ``STAGES``, the software-pipeline depth of the step loop
(table column, gather and dot of later steps in flight), tuned per shape class on first use among
``GEMM_CONFIGS`` / ``TF32_CONFIGS`` (``gather_gemm``; the sweeps are in ``benchmarks/NOTES.md``).
A tile first loads its rows' whole table once and ranks the offsets some row uses (``K ≤ 32``);
its step loop visits only those, in order: none on the padding rows of the static form, all of
them on a dense submanifold map. With ``STAGES`` > 1 the loop has no branch (each step finds its
offset by rank), so the pipeliner can prefetch; one stage keeps the skip as a branch (TF32
measured faster so). Each
output element sums its offsets in order, each over its channels in order, whatever the tile
(tensor-core products are exact and accumulate per instruction in channel order; ``U`` > 1 only
with one channel chunk), so every configuration gives the same bits; results are bit-identical
run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from . import _launch

_WGRAD_ROWS = 4096  # rows per wgrad partial sum (fixed: the sum order depends on M alone)
_TUNE_SPIN_CYCLES = 2_000_000  # the tuner's GPU spin before each round (about 1 ms on an H200)


def _precision(dtype: torch.dtype, precision: str = "auto") -> str:
    """``tl.dot``'s input precision: float32 as asked (``"auto"``: TF32 where
    ``torch.backends.cuda.matmul.allow_tf32`` is set, else IEEE); ignored for 16-bit inputs
    (tensor cores with float32 accumulation)."""
    if dtype != torch.float32:
        return "tf32"
    if precision == "auto":
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return precision


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, _launch.next_power_of_2(max(n, 1))))


@triton.jit
def _gather_step(x_ptr, w_ptr, table_ptr, rows, rmask, k, u, K, cc, ccm, cols, cmask, C_IN, s_wk, s_wi, s_wo):
    """Offset ``k``'s gathered rows ``(BLOCK_M, BLOCK_C)`` and weight slice ``(BLOCK_C, BLOCK_N)``;
    all zero (every load masked: no memory traffic) where ``u`` is false."""
    src = tl.load(table_ptr + rows.to(tl.int64) * K + k, mask=rmask & u, other=-1)
    a = tl.load(
        x_ptr + src.to(tl.int64)[:, None] * C_IN + cc[None, :], mask=(src >= 0)[:, None] & ccm[None, :], other=0.0
    )
    b = tl.load(
        w_ptr + k * s_wk + cc[:, None] * s_wi + cols[None, :] * s_wo, mask=ccm[:, None] & cmask[None, :] & u, other=0.0
    )
    return a, b


@triton.jit
def _nth_offset(i, n_used, rank, kk, K, SKIP: tl.constexpr):
    """The ``i``-th used offset of the tile in increasing order (``K``: none, ``i ≥ n_used``);
    without ``SKIP`` every offset is used and the ``i``-th is ``i``."""
    if SKIP:
        k = tl.sum(tl.where(rank == i, kk, 0), axis=0)
        return tl.where(i < n_used, k, K)
    else:
        return i


@triton.jit
def _step(acc, x_ptr, w_ptr, table_ptr, rows, rmask, k0, k1, k2, k3, u0, u1, u2, u3, K, cc, cols, cmask, C_IN,
          s_wk, s_wi, s_wo, U: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """One step: the gathers of offsets ``k0..k{U-1}`` (``u``: used) over the channels ``cc``
    first, then their dots into ``acc`` in offset order."""
    ccm = cc < C_IN
    a0, b0 = _gather_step(x_ptr, w_ptr, table_ptr, rows, rmask, k0, u0, K, cc, ccm, cols, cmask, C_IN, s_wk, s_wi, s_wo)  # fmt: skip
    if U > 1:
        a1, b1 = _gather_step(x_ptr, w_ptr, table_ptr, rows, rmask, k1, u1, K, cc, ccm, cols, cmask, C_IN, s_wk, s_wi, s_wo)  # fmt: skip
    if U > 2:
        a2, b2 = _gather_step(x_ptr, w_ptr, table_ptr, rows, rmask, k2, u2, K, cc, ccm, cols, cmask, C_IN, s_wk, s_wi, s_wo)  # fmt: skip
    if U > 3:
        a3, b3 = _gather_step(x_ptr, w_ptr, table_ptr, rows, rmask, k3, u3, K, cc, ccm, cols, cmask, C_IN, s_wk, s_wi, s_wo)  # fmt: skip
    acc = tl.dot(a0, b0, acc, input_precision=PRECISION)
    if U > 1:
        acc = tl.dot(a1, b1, acc, input_precision=PRECISION)
    if U > 2:
        acc = tl.dot(a2, b2, acc, input_precision=PRECISION)
    if U > 3:
        acc = tl.dot(a3, b3, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _gather_gemm_kernel(
    x_ptr,  # (R, C_IN) gathered rows
    w_ptr,  # weight, element (k, i, o) at k * s_wk + i * s_wi + o * s_wo
    b_ptr,
    table_ptr,  # (M, K) int32, -1 for none
    out_ptr,  # (M, C_OUT)
    M,
    K,
    C_IN,
    C_OUT,
    s_wk,
    s_wi,
    s_wo,
    HAS_BIAS: tl.constexpr,
    RELU: tl.constexpr,
    PRECISION: tl.constexpr,
    SKIP: tl.constexpr,  # visit only the offsets some row of the tile uses (K ≤ KPAD ≤ 32)
    KPAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    U: tl.constexpr = 1,  # offsets per step (1-4): their gathers are issued before their dots
    STAGES: tl.constexpr = 1,  # 1: offsets with a skip branch; more: a branch-free loop pipelined this deep
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < C_OUT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    kk = tl.arange(0, KPAD)
    if SKIP:
        # the offsets some row of the tile uses (one load of the tile's table rows), ranked in order
        tab = tl.load(
            table_ptr + rows.to(tl.int64)[:, None] * K + kk[None, :],
            mask=rmask[:, None] & (kk < K)[None, :],
            other=-1,
        )
        bit = tl.max((tab >= 0).to(tl.int32), axis=0)
        rank = tl.where(bit != 0, tl.cumsum(bit, axis=0) - 1, -1)
        n_used = tl.sum(bit, axis=0)
    else:
        bit = kk < K
        rank = kk
        n_used = K
    if STAGES == 1:
        # offsets in order, U at a time, each over its channel chunks; a branch skips the groups no
        # row uses (visiting one would add exact zeros)
        used = tl.sum(bit << kk, axis=0) if SKIP else -1
        for k0 in range(0, K, U):
            if ((used >> k0) & ((1 << U) - 1)) != 0:
                for c0 in range(0, C_IN, BLOCK_C):
                    cc = c0 + tl.arange(0, BLOCK_C)
                    acc = _step(acc, x_ptr, w_ptr, table_ptr, rows, rmask, k0, k0 + 1, k0 + 2, k0 + 3,
                                (k0 < K) & (((used >> k0) & 1) != 0), (k0 + 1 < K) & (((used >> (k0 + 1)) & 1) != 0),
                                (k0 + 2 < K) & (((used >> (k0 + 2)) & 1) != 0), (k0 + 3 < K) & (((used >> (k0 + 3)) & 1) != 0),
                                K, cc, cols, cmask, C_IN, s_wk, s_wi, s_wo, U, PRECISION)  # fmt: skip
    else:
        # a branch-free loop the pipeliner can prefetch: step = U used offsets (ranked) × one chunk
        # of BLOCK_C channels (U > 1 only with one chunk)
        chunks = tl.cdiv(C_IN, BLOCK_C)
        for step in tl.range(0, tl.cdiv(n_used, U) * chunks, num_stages=STAGES):
            i0 = (step // chunks) * U
            cc = (step % chunks) * BLOCK_C + tl.arange(0, BLOCK_C)
            k0 = _nth_offset(i0, n_used, rank, kk, K, SKIP)
            k1 = _nth_offset(i0 + 1, n_used, rank, kk, K, SKIP) if U > 1 else K
            k2 = _nth_offset(i0 + 2, n_used, rank, kk, K, SKIP) if U > 2 else K
            k3 = _nth_offset(i0 + 3, n_used, rank, kk, K, SKIP) if U > 3 else K
            acc = _step(acc, x_ptr, w_ptr, table_ptr, rows, rmask, k0, k1, k2, k3, k0 < K, k1 < K, k2 < K, k3 < K,
                        K, cc, cols, cmask, C_IN, s_wk, s_wi, s_wo, U, PRECISION)  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if RELU:
        acc = tl.maximum(acc, 0.0)
    out = out_ptr + rows.to(tl.int64)[:, None] * C_OUT + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


# gather_gemm's tile configurations ``(BLOCK_M, num_warps, U, BLOCK_C, STAGES)`` per operand class
# (``BLOCK_C`` 0: the channels rounded up to a power of two, at most 64; ``STAGES`` the software
# pipeline depth of the step loop); each won on some S2 / S3 layer in the H200 sweeps recorded in
# benchmarks/NOTES.md (few: each is compiled on first use). 16-bit and TF32 products are exact per
# tensor-core instruction and summed in channel order, so a smaller channel chunk keeps the bits;
# IEEE FMA and tf32x3 keep one chunk.
GEMM_CONFIGS = ((64, 4, 3, 0, 1), (128, 4, 1, 0, 1), (128, 4, 1, 0, 2), (64, 4, 2, 0, 3))
TF32_CONFIGS = ((64, 4, 2, 0, 1), (128, 4, 1, 16, 1), (128, 4, 1, 32, 1), (32, 4, 1, 32, 1), (128, 2, 1, 16, 1))
# the tuner's choice per shape class, filled on first use (``gather_gemm``)
_TUNED: dict = {}


def _configs(prec: str, dtype: torch.dtype) -> tuple:
    """The tuner's candidates for float32 with ``prec`` or a 16-bit ``dtype``."""
    return TF32_CONFIGS if dtype == torch.float32 and prec == "tf32" else GEMM_CONFIGS


def _gemm_config(m: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The untuned ``(BLOCK_M, num_warps, U, BLOCK_C, STAGES)``: for 16-bit inputs from 131,072
    rows 128 rows in a 2-stage pipeline, else 64 rows in one stage; one channel chunk."""
    if m >= 131072 and dtype != torch.float32:
        return 128, 4, 1, 0, 2
    return 64, 4, 1, 0, 1


def _rows_class(m: int) -> tuple[int, int]:
    """The tuner's row-count class: the bit length and the next two bits (4 classes per octave:
    a static encoder's layers of 40,000 and 60,000 rows tune apart)."""
    b = m.bit_length()
    return b, (m >> max(b - 3, 0)) & 3


def _fastest(run, configs) -> tuple:
    """The fastest of ``configs`` by CUDA-event time of ``run(cfg)``: one warm-up call each
    (compiles), then 3 rounds of 3 calls per config, the median round; one host sync. Each round
    is queued behind a short GPU spin (``torch.cuda._sleep``) so that the events time the kernels,
    not the host's launches (a small layer's kernel is shorter than its launch)."""
    for cfg in configs:
        run(cfg)
    events = {cfg: [] for cfg in configs}
    for _ in range(3):
        torch.cuda._sleep(_TUNE_SPIN_CYCLES)
        for cfg in configs:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                run(cfg)
            stop.record()
            events[cfg].append((start, stop))
    torch.cuda.synchronize()
    return min(configs, key=lambda c: sorted(a.elapsed_time(b) for a, b in events[c])[1])


def gather_gemm(
    x, weight_view, bias, table, c_out, *, strides, relu: bool = False, precision: str = "auto", config=None
):
    """``out (M, c_out)`` of ``x.dtype``: ``bias + Σ_k x[table[:, k]] @ W[k]`` (``relu``: then
    ``max(·, 0)``) where ``W[k][i, o]`` is at ``weight_view + k * strides[0] + i * strides[1] +
    o * strides[2]``. One launch.

    Tuned per shape class ``(C_in, C_out, K, row class of M (_rows_class), dtype, precision, bias,
    relu)``: the first call of a class on a GPU, unless a CUDA graph is being captured, times
    every candidate (``GEMM_CONFIGS``; float32 with TF32: ``TF32_CONFIGS``) on its own inputs (one
    host sync) and keeps the fastest; until then, and under the interpreter, ``_gemm_config``;
    ``config``: that ``(BLOCK_M, num_warps, U, BLOCK_C[, STAGES])`` instead. Every
    configuration gives the same bits: each output element sums its offsets in order, each over
    its channels in order (``U`` falls back to 1 where ``BLOCK_C`` splits the channels; IEEE and
    tf32x3 float32 keep one chunk of up to 64 channels), so the choice changes only the time."""
    m, k = table.shape
    c_in = x.shape[1]
    out = torch.empty((m, c_out), dtype=x.dtype, device=x.device)
    if m == 0 or c_out == 0:
        return out
    if k == 0 or c_in == 0 or x.shape[0] == 0:
        out = out.copy_(bias.expand(m, c_out)) if bias is not None else out.zero_()
        return out.clamp_(min=0) if relu else out
    block_n = _pow2(c_out, 16, 128)
    full_c = _pow2(c_in, 16, 64)
    kpad = _launch.next_power_of_2(k)
    prec = _precision(x.dtype, precision)
    has_bias = bias is not None

    def run(cfg):
        block_m, num_warps, u, block_c, stages = cfg if len(cfg) == 5 else (*cfg, 1)
        if prec != "tf32":  # IEEE / tf32x3 float32 sum in dot-call order: one chunk
            block_c = 0
        block_c = min(block_c or full_c, full_c)
        if block_c < c_in:
            u = 1  # offsets in order, each over all its channel chunks
        _launch.launch(
            _gather_gemm_kernel,
            (_launch.cdiv(m, block_m), _launch.cdiv(c_out, block_n)),
            x,
            weight_view,
            bias if has_bias else x,
            table,
            out,
            m,
            k,
            c_in,
            c_out,
            *strides,
            HAS_BIAS=has_bias,
            RELU=relu,
            PRECISION=prec,
            SKIP=kpad <= 32,
            KPAD=kpad,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_C=block_c,
            U=u,
            STAGES=stages,
            num_warps=num_warps,
            num_stages=stages,
        )

    key = (c_in, c_out, k, _rows_class(m), x.dtype, prec, has_bias, relu)
    cfg = config or _TUNED.get(key)
    if cfg is None:
        cfg = _gemm_config(m, x.dtype)
        if x.is_cuda and not torch.cuda.is_current_stream_capturing():
            cfg = _TUNED[key] = _fastest(run, _configs(prec, x.dtype))
    run(cfg)
    return out


@triton.jit
def _wgrad_kernel(
    x_ptr,  # (N, C_IN)
    g_ptr,  # (M, C_OUT)
    table_ptr,  # (M, K) int32
    part_ptr,  # (S, K, C_IN, C_OUT) float32
    M,
    K,
    C_IN,
    C_OUT,
    ROWS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    k = tl.program_id(0)
    s = tl.program_id(1)
    tiles_o = tl.cdiv(C_OUT, BLOCK_O)
    ti = tl.program_id(2) // tiles_o
    to = tl.program_id(2) % tiles_o
    ci = ti * BLOCK_I + tl.arange(0, BLOCK_I)
    co = to * BLOCK_O + tl.arange(0, BLOCK_O)
    cim = ci < C_IN
    com = co < C_OUT
    acc = tl.zeros((BLOCK_I, BLOCK_O), dtype=tl.float32)
    for m0 in range(0, tl.minimum(ROWS, M - s * ROWS), BLOCK_M):
        rows = s * ROWS + m0 + tl.arange(0, BLOCK_M)
        rm = rows < M
        src = tl.load(table_ptr + rows.to(tl.int64) * K + k, mask=rm, other=-1)
        valid = src >= 0
        if tl.max(valid.to(tl.int32), axis=0) > 0:
            a = tl.load(
                x_ptr + src.to(tl.int64)[:, None] * C_IN + ci[None, :], mask=valid[:, None] & cim[None, :], other=0.0
            )
            g = tl.load(
                g_ptr + rows.to(tl.int64)[:, None] * C_OUT + co[None, :], mask=rm[:, None] & com[None, :], other=0.0
            )
            acc = tl.dot(tl.trans(a), g, acc, input_precision=PRECISION)
    part = part_ptr + ((s * K + k) * C_IN + ci[:, None]).to(tl.int64) * C_OUT + co[None, :]
    tl.store(part, acc, mask=cim[:, None] & com[None, :])


def wgrad(x, grad_out, table, weight_dtype, block_m: int = 128, precision: str = "auto"):
    """``(K, C_in, C_out)`` of ``weight_dtype``: ``Σ_m x[table[m, k]]ᵀ @ grad_out[m]`` per offset."""
    m, k = table.shape
    c_in, c_out = x.shape[1], grad_out.shape[1]
    splits = max(1, _launch.cdiv(m, _WGRAD_ROWS))
    part = torch.zeros((splits, k, c_in, c_out), dtype=torch.float32, device=x.device)
    if m and k and c_in and c_out and x.shape[0]:
        block_i = _pow2(c_in, 16, 64)
        block_o = _pow2(c_out, 16, 64)
        grid = (k, splits, _launch.cdiv(c_in, block_i) * _launch.cdiv(c_out, block_o))
        _launch.launch(
            _wgrad_kernel,
            grid,
            x,
            grad_out,
            table,
            part,
            m,
            k,
            c_in,
            c_out,
            ROWS=_WGRAD_ROWS,
            PRECISION=_precision(x.dtype, precision),
            BLOCK_M=block_m,
            BLOCK_I=block_i,
            BLOCK_O=block_o,
            num_warps=4,
        )
    return part.sum(0).to(weight_dtype)


def sparse_conv3d(features, weight, bias, out_in, relu: bool = False, precision: str = "auto"):
    """Forward: ``(M, C_out)``; ``weight (K, C_in, C_out)`` contiguous; ``relu``: the epilogue;
    ``precision``: float32's ``tl.dot`` input precision (``_precision``)."""
    s = weight.stride()
    return gather_gemm(
        features, weight, bias, out_in, weight.shape[2], strides=(s[0], s[1], s[2]), relu=relu, precision=precision
    )


@triton.jit
def _inverse_table_kernel(table_ptr, inv_ptr, M, K, BLOCK: tl.constexpr):
    # inv[table[m, k], k] = m for every used cell; inv starts at -1 (each cell has one writer)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < M * K
    src = tl.load(table_ptr + idx, mask=inside, other=-1)
    k = idx % K
    tl.store(inv_ptr + src.to(tl.int64) * K + k, (idx // K).to(tl.int32), mask=inside & (src >= 0))


def inverse_table(table: torch.Tensor, num_in: int) -> torch.Tensor:
    """``(num_in, K)`` int32: for each input row and offset the output row it feeds (−1: none);
    ``pcops.reference.kernel_map.inverse_table`` in one fill and one launch."""
    m, k = table.shape
    inv = torch.full((num_in, k), -1, dtype=torch.int32, device=table.device)
    if m and k and num_in:
        block = 1024
        _launch.launch(_inverse_table_kernel, (_launch.cdiv(m * k, block),), table, inv, m, k, BLOCK=block)
    return inv


def sparse_conv3d_backward(grad_out, features, weight, out_in, symmetric: bool = False, precision: str = "auto"):
    """``(∂features, ∂weight)``. ``symmetric``: ``out_in`` is a submanifold map with odd kernel
    sizes, its own inverse with offset ``k`` mirrored to ``K - 1 - k``; else the inverse table
    is built (``inverse_table``)."""
    s = weight.stride()
    if symmetric:
        # ∂x[i] = Σ_k g[inv[i, k]] Wᵀ[k] = Σ_j g[out_in[i, j]] Wᵀ[K-1-j]: offsets of Wᵀ reversed
        k = weight.shape[0]
        view, strides = weight[k - 1], (-s[0], s[2], s[1])
        grad_features = gather_gemm(grad_out, view, None, out_in, weight.shape[1], strides=strides, precision=precision)
    else:
        inverse = inverse_table(out_in, features.shape[0])
        # Wᵀ[k][o, i] = W[k][i, o]: the rows of the GEMM run over C_out
        grad_features = gather_gemm(
            grad_out, weight, None, inverse, weight.shape[1], strides=(s[0], s[2], s[1]), precision=precision
        )
    return grad_features, wgrad(features, grad_out, out_in, weight.dtype, precision=precision)
