"""Hard and dynamic voxelization on the CPU: one pass with a hash map (numba).

Three phases, each one pass over the points:

1. cells (parallel over points): the range test and the cell ``floor((p - range_min) /
   voxel_size)`` in float32, operation for operation as the reference
   (``pcops.reference.voxelize.voxel_coords``): ``p`` converted to float32, ``range_min <= p <
   range_max``, ``q = (p - range_min) / voxel_size`` (float32 subtraction, IEEE division) and
   ``q < grid``; NaN/inf fail a comparison. Each in-range point gets its packed cell key
   ``(z * gy + y) * gx + x``, the others −1.
2. numbering (one thread, in point order, sample by sample): an open-addressing hash table
   (linear probing, Fibonacci hashing of the key ``b * cells + cell``, grown ×2 at load 1/2, so
   it stays the size of the occupied voxels) gives each voxel its row the first time one of its
   points is met: voxels are numbered in first-point order, the first ``max_voxels`` of each
   sample are kept (row −1 marks a dropped voxel), and a point of a kept voxel takes the next
   free slot (its rank) while fewer than ``max_points_per_voxel`` are stored. Consecutive points
   of a LiDAR scan often share a voxel: the last key is checked before the table. First come,
   first served is then the point order itself, so the output is the reference's whatever the
   thread count.
3. copy (parallel over points, then over voxels): each stored point's ``C`` channels are copied
   as raw bits (any float dtype, NaN payloads included) to ``voxels[row, rank]``, and every
   slot past a voxel's count is zeroed.

Working memory is O(N): the keys, the ranks and a table of at most ``2 * 2 * voxels`` entries.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from ..reference.voxelize import grid_size
from . import keeps_torch_threads, num_threads

__all__ = ["voxelize", "dynamic_voxelize"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # float dtype → same-size int
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing
# Clouds of at least this many points run phases 1 and 3 in parallel (when torch allows more than
# one thread): below it waking and joining the pool costs more than it saves (benchmarks/NOTES.md).
PARALLEL_MIN_POINTS = 1 << 18


@njit(cache=True, nogil=True, inline="always")
def _cell_key(xyz, i, lo, hi, vs, grid, gx, gy):
    """Packed cell of point ``i`` or −1 out of range (the reference's float32 arithmetic)."""
    x, y, z = xyz[i, 0], xyz[i, 1], xyz[i, 2]
    if not ((x >= lo[0]) & (x < hi[0]) & (y >= lo[1]) & (y < hi[1]) & (z >= lo[2]) & (z < hi[2])):
        return np.int64(-1)
    qx = (x - lo[0]) / vs[0]
    qy = (y - lo[1]) / vs[1]
    qz = (z - lo[2]) / vs[2]
    if not ((qx < grid[0]) & (qy < grid[1]) & (qz < grid[2])):
        return np.int64(-1)
    return np.int64(qx) + (np.int64(qy) + np.int64(qz) * gy) * gx  # q >= 0: truncation is floor


@njit(cache=True, nogil=True, parallel=True)
def _keys_parallel(xyz, lo, hi, vs, grid, gx, gy, keys):
    for i in prange(keys.shape[0]):
        keys[i] = _cell_key(xyz, i, lo, hi, vs, grid, gx, gy)


@njit(cache=True, nogil=True)
def _keys_serial(xyz, lo, hi, vs, grid, gx, gy, keys):
    for i in range(keys.shape[0]):
        keys[i] = _cell_key(xyz, i, lo, hi, vs, grid, gx, gy)


@njit(cache=True, nogil=True, inline="always")
def _slot(key, bits):
    """Fibonacci hashing: the top ``bits`` bits of ``key * 2^64 / golden ratio``."""
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(64 - bits))


@njit(cache=True, nogil=True)
def _fill(keys, i, end, base, max_voxels, max_points, p2v, rank, vkey, vcount, tkey, trow, bits, state, stat):
    """Points ``i:end`` of one sample (key offset ``base``) until the end or until the table is half
    full; returns where it stopped. ``state = (rows, table entries)``, ``stat`` the sample's
    ``(occupied voxels, in-range points, stored points)``. (The table is grown by the caller: an
    array reassigned inside this loop would cost numba reference counting on every point.)"""
    mask = (1 << bits) - 1
    rows, used = state[0], state[1]
    occupied, in_range, stored = stat[0], stat[1], stat[2]
    last = np.int64(-1)
    row = -1
    while i < end:
        k = keys[i]
        if k >= 0:
            in_range += 1
            k += base
            if k != last:
                h = _slot(k, bits)
                while tkey[h] != k and tkey[h] != -1:
                    h = (h + 1) & mask
                if tkey[h] == k:
                    row = trow[h]
                else:  # a new voxel: kept while the sample has fewer than max_voxels
                    row = -1
                    if occupied < max_voxels:
                        row = rows
                        vkey[rows] = k
                        vcount[rows] = 0
                        rows += 1
                    occupied += 1
                    tkey[h] = k
                    trow[h] = row
                    used += 1
                last = k
            if row >= 0:
                c = vcount[row]
                if c < max_points:
                    p2v[i] = row
                    rank[i] = c
                    vcount[row] = c + 1
                    stored += 1
        i += 1
        if 2 * used > mask + 1:
            break
    state[0], state[1] = rows, used
    stat[0], stat[1], stat[2] = occupied, in_range, stored
    return i


