"""KNN and ball query on the CPU: one KD-tree per reference cloud, queried in parallel (numba).

Algorithm (the KD-tree of Friedman, Bentley & Finkel, "An Algorithm for Finding Best Matches in
Logarithmic Expected Time", ACM TOMS 1977, with the bounding-box pruning of Arya & Mount's ANN
library): the valid reference points of a cloud are split at the median of their widest box side,
level by level, into a complete binary tree whose leaves hold ``LEAF`` points or fewer, each
leaf's points kept in index order. Every node stores its points' bounding box (and, for ball
query, their lowest index). A KNN query walks the tree depth first, nearer child first, keeps its
best ``K`` as a list sorted by (distance, index), and skips a node whose box is farther than the
K-th best; a ball query skips boxes at ``radius²`` or more, and, once ``K`` hits are held, nodes
and leaf tails whose indices are all above the K-th hit (the reference keeps the first ``K`` hits
in index order, not the nearest).

Exactness: distances are ``(dx*dx + dy*dy) + dz*dz`` from ``dx = q - r`` in float32 without FMA,
as the reference. The box bound uses the same operations on the gaps to the box, and rounding is
monotone, so it is never above a computed distance of the box's points: a skipped node holds no
point that the reference would rank ahead. Equal distances are ordered by index, so the result does
not depend on the tree's shape or the thread count. Clouds with a non-finite coordinate among their
valid points run a brute-force replica of the reference instead (its stable sort puts NaN after
``inf`` and after the padded slots).

Memory: the tree is O(N) (points permuted once, < 4N/LEAF nodes); outputs are O(N·K).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from . import keeps_torch_threads, num_threads

__all__ = ["knn", "ball_query", "LEAF"]

LEAF = 8  # points per leaf at most: a leaf costs a box test, a point a distance; 8 balances them
_CHUNK = 256  # queries per parallel task: enough to amortise a task's buffers
_STACK = 64  # traversal stack slots: the tree is at most 2 * log2(N) deep in pushes
_F32 = np.float32
_INF = np.float32(np.inf)
_NAN = np.float32(np.nan)
_NO_INDEX = np.int64(np.iinfo(np.int64).max)  # the index of an empty slot: after every real one
_SUBTREES_PER_THREAD = 8  # tree build: subtrees per thread in its one whole-subtree region


# --- tree build -------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _depth(n, leaf):
    """Levels below the root so that a complete binary tree of median splits has leaves of ≤ leaf."""
    d = 0
    while (n + (1 << d) - 1) >> d > leaf:
        d += 1
    return d


@njit(cache=True, nogil=True)
def _select(key, a, b, ix, lo, hi, kth):
    """Reorder ``lo:hi`` of ``key`` (and alongside it ``a``, ``b``, ``ix``) so that ``kth`` holds the
    kth smallest key, none left of it larger and none right of it smaller (Hoare quickselect)."""
    lo_, hi_ = lo, hi - 1
    while hi_ > lo_:
        x, y, z = key[lo_], key[(lo_ + hi_) >> 1], key[hi_]
        pivot = max(min(x, y), min(max(x, y), z))  # median of three: sorted runs stay O(n)
        i, j = lo_, hi_
        while i <= j:
            while key[i] < pivot:
                i += 1
            while key[j] > pivot:
                j -= 1
            if i <= j:
                key[i], key[j] = key[j], key[i]
                a[i], a[j] = a[j], a[i]
                b[i], b[j] = b[j], b[i]
                ix[i], ix[j] = ix[j], ix[i]
                i += 1
                j -= 1
        # [lo_, j] <= pivot <= [i, hi_], and j < between < i equals the pivot
        if kth <= j:
            hi_ = j
        elif kth >= i:
            lo_ = i
        else:
            break


@njit(cache=True, nogil=True)
def _finite(points, lengths):
    """``(B,)`` bool: every coordinate of the cloud's first ``lengths[b]`` points is finite.

    Serial: one pass over the points costs less than starting and joining a parallel region
    (benchmarks/NOTES.md, stop 25)."""
    out = np.zeros(points.shape[0], dtype=np.bool_)
    for b in range(points.shape[0]):
        ok = True
        for i in range(lengths[b]):
            for c in range(3):
                v = points[b, i, c]
                if not (v - v == 0):  # false for inf and NaN
                    ok = False
        out[b] = ok
    return out


@njit(cache=True, nogil=True, inline="always")
def _node(b, j, level, depth, off, pts, pidx, lo, hi, box, minidx):
    """Build node ``j`` (local number, at ``level``) of cloud ``b``: its box, then either its split
    at the median of its widest side into its two children's ranges, or (a leaf) its points put
    in index order and its lowest index."""
    node = off[b] + j
    s, e = lo[node], hi[node]
    x0, y0, z0, x1, y1, z1 = _INF, _INF, _INF, -_INF, -_INF, -_INF
    for i in range(s, e):
        x, y, z = pts[b, 0, i], pts[b, 1, i], pts[b, 2, i]
        x0, y0, z0 = min(x0, x), min(y0, y), min(z0, z)
        x1, y1, z1 = max(x1, x), max(y1, y), max(z1, z)
    box[node, 0], box[node, 1], box[node, 2] = x0, y0, z0
    box[node, 3], box[node, 4], box[node, 5] = x1, y1, z1
    if level < depth[b]:
        # split the widest side at the median: a balanced tree of fixed depth
        ext0, ext1, ext2 = x1 - x0, y1 - y0, z1 - z0
        c = 0 if ext0 >= ext1 and ext0 >= ext2 else (1 if ext1 >= ext2 else 2)
        mid = s + (e - s) // 2
        key, oa, ob = pts[b, c], pts[b, (c + 1) % 3], pts[b, (c + 2) % 3]
        _select(key, oa, ob, pidx[b], s, e, mid)
        left = off[b] + 2 * j + 1
        lo[left], hi[left] = s, mid
        lo[left + 1], hi[left + 1] = mid, e
    else:
        # leaves in index order: a ball query stops a leaf at its K-th hit's index
        for i in range(s + 1, e):
            x, y, z, p = pts[b, 0, i], pts[b, 1, i], pts[b, 2, i], pidx[b, i]
            m = i
            while m > s and pidx[b, m - 1] > p:
                for c in range(3):
                    pts[b, c, m] = pts[b, c, m - 1]
                pidx[b, m] = pidx[b, m - 1]
                m -= 1
            pts[b, 0, m], pts[b, 1, m], pts[b, 2, m], pidx[b, m] = x, y, z, p
        minidx[node] = pidx[b, s] if e > s else _NO_INDEX


@njit(cache=True, nogil=True, inline="always")
def _up(b, j, off, minidx):
    """The lowest original index below inner node ``j`` of cloud ``b``, from its children's."""
    left = off[b] + 2 * j + 1
    minidx[off[b] + j] = min(minidx[left], minidx[left + 1])


