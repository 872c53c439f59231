"""Anchor target assignment of PointPillars: OpenPCDet's ``AxisAlignedTargetAssigner``, batched.

For every class separately (its anchors against its ground truth), as OpenPCDet does for the KITTI
``pointpillar.yaml`` (``MATCHED_THRESHOLD`` / ``UNMATCHED_THRESHOLD`` per class, ``POS_FRACTION``
−1, i.e. no sampling, ``NORM_BY_NUM_EXAMPLES`` False, ``MATCH_HEIGHT`` False):

* IoU is the *nearest-BEV* axis-aligned IoU: each box's heading is wrapped to ``[-π/2, π/2)``
  and, beyond ``±π/4``, its ``dx``/``dy`` are swapped; the boxes are then compared as axis-aligned
  rectangles (``boxes3d_nearest_bev_iou``).
* an anchor whose best IoU is ``>= matched`` is positive for that ground truth; one whose best IoU
  is ``< unmatched`` is background (label 0); the rest are ignored (label −1);
* every ground truth keeps its best anchor(s): each anchor whose IoU with some ground truth equals
  that ground truth's best IoU (when > 0) is positive, for the ground truth of its *own* best IoU
  (OpenPCDet's ``gt_inds_force``), even below ``unmatched``.

Batched with fixed shapes: ground truth is padded to ``G`` boxes per scan (``gt_labels`` 0 marks
padding). Everything is a tensor expression over ``(B, H, W, R, G)`` (the anchor grid's overlaps are separable
into rows and columns): no host synchronisation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import box_coder
from .config import PointPillarsConfig

__all__ = ["Targets", "assign_targets", "nearest_bev_iou"]

# OpenPCDet pointpillar.yaml: (matched, unmatched) IoU per class
DEFAULT_THRESHOLDS = {"Car": (0.6, 0.45), "Pedestrian": (0.5, 0.35), "Cyclist": (0.5, 0.35)}


class Targets(NamedTuple):
    labels: torch.Tensor  # (B, A) int64: class id 1..C for positives, 0 background, -1 ignored
    reg_targets: torch.Tensor  # (B, A, 7) float32 ResidualCoder targets (0 where not positive)
    gt_index: torch.Tensor  # (B, A) int64 index of the matched ground truth (-1 where not positive)


def _nearest_bev(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 7)`` boxes → ``(..., 4)`` axis-aligned ``(x1, y1, x2, y2)`` of the nearest BEV box."""
    rot = box_coder.limit_period(boxes[..., 6], 0.5, torch.pi).abs()
    swap = rot > torch.pi / 4
    dx = torch.where(swap, boxes[..., 4], boxes[..., 3])
    dy = torch.where(swap, boxes[..., 3], boxes[..., 4])
    x, y = boxes[..., 0], boxes[..., 1]
    return torch.stack((x - dx / 2, y - dy / 2, x + dx / 2, y + dy / 2), dim=-1)


