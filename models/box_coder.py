"""Anchors, OpenPCDet's ResidualCoder (decode side) and its direction-bin correction.

Boxes are 7-vectors ``(x, y, z, dx, dy, dz, heading)`` in the LiDAR frame (metres, radians),
``z`` at the box centre: OpenPCDet's convention.
"""

from __future__ import annotations

import math

import torch

from .config import PointPillarsConfig

__all__ = ["generate_anchors", "encode_boxes", "decode_boxes", "limit_period", "apply_direction", "direction_target"]


def generate_anchors(config: PointPillarsConfig) -> torch.Tensor:
    """All anchors of the head, ``(H_f, W_f, A_loc, 7)`` float32 on the CPU.

    Matches OpenPCDet's ``AnchorGenerator`` (``anchor_generator.py``) for one size and one height
    per class:

    * centres from ``torch.arange(start, end + 1e-5, step)``, where with ``align_center=False`` the
      grid spans the whole range inclusively, ``step = (max - min) / (n - 1)`` (so the first anchor
      sits on ``x = 0, y = -39.68``, the last on ``x = 69.12, y = 39.68``), and with
      ``align_center=True`` it is offset by half a step, ``step = (max - min) / n``;
    * ``z = bottom_height + dz / 2`` (OpenPCDet shifts the anchor bottoms to the box centres);
    * cell order ``(y, x)``, then class in config order, then rotation (OpenPCDet concatenates the
      per-class ``(1, H, W, 1, R, 7)`` tensors on dim -3), so anchor ``a`` of cell ``(y, x)`` is
      row ``(y * W_f + x) * A_loc + a`` of the flattened ``(N, 7)`` view, the order of the head's
      channels ``a * num_classes + class`` / ``a * 7 + k`` / ``a * num_dir_bins + bin``.

    The arange is evaluated on the CPU (in double, then rounded to float32) where OpenPCDet runs it
    on the GPU in float32; the centres may differ in the last bit (< 1e-5 m).
    """
    h_f, w_f = config.feature_map_hw
    r = config.point_cloud_range
    per_class = []
    for a in config.anchors:
        if a.align_center:
            x_step, y_step = (r[3] - r[0]) / w_f, (r[4] - r[1]) / h_f
            x0, y0 = r[0] + x_step / 2, r[1] + y_step / 2
        else:
            x_step, y_step = (r[3] - r[0]) / (w_f - 1), (r[4] - r[1]) / (h_f - 1)
            x0, y0 = r[0], r[1]
        xs = torch.arange(x0, r[3] + 1e-5, step=x_step, dtype=torch.float32)
        ys = torch.arange(y0, r[4] + 1e-5, step=y_step, dtype=torch.float32)
        if xs.numel() != w_f or ys.numel() != h_f:
            raise ValueError(f"anchors: grid of {ys.numel()}x{xs.numel()} centres for a {h_f}x{w_f} feature map")
        rots = torch.tensor(a.rotations, dtype=torch.float32)
        n_rot = rots.numel()
        z = torch.tensor(a.bottom_height, dtype=torch.float32) + torch.tensor(a.size[2], dtype=torch.float32) / 2
        anchors = torch.empty(h_f, w_f, n_rot, 7, dtype=torch.float32)
        anchors[..., 0] = xs.view(1, w_f, 1)
        anchors[..., 1] = ys.view(h_f, 1, 1)
        anchors[..., 2] = z
        anchors[..., 3:6] = torch.tensor(a.size, dtype=torch.float32)
        anchors[..., 6] = rots.view(1, 1, n_rot)
        per_class.append(anchors)
    return torch.cat(per_class, dim=2)


def limit_period(val: torch.Tensor, offset: float = 0.5, period: float = math.pi) -> torch.Tensor:
    """OpenPCDet's ``common_utils.limit_period``: ``val - floor(val / period + offset) * period``,
    i.e. ``val`` mapped into ``[-offset * period, (1 - offset) * period)``."""
    return val - torch.floor(val / period + offset) * period


