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
    num_dropped_voxels: torch.Tensor  # (B,) int64 voxels beyond max_voxels (dropped, as OpenPCDet does)


def voxelize(points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths=None) -> Voxels:
    """Hard voxelization in plain torch (first come, first served), as ``pcops.voxelize``."""
    from pcops.reference import voxelize as ref

    out = ref.voxelize(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, False)
    return Voxels(out[0], out[1], out[2], out[6])


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy rotated BEV NMS in plain torch: kept indices in descending score order."""
    from pcops.reference import nms as ref

    return ref.nms_bev(boxes, scores, iou_threshold)