@njit(cache=True, nogil=True, parallel=True)
def _build(ref, lengths, use, leaf, threads):
    """KD-trees of the clouds with ``use[b]``: ``ref (B, N, 3)`` float32, ``lengths (B,)`` int64.

    Returns ``pts (B, 3, N)`` float32 (the valid points permuted into leaf order), ``pidx (B, N)``
    int64 (their original indices), per node (all clouds, node ``j`` of cloud ``b`` at
    ``off[b] + j``, children of ``j`` at ``2j+1``, ``2j+2``): ``lo``/``hi`` int64 point ranges,
    ``box (nodes, 6)`` float32 (min xyz, max xyz), ``minidx`` int64 (lowest original index below);
    ``off (B + 1,)`` and ``depth (B,)`` int64 (−1 for clouds not built). ``threads``: numba's
    thread count, which sets where the build switches to whole subtrees (not the tree itself).
    """
    batch, n = ref.shape[0], ref.shape[1]
    depth = np.full(batch, -1, dtype=np.int64)
    off = np.zeros(batch + 1, dtype=np.int64)
    max_depth = -1
    for b in range(batch):
        if use[b]:
            depth[b] = _depth(lengths[b], leaf)
            max_depth = max(max_depth, depth[b])
        off[b + 1] = off[b] + ((2 << depth[b]) - 1 if use[b] else 0)
    nodes = off[batch]
    pts = np.empty((batch, 3, n), dtype=_F32)
    pidx = np.empty((batch, n), dtype=np.int64)
    lo = np.zeros(nodes, dtype=np.int64)
    hi = np.zeros(nodes, dtype=np.int64)
    box = np.empty((nodes, 6), dtype=_F32)
    minidx = np.empty(nodes, dtype=np.int64)
    for b in prange(batch):
        if use[b]:
            for i in range(lengths[b]):
                pts[b, 0, i] = ref[b, i, 0]
                pts[b, 1, i] = ref[b, i, 1]
                pts[b, 2, i] = ref[b, i, 2]
                pidx[b, i] = i
            hi[off[b]] = lengths[b]
    # Few parallel regions: each one costs a fork and a join, milliseconds on a loaded machine.
    # The top levels go one level per region (every node of every cloud in parallel, so a large
    # cloud splits too) until there are ``_SUBTREES_PER_THREAD`` subtrees per thread; then one
    # region builds each subtree below that level whole, leaves' lowest indices included. Every
    # node gets the same operations on the same range as level by level: the tree does not
    # depend on the thread count.
    split = 0
    while split <= max_depth and (batch << split) < _SUBTREES_PER_THREAD * threads:
        split += 1
    for level in range(split):
        width = 1 << level
        for t in prange(batch * width):
            b = t // width
            if level <= depth[b]:
                _node(b, width - 1 + t - b * width, level, depth, off, pts, pidx, lo, hi, box, minidx)
    width0 = 1 << split
    for t in prange(batch * width0):
        b = t // width0
        s = t - b * width0  # the subtree's position at level ``split``
        if split <= depth[b]:
            for level in range(split, depth[b] + 1):
                w = 1 << (level - split)  # the subtree's nodes at this level
                first = (1 << level) - 1 + s * w
                for u in range(w):
                    _node(b, first + u, level, depth, off, pts, pidx, lo, hi, box, minidx)
            for level in range(depth[b] - 1, split - 1, -1):
                w = 1 << (level - split)
                first = (1 << level) - 1 + s * w
                for u in range(w):
                    _up(b, first + u, off, minidx)
    for b in range(batch):
        for level in range(min(split, depth[b]) - 1, -1, -1):
            for j in range((1 << level) - 1, (2 << level) - 1):
                _up(b, j, off, minidx)
    return pts, pidx, lo, hi, box, minidx, off, depth


