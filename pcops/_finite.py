"""The non-finite policy of the point ops, written once for every backend.

A point with a NaN or ±inf coordinate is **absent**: ``farthest_point_sample`` never selects it
(rows are padded with −1 once the finite points run out), it is never a ``knn`` or
``ball_query`` neighbour, and a non-finite query gets a padded row (``knn``: ``inf`` / −1;
``ball_query``: −1 and count 0). Each kernel (reference, CPU, Triton, CUDA) runs on the cloud with
those points moved after the finite ones (a stable partition, so the finite points keep their
relative order and every tie rule still picks the lowest original index), with the finite count
as its length; its indices are mapped back. So every backend gives what it gives on the cloud
without the non-finite points. On the GPU this costs three Triton launches (``pcops.triton.finite``:
the partition (2), the index mapping (1); a KNN with separate queries one more, which zeroes the
non-finite queries) and no host synchronisation; on the CPU (torch ops here), clouds that are all
finite skip it.
"""

from __future__ import annotations

import torch

__all__ = ["partition", "restore", "fps", "fps_triton", "knn", "knn_triton", "ball_query", "ball_query_triton"]


def _keep(points: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` bool: inside the cloud's length and every coordinate finite."""
    n = points.shape[1]
    inside = torch.arange(n, device=points.device)[None, :] < lengths[:, None]
    return inside & torch.isfinite(points).all(dim=-1)


def _skip(keep: torch.Tensor, lengths: torch.Tensor) -> bool:
    """CPU tensors whose valid points are all finite need no partition (free to check there)."""
    return keep.device.type == "cpu" and bool(keep.sum() == lengths.clamp(0, keep.shape[1]).sum())


def partition(points: torch.Tensor, keep: torch.Tensor):
    """Stable partition of each cloud: kept points first, in order.

    Returns ``(points', counts, perm, pos)``: ``points'[b, j] = points[b, perm[b, j]]`` (zeros
    past ``counts[b]``),
    ``counts (B,)`` int64 kept points, ``pos[b, i]`` the new position of point ``i``.
    """
    b, n = keep.shape
    ar = torch.arange(n, device=keep.device).expand(b, n)
    kept_upto = keep.cumsum(1)  # kept points at or before i
    # contiguous: the CUDA launchers read lengths through a raw pointer
    counts = kept_upto[:, -1].contiguous() if n else torch.zeros(b, dtype=torch.int64, device=keep.device)
    pos = torch.where(keep, kept_upto - 1, counts[:, None] + ar - kept_upto)
    perm = torch.empty_like(pos).scatter_(1, pos, ar)
    # the moved-out points become zeros: no kernel ever reads a NaN, even in its padding
    cleared = points.masked_fill(~keep[..., None], 0)
    moved = cleared.gather(1, perm[..., None].expand(b, n, points.shape[2]))
    return moved, counts, perm, pos


def restore(idx: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Indices into the partitioned clouds (−1 padded, ``(B, ...)``) → indices into the originals."""
    if perm.shape[1] == 0:  # no reference points: every index is already −1
        return idx
    flat = idx.reshape(idx.shape[0], -1)
    out = torch.where(flat >= 0, perm.gather(1, flat.clamp(min=0)), flat)
    return out.reshape(idx.shape)


def fps(run, points, lengths, start_idx, num_samples):
    """``run(points, lengths, start_idx, num_samples)`` under the policy. A start point that is in
    range but non-finite is replaced by the cloud's lowest-index finite point; one outside
    ``[0, length)`` keeps the kernels' rule (a row of −1)."""
    if points.is_cuda:
        return fps_triton(run, points, lengths, start_idx, num_samples)
    lengths = lengths.clamp(0, points.shape[1])
    keep = _keep(points, lengths)
    if _skip(keep, lengths):
        return run(points, lengths, start_idx, num_samples)
    moved, counts, perm, pos = partition(points, keep)
    n = points.shape[1]
    in_range = (start_idx >= 0) & (start_idx < lengths)
    s = start_idx.clamp(0, max(n - 1, 0))
    if n:
        finite_start = keep.gather(1, s[:, None])[:, 0]
        new_start = torch.where(finite_start, pos.gather(1, s[:, None])[:, 0], 0)
    else:
        new_start = s
    new_start = torch.where(in_range, new_start, -1)
    return restore(run(moved.contiguous(), counts, new_start, num_samples), perm)


def fps_triton(run, points, lengths, start_idx, num_samples):
    """:func:`fps` with the Triton passes (the CUDA path; the interpreter's on the CPU): 3 launches
    around the kernel, none for the lengths (the passes clamp them)."""
    from .triton import finite as tri

    moved, counts, perm, _, new_start = tri.partition(points, lengths, start_idx.contiguous())
    return tri.restore(run(moved, counts, new_start, num_samples), perm)


def _self_query(query, ref, query_lengths, ref_lengths) -> bool:
    """A self-KNN as the GPU launchers recognise it (one tensor, one lengths tensor): one sort."""
    return (
        query.data_ptr() == ref.data_ptr()
        and query.shape == ref.shape
        and query_lengths.data_ptr() == ref_lengths.data_ptr()
    )


def _pair(run, query, ref, query_lengths, ref_lengths, *args):
    """``run(query', ref', query_lengths, counts, *args)`` on the CPU with the non-finite queries
    zeroed (no kernel meets them) and the references partitioned. Returns ``(outputs, perm,
    bad_q)``: ``perm`` None means the kernel ran on the inputs as they are (all finite)."""
    ref_lengths = ref_lengths.clamp(0, ref.shape[1])
    bad_q = ~torch.isfinite(query).all(dim=-1)
    keep = _keep(ref, ref_lengths)
    if _skip(keep, ref_lengths) and not bool(bad_q.any()):
        return run(query, ref, query_lengths, ref_lengths, *args), None, bad_q
    moved, counts, perm, _ = partition(ref, keep)
    q = torch.where(bad_q[..., None], torch.zeros((), dtype=query.dtype, device=query.device), query)
    return run(q.contiguous(), moved.contiguous(), query_lengths, counts, *args), perm, bad_q


def knn(run, query, ref, query_lengths, ref_lengths, k):
    """``run(query, ref, query_lengths, ref_lengths, k) -> (dists, idx)`` under the policy."""
    if query.is_cuda:
        return knn_triton(run, query, ref, query_lengths, ref_lengths, k)
    if _self_query(query, ref, query_lengths, ref_lengths):
        return _self_knn(run, ref, ref_lengths, k)
    (dists, idx), perm, bad_q = _pair(run, query, ref, query_lengths, ref_lengths, k)
    if perm is None:
        return dists, idx
    bad = bad_q[..., None]
    return dists.masked_fill(bad, float("inf")), restore(idx, perm).masked_fill(bad, -1)


def knn_triton(run, query, ref, query_lengths, ref_lengths, k):
    """:func:`knn` with the Triton passes (the CUDA path; the interpreter's on the CPU), no torch
    op around them (the passes clamp the lengths). Self-KNN: the partition (2 launches), the
    index mapping with the row order (1). Otherwise also one pass that zeroes the non-finite
    queries (their rows are padded by the mapping, which reads the original queries)."""
    from .triton import finite as tri

    if _self_query(query, ref, query_lengths, ref_lengths):
        # the partitioned cloud is both sides (the kernels keep their one shared sort); a
        # non-finite point lands past the finite count, so its row comes back padded
        moved, counts, perm, pos, _ = tri.partition(ref.contiguous(), ref_lengths)
        dists, idx = run(moved, moved, counts, counts, k)
        return tri.restore(idx, perm, dists, rows=pos)
    query = query.contiguous()
    moved, counts, perm, _, _ = tri.partition(ref.contiguous(), ref_lengths)
    dists, idx = run(tri.zero_non_finite(query), moved, query_lengths, counts, k)
    return tri.restore(idx, perm, dists, query=query)


def _self_knn(run, points, lengths, k):
    """Self-KNN on the CPU: the partitioned cloud is both sides; rows are put back in the
    original order."""
    clamped = lengths.clamp(0, points.shape[1])
    keep = _keep(points, clamped)
    if _skip(keep, clamped):
        return run(points, points, lengths, lengths, k)
    moved, counts, perm, pos = partition(points, keep)
    moved = moved.contiguous()
    dists, idx = run(moved, moved, counts, counts, k)
    rows = pos[..., None].expand(-1, -1, k)
    return dists.gather(1, rows), restore(idx.gather(1, rows), perm)


def ball_query(run, query, ref, query_lengths, ref_lengths, radius, k):
    """``run(query, ref, query_lengths, ref_lengths, radius, k) -> (idx, counts)`` under the policy
    (the CUDA grid kernel of ``pcops.triton.ball_query_grid`` applies it inside; the other CUDA
    kernels and the reference on CUDA come here)."""
    if query.is_cuda:
        return ball_query_triton(run, query, ref, query_lengths, ref_lengths, radius, k)
    (idx, cnt), perm, bad_q = _pair(run, query, ref, query_lengths, ref_lengths, radius, k)
    if perm is None:
        return idx, cnt
    return restore(idx, perm).masked_fill(bad_q[..., None], -1), cnt.masked_fill(bad_q, 0)


def ball_query_triton(run, query, ref, query_lengths, ref_lengths, radius, k):
    """:func:`ball_query` with the Triton passes (as :func:`knn_triton`): the partition (2
    launches), the query pass (1, which also gives the non-finite rows), the index mapping (1) and
    the counts of those rows set to 0 (1)."""
    from .triton import finite as tri

    query = query.contiguous()
    moved, counts, perm, _, _ = tri.partition(ref.contiguous(), ref_lengths)
    q, bad_q = tri.zero_non_finite(query, with_mask=True)
    idx, cnt = run(q, moved, query_lengths, counts, radius, k)
    return tri.restore(idx, perm, query=query), cnt.masked_fill(bad_q, 0)
