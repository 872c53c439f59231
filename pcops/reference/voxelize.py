"""Voxelization in plain PyTorch: the CPU path and the test oracle.

First come, first served (spconv's CPU voxelizer / mmcv's deterministic mode), vectorised:

1. cell of each point: ``floor((p - range_min) / voxel_size)`` in float32, in range iff
   ``range_min <= p < range_max`` and ``cell < grid`` (NaN/inf fail the comparisons; ``cell >= 0``
   follows from ``p >= range_min``);
2. one packed key per in-range point, ``((b * gz + z) * gy + y) * gx + x`` (int32 when it fits);
3. the first point of each voxel: a scatter-min of point positions over a table of every cell
   (grids of at most ``TABLE_CELLS_PER_POINT`` cells per point), else the head of its run of
   equal keys after a stable sort;
4. voxels are numbered by their first point (a prefix count of "first point" flags), which is
   sample-major because samples are contiguous runs of points; the per-sample cap
   ``max_voxels`` keeps the first ones;
5. hard voxelization: a stable sort of the voxel numbers groups each voxel's points in point
   order, the offset inside the group is a point's rank, the per-voxel cap keeps ranks
   ``< max_points_per_voxel``, and point ``(row, rank)`` is scattered to ``voxels[row, rank]``.

Written for one CPU thread too (the data-loader path): each step is one pass of a vectorised
torch op over ``N`` (points), ``K`` (in-range points) or ``V`` (voxels) elements, and the
choices below are measured on a KITTI scan (N = 120k, K = 62k, V = 15k), not style.
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
    """``(q (3, N) float32, in_range (N,) bool)`` with ``q = (p - range_min) / voxel_size`` (x, y, z).

    The cell is ``floor(q)``, i.e. ``q`` truncated to an integer for points in range (``q >= 0``
    there). ``cell >= 0`` needs no test: ``p >= range_min`` makes ``p - range_min >= 0`` exactly;
    ``floor(q) < grid`` is ``q < grid`` for an integer ``grid`` (NaN fails both).
    """
    # (3, N) contiguous, a fresh buffer: the per-axis arithmetic then runs on contiguous rows
    # (several times faster on the CPU than over (N, 3) with a stride of C), in place
    xyz = torch.empty((3, points.shape[0]), dtype=torch.float32, device=points.device).copy_(points[:, :3].t())
    params = [point_cloud_range[:3], point_cloud_range[3:], voxel_size, grid_size(voxel_size, point_cloud_range)]
    lo, hi, vs, grid = torch.tensor(params, dtype=torch.float32, device=points.device)[:, :, None]
    # the three tests as 1.0 / 0.0 and their product: comparisons written to float32 are
    # vectorised on the CPU, ~4x faster than to bool
    ok = torch.ge(xyz, lo, out=torch.empty_like(xyz))
    test = torch.lt(xyz, hi, out=torch.empty_like(xyz))
    ok *= test
    q = xyz.sub_(lo).div_(vs)
    ok *= torch.lt(q, grid, out=test)
    return q, ok[0].mul_(ok[1]).mul_(ok[2]).bool()


_ROW_DTYPES = {4: torch.int32, 8: torch.int64, 16: torch.complex128}  # one element per row of that many bytes


def _as_elements(t: torch.Tensor) -> torch.Tensor:
    """A contiguous ``(R, C)`` ``t`` as ``(R,)`` elements of one row each when a row is 4, 8 or 16
    bytes (a bit copy moves it: ~3x faster than moving ``C`` short elements on the CPU); else ``t``."""
    row_dtype = _ROW_DTYPES.get(t.shape[1] * t.element_size())
    if row_dtype is None or not t.is_contiguous():
        return t
    return t.view(row_dtype).view(-1)


def _take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` for a ``(R, C)`` ``t`` (``index_select``: several times faster than advanced
    indexing on the CPU)."""
    return _as_elements(t).index_select(0, index).view(t.dtype).view(-1, t.shape[1])