@njit(cache=True, nogil=True)
def _grow(tkey, trow, bits):
    """The table rehashed into ``2 ** bits`` entries."""
    mask = (1 << bits) - 1
    nkey = np.full(mask + 1, -1, np.int64)
    nrow = np.empty(mask + 1, np.int32)
    for j in range(tkey.shape[0]):
        k = tkey[j]
        if k != -1:
            g = _slot(k, bits)
            while nkey[g] != -1:
                g = (g + 1) & mask
            nkey[g] = k
            nrow[g] = trow[j]
    return nkey, nrow


@njit(cache=True, nogil=True)
def _number(keys, starts, ends, cells, max_voxels, max_points, p2v, rank, vkey, vcount, stats):
    """Phase 2, in point order. ``max_voxels`` / ``max_points``: the caps (dynamic: above ``N``).

    Writes ``p2v`` (row or −1; must come in as −1), ``rank`` (slot in the row, stored points),
    per row its key ``vkey`` (``b * cells + cell``) and stored count ``vcount``, and per sample
    ``stats[b] = (occupied voxels, in-range points, stored points)``. Returns the row count."""
    bits = 10
    while (1 << bits) < 4 * min(keys.shape[0], 4096):
        bits += 1
    tkey = np.full(1 << bits, -1, np.int64)
    trow = np.empty(1 << bits, np.int32)
    state = np.zeros(2, np.int64)
    for b in range(starts.shape[0]):
        i = starts[b]
        while True:
            i = _fill(
                keys,
                i,
                ends[b],
                b * cells,
                max_voxels,
                max_points,
                p2v,
                rank,
                vkey,
                vcount,
                tkey,
                trow,
                bits,
                state,
                stats[b],
            )
            if 2 * state[1] > (1 << bits):
                bits += 1
                tkey, trow = _grow(tkey, trow, bits)
            if i >= ends[b]:
                break
    return state[0]


@njit(cache=True, nogil=True)
def _coords(vkey, rows, total, cells, gx, gy, gz, coords):
    """``coords[:rows]`` = ``(b, z, y, x)`` decoded from the keys, ``coords[rows:total]`` = −1."""
    for r in range(rows):
        k = vkey[r]
        b = k // cells
        c = k - b * cells
        coords[r, 3] = c % gx
        c //= gx
        coords[r, 2] = c % gy
        coords[r, 1] = c // gy
        coords[r, 0] = b
    for r in range(rows, total):
        for a in range(4):
            coords[r, a] = -1


@njit(cache=True, nogil=True, parallel=True)
def _copy_parallel(src, p2v, rank, counts, out):
    """``out (rows, P, C)`` bits: each stored point to its slot, zeros past each row's count."""
    channels = src.shape[1]
    for i in prange(src.shape[0]):
        r = p2v[i]
        if r >= 0:
            for c in range(channels):
                out[r, rank[i], c] = src[i, c]
    flat = out.reshape(out.shape[0], -1)
    for r in prange(out.shape[0]):
        flat[r, counts[r] * channels :] = 0


@njit(cache=True, nogil=True)
def _copy_serial(src, p2v, rank, counts, out):
    channels = src.shape[1]
    for i in range(src.shape[0]):
        r = p2v[i]
        if r >= 0:
            for c in range(channels):
                out[r, rank[i], c] = src[i, c]
    flat = out.reshape(out.shape[0], -1)
    for r in range(out.shape[0]):
        flat[r, counts[r] * channels :] = 0