def nearest_bev_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Nearest-BEV axis-aligned IoU of ``a (..., N, 7)`` and ``b (..., M, 7)`` → ``(..., N, M)``."""
    ra, rb = _nearest_bev(a).unsqueeze(-2), _nearest_bev(b).unsqueeze(-3)
    iw = (torch.minimum(ra[..., 2], rb[..., 2]) - torch.maximum(ra[..., 0], rb[..., 0])).clamp(min=0)
    ih = (torch.minimum(ra[..., 3], rb[..., 3]) - torch.maximum(ra[..., 1], rb[..., 1])).clamp(min=0)
    inter = iw * ih
    area_a = (ra[..., 2] - ra[..., 0]) * (ra[..., 3] - ra[..., 1])
    area_b = (rb[..., 2] - rb[..., 0]) * (rb[..., 3] - rb[..., 1])
    return inter / (area_a + area_b - inter).clamp(min=1e-6)


def assign_targets(
    config: PointPillarsConfig,
    anchors: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    thresholds: dict | None = None,
    class_slices=None,
) -> Targets:
    """Targets of every anchor for a batch.

    Args:
        config: the model's config (anchor layout: cells, then class, then rotation).
        anchors: ``(A, 7)`` float32, ``A = H_f * W_f * num_anchors_per_location`` in the head's order.
        gt_boxes: ``(B, G, 7)`` float32 LiDAR-frame boxes, padded.
        gt_labels: ``(B, G)`` int64 class ids ``1..C`` (config order), 0 for padding.
        thresholds: ``{class_name: (matched, unmatched)}``; default OpenPCDet's KITTI values.
        class_slices: optional ``((start, stop), ...)`` per class id 1..C: the columns of ``gt_boxes``
            that can hold that class (:func:`pcops.models.data.collate` groups them); only those are
            compared with the class's anchors (the same result, less work). Default: all columns.
    Returns:
        :class:`Targets` with ``A`` anchors per scan in the head's order.
    """
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    bsz, g = gt_labels.shape
    h_f, w_f = config.feature_map_hw
    a_loc = config.num_anchors_per_location
    grid = anchors.view(h_f, w_f, a_loc, 7)
    labels = torch.full((bsz, h_f, w_f, a_loc), -1, dtype=torch.int64, device=anchors.device)
    gt_index = torch.full((bsz, h_f, w_f, a_loc), -1, dtype=torch.int64, device=anchors.device)
    gt_rect_all = _nearest_bev(gt_boxes)  # (B, G, 4)
    offset = 0
    for c, anchor_cfg in enumerate(config.anchors, start=1):
        n_rot = len(anchor_cfg.rotations)
        matched, unmatched = thresholds[anchor_cfg.class_name]
        lo, hi = (0, g) if class_slices is None else (class_slices[c - 1] if c - 1 < len(class_slices) else (0, 0))
        gt_rect = gt_rect_all[:, lo:hi]
        gx1, gy1, gx2, gy2 = (v[:, None, None, :] for v in gt_rect.unbind(-1))  # (B, 1, 1, G_c)
        area_g = (gx2 - gx1) * (gy2 - gy1)
        is_gt = (gt_labels[:, lo:hi] == c)[:, None, None, :]  # (B, 1, 1, G_c)
        if hi <= lo:  # no box of this class in the batch: every anchor is background
            labels[..., offset : offset + n_rot] = 0
            offset += n_rot
            continue
        ious = []
        for a in range(offset, offset + n_rot):
            # anchors lie on a grid and are axis-aligned after the nearest-BEV rule, so the overlap
            # is separable: widths depend on the column only, heights on the row only
            rect = _nearest_bev(grid[:, :, a])  # (H, W, 4)
            ax1, ax2 = rect[0, :, 0].view(1, 1, w_f, 1), rect[0, :, 2].view(1, 1, w_f, 1)
            ay1, ay2 = rect[:, 0, 1].view(1, h_f, 1, 1), rect[:, 0, 3].view(1, h_f, 1, 1)
            iw = (torch.minimum(ax2, gx2) - torch.maximum(ax1, gx1)).clamp(min=0)  # (B, 1, W, G)
            ih = (torch.minimum(ay2, gy2) - torch.maximum(ay1, gy1)).clamp(min=0)  # (B, H, 1, G)
            inter = ih * iw
            area_a = (rect[..., 2] - rect[..., 0]) * (rect[..., 3] - rect[..., 1])  # (H, W)
            iou = inter / (area_a[None, :, :, None] + area_g - inter).clamp(min=1e-6)
            ious.append(iou.masked_fill(~is_gt, -1.0))
        iou = torch.stack(ious, dim=3)  # (B, H, W, R, G)
        a_max, a_arg = iou.max(dim=-1)  # best ground truth of each anchor
        g_max = iou.flatten(1, 3).max(dim=1).values.view(bsz, 1, 1, 1, hi - lo)  # best anchor IoU of each ground truth
        g_max = torch.where(g_max > 0, g_max, torch.full_like(g_max, 2.0))  # OpenPCDet: best 0 -> no forced match
        forced = ((iou == g_max) & is_gt.unsqueeze(3)).any(dim=-1)
        lab = torch.where(a_max < unmatched, torch.zeros_like(a_arg), torch.full_like(a_arg, -1))
        pos = (a_max >= matched) | forced
        labels[..., offset : offset + n_rot] = torch.where(pos, torch.full_like(lab, c), lab)
        gt_index[..., offset : offset + n_rot] = torch.where(pos, a_arg + lo, torch.full_like(a_arg, -1))
        offset += n_rot
    labels = labels.view(bsz, -1)
    gt_index = gt_index.view(bsz, -1)
    matched_gt = torch.gather(gt_boxes, 1, gt_index.clamp(min=0).unsqueeze(-1).expand(-1, -1, 7))
    reg = box_coder.encode_boxes(matched_gt, anchors.unsqueeze(0))
    reg = torch.where((labels > 0).unsqueeze(-1), reg, torch.zeros_like(reg))
    return Targets(labels, reg, gt_index)
