"""Triton kernels for the softmax over the stored values of each CSR row, forward and backward.

Layout ("grouped rows"): the tile is ``[BLOCK_R, VPT, SUB]``, element ``(r, k, s)`` being entry
``s + SUB·k`` of row ``r``; Triton orders a layout's dimensions by address contiguity, so ``SUB``
lanes share a row, ``32 / SUB`` rows share a warp and the ``VPT`` entries of a lane stay in its
registers (the CUDA C++ group shape of ``csrc/sparse_softmax.cu``). The row max and sum are
``VPT`` in-thread steps then ``log2(SUB)`` shuffles for all the warp's rows at once; the row sums
reduce the in-thread axis first and come back to the tile's layout through the matching
``expand_dims`` (no layout conversion; the sm_90 test checks threadsPerWarp ``[1, 32/SUB, SUB]``).
Rows longer than ``CAP = SUB·VPT`` loop over CAP-wide chunks (online max and sum, then a second
pass that writes).

Config: ``SUB``/``VPT`` from the mean row length (no host sync), the smallest ``CAP ≥ 1.9·mean``
as the CUDA C++ launcher; ``BLOCK_R`` autotuned over 4 or 8 warps × 1 or 2 rows per thread (4
configs, keyed on the mean length and ``SUB``): one or two rows per thread keep 8-16 values per
thread per tensor, and the warps per program trade the crow loads' reuse against more, smaller
programs in flight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _backend
from ._fused_common import autotuning, quick_bench
from . import _launch

_LOG2E_C = tl.constexpr(1.4426950408889634)


# (SUB, VPT), smallest capacity first (≤ 32, 64, 128, 128): as csrc/sparse_softmax.cu's group shapes
_GROUP_SHAPES = ((4, 8), (8, 8), (16, 8), (32, 4))
_GROUPED_CONFIGS = [triton.Config({"BLOCK_R": r}, num_warps=w) for r in (2, 4, 8, 16, 32, 64, 128) for w in (2, 4, 8)]
_GROUPED_WARPS = (4, 8)


def _prune_grouped(configs, named_args, **kwargs):
    per_warp = 32 // kwargs["SUB"]
    keep = [
        c
        for c in configs
        if c.num_warps in _GROUPED_WARPS and c.kwargs["BLOCK_R"] in (per_warp * c.num_warps, 2 * per_warp * c.num_warps)
    ]
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
    # s == 0 only for an all −inf row (outputs 0); a NaN or +inf value makes s NaN: the row is NaN
    inv = tl.where(s == 0, 0.0, 1.0 / tl.where(s == 0, 1.0, s))
    # e0 was taken against ref0 ≤ ref (equal unless a later chunk raised the max); a first chunk
    # of only −inf has e0 = 0 and must not meet exp(0 − ref) = inf (0 · inv keeps a NaN row NaN)
    scale0 = tl.where(m0 == float("-inf"), 0.0 * inv, tl.exp(ref0 - ref) * inv)
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
    configs=_GROUPED_CONFIGS,
    key=["AVG_LEN", "SUB"],
    prune_configs_by={"early_config_prune": _prune_grouped},
    do_bench=quick_bench,
)(_sparse_softmax_grouped_kernel)
_sparse_softmax_grouped_bwd_tuned = triton.autotune(
    configs=_GROUPED_CONFIGS,
    key=["AVG_LEN", "SUB"],
    prune_configs_by={"early_config_prune": _prune_grouped},
    do_bench=quick_bench,
)(_sparse_softmax_grouped_bwd_kernel)


# --- launchers ------------------------------------------------------------------------------


# the autotuner's choice per (kernel, AVG_LEN, SUB, VPT, dtypes): later calls launch the kernel
# with it directly (the autotuner's run() rebuilds its key from every argument on each call)
_TUNED: dict = {}
_NATIVE_DONE: set = set()  # (tuned key, device, rows' and nnz's classes): registered or not registrable


def _grouped_launch(tuned, kernel, args, rows, nnz, avg_len, block_r, num_warps, sub, vpt, kinds):
    default_shape = sub is None
    if sub is None:
        sub, vpt = _group_shape(rows, nnz)
    vpt = vpt or 8
    if block_r is None and num_warps is None and autotuning():
        key = (kernel, avg_len, sub, vpt, *(a.dtype for a in args[: len(kinds) - 3]))
        plan = _TUNED.get(key)
        if plan is None:  # first call of this shape class: the autotuner times its configs (or finds its cache)
            tuned[lambda c: (_launch.cdiv(rows, c["BLOCK_R"]),)](*args, avg_len, SUB=sub, VPT=vpt)
            cfg = tuned.best_config
            plan = _TUNED[key] = (cfg.kwargs["BLOCK_R"], {"SUB": sub, "VPT": vpt, **cfg.all_kwargs()})
        else:
            _launch.launch(kernel, (_launch.cdiv(rows, plan[0]),), *args, avg_len, **plan[1])
        if default_shape and args[0].is_cuda:
            _native_register(key, kernel, args + (avg_len,), plan, kinds)
    else:
        w = num_warps or 4
        br = block_r or 32 // sub * w
        _launch.launch(kernel, (_launch.cdiv(rows, br),), *args, avg_len, SUB=sub, VPT=vpt, BLOCK_R=br, num_warps=w)
    _backend.log_kernel("sparse_softmax", f"{kernel.__name__} SUB={sub} VPT={vpt}")


def _native_register(key: tuple, kernel, args: tuple, plan: tuple, kinds: str) -> None:
    """Hand the kernel this call launched to the native host path (``pcops._native``;
    ``csrc/host/sparse_softmax.cpp`` passes the arguments in this order), once per shape class and
    Triton specialisation. Starts the module's build on the first call."""
    from .. import _native

    host = _native.loaded()
    if host is None:
        return
    backward = kernel is _sparse_softmax_grouped_bwd_kernel
    rows, nnz = args[-3], args[-2]
    crow = args[3] if backward else args[1]
    v = args[1] if backward else args[0]  # the values, or the forward's output for the backward
    done = (key, v.device.index, _native.spec(rows), _native.spec(nnz))
    if done in _NATIVE_DONE or not _native.registrable(*args[: len(kinds) - 3]):
        return
    if backward and args[0].dtype != args[1].dtype:
        return  # (the C++ backward passes a gradient of the output's dtype: its key has no other)
    _NATIVE_DONE.add(done)
    bound = _native.bind(kernel, (_launch.cdiv(rows, plan[0]),), args, plan[1], kinds)
    if bound is not None:
        host.ss_register(v, crow, backward, plan[1]["SUB"], plan[1]["VPT"], *bound, plan[0])
        if not backward:
            _native.registered("sparse_softmax")


