"""Ball query on a grid of sorted cells: what ``pcops.ball_query`` runs on CUDA (issue 19's B1).

The references are keyed by their cell (cells a little larger than the radius) and sorted with a
stable sort, so each cell's points are one run in index order. A query visits the at most
3 × 3 × 3 cells that its ball's bounding box overlaps (one lane of a warp each, both ends of the
run found by one interleaved binary search) and merges those runs by index, many references per
step: each lane reads the next ``W`` entries of its run; every entry up to ``t``, the smallest
``W``-th entry of a lane holding ``W``, comes next in index order over all cells (any entry not
read is above its lane's ``W``-th, so above ``t``). Those are tested at once, the hits sorted
(at most ``32 W``) and appended, until ``K`` hits or every run is read. The hits are therefore
the first ``K`` in index order, the same set and order as the scan of every reference
(``knn.ball_query``), with the same distance arithmetic (no FMA). The kernel writes every slot
(−1 past the count).

Non-finite points follow ``pcops._finite``'s policy without its partition: a reference with a
NaN or ±inf coordinate gets no cell (and never hits in the scan fallback: its distance is not
below ``r²``), and a non-finite query gets no hit. Indices are those of the inputs, as the
policy's mapping back gives.

A computed hit lies strictly inside ``(q - r', q + r')`` on every axis for
``r' = r · (1 + 1e-4) + 1e-18``: ``fl(dx²) ≤ d² < fl(r²)`` bounds ``|dx|`` by
``r (1 + 2⁻²²)``. Cell indices are ``floor(fl(x · (1 / r')))``, a monotone function of ``x``, so
every hit's cell lies within the box's cells. Cells must fit 18 bits per axis
(``|x| / r' < 2¹⁷ - 4``): a reference outside that range sets a device flag that sends every
query of the call to the scan instead (no host sync); so does a query whose box rounds to a
fourth cell on an axis (rare). Up to 511 samples (the key's batch bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _backend, _finite
from . import _launch
from .finite import _finite3
from .knn import _f32
from .knn import ball_query as _scan

_CELL_BITS = 18
_CELL_LIMIT = (1 << (_CELL_BITS - 1)) - 4  # |cell| below this fits the key
MAX_BATCH = (1 << (63 - 3 * _CELL_BITS)) - 1  # 511
_KEY_PAD = (1 << 63) - 1  # references past their sample's length: after every real key
_BLOCK = 1024
_BR = 64  # references per step of the scan fallback
_W = 4  # sorted references per cell per step of the merge (a 32 x 4 tile)


@triton.jit
def _cell_of(v, inv_c):
    return tl.floor(v * inv_c)


@triton.jit
def _key(b, cx, cy, cz, BITS: tl.constexpr):
    half = 1 << (BITS - 1)
    k = b.to(tl.int64)
    k = (k << BITS) + (cz.to(tl.int64) + half)
    k = (k << BITS) + (cy.to(tl.int64) + half)
    return (k << BITS) + (cx.to(tl.int64) + half)


@triton.jit
def _ball_cells_kernel(
    ref_ptr,  # (B, Nr, 3) float32
    len_ptr,  # (B,) int64
    key_ptr,  # (B * Nr,) int64 out
    flag_ptr,  # (1,) int32: set to 1 when a reference's cell does not fit the key
    nr,
    inv_c,
    limit,
    BITS: tl.constexpr,
    PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r_len = tl.minimum(tl.maximum(tl.load(len_ptr + b), 0), nr)
    live = i < nr
    valid = i < r_len
    base = ref_ptr + (b * nr + i) * 3
    x = tl.load(base + 0, mask=valid, other=0.0)
    y = tl.load(base + 1, mask=valid, other=0.0)
    z = tl.load(base + 2, mask=valid, other=0.0)
    valid = valid & _finite3(x, y, z)  # a non-finite reference is absent: never in a cell
    cx = _cell_of(x, inv_c)
    cy = _cell_of(y, inv_c)
    cz = _cell_of(z, inv_c)
    fits = (tl.abs(cx) < limit) & (tl.abs(cy) < limit) & (tl.abs(cz) < limit)
    key = _key(b, cx.to(tl.int32), cy.to(tl.int32), cz.to(tl.int32), BITS)
    key = tl.where(valid & fits, key, PAD)
    tl.store(key_ptr + b * nr + i, key, mask=live)
    bad = tl.max((valid & ~fits).to(tl.int32), axis=0)
    if bad > 0:
        tl.atomic_max(flag_ptr, 1)


@triton.jit
def _search_step(keys_ptr, lo, hi, key, STRICT: tl.constexpr):
    """One step of a per-lane binary search for the first position whose key is ``>= key``
    (``> key`` with ``STRICT``) within ``[lo, hi)``."""
    active = lo < hi
    mid = (lo + hi) // 2
    v = tl.load(keys_ptr + mid, mask=active, other=0)
    if STRICT:
        right = active & (v <= key)
    else:
        right = active & (v < key)
    return tl.where(right, mid + 1, lo), tl.where(active & ~right, mid, hi)


@triton.jit
def _bounds(keys_ptr, n, key, steps):
    """Per lane, the first position whose key is ``>= key`` and the first ``> key`` (the run of
    ``key``): the two binary searches interleaved, one chain of ``steps`` dependent loads."""
    lo = tl.zeros(key.shape, tl.int64)
    hi = tl.full(key.shape, 0, tl.int64) + n
    lo2 = lo
    hi2 = hi
    for _ in range(steps):
        lo, hi = _search_step(keys_ptr, lo, hi, key, False)
        lo2, hi2 = _search_step(keys_ptr, lo2, hi2, key, True)
    return lo, lo2


@triton.jit
def _ball_grid_kernel(
    q_ptr,  # (B, Nq, 3) float32
    r_ptr,  # (B, Nr, 3) float32
    q_len_ptr,  # (B,) int64
    r_len_ptr,  # (B,) int64
    keys_ptr,  # (B * Nr,) int64, sorted
    perm_ptr,  # (B * Nr,) int64: flat reference index of each sorted key
    flag_ptr,  # (1,) int32: 1 = some reference's cell does not fit: scan instead
    idx_ptr,  # (B, Nq, K) int64 out (every slot written)
    count_ptr,  # (B, Nq) int64 out
    nq,
    nr,
    n_keys,  # B * Nr
    radius2,  # radius² (float32)
    rp,  # r' (float32)
    inv_c,  # 1 / r' (float32)
    limit,
    k,
    steps,  # binary-search steps: bit length of B * Nr
    BITS: tl.constexpr,
    BR: tl.constexpr,
    W: tl.constexpr,  # sorted entries per cell read per step of the merge
    KPAD: tl.constexpr,  # next power of two >= k
):
    qi = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    q_len = tl.minimum(tl.maximum(tl.load(q_len_ptr + b), 0), nq)
    row = b * nq + qi
    count = tl.zeros([], tl.int32)
    if qi < q_len:
        r_len = tl.minimum(tl.maximum(tl.load(r_len_ptr + b), 0), nr)
        qx = tl.load(q_ptr + row * 3 + 0)
        qy = tl.load(q_ptr + row * 3 + 1)
        qz = tl.load(q_ptr + row * 3 + 2)
        if _finite3(qx, qy, qz):  # a non-finite query: no hit (count 0, every slot -1)
            lx, hx = _cell_of(qx - rp, inv_c), _cell_of(qx + rp, inv_c)
            ly, hy = _cell_of(qy - rp, inv_c), _cell_of(qy + rp, inv_c)
            lz, hz = _cell_of(qz - rp, inv_c), _cell_of(qz + rp, inv_c)
            fits = (tl.maximum(tl.abs(lx), tl.abs(hx)) < limit) & (tl.maximum(tl.abs(ly), tl.abs(hy)) < limit)
            fits = fits & (tl.maximum(tl.abs(lz), tl.abs(hz)) < limit)
            fits = fits & (hx - lx < 3) & (hy - ly < 3) & (hz - lz < 3)
            if fits & (tl.load(flag_ptr) == 0):
                # one lane per cell of the box (at most 3 per axis), its run of sorted references
                lane = tl.arange(0, 32)
                cx = lx.to(tl.int32) + lane % 3
                cy = ly.to(tl.int32) + (lane // 3) % 3
                cz = lz.to(tl.int32) + lane // 9
                inside = (lane < 27) & (cx <= hx.to(tl.int32)) & (cy <= hy.to(tl.int32)) & (cz <= hz.to(tl.int32))
                start, end = _bounds(keys_ptr, n_keys, _key(b, cx, cy, cz, BITS), steps)
                end = tl.where(inside, end, start)
                cur = start
                big = 2147483647
                offs = tl.arange(0, W)
                j = tl.arange(0, 32 * W)
                go = tl.max(end - cur, axis=0) > 0
                while go:
                    # each cell's next W references (ascending index); every one up to the
                    # smallest W-th index of a full row comes next in index order, across cells
                    pos = cur[:, None] + offs[None, :]
                    live = pos < end[:, None]
                    cand = tl.load(perm_ptr + pos, mask=live, other=big).to(tl.int32)
                    t = tl.min(tl.max(cand, axis=1), axis=0)  # rows short of W entries read big
                    take = live & (cand <= t)
                    cur += tl.sum(take.to(tl.int64), axis=1)
                    ref = r_ptr + cand.to(tl.int64) * 3
                    dx = qx - tl.load(ref + 0, mask=take, other=0.0)
                    dy = qy - tl.load(ref + 1, mask=take, other=0.0)
                    dz = qz - tl.load(ref + 2, mask=take, other=0.0)
                    hit = take & (dx * dx + dy * dy + dz * dz < radius2)
                    nh = tl.sum(tl.sum(hit.to(tl.int32), axis=1), axis=0)
                    if nh > 0:
                        s = tl.sort(tl.reshape(tl.where(hit, cand, big), [32 * W]))
                        slot = count + j
                        tl.store(idx_ptr + row * k + slot, s.to(tl.int64) - b * nr, mask=(j < nh) & (slot < k))
                        count = tl.minimum(count + nh, k)
                    go = (count < k) & (tl.max(end - cur, axis=0) > 0)
            else:  # the scan of every reference, in index order (non-finite ones never hit)
                t = 0
                n_t = tl.cdiv(r_len, BR)
                while (t < n_t) & (count < k):
                    pos = t * BR + tl.arange(0, BR)
                    valid = pos < r_len
                    rx = tl.load(r_ptr + (b * nr + pos) * 3 + 0, mask=valid, other=0.0)
                    ry = tl.load(r_ptr + (b * nr + pos) * 3 + 1, mask=valid, other=0.0)
                    rz = tl.load(r_ptr + (b * nr + pos) * 3 + 2, mask=valid, other=0.0)
                    dx = qx - rx
                    dy = qy - ry
                    dz = qz - rz
                    hit = (dx * dx + dy * dy + dz * dz < radius2) & valid
                    slot = count + tl.cumsum(hit.to(tl.int32), axis=0) - 1
                    keep = hit & (slot < k)
                    tl.store(idx_ptr + row * k + slot, pos.to(tl.int64), mask=keep)
                    count += tl.sum(keep.to(tl.int32), axis=0)
                    t += 1
    pad = tl.arange(0, KPAD)
    tl.store(idx_ptr + row * k + pad, tl.full([KPAD], -1, tl.int64), mask=(pad >= count) & (pad < k))
    tl.store(count_ptr + row, count.to(tl.int64))


def ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    radius: float,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pcops.triton.knn.ball_query` under ``pcops._finite``'s non-finite policy (same
    arguments, outputs and semantics), on the grid.

    Launches: the key pass (and the flag's fill), ``torch.sort`` (stable) of ``B · Nr`` keys,
    the query pass; no host synchronisation. More than :data:`MAX_BATCH` samples, ``B · Nr ≥
    2³¹`` or an empty side: the scan, with the policy's partition.
    """
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    if batch > MAX_BATCH or nr == 0 or nq == 0 or batch * nr >= 2**31:
        return _finite.ball_query(_scan, query, ref, query_lengths, ref_lengths, radius, k)
    _backend.log_kernel("ball_query", "triton _ball_grid_kernel (sorted cells)")
    dev = query.device
    idx = torch.empty((batch, nq, k), dtype=torch.int64, device=dev)
    counts = torch.empty((batch, nq), dtype=torch.int64, device=dev)
    radius2 = _f32(radius * radius)
    rp = _f32(radius * (1.0 + 1e-4) + 1e-18)
    inv_c = _f32(1.0 / rp)
    keys = torch.empty(batch * nr, dtype=torch.int64, device=dev)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    _launch.launch(
        _ball_cells_kernel,
        (_launch.cdiv(nr, _BLOCK), batch),
        ref,
        ref_lengths,
        keys,
        flag,
        nr,
        inv_c,
        float(_CELL_LIMIT),
        BITS=_CELL_BITS,
        PAD=_KEY_PAD,
        BLOCK=_BLOCK,
    )
    keys, perm = torch.sort(keys, stable=True)
    _launch.launch(
        _ball_grid_kernel,
        (nq, batch),
        query,
        ref,
        query_lengths,
        ref_lengths,
        keys,
        perm,
        flag,
        idx,
        counts,
        nq,
        nr,
        batch * nr,
        radius2,
        rp,
        inv_c,
        float(_CELL_LIMIT),
        k,
        (batch * nr).bit_length(),
        BITS=_CELL_BITS,
        BR=_BR,
        W=_W,
        KPAD=_launch.next_power_of_2(k),
        num_warps=1,
        enable_fp_fusion=False,
    )
    return idx, counts