def _put_rows(rows: int, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A ``(rows, C)`` tensor of zeros with ``out[index] = values``."""
    out = values.new_zeros((rows, values.shape[1]))
    _as_elements(out).index_copy_(0, index, _as_elements(values))
    return out


def _put(n: int, index: torch.Tensor, values: torch.Tensor, fill) -> torch.Tensor:
    """A ``(n,)`` tensor of ``fill`` with ``out[index] = values`` (distinct indices)."""
    return torch.full((n,), fill, dtype=values.dtype, device=values.device).scatter_(0, index, values)


# Grids of at most this many cells per point find each voxel's first point through a table of
# every cell (a scatter-min and a gather, no sort: ~3x faster on the CPU); finer grids (SECOND's
# 90M cells) through a stable sort of the keys. (The tests pass other thresholds to take each way.)
TABLE_CELLS_PER_POINT = 8


def _number_voxels(points, voxel_size, point_cloud_range, lengths, table_cells_per_point=TABLE_CELLS_PER_POINT):
    """The occupied voxels, numbered in first-point order.

    Returns ``(idx, vid, vb, coords)``: per in-range point (ascending) ``idx (K,)`` int64 its index
    and ``vid (K,)`` int32 its voxel; per voxel ``vb (V,)`` int64 its sample and ``coords (V, 4)``
    int32 its ``(b, z, y, x)``. Index arithmetic is int32 where it fits (int64 ops are several
    times slower on the CPU).
    """
    gx, gy, gz = grid_size(voxel_size, point_cloud_range)
    batch = 1 if lengths is None else lengths.numel()
    n = points.shape[0]
    cells = batch * gx * gy * gz
    device = points.device
    q, ok = voxel_coords(points, voxel_size, point_cloud_range)
    if lengths is not None:
        b = sample_ids(lengths, n, device)
        ok &= b < batch
    idx = ok.nonzero().squeeze(1)
    # packed key ((b * gz + z) * gy + y) * gx + x; int32 when it fits. Computed for every point
    # (cells out of range convert to garbage, never read) and gathered once. The conversion
    # truncates: floor for q >= 0
    cell = q.to(torch.int32 if cells < 2**31 else torch.int64)
    key = cell[0].add_(cell[1].add_(cell[2], alpha=gy), alpha=gx).index_select(0, idx)
    if lengths is not None:
        key += b.index_select(0, idx).to(key.dtype) * (gx * gy * gz)
    k = key.numel()
    pos = torch.arange(k, dtype=torch.int32, device=device)
    # head[i]: position (in idx) of the first point of point i's voxel
    if cells <= table_cells_per_point * n:
        table = torch.full((cells,), k, dtype=torch.int32, device=device)
        head = table.scatter_reduce_(0, key.long(), pos, "amin").index_select(0, key)
    else:  # the first element of each run of equal keys after a stable sort (runs in point order)
        sk, perm = torch.sort(key, stable=True)
        _, run, count = torch.unique_consecutive(sk, return_inverse=True, return_counts=True)
        run_head = perm.index_select(0, torch.cumsum(count, 0) - count).to(torch.int32)
        head = _put(k, perm, run_head.index_select(0, run), 0)
    # voxels numbered by first point: a prefix count of the "first point" flags
    is_first = head == pos
    vid = (torch.cumsum(is_first, 0, dtype=torch.int32) - 1).index_select(0, head)
    vfirst = idx.index_select(0, is_first.nonzero().squeeze(1))  # first point of each voxel
    vb = torch.zeros_like(vfirst) if lengths is None else b.index_select(0, vfirst)
    coords = torch.stack([vb.to(torch.int32)] + [q[i].index_select(0, vfirst).to(torch.int32) for i in (2, 1, 0)], 1)
    return idx, vid, vb, coords


def _by_voxel(vid: torch.Tensor, nv: int):
    """The points grouped by voxel, in point order within each: ``(order (K,) int64 positions,
    svid (K,) int32 their voxels, rank (K,) int32 their ranks in the voxel, count (V,) int64)``."""
    # a stable sort of the voxel numbers (int16 when they fit: ~2x faster than int32 on the CPU)
    svid, order = torch.sort(vid.to(torch.int16 if nv <= 2**15 else torch.int32), stable=True)
    svid = svid.to(torch.int32)
    count = torch.bincount(vid, minlength=nv)
    head = (torch.cumsum(count, 0) - count).to(torch.int32)  # sorted position of each voxel's first point
    rank = torch.arange(vid.numel(), dtype=torch.int32, device=vid.device) - head.index_select(0, svid)
    return order, svid, rank, count


def _per_sample(index: torch.Tensor, values: torch.Tensor, batch: int) -> torch.Tensor:
    """``(B,)`` int64 sums of ``values`` by sample ``index``."""
    return torch.zeros(batch, dtype=torch.int64, device=values.device).index_add_(0, index, values.long())


def _pad(t: torch.Tensor, rows: int, fill) -> torch.Tensor:
    """``t`` followed by rows of ``fill`` up to ``rows`` rows."""
    if rows <= t.shape[0]:
        return t
    return torch.cat([t, t.new_full((rows - t.shape[0],) + t.shape[1:], fill)])


def voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    max_points_per_voxel: int,
    max_voxels: int,
    pad_to_max: bool,
    *,
    table_cells_per_point: int = TABLE_CELLS_PER_POINT,
):
    """Hard voxelization; see ``pcops.voxelize`` for the contract.

    Returns ``(voxels, coords, num_points, point_to_voxel, num_voxels, num_dropped_points,
    num_dropped_voxels)``; the last three are ``(B,)`` int64. ``table_cells_per_point``: grids of
    at most this many cells per point find first points through a table, others by a sort (the
    same output either way).
    """
    n, num_channels = points.shape
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, vb, coords = _number_voxels(points, voxel_size, point_cloud_range, lengths, table_cells_per_point)
    nv = vb.numel()
    order, svid, rank, count = _by_voxel(vid, nv)
    point = idx.index_select(0, order)
    nvox = _per_sample(vb, torch.ones_like(vb), batch)
    in_range = _per_sample(vb, count, batch)
    row = svid  # row in voxels of each point's voxel: its number, unless the cap drops voxels
    if nv > max_voxels:  # a sample may exceed the cap: each keeps its first max_voxels voxels
        start = torch.cumsum(nvox, 0) - nvox
        keep_v = torch.arange(nv, device=device) - start.index_select(0, vb) < max_voxels
        row = (torch.cumsum(keep_v, 0, dtype=torch.int32) - 1).where(keep_v, -1).index_select(0, svid)
        kv = keep_v.nonzero().squeeze(1)
        count, vb, coords = count.index_select(0, kv), vb.index_select(0, kv), _take_rows(coords, kv)
    # each voxel keeps its first max_points_per_voxel points; row -1: dropped
    row = row.where(rank < max_points_per_voxel, -1)
    point_to_voxel = _put(n, point, row.long(), -1)

    m = vb.numel()
    total = batch * max_voxels if pad_to_max else m
    # point (row, rank) goes to slot row * max_points_per_voxel + rank; the dropped ones to a
    # spare slot, cut off after
    slot = torch.add(rank, row, alpha=max_points_per_voxel).where(row >= 0, total * max_points_per_voxel)
    voxels = _put_rows(total * max_points_per_voxel + 1, slot.long(), _take_rows(points, point))
    voxels = voxels[:-1].view(total, max_points_per_voxel, num_channels)
    kept_count = count.clamp(max=max_points_per_voxel)
    coords = _pad(coords, total, -1)
    num_points = _pad(kept_count.to(torch.int32), total, 0)

    num_voxels = nvox.clamp(max=max_voxels)
    dropped_points = in_range - _per_sample(vb, kept_count, batch)
    return voxels, coords, num_points, point_to_voxel, num_voxels, dropped_points, nvox - num_voxels


def dynamic_voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    pad_to_max: bool,
    *,
    table_cells_per_point: int = TABLE_CELLS_PER_POINT,
):
    """Dynamic voxelization (no caps); see ``pcops.dynamic_voxelize`` (``table_cells_per_point``: as ``voxelize``).

    Returns ``(point_to_voxel (N,) int64, coords (M or N, 4) int32, num_voxels (B,) int64)``.
    """
    n = points.shape[0]
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, vb, coords = _number_voxels(points, voxel_size, point_cloud_range, lengths, table_cells_per_point)
    point_to_voxel = _put(n, idx, vid.long(), -1)
    coords = _pad(coords, n if pad_to_max else 0, -1)
    num_voxels = _per_sample(vb, torch.ones_like(vb), batch)
    return point_to_voxel, coords, num_voxels


def point_cells(points: torch.Tensor, lengths: torch.Tensor | None, voxel_size, point_cloud_range) -> torch.Tensor:
    """``(N, 4)`` int32 ``(b, z, y, x)`` cell of every point, −1 rows for points out of range (or
    past ``lengths.sum()``); see ``pcops.dynamic_voxelize(cells_only=True)``."""
    n = points.shape[0]
    batch = 1 if lengths is None else lengths.numel()
    q, ok = voxel_coords(points, voxel_size, point_cloud_range)
    b = sample_ids(lengths, n, points.device)
    ok &= b < batch
    # truncation is floor for the in-range points (q >= 0); the others are overwritten
    cells = torch.stack([b.to(torch.int32), q[2].to(torch.int32), q[1].to(torch.int32), q[0].to(torch.int32)], 1)
    return cells.masked_fill_(~ok[:, None], -1)


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
        best = out[pv]
        # a NaN feature wins its voxel (amax propagates NaN, as torch): the first NaN point is the arg
        hit = ((features == best) | (features.isnan() & best.isnan())) & valid[:, None]
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
