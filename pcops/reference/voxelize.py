"""Voxelization in plain PyTorch: the CPU path and the test oracle.

First come, first served (spconv's CPU voxelizer / mmcv's deterministic mode), vectorised:

1. voxel of each point: ``floor((p - range_min) / voxel_size)`` in float32, in range iff
   ``range_min <= p < range_max`` and ``0 <= c < grid`` (NaN/inf fail the comparisons);
2. one packed int64 key per in-range point, ``((b * gz + z) * gy + y) * gx + x``;
3. one *stable* sort of the keys (in point order): equal keys become contiguous runs in point
   order, so the first element of a run is the voxel's first point and the offset inside the
   run is the point's rank in its voxel;
4. voxels are numbered by their first point (a prefix count of "first point" flags), which
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
    """``(cells (3, N) float32 (x, y, z), in_range (N,) bool)``; cells are only meaningful in range.

    ``cell >= 0`` needs no test: ``p >= range_min`` makes ``p - range_min >= 0`` exactly.
    """
    # (3, N) contiguous: the per-axis arithmetic then runs on contiguous rows (several times
    # faster on the CPU than broadcasting over (N, 3) with a stride of C)
    xyz = points[:, :3].t().float().contiguous()
    col = dict(dtype=torch.float32, device=points.device)
    lo = torch.tensor(point_cloud_range[:3], **col)[:, None]
    hi = torch.tensor(point_cloud_range[3:], **col)[:, None]
    vs = torch.tensor(voxel_size, **col)[:, None]
    grid = torch.tensor(grid_size(voxel_size, point_cloud_range), **col)[:, None]
    cell = torch.floor((xyz - lo) / vs)
    ok = (xyz >= lo) & (xyz < hi) & (cell < grid)
    return cell, ok[0] & ok[1] & ok[2]


def _take(t: torch.Tensor, index: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``t[index]`` along ``dim`` (``index_select``: several times faster than advanced indexing on the CPU)."""
    return t.index_select(dim, index)


_ROW_DTYPES = {4: torch.int32, 8: torch.int64, 16: torch.complex128}  # one element per row of that many bytes


