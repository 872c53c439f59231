"""The fused pillar feature net + scatter in plain PyTorch: the CPU path and the test oracle.

OpenPCDet's ``PillarVFE`` with one PFN layer (``use_absolute_xyz``, no distance), eval mode, the
BatchNorm folded into the linear layer, then PointPillars' scatter of each pillar's features into
the BEV canvas. The same arithmetic as ``pcops.triton.pfn`` (float32 throughout).
"""

from __future__ import annotations

import torch


def pillar_features(
    voxels: torch.Tensor,
    num_points: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    voxel_size,
    range_min,
) -> torch.Tensor:
    """``(M, C)`` float32: decorate, ``x @ weight + bias``, ReLU, max over the ``T`` slots."""
    num_slots = voxels.shape[1]
    n = num_points.long()
    pts = voxels[..., :4].float()  # x, y, z, r (extra point features are not used)
    xyz = pts[..., :3]
    # point mean over all T slots (the padding is zero) over the valid count, as OpenPCDet
    mean = xyz.sum(1) / n.clamp(min=1).to(torch.float32)[:, None]
    # pillar centre: coord * voxel + (voxel / 2 + range min), in float32
    vs = torch.tensor(voxel_size, dtype=torch.float32, device=voxels.device)
    offset = torch.tensor([v / 2 + r for v, r in zip(voxel_size, range_min)], dtype=torch.float32, device=voxels.device)
    centre = coords[:, [3, 2, 1]].to(torch.float32) * vs + offset
    feats = torch.cat([pts, xyz - mean[:, None], xyz - centre[:, None]], -1)
    # padding slots are zeroed after decoration; they still count in the max (relu(bias))
    valid = torch.arange(num_slots, device=voxels.device)[None, :] < n[:, None]
    feats = feats * valid[..., None]
    if num_slots == 0:
        return feats.new_zeros((voxels.shape[0], weight.shape[1]))
    return torch.relu(feats @ weight.float() + bias.float()).amax(dim=1)


def pfn_scatter(voxels, num_points, coords, weight, bias, canvas, voxel_size, range_min, count=None) -> None:
    """Write the features of every live row (``< count``, ``num_points > 0``, inside the canvas) into
    ``canvas (B, C, H, W)`` at its cell, in place; other cells are left untouched."""
    bsz, _, grid_h, grid_w = canvas.shape
    out = pillar_features(voxels, num_points, coords, weight, bias, voxel_size, range_min)
    b, y, x = coords[:, 0].long(), coords[:, 2].long(), coords[:, 3].long()
    live = (num_points > 0) & (b >= 0) & (b < bsz) & (y >= 0) & (y < grid_h) & (x >= 0) & (x < grid_w)
    if count is not None:
        live &= torch.arange(voxels.shape[0], device=voxels.device) < count.reshape(-1)[0].to(voxels.device)
    rows = live.nonzero().squeeze(1)
    canvas[b[rows], :, y[rows], x[rows]] = out[rows].to(canvas.dtype)
