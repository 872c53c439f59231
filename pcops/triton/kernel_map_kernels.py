"""Triton kernels for sparse-convolution kernel maps on a GPU hash table (their launchers:
``pcops.triton.kernel_map``).

Keys: a voxel's linear index ``((b * D + z) * H + y) * W + x`` (int64). One int64 workspace,
filled with −1 by a single launch, holds everything that needs an initial value:

    [input table: 2·cap_in] [output table: cap_out] [group counts: G·KPAD] [counters: 4] [sink]

Tables use open addressing with linear probing in power-of-two arrays (input table load
≤ 1/4; output table: more slots than candidates, so it never fills), start = bits
``[32 - log2(cap), 32)`` of ``(key ^ key >> 29) * 0x7FEB352D`` (multiplicative hashing keeps
neighbouring keys apart). An input slot is a ``(key, row)`` pair of int64 words: the key is
claimed with ``atomic_cas`` from −1 and the row is merged with ``atomic_max`` of
``2^40 - row``, so among duplicate voxels the lowest row wins whatever order the atomics ran
in (deterministic). Input keys start probing at the first slot of a 2-slot bucket (one
aligned 32-byte sector) and lookups read a whole bucket per round: the same sectors as
slot-by-slot probing, but a lookup tile, which loops until its slowest lane is done, needs
about half the rounds (``benchmarks/NOTES.md`` has the host simulation of the S1 table). The output table (regular and transposed
conv) stores candidate output *keys*; each program appends the keys it newly claimed to a list
at a position from one ``atomic_add`` per probe round, and the list is then sorted
(``torch.sort``), which makes the output order deterministic whatever the atomics did (as int32
when ``(max batch + 1) · D'H'W' < 2^31``, the usual case: half the radix passes). Candidates
are enumerated per input only over the offsets that can divide (per axis
``k = k0 + j * s / gcd(d, s)``: 8 of 27 for 3×3×3 stride 2), and ``atomic_cas`` (which has no
mask) sends idle lanes to a contiguous sink with an impossible compare value, so finished
lanes cost one coalesced, contention-free atomic per round instead of a scattered one.

Pair count without a pass of its own: a regular or transposed map has exactly one pair per
valid (input, offset) candidate (the output it reaches is in the output set, and an
(output, offset) has one input), so the insert pass counts them, for the first row of each
distinct voxel only (duplicates add nothing). Submanifold pairs are counted by the lookup.

Pairs layout from the out-in table, no scan kernel: the lookup pass adds its hits per offset
into the counts of its *group* of ``sub`` consecutive blocks (≤ ``_MAX_GROUPS`` groups, int64
atomics: order-independent sums); each compaction program reduces all group counts itself
(a few KB) into the offsets and its own first position per offset, then ranks the hits of its
rows (``tl.cumsum``), so pairs within an offset are in ascending output order, no atomics.

Every atomic is ``sem="relaxed"`` (Triton's default is acq_rel, a fence per atomic): only
the atomicity of each operation matters inside a pass; the passes are ordered by their launches.

Launches and host syncs (S1 workloads: 44k voxels):
  submanifold: fill, insert, lookup, compact = 4 launches; 1 host sync at the very end (the
  pair count P, read after everything is queued: no bubble) or none with ``pad_pairs`` (pairs
  padded to N·K, CUDA-graph capturable).
  regular/transposed: fill, insert (inputs + candidates + counts of M and P), [1 sync: M, P
  and the largest batch index in one read], ``torch.sort``, lookup, compact = 4 launches +
  the sort's; the one sync is the output size M.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _slot(key, log_cap, cap):
    # multiplicative hash: bits [32 - log_cap, 32) of the (wrapping) product; the xor folds
    # high key bits (batch, z) into the low 32 that the product window sees
    h = (key ^ (key >> 29)) * 0x7FEB352D
    return ((h >> (32 - log_cap)) & (cap - 1)).to(tl.int32)


@triton.jit
def _any2d(mask):
    return tl.max(tl.max(mask.to(tl.int32), axis=1), axis=0) > 0


@triton.jit
def _popc(v):
    # set bits of int64 values below 2^32 (SWAR: no popc instruction needed, interpreter included)
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24) & 0xFF


@triton.jit
def _strided_candidates(
    z, y, x, inside, Do, Ho, Wo,
    Kz: tl.constexpr, Ky: tl.constexpr, Kx: tl.constexpr, sz: tl.constexpr, sy: tl.constexpr, sx: tl.constexpr,
    pz: tl.constexpr, py: tl.constexpr, px: tl.constexpr, dz: tl.constexpr, dy: tl.constexpr, dx: tl.constexpr,
    gz: tl.constexpr, gy: tl.constexpr, gx: tl.constexpr, qz: tl.constexpr, qy: tl.constexpr, qx: tl.constexpr,
    vz: tl.constexpr, vy: tl.constexpr, vx: tl.constexpr, Jy: tl.constexpr, Jx: tl.constexpr, J: tl.constexpr,
    JPAD: tl.constexpr,
):  # fmt: skip
    """A regular conv's ``(cand, oz, oy, ox, k)`` per (input, j), ``(BLOCK_N, JPAD)``: the outputs
    the inputs reach and through which offset (``cand``: valid and inside the output grid).
    o * s = i + p - k * d must divide: only k with k * d = i + p (mod s) can, i.e.
    k = k0 + j * (s / g) with k0 = ((i + p) mod s / g) * inv (mod s / g), when g | (i + p) mod s;
    enumerating those j (not all K offsets) keeps the lanes (and atomics) few."""
    j = tl.arange(0, JPAD)
    jx = j % Jx
    jy = (j // Jx) % Jy
    jz = j // (Jx * Jy)
    cand = inside[:, None] & (j < J)[None, :]
    rz = tl.where(inside, z + pz, 0) % sz
    ry = tl.where(inside, y + py, 0) % sy
    rx = tl.where(inside, x + px, 0) % sx
    kz = ((rz // gz) * vz) % qz
    ky = ((ry // gy) * vy) % qy
    kx = ((rx // gx) * vx) % qx
    kz = kz[:, None] + jz[None, :] * qz
    ky = ky[:, None] + jy[None, :] * qy
    kx = kx[:, None] + jx[None, :] * qx
    cand = cand & (rz % gz == 0)[:, None] & (ry % gy == 0)[:, None] & (rx % gx == 0)[:, None]
    cand = cand & (kz < Kz) & (ky < Ky) & (kx < Kx)
    nz = z[:, None] + pz - kz * dz
    ny = y[:, None] + py - ky * dy
    nx = x[:, None] + px - kx * dx
    cand = cand & (nz >= 0) & (ny >= 0) & (nx >= 0)
    oz = tl.where(cand, nz, 0) // sz
    oy = tl.where(cand, ny, 0) // sy
    ox = tl.where(cand, nx, 0) // sx
    cand = cand & (oz >= 0) & (oz < Do) & (oy >= 0) & (oy < Ho) & (ox >= 0) & (ox < Wo)
    return cand, oz, oy, ox, (kz * Ky + ky) * Kx + kx


@triton.jit
def _kmap_insert_kernel(
    coords_ptr,  # (N, 4) int32 (batch, z, y, x) input voxels
    ws_ptr,  # (ws,) int64 workspace, -1 = empty: input table (2 cap_in) | output table (cap_out) | counts | counters | sink
    out_keys_ptr,  # (bound,) int64 out: distinct candidate output keys, unordered (GEN)
    out_keys32_ptr,  # (bound,) int32 out: the same keys truncated (used when the key space fits)
    out_coords_ptr,  # (N, 4) int32 out: a copy of coords (COPY: submanifold)
    bits_ptr,  # BITMAP: (words,) int32 output-cell bitmap, all ones = empty; a cleared bit = an output
    out_in_ptr,  # MIRROR: (N, K) int32 out-in table: its upper half (offsets past the centre) set to -1; FILL: all
    n,  # N
    fill_len,  # FILL: out_in entries (all set to -1)
    nbatch,  # BITMAP: samples covered by the bitmap (inputs of later samples are never inputs)
    D,
    H,
    W,  # input grid
    cap_in,
    log_in,  # input table slots (power of two) and log2
    cap_out,
    log_out,  # output table slots and log2 (GEN)
    counters_off,  # workspace index of the counters M - 1, max batch, P - 1 (CSTRIDE apart)
    sink_off,  # workspace index of the sink
    Do,
    Ho,
    Wo,  # output grid (GEN)
    # the geometry is compile-time: fewer launch arguments (host time) and divisions by constants
    Kz: tl.constexpr,
    Ky: tl.constexpr,
    Kx: tl.constexpr,  # kernel sizes
    sz: tl.constexpr,
    sy: tl.constexpr,
    sx: tl.constexpr,  # stride
    pz: tl.constexpr,
    py: tl.constexpr,
    px: tl.constexpr,  # padding
    dz: tl.constexpr,
    dy: tl.constexpr,
    dx: tl.constexpr,  # dilation
    gz: tl.constexpr,
    gy: tl.constexpr,
    gx: tl.constexpr,  # per axis: gcd(d, s)
    qz: tl.constexpr,
    qy: tl.constexpr,
    qx: tl.constexpr,  # s / g
    vz: tl.constexpr,
    vy: tl.constexpr,
    vx: tl.constexpr,  # (d / g)^-1 mod (s / g)
    Jy: tl.constexpr,
    Jx: tl.constexpr,
    J: tl.constexpr,  # candidate offsets enumerated per input: Jz * Jy * Jx = J
    ROW_BASE: tl.constexpr,
    GEN: tl.constexpr,  # generate candidate outputs (regular / transposed conv)
    TRANSPOSED: tl.constexpr,
    COPY: tl.constexpr,
    KEYS32: tl.constexpr,  # also write the int32 keys
    BITMAP: tl.constexpr,  # mark candidate outputs in a dense bitmap (static shapes) instead of the table
    BLOCK_N: tl.constexpr,
    JPAD: tl.constexpr,  # next power of two >= J
    SINK_COPIES: tl.constexpr,
    CSTRIDE: tl.constexpr,  # counter spacing (int64 words)
    TABLE: tl.constexpr,  # insert the inputs into the hash table (off: the lookup reads an input bitmap)
    MIRROR: tl.constexpr,  # submanifold table-only map with a symmetric kernel (see the lookup)
    K: tl.constexpr,  # MIRROR: offsets
    KHPAD: tl.constexpr,  # MIRROR: next power of two > K // 2
    FILL: tl.constexpr = False,  # set out_in to -1 (the static regular map's scatter pass writes its hits later)
):
    pid = tl.program_id(0)
    if FILL:
        nprog = tl.num_programs(0)
        for t0 in range(pid * 1024, fill_len, nprog * 1024):
            t = t0 + tl.arange(0, 1024)
            tl.store(out_in_ptr + t, tl.full([1024], -1, tl.int32), mask=t < fill_len)
    r = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    live = r < n
    b = tl.load(coords_ptr + r * 4 + 0, mask=live, other=-1)
    z = tl.load(coords_ptr + r * 4 + 1, mask=live, other=-1)
    y = tl.load(coords_ptr + r * 4 + 2, mask=live, other=-1)
    x = tl.load(coords_ptr + r * 4 + 3, mask=live, other=-1)
    if COPY:
        tl.store(out_coords_ptr + r * 4 + 0, b, mask=live)
        tl.store(out_coords_ptr + r * 4 + 1, z, mask=live)
        tl.store(out_coords_ptr + r * 4 + 2, y, mask=live)
        tl.store(out_coords_ptr + r * 4 + 3, x, mask=live)
    # out-of-grid voxels are never inserted, so they are never found as inputs
    inside = live & (b >= 0) & (z >= 0) & (z < D) & (y >= 0) & (y < H) & (x >= 0) & (x < W)
    if BITMAP:
        inside = inside & (b < nbatch)
    b64 = b.to(tl.int64)
    key = ((b64 * D + z) * H + y) * W + x
    # atomic_cas has no mask: idle lanes CAS a private, contiguous sink cell (coalesced, no
    # contention) against -2, which no cell ever holds, so they never write
    sink = sink_off + (pid % SINK_COPIES) * (BLOCK_N * JPAD)

    # 1) claim the key's slot (or find the voxel already there), then merge the row: the
    #    lowest row of duplicate voxels wins, whatever order the atomics ran in
    # start at the first slot of the key's 2-slot bucket (one aligned 32-byte sector): lookups
    # read a whole bucket per round, and linear probing keeps every key in or after its bucket
    slot = _slot(key, log_in - 1, cap_in >> 1) * 2
    active = inside
    if not TABLE:  # the lookup reads an input bitmap index: nothing to insert
        active = r < 0
    first = r < 0  # this row claimed the slot: the one row of its voxel that counts pairs
    lane = tl.arange(0, BLOCK_N)
    while tl.max(active.to(tl.int32), axis=0) > 0:
        cell = tl.where(active, slot.to(tl.int64) * 2, sink + lane)
        old = tl.atomic_cas(ws_ptr + cell, tl.where(active, -1, -2).to(tl.int64), key, sem="relaxed")
        claimed = active & (old == -1)
        done = claimed | (active & (old == key))
        first = first | claimed
        tl.atomic_max(ws_ptr + slot.to(tl.int64) * 2 + 1, ROW_BASE - r.to(tl.int64), mask=done, sem="relaxed")
        active = active & ~done
        slot = tl.where(active, (slot + 1) & (cap_in - 1), slot)
    if MIRROR:
        # the lookup writes the upper half of a row only where a neighbour finds it: -1 first
        jh = tl.arange(0, KHPAD)
        up = live[:, None] & (jh < K // 2)[None, :]
        tl.store(out_in_ptr + r[:, None] * K + (K // 2 + 1) + jh[None, :], tl.full(up.shape, -1, tl.int32), mask=up)
        # a voxel held twice (a row that is not the lowest of its voxel) or a row outside the grid
        # breaks the symmetry: the flag counter tells the lookup to probe every offset
        dup = inside & ~first
        bad = tl.max((dup | (live & (b >= 0) & ~inside)).to(tl.int32), axis=0)
        tl.atomic_max(ws_ptr + counters_off + 3 * CSTRIDE, bad.to(tl.int64), mask=bad > 0, sem="relaxed")

    # 2) candidate outputs of every (input, offset), deduplicated in the output table
    if GEN:
        j = tl.arange(0, JPAD)
        jx = j % Jx
        jy = (j // Jx) % Jy
        jz = j // (Jx * Jy)
        cand = inside[:, None] & (j < J)[None, :]
        if TRANSPOSED:
            # every offset reaches one output: o = i * s - p + k * d
            oz = z[:, None] * sz - pz + jz[None, :] * dz
            oy = y[:, None] * sy - py + jy[None, :] * dy
            ox = x[:, None] * sx - px + jx[None, :] * dx
        else:
            cand, oz, oy, ox, _ = _strided_candidates(
                z, y, x, inside, Do, Ho, Wo, Kz, Ky, Kx, sz, sy, sx, pz, py, px, dz, dy, dx, gz, gy, gx, qz, qy, qx,
                vz, vy, vx, Jy, Jx, J, JPAD,
            )  # fmt: skip
        cand = cand & (oz >= 0) & (oz < Do) & (oy >= 0) & (oy < Ho) & (ox >= 0) & (ox < Wo)
        counter_ptr = ws_ptr + counters_off
        if not BITMAP:  # the static form reads neither (its compaction counts P; no sort)
            # one pair per valid (voxel, offset): the pair count P, before any lookup
            num_pairs = tl.sum(tl.sum((cand & first[:, None]).to(tl.int32), axis=1), axis=0)
            tl.atomic_add(counter_ptr + 2 * CSTRIDE, num_pairs.to(tl.int64), mask=num_pairs > 0, sem="relaxed")
            # the largest batch index bounds the output key space: int32 keys sort in half the passes
            tl.atomic_max(counter_ptr + CSTRIDE, tl.max(tl.where(inside, b64, -1), axis=0), sem="relaxed")
        okey = ((b64[:, None] * Do + oz) * Ho + oy) * Wo + ox
        if BITMAP:
            # keys are bit positions: the bitmap's set of cleared bits is the output set, in key order
            bit = (okey & 31).to(tl.int32)
            tl.atomic_and(bits_ptr + (okey >> 5), ~(tl.full(bit.shape, 1, tl.int32) << bit), mask=cand, sem="relaxed")
        else:
            oslot = _slot(okey, log_out, cap_out)
            active2 = cand
            mine = oslot < 0  # (all False) the lanes whose key this program claimed (a lane's key never changes)
            lane2 = tl.arange(0, BLOCK_N)[:, None] * JPAD + j[None, :]
            while _any2d(active2):
                cell = tl.where(active2, 2 * cap_in + oslot, sink + lane2)
                old = tl.atomic_cas(ws_ptr + cell, tl.where(active2, -1, -2).to(tl.int64), okey, sem="relaxed")
                claimed = active2 & (old == -1)
                mine = mine | claimed
                active2 = active2 & ~claimed & (old != okey)
                oslot = tl.where(active2, (oslot + 1) & (cap_out - 1), oslot)
            # one counter atomic per program, after the probing: rank the claimed lanes row-major
            c = mine.to(tl.int32)
            row_tot = tl.sum(c, axis=1)
            rank = (tl.cumsum(row_tot, axis=0) - row_tot)[:, None] + tl.cumsum(c, axis=1) - c
            total = tl.sum(row_tot, axis=0)
            # the counter starts at -1; programs that claim nothing skip the atomic
            start = tl.atomic_add(counter_ptr, total.to(tl.int64), mask=total > 0, sem="relaxed") + 1
            tl.store(out_keys_ptr + start + rank, okey, mask=mine)
            if KEYS32:
                tl.store(out_keys32_ptr + start + rank, okey.to(tl.int32), mask=mine)


@triton.jit
def _kmap_bits_count_kernel(
    bits_ptr,  # (words,) int32 output bitmap (a cleared bit = an output)
    sums_ptr,  # (chunks,) int32 out: outputs per chunk of WORDS words
    words,
    WORDS: tl.constexpr,
):
    pid = tl.program_id(0)
    w = pid * WORDS + tl.arange(0, WORDS)
    v = (~tl.load(bits_ptr + w, mask=w < words, other=-1)).to(tl.int64) & 0xFFFFFFFF
    tl.store(sums_ptr + pid, tl.sum(_popc(v), axis=0).to(tl.int32))


@triton.jit
def _kmap_bits_emit_kernel(
    bits_ptr,  # (words,) int32 output bitmap (a cleared bit = an output)
    sums_ptr,  # (chunks,) int32 outputs per chunk
    keys_ptr,  # (cap,) int64 out: the output keys in ascending order, at [0, M)
    ws_ptr,  # int64 workspace: the counter M - 1 is written at m_off (program 0)
    pre_ptr,  # PREFIX: (words,) int32 out: outputs in the words before each word (a word's first rank)
    m_off,
    words,
    chunks,
    WORDS: tl.constexpr,  # words per program (as in the count pass)
    CELLS: tl.constexpr,  # cells ranked per step
    SUMS: tl.constexpr,  # chunk sums reduced per step
    PREFIX: tl.constexpr,  # also write the per-word prefix (the bitmap index of the outputs)
):
    pid = tl.program_id(0)
    before = tl.zeros([SUMS], dtype=tl.int32)
    total = tl.zeros([SUMS], dtype=tl.int32)
    for c0 in range(0, chunks, SUMS):
        c = c0 + tl.arange(0, SUMS)
        v = tl.load(sums_ptr + c, mask=c < chunks, other=0)
        total += v
        before += tl.where(c < pid, v, 0)
    base = tl.sum(before, axis=0)
    tl.store(ws_ptr + m_off, tl.sum(total, axis=0).to(tl.int64) - 1, mask=pid == 0)
    first_cell = pid.to(tl.int64) * (WORDS * 32)
    bit = tl.arange(0, 32)
    # an empty chunk writes no key (with PREFIX: only its words' prefix, all equal to `base`)
    span = tl.where((tl.load(sums_ptr + pid) > 0) | PREFIX, WORDS, 0)
    for c0 in range(0, span, CELLS // 32):
        # CELLS / 32 words per step, loaded once each and expanded to (word, bit) only where needed
        wl = c0 + tl.arange(0, CELLS // 32)
        word = pid * WORDS + wl  # < 2^26 words (the bitmap has < 2^31 cells)
        v = ~tl.load(bits_ptr + word, mask=word < words, other=-1)
        per_word = _popc(v.to(tl.int64) & 0xFFFFFFFF).to(tl.int32)
        n_step = tl.sum(per_word, axis=0)
        if PREFIX:
            tl.store(pre_ptr + word, base + tl.cumsum(per_word, axis=0) - per_word, mask=word < words)
        if n_step > 0:  # most steps of a sparse grid hold no output
            occ = (v[:, None] >> bit[None, :]) & 1
            rank = base + (tl.cumsum(per_word, axis=0) - per_word)[:, None] + tl.cumsum(occ, axis=1) - occ
            local = wl[:, None] * 32 + bit[None, :]  # int32 inside the chunk
            tl.store(keys_ptr + rank, first_cell + local, mask=occ > 0)
        base += n_step


@triton.jit
def _find_rows(ws_ptr, key, valid, cap_in, log_in, ROW_BASE: tl.constexpr):
    """The input table's row of each 2-D ``key`` (int64), −1 where absent or not ``valid``.
    Probes bucket by bucket (2 slots of (key, row): one aligned 32-byte sector, both keys loaded
    in one round trip) until the key or an empty slot; with inserts only, a key never sits after
    an empty slot of its probe sequence, so a match anywhere in the bucket is it. Only the hits
    (S1 subm: 14 % of the lanes) read their row, once, after the probing."""
    bucket = _slot(key, log_in - 1, cap_in >> 1)
    hit_word = tl.full(key.shape, -1, tl.int32)  # workspace index of the hit's key word
    active = valid
    while _any2d(active):
        cell = bucket * 4
        e0 = tl.load(ws_ptr + cell, mask=active, other=-1)
        e1 = tl.load(ws_ptr + cell + 2, mask=active, other=-1)
        hit0 = active & (e0 == key)
        hit1 = active & (e1 == key)
        hit_word = tl.where(hit0, cell, tl.where(hit1, cell + 2, hit_word))
        active = active & (e0 != -1) & (e1 != -1) & ~hit0 & ~hit1
        bucket = tl.where(active, (bucket + 1) & ((cap_in >> 1) - 1), bucket)
    return ROW_BASE - tl.load(ws_ptr + hit_word + 1, mask=hit_word >= 0, other=ROW_BASE + 1)


@triton.jit
def _decode_keys(keys_ptr, out_coords_ptr, m, rows, live, Do, Ho, Wo):
    """Output rows ``m``'s voxels ``(b, z, y, x)`` (int64) decoded from their keys, also stored
    into ``out_coords`` (``rows``); rows not ``live`` get −1."""
    okey = tl.load(keys_ptr + m, mask=live, other=0).to(tl.int64)
    ox = okey % Wo
    t = okey // Wo
    oy = t % Ho
    t = t // Ho
    oz = t % Do
    b = tl.where(live, t // Do, -1)
    tl.store(out_coords_ptr + m * 4 + 0, b.to(tl.int32), mask=rows)
    tl.store(out_coords_ptr + m * 4 + 1, tl.where(live, oz, -1).to(tl.int32), mask=rows)
    tl.store(out_coords_ptr + m * 4 + 2, tl.where(live, oy, -1).to(tl.int32), mask=rows)
    tl.store(out_coords_ptr + m * 4 + 3, tl.where(live, ox, -1).to(tl.int32), mask=rows)
    return b, oz, oy, ox


@triton.jit
def _lookup_offsets(
    ws_ptr,
    ibits_ptr,
    ipre_ptr,
    in_rows,
    in_cells,
    out_in_ptr,
    m,
    rows,
    live,
    b,
    oz,
    oy,
    ox,
    rk,
    k_live,
    full,
    counts_off,
    group,
    D,
    H,
    W,
    cap_in,
    log_in,
    K: tl.constexpr,
    Ky: tl.constexpr,
    Kx: tl.constexpr,
    sz: tl.constexpr,
    sy: tl.constexpr,
    sx: tl.constexpr,
    pz: tl.constexpr,
    py: tl.constexpr,
    px: tl.constexpr,
    dz: tl.constexpr,
    dy: tl.constexpr,
    dx: tl.constexpr,
    ROW_BASE: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    HALF: tl.constexpr,
    COUNT: tl.constexpr,
    KPAD: tl.constexpr,
    IDX: tl.constexpr,
):
    # one (row, offset) tile of the lookup: offsets `rk` of the rows `m` (see _kmap_lookup_kernel)
    kx = rk % Kx
    ky = (rk // Kx) % Ky
    kz = rk // (Kx * Ky)
    valid = (live & (b >= 0))[:, None] & k_live[None, :]
    if TRANSPOSED:
        # i = (o + p - k * d) / s when it divides (non-negative numerators only)
        nz = oz[:, None] + pz - kz[None, :] * dz
        ny = oy[:, None] + py - ky[None, :] * dy
        nx = ox[:, None] + px - kx[None, :] * dx
        valid = valid & (nz >= 0) & (ny >= 0) & (nx >= 0)
        nz = tl.where(valid, nz, 0)
        ny = tl.where(valid, ny, 0)
        nx = tl.where(valid, nx, 0)
        valid = valid & (nz % sz == 0) & (ny % sy == 0) & (nx % sx == 0)
        iz = nz // sz
        iy = ny // sy
        ix = nx // sx
    else:
        # i = o * s - p + k * d (submanifold: s = 1, p = the centred padding)
        iz = oz[:, None] * sz - pz + kz[None, :] * dz
        iy = oy[:, None] * sy - py + ky[None, :] * dy
        ix = ox[:, None] * sx - px + kx[None, :] * dx
    valid = valid & (iz >= 0) & (iz < D) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    key = ((b[:, None] * D + iz) * H + iy) * W + ix

    if IDX:
        # the inputs are the outputs of a static regular map, rows in key order: an input's row is
        # its rank among the bitmap's cleared bits, the word's prefix plus the cleared bits below
        # it in its word (two independent loads, no probing); rows past `in_rows` were cut
        valid = valid & (key < in_cells)
        word = tl.where(valid, key >> 5, 0)
        occ = (~tl.load(ibits_ptr + word, mask=valid, other=-1)).to(tl.int64) & 0xFFFFFFFF
        bit = key & 31
        has = valid & (((occ >> bit) & 1) != 0)
        rank = tl.load(ipre_ptr + word, mask=has, other=0).to(tl.int64) + _popc(occ & ((1 << bit) - 1))
        found = tl.where(has & (rank < in_rows), rank, -1)
    else:
        found = _find_rows(ws_ptr, key, valid, cap_in, log_in, ROW_BASE)

    out_mask = rows[:, None] & k_live[None, :]
    tl.store(out_in_ptr + m[:, None] * K + rk[None, :], found.to(tl.int32), mask=out_mask)
    if HALF:
        # the mirrored entry: row `found` reaches row m at the opposite offset
        mirror = (found >= 0) & (rk < K // 2)[None, :] & ~full
        tl.store(
            out_in_ptr + found * K + (K - 1 - rk)[None, :], (m[:, None] + rk[None, :] * 0).to(tl.int32), mask=mirror
        )
    if COUNT:
        cnt = tl.sum((found >= 0).to(tl.int64), axis=0)
        tl.atomic_add(ws_ptr + counts_off + group * KPAD + rk, cnt, mask=k_live & (cnt > 0), sem="relaxed")


@triton.jit
def _kmap_lookup_kernel(
    coords_ptr,  # (N, 4) int32 input voxels (submanifold: also the outputs)
    ws_ptr,  # (ws,) int64 workspace: input table (key, ROW_BASE - row) pairs at [0, 2 cap_in); group counts
    keys_ptr,  # (M,) int64 or int32 sorted output keys (FROM_KEYS; DEV_M: at [0, M) of a longer buffer)
    out_coords_ptr,  # (M, 4) int32 out: decoded output voxels (FROM_KEYS); DEV_M: rows past M are -1
    out_in_ptr,  # (M, K) int32 out: input row per (output, offset), -1 for none
    ibits_ptr,  # IDX: (cells / 32,) int32 input bitmap (a cleared bit = an input voxel)
    ipre_ptr,  # IDX: (cells / 32,) int32 inputs before each word (see _kmap_bits_emit_kernel)
    in_rows,  # IDX: input rows kept (an input ranked at or past it is absent)
    in_cells,  # IDX: cells the input bitmap covers
    m_total,  # M (DEV_M: the row capacity)
    counts_off,  # workspace index of the (G, KPAD) group counts (start at -1)
    m_off,  # DEV_M: workspace index of the counter M - 1
    sub,  # blocks per count group
    D,
    H,
    W,  # input grid
    cap_in,
    log_in,
    Do,
    Ho,
    Wo,  # output grid (FROM_KEYS decoding)
    K: tl.constexpr,
    Ky: tl.constexpr,
    Kx: tl.constexpr,  # offsets, kernel sizes (y, x)
    sz: tl.constexpr,
    sy: tl.constexpr,
    sx: tl.constexpr,  # stride
    pz: tl.constexpr,
    py: tl.constexpr,
    px: tl.constexpr,  # padding
    dz: tl.constexpr,
    dy: tl.constexpr,
    dx: tl.constexpr,  # dilation
    ROW_BASE: tl.constexpr,
    FROM_KEYS: tl.constexpr,  # outputs are sorted keys (regular/transposed) or coords (submanifold)
    TRANSPOSED: tl.constexpr,
    DEV_M: tl.constexpr,  # M is read on the device (static shapes): rows [M, m_total) get -1
    BLOCK_M: tl.constexpr,
    KPAD: tl.constexpr,  # lanes per row: K padded (HALF: K // 2 + 1 padded)
    TAIL: tl.constexpr,  # DEV_M: entries set to -1 per step in the rows past M
    HALF: tl.constexpr,  # submanifold, symmetric kernel, table only: probe the offsets up to the centre
    COUNT: tl.constexpr,  # add the hits per offset into the group counts (for the compaction)
    CSTRIDE: tl.constexpr,  # counter spacing (HALF: the flag counter is at m_off + 3 CSTRIDE)
    IDX: tl.constexpr = False,  # inputs found in an input bitmap, not in the hash table
):
    # HALF: offsets k and K - 1 - k are opposite displacements, so when row i finds row j at k,
    # row j finds row i at K - 1 - k, provided every voxel is held once and every row with a batch
    # index is inside the grid (the insert pass raises a flag otherwise). Each row probes the
    # offsets up to the centre and writes the mirrored entry into its neighbour's row, whose upper
    # half the insert pass set to -1: half the probes, and each entry is written by exactly one
    # row (deterministic). With the flag raised, a second pass probes the upper half instead.
    pid = tl.program_id(0)
    if DEV_M:
        # only the blocks holding the M live rows are looked up (a stride over the programs); the
        # rows [M, m_total) are set to -1 by flat strides below
        m_dev = tl.minimum(tl.load(ws_ptr + m_off) + 1, m_total)  # a row capacity may cut M
        live_blocks = tl.cdiv(m_dev, BLOCK_M)
        # `sub` is the group count G here: groups of ceil(live blocks / G) blocks (as the compaction)
        sub_d = tl.maximum((live_blocks + sub - 1) // sub, 1)
        blk_end = live_blocks
        blk_step = tl.num_programs(0)
    else:
        m_dev = m_total
        sub_d = sub
        blk_end = pid + 1
        blk_step = 1
    if HALF:
        full = tl.load(ws_ptr + m_off + 3 * CSTRIDE) >= 0  # the flag: probe every offset
        npass = 1 + full.to(tl.int32)
    else:
        full = False
        npass = 1
    for blk in range(pid, blk_end, blk_step):
        m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = m < m_total  # rows written
        if DEV_M:
            live = m < m_dev
        else:
            live = rows
        if FROM_KEYS:
            b, oz, oy, ox = _decode_keys(keys_ptr, out_coords_ptr, m, rows, live, Do, Ho, Wo)
        else:
            b = tl.load(coords_ptr + m * 4 + 0, mask=live, other=-1).to(tl.int64)
            oz = tl.load(coords_ptr + m * 4 + 1, mask=live, other=0).to(tl.int64)
            oy = tl.load(coords_ptr + m * 4 + 2, mask=live, other=0).to(tl.int64)
            ox = tl.load(coords_ptr + m * 4 + 3, mask=live, other=0).to(tl.int64)
        for ps in range(0, npass):
            if HALF:
                rk = ps * (K // 2 + 1) + tl.arange(0, KPAD)  # pass 0: offsets 0..K/2; pass 1: the rest
                k_live = (tl.arange(0, KPAD) <= K // 2) & (rk < K)
            else:
                rk = tl.arange(0, KPAD)
                k_live = rk < K
            _lookup_offsets(
                ws_ptr,
                ibits_ptr,
                ipre_ptr,
                in_rows,
                in_cells,
                out_in_ptr,
                m,
                rows,
                live,
                b,
                oz,
                oy,
                ox,
                rk,
                k_live,
                full,
                counts_off,
                blk // sub_d,
                D,
                H,
                W,
                cap_in,
                log_in,
                K,
                Ky,
                Kx,
                sz,
                sy,
                sx,
                pz,
                py,
                px,
                dz,
                dy,
                dx,
                ROW_BASE,
                TRANSPOSED,
                HALF,
                COUNT,
                KPAD,
                IDX,
            )
    if DEV_M:
        nprog = tl.num_programs(0)
        for t0 in range(m_dev * K + pid * TAIL, m_total * K, nprog * TAIL):
            t = t0 + tl.arange(0, TAIL)
            tl.store(out_in_ptr + t, tl.full([TAIL], -1, tl.int32), mask=t < m_total * K)
        if FROM_KEYS:
            for t0 in range(m_dev * 4 + pid * TAIL, m_total * 4, nprog * TAIL):
                t = t0 + tl.arange(0, TAIL)
                tl.store(out_coords_ptr + t, tl.full([TAIL], -1, tl.int32), mask=t < m_total * 4)


@triton.jit
def _kmap_scatter_kernel(
    coords_ptr,  # (N, 4) int32 input voxels
    ws_ptr,  # int64 workspace: the input table and the counter M - 1 at m_off
    bits_ptr,  # (words,) int32 output bitmap (a cleared bit = an output)
    pre_ptr,  # (words,) int32 outputs before each word (_kmap_bits_emit_kernel's PREFIX)
    keys_ptr,  # (cap,) int64 output keys in ascending order at [0, M)
    out_coords_ptr,  # (m_total, 4) int32 out: decoded output voxels, -1 past M
    out_in_ptr,  # (m_total, K) int32 out-in table, all -1 on entry
    n,
    nbatch,
    D,
    H,
    W,  # input grid
    cap_in,
    log_in,
    m_off,  # workspace index of the counter M - 1
    m_total,  # output rows kept (a row capacity may cut M)
    Do,
    Ho,
    Wo,  # output grid
    Kz: tl.constexpr,
    Ky: tl.constexpr,
    Kx: tl.constexpr,
    sz: tl.constexpr,
    sy: tl.constexpr,
    sx: tl.constexpr,
    pz: tl.constexpr,
    py: tl.constexpr,
    px: tl.constexpr,
    dz: tl.constexpr,
    dy: tl.constexpr,
    dx: tl.constexpr,
    gz: tl.constexpr,
    gy: tl.constexpr,
    gx: tl.constexpr,
    qz: tl.constexpr,
    qy: tl.constexpr,
    qx: tl.constexpr,
    vz: tl.constexpr,
    vy: tl.constexpr,
    vx: tl.constexpr,
    Jy: tl.constexpr,
    Jx: tl.constexpr,
    J: tl.constexpr,
    K: tl.constexpr,
    ROW_BASE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    JPAD: tl.constexpr,
    TAIL: tl.constexpr,  # output rows decoded per step
):
    # A static regular map's out-in table from the input side: each input finds its own row in the
    # hash table once, enumerates the <= J outputs it reaches (as the insert pass did) and writes
    # its row into theirs at that offset. An output's row is its rank in the output bitmap (word
    # prefix plus the cleared bits below it): no hash probing of K offsets per output. Each
    # (output, offset) has one input voxel, and of duplicate voxels only the row the table holds
    # (the lowest) writes: no atomics, the same table as the lookup pass. (Inputs found in a
    # bitmap index are cheaper to look up per output: that map keeps the lookup pass.)
    pid = tl.program_id(0)
    r = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    live = r < n
    b = tl.load(coords_ptr + r * 4 + 0, mask=live, other=-1)
    z = tl.load(coords_ptr + r * 4 + 1, mask=live, other=-1)
    y = tl.load(coords_ptr + r * 4 + 2, mask=live, other=-1)
    x = tl.load(coords_ptr + r * 4 + 3, mask=live, other=-1)
    inside = live & (b >= 0) & (b < nbatch) & (z >= 0) & (z < D) & (y >= 0) & (y < H) & (x >= 0) & (x < W)
    b64 = b.to(tl.int64)
    # the row the table holds for this voxel: of duplicate voxels only that row (the lowest) writes
    key = ((b64 * D + z) * H + y) * W + x
    held = _find_rows(ws_ptr, key[:, None], inside[:, None], cap_in, log_in, ROW_BASE)
    inside = inside & (tl.sum(held, axis=1) == r)
    cand, oz, oy, ox, k = _strided_candidates(
        z, y, x, inside, Do, Ho, Wo, Kz, Ky, Kx, sz, sy, sx, pz, py, px, dz, dy, dx, gz, gy, gx, qz, qy, qx,
        vz, vy, vx, Jy, Jx, J, JPAD,
    )  # fmt: skip
    okey = ((b64[:, None] * Do + oz) * Ho + oy) * Wo + ox
    word = tl.where(cand, okey >> 5, 0)
    occ = (~tl.load(bits_ptr + word, mask=cand, other=-1)).to(tl.int64) & 0xFFFFFFFF
    bit = okey & 31
    row = tl.load(pre_ptr + word, mask=cand, other=0).to(tl.int64) + _popc(occ & ((1 << bit) - 1))
    tl.store(out_in_ptr + row * K + k, (r[:, None] + k * 0).to(tl.int32), mask=cand & (row < m_total))
    # the output rows' voxels: decoded keys for the M rows, -1 past them
    m_dev = tl.minimum(tl.load(ws_ptr + m_off) + 1, m_total)
    nprog = tl.num_programs(0)
    for t0 in range(pid * TAIL, m_total, nprog * TAIL):
        m = t0 + tl.arange(0, TAIL)
        _decode_keys(keys_ptr, out_coords_ptr, m, m < m_total, m < m_dev, Do, Ho, Wo)


@triton.jit
def _kmap_count_kernel(
    out_in_ptr,  # (M, K) int32
    counts_ptr,  # (G, KPAD) int64 group counts, start at -1: entries >= 0 per offset added per group
    m_total,
    sub,
    K,
    BLOCK_M: tl.constexpr,
    KPAD: tl.constexpr,
):
    pid = tl.program_id(0)
    m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, KPAD)
    mask = (m < m_total)[:, None] & (rk < K)[None, :]
    v = tl.load(out_in_ptr + m[:, None] * K + rk[None, :], mask=mask, other=-1)
    cnt = tl.sum((v >= 0).to(tl.int64), axis=0)
    tl.atomic_add(counts_ptr + (pid // sub) * KPAD + rk, cnt, mask=rk < K, sem="relaxed")


@triton.jit
def _kmap_compact_kernel(
    out_in_ptr,  # (M, K) int32
    counts_ptr,  # int64: at [counts_off, + G * KPAD) hits per (group of `sub` blocks, offset), each from -1
    pair_in_ptr,  # (cap_pairs,) int32 out
    pair_out_ptr,  # (cap_pairs,) int32 out
    offsets_ptr,  # (K + 1,) int32 out (program 0 writes it)
    counts_off,
    m_total,
    K,
    sub,  # blocks of BLOCK_M rows per group (DEV_M: unused, from M on the device)
    num_groups,
    cap_pairs,  # length of the pair arrays (P, or M * K when padded)
    m_off,  # DEV_M: index in counts_ptr of the counter M - 1
    BLOCK_M: tl.constexpr,
    KPAD: tl.constexpr,
    CHUNK: tl.constexpr,  # group rows reduced per step (S1: all at once)
    ROWS: tl.constexpr,  # rows ranked per step: BLOCK_M times a power of two dividing `sub` (S1: 1)
    PAD: tl.constexpr,  # write -1 to the pair entries [P, cap_pairs)
    DEV_M: tl.constexpr,  # M on the device (static shapes): groups split the M rows; needs ROWS == BLOCK_M
    TAIL: tl.constexpr,  # DEV_M: pair entries set to -1 per step
):
    # program = one count group: reduce every group's counts (a few KB) into the per-offset
    # totals and this group's first position per offset, then rank the hits row by row
    pid = tl.program_id(0)
    rk = tl.arange(0, KPAD)
    k_live = rk < K
    total = tl.zeros([KPAD], dtype=tl.int32)
    before = tl.zeros([KPAD], dtype=tl.int32)
    for g0 in range(0, num_groups, CHUNK):
        g = g0 + tl.arange(0, CHUNK)
        g_live = g < num_groups
        c = tl.load(counts_ptr + counts_off + g[:, None] * KPAD + rk[None, :], mask=g_live[:, None], other=-1) + 1
        c = c.to(tl.int32)
        total += tl.sum(c, axis=0)
        before += tl.sum(tl.where((g < pid)[:, None], c, 0), axis=0)
    start = tl.cumsum(total, axis=0) - total  # first pair of each offset
    num_pairs = tl.sum(total, axis=0)
    tl.store(offsets_ptr + rk, start, mask=k_live & (pid == 0))
    tl.store(offsets_ptr + K + rk * 0, start * 0 + num_pairs, mask=(rk == 0) & (pid == 0))
    run = start + before
    m_read = m_total
    if DEV_M:
        # only the first M rows hold hits: this group's share of them, as the lookup counted
        m_read = tl.minimum(tl.load(counts_ptr + m_off).to(tl.int32) + 1, m_total)  # as the lookup cut it
        sub = (tl.cdiv(m_read, BLOCK_M) + num_groups - 1) // num_groups
        # the padded pair entries [P, cap_pairs), shared out by a stride over the programs
        for t0 in range(num_pairs + pid * TAIL, cap_pairs, num_groups * TAIL):
            t = t0 + tl.arange(0, TAIL)
            tl.store(pair_in_ptr + t, tl.full([TAIL], -1, tl.int32), mask=t < cap_pairs)
            tl.store(pair_out_ptr + t, tl.full([TAIL], -1, tl.int32), mask=t < cap_pairs)
    for s in range(0, sub, ROWS // BLOCK_M):
        m = (pid * sub + s) * BLOCK_M + tl.arange(0, ROWS)
        mask = (m < m_total)[:, None] & k_live[None, :]
        v = tl.load(out_in_ptr + m[:, None] * K + rk[None, :], mask=mask & (m < m_read)[:, None], other=-1)
        hit = (v >= 0).to(tl.int32)
        # stable: rank among this tile's hits of the same offset, in output order
        pos = run[None, :] + tl.cumsum(hit, axis=0) - hit
        ok = (hit > 0) & (pos < cap_pairs)
        tl.store(pair_in_ptr + pos, v, mask=ok)
        tl.store(pair_out_ptr + pos, (m[:, None] + rk[None, :] * 0).to(tl.int32), mask=ok)
        run += tl.sum(hit, axis=0)
        if PAD and not DEV_M:
            flat = m[:, None] * K + rk[None, :]
            tail = mask & (flat >= num_pairs) & (flat < cap_pairs)
            tl.store(pair_in_ptr + flat, v * 0 - 1, mask=tail)
            tl.store(pair_out_ptr + flat, v * 0 - 1, mask=tail)
