"""Training augmentations on the GPU batch: OpenPCDet's per-point ones (pasted-box point
removal, flip, rotation, scaling, shuffle) and the sim-to-real transfer ones of
:class:`SensorAug` (issue 22), vectorised with no host sync."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .config import PointPillarsConfig
from .data import FAR, Batch

__all__ = ["SensorAug", "augment_batch"]


@dataclasses.dataclass(frozen=True)
class SensorAug:
    """Augmentations for the transfer from simulated to real scans (issue 22), drawn per scan
    (per object, per beam, per point) from the step's generator, on top of OpenPCDet's:

    Attributes:
        object_scale: each labelled object and its points scaled by ``U(lo, hi)`` about the centre
            of the box's bottom face (objects stay on the ground).
        beam_drop: each of the 64 beams (points binned by elevation to the nearest HDL-64E beam)
            dropped with this probability (its points moved out of range).
        intensity_gain, intensity_noise: reflectance × ``U(lo, hi)`` per scan, plus ``N(0, σ)`` per
            point, clipped to [0, 1].
        height: the sensor height jittered by ``U(-h, h)`` metres per scan (points and boxes move
            together along z).
    """

    object_scale: tuple = (0.9, 1.1)
    beam_drop: float = 0.05
    intensity_gain: tuple = (0.8, 1.2)
    intensity_noise: float = 0.03
    height: float = 0.1


@functools.lru_cache(maxsize=None)
def _beam_bounds(device: torch.device) -> torch.Tensor:
    """The 63 elevations between HDL-64E beams, ascending, on ``device`` (one copy per device, not
    one per training step)."""
    from pcops.sim.sensor import hdl64_elevations

    elev = torch.as_tensor(hdl64_elevations(64), dtype=torch.float32)  # descending
    return ((elev[:-1] + elev[1:]) / 2).flip(0).to(device)


def _beam_of(pts: torch.Tensor) -> torch.Tensor:
    """``(N,)`` int64: the nearest HDL-64E beam (0 = top) of each point, by elevation from the sensor."""
    e = torch.atan2(pts[:, 2], torch.hypot(pts[:, 0], pts[:, 1]))
    return 63 - torch.bucketize(e, _beam_bounds(pts.device))


def _sensor_augment(batch: Batch, pts, boxes, aug: SensorAug, generator):
    """``(points, boxes)`` after :class:`SensorAug` (the points' scans in ``batch``; no host sync)."""
    dev, (bsz, g) = pts.device, boxes.shape[:2]

    def uniform(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(shape, device=dev, generator=generator)

    idx, far = batch.sample_index, pts[:, 0] >= FAR
    # objects: scaled about their bottom centres (a point moves with the loader's first box holding it)
    s_obj = torch.where(batch.gt_labels > 0, uniform(*aug.object_scale, bsz, g), 1.0)
    ref = torch.cat([boxes[..., :2], boxes[..., 2:3] - boxes[..., 5:6] / 2], dim=-1).reshape(-1, 3)  # bottom centres
    if batch.owner is None:
        raise ValueError("batch.owner: expected each point's box column (collate() sets it), got None")
    col = idx * g + batch.owner.clamp(min=0).long()
    p, r = pts[:, :3], ref[col]
    xyz = torch.where((batch.owner >= 0)[:, None], r + (p - r) * s_obj.reshape(-1)[col, None], p)
    bottom = boxes[..., 2] - boxes[..., 5] / 2
    dims = boxes[..., 3:6] * s_obj[..., None]
    boxes = torch.cat([boxes[..., :2], (bottom + dims[..., 2] / 2)[..., None], dims, boxes[..., 6:]], dim=-1)
    # beams dropped, reflectance gain and noise, sensor height
    dropped = (uniform(0.0, 1.0, bsz, 64) < aug.beam_drop)[idx, _beam_of(xyz)] & ~far
    gain = uniform(*aug.intensity_gain, bsz)[idx]
    noise = torch.randn(pts.shape[0], device=dev, generator=generator) * aug.intensity_noise
    refl = (pts[:, 3] * gain + noise).clamp(0.0, 1.0)
    dz = uniform(-aug.height, aug.height, bsz)
    out = torch.cat([xyz[:, :2], (xyz[:, 2] + dz[idx])[:, None], refl[:, None], pts[:, 4:]], dim=1)
    out = torch.where((far | dropped)[:, None], torch.full_like(out, FAR), out)
    boxes = torch.cat([boxes[..., :2], (boxes[..., 2] + dz[:, None])[..., None], boxes[..., 3:]], dim=-1)
    return out, boxes


def augment_batch(
    batch: Batch,
    config: PointPillarsConfig,
    generator: torch.Generator | None = None,
    sensor: SensorAug | None = None,
) -> Batch:
    """The per-point augmentations on the batch's device, vectorised, no host sync (the loader
    has removed the scan's points inside pasted boxes and found each point's box): (``sensor``) the
    transfer augmentations of :class:`SensorAug`, flip about x, rotation about z, scaling
    (parameters from ``batch.aug``), a per-scan point shuffle, and boxes whose centre leaves
    ``point_cloud_range`` marked as padding."""
    pts, idx = batch.points, batch.sample_index
    flip, rot, scale = batch.aug.unbind(1)
    boxes = batch.gt_boxes.clone()
    if sensor is not None:
        pts, boxes = _sensor_augment(batch, pts, boxes, sensor, generator)
    sign = 1.0 - 2.0 * flip  # -1 where flipped
    # points
    y = pts[:, 1] * sign[idx]
    c, s = torch.cos(rot)[idx], torch.sin(rot)[idx]
    x2 = c * pts[:, 0] - s * y
    y2 = s * pts[:, 0] + c * y
    sc = scale[idx]
    far = pts[:, 0] >= FAR
    pts = torch.stack([x2 * sc, y2 * sc, pts[:, 2] * sc, pts[:, 3]], dim=1)
    pts = torch.where(far.unsqueeze(1), torch.full_like(pts, FAR), pts)
    # boxes
    by = boxes[..., 1] * sign[:, None]
    bh = boxes[..., 6] * sign[:, None]
    cb, sb = torch.cos(rot)[:, None], torch.sin(rot)[:, None]
    bx2 = cb * boxes[..., 0] - sb * by
    by2 = sb * boxes[..., 0] + cb * by
    scl = scale[:, None]
    heading = bh + rot[:, None]
    heading = heading - torch.floor(heading / (2 * math.pi) + 0.5) * (2 * math.pi)
    boxes = torch.stack(
        [
            bx2 * scl,
            by2 * scl,
            boxes[..., 2] * scl,
            boxes[..., 3] * scl,
            boxes[..., 4] * scl,
            boxes[..., 5] * scl,
            heading,
        ],
        dim=-1,
    )
    r = config.point_cloud_range
    in_range = (boxes[..., 0] >= r[0]) & (boxes[..., 0] < r[3]) & (boxes[..., 1] >= r[1]) & (boxes[..., 1] < r[4])
    labels = batch.gt_labels * in_range
    # shuffle inside each scan: sort by (scan, random key)
    key = idx.to(torch.float64) + torch.rand(idx.shape, device=idx.device, dtype=torch.float64, generator=generator)
    order = torch.argsort(key)
    pts = pts[order]
    return batch._replace(points=pts, gt_boxes=boxes, gt_labels=labels, scene=batch.scene[order])
