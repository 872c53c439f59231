"""Farthest point sampling on the CPU: bucket FPS over a KD-tree (numba).

Algorithm (QuickFPS, Han et al., "QuickFPS: Architecture and Algorithm Co-Design for Farthest
Point Sampling in Large-Scale Point Clouds", IEEE TCAD 2023; the bucket FPS of the fpsample
library): the valid points of a cloud are split by median cuts along the widest axis into a
balanced KD-tree whose leaves ("buckets") hold ``LEAF`` points or fewer. Every node keeps its
points' bounding box and the largest running distance below it with that point's index. A step
with new sample ``c`` descends only into nodes whose box can be nearer to ``c`` than their
largest running distance (no other point's distance can shrink), updates those buckets' points,
and recomputes the maxima on the way back, so the next sample is read off the root.

Exactness: the box bound ``(gx*gx + gy*gy) + gz*gz`` with ``gx = max(lo - cx, cx - hi, 0)`` is
computed in the same float32 operations as the distances, and rounding is monotone, so it is
never above any computed distance of the box's points: a skipped node holds no point whose
distance would have changed. The running distances are therefore the reference's, bit for bit,
and ties resolve to the lowest original index (buckets keep their points in index order, nodes
compare (distance, index)). Clouds with a non-finite coordinate (padding included, as the
reference touches padding) run a brute-force replica of the reference, NaN propagation included.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from . import keeps_torch_threads, num_threads

__all__ = ["farthest_point_sample", "LEAF"]

LEAF = 64  # bucket size: small enough that a step touches few points, large enough to amortise the tree
_F32 = np.float32


@njit(cache=True, nogil=True)
def _select(pts, idx, lo, hi, k, axis):
    """Reorder rows ``lo:hi`` of ``pts (n, 3)`` and ``idx (n,)`` so that row ``k`` holds the k-th
    smallest ``pts[:, axis]``, none left of it larger and none right of it smaller (Hoare
    quickselect, median-of-three pivot)."""
    while hi - lo > 1:
        a, b, c = pts[lo, axis], pts[(lo + hi) // 2, axis], pts[hi - 1, axis]
        pivot = max(min(a, b), min(max(a, b), c))
        i, j = lo, hi - 1
        while i <= j:
            while pts[i, axis] < pivot:
                i += 1
            while pts[j, axis] > pivot:
                j -= 1
            if i <= j:
                for t in range(3):
                    v = pts[i, t]
                    pts[i, t] = pts[j, t]
                    pts[j, t] = v
                t = idx[i]
                idx[i] = idx[j]
                idx[j] = t
                i += 1
                j -= 1
        # [lo, j] <= pivot <= [i, hi): continue on the side that holds k
        if k <= j:
            hi = j + 1
        elif k >= i:
            lo = i
        else:
            return


@njit(cache=True, nogil=True)
def _build(xyz, n):
    """Balanced KD-tree of ``xyz[:n]`` in heap order (children of node i: 2i+1, 2i+2), ``depth``
    levels of cuts, ``2**depth`` buckets of at most ``LEAF`` points.

    Returns ``(px, py, pz, pid, begin, end, depth)``: the coordinates reordered so that node i is
    the row range ``begin[i]:end[i]``, and each row's original index ``pid``. Each node is cut at
    its middle row along the axis where its points spread most (quickselect).
    """
    depth = 0
    while (n >> depth) > LEAF:
        depth += 1
    first_leaf = (1 << depth) - 1
    n_nodes = (2 << depth) - 1
    begin = np.empty(n_nodes, np.int32)
    end = np.empty(n_nodes, np.int32)
    pts = xyz[:n].copy()
    pid = np.arange(n).astype(np.int32)
    begin[0] = 0
    end[0] = n
    for node in range(first_leaf):
        lo, hi = begin[node], end[node]
        mn0, mn1, mn2 = pts[lo, 0], pts[lo, 1], pts[lo, 2]
        mx0, mx1, mx2 = mn0, mn1, mn2
        for j in range(lo + 1, hi):
            mn0 = min(mn0, pts[j, 0])
            mn1 = min(mn1, pts[j, 1])
            mn2 = min(mn2, pts[j, 2])
            mx0 = max(mx0, pts[j, 0])
            mx1 = max(mx1, pts[j, 1])
            mx2 = max(mx2, pts[j, 2])
        axis = 0
        ext = mx0 - mn0
        if mx1 - mn1 > ext:
            axis = 1
            ext = mx1 - mn1
        if mx2 - mn2 > ext:
            axis = 2
        mid = lo + (hi - lo) // 2
        _select(pts, pid, lo, hi, mid, axis)
        begin[2 * node + 1] = lo
        end[2 * node + 1] = mid
        begin[2 * node + 2] = mid
        end[2 * node + 2] = hi
    return pts[:, 0].copy(), pts[:, 1].copy(), pts[:, 2].copy(), pid, begin, end, depth


@njit(cache=True, nogil=True)
def _fps_tree(xyz, n, start, m, out):
    """Bucket FPS of one cloud: ``xyz (≥n, 3)`` float32 finite, ``n ≥ 1`` valid points, ``start`` in
    ``[0, n)``; writes ``min(m, n)`` indices into ``out``."""
    px, py, pz, perm, begin, end, depth = _build(xyz, n)
    first_leaf = (1 << depth) - 1
    n_nodes = (2 << depth) - 1
    md = np.full(n, np.inf, np.float32)
    pos = np.empty(n, np.int32)
    for j in range(n):
        pos[perm[j]] = j
    box = np.empty((n_nodes, 6), np.float32)  # lo x, y, z, hi x, y, z
    best = np.empty(n_nodes, np.float32)  # largest running distance below the node
    arg = np.empty(n_nodes, np.int32)  # its lowest original index
    for leaf in range(first_leaf, n_nodes):
        lo, hi = begin[leaf], end[leaf]
        box[leaf, 0] = px[lo:hi].min()
        box[leaf, 1] = py[lo:hi].min()
        box[leaf, 2] = pz[lo:hi].min()
        box[leaf, 3] = px[lo:hi].max()
        box[leaf, 4] = py[lo:hi].max()
        box[leaf, 5] = pz[lo:hi].max()
        best[leaf] = np.inf
        arg[leaf] = perm[lo:hi].min()
    for node in range(first_leaf - 1, -1, -1):
        left, right = 2 * node + 1, 2 * node + 2
        for a in range(3):
            box[node, a] = min(box[left, a], box[right, a])
            box[node, 3 + a] = max(box[left, 3 + a], box[right, 3 + a])
        best[node] = max(best[left], best[right])
        arg[node] = min(arg[left], arg[right])

    zero = _F32(0.0)
    stack = np.empty(depth + 2, np.int32)
    visited = np.empty(n_nodes, np.int32)
    sel = start
    out[0] = sel
    for s in range(1, min(m, n)):
        cx, cy, cz = xyz[sel, 0], xyz[sel, 1], xyz[sel, 2]
        md[pos[sel]] = -1.0  # a chosen point is never chosen again
        # descend: a node whose box is farther than its largest distance keeps all its distances
        # (its bound is not above any of them); the chosen point's path has bound 0 ≤ its maximum
        top = 0
        stack[0] = 0
        n_visited = 0
        while top >= 0:
            node = stack[top]
            top -= 1
            gx = max(box[node, 0] - cx, cx - box[node, 3], zero)
            gy = max(box[node, 1] - cy, cy - box[node, 4], zero)
            gz = max(box[node, 2] - cz, cz - box[node, 5], zero)
            if gx * gx + gy * gy + gz * gz > best[node]:
                continue
            if node < first_leaf:
                visited[n_visited] = node
                n_visited += 1
                stack[top + 1] = 2 * node + 2
                stack[top + 2] = 2 * node + 1
                top += 2
                continue
            lo, hi = begin[node], end[node]
            for j in range(lo, hi):
                dx = px[j] - cx
                dy = py[j] - cy
                dz = pz[j] - cz
                d = dx * dx + dy * dy + dz * dz
                md[j] = min(md[j], d)
            # the bucket's maximum, then its lowest original index (buckets are not in index order)
            b = md[lo]
            for j in range(lo + 1, hi):
                b = max(b, md[j])
            bi = n
            for j in range(lo, hi):
                if md[j] == b:
                    bi = min(bi, perm[j])
            best[node] = b
            arg[node] = bi
        # recompute the maxima bottom-up: a node is recorded before its descendants
        for v in range(n_visited - 1, -1, -1):
            node = visited[v]
            left, right = 2 * node + 1, 2 * node + 2
            if best[right] > best[left] or (best[right] == best[left] and arg[right] < arg[left]):
                best[node] = best[right]
                arg[node] = arg[right]
            else:
                best[node] = best[left]
                arg[node] = arg[left]
        sel = arg[0]
        out[s] = sel


@njit(cache=True, nogil=True)
def _fps_brute(xyz, n, length, start, m, out):
    """The reference's loop for one cloud with non-finite coordinates: all ``n`` rows (padding at −1),
    ``torch.minimum`` (NaN wins) and ``argmax`` (the first NaN, else the first maximum)."""
    md = np.empty(n, np.float32)
    for j in range(n):
        md[j] = np.inf if j < length else -1.0
    sel = start
    for s in range(min(m, length)):
        out[s] = sel
        cx, cy, cz = xyz[sel, 0], xyz[sel, 1], xyz[sel, 2]
        for j in range(n):
            dx = xyz[j, 0] - cx
            dy = xyz[j, 1] - cy
            dz = xyz[j, 2] - cz
            d = dx * dx + dy * dy + dz * dz
            if np.isnan(d) or d < md[j]:
                md[j] = d
        md[sel] = -1.0
        sel = 0
        for j in range(n):
            if np.isnan(md[j]):
                sel = j
                break
            if md[j] > md[sel]:
                sel = j


@njit(cache=True, nogil=True)
def _fps_cloud(points, lengths, start, m, out, b):
    """Cloud ``b`` of the batch into ``out[b]`` (left at −1 for an empty cloud or a bad start)."""
    n = points.shape[1]
    length = min(max(lengths[b], 0), n)
    s = start[b]
    if length == 0 or s < 0 or s >= length:
        return  # a row of −1, as the reference
    cloud = points[b]
    for j in range(n):
        for a in range(3):
            if not np.isfinite(cloud[j, a]):
                _fps_brute(cloud, n, length, s, m, out[b])
                return
    _fps_tree(cloud, length, s, m, out[b])


@njit(cache=True, nogil=True, parallel=True)
def _fps_parallel(points, lengths, start, m, out):
    """``points (B, N, 3)`` float32, ``lengths (B,)``, ``start (B,)`` int64 → ``out (B, m)`` (−1 filled);
    one cloud per task: results do not depend on the thread count."""
    for b in prange(points.shape[0]):
        _fps_cloud(points, lengths, start, m, out, b)


@njit(cache=True, nogil=True)
def _fps_serial(points, lengths, start, m, out):
    """As :func:`_fps_parallel` on the calling thread (one thread or one cloud: no pool wake-up)."""
    for b in range(points.shape[0]):
        _fps_cloud(points, lengths, start, m, out, b)


@keeps_torch_threads
def farthest_point_sample(
    points: torch.Tensor, lengths: torch.Tensor, start_idx: torch.Tensor, num_samples: int
) -> torch.Tensor:
    """Bucket FPS of a batch, the clouds in parallel over ``torch.get_num_threads()`` threads.

    ``points (B, N, 3)`` float32 CPU, ``lengths (B,)``, ``start_idx (B,)`` integer → ``(B, M)``
    int64, exactly ``pcops.reference.fps.farthest_point_sample``: lowest index on ties, −1 past
    ``min(M, length)``, a row of −1 for a start outside ``[0, length)``; the same whatever the
    thread count.
    """
    batch = points.shape[0]
    out = torch.full((batch, num_samples), -1, dtype=torch.int64)
    if batch == 0 or points.shape[1] == 0:
        return out
    args = (
        points.to(torch.float32).contiguous().numpy(),
        lengths.to(torch.int64).contiguous().numpy(),
        start_idx.to(torch.int64).contiguous().numpy(),
        num_samples,
        out.numpy(),
    )
    threads = min(num_threads(), numba.config.NUMBA_NUM_THREADS, batch)
    if threads == 1:
        _fps_serial(*args)
    else:
        numba.set_num_threads(threads)
        _fps_parallel(*args)
    return out
