"""Triton kernels for sparse-convolution kernel maps on a GPU hash table.

Keys: a voxel's linear index ``((b * D + z) * H + y) * W + x`` (int64). Tables: open
addressing with linear probing in power-of-two int64 arrays (input table load ≤ 1/4, output
table ≤ 1/2 of its bound), slot = bits
``[32 - log2(cap), 32)`` of ``(key ^ key >> 29) * 0x7FEB352D`` (multiplicative hashing keeps
neighbouring keys apart). The input table stores *row indices* (claimed with ``atomic_cas``
from −1; the key is re-read from ``coords``), so one int64 fill initialises it; duplicates
keep the lowest row (``atomic_min``), so lookups are deterministic. The output table (regular
and transposed conv) stores candidate output *keys*; each program appends the keys it newly
claimed to a list at a position from one ``atomic_add`` per probe round, and the list is then
sorted (``torch.sort``), which makes the output order deterministic whatever the atomics did
(as int32 when ``(max batch + 1) · D'H'W' < 2^31``, the usual case: half the radix passes).
Candidates are enumerated per input only over the offsets that can divide (per axis
``k = k0 + j * s / gcd(d, s)``: 8 of 27 for 3×3×3 stride 2), and ``atomic_cas`` (which has no
mask) sends idle lanes to a contiguous sink with an impossible compare value, so finished
lanes cost one coalesced, contention-free atomic per round instead of a scattered one.

Launches: submanifold = fill, insert, lookup, scan, [sync P], compact (5); regular/transposed
= fill, insert (inputs + candidates), [sync M], ``torch.sort``, lookup, scan, [sync P],
compact (5 + the sort's). The pairs layout is written from the out-in table: the lookup pass
counts hits per (offset, block), a one-program scan turns the counts into positions, and the
compaction pass ranks hits inside each block (``tl.cumsum``), so pairs within an offset are in
ascending output order with no atomics.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

# (row, offset) lanes per program in the 2-D passes (64 rows × 32 offsets for 3×3×3: 8 lanes
# per thread at 8 warps, few enough int64 temporaries to stay in registers)
_TILE = 2048
# elements per step of the one-program scan over the (offset, block) counts (S1: 3 steps)
_SCAN_BLOCK = 8192
_SCAN_WARPS = 16
_NUM_WARPS = 8
# the hash tables hold at least this many slots
_MIN_CAPACITY = 16
# lanes per program in the insert pass: small, since a tile probes until its slowest lane is done
_INSERT_LANES = 256
# idle lanes of concurrent programs CAS different sink copies
_SINK_COPIES = 16


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
def _row_key(coords_ptr, row, mask, D, H, W):
    # linear key of input rows ``row`` (int64), re-read from coords
    b = tl.load(coords_ptr + row * 4 + 0, mask=mask, other=0).to(tl.int64)
    z = tl.load(coords_ptr + row * 4 + 1, mask=mask, other=0)
    y = tl.load(coords_ptr + row * 4 + 2, mask=mask, other=0)
    x = tl.load(coords_ptr + row * 4 + 3, mask=mask, other=0)
    return ((b * D + z) * H + y) * W + x


@triton.jit
def _kmap_insert_kernel(
    coords_ptr,  # (N, 4) int32 (batch, z, y, x) input voxels
    table_ptr,  # (cap_in + cap_out + 2 + sink,) int64, -1 = empty: input table | output table | counter | max batch | sink
    out_keys_ptr,  # (bound,) int64 out: distinct candidate output keys, unordered (GEN)
    out_keys32_ptr,  # (bound,) int32 out: the same keys truncated (used when the key space fits)
    out_coords_ptr,  # (N, 4) int32 out: a copy of coords (COPY: submanifold)
    n,  # N
    D, H, W,  # input grid
    cap_in, log_in,  # input table slots (power of two) and log2
    cap_out, log_out,  # output table slots and log2 (GEN)
    Do, Ho, Wo,  # output grid (GEN)
    Kz, Ky, Kx,  # kernel sizes
    sz, sy, sx, pz, py, px, dz, dy, dx,  # stride, padding, dilation
    gz, gy, gx, qz, qy, qx, vz, vy, vx,  # per axis: gcd(d, s), s / g, (d / g)^-1 mod (s / g)
    Jy, Jx, J,  # candidate offsets enumerated per input: Jz * Jy * Jx = J
    GEN: tl.constexpr,  # generate candidate outputs (regular / transposed conv)
    TRANSPOSED: tl.constexpr,
    COPY: tl.constexpr,
    BLOCK_N: tl.constexpr,
    JPAD: tl.constexpr,  # next power of two >= J
    SINK_COPIES: tl.constexpr,
):
    pid = tl.program_id(0)
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
    b64 = b.to(tl.int64)
    key = ((b64 * D + z) * H + y) * W + x
    row = r.to(tl.int64)
    # atomic_cas has no mask: idle lanes CAS a private, contiguous sink cell (coalesced, no
    # contention) against -2, which no cell ever holds, so they never write
    sink = cap_in + cap_out + 2 + (pid % SINK_COPIES) * (BLOCK_N * JPAD)

    # 1) insert the row index; the key of an occupied slot is re-read from coords
    slot = _slot(key, log_in, cap_in)
    active = inside
    lane = tl.arange(0, BLOCK_N)
    while tl.max(active.to(tl.int32), axis=0) > 0:
        cell = tl.where(active, slot, sink + lane)
        old = tl.atomic_cas(table_ptr + cell, tl.where(active, -1, -2).to(tl.int64), row)
        occupied = active & (old >= 0)
        same = occupied & (_row_key(coords_ptr, old, occupied, D, H, W) == key)
        # a duplicate voxel: the lowest row wins, whatever order the atomics ran in
        tl.atomic_min(table_ptr + slot, row, mask=same)
        active = occupied & ~same
        slot = tl.where(active, (slot + 1) & (cap_in - 1), slot)

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
            # o * s = i + p - k * d must divide: only k with k * d = i + p (mod s) can, i.e.
            # k = k0 + j * (s / g) with k0 = ((i + p) mod s / g) * inv (mod s / g), when g | (i + p) mod s;
            # enumerating those j (not all K offsets) keeps the lanes (and atomics) few
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
        okey = ((b64[:, None] * Do + oz) * Ho + oy) * Wo + ox
        oslot = _slot(okey, log_out, cap_out)
        active2 = cand
        counter_ptr = table_ptr + cap_in + cap_out
        # the largest batch index bounds the output key space: int32 keys sort in half the passes
        tl.atomic_max(counter_ptr + 1, tl.max(tl.where(inside, b64, -1), axis=0))
        lane2 = tl.arange(0, BLOCK_N)[:, None] * JPAD + j[None, :]
        while _any2d(active2):
            cell = tl.where(active2, cap_in + oslot, sink + lane2)
            old = tl.atomic_cas(table_ptr + cell, tl.where(active2, -1, -2).to(tl.int64), okey)
            claimed = active2 & (old == -1)
            # one atomic per round: rank the claimed lanes in row-major order inside the tile
            c = claimed.to(tl.int32)
            row_tot = tl.sum(c, axis=1)
            rank = (tl.cumsum(row_tot, axis=0) - row_tot)[:, None] + tl.cumsum(c, axis=1) - c
            total = tl.sum(row_tot, axis=0)
            start = tl.atomic_add(counter_ptr, total.to(tl.int64)) + 1  # the counter starts at -1
            tl.store(out_keys_ptr + start + rank, okey, mask=claimed)
            tl.store(out_keys32_ptr + start + rank, okey.to(tl.int32), mask=claimed)
            active2 = active2 & ~claimed & (old != okey)
            oslot = tl.where(active2, (oslot + 1) & (cap_out - 1), oslot)


@triton.jit
def _kmap_lookup_kernel(
    coords_ptr,  # (N, 4) int32 input voxels
    table_ptr,  # (cap_in,) int64 input table: row index or -1
    keys_ptr,  # (M,) int64 or int32 sorted output keys (FROM_KEYS)
    out_coords_ptr,  # (M, 4) int32 out: decoded output voxels (FROM_KEYS)
    out_in_ptr,  # (M, K) int32 out: input row per (output, offset), -1 for none
    counts_ptr,  # (K, nb) int32 out: hits per offset and block of BLOCK_M outputs
    m_total,  # M
    nb,  # number of programs (blocks of outputs)
    D, H, W,  # input grid
    cap_in, log_in,
    Do, Ho, Wo,  # output grid (FROM_KEYS decoding)
    K, Ky, Kx,
    sz, sy, sx, pz, py, px, dz, dy, dx,
    FROM_KEYS: tl.constexpr,  # outputs are sorted keys (regular/transposed) or coords (submanifold)
    TRANSPOSED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    KPAD: tl.constexpr,
):
    pid = tl.program_id(0)
    m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    live = m < m_total
    if FROM_KEYS:
        okey = tl.load(keys_ptr + m, mask=live, other=0).to(tl.int64)
        ox = okey % Wo
        t = okey // Wo
        oy = t % Ho
        t = t // Ho
        oz = t % Do
        b = t // Do
        tl.store(out_coords_ptr + m * 4 + 0, b.to(tl.int32), mask=live)
        tl.store(out_coords_ptr + m * 4 + 1, oz.to(tl.int32), mask=live)
        tl.store(out_coords_ptr + m * 4 + 2, oy.to(tl.int32), mask=live)
        tl.store(out_coords_ptr + m * 4 + 3, ox.to(tl.int32), mask=live)
    else:
        b = tl.load(coords_ptr + m * 4 + 0, mask=live, other=-1).to(tl.int64)
        oz = tl.load(coords_ptr + m * 4 + 1, mask=live, other=0).to(tl.int64)
        oy = tl.load(coords_ptr + m * 4 + 2, mask=live, other=0).to(tl.int64)
        ox = tl.load(coords_ptr + m * 4 + 3, mask=live, other=0).to(tl.int64)
    rk = tl.arange(0, KPAD)
    k_live = rk < K
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

    # probe until the key or an empty slot: the table's rows are re-keyed from coords
    slot = _slot(key, log_in, cap_in)
    found = tl.full((BLOCK_M, KPAD), -1, tl.int64)
    active = valid
    while _any2d(active):
        e = tl.load(table_ptr + slot, mask=active, other=-1)
        occupied = active & (e >= 0)
        hit = occupied & (_row_key(coords_ptr, e, occupied, D, H, W) == key)
        found = tl.where(hit, e, found)
        active = occupied & ~hit
        slot = tl.where(active, (slot + 1) & (cap_in - 1), slot)

    out_mask = live[:, None] & k_live[None, :]
    tl.store(out_in_ptr + m[:, None] * K + rk[None, :], found.to(tl.int32), mask=out_mask)
    cnt = tl.sum((found >= 0).to(tl.int32), axis=0)
    tl.store(counts_ptr + rk * nb + pid, cnt, mask=k_live)


@triton.jit
def _kmap_count_kernel(
    out_in_ptr,  # (M, K) int32
    counts_ptr,  # (K, nb) int32 out: entries >= 0 per offset and block
    m_total, nb, K,
    BLOCK_M: tl.constexpr,
    KPAD: tl.constexpr,
):
    pid = tl.program_id(0)
    m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, KPAD)
    mask = (m < m_total)[:, None] & (rk < K)[None, :]
    v = tl.load(out_in_ptr + m[:, None] * K + rk[None, :], mask=mask, other=-1)
    tl.store(counts_ptr + rk * nb + pid, tl.sum((v >= 0).to(tl.int32), axis=0), mask=rk < K)


@triton.jit
def _kmap_scan_kernel(
    counts_ptr,  # (K * nb,) int32: hits of block b for offset k at [k * nb + b]
    base_ptr,  # (K * nb,) int32 out: first pair position of (k, b) (exclusive scan)
    offsets_ptr,  # (K + 1,) int32 out: first pair of offset k; offsets[K] = P
    nb, K,
    BLOCK: tl.constexpr,
):
    # one program: the (offset, block) order is exactly the pair order, so one running
    # exclusive scan gives every block's first position and every offset's start
    total = nb * K
    carry = tl.zeros([1], dtype=tl.int32)
    for start in range(0, total, BLOCK):
        j = start + tl.arange(0, BLOCK)
        live = j < total
        c = tl.load(counts_ptr + j, mask=live, other=0)
        excl = tl.cumsum(c, axis=0) - c + carry
        tl.store(base_ptr + j, excl, mask=live)
        k = j // nb
        tl.store(offsets_ptr + k, excl, mask=live & (j - k * nb == 0))
        carry += tl.sum(c, axis=0)
    tl.store(offsets_ptr + K, tl.sum(carry, axis=0))


@triton.jit
def _kmap_compact_kernel(
    out_in_ptr,  # (M, K) int32
    base_ptr,  # (K * nb,) int32 first pair position of (offset, block)
    pair_in_ptr,  # (P,) int32 out
    pair_out_ptr,  # (P,) int32 out
    m_total, nb, K,
    BLOCK_M: tl.constexpr,
    KPAD: tl.constexpr,
):
    pid = tl.program_id(0)
    m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, KPAD)
    k_live = rk < K
    mask = (m < m_total)[:, None] & k_live[None, :]
    v = tl.load(out_in_ptr + m[:, None] * K + rk[None, :], mask=mask, other=-1)
    hit = (v >= 0).to(tl.int32)
    # stable: rank among this block's hits of the same offset, in output order
    rank = tl.cumsum(hit, axis=0) - hit
    base = tl.load(base_ptr + rk * nb + pid, mask=k_live, other=0)
    pos = base[None, :] + rank
    tl.store(pair_in_ptr + pos, v, mask=hit > 0)
    tl.store(pair_out_ptr + pos, (m[:, None] + rk[None, :] * 0).to(tl.int32), mask=hit > 0)


# --- launchers ------------------------------------------------------------------------------


def _tile(num_k: int) -> tuple[int, int]:
    """``(rows per program, padded offsets)`` for the 2-D passes."""
    kpad = max(2, triton.next_power_of_2(num_k))
    return max(2, _TILE // kpad), kpad


def _capacity(count: int, slack: int = 2) -> tuple[int, int]:
    """Power-of-two table size ≥ slack × count (load ≤ 1/slack) and its log2."""
    cap = max(_MIN_CAPACITY, triton.next_power_of_2(slack * max(1, count)))
    return cap, cap.bit_length() - 1


@functools.lru_cache(maxsize=256)
def _axis_enumeration(kernel_size: tuple, stride: tuple, dilation: tuple, transposed: bool):
    """Per axis ``(g, q, inv, J)``: the offsets ``k`` with ``k * d = r (mod s)`` are
    ``k0 + j * q`` (``q = s / g``, ``g = gcd(d, s)``, ``k0 = (r / g) * inv mod q``, needs
    ``g | r``), at most ``J = ceil(K / q)`` of them; transposed: all ``K`` (``q = 1``)."""
    axes = []
    for k, s, d in zip(kernel_size, stride, dilation):
        if transposed:
            axes.append((1, 1, 0, k))
            continue
        g = math.gcd(d, s)
        q = s // g
        inv = pow(d // g, -1, q) if q > 1 else 0
        axes.append((g, q, inv, -(-k // q)))
    return axes


def max_outputs_per_input(kernel_size, stride, dilation, transposed: bool) -> int:
    """How many distinct outputs one input voxel can reach (bounds the output table)."""
    return math.prod(a[3] for a in _axis_enumeration(tuple(kernel_size), tuple(stride), tuple(dilation), transposed))


def _pairs(out_in: torch.Tensor, counts: torch.Tensor, nb: int, block_m: int, kpad: int):
    """Scan + compaction from the out-in table and its per-(offset, block) counts; syncs once for P."""
    num_out, num_k = out_in.shape
    dev = out_in.device
    offsets = torch.empty(num_k + 1, dtype=torch.int32, device=dev)
    base = torch.empty(num_k * nb, dtype=torch.int32, device=dev)
    _kmap_scan_kernel[(1,)](counts, base, offsets, nb, num_k, BLOCK=_SCAN_BLOCK, num_warps=_SCAN_WARPS)
    num_pairs = int(offsets[num_k])  # host sync: the pair count is an output size
    pair_in = torch.empty(num_pairs, dtype=torch.int32, device=dev)
    pair_out = torch.empty(num_pairs, dtype=torch.int32, device=dev)
    if num_pairs:
        _kmap_compact_kernel[(nb,)](
            out_in, base, pair_in, pair_out, num_out, nb, num_k, BLOCK_M=block_m, KPAD=kpad, num_warps=_NUM_WARPS
        )
    return pair_in, pair_out, offsets


def pairs_from_table(out_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs layout of an out-in table.

    Args:
        out_in: ``(M, K)`` int32 contiguous, −1 for no input.
    Returns:
        ``pair_in, pair_out (P,)`` int32 grouped by offset, ascending output within an offset,
        and ``offsets (K+1,)`` int32. 3 launches (count, scan, compact), one host sync (P).
    """
    num_out, num_k = out_in.shape
    dev = out_in.device
    if num_out == 0:
        empty = torch.empty(0, dtype=torch.int32, device=dev)
        return empty, empty.clone(), torch.zeros(num_k + 1, dtype=torch.int32, device=dev)
    block_m, kpad = _tile(num_k)
    nb = triton.cdiv(num_out, block_m)
    counts = torch.empty(num_k * nb, dtype=torch.int32, device=dev)
    _kmap_count_kernel[(nb,)](out_in, counts, num_out, nb, num_k, BLOCK_M=block_m, KPAD=kpad, num_warps=_NUM_WARPS)
    return _pairs(out_in, counts, nb, block_m, kpad)


