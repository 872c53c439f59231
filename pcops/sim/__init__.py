"""A seeded LiDAR simulator: labelled street scenes scanned by a Velodyne HDL-64E-like sensor.

Not an op module; import it as ``pcops.sim``. :func:`simulate_scan` builds a random street
scene from ``seed`` and casts the sensor's rays into it with vectorised NumPy ray casting
(the first hit along each ray wins), returning a KITTI-like ``(N, 4)`` float32 scan, the
ground-truth boxes of the labelled objects, their class names and the number of points in
each box. The same arguments always give the same arrays (one ``numpy.random.Generator``
drives everything, in a fixed order).

Sensor model (defaults follow KITTI's HDL-64E):
    * 64 beams at fixed elevations: an upper block of 32 from +2.0 deg down to -8.33 deg
      (1/3 deg apart) and a lower block of 32 from -8.83 deg to -24.9 deg (~0.52 deg apart);
      other ``n_beams`` interpolate that table. Each beam gets a small fixed azimuth offset
      and intensity gain, as the real lasers do.
    * 0.18 deg between firings (2,000 columns over 360 deg): the spacing measured inside every
      ring of the KITTI scans (the HDL-64E at 10 Hz; 0.09 deg is its 5 Hz mode, and gives
      twice the points).
    * Mounted 1.73 m above the road; ranges up to 120 m; Gaussian range noise (2 cm,
      clipped at 3 sigma), range quantised to 2 mm, reflectance quantised to 0.01.
    * A return is detected when ``albedo * (0.1 + 0.9 sqrt(cos incidence)) * (R0 / r)^2``,
      times log-normal speckle, exceeds 1 (R0 = 170 m): dark surfaces and grazing ground
      fade first. Car glass returns half the time; building windows mostly return from
      the rooms behind them (up to 4 m deeper); foliage and bicycles are porous (some rays
      pass through); a small random dropout (2 %) removes any return. Four mounting posts
      around the sensor cast narrow shadow wedges on the lowest beams (as in KITTI scans;
      the car's roof sits below the lowest beam).
    * Reflectance = albedo * (0.6 + 0.4 cos incidence) * beam gain * log-normal speckle,
      minus a far-range fade (0.008 per metre beyond 15 m); readings under 0.06 come out as
      0 (weak and far returns read 0, as in KITTI).

Scene model: a straight road along x (ego in the right-hand lane, lane markings), raised
sidewalks with curbs on both sides, an optional cross street, a street end (a row of
buildings across the road 55-110 m away) on either side with probability 1/2, a gently
sloped ground plane (up to 1.5 % along the road); behind the sidewalks rows of buildings
(with window glass), walls, hedges and open lawns with bushes; on the sidewalks poles, trees
(trunk cylinder + porous ellipsoid crown) and unlabelled clutter (bollards, bins, utility
boxes, benches, parked bicycles, sign posts); labelled cars (body, glass cabin, wheels),
pedestrians (legs, torso, head) and cyclists (porous bicycle + rider), parked along the curbs,
driving in the lanes (both directions, and in the cross street), walking on the sidewalks or
crossing the road. Class sizes are drawn around KITTI's means (Car 3.9 x 1.6 x 1.56 m,
Pedestrian 0.8 x 0.6 x 1.76 m, Cyclist 1.76 x 0.6 x 1.73 m).

Labels: every placed object is kept, including those hidden behind others or too far to
return any point (``num_points_in_box`` is then 0); filter on ``num_points_in_box`` to keep
the visible ones. Unlike KITTI (front camera only) the labels cover the full 360 degrees.
Every object's parts are inset 7 cm from its box, so the points it returns (range noise is
clipped at 3 sigma) lie inside its box; ``num_points_in_box`` counts all scan points inside
the box (as OpenPCDet's ground-truth database does), which may include a few ground points
at the box's bottom face; ``num_object_points`` counts only the object's own returns.
Over a split, about two thirds of the labelled objects are cars, a quarter pedestrians and a
tenth cyclists (tested bounds: Car 58-76 %, Pedestrian 15-33 %, Cyclist 4-15 %), all within
100 m (BEV) of the sensor: about 45 % within 30 m, 32 % at 30-50 m and 23 % beyond (tested
bounds 33-57 %, 20-44 %, 13-35 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import check_float, check_int
from .raycast import _cast
from .scene import CLASS_SIZES, PART_INSET, _build_scene
from .sensor import (
    AZIMUTH_STEP_DEG,
    DETECT_R0,
    FADE_PER_M,
    FADE_START,
    GLASS_PASS,
    MAX_RANGE,
    MOUNT_POSTS,
    REFL_FLOOR,
    REFL_SPECKLE,
    SENSOR_HEIGHT,
    SPECKLE_SIGMA,
    _measure,
    _Rays,
    hdl64_elevations,
)

__all__ = [
    "SimScan",
    "simulate_scan",
    "simulated_points",
    "hdl64_elevations",
    "points_in_boxes_count",
    "CLASS_SIZES",
    # constants of the sensor and scene models (see sensor.py and scene.py)
    "SENSOR_HEIGHT",
    "MAX_RANGE",
    "AZIMUTH_STEP_DEG",
    "DETECT_R0",
    "SPECKLE_SIGMA",
    "REFL_SPECKLE",
    "GLASS_PASS",
    "FADE_START",
    "FADE_PER_M",
    "REFL_FLOOR",
    "PART_INSET",
    "MOUNT_POSTS",
]


# ----------------------------------------------------------------------------- labels


def points_in_boxes_count(points, boxes) -> np.ndarray:
    """Number of points (N, >=3) inside each box (M, 7) (x, y, z, dx, dy, dz, heading),
    faces included; returns (M,) int64. Plain NumPy, for labels and tests."""
    p = np.asarray(points, dtype=np.float64)[:, :3]
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    out = np.zeros(len(b), dtype=np.int64)
    for i, (x, y, z, l, w, h, yaw) in enumerate(b):
        d = p - np.array([x, y, z])
        c, s = math.cos(yaw), math.sin(yaw)
        lx = c * d[:, 0] + s * d[:, 1]
        ly = -s * d[:, 0] + c * d[:, 1]
        out[i] = int(np.count_nonzero((np.abs(lx) <= l / 2) & (np.abs(ly) <= w / 2) & (np.abs(d[:, 2]) <= h / 2)))
    return out


# ----------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class SimScan:
    """One simulated scan.

    Attributes:
        points: ``(N, 4)`` float32 ``(x, y, z, reflectance)``, LiDAR frame (x forward, y left,
            z up, metres; the sensor at the origin, the road about 1.73 m below), reflectance
            in [0, 1] quantised to 0.01. Ordered sweep by sweep, then beam by beam (top beam
            first), then by azimuth from -180 deg.
        boxes: ``(M, 7)`` float32 ``(x, y, z, dx, dy, dz, heading)`` ground truth in
            OpenPCDet's convention (z at the box centre, heading about +z from +x).
        names: the M class names (``Car``, ``Pedestrian``, ``Cyclist``).
        num_points_in_box: ``(M,)`` int64, points of ``points`` inside each box, counted
            geometrically (faces included) as OpenPCDet's ground-truth database does: 0 for an
            object that is hidden or out of range; it may include a few ground points inside
            the footprint (under the car body, or where the road slopes).
        num_object_points: ``(M,)`` int64, points returned by the object itself (always
            <= ``num_points_in_box``).
        instance: ``(N,)`` int64, index of the labelled object each point hit, -1 for the
            background (ground, buildings, vegetation, poles).
        ring: ``(N,)`` int64 beam index, 0 = top beam.
    """

    points: torch.Tensor
    boxes: torch.Tensor
    names: list
    num_points_in_box: torch.Tensor
    num_object_points: torch.Tensor
    instance: torch.Tensor
    ring: torch.Tensor


def simulate_scan(
    seed: int = 0,
    *,
    n_beams: int = 64,
    azimuth_step_deg: float = AZIMUTH_STEP_DEG,
    n_objects: int | None = None,
    n_sweeps: int = 1,
    ego_speed: float = 8.0,
    sweep_period: float = 0.1,
    max_range: float = MAX_RANGE,
    range_noise: float = 0.02,
    dropout: float = 0.02,
    scene_version: int = 2,
) -> SimScan:
    """Simulate one labelled LiDAR scan of a random street scene (see the module docstring).

    Args:
        seed: scene and noise seed; the output is a deterministic function of all arguments.
        n_beams: number of lasers (64 = HDL-64E; others interpolate its elevation table).
        azimuth_step_deg: horizontal angle between firings, degrees (0.18 ~ KITTI; 0.09 doubles
            the points).
        n_objects: labelled objects to try to place (default: 18-29 drawn from the seed); an
            object that finds no free spot in 25 tries is left out, so fewer may be placed.
        n_sweeps: scans taken while the ego car drives along +x at ``ego_speed`` m/s, one every
            ``sweep_period`` s, merged into the frame of the last one (the scene is static).
        max_range: farthest return, metres.
        range_noise: standard deviation of the range noise, metres (clipped at 3 sigma).
        dropout: probability that any return is lost.
        scene_version: 2 (default; issue 22): the scenes the shipped PointPillars weights were
            trained and evaluated on: vans and trucks (labelled
            ``Van``, ``Truck``), four car body types (compact, hatchback, sedan, SUV: clearance,
            belt line, cabin and a sloping hood), pedestrians with separate legs and arms,
            cars turning at the intersection at any heading, dense unlabelled clutter of a
            person's size on the sidewalks (``pcops.sim.clutter``), and a reflectance model
            fitted to real KITTI histograms (15 % brighter; some returns read 0), and the
            laser head's two blocks firing from 0.21 / 0.05 m above the origin, the lowest beam
            at -24.33 deg (``sensor.BLOCK_HEIGHTS_V2``); class shares
            Car 60 %, Van 6 %, Truck 3 %, Pedestrian 20 %, Cyclist 11 % of the draws.
            1: the earlier, simpler scenes (boxy cars, cars, pedestrians and cyclists only; the
            weights shipped before stop 29 were trained on them), kept byte-identical.

    Returns:
        :class:`SimScan`. The default scene has about 100-130 k points and takes well under
        2 s on one CPU core; ``azimuth_step_deg=0.09, n_sweeps=5`` gives about 1 M points.
    """
    seed = check_int("seed", seed, min_value=0)
    n_beams = check_int("n_beams", n_beams, min_value=1)
    azimuth_step_deg = check_float("azimuth_step_deg", azimuth_step_deg, min_value=0.005, max_value=10.0)
    if n_objects is not None:
        n_objects = check_int("n_objects", n_objects, min_value=0)
    n_sweeps = check_int("n_sweeps", n_sweeps, min_value=1)
    ego_speed = check_float("ego_speed", ego_speed, min_value=0.0, max_value=60.0)
    sweep_period = check_float("sweep_period", sweep_period, min_value=0.0)
    max_range = check_float("max_range", max_range, min_value=0.0, min_open=True)
    range_noise = check_float("range_noise", range_noise, min_value=0.0, max_value=(PART_INSET - 0.002) / 3)
    dropout = check_float("dropout", dropout, min_value=0.0, max_value=1.0)
    scene_version = check_int("scene_version", scene_version, min_value=1)
    if scene_version > 2:
        raise ValueError(f"scene_version: expected 1 or 2, got {scene_version}")

    rng = np.random.default_rng(seed)
    ego_xs = [-(n_sweeps - 1 - k) * ego_speed * sweep_period for k in range(n_sweeps)]
    scene = _build_scene(rng, n_objects, ego_xs, scene_version)
    rays = _Rays(rng, n_beams, azimuth_step_deg, scene_version)
    # version 2 casts each block of lasers from its own emitter height; version 1 all from the origin
    blocks = rays.blocks() if scene_version > 1 else [(0, rays, 0.0)]
    pts_l, inst_l, ring_l = [], [], []
    for ox in ego_xs:
        origin = np.array([ox, 0.0, ox * scene.ground.sx])  # the sensor follows the road slope
        for post, (az, dist, rad, top) in zip(scene.prims, MOUNT_POSTS):
            post.cx = ox + dist * math.cos(math.radians(az))
            post.cy = dist * math.sin(math.radians(az))
            post.r, post.z0, post.z1 = rad, origin[2] - 1.0, origin[2] + top
        for b0, block, dz in blocks:
            o = origin + np.array([0.0, 0.0, dz])
            t, s, cosv = _cast(scene, block, o, rng)
            pts, inst, ring = _measure(block, o, t, s, cosv, scene, rng, max_range, range_noise, dropout, scene_version)
            pts_l.append(pts)
            inst_l.append(inst)
            ring_l.append(ring + b0)
    pts = np.concatenate(pts_l).astype(np.float32)
    # boxes rounded to 0.1 mm, as the label files store them, so counts match a file round trip
    boxes32 = np.round(scene.boxes, 4).astype(np.float32)
    counts = points_in_boxes_count(pts, boxes32)
    inst = np.concatenate(inst_l)
    own = np.bincount(inst[inst >= 0], minlength=len(boxes32)).astype(np.int64)
    return SimScan(
        points=torch.from_numpy(pts),
        boxes=torch.from_numpy(boxes32),
        names=list(scene.names),
        num_points_in_box=torch.from_numpy(counts),
        num_object_points=torch.from_numpy(own),
        instance=torch.from_numpy(inst),
        ring=torch.from_numpy(np.concatenate(ring_l).astype(np.int64)),
    )


def simulated_points(n_points: int, seed: int = 0, **kwargs) -> torch.Tensor:
    """A simulated ``(n_points, 4)`` float32 scan of exactly ``n_points`` points.

    For benchmarks that need a scan of a given size (e.g. the size of a real KITTI scan when
    that file is absent): runs :func:`simulate_scan` (``seed`` and ``kwargs`` passed on),
    adding sweeps until there are enough points, then keeps a seeded random subset in scan
    order. Deterministic for given arguments.
    """
    n_points = check_int("n_points", n_points, min_value=0)
    scan = simulate_scan(seed, **kwargs)
    have = len(scan.points)
    if have < n_points:
        if "n_sweeps" in kwargs:
            raise ValueError(f"n_points: the scan has only {have} points with n_sweeps={kwargs['n_sweeps']}")
        sweeps = math.ceil(1.05 * n_points / max(have, 1))
        scan = simulate_scan(seed, n_sweeps=sweeps, **kwargs)
        have = len(scan.points)
    pick = np.sort(np.random.default_rng(seed).choice(have, size=n_points, replace=False))
    return scan.points[torch.from_numpy(pick)]
