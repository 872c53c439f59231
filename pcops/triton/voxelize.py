"""Triton kernels for deterministic voxelization (hard FCFS and dynamic) on a GPU hash table.

Hard voxelization of clouds below ``_CSR_MAX_N`` points (the CSR mode, the default for scans) is
one fill, the main kernel (2 a-b below, then one ``atomic_add`` per point on its voxel's count,
which gives the point an arrival position), one ``torch.cumsum`` of the counts (segment
offsets), ``_voxel_scatter_kernel`` (each point to its position in its voxel's CSR segment) and
``_voxel_rows_kernel`` (3 below, its lowest ``max_points_per_voxel`` indices from a sort of the
segment's first ``PB`` entries merged with each further ``PB``): no ranking, waits or cascades
in the main kernel. Bigger clouds (whose dense voxels would make the rows kernel loop), and the
CSR mode's predecessor, rank the points in the main kernel instead: one fill and two launches
(dynamic: one fill and one launch):

1. ``torch.full(-1)`` of one int32 work buffer: the hash table (int64 keys, encoded first
   point, voxel row per slot), scan descriptors, per-sample counters and the per-voxel
   lists ``L`` (everything's "empty" is −1, so a single fill initialises it all).
2. ``_voxelize_kernel``, one program per block of ``BLOCK`` consecutive points, blocks taken
   in order through an atomic ticket (so a block only ever waits on blocks already running,
   which never wait on later ones):
   a. voxel cell and packed int64 key of each point (float32, IEEE ``div_rn``, exactly as the
      reference); open-addressing insert (``atomic_cas``, linear probing) and
      ``atomic_max(N - 1 - p)`` per slot, i.e. the voxel's first point; then the block raises
      its "inserted" flag and waits until every earlier block has raised its own (from a shared
      watermark on), after which ``first point == p`` is final for all points of this block;
   b. a single-pass prefix sum (decoupled look-back, segmented by sample for the per-sample
      cap) over the "first point of its voxel" flags numbers the voxels in first-point order;
      the first point publishes its voxel's row (or −2: dropped by ``max_voxels``) in the slot;
   c. every point reads its voxel's row; the voxel keeps its first ``max_points_per_voxel``
      points in a list of encoded indices ``N - 1 - p`` (largest first) filled by ``atomic_max``
      at a start position: a position keeps the larger value and passes the smaller one on (a
      cascade), so whatever the order of the atomics position ``j`` ends holding the
      ``(j+1)``-th smallest point index, and exactly the points of rank ≥ ``max_points_per_voxel``
      fall off the end: the deterministic FCFS set. (Proof: the values that ever reach position
      ``j`` are exactly those that are not among the ``j`` largest and do not start beyond
      ``j``; the largest of them stays. That holds for any start position up to a value's rank,
      i.e. the number of larger values in its voxel.)
      Default (``_RANK_TABLE = False``, ``_RANK_SORT = True``, measured on the H200): the
      block sorts its (voxel row, lane) keys; a point starts at its in-block rank plus the
      earlier blocks' values it sees in the list, and blocks racing on a voxel cascade each
      other's points. ``_RANK_TABLE = True`` (selectable, being measured): exact ranks, so no point ever cascades. The block sorts its
      (voxel row, lane) keys: rank in the block = index − run start, run length from the same
      scan of the flipped keys. Each run enters one entry (earliness of its block, point count) into its voxel's
      run table, a list of the ``max_points_per_voxel`` earliest runs kept by the same
      ``atomic_max`` cascade (runs, not points, so races cost a round or two); after a second
      wait for every earlier block's entries, those entries are settled at the table's front
      and their counts give the points of the voxel in earlier blocks. A point's rank is that
      count plus its rank in the block; kept points store themselves at their final list
      position (a plain store). ``_RANK_SORT = False``: the plain cascade from a list snapshot.
3. ``_voxel_rows_kernel``, one program per block of output rows: maps a packed output row to
   its sample's list, gathers the points into ``voxels`` (zero padding written in the same
   pass), writes ``coords``, ``num_points``, ``point_to_voxel`` of the kept points and the
   per-sample counts.

The variable-size form reads the per-sample voxel counts on the host (one sync) between 2
and 3 to size the outputs; ``pad_to_max`` sizes them ``B * max_voxels`` and never syncs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# main kernel launch configuration, (points per program (the scan granularity), warps), for
# clouds below / from _BIG_N points, per mode. H200, graph-replayed pad_to_max, commit 72fc0f0
# (hard with the first-point wait, since dropped): (1024, 16) was the fastest hard and dynamic
# configuration on V1 and V2 (dynamic V1 0.029 ms vs 0.037 with (1024, 8); V2 hard 0.53 vs 0.65
# (1024, 8), 0.61 (2048, 32), 0.82 (4096, 32)). benchmarks/bench_voxelize.py sweeps them.
_MAIN_CONFIG = {"hard": ((1024, 16), (1024, 16)), "dynamic": ((1024, 16), (1024, 16))}
_BIG_N = 400_000
# descriptors read per look-back / wait step
_LOOKBACK = 128
# CSR scatter kernel: points per program
_SCATTER_BLOCK = 1024
# rows kernel launch configuration: (output rows per program, warps)
_ROWS_CONFIG = (16, 4)
# hard mode: in-block point ranks from a sort of (voxel, lane) keys (True) or the plain cascade
_RANK_SORT = True
# hard mode, sorted ranks: wait until a voxel begun by an earlier block holds its first point.
# Off: the waits chain block after block (H200 V1 0.36 ms with, 0.092 ms without)
_WAIT_FIRST = False
# hard mode: exact point ranks from per-voxel tables of the earliest blocks' runs (no point
# cascades between racing blocks; a second "inserted" wait); else _RANK_SORT decides. (H200 at
# 72fc0f0, sorted ranks: V1 0.092 ms of which ~50 µs past the dynamic kernel, mostly point
# cascades of blocks racing on a voxel.) Off by default until measured on the H200: the
# benchmark's "run table" row and tests/test_voxelize.py::test_gpu_table_variant exercise it.
_RANK_TABLE = False
# hard mode for clouds below this many points per sample (on average): no ranking in the main kernel, only an arrival
# position per point; a scatter kernel lays each voxel's points out as a CSR segment (offsets from
# one torch.cumsum) and the rows kernel keeps the max_points smallest indices of each segment (a
# sort of PB entries, plus a merge per further PB for the few larger voxels). Bigger clouds keep the
# ranked lists (_RANK_SORT / _RANK_TABLE), whose rows kernel needs no merge loop for dense voxels:
# in the CSR mode a voxel of c points costs its rows program c / PB chunk loads (a sort-merge only
# for chunks holding an index below the PB-th smallest so far): fine for LiDAR scans (V1's largest
# voxel holds 127 points; V2's 10x-tiled scan ~1,300), slow for clouds that put 10^5 points in one voxel
# (H200, V1 plus K points in one voxel, graph replay: K = 10^4 0.20 ms, 10^5 1.51 ms, 10^6 13.7 ms; the
# lists 0.095, 0.185, 1.04). Tried: a pre-test of 8 chunks per wide load (10^6: 5.2 ms) raised the rows
# kernel from 64 to 168 registers and V1 from 0.054 to 0.0575 ms: not kept (benchmarks/NOTES.md).
_CSR_MAX_N = 2_000_000  # H200 at 14c32e1: V1 0.054 ms (lists 0.094), V2 0.183 (lists 0.240), E2's batch of 8 scans
# tests only: True lays the CSR segments out in reverse arrival order (exercises the rows kernel's merges,
# which the interpreter's in-order blocks never need otherwise)
_CSR_REVERSE = False
# the "inserted" wait reads flags from a shared watermark on (False: from block 0)
_WATERMARK = True
# tests only: False makes the sorted path ignore earlier blocks' list entries (every collision cascades)
_SEEN = True
# tests only: True sorts int64 keys even where int32 ones fit
_KEY64 = False
# tests only: False makes blocks publish aggregates only, so look-backs walk to a sample start
_PUBLISH_INCLUSIVE = True


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _run_start_combine(k1, s1, k2, s2):
    """Scan over sorted keys: (key, index of the first element of its run). Associative because
    equal keys are contiguous (k1 == k2 means everything between them is one run)."""
    return k2, tl.where(k1 == k2, s1, s2)


@triton.jit
def _seen_larger(lst, need, thr, SNAP: tl.constexpr, PB: tl.constexpr):
    """How many list entries larger than ``thr`` a read of the list ``lst`` (per lane) proves: an
    entry ``> thr`` at position ``j`` proves ``j + 1`` (a list position only ever holds a value
    whose larger values fill the positions before it), so any set of positions read gives a
    valid count. Two steps of reads instead of PB: every SNAP-th position, then the SNAP positions
    from the last of those held (the list fills from the front, so this finds the whole prefix
    in the usual case). One [BLOCK] load per position (constant offsets from one pointer per
    lane: few registers); plain loads (a stale value is an older state, still a valid count);
    positions past the cap are never written (read as -1), so they need no mask."""
    j0 = tl.zeros_like(need.to(tl.int32))
    for c in tl.static_range(SNAP, PB, SNAP):
        v = tl.load(lst + c, mask=need, other=-1, cache_modifier=".cg")
        j0 = tl.where(v > thr, c, j0)  # c increasing: the last one held wins
    seen = tl.where(j0 > 0, j0 + 1, 0)
    lst0 = lst + j0
    for k in tl.static_range(0, SNAP):
        v = tl.load(lst0 + k, mask=need, other=-1, cache_modifier=".cg")
        seen = tl.maximum(seen, tl.where(v > thr, j0 + k + 1, 0))
    return seen


@triton.jit
def _voxel_cell(v, lo, hi, size, cells):
    """Cell index along one axis (int32) and the in-range test, exactly the reference's float32 math."""
    c = tl.floor(tl.math.div_rn(v - lo, size))
    ok = (v >= lo) & (v < hi) & (c < cells)
    return tl.where(ok, c, 0.0).to(tl.int32), ok