@njit(cache=True, nogil=True, inline="always")
def _box_dist(qx, qy, qz, box, node):
    """Squared distance from the query to the node's box, in the distances' float32 operations."""
    zero = _F32(0.0)
    gx = box[node, 0] - qx if qx < box[node, 0] else (qx - box[node, 3] if qx > box[node, 3] else zero)
    gy = box[node, 1] - qy if qy < box[node, 1] else (qy - box[node, 4] if qy > box[node, 4] else zero)
    gz = box[node, 2] - qz if qz < box[node, 2] else (qz - box[node, 5] if qz > box[node, 5] else zero)
    return gx * gx + gy * gy + gz * gz


def _tasks(batch: int, nq: int) -> np.ndarray:
    """``(T, 3)`` int64 (cloud, first query, end query): every query row in chunks of ``_CHUNK``."""
    starts = np.arange(0, nq, _CHUNK, dtype=np.int64)
    t = np.empty((batch * starts.shape[0], 3), dtype=np.int64)
    t[:, 0] = np.repeat(np.arange(batch, dtype=np.int64), starts.shape[0])
    t[:, 1] = np.tile(starts, batch)
    t[:, 2] = np.minimum(t[:, 1] + _CHUNK, nq)
    return t


@njit(cache=True, nogil=True)
def _self_order(pidx, ql, finite, nq):
    """Query rows in the tree's leaf order (consecutive queries are neighbours: warm caches)."""
    order = np.empty((pidx.shape[0], nq), dtype=np.int64)
    for b in range(pidx.shape[0]):
        for j in range(nq):
            order[b, j] = pidx[b, j] if (finite[b] and j < ql[b]) else j
    return order


