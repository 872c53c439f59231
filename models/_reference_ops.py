"""The plain-torch reference ops the ``impl="reference"`` path of PointPillars runs on.

Thin adapters over ``pcops.reference``: the same computations as the public ops' CPU path,
called directly so that they also run on CUDA tensors (the oracle and the benchmark baseline).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Voxels(NamedTuple):
    voxels: torch.Tensor  # (M, T, C) zero padded
    coords: torch.Tensor  # (M, 4) int32 (batch, z, y, x)
    num_points: torch.Tensor  # (M,) int32


def voxelize(points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths=None) -> Voxels:
    """Hard voxelization in plain torch (first-come order), as ``pcops.voxelize``."""
    try:
        from pcops.reference import voxelize as ref
    except ImportError:  # pragma: no cover - development before the op landed
        ref = None
    if ref is not None and hasattr(ref, "voxelize"):
        out = ref.voxelize(points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths=lengths)
        return Voxels(out.voxels, out.coords, out.num_points)
    return _voxelize_fallback(points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy rotated BEV NMS in plain torch: kept indices in descending score order."""
    from pcops.reference import nms as ref

    return ref.nms_bev(boxes, scores, iou_threshold)


def _voxelize_fallback(points, voxel_size, pc_range, max_points, max_voxels, lengths):
    # temporary: spconv/OpenPCDet hard voxelization semantics, per scan, first-come order
    dev = points.device
    vs = torch.tensor(voxel_size, dtype=torch.float32, device=dev)
    lo = torch.tensor(pc_range[:3], dtype=torch.float32, device=dev)
    grid = [int(round((pc_range[i + 3] - pc_range[i]) / voxel_size[i])) for i in range(3)]
    if lengths is None:
        lengths = torch.tensor([points.shape[0]], device=dev)
    starts = torch.cumsum(lengths, 0) - lengths
    out_v, out_c, out_n = [], [], []
    for b, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        p = points[s : s + n]
        c = torch.floor((p[:, :3] - lo) / vs).long()
        ok = ((c >= 0) & (c < torch.tensor(grid, device=dev))).all(1)
        p, c = p[ok], c[ok]
        lin = (c[:, 2] * grid[1] + c[:, 1]) * grid[0] + c[:, 0]
        uniq, inv = torch.unique(lin, return_inverse=True)
        first = torch.full((uniq.numel(),), p.shape[0], dtype=torch.long, device=dev).scatter_reduce(
            0, inv, torch.arange(p.shape[0], device=dev), reduce="amin")
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=dev)
        vid = rank[inv]
        keep_v = vid < max_voxels
        nv = min(order.numel(), max_voxels)
        slot = torch.zeros(p.shape[0], dtype=torch.long, device=dev)
        # slot = rank of the point among earlier points of its voxel
        sorted_idx = torch.argsort(vid * p.shape[0] + torch.arange(p.shape[0], device=dev))
        vs_sorted = vid[sorted_idx]
        pos = torch.arange(p.shape[0], device=dev)
        seg_start = torch.zeros(order.numel() + 1, dtype=torch.long, device=dev)
        seg_start.scatter_reduce_(0, vs_sorted, pos, reduce="amin", include_self=False)
        slot[sorted_idx] = pos - seg_start[vs_sorted]
        keep = keep_v & (slot < max_points)
        vox = torch.zeros(nv, max_points, p.shape[1], device=dev)
        vox[vid[keep], slot[keep]] = p[keep]
        num = torch.zeros(nv, dtype=torch.int32, device=dev)
        num.index_add_(0, vid[keep], torch.ones_like(vid[keep], dtype=torch.int32))
        cz = c[first[order[:nv]]]
        coords = torch.stack([torch.full_like(cz[:, 0], b), cz[:, 2], cz[:, 1], cz[:, 0]], 1).to(torch.int32)
        out_v.append(vox), out_c.append(coords), out_n.append(num)
    return Voxels(torch.cat(out_v), torch.cat(out_c), torch.cat(out_n))