def encode_boxes(boxes: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """OpenPCDet's ``ResidualCoder.encode_torch`` (``encode_angle_by_sincos=False``): the inverse of
    :func:`decode_boxes`. Sizes are clamped to ``>= 1e-5`` before the log, as OpenPCDet does.

    ``x_t = (x - x_a) / d_a``, ``y_t = (y - y_a) / d_a``, ``z_t = (z - z_a) / dz_a``,
    ``dx_t = log(dx / dx_a)`` (likewise dy, dz), ``r_t = r - r_a`` (not wrapped: the loss compares
    headings through ``sin(a - b)``). Shapes ``(..., 7)`` broadcastable; float32.
    """
    anchors = anchors.float()
    boxes = boxes.float()
    xa, ya, za, dxa, dya, dza, ra = anchors.unbind(-1)
    xg, yg, zg, dxg, dyg, dzg, rg = boxes.unbind(-1)
    dxa, dya, dza = dxa.clamp(min=1e-5), dya.clamp(min=1e-5), dza.clamp(min=1e-5)
    dxg, dyg, dzg = dxg.clamp(min=1e-5), dyg.clamp(min=1e-5), dzg.clamp(min=1e-5)
    diagonal = torch.sqrt(dxa**2 + dya**2)
    return torch.stack(
        (
            (xg - xa) / diagonal,
            (yg - ya) / diagonal,
            (zg - za) / dza,
            torch.log(dxg / dxa),
            torch.log(dyg / dya),
            torch.log(dzg / dza),
            rg - ra,
        ),
        dim=-1,
    )


def direction_target(
    anchors: torch.Tensor, reg_targets: torch.Tensor, dir_offset: float, num_bins: int
) -> torch.Tensor:
    """OpenPCDet's ``get_direction_target`` (``one_hot=False``): the direction bin of each target's
    heading, ``floor(limit_period(r - dir_offset, 0, 2π) / (2π / num_bins))`` clamped to the bins;
    ``r = r_t + r_a``. Returns int64 of the leading shape."""
    rot_gt = reg_targets[..., 6] + anchors[..., 6]
    offset_rot = limit_period(rot_gt - dir_offset, 0.0, 2 * math.pi)
    bins = torch.floor(offset_rot / (2 * math.pi / num_bins)).long()
    return bins.clamp(min=0, max=num_bins - 1)


def decode_boxes(deltas: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """OpenPCDet's ``ResidualCoder.decode_torch`` with ``encode_angle_by_sincos=False``.

    ``x = x_t * d_a + x_a``, ``y = y_t * d_a + y_a`` with ``d_a = sqrt(dx_a² + dy_a²)``,
    ``z = z_t * dz_a + z_a``, sizes ``exp(t) * size_a``, ``heading = r_t + r_a``.

    Args:
        deltas: ``(..., 7)`` regression outputs of ``conv_box``.
        anchors: ``(..., 7)`` matching anchors (broadcastable).
    Returns:
        ``(..., 7)`` boxes in ``deltas.dtype`` promoted with the anchors' (float32).
    """
    xa, ya, za, dxa, dya, dza, ra = anchors.unbind(-1)
    xt, yt, zt, dxt, dyt, dzt, rt = deltas.unbind(-1)
    diagonal = torch.sqrt(dxa**2 + dya**2)
    return torch.stack(
        (
            xt * diagonal + xa,
            yt * diagonal + ya,
            zt * dza + za,
            torch.exp(dxt) * dxa,
            torch.exp(dyt) * dya,
            torch.exp(dzt) * dza,
            rt + ra,
        ),
        dim=-1,
    )


def apply_direction(
    heading: torch.Tensor, dir_logits: torch.Tensor, dir_offset: float, dir_limit_offset: float, num_bins: int
) -> torch.Tensor:
    """OpenPCDet's direction-bin correction (``AnchorHeadTemplate.generate_predicted_boxes``).

    ``period = 2π / num_bins``; ``heading' = limit_period(heading - dir_offset, dir_limit_offset,
    period) + dir_offset + period * argmax(dir_logits)``. The argmax is ``torch.max(..., dim=-1)``,
    as OpenPCDet's. With the KITTI values (offset 0.78539, limit offset 0, 2 bins) the result lies in
    ``[0.785, 0.785 + 2π)``: headings are not wrapped to ``[-π, π)``, exactly as OpenPCDet returns them.
    """
    period = 2 * math.pi / num_bins
    dir_labels = torch.max(dir_logits, dim=-1)[1]
    rot = limit_period(heading - dir_offset, dir_limit_offset, period)
    return rot + dir_offset + period * dir_labels.to(heading.dtype)