def _take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` for a contiguous ``(R, C)`` ``t``; rows of 4, 8 or 16 bytes are copied as one
    element each (a plain bit copy: ~3x faster than ``index_select`` of short rows on the CPU)."""
    row_dtype = _ROW_DTYPES.get(t.shape[1] * t.element_size())
    if row_dtype is None or not t.is_contiguous():
        return _take(t, index)
    return _take(t.view(row_dtype).view(-1), index).view(t.dtype).view(-1, t.shape[1])


def _put(n: int, index: torch.Tensor, values: torch.Tensor, fill) -> torch.Tensor:
    """A ``(n,)`` tensor of ``fill`` with ``out[index] = values`` (distinct indices)."""
    return torch.full((n,), fill, dtype=values.dtype, device=values.device).scatter_(0, index, values)


def _fcfs(points, voxel_size, point_cloud_range, lengths):
    """Voxel numbering in first-point order.

    Returns ``(idx (K,) in-range point indices ascending, vid (K,) voxel of each in first-point
    order, rank (K,) rank in its voxel in point order, count (V,) points per voxel,
    vb (V,) sample of each voxel, vcell (3, V) int (x, y, z) of each voxel, b (K,) sample of
    each in-range point)``.
    """
    gx, gy, gz = grid_size(voxel_size, point_cloud_range)
    batch = 1 if lengths is None else lengths.numel()
    device = points.device
    cell, ok = voxel_coords(points, voxel_size, point_cloud_range)
    if lengths is not None:
        b_all = sample_ids(lengths, points.shape[0], device)
        ok = ok & (b_all < batch)
    idx = ok.nonzero().squeeze(1)
    c = _take(cell, idx, 1).to(torch.int32)  # (3, K) x, y, z
    # packed key ((b * gz + z) * gy + y) * gx + x; int32 (a faster sort) when it fits
    if batch * gx * gy * gz >= 2**31:
        c = c.long()
    key = (c[2] * gy + c[1]) * gx + c[0]
    if lengths is not None:
        b = _take(b_all, idx)
        key = key + b.to(key.dtype) * (gx * gy * gz)
    else:
        b = None  # one sample
    sk, perm = torch.sort(key, stable=True)  # runs of equal keys, each run in point order
    num = sk.numel()
    head = torch.ones(num, dtype=torch.bool, device=device)
    head[1:] = sk[1:] != sk[:-1]
    run = torch.cumsum(head, 0) - 1  # run (voxel in key order) of each sorted position
    heads = head.nonzero().squeeze(1)
    first_pos = _take(perm, heads)  # position (in idx) of each voxel's first point, key order
    count = torch.diff(heads, append=heads.new_tensor([num]))
    # number the voxels by first point: a prefix count of the "first point" flags (no sort)
    nv = first_pos.numel()
    is_first = torch.zeros(num, dtype=torch.bool, device=device).index_fill_(0, first_pos, True)
    vid_of_run = (torch.cumsum(is_first, 0) - 1).index_select(0, first_pos)
    order = _put(nv, vid_of_run, torch.arange(nv, device=device), 0)  # voxel (key order) of each vid
    rank_sorted = torch.arange(num, device=device) - _take(heads, run)
    vid = _put(num, perm, _take(vid_of_run, run), 0)
    rank = _put(num, perm, rank_sorted, 0)
    fpos = _take(first_pos, order)
    vb = torch.zeros(nv, dtype=torch.int64, device=device) if b is None else _take(b, fpos)
    return idx, vid, rank, _take(count, order), vb, _take(c, fpos, 1), b


def _per_sample(b: torch.Tensor | None, batch: int, total: int, device) -> torch.Tensor:
    """``(B,)`` int64 count of entries per sample (``b is None``: one sample of ``total``)."""
    if b is None:
        return torch.full((1,), total, dtype=torch.int64, device=device)
    return torch.bincount(b, minlength=batch)[:batch]


def _coords(vb: torch.Tensor, vcell: torch.Tensor, rows: int) -> torch.Tensor:
    """``(rows, 4)`` int32 ``(b, z, y, x)``: the voxels first, then −1 rows."""
    coords = torch.full((rows, 4), -1, dtype=torch.int32, device=vb.device)
    m = vb.numel()
    coords[:m, 0] = vb
    coords[:m, 1:] = vcell.flip(0).t()
    return coords


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
    idx, vid, rank, count, vb, vcell, b = _fcfs(points, voxel_size, point_cloud_range, lengths)
    nvox = _per_sample(vb, batch, vb.numel(), device)  # voxels are sample-major
    start = torch.cumsum(nvox, 0) - nvox
    local = torch.arange(vb.numel(), device=device) - _take(start, vb)
    keep_v = local < max_voxels
    kv = keep_v.nonzero().squeeze(1)
    m = kv.numel()
    row_of_vid = (torch.cumsum(keep_v, 0) - 1).where(keep_v, -1)
    keep_p = (_take(row_of_vid, vid) >= 0) & (rank < max_points_per_voxel)
    kp = keep_p.nonzero().squeeze(1)
    kidx, krow, krank = _take(idx, kp), _take(row_of_vid, _take(vid, kp)), _take(rank, kp)

    point_to_voxel = _put(n, kidx, krow, -1)
    total = batch * max_voxels if pad_to_max else m
    # gather through a slot table (N = a zero row): cheaper than zero-fill + scatter
    slot = _put(total * max_points_per_voxel, krow * max_points_per_voxel + krank, kidx, n)
    padded = torch.cat([points, points.new_zeros((1, num_channels))])
    voxels = _take_rows(padded, slot).view(total, max_points_per_voxel, num_channels)
    coords = _coords(_take(vb, kv), _take(vcell, kv, 1), total)
    num_points = torch.zeros(total, dtype=torch.int32, device=device)
    num_points[:m] = _take(count, kv).clamp(max=max_points_per_voxel)

    num_voxels = nvox.clamp(max=max_voxels)
    num_dropped_voxels = nvox - num_voxels
    in_range = _per_sample(b, batch, idx.numel(), device)
    kept = _per_sample(None if b is None else _take(b, kp), batch, kp.numel(), device)
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
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, rank, count, vb, vcell, b = _fcfs(points, voxel_size, point_cloud_range, lengths)
    point_to_voxel = _put(n, idx, vid, -1)
    coords = _coords(vb, vcell, n if pad_to_max else vb.numel())
    num_voxels = _per_sample(vb, batch, vb.numel(), points.device)
    return point_to_voxel, coords, num_voxels


# --- per-voxel reduction of point features ----------------------------------------------------


def _counts(index: torch.Tensor, size: int) -> torch.Tensor:
    """``bincount`` without a host sync on CUDA (so it can be graph-captured)."""
    return torch.zeros(size, dtype=torch.int64, device=index.device).index_add_(0, index, torch.ones_like(index))


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
        cnt = _counts(pv, num_voxels + 1)[:num_voxels]
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
        cnt = _counts(point_to_voxel.where(valid, num_voxels), num_voxels + 1)[:num_voxels]
        g = g / cnt.clamp_min(1).to(grad_out.dtype)[pv][:, None]
    return g