def _setup(points, lengths, voxel_size, point_cloud_range):
    """Phase 1 and the arguments of phase 2: ``(keys, starts, ends, cells, (gx, gy, gz), threads)``."""
    n = points.shape[0]
    gx, gy, gz = grid_size(voxel_size, point_cloud_range)
    if lengths is None:
        starts = np.zeros(1, np.int64)
        ends = np.full(1, n, np.int64)
    else:  # as reference.sample_ids: runs of max(length, 0) points, cut at N
        cum = torch.cumsum(lengths.to(torch.int64).clamp_min(0), 0)
        ends = cum.clamp(max=n).numpy()
        starts = np.concatenate([np.zeros(1, np.int64), ends[:-1]])
    f32 = np.float32
    lo = np.array(point_cloud_range[:3], f32)
    hi = np.array(point_cloud_range[3:], f32)
    vs = np.array(voxel_size, f32)
    grid = np.array([gx, gy, gz], f32)
    xyz = points if points.dtype == torch.float32 else points[:, :3].to(torch.float32)
    xyz = xyz.contiguous().numpy()
    keys = np.empty(n, np.int64)
    threads = min(num_threads(), numba.config.NUMBA_NUM_THREADS)
    if threads > 1 and n >= PARALLEL_MIN_POINTS:
        numba.set_num_threads(threads)
        _keys_parallel(xyz, lo, hi, vs, grid, gx, gy, keys)
    else:
        threads = 1
        _keys_serial(xyz, lo, hi, vs, grid, gx, gy, keys)
    return keys, starts, ends, gx * gy * gz, (gx, gy, gz), threads


def _stats(stats, max_voxels=None):
    occupied = torch.from_numpy(stats[:, 0].copy())
    if max_voxels is None:
        return occupied
    kept = occupied.clamp(max=max_voxels)
    return kept, torch.from_numpy(stats[:, 1] - stats[:, 2]), occupied - kept


@keeps_torch_threads
def voxelize(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max):
    """``pcops.reference.voxelize.voxelize``, bit for bit, in one hash-map pass.

    ``points (N, C)`` any float dtype on the CPU. Returns ``(voxels, coords, num_points,
    point_to_voxel, num_voxels, num_dropped_points, num_dropped_voxels)``.
    """
    n, channels = points.shape
    keys, starts, ends, cells, (gx, gy, gz), threads = _setup(points, lengths, voxel_size, point_cloud_range)
    batch = starts.shape[0]
    cap_rows = min(n, batch * max_voxels)
    point_to_voxel = torch.full((n,), -1, dtype=torch.int64)
    rank = np.empty(n, np.int32)
    vkey = np.empty(cap_rows, np.int64)
    vcount = np.zeros(max(cap_rows, batch * max_voxels if pad_to_max else 0), np.int32)
    stats = np.zeros((batch, 3), np.int64)
    p2v = point_to_voxel.numpy()
    rows = _number(keys, starts, ends, cells, max_voxels, max_points_per_voxel, p2v, rank, vkey, vcount, stats)
    total = batch * max_voxels if pad_to_max else rows
    coords = torch.empty((total, 4), dtype=torch.int32)
    _coords(vkey, rows, total, cells, gx, gy, gz, coords.numpy())
    num_points = torch.from_numpy(vcount[:total].copy())
    voxels = torch.empty((total, max_points_per_voxel, channels), dtype=points.dtype)
    bits = _BITS[points.element_size()]
    args = (points.view(bits).numpy(), p2v, rank, vcount, voxels.view(bits).numpy())
    if threads > 1:
        numba.set_num_threads(threads)
        _copy_parallel(*args)
    else:
        _copy_serial(*args)
    num_voxels, dropped_points, dropped_voxels = _stats(stats, max_voxels)
    return voxels, coords, num_points, point_to_voxel, num_voxels, dropped_points, dropped_voxels


@keeps_torch_threads
def dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max):
    """``pcops.reference.voxelize.dynamic_voxelize``, bit for bit: ``(point_to_voxel (N,) int64,
    coords (M or N, 4) int32, num_voxels (B,) int64)``."""
    n = points.shape[0]
    keys, starts, ends, cells, (gx, gy, gz), _ = _setup(points, lengths, voxel_size, point_cloud_range)
    batch = starts.shape[0]
    point_to_voxel = torch.full((n,), -1, dtype=torch.int64)
    rank = np.empty(n, np.int32)
    vkey = np.empty(n, np.int64)
    vcount = np.empty(n, np.int32)
    stats = np.zeros((batch, 3), np.int64)
    big = n + 1  # no caps
    rows = _number(keys, starts, ends, cells, big, big, point_to_voxel.numpy(), rank, vkey, vcount, stats)
    total = n if pad_to_max else rows
    coords = torch.empty((total, 4), dtype=torch.int32)
    _coords(vkey, rows, total, cells, gx, gy, gz, coords.numpy())
    return point_to_voxel, coords, _stats(stats)