def sparse_softmax(
    values: torch.Tensor,
    crow: torch.Tensor,
    *,
    block_r: int | None = None,
    num_warps: int | None = None,
    sub: int | None = None,
    vpt: int | None = None,
) -> torch.Tensor:
    """Softmax of each CSR row's stored values.

    Args:
        values: ``(nnz,)`` contiguous float32/float16/bfloat16.
        crow: ``(rows + 1,)`` int32/int64 row pointers (not checked here: row ranges are clamped
            to ``[0, nnz]`` so a malformed crow cannot read or write out of bounds).
        block_r, num_warps, sub, vpt: a fixed config (power-of-two ``sub`` ≤ 32 lanes per row,
            ``vpt`` entries per lane; default from the mean row length), bypassing autotuning
            (automatic under the interpreter).
    Returns:
        ``(nnz,)`` like ``values``; empty rows write nothing, all −inf rows give 0. One launch,
        no host sync.
    """
    out = torch.empty_like(values)
    rows, nnz = crow.numel() - 1, values.numel()
    if rows > 0 and nnz > 0:
        _grouped_launch(
            _sparse_softmax_grouped_tuned,
            _sparse_softmax_grouped_kernel,
            (values, crow, out, rows, nnz),
            rows,
            nnz,
            _avg_len(nnz, rows),
            block_r,
            num_warps,
            sub,
            vpt,
            "pppiii",
        )
    return out


def sparse_softmax_backward(
    grad: torch.Tensor,
    y: torch.Tensor,
    crow: torch.Tensor,
    *,
    block_r: int | None = None,
    num_warps: int | None = None,
    sub: int | None = None,
    vpt: int | None = None,
) -> torch.Tensor:
    """``dx = y·(g - Σ_row g·y)`` per CSR row; arguments as ``sparse_softmax`` (grad, y: ``(nnz,)``)."""
    dx = torch.empty_like(y)
    rows, nnz = crow.numel() - 1, y.numel()
    if rows > 0 and nnz > 0:
        _grouped_launch(
            _sparse_softmax_grouped_bwd_tuned,
            _sparse_softmax_grouped_bwd_kernel,
            (grad, y, dx, crow, rows, nnz),
            rows,
            nnz,
            _avg_len(nnz, rows),
            block_r,
            num_warps,
            sub,
            vpt,
            "ppppiii",
        )
    return dx


def _avg_len(nnz: int, rows: int) -> int:
    # bucketed to a power of two, so nearby sizes share one autotuning result
    return _launch.next_power_of_2(max(1, nnz // max(rows, 1)))