def _order(pidx, q, r, ql, rl, finite) -> np.ndarray:
    """``(B, Nq)`` int64 rows to visit: leaf order for a self query, else index order."""
    nq = q.shape[1]
    if q.__array_interface__["data"][0] == r.__array_interface__["data"][0] and q.shape == r.shape and (ql == rl).all():
        return _self_order(pidx, ql, finite, nq)
    return np.ascontiguousarray(np.broadcast_to(np.arange(nq, dtype=np.int64), (q.shape[0], nq)))


# --- KNN --------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _before(d1, i1, d2, i2):
    """(distance, index) order of the reference's stable sort: NaN after every number, ties by index."""
    n1, n2 = d1 != d1, d2 != d2
    if n1 or n2:
        return i1 < i2 if (n1 and n2) else n2
    return d1 < d2 or (d1 == d2 and i1 < i2)


@njit(cache=True, nogil=True, parallel=True)
def _knn_kernel(query, ref, ql, rl, k, tasks, order, finite, pts, pidx, lo, hi, box, off, depth, dists, idx):
    """Fill ``dists (B, Nq, k)`` float32 and ``idx (B, Nq, k)`` int64 (see :func:`knn`)."""
    nr = ref.shape[1]
    for t in prange(tasks.shape[0]):
        b, q0, q1 = tasks[t, 0], tasks[t, 1], tasks[t, 2]
        n_ref = rl[b]
        kk = min(k, n_ref)  # slots that hold a valid reference point (or, for NaN clouds, fewer)
        best_d = np.empty(max(kk, 1), dtype=_F32)
        best_i = np.empty(max(kk, 1), dtype=np.int64)
        stack = np.empty(_STACK, dtype=np.int64)
        stack_d = np.empty(_STACK, dtype=_F32)
        leaf0 = (1 << depth[b]) - 1  # first leaf of the cloud's tree (local node number)
        base = off[b]
        for j in range(q0, q1):
            q = order[b, j]
            filled = 0
            if q < ql[b] and kk > 0:
                qx, qy, qz = query[b, q, 0], query[b, q, 1], query[b, q, 2]
                for s in range(kk):
                    # the empty slot sorts after everything: inf here, NaN for the brute force
                    best_d[s] = _INF if finite[b] else _NAN
                    best_i[s] = _NO_INDEX
                if finite[b]:
                    wd, wi = _INF, _NO_INDEX  # the K-th best so far
                    stack[0], stack_d[0], sp = 0, _F32(0.0), 1
                    while sp > 0:
                        sp -= 1
                        node, bd = stack[sp], stack_d[sp]
                        if bd > wd:  # equal may still hold a lower index at the K-th distance
                            continue
                        if node >= leaf0:
                            g = base + node
                            for i in range(lo[g], hi[g]):
                                dx = qx - pts[b, 0, i]
                                dy = qy - pts[b, 1, i]
                                dz = qz - pts[b, 2, i]
                                d = dx * dx + dy * dy + dz * dz
                                p = pidx[b, i]
                                if d < wd or (d == wd and p < wi):
                                    m = kk - 1
                                    while m > 0 and (best_d[m - 1] > d or (best_d[m - 1] == d and best_i[m - 1] > p)):
                                        best_d[m] = best_d[m - 1]
                                        best_i[m] = best_i[m - 1]
                                        m -= 1
                                    best_d[m], best_i[m] = d, p
                                    wd, wi = best_d[kk - 1], best_i[kk - 1]
                        else:
                            c1 = 2 * node + 1
                            d1 = _box_dist(qx, qy, qz, box, base + c1)
                            d2 = _box_dist(qx, qy, qz, box, base + c1 + 1)
                            near, far, dn, df = (c1, c1 + 1, d1, d2) if d1 <= d2 else (c1 + 1, c1, d2, d1)
                            if df <= wd:
                                stack[sp], stack_d[sp] = far, df
                                sp += 1
                            if dn <= wd:
                                stack[sp], stack_d[sp] = near, dn
                                sp += 1
                    filled = kk
                else:
                    # a non-finite coordinate: the reference's brute force, its NaN order included
                    for i in range(n_ref):
                        dx = qx - ref[b, i, 0]
                        dy = qy - ref[b, i, 1]
                        dz = qz - ref[b, i, 2]
                        d = dx * dx + dy * dy + dz * dz
                        if _before(d, i, best_d[kk - 1], best_i[kk - 1]):
                            m = kk - 1
                            while m > 0 and _before(d, i, best_d[m - 1], best_i[m - 1]):
                                best_d[m] = best_d[m - 1]
                                best_i[m] = best_i[m - 1]
                                m -= 1
                            best_d[m], best_i[m] = d, i
                    numbers = 0
                    while numbers < kk and best_d[numbers] == best_d[numbers]:
                        numbers += 1
                    filled = numbers
                    take = min(k, nr)
                    # padded references (inf, -1) sort after every number and before NaN
                    s = numbers
                    while s < take and s - numbers < nr - n_ref:
                        dists[b, q, s], idx[b, q, s] = _INF, -1
                        s += 1
                    m = numbers
                    while s < take and m < kk:
                        dists[b, q, s], idx[b, q, s] = best_d[m], best_i[m]
                        s += 1
                        m += 1
                    for s2 in range(s, k):
                        dists[b, q, s2], idx[b, q, s2] = _INF, -1
                for s in range(filled):
                    dists[b, q, s], idx[b, q, s] = best_d[s], best_i[s]
                if finite[b]:
                    for s in range(filled, k):
                        dists[b, q, s], idx[b, q, s] = _INF, -1
            else:
                for s in range(k):
                    dists[b, q, s], idx[b, q, s] = _INF, -1