@triton.jit
def _voxelize_kernel(
    points_ptr,  # (N, C) contiguous, any float dtype
    lengths_ptr,  # (B,) int32/int64 sample lengths (unused without HAS_LENGTHS)
    keys_ptr,  # (CAP,) int64 hash keys, -1 = empty
    first_ptr,  # (CAP,) int32 max of N - 1 - p over the slot's points (-1 = none)
    row_ptr,  # (CAP,) int32 voxel row (sample-local) of the slot, -2 dropped, -1 not yet known
    ticket_ptr,  # (3,) int32 block ticket, the "inserted" and "run table inserted" watermarks; start at -1
    flags_ptr,  # (G,) int32 "inserted" flag per block, -1 = not yet
    desc_ptr,  # (G,) int32 look-back descriptor per block: value << 2 | status (1 aggregate, 2 inclusive)
    stats_ptr,  # (2, B) int32: voxel count before the first / after the last point of each sample
    drop_ptr,  # (B,) int32 dropped-point counter per sample, starts at -1
    lists_ptr,  # (B * S, PB) int32 per-voxel lists of N - 1 - p, -1 = empty (HARD only)
    table_ptr,  # (B * S, PB) int32 per-voxel run tables (G-1-block) << CBITS | count, -1 = empty (TABLE only)
    flags2_ptr,  # (G,) int32 "run table inserted" flag per block, -1 = not yet (TABLE only)
    p2v_ptr,  # (N,) int64 point_to_voxel: -1 (HARD: rows kernel fills the kept ones) / row
    coords_ptr,  # (N, 4) int32 (b, z, y, x) per voxel row (dynamic only)
    cnt_ptr,  # (B * S,) int32 points per list row minus one, starts at -1 (CSR only)
    lrb_ptr,  # (N,) int32 list row of each kept-voxel point, -1 none (CSR only)
    posb_ptr,  # (N,) int32 arrival position of the point in its list row (CSR only)
    num_points, num_channels, batch_size, cap,
    x_lo, y_lo, z_lo, x_hi, y_hi, z_hi,  # point_cloud_range, float32
    vx, vy, vz,  # voxel_size, float32
    gx, gy, gz,  # grid cells per axis (int)
    max_points, max_voxels, list_stride,  # caps; S = rows per sample in lists (HARD only)
    HAS_LENGTHS: tl.constexpr,
    HARD: tl.constexpr,
    SEGMENTED: tl.constexpr,
    PB: tl.constexpr,
    BLOCK: tl.constexpr,
    LOOKBACK: tl.constexpr,
    PUBLISH_INCLUSIVE: tl.constexpr,
    SNAP: tl.constexpr,
    BMAX: tl.constexpr,  # > 0: next power of 2 >= B, samples handled as one vector; 0: a loop over B
    RANK_SORT: tl.constexpr,  # HARD: in-block ranks from a sort (True) or the plain atomic cascade (False)
    KEY64: tl.constexpr,  # RANK_SORT: (B * S + 1) * 2 * BLOCK does not fit int32, sort int64 keys
    SEEN: tl.constexpr,  # RANK_SORT: read earlier blocks' list entries (tests: False forces cascades)
    WAIT_FIRST: tl.constexpr,  # RANK_SORT: wait for the first point of voxels begun by earlier blocks
    WATERMARK: tl.constexpr,  # the "inserted" wait starts at a shared watermark (else at block 0)
    TABLE: tl.constexpr,  # HARD: exact ranks from per-voxel tables of the earliest runs (see _RANK_TABLE)
    CBITS: tl.constexpr,  # TABLE: bits of a run's point count in a table entry
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
    if WATERMARK:
        w0 = tl.maximum(tl.atomic_add(ticket_ptr + 1, 0, sem="acquire"), 0)
    else:
        w0 = t * 0
    for c0 in range(w0, t, BLOCK):
        offs = c0 + lane
        m = offs < t
        f = tl.atomic_add(flags_ptr + offs, 0, mask=m, sem="acquire")
        todo = m & (f < 0)
        while tl.max(todo.to(tl.int32), axis=0) > 0:
            f = tl.atomic_add(flags_ptr + offs, 0, mask=todo, sem="acquire")
            todo = todo & (f < 0)
    if WATERMARK:
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
        elif TABLE:
            # exact ranks, no cascade of points: rank = (points of the voxel in earlier blocks) +
            # (rank among this block's points of the voxel, from a sort of (list row, lane)).
            # The first term comes from the voxel's run table: each block enters one entry per
            # voxel, (G - 1 - block, point count), kept in a list of the max_points largest
            # entries (= earliest blocks) by the order-free atomic_max cascade; once every
            # earlier block has entered its runs (a second "inserted" wait), the earlier blocks'
            # entries are settled in the table's first positions (later entries are smaller and
            # never move them), so their counts add up exactly. If the table holds max_points
            # earlier entries, earlier blocks hold >= max_points points: all ours drop. Each kept
            # point then stores itself at its final list position (a plain store).
            lr_none = batch_size * list_stride
            lr = tl.where(keep, b * list_stride + row, lr_none)
            if KEY64:
                skey = tl.sort(lr.to(tl.int64) * BLOCK + lane)
            else:
                skey = tl.sort(lr * BLOCK + lane)
            lr_s = (skey // BLOCK).to(tl.int32)
            lane_s = (skey % BLOCK).to(tl.int32)
            _, run0 = tl.associative_scan((lr_s, lane), 0, _run_start_combine)
            # run end: the same forward scan on the flipped keys (descending, runs still contiguous)
            _, end_f = tl.associative_scan((tl.flip(lr_s, 0), lane), 0, _run_start_combine)
            run1 = BLOCK - 1 - tl.flip(end_f, 0)
            rank = lane - run0
            cand = lr_s < lr_none
            x = num_points - 1 - (t * BLOCK + lane_s)
            tab = table_ptr + lr_s * PB
            lead = cand & (rank == 0)
            cmask = (1 << CBITS) - 1
            num_blocks = tl.cdiv(num_points, BLOCK)
            ent = ((num_blocks - 1 - t) << CBITS) | tl.minimum(run1 - run0 + 1, PB)
            # enter the run: start after the earlier blocks' entries seen (entries > ours)
            epos = _seen_larger(tab, lead, ent, SNAP, PB)
            ecar = lead
            eact = ecar & (epos < max_points)
            while tl.max(eact.to(tl.int32), axis=0) > 0:
                old = tl.atomic_max(tab + epos, ent, mask=eact)
                ecar = ecar & ~(eact & (old == -1))
                ent = tl.where(eact, tl.minimum(old, ent), ent)
                epos = tl.where(eact, epos + 1, epos)
                eact = ecar & (epos < max_points)
            tl.debug_barrier()
            tl.atomic_xchg(flags2_ptr + t, 1, sem="release")
            if WATERMARK:
                w2 = tl.maximum(tl.atomic_add(ticket_ptr + 2, 0, sem="acquire"), 0)
            else:
                w2 = t * 0
            for c0 in range(w2, t, BLOCK):
                offs = c0 + lane
                m = offs < t
                f = tl.atomic_add(flags2_ptr + offs, 0, mask=m, sem="acquire")
                todo = m & (f < 0)
                while tl.max(todo.to(tl.int32), axis=0) > 0:
                    f = tl.atomic_add(flags2_ptr + offs, 0, mask=todo, sem="acquire")
                    todo = todo & (f < 0)
            if WATERMARK:
                tl.atomic_max(ticket_ptr + 2, t + 1, sem="release")
            # points of the voxel in earlier blocks: the counts of the table's leading entries
            # from blocks < t (entry > thr_e), read SNAP positions per round trip
            thr_e = ((num_blocks - 1 - t) << CBITS) | cmask
            need = cand & (rank < max_points)
            earlier = tl.zeros((BLOCK,), tl.int32)
            inpre = need
            c = t * 0
            while tl.max(inpre.to(tl.int32), axis=0) > 0:
                rd = inpre
                for k in tl.static_range(0, SNAP):
                    v = tl.load(tab + c + k, mask=rd, other=-1, volatile=True)
                    inpre = inpre & (v > thr_e)
                    earlier += tl.where(inpre, v & cmask, 0)
                c += SNAP
                inpre = inpre & (c < max_points) & (earlier + rank < max_points)
            grank = earlier + rank
            kept = need & (grank < max_points)
            tl.store(lists_ptr + lr_s * PB + grank, x, mask=kept)
            carrying = cand & ~kept  # dropped: the voxel already holds max_points earlier points
        elif RANK_SORT:
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
            if WAIT_FIRST:
                # a voxel begun by an earlier block: wait until that block has put the voxel's first
                # point at position 0 (it never waits on later blocks: no deadlock), so the reads
                # below see that block's points and ours do not land first and cascade its. The
                # first reads go out with the first step's (one round trip); points that had to
                # wait read the first step again.
                wt = need & ((q % 2) == 1)
                v0 = tl.load(lst, mask=wt, other=-1, volatile=True)
                for c in tl.static_range(SNAP, PB, SNAP):
                    v = tl.load(lst + c, mask=need, other=-1, cache_modifier=".cg")
                    j0 = tl.where(v > thr, c, j0)  # c increasing: the last one held wins
                wt = wt & (v0 <= thr)
                if tl.max(wt.to(tl.int32), axis=0) > 0:
                    again = wt
                    while tl.max(wt.to(tl.int32), axis=0) > 0:
                        v0 = tl.load(lst, mask=wt, other=-1, volatile=True)
                        wt = wt & (v0 <= thr)
                    for c in tl.static_range(SNAP, PB, SNAP):
                        v = tl.load(lst + c, mask=again, other=-1, cache_modifier=".cg")
                        j0 = tl.where(again & (v > thr), c, j0)
            else:
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
        else:
            lst = lists_ptr + ((b.to(tl.int64) * list_stride + row) * PB)
            cand = keep
            x = enc
            pos = tl.zeros((BLOCK,), tl.int32)
            for j0 in tl.static_range(0, PB, SNAP):  # unrolled: the chunk loads are independent
                jj = j0 + tl.arange(0, SNAP)
                snap = tl.load(lst[:, None] + jj[None, :], mask=keep[:, None] & (jj < max_points)[None, :], other=-1,
                               volatile=True)
                pos = tl.maximum(pos, tl.max(tl.where(snap > x[:, None], jj[None, :] + 1, 0), axis=1))
        if not TABLE and not CSR:
            carrying = cand  # still holds a value that is not in the list
            act = carrying & (pos < max_points)
            while tl.max(act.to(tl.int32), axis=0) > 0:
                old = tl.atomic_max(lst + pos, x, mask=act)
                carrying = carrying & ~(act & (old == -1))
                x = tl.where(act, tl.minimum(old, x), x)
                pos = tl.where(act, pos + 1, pos)
                act = carrying & (pos < max_points)
        # carrying: a point pushed off the list (in sorted order under RANK_SORT)
        nd = tl.sum(dropped_v.to(tl.int32), axis=0) + tl.sum(carrying.to(tl.int32), axis=0)
        if HAS_LENGTHS:
            b_lo = tl.min(tl.where(live, b, batch_size), axis=0)
            b_hi = tl.max(tl.where(live, b, -1), axis=0)
            if b_lo == b_hi:
                tl.atomic_add(drop_ptr + b_lo, nd, mask=nd > 0)
            else:
                ones = tl.full((BLOCK,), 1, tl.int32)
                if RANK_SORT or TABLE:  # carrying is in sorted order
                    tl.atomic_add(drop_ptr + b, ones, mask=dropped_v)
                    tl.atomic_add(drop_ptr + lr_s // list_stride, ones, mask=carrying)
                else:
                    tl.atomic_add(drop_ptr + b, ones, mask=dropped_v | carrying)
        else:
            tl.atomic_add(drop_ptr, nd, mask=nd > 0)
    else:
        tl.store(p2v_ptr + p64, tl.where(valid, row, -1).to(tl.int64), mask=live)


@triton.jit
def _voxel_scatter_kernel(
    lrb_ptr,  # (N,) int32 list row of each kept-voxel point, -1 none
    posb_ptr,  # (N,) int32 arrival position of the point in its list row
    cnt_ptr,  # (B * S,) int32 points per list row minus one
    csum_ptr,  # (B * S,) int32 inclusive cumulative sum of cnt
    seg_ptr,  # (N,) int32 out: the points of list row l at [start(l), start(l) + count(l)), arrival order
    num_points,
    BLOCK: tl.constexpr,
    REVERSE: tl.constexpr,  # tests: lay segments out in reverse arrival order (the rows kernel must merge)
):
    """CSR mode: every point of a kept voxel to its arrival position in its voxel's segment.
    ``start(l) = csum[l] + l - cnt[l]``: the counts are stored minus one, so the inclusive sum of
    the true counts up to ``l`` is ``csum[l] + l + 1``."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = p < num_points
    lr = tl.load(lrb_ptr + p, mask=live, other=-1)
    m = live & (lr >= 0)
    pos = tl.load(posb_ptr + p, mask=m, other=0)
    cnt = tl.load(cnt_ptr + lr, mask=m, other=0)  # count - 1
    start = tl.load(csum_ptr + lr, mask=m, other=0) + lr - cnt
    if REVERSE:
        pos = cnt - pos
    tl.store(seg_ptr + start + pos, p, mask=m)


@triton.jit
def _voxel_rows_kernel(
    points_ptr,  # (N, C) contiguous
    stats_ptr,  # (2, B) int32 per-sample voxel counts before / after (from the main kernel)
    drop_ptr,  # (B,) int32 dropped-point counters (start at -1)
    lists_ptr,  # (B * S, PB) int32 per-voxel lists of N - 1 - p (not CSR)
    cnt_ptr,  # (B * S,) int32 points per list row minus one (CSR only)
    csum_ptr,  # (B * S,) int32 inclusive cumulative sum of cnt (CSR only)
    seg_ptr,  # (N,) int32 the list rows' points, CSR segments in arrival order (CSR only)
    voxels_ptr,  # (R, P, C) output
    coords_ptr,  # (R, 4) int32 output
    npts_ptr,  # (R,) int32 output
    p2v_ptr,  # (N,) int64 point_to_voxel (kept points written here)
    nvox_ptr,  # (B,) int64 output: num_voxels
    ndp_ptr,  # (B,) int64 output: num_dropped_points
    ndv_ptr,  # (B,) int64 output: num_dropped_voxels
    num_points, num_channels, batch_size, num_rows,
    x_lo, y_lo, z_lo, vx, vy, vz,
    max_points, max_voxels, list_stride,
    PB: tl.constexpr,
    CB: tl.constexpr,
    ROWS: tl.constexpr,
    SB: tl.constexpr,
    BMAX: tl.constexpr,  # as in _voxelize_kernel
    C_EXACT: tl.constexpr,  # num_channels == CB: a constant row stride (vector loads and stores)
    CSR: tl.constexpr,  # the voxels' points come from CSR segments (arrival order) instead of ranked lists
):
    pid = tl.program_id(0)
    if C_EXACT:
        nc = CB
    else:
        nc = num_channels
    r = pid * ROWS + tl.arange(0, ROWS)
    # packed output row -> (sample, row in the sample)
    if BMAX > 0:
        j = tl.arange(0, BMAX)
        mj = j < batch_size
        n_j = tl.load(stats_ptr + batch_size + j, mask=mj, other=0) - tl.load(stats_ptr + j, mask=mj, other=0)
        incl = tl.cumsum(tl.minimum(n_j, max_voxels), axis=0)  # kept rows up to and including sample j
        incl = tl.where(mj, incl, 2147483647)
        le = incl[None, :] <= r[:, None]
        b = tl.sum(le.to(tl.int32), axis=1)
        base = tl.max(tl.where(le, incl[None, :], 0), axis=1)
        b = tl.where(b < batch_size, b, -1)
    else:
        b = tl.full((ROWS,), -1, tl.int32)
        base = tl.zeros((ROWS,), tl.int32)
        cum = pid * 0
        for i in range(batch_size):
            n_i = tl.load(stats_ptr + batch_size + i) - tl.load(stats_ptr + i)
            k_i = tl.minimum(n_i, max_voxels)
            inside = (r >= cum) & (r < cum + k_i)
            b = tl.where(inside, i, b)
            base = tl.where(inside, cum, base)
            cum += k_i
    in_rows = r < num_rows
    real = in_rows & (b >= 0)
    lrow = (b.to(tl.int64) * list_stride + (r - base)).to(tl.int64)

    jj = tl.arange(0, PB)
    if CSR:
        # the max_points smallest point indices of the segment, ascending: sort the first PB, then
        # merge each further chunk of PB (sort both, keep the lower half); padding sorts last
        big = 2147483647
        c = tl.load(cnt_ptr + lrow, mask=real, other=-1) + 1
        start = tl.load(csum_ptr + lrow, mask=real, other=0) + lrow + 1 - c
        seg = seg_ptr + start[:, None] + jj[None, :]
        best = tl.full((ROWS, PB), big, tl.int32)
        c_max = tl.max(c, axis=0)
        if c_max > 0:  # programs past the last voxel (pad_to_max) write padding only: no sort
            best = tl.sort(tl.load(seg, mask=jj[None, :] < c[:, None], other=big), dim=1)
            k = pid * 0 + PB
            while k < c_max:  # only programs holding a voxel of more than PB points
                chunk = tl.load(seg + k, mask=(jj[None, :] + k) < c[:, None], other=big)
                # segments are in arrival order, which follows the blocks' ticket order, so later
                # chunks rarely hold an index below the PB-th smallest so far: skip their sort
                if tl.max((tl.min(chunk, axis=1) < tl.max(best, axis=1)).to(tl.int32), axis=0) > 0:
                    both = tl.sort(tl.reshape(tl.join(best, chunk), (ROWS, 2 * PB)), dim=1)
                    best, _ = tl.split(tl.permute(tl.reshape(both, (ROWS, 2, PB)), (0, 2, 1)))
                k += PB
        has = (best < big) & (jj < max_points)[None, :]
        pidx = best.to(tl.int64)
        e = tl.where(has, num_points - 1 - best, -1)  # the lists' encoding, for the first point below
    else:
        e = tl.load(lists_ptr + lrow[:, None] * PB + jj[None, :], mask=real[:, None] & (jj < max_points)[None, :],
                    other=-1)
        has = e >= 0
        pidx = (num_points - 1 - e).to(tl.int64)
    npts = tl.sum(has.to(tl.int32), axis=1)
    tl.store(npts_ptr + r, npts, mask=in_rows)
    r64 = r.to(tl.int64)
    tl.store(p2v_ptr + pidx, tl.zeros((ROWS, PB), tl.int64) + r64[:, None], mask=has)

    cc = tl.arange(0, CB)
    if C_EXACT:
        cmask = tl.full((1, 1, CB), 1, tl.int1)  # a constant mask keeps the accesses vectorised
    else:
        cmask = (cc < nc)[None, None, :]
    vals = tl.load(points_ptr + pidx[:, :, None] * nc + cc[None, None, :], mask=has[:, :, None] & cmask, other=0.0)
    out = voxels_ptr + (r64[:, None, None] * max_points + jj[None, :, None]) * nc + cc[None, None, :]
    tl.store(out, vals, mask=in_rows[:, None, None] & (jj < max_points)[None, :, None] & cmask)

    # coords from the voxel's first point (recomputed with the main kernel's arithmetic)
    fp = (num_points - 1 - tl.max(e, axis=1)).to(tl.int64)
    fx = tl.load(points_ptr + fp * nc + 0, mask=real, other=0.0).to(tl.float32)
    fy = tl.load(points_ptr + fp * nc + 1, mask=real, other=0.0).to(tl.float32)
    fz = tl.load(points_ptr + fp * nc + 2, mask=real, other=0.0).to(tl.float32)
    cx = tl.floor(tl.math.div_rn(fx - x_lo, vx)).to(tl.int32)
    cy = tl.floor(tl.math.div_rn(fy - y_lo, vy)).to(tl.int32)
    cz = tl.floor(tl.math.div_rn(fz - z_lo, vz)).to(tl.int32)
    crow = coords_ptr + r64 * 4
    tl.store(crow + 0, tl.where(real, b, -1), mask=in_rows)
    tl.store(crow + 1, tl.where(real, cz, -1), mask=in_rows)
    tl.store(crow + 2, tl.where(real, cy, -1), mask=in_rows)
    tl.store(crow + 3, tl.where(real, cx, -1), mask=in_rows)

    if pid == 0:
        for s0 in range(0, batch_size, SB):
            s = s0 + tl.arange(0, SB)
            ms = s < batch_size
            n_s = tl.load(stats_ptr + batch_size + s, mask=ms, other=0) - tl.load(stats_ptr + s, mask=ms, other=0)
            kept = tl.minimum(n_s, max_voxels)
            tl.store(nvox_ptr + s, kept.to(tl.int64), mask=ms)
            tl.store(ndp_ptr + s, (tl.load(drop_ptr + s, mask=ms, other=-1) + 1).to(tl.int64), mask=ms)
            tl.store(ndv_ptr + s, (n_s - kept).to(tl.int64), mask=ms)


# --- launchers -------------------------------------------------------------------------------


def _bmax(batch: int) -> int:
    """Samples as one vector up to 16 of them (one round trip instead of one per sample)."""
    return triton.next_power_of_2(batch) if batch <= 16 else 0


def _main_config(n: int, hard: bool):
    small, big = _MAIN_CONFIG["hard" if hard else "dynamic"]
    return big if n >= _BIG_N else small


def _grid_size(voxel_size, point_cloud_range):
    from ..reference.voxelize import grid_size

    return grid_size(voxel_size, point_cloud_range)


def _run_main(points, lengths, voxel_size, point_cloud_range, hard, max_points, max_voxels, pad_to_max=False):
    """Fill + main kernel. Returns the work views needed by the rows kernel / the caller."""
    n, num_channels = points.shape
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    gx, gy, gz = _grid_size(voxel_size, point_cloud_range)
    # open addressing at load <= 1/2: twice the most voxels there can be (points, or grid cells)
    cap = max(triton.next_power_of_2(2 * min(n, batch * gx * gy * gz)), 64)
    block, num_warps = _main_config(n, hard)
    num_blocks = triton.cdiv(n, block)
    pb = triton.next_power_of_2(max_points) if hard else 1
    list_stride = min(max_voxels, n) if hard else 0
    csr = hard and n < _CSR_MAX_N * batch  # scan-sized samples on average (E2's batch of 8 scans too)
    list_len = batch * list_stride * pb if hard and not csr else 0
    csr_lens = [batch * list_stride, n, n] if csr else [0, 0, 0]  # counts, list row and position per point
    coords_len = 4 * n if (not hard and pad_to_max) else 0  # -1 padded coords of the dynamic fixed form
    # one int32 buffer, one fill: every "empty" is -1 (keys: int64 -1 = two int32 -1)
    # coords first: the tensor returned to the caller then starts at storage offset 0 (as the fake
    # function promises), and the int64 keys stay 8-byte aligned (coords_len is a multiple of 4)
    cbits = pb.bit_length() + 1  # run counts are capped at pb
    table = hard and not csr and _RANK_TABLE and num_blocks < 2 ** (31 - cbits)
    table_len = list_len if table else 0
    flags2_len = num_blocks if table else 0
    sizes = [coords_len, 2 * cap, cap, cap, 3, num_blocks, num_blocks, 2 * batch, batch, list_len, table_len,
             flags2_len, *csr_lens]
    work = torch.full((sum(sizes),), -1, dtype=torch.int32, device=device)
    views = list(torch.split(work, sizes))
    keys = views[1].view(torch.int64)
    coords, first, row, ticket, flags, desc, stats, drop, lists, tables, flags2, cnt, lrb, posb = views[0], *views[2:]
    p2v = torch.empty(n, dtype=torch.int64, device=device)
    if not hard and not pad_to_max:
        coords = torch.empty((n, 4), dtype=torch.int32, device=device)  # rows < M all written
    segmented = hard and lengths is not None
    _voxelize_kernel[(num_blocks,)](
        points, lengths if lengths is not None else ticket, keys, first, row, ticket, flags, desc, stats, drop,
        lists, tables, flags2, p2v, coords, cnt, lrb, posb, n, num_channels, batch, cap,
        *(float(v) for v in point_cloud_range), *(float(v) for v in voxel_size), gx, gy, gz,
        max_points, max_voxels, list_stride,
        HAS_LENGTHS=lengths is not None, HARD=hard, SEGMENTED=segmented, PB=pb, BLOCK=block,
        LOOKBACK=_LOOKBACK, PUBLISH_INCLUSIVE=_PUBLISH_INCLUSIVE, SNAP=min(pb, 8), BMAX=_bmax(batch),
        RANK_SORT=hard and not csr and _RANK_SORT, KEY64=_KEY64 or (batch * list_stride + 1) * 2 * block >= 2**31, SEEN=_SEEN,
        WAIT_FIRST=_WAIT_FIRST, WATERMARK=_WATERMARK, TABLE=table, CBITS=cbits, CSR=csr,
        num_warps=num_warps,
    )
    return dict(stats=stats, drop=drop, lists=lists, p2v=p2v, coords=None if hard else coords.view(n, 4), pb=pb,
                list_stride=list_stride, batch=batch, csr=(cnt, lrb, posb) if csr else None)


def voxelize(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max):
    """Hard FCFS voxelization on the GPU (or under the Triton interpreter).

    Args:
        points: ``(N, C)`` contiguous float; lengths: ``(B,)`` int or None; voxel_size (3,),
            point_cloud_range (6,) floats; caps ≥ 1; pad_to_max: fixed ``B * max_voxels`` rows.
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
        return (points.new_zeros((rows, max_points_per_voxel, num_channels)),
                torch.full((rows, 4), -1, dtype=torch.int32, device=device),
                torch.zeros(rows, dtype=torch.int32, device=device),
                torch.empty(0, dtype=torch.int64, device=device), zeros, zeros.clone(), zeros.clone())
    w = _run_main(points, lengths, voxel_size, point_cloud_range, True, max_points_per_voxel, max_voxels)
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
        _voxel_scatter_kernel[(triton.cdiv(n, _SCATTER_BLOCK),)](lrb, posb, cnt, csum, seg, n, BLOCK=_SCATTER_BLOCK,
                                                                 REVERSE=_CSR_REVERSE)
    else:
        cnt = csum = seg = w["lists"]  # unused
    rows_per_program, rows_warps = _ROWS_CONFIG
    _voxel_rows_kernel[(max(triton.cdiv(rows, rows_per_program), 1),)](
        points, w["stats"], w["drop"], w["lists"], cnt, csum, seg, voxels, coords, npts, w["p2v"], *counts,
        n, num_channels, batch, rows,
        *(float(v) for v in point_cloud_range[:3]), *(float(v) for v in voxel_size),
        max_points_per_voxel, max_voxels, w["list_stride"],
        PB=w["pb"], CB=triton.next_power_of_2(num_channels), ROWS=rows_per_program, SB=128, BMAX=_bmax(batch),
        C_EXACT=num_channels == triton.next_power_of_2(num_channels), CSR=w["csr"] is not None, num_warps=rows_warps,
    )
    return voxels, coords, npts, w["p2v"], counts[0], counts[1], counts[2]


def dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max):
    """Dynamic voxelization on the GPU (or under the Triton interpreter).

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
        return (torch.empty(0, dtype=torch.int64, device=device),
                torch.empty((0, 4), dtype=torch.int32, device=device),
                torch.zeros(batch, dtype=torch.int64, device=device))
    w = _run_main(points, lengths, voxel_size, point_cloud_range, False, 1, 2**31 - 1, pad_to_max)
    stats = w["stats"].view(2, batch)
    num_voxels = torch.sub(stats[1], stats[0], out=torch.empty(batch, dtype=torch.int64, device=device))  # 1 launch
    coords = w["coords"]
    if not pad_to_max:
        before, after = stats.tolist()  # the one host sync: M
        coords = coords[: sum(a - s for s, a in zip(before, after))]  # a view: no copy launch
    return w["p2v"], coords, num_voxels
