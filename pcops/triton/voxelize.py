"""Triton kernels for deterministic voxelization (hard FCFS and dynamic) on a GPU hash table.

Launches: ``torch.full(-1)`` of one int32 work buffer (hash table, scan descriptors, per-sample
counters, per-voxel lists: every "empty" is −1), then ``_voxelize_kernel``: one program per
block of ``BLOCK`` points, taken in order through an atomic ticket (a block only waits on
blocks already running). It computes each point's voxel key exactly as the reference, inserts
it (``atomic_cas``, linear probing) with ``atomic_max`` of the encoded index ``N - 1 - p`` (the
voxel's first point), waits until every earlier block has inserted, and numbers the voxels in
first-point order by a decoupled look-back prefix sum (segmented by sample for the per-sample
cap). Hard voxelization then keeps each voxel's ``max_points_per_voxel`` lowest indices:

- CSR mode (``mode="csr"``; ``"auto"`` below ``CSR_MAX_POINTS_PER_SAMPLE`` points per sample):
  one ``atomic_add`` per point gives an arrival position; a ``torch.cumsum`` of the counts gives
  segment offsets, ``_voxel_scatter_kernel`` lays the points out, and ``_voxel_rows_kernel``
  sorts each segment's first ``PB`` entries and merges further chunks of ``PB``.
- Lists mode (``mode="lists"``): per-voxel lists filled by ``atomic_max`` at a start position,
  a position keeping the larger encoded index and passing the smaller on, so position ``j``
  ends holding the ``(j+1)``-th smallest index whatever the order of the atomics (any start
  position up to a value's rank is valid); a point starts at its in-block rank (a sort of the
  block's (voxel, lane) keys) plus the earlier blocks' entries it sees in the list.

``_voxel_rows_kernel`` gathers the kept points into ``voxels`` (padding in the same pass) and
writes ``coords``, ``num_points``, ``point_to_voxel`` and the per-sample counts. The variable-size
form reads the voxel counts on the host once; ``pad_to_max`` never syncs.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from .. import _backend
from .voxelize_cells import _bmax, _grid_size, _point_cells_kernel, _voxel_cell, point_cells  # noqa: F401
from .voxelize_rows import _voxel_rows_kernel, _voxel_scatter_kernel
from .voxelize_tuning import CSR_MAX_POINTS_PER_SAMPLE, DEFAULT, MODES, Tuning
from . import _launch


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _run_start_combine(k1, s1, k2, s2):
    """Scan over sorted keys: (key, index of the first element of its run). Associative because
    equal keys are contiguous (k1 == k2 means everything between them is one run)."""
    return k2, tl.where(k1 == k2, s1, s2)


@triton.jit
def _voxelize_kernel(
    points_ptr,  # (N, C) contiguous, any float dtype
    lengths_ptr,  # (B,) int32/int64 sample lengths (unused without HAS_LENGTHS)
    keys_ptr,  # (CAP,) int64 hash keys, -1 = empty
    first_ptr,  # (CAP,) int32 max of N - 1 - p over the slot's points (-1 = none)
    row_ptr,  # (CAP,) int32 voxel row (sample-local) of the slot, -2 dropped, -1 not yet known
    ticket_ptr,  # (3,) int32 block ticket and the "inserted" watermark (the third entry unused); start at -1
    flags_ptr,  # (G,) int32 "inserted" flag per block, -1 = not yet
    desc_ptr,  # (G,) int32 look-back descriptor per block: value << 2 | status (1 aggregate, 2 inclusive)
    stats_ptr,  # (2, B) int32: voxel count before the first / after the last point of each sample
    drop_ptr,  # (B,) int32 dropped-point counter per sample, starts at -1
    lists_ptr,  # (B * S, PB) int32 per-voxel lists of N - 1 - p, -1 = empty (HARD only)
    p2v_ptr,  # (N,) int64 point_to_voxel: -1 (HARD: rows kernel fills the kept ones) / row
    coords_ptr,  # (N, 4) int32 (b, z, y, x) per voxel row (dynamic only)
    cnt_ptr,  # (B * S,) int32 points per list row minus one, starts at -1 (CSR only)
    lrb_ptr,  # (N,) int32 list row of each kept-voxel point, -1 none (CSR only)
    posb_ptr,  # (N,) int32 arrival position of the point in its list row (CSR only)
    num_points,
    num_channels,
    batch_size,
    cap,
    x_lo,
    y_lo,
    z_lo,
    x_hi,
    y_hi,
    z_hi,  # point_cloud_range, float32
    vx,
    vy,
    vz,  # voxel_size, float32
    gx,
    gy,
    gz,  # grid cells per axis (int)
    max_points,
    max_voxels,
    list_stride,  # caps; S = rows per sample in lists (HARD only)
    HAS_LENGTHS: tl.constexpr,
    HARD: tl.constexpr,
    SEGMENTED: tl.constexpr,
    PB: tl.constexpr,
    BLOCK: tl.constexpr,
    LOOKBACK: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr,  # tests: False makes blocks publish aggregates only (look-backs walk further)
    SNAP: tl.constexpr,
    BMAX: tl.constexpr,  # > 0: next power of 2 >= B, samples handled as one vector; 0: a loop over B
    KEY64: tl.constexpr,  # lists: (B * S + 1) * 2 * BLOCK does not fit int32, sort int64 keys
    SEEN: tl.constexpr,  # lists: read earlier blocks' list entries (tests: False forces cascades)
    CSR: tl.constexpr,  # HARD: count the voxels' points (arrival order) for the CSR lists instead of ranking them
):
    t = tl.atomic_add(ticket_ptr, 1) + 1  # block ticket: blocks are processed in start order
    lane = tl.arange(0, BLOCK)
    p = t * BLOCK + lane
    live = p < num_points
    p64 = p.to(tl.int64)

    # --- sample of each point (samples are contiguous runs) --------------------------------
    if HAS_LENGTHS:
        if BMAX > 0:
            # all sample ends at once (one round trip): b = number of ends <= p
            j = tl.arange(0, BMAX)
            ends = tl.cumsum(tl.load(lengths_ptr + j, mask=j < batch_size, other=0).to(tl.int32), axis=0)
            ends = tl.where(j < batch_size, ends, 2147483647)
            le = ends[None, :] <= p[:, None]
            b = tl.sum(le.to(tl.int32), axis=1)
            s_start = tl.max(tl.where(le, ends[None, :], 0), axis=1)
            s_end = tl.min(tl.where(le, 2147483647, ends[None, :]), axis=1)
        else:
            b = tl.full((BLOCK,), batch_size, tl.int32)
            s_start = tl.zeros((BLOCK,), tl.int32)
            s_end = tl.zeros((BLOCK,), tl.int32)
            acc = t * 0
            for i in range(batch_size):
                end = acc + tl.load(lengths_ptr + i).to(tl.int32)
                inside = (p >= acc) & (p < end)
                b = tl.where(inside, i, b)
                s_start = tl.where(inside, acc, s_start)
                s_end = tl.where(inside, end, s_end)
                acc = end
        in_batch = live & (b < batch_size)
    else:
        b = tl.zeros((BLOCK,), tl.int32)
        s_start = tl.zeros((BLOCK,), tl.int32)
        s_end = tl.zeros((BLOCK,), tl.int32) + num_points
        in_batch = live

    # --- voxel key ------------------------------------------------------------------------
    row_ptrs = points_ptr + p64 * num_channels
    px = tl.load(row_ptrs + 0, mask=live, other=0.0).to(tl.float32)
    py = tl.load(row_ptrs + 1, mask=live, other=0.0).to(tl.float32)
    pz = tl.load(row_ptrs + 2, mask=live, other=0.0).to(tl.float32)
    cx, okx = _voxel_cell(px, x_lo, x_hi, vx, gx)
    cy, oky = _voxel_cell(py, y_lo, y_hi, vy, gy)
    cz, okz = _voxel_cell(pz, z_lo, z_hi, vz, gz)
    valid = in_batch & okx & oky & okz
    key = ((b.to(tl.int64) * gz + cz) * gy + cy) * gx + cx
    key = tl.where(valid, key, -1)

    # --- hash insert (linear probing) and first point per slot --------------------------------
    h = key * 0x9E3779B1
    # lanes with nothing to insert still take part in the (unmasked) CAS, with a comparand that
    # never matches (-3) at a spread-out slot, so they write nothing and contend with no one
    slot = tl.where(valid, (h ^ (h >> 17)) & (cap - 1), (p64 * 0x9E3779B1 >> 7) & (cap - 1))
    pending = valid
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        # one CAS per probe (no load first: a load would cost a second round trip); it returns -1
        # (inserted), our key (already there) or another key (probe on)
        old = tl.atomic_cas(keys_ptr + slot, tl.where(pending, -1, -3).to(tl.int64), key)
        hit = pending & ((old == -1) | (old == key))
        pending = pending & (~hit)
        slot = tl.where(pending, (slot + 1) & (cap - 1), slot)
    enc = (num_points - 1 - p).to(tl.int32)
    tl.atomic_max(first_ptr + slot, enc, mask=valid)
    tl.debug_barrier()
    tl.atomic_xchg(flags_ptr + t, 1, sem="release")

    # wait until every earlier block has inserted its points (BLOCK flags per round trip), from
    # the watermark on: a block that has seen all blocks before it inserted raises the watermark
    # to its own ticket + 1, so later blocks skip those flags (O(blocks) reads, not O(blocks²))
    w0 = tl.maximum(tl.atomic_add(ticket_ptr + 1, 0, sem="acquire"), 0)
    for c0 in range(w0, t, BLOCK):
        offs = c0 + lane
        m = offs < t
        f = tl.atomic_add(flags_ptr + offs, 0, mask=m, sem="acquire")
        todo = m & (f < 0)
        while tl.max(todo.to(tl.int32), axis=0) > 0:
            f = tl.atomic_add(flags_ptr + offs, 0, mask=todo, sem="acquire")
            todo = todo & (f < 0)
    tl.atomic_max(ticket_ptr + 1, t + 1, sem="release")

    first = tl.load(first_ptr + slot, mask=valid, other=-2, volatile=True)
    is_first = valid & (first == enc)

    # --- segmented decoupled look-back scan of the first-point flags ---------------------------
    fi = is_first.to(tl.int32)
    excl = tl.cumsum(fi, axis=0) - fi
    total = tl.sum(fi, axis=0)
    if SEGMENTED:
        is_start = in_batch & (p == s_start)
    else:
        is_start = p == 0
    w = tl.where(is_start, excl, -1)
    last_start = tl.associative_scan(w, 0, _max_combine)  # excl at the last start <= p, or -1
    block_last = tl.max(w, axis=0)
    has_start = block_last >= 0
    agg = tl.where(has_start, total - block_last, total)
    tl.atomic_xchg(desc_ptr + t, (agg << 2) | tl.where(has_start, 2, 1), sem="release")
    carry = t * 0
    j = t - 1
    lb = tl.arange(0, LOOKBACK)
    while j >= 0:
        offs = j - lb
        m = offs >= 0
        d = tl.atomic_add(desc_ptr + offs, 0, mask=m, sem="acquire")
        todo = m & (d < 0)
        while tl.max(todo.to(tl.int32), axis=0) > 0:
            d2 = tl.atomic_add(desc_ptr + offs, 0, mask=todo, sem="acquire")
            d = tl.where(todo, d2, d)
            todo = todo & (d < 0)
        inclusive = m & ((d & 3) == 2)
        k = tl.min(tl.where(inclusive, lb, LOOKBACK), axis=0)
        carry += tl.sum(tl.where(m & (lb <= k), d >> 2, 0), axis=0)
        j = tl.where(k < LOOKBACK, -1, j - LOOKBACK)
    if PUBLISH_INCLUSIVE and block_last < 0:
        tl.atomic_xchg(desc_ptr + t, ((carry + agg) << 2) | 2, sem="release")
    local = tl.where(last_start >= 0, excl - last_start, carry + excl)  # voxel index in its sample (segment)

    # per-sample voxel counts (before the first point / after the last point of each sample)
    tl.store(stats_ptr + b, local, mask=in_batch & (p == s_start))
    tl.store(stats_ptr + batch_size + b, local + fi, mask=in_batch & (p == s_end - 1))

    # --- publish each voxel's row, then read it ----------------------------------------------
    if HARD:
        tl.atomic_xchg(row_ptr + slot, tl.where(local < max_voxels, local, -2), mask=is_first, sem="release")
    else:
        tl.atomic_xchg(row_ptr + slot, local, mask=is_first, sem="release")
        crow = coords_ptr + local.to(tl.int64) * 4
        tl.store(crow + 0, b, mask=is_first)
        tl.store(crow + 1, cz, mask=is_first)
        tl.store(crow + 2, cy, mask=is_first)
        tl.store(crow + 3, cx, mask=is_first)
    row = tl.load(row_ptr + slot, mask=valid, other=0, volatile=True)
    wait = valid & (row == -1)
    while tl.max(wait.to(tl.int32), axis=0) > 0:
        row2 = tl.load(row_ptr + slot, mask=wait, other=0, volatile=True)
        row = tl.where(wait, row2, row)
        wait = wait & (row == -1)

    if HARD:
        tl.store(p2v_ptr + p64, tl.full((BLOCK,), -1, tl.int64), mask=live)
        # FCFS cascade: a position keeps the larger encoded index (= the smaller point index) and
        # passes the other value on. A value may start at any position s <= (number of larger
        # values in its voxel): positions only ever grow, so a value seen at position j that is
        # larger than ours proves j + 1 larger values; s >= max_points drops the point at once.
        keep = valid & (row >= 0)
        dropped_v = valid & (row == -2)  # voxel dropped by max_voxels
        if CSR:
            # no ranking here: each point takes an arrival position in its voxel (counts start at
            # -1); the scatter kernel lays the voxels' points out as CSR rows and the rows kernel
            # keeps the max_points smallest indices of each. Whatever the arrival order, exactly
            # count - max_points points of a voxel drop, so the drop counts are exact here.
            lr_c = tl.where(keep, b * list_stride + row, 0)
            pos = tl.atomic_add(cnt_ptr + lr_c, 1, mask=keep) + 1
            tl.store(lrb_ptr + p, tl.where(keep, lr_c, -1), mask=live)
            tl.store(posb_ptr + p, pos, mask=keep)
            carrying = keep & (pos >= max_points)
        else:
            # in-block rank without atomics: sort (list row, lane), rank = index - run start. A
            # value's start is (earlier blocks' values seen in the list) + (in-block rank), both
            # counted among its larger values, so in the usual case every point lands with one
            # atomic at its final position and points of rank >= max_points drop at once.
            thr = num_points - 1 - t * BLOCK  # encoded values > thr belong to earlier blocks
            lr_none = batch_size * list_stride
            # key: (list row, voxel has a point in an earlier block, lane)
            lr = tl.where(keep, (b * list_stride + row) * 2 + (first > thr).to(tl.int32), lr_none * 2)
            if KEY64:
                skey = tl.sort(lr.to(tl.int64) * BLOCK + lane)
            else:
                skey = tl.sort(lr * BLOCK + lane)
            q = (skey // BLOCK).to(tl.int32)
            lr_s = q // 2
            lane_s = (skey % BLOCK).to(tl.int32)
            _, run0 = tl.associative_scan((q, lane), 0, _run_start_combine)
            rank = lane - run0  # points of the same voxel earlier in this block
            cand = lr_s < lr_none
            x = num_points - 1 - (t * BLOCK + lane_s)
            lst = lists_ptr + lr_s * PB  # int32 offsets: the lists hold < 2**31 entries
            need = cand & (rank < max_points)
            # earlier blocks' values seen in the list: one at position j proves j + 1 of them (all
            # values larger than an earlier block's value are earlier blocks' values), so any set
            # of positions read gives a valid count. Two steps of reads instead of PB: every SNAP-th
            # position, then the SNAP positions from the last of those held by an earlier block
            # (the list fills from the front, so this finds the whole prefix in the usual case).
            # One [BLOCK] load per position (constant offsets from one pointer per point: few
            # registers). Plain loads: a stale value is an older state of the list, still a valid
            # count. Positions max_points .. PB - 1 are never written (read as -1): no mask there.
            j0 = tl.zeros((BLOCK,), tl.int32)
            for c in tl.static_range(SNAP, PB, SNAP):
                v = tl.load(lst + c, mask=need, other=-1, cache_modifier=".cg")
                j0 = tl.where(v > thr, c, j0)  # c increasing: the last one held wins
            seen = tl.zeros((BLOCK,), tl.int32)
            lst0 = lst + j0
            for k in tl.static_range(0, SNAP):
                v = tl.load(lst0 + k, mask=need, other=-1, cache_modifier=".cg")
                seen = tl.where(v > thr, j0 + k + 1, seen)
            seen = tl.maximum(seen, tl.where(j0 > 0, j0 + 1, 0))  # position j0 > 0 was seen held
            if not SEEN:
                seen = seen * 0
            pos = seen + rank
        if not CSR:
            carrying = cand  # still holds a value that is not in the list
            act = carrying & (pos < max_points)
            while tl.max(act.to(tl.int32), axis=0) > 0:
                old = tl.atomic_max(lst + pos, x, mask=act)
                carrying = carrying & ~(act & (old == -1))
                x = tl.where(act, tl.minimum(old, x), x)
                pos = tl.where(act, pos + 1, pos)
                act = carrying & (pos < max_points)
        # carrying: a point pushed off the list (in sorted order in the lists mode)
        nd = tl.sum(dropped_v.to(tl.int32), axis=0) + tl.sum(carrying.to(tl.int32), axis=0)
        if HAS_LENGTHS:
            b_lo = tl.min(tl.where(live, b, batch_size), axis=0)
            b_hi = tl.max(tl.where(live, b, -1), axis=0)
            if b_lo == b_hi:
                tl.atomic_add(drop_ptr + b_lo, nd, mask=nd > 0)
            else:
                ones = tl.full((BLOCK,), 1, tl.int32)
                if not CSR:  # carrying is in sorted order
                    tl.atomic_add(drop_ptr + b, ones, mask=dropped_v)
                    tl.atomic_add(drop_ptr + lr_s // list_stride, ones, mask=carrying)
                else:
                    tl.atomic_add(drop_ptr + b, ones, mask=dropped_v | carrying)
        else:
            tl.atomic_add(drop_ptr, nd, mask=nd > 0)
    else:
        tl.store(p2v_ptr + p64, tl.where(valid, row, -1).to(tl.int64), mask=live)


# --- launchers -------------------------------------------------------------------------------


def _use_csr(mode: str, n: int, batch: int) -> bool:
    """Hard mode: the CSR layout (``"csr"``, or ``"auto"`` below ``CSR_MAX_POINTS_PER_SAMPLE`` points
    per sample on average: scan-sized samples, E2's batch of 8 scans too) or the ranked lists."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    return mode == "csr" or (mode == "auto" and n < CSR_MAX_POINTS_PER_SAMPLE * batch)


def _run_main(
    points,
    lengths,
    voxel_size,
    point_cloud_range,
    hard,
    max_points,
    max_voxels,
    pad_to_max=False,
    mode="auto",
    tuning: Tuning = DEFAULT,
):
    """Fill + main kernel. Returns the work views needed by the rows kernel / the caller."""
    n, num_channels = points.shape
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    gx, gy, gz = _grid_size(voxel_size, point_cloud_range)
    # open addressing at load <= 1/2: twice the most voxels there can be (points, or grid cells)
    cap = max(_launch.next_power_of_2(2 * min(n, batch * gx * gy * gz)), 64)
    block, num_warps = tuning.main(n, hard)
    num_blocks = _launch.cdiv(n, block)
    pb = _launch.next_power_of_2(max_points) if hard else 1
    list_stride = min(max_voxels, n) if hard else 0
    csr = hard and _use_csr(mode, n, batch)
    list_len = batch * list_stride * pb if hard and not csr else 0
    csr_lens = [batch * list_stride, n, n] if csr else [0, 0, 0]  # counts, list row and position per point
    coords_len = 4 * n if (not hard and pad_to_max) else 0  # -1 padded coords of the dynamic fixed form
    # one int32 buffer, one fill: every "empty" is -1 (keys: int64 -1 = two int32 -1)
    # coords first: the tensor returned to the caller then starts at storage offset 0 (as the fake
    # function promises), and the int64 keys stay 8-byte aligned (coords_len is a multiple of 4)
    sizes = [coords_len, 2 * cap, cap, cap, 3, num_blocks, num_blocks, 2 * batch, batch, list_len, *csr_lens]
    work = torch.full((sum(sizes),), -1, dtype=torch.int32, device=device)
    views = list(torch.split(work, sizes))
    keys = views[1].view(torch.int64)
    coords, first, row, ticket, flags, desc, stats, drop, lists, cnt, lrb, posb = views[0], *views[2:]
    p2v = torch.empty(n, dtype=torch.int64, device=device)
    if not hard and not pad_to_max:
        coords = torch.empty((n, 4), dtype=torch.int32, device=device)  # rows < M all written
    segmented = hard and lengths is not None
    args = (
        points,
        lengths if lengths is not None else ticket,
        keys,
        first,
        row,
        ticket,
        flags,
        desc,
        stats,
        drop,
        lists,
        p2v,
        coords,
        cnt,
        lrb,
        posb,
        n,
        num_channels,
        batch,
        cap,
        *(float(v) for v in point_cloud_range),
        *(float(v) for v in voxel_size),
        gx,
        gy,
        gz,
        max_points,
        max_voxels,
        list_stride,
    )
    meta = dict(
        HAS_LENGTHS=lengths is not None,
        HARD=hard,
        SEGMENTED=segmented,
        PB=pb,
        BLOCK=block,
        LOOKBACK=tuning.lookback,
        PUBLISH_INCLUSIVE=tuning.publish_inclusive,
        SNAP=min(pb, 8),
        BMAX=_bmax(batch),
        KEY64=tuning.key64 or (batch * list_stride + 1) * 2 * block >= 2**31,
        SEEN=tuning.seen,
        CSR=csr,
        num_warps=num_warps,
    )
    _launch.launch(_voxelize_kernel, (num_blocks,), *args, **meta)
    return dict(
        launch=(args, meta),
        views=views,
        cap=cap,
        stats=stats,
        drop=drop,
        lists=lists,
        p2v=p2v,
        coords=None if hard else coords.view(n, 4),
        pb=pb,
        list_stride=list_stride,
        batch=batch,
        csr=(cnt, lrb, posb) if csr else None,
    )


def voxelize(
    points,
    lengths,
    voxel_size,
    point_cloud_range,
    max_points_per_voxel,
    max_voxels,
    pad_to_max,
    mode: str = "auto",
    tuning: Tuning = DEFAULT,
):
    """Hard FCFS voxelization on the GPU (or under the Triton interpreter).

    Args:
        points: ``(N, C)`` contiguous float; lengths: ``(B,)`` int or None; voxel_size (3,),
            point_cloud_range (6,) floats; caps ≥ 1; pad_to_max: fixed ``B * max_voxels`` rows.
        mode: ``"auto"``, ``"csr"`` or ``"lists"`` (see ``pcops.voxelize``).
        tuning: launch parameters and test hooks (``Tuning``; the defaults are the product's).
    Returns:
        ``(voxels, coords, num_points, point_to_voxel, num_voxels, num_dropped_points,
        num_dropped_voxels)`` as ``pcops.voxelize``. The variable-size form reads the per-sample
        voxel counts on the host once (to size the outputs); ``pad_to_max`` has no host sync.
        Launches: a fill, the main kernel, (CSR mode: a ``torch.cumsum`` and the scatter kernel,)
        the rows kernel.
    """
    n, num_channels = points.shape
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    if n == 0:
        rows = batch * max_voxels if pad_to_max else 0
        zeros = torch.zeros(batch, dtype=torch.int64, device=device)
        return (
            points.new_zeros((rows, max_points_per_voxel, num_channels)),
            torch.full((rows, 4), -1, dtype=torch.int32, device=device),
            torch.zeros(rows, dtype=torch.int32, device=device),
            torch.empty(0, dtype=torch.int64, device=device),
            zeros,
            zeros.clone(),
            zeros.clone(),
        )
    w = _run_main(
        points, lengths, voxel_size, point_cloud_range, True, max_points_per_voxel, max_voxels, mode=mode, tuning=tuning
    )
    if pad_to_max:
        rows = batch * max_voxels
    else:
        before, after = w["stats"].view(2, batch).tolist()  # the one host sync: M
        rows = sum(min(a - s, max_voxels) for s, a in zip(before, after))
    voxels = torch.empty((rows, max_points_per_voxel, num_channels), dtype=points.dtype, device=device)
    coords = torch.empty((rows, 4), dtype=torch.int32, device=device)
    npts = torch.empty(rows, dtype=torch.int32, device=device)
    counts = [torch.empty(batch, dtype=torch.int64, device=device) for _ in range(3)]
    if w["csr"] is not None:
        cnt, lrb, posb = w["csr"]
        csum = torch.cumsum(cnt, 0, dtype=torch.int32)
        seg = torch.empty(n, dtype=torch.int32, device=device)
        scatter = (
            (_launch.cdiv(n, tuning.scatter_block),),
            (lrb, posb, cnt, csum, seg, n),
            dict(BLOCK=tuning.scatter_block, REVERSE=tuning.reverse_segments),
        )
        _launch.launch(_voxel_scatter_kernel, scatter[0], *scatter[1], **scatter[2])
    else:
        cnt = csum = seg = w["lists"]  # unused
    rows_per_program, rows_warps = tuning.rows
    _backend.log_kernel(
        "voxelize", "_voxelize_kernel + " + ("scatter + rows (csr)" if w["csr"] is not None else "rows (lists)")
    )
    rows_args = (
        points,
        w["stats"],
        w["drop"],
        w["lists"],
        cnt,
        csum,
        seg,
        voxels,
        coords,
        npts,
        w["p2v"],
        *counts,
        n,
        num_channels,
        batch,
        rows,
        *(float(v) for v in point_cloud_range[:3]),
        *(float(v) for v in voxel_size),
        max_points_per_voxel,
        max_voxels,
        w["list_stride"],
    )
    rows_meta = dict(
        PB=w["pb"],
        CB=_launch.next_power_of_2(num_channels),
        ROWS=rows_per_program,
        SB=128,
        BMAX=_bmax(batch),
        C_EXACT=num_channels == _launch.next_power_of_2(num_channels),
        CSR=w["csr"] is not None,
        num_warps=rows_warps,
    )
    _launch.launch(_voxel_rows_kernel, (max(_launch.cdiv(rows, rows_per_program), 1),), *rows_args, **rows_meta)
    if tuning is DEFAULT and points.is_cuda and w["csr"] is not None:
        _native_register_hard(
            points, lengths, voxel_size, point_cloud_range, pad_to_max, w, scatter, rows_args, rows_meta
        )
    return voxels, coords, npts, w["p2v"], counts[0], counts[1], counts[2]


def dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max, tuning: Tuning = DEFAULT):
    """Dynamic voxelization on the GPU (or under the Triton interpreter); ``tuning`` as ``voxelize``.

    Returns:
        ``(point_to_voxel (N,) int64, coords (M or N, 4) int32, num_voxels (B,) int64)``.
        One fill and one launch (plus a subtraction for ``num_voxels``); the variable-size form
        reads ``M`` on the host once (``coords`` is then a view of an ``(N, 4)`` buffer),
        ``pad_to_max`` never syncs (``coords`` rows ≥ M are −1).
    """
    n = points.shape[0]
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    if n == 0:
        return (
            torch.empty(0, dtype=torch.int64, device=device),
            torch.empty((0, 4), dtype=torch.int32, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
        )
    w = _run_main(points, lengths, voxel_size, point_cloud_range, False, 1, 2**31 - 1, pad_to_max, tuning=tuning)
    if tuning is DEFAULT and points.is_cuda:
        _native_register_dynamic(points, lengths, voxel_size, point_cloud_range, pad_to_max, w)
    stats = w["stats"].view(2, batch)
    num_voxels = torch.sub(stats[1], stats[0], out=torch.empty(batch, dtype=torch.int64, device=device))  # 1 launch
    coords = w["coords"]
    if not pad_to_max:
        before, after = stats.tolist()  # the one host sync: M
        coords = coords[: sum(a - s for s, a in zip(before, after))]  # a view: no copy launch
    return w["p2v"], coords, num_voxels


_NATIVE_DONE: set = set()  # the classes handed to the native host path (or found not registrable)
_MAIN_KINDS = "p" * 16 + "i" * 4 + "f" * 9 + "i" * 6
_ROWS_KINDS = "p" * 14 + "i" * 4 + "f" * 6 + "i" * 3


def _native_register_dynamic(points, lengths, voxel_size, point_cloud_range, pad_to_max, w) -> None:
    """Hand this dynamic voxelization's main kernel to the native host path (below)."""
    _native_register(points, lengths, voxel_size, point_cloud_range, pad_to_max, w, False, 1, 2**31 - 1)


def _native_register_hard(points, lengths, voxel_size, point_cloud_range, pad_to_max, w, scatter, rows_args, rows_meta):
    """Hand this hard voxelization's kernels (main, scatter, rows; the CSR layout) to the native host
    path (below). A variable-size call learns its row count after the main kernel, so the rows
    kernel is bound for each specialisation class of that count (1, a multiple of 16, other:
    compiled here once, without a launch)."""
    max_points, max_voxels = rows_args[24], rows_args[25]
    rows_per_program = DEFAULT.rows[0]
    counts = (rows_args[17],) if pad_to_max else (1, 16, 17)
    rows = [None, None, None]

    def extra(native):
        for r in counts:
            a = rows_args[:17] + (r,) + rows_args[18:]
            rows[native.spec(r)] = native.bind(
                _voxel_rows_kernel, (max(_launch.cdiv(r, rows_per_program), 1),), a, rows_meta, _ROWS_KINDS
            )
        s = native.bind(_voxel_scatter_kernel, scatter[0], scatter[1], scatter[2], "pppppi")
        if s is None or any(rows[native.spec(r)] is None for r in counts):
            return None
        return s, tuple(rows), scatter[2]["BLOCK"], rows_per_program

    _native_register(points, lengths, voxel_size, point_cloud_range, pad_to_max, w, True, max_points, max_voxels, extra)


def _native_register(points, lengths, voxel_size, point_cloud_range, pad_to_max, w, hard, max_points, max_voxels,
                     extra=None) -> None:  # fmt: skip
    """Hand a voxelization's kernels to the native host path (``pcops._native``;
    ``csrc/host/voxelize.cpp`` derives the same work layout from N and passes the arguments in
    this order), once per grid, dtypes, caps, sample count and argument classes. Starts the
    module's build on the first call."""
    from .. import _native

    host = _native.loaded()
    if host is None:
        return
    args, meta = w["launch"]
    n = points.shape[0]
    align = sum(1 << i for i, v in enumerate(w["views"]) if not v.data_ptr() & 15)
    grid = (*(float(v) for v in point_cloud_range), *(float(v) for v in voxel_size))
    done = (points.device.index, points.dtype, points.shape[1], None if lengths is None else lengths.dtype,
            w["batch"], grid, hard, max_points, max_voxels, pad_to_max, n >= DEFAULT.big_n, meta["KEY64"],
            _native.spec(n), _native.spec(w["list_stride"]), align)  # fmt: skip
    if done in _NATIVE_DONE or not _native.registrable(points, *(() if lengths is None else (lengths,))):
        return
    _NATIVE_DONE.add(done)
    num_blocks = _launch.cdiv(n, meta["BLOCK"])
    main = _native.bind(_voxelize_kernel, (num_blocks,), args, meta, _MAIN_KINDS)
    more = extra(_native) if extra is not None else (None, None, 0, 0)
    if main is None or more is None:
        return
    (small, _), (big, _) = DEFAULT.hard_main if hard else DEFAULT.dynamic_main
    values = (*args[29:32], small, big, DEFAULT.big_n, CSR_MAX_POINTS_PER_SAMPLE)
    sizes = (w["cap"], num_blocks, meta["BLOCK"], w["list_stride"], int(meta["KEY64"]))
    if host.vx_register(points, lengths, list(grid[:6]), list(grid[6:]), hard, max_points, max_voxels, pad_to_max,
                        values, sizes, align, main, *more):  # fmt: skip
        _native.registered("voxelize" if hard else "dynamic_voxelize")
    else:
        logging.getLogger("pcops").warning(
            "pcops: the native host path derives another voxelization work layout than the Python path "
            "(N=%d); this voxelization class stays on the Python path",
            n,
        )
