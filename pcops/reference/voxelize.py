"""Voxelization in plain PyTorch: the CPU path and the test oracle.

First come, first served (spconv's CPU voxelizer / mmcv's deterministic mode), vectorised:

1. voxel of each point: ``floor((p - range_min) / voxel_size)`` in float32, in range iff
   ``range_min <= p < range_max`` and ``0 <= c < grid`` (NaN/inf fail the comparisons);
2. one packed int64 key per in-range point, ``((b * gz + z) * gy + y) * gx + x``;
3. one *stable* sort of the keys (in point order): equal keys become contiguous runs in point
   order, so the first element of a run is the voxel's first point and the offset inside the
   run is the point's rank in its voxel;
4. voxels are numbered by their first point (a sort of the run heads, one per voxel), which
   is sample-major because samples are contiguous runs of points; the per-sample cap
   ``max_voxels`` keeps the first ones, the per-voxel cap keeps ranks ``< max_points_per_voxel``.
"""
from __future__ import annotations

from typing import Sequence

import torch


def grid_size(voxel_size: Sequence[float], point_cloud_range: Sequence[float]) -> tuple[int, int, int]:
    """``(gx, gy, gz)`` = ``round((range_max - range_min) / voxel_size)`` (as spconv and mmcv)."""
    return tuple(
        max(int(round((point_cloud_range[i + 3] - point_cloud_range[i]) / voxel_size[i])), 1) for i in range(3)
    )


def sample_ids(lengths: torch.Tensor | None, num_points: int, device) -> torch.Tensor:
    """``(N,)`` int64 sample of each point; points past ``lengths.sum()`` get ``B`` (out of range)."""
    if lengths is None:
        return torch.zeros(num_points, dtype=torch.int64, device=device)
    lengths = lengths.long()
    batch = lengths.numel()
    b = torch.repeat_interleave(torch.arange(batch, device=device), lengths.clamp_min(0))[:num_points]
    if b.numel() < num_points:
        b = torch.cat([b, b.new_full((num_points - b.numel(),), batch)])
    return b