def _set_threads() -> None:
    numba.set_num_threads(min(num_threads(), numba.config.NUMBA_NUM_THREADS))


@keeps_torch_threads
def knn(
    query: torch.Tensor, ref: torch.Tensor, query_lengths: torch.Tensor, ref_lengths: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact KNN, the reference's result bit for bit.

    ``query (B, Nq, 3)``, ``ref (B, Nr, 3)`` float32 CPU, ``query_lengths``/``ref_lengths (B,)``
    int64 → ``dists (B, Nq, k)`` float32 ascending squared distances and ``idx (B, Nq, k)`` int64;
    ties by lowest index; slots past a cloud's valid reference count and rows of padded queries
    hold ``inf`` / −1.
    """
    _set_threads()
    q = query.detach().contiguous().numpy()
    r = ref.detach().contiguous().numpy()
    ql = query_lengths.contiguous().numpy()
    rl = ref_lengths.contiguous().numpy()
    batch, nq = q.shape[0], q.shape[1]
    dists = torch.empty((batch, nq, k), dtype=torch.float32)
    idx = torch.empty((batch, nq, k), dtype=torch.int64)
    if batch * nq == 0:
        return dists, idx
    # a query or reference coordinate that is not finite sends its cloud to the brute force
    finite = _finite(r, rl) & _finite(q, ql)
    pts, pidx, lo, hi, box, _, off, depth = _build(r, rl, finite, LEAF, numba.get_num_threads())
    _knn_kernel(
        q,
        r,
        ql,
        rl,
        k,
        _tasks(batch, nq),
        _order(pidx, q, r, ql, rl, finite),
        finite,
        pts,
        pidx,
        lo,
        hi,
        box,
        off,
        depth,
        dists.numpy(),
        idx.numpy(),
    )
    return dists, idx


# --- ball query -------------------------------------------------------------------------------


@njit(cache=True, nogil=True, parallel=True)
def _ball_kernel(query, ref, ql, rl, r2, k, tasks, finite, pts, pidx, lo, hi, box, minidx, off, depth, idx, counts):
    """Fill ``idx (B, Nq, k)`` int64 and ``counts (B, Nq)`` int64 (see :func:`ball_query`)."""
    for t in prange(tasks.shape[0]):
        b, q0, q1 = tasks[t, 0], tasks[t, 1], tasks[t, 2]
        hits = np.empty(k, dtype=np.int64)
        stack = np.empty(_STACK, dtype=np.int64)
        leaf0 = (1 << depth[b]) - 1
        base = off[b]
        for q in range(q0, q1):
            cnt = 0
            if q < ql[b] and rl[b] > 0:
                qx, qy, qz = query[b, q, 0], query[b, q, 1], query[b, q, 2]
                if finite[b]:
                    stack[0], sp = 0, 1
                    while sp > 0:
                        sp -= 1
                        node = stack[sp]
                        g = base + node
                        if cnt == k and minidx[g] > hits[k - 1]:  # only later indices below
                            continue
                        if node >= leaf0:
                            for i in range(lo[g], hi[g]):
                                p = pidx[b, i]
                                if cnt == k and p > hits[k - 1]:  # the leaf is in index order
                                    break
                                dx = qx - pts[b, 0, i]
                                dy = qy - pts[b, 1, i]
                                dz = qz - pts[b, 2, i]
                                if dx * dx + dy * dy + dz * dz < r2:
                                    m = min(cnt, k - 1)
                                    while m > 0 and hits[m - 1] > p:
                                        hits[m] = hits[m - 1]
                                        m -= 1
                                    hits[m] = p
                                    cnt = min(cnt + 1, k)
                        else:
                            c1 = 2 * node + 1
                            in1 = _box_dist(qx, qy, qz, box, base + c1) < r2
                            in2 = _box_dist(qx, qy, qz, box, base + c1 + 1) < r2
                            # the child with the lower first index goes first: the list fills early
                            first_left = minidx[base + c1] <= minidx[base + c1 + 1]
                            if in1 and in2:
                                stack[sp], stack[sp + 1] = (c1 + 1, c1) if first_left else (c1, c1 + 1)
                                sp += 2
                            elif in1:
                                stack[sp] = c1
                                sp += 1
                            elif in2:
                                stack[sp] = c1 + 1
                                sp += 1
                else:
                    # a non-finite coordinate: the reference's scan in index order (NaN never hits)
                    for i in range(rl[b]):
                        dx = qx - ref[b, i, 0]
                        dy = qy - ref[b, i, 1]
                        dz = qz - ref[b, i, 2]
                        if dx * dx + dy * dy + dz * dz < r2:
                            hits[cnt] = i
                            cnt += 1
                            if cnt == k:
                                break
            for s in range(cnt):
                idx[b, q, s] = hits[s]
            for s in range(cnt, k):
                idx[b, q, s] = -1
            counts[b, q] = cnt


@keeps_torch_threads
def ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    radius: float,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` reference points in index order with ``|q - r|² < radius²``, as the reference.

    ``query (B, Nq, 3)``, ``ref (B, Nr, 3)`` float32 CPU, lengths ``(B,)`` int64 → ``idx (B, Nq, k)``
    int64 padded with −1 and ``counts (B, Nq)`` int64; ``radius²`` is rounded to float32 once.
    """
    _set_threads()
    q = query.detach().contiguous().numpy()
    r = ref.detach().contiguous().numpy()
    ql = query_lengths.contiguous().numpy()
    rl = ref_lengths.contiguous().numpy()
    batch, nq = q.shape[0], q.shape[1]
    idx = torch.empty((batch, nq, k), dtype=torch.int64)
    counts = torch.empty((batch, nq), dtype=torch.int64)
    if batch * nq == 0:
        return idx, counts
    finite = _finite(r, rl) & _finite(q, ql)
    pts, pidx, lo, hi, box, minidx, off, depth = _build(r, rl, finite, LEAF, numba.get_num_threads())
    r2 = _F32(radius * radius)  # as the reference: radius² in double, rounded to float32
    _ball_kernel(
        q,
        r,
        ql,
        rl,
        r2,
        k,
        _tasks(batch, nq),
        finite,
        pts,
        pidx,
        lo,
        hi,
        box,
        minidx,
        off,
        depth,
        idx.numpy(),
        counts.numpy(),
    )
    return idx, counts