def sparse_conv_kernel_map(
    coords: torch.Tensor,
    in_shape,
    out_shape,
    kernel_size,
    stride,
    padding,
    dilation,
    subm: bool,
    transposed: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel map on the GPU (or on CPU tensors under the Triton interpreter).

    Args:
        coords: ``(N, 4)`` int32 contiguous ``(batch, z, y, x)``; out-of-grid rows are never
            inputs; duplicates: the lowest row is the input found.
        in_shape, out_shape: ``(D, H, W)`` grids; kernel_size, stride, padding, dilation: 3-lists
            (submanifold: stride 1 and the centred padding, as the public function passes).
    Returns:
        ``(out_coords (M, 4), pair_in (P,), pair_out (P,), offsets (K+1,), out_in (M, K))``, all
        int32, equal to ``reference.kernel_map.sparse_conv_kernel_map``. Host syncs: M
        (regular/transposed) and P.
    """
    dev = coords.device
    n = coords.shape[0]
    num_k = math.prod(kernel_size)
    D, H, W = in_shape
    Do, Ho, Wo = out_shape
    kz_, ky_, kx_ = kernel_size
    geometry = (num_k, ky_, kx_, *stride, *padding, *dilation)
    block, kpad = _tile(num_k)
    if n == 0:
        empty = torch.empty(0, dtype=torch.int32, device=dev)
        return (torch.empty((0, 4), dtype=torch.int32, device=dev), empty, empty.clone(),
                torch.zeros(num_k + 1, dtype=torch.int32, device=dev),
                torch.empty((0, num_k), dtype=torch.int32, device=dev))
    # load ≤ 1/4: a lookup tile probes until its slowest lane stops, so short probe tails matter
    cap_in, log_in = _capacity(n, 4)
    axes = _axis_enumeration(tuple(kernel_size), tuple(stride), tuple(dilation), transposed)
    if subm:
        bound, cap_out, log_out, jpad = 0, 0, 0, 1
        block_n = _INSERT_LANES
    else:
        bound = n * math.prod(a[3] for a in axes)
        cap_out, log_out = _capacity(bound)
        jpad = triton.next_power_of_2(math.prod(a[3] for a in axes))
        block_n = max(2, _INSERT_LANES // jpad)
    sink = _SINK_COPIES * block_n * jpad
    if cap_in + cap_out + 2 + sink >= 2**31:
        raise ValueError(f"coords: {n} voxels need hash tables of {cap_in + cap_out} slots (limit 2^31)")
    table = torch.full((cap_in + cap_out + 2 + sink,), -1, dtype=torch.int64, device=dev)  # launch 1
    out_keys = torch.empty(bound, dtype=torch.int64, device=dev)
    out_keys32 = torch.empty(bound, dtype=torch.int32, device=dev)
    out_coords = torch.empty((n, 4) if subm else (0, 4), dtype=torch.int32, device=dev)
    enum_args = [a[0] for a in axes] + [a[1] for a in axes] + [a[2] for a in axes] + [
        axes[1][3], axes[2][3], math.prod(a[3] for a in axes)]
    _kmap_insert_kernel[(triton.cdiv(n, block_n),)](  # launch 2
        coords, table, out_keys, out_keys32, out_coords, n, D, H, W, cap_in, log_in, max(cap_out, 1), log_out,
        Do, Ho, Wo, *kernel_size, *stride, *padding, *dilation, *enum_args,
        GEN=not subm, TRANSPOSED=transposed, COPY=subm, BLOCK_N=block_n, JPAD=jpad, SINK_COPIES=_SINK_COPIES,
        num_warps=4,
    )
    if subm:
        num_out, keys = n, out_keys
    else:
        # host sync: the output count is an output size (read with the largest batch index)
        last, max_batch = table[cap_in + cap_out : cap_in + cap_out + 2].tolist()
        num_out = last + 1
        # linear keys sort lexicographically by (b, z, y, x); int32 keys when they fit (half the radix passes)
        fits32 = (max_batch + 1) * Do * Ho * Wo < 2**31
        keys = torch.sort((out_keys32 if fits32 else out_keys)[:num_out]).values
        out_coords = torch.empty((num_out, 4), dtype=torch.int32, device=dev)
    out_in = torch.empty((num_out, num_k), dtype=torch.int32, device=dev)
    if num_out == 0:
        empty = torch.empty(0, dtype=torch.int32, device=dev)
        return out_coords, empty, empty.clone(), torch.zeros(num_k + 1, dtype=torch.int32, device=dev), out_in
    nb = triton.cdiv(num_out, block)
    counts = torch.empty(num_k * nb, dtype=torch.int32, device=dev)
    _kmap_lookup_kernel[(nb,)](  # launch 3
        coords, table, keys, out_coords, out_in, counts, num_out, nb, D, H, W, cap_in, log_in,
        Do, Ho, Wo, *geometry,
        FROM_KEYS=not subm, TRANSPOSED=transposed, BLOCK_M=block, KPAD=kpad, num_warps=_NUM_WARPS,
    )
    pair_in, pair_out, offsets = _pairs(out_in, counts, nb, block, kpad)  # launches 4, 5
    return out_coords, pair_in, pair_out, offsets, out_in