def voxel_coords(
    points: torch.Tensor, voxel_size: Sequence[float], point_cloud_range: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cells (N, 3) int64 (x, y, z), in_range (N,) bool)``; cells are 0 where out of range."""
    xyz = points[:, :3].float()
    lo = torch.tensor(point_cloud_range[:3], dtype=torch.float32, device=points.device)
    hi = torch.tensor(point_cloud_range[3:], dtype=torch.float32, device=points.device)
    vs = torch.tensor(voxel_size, dtype=torch.float32, device=points.device)
    grid = torch.tensor(grid_size(voxel_size, point_cloud_range), dtype=torch.float32, device=points.device)
    cell = torch.floor((xyz - lo) / vs)
    ok = ((xyz >= lo) & (xyz < hi) & (cell >= 0) & (cell < grid)).all(1)
    return torch.where(ok[:, None], cell, 0).long(), ok


def voxel_keys(points, voxel_size, point_cloud_range, lengths):
    """``(key (N,) int64, in_range (N,) bool, batch (N,) int64, cells (N, 3))`` with
    ``key = ((b * gz + z) * gy + y) * gx + x`` (−1 out of range)."""
    gx, gy, gz = grid_size(voxel_size, point_cloud_range)
    cell, ok = voxel_coords(points, voxel_size, point_cloud_range)
    b = sample_ids(lengths, points.shape[0], points.device)
    batch = 1 if lengths is None else lengths.numel()
    ok = ok & (b < batch)
    key = ((b * gz + cell[:, 2]) * gy + cell[:, 1]) * gx + cell[:, 0]
    return key.where(ok, -1), ok, b, cell


def _fcfs(points, voxel_size, point_cloud_range, lengths):
    """Voxel numbering in first-point order.

    Returns ``(idx (K,) in-range point indices ascending, vid (K,) voxel of each in first-point
    order, rank (K,) rank in its voxel in point order, first (V,) first point of each voxel,
    count (V,), batch (N,), cells (N, 3))``.
    """
    key, ok, b, cell = voxel_keys(points, voxel_size, point_cloud_range, lengths)
    idx = ok.nonzero().squeeze(1)
    k = key[idx]
    sk, perm = torch.sort(k, stable=True)  # runs of equal keys, each run in point order
    num = sk.numel()
    head = torch.ones(num, dtype=torch.bool, device=k.device)
    head[1:] = sk[1:] != sk[:-1]
    run = torch.cumsum(head, 0) - 1  # run (voxel in key order) of each sorted position
    heads = head.nonzero().squeeze(1)
    first = idx[perm[heads]]  # first point of each voxel (key order)
    count = torch.diff(torch.cat([heads, heads.new_tensor([num])]))
    order = torch.argsort(first)  # voxels by first point (firsts are distinct)
    vid_of_run = torch.empty_like(order)
    vid_of_run[order] = torch.arange(order.numel(), device=k.device)
    rank_sorted = torch.arange(num, device=k.device) - heads[run]
    vid = torch.empty_like(run)
    vid[perm] = vid_of_run[run]
    rank = torch.empty_like(rank_sorted)
    rank[perm] = rank_sorted
    return idx, vid, rank, first[order], count[order], b, cell


def voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    max_points_per_voxel: int,
    max_voxels: int,
    pad_to_max: bool,
):
    """Hard voxelization; see ``pcops.voxelize`` for the contract.

    Returns ``(voxels, coords, num_points, point_to_voxel, num_voxels, num_dropped_points,
    num_dropped_voxels)``; the last three are ``(B,)`` int64.
    """
    n, num_channels = points.shape
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, rank, first, count, b, cell = _fcfs(points, voxel_size, point_cloud_range, lengths)
    vb = b[first]  # sample of each voxel (voxels are sample-major)
    nvox = torch.bincount(vb, minlength=batch)[:batch]
    start = torch.cumsum(nvox, 0) - nvox
    local = torch.arange(first.numel(), device=device) - start[vb]
    keep_v = local < max_voxels
    row_of_vid = torch.cumsum(keep_v, 0) - 1
    row_of_vid = row_of_vid.where(keep_v, -1)
    m = int(keep_v.sum())
    keep_p = keep_v[vid] & (rank < max_points_per_voxel)
    rows = row_of_vid[vid]

    point_to_voxel = torch.full((n,), -1, dtype=torch.int64, device=device)
    point_to_voxel[idx[keep_p]] = rows[keep_p]
    total = batch * max_voxels if pad_to_max else m
    voxels = points.new_zeros((total, max_points_per_voxel, num_channels))
    voxels[rows[keep_p], rank[keep_p]] = points[idx[keep_p]]
    coords = torch.full((total, 4), -1, dtype=torch.int32, device=device)
    kf = first[keep_v]
    coords[:m] = torch.stack([b[kf], cell[kf, 2], cell[kf, 1], cell[kf, 0]], 1).to(torch.int32)
    num_points = torch.zeros(total, dtype=torch.int32, device=device)
    num_points[:m] = count[keep_v].clamp(max=max_points_per_voxel).to(torch.int32)

    num_voxels = nvox.clamp(max=max_voxels)
    num_dropped_voxels = nvox - num_voxels
    in_range = torch.bincount(b[idx], minlength=batch)[:batch]
    kept = torch.bincount(b[idx[keep_p]], minlength=batch)[:batch]
    return voxels, coords, num_points, point_to_voxel, num_voxels, in_range - kept, num_dropped_voxels


def dynamic_voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    pad_to_max: bool,
):
    """Dynamic voxelization (no caps); see ``pcops.dynamic_voxelize``.

    Returns ``(point_to_voxel (N,) int64, coords (M or N, 4) int32, num_voxels (B,) int64)``.
    """
    n = points.shape[0]
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, rank, first, count, b, cell = _fcfs(points, voxel_size, point_cloud_range, lengths)
    point_to_voxel = torch.full((n,), -1, dtype=torch.int64, device=device)
    point_to_voxel[idx] = vid
    m = first.numel()
    coords = torch.full((n if pad_to_max else m, 4), -1, dtype=torch.int32, device=device)
    coords[:m] = torch.stack([b[first], cell[first, 2], cell[first, 1], cell[first, 0]], 1).to(torch.int32)
    num_voxels = torch.bincount(b[first], minlength=batch)[:batch]
    return point_to_voxel, coords, num_voxels


# --- per-voxel reduction of point features ----------------------------------------------------


def voxel_reduce(features: torch.Tensor, point_to_voxel: torch.Tensor, num_voxels: int, reduce: str):
    """``(out (M, F), arg (M, F) int64)``: the reduction over the points of each voxel (rows with
    ``point_to_voxel == -1`` ignored, empty voxels 0); ``arg`` is the winning point of ``max``
    (lowest index among ties, −1 for empty voxels) and empty for ``sum``/``mean``."""
    n, num_feat = features.shape
    valid = point_to_voxel >= 0
    pv = point_to_voxel.where(valid, num_voxels)  # dump row M, cut off at the end
    if reduce == "max":
        out = features.new_full((num_voxels + 1, num_feat), float("-inf"))
        out.scatter_reduce_(0, pv[:, None].expand(n, num_feat), features, reduce="amax", include_self=True)
        hit = (features == out[pv]) & valid[:, None]
        arg = torch.full((num_voxels + 1, num_feat), n, dtype=torch.int64, device=features.device)
        pidx = torch.arange(n, device=features.device)[:, None].expand(n, num_feat)
        arg.scatter_reduce_(0, pv[:, None].expand(n, num_feat), pidx.where(hit, n), reduce="amin")
        arg = arg[:num_voxels]
        out = out[:num_voxels].where(arg < n, 0)
        return out, arg.where(arg < n, -1)
    acc_dtype = torch.float32 if features.dtype in (torch.float16, torch.bfloat16) else features.dtype
    out = torch.zeros((num_voxels + 1, num_feat), dtype=acc_dtype, device=features.device)
    out.index_add_(0, pv, features.to(acc_dtype))
    out = out[:num_voxels]
    if reduce == "mean":
        cnt = torch.bincount(pv, minlength=num_voxels + 1)[:num_voxels]
        out = out / cnt.clamp_min(1).to(acc_dtype)[:, None]
    return out.to(features.dtype), torch.empty((0, num_feat), dtype=torch.int64, device=features.device)


def voxel_reduce_backward(grad_out, features_shape, point_to_voxel, arg, reduce: str, num_voxels: int):
    """Gradient w.r.t. ``features``: ``sum`` → the voxel's gradient, ``mean`` → divided by the
    voxel's point count, ``max`` → to the winning point only."""
    n, num_feat = features_shape
    valid = point_to_voxel >= 0
    pv = point_to_voxel.where(valid, 0)
    if reduce == "max":
        grad = grad_out.new_zeros((n + 1, num_feat))
        a = arg.where(arg >= 0, n)
        grad.scatter_(0, a, grad_out)  # each (voxel, feature) has one winner; distinct per column
        return grad[:n]
    g = grad_out[pv] * valid[:, None].to(grad_out.dtype)
    if reduce == "mean":
        cnt = torch.bincount(point_to_voxel.where(valid, num_voxels), minlength=num_voxels + 1)[:num_voxels]
        g = g / cnt.clamp_min(1).to(grad_out.dtype)[pv][:, None]
    return g
