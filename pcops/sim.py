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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ._checks import check_float, check_int

__all__ = ["SimScan", "simulate_scan", "simulated_points", "hdl64_elevations", "points_in_boxes_count", "CLASS_SIZES"]

# ----------------------------------------------------------------------------- constants

SENSOR_HEIGHT = 1.73  # m, KITTI's Velodyne above the road
MAX_RANGE = 120.0  # m
AZIMUTH_STEP_DEG = 0.18  # measured in KITTI rings (HDL-64E at 10 Hz)
DETECT_R0 = 170.0  # m: range at which a white (albedo 1), head-on target is at threshold
SPECKLE_SIGMA = 0.3  # log-normal speckle of the detection test
REFL_SPECKLE = 0.25  # log-normal speckle of the reflectance
GLASS_PASS = 0.5  # probability that a window return comes from behind the glass
FADE_START, FADE_PER_M = 15.0, 0.008  # reflectance loses FADE_PER_M per metre beyond FADE_START
REFL_FLOOR = 0.06  # reflectance readings below this come out as 0 (weak returns)
PART_INSET = 0.07  # m: object parts stay this far inside their box (> 3 sigma noise + 2 mm quantum)
# sensor mounting posts: (azimuth deg, distance m, radius m, top z relative to the sensor m)
MOUNT_POSTS = tuple((az, 0.9, 0.12, -0.25) for az in (45.0, -45.0, 135.0, -135.0))

# KITTI mean sizes (l, w, h) and spreads, metres.
CLASS_SIZES = {
    "Car": ((3.9, 1.6, 1.56), (0.35, 0.09, 0.1)),
    "Pedestrian": ((0.8, 0.62, 1.76), (0.15, 0.08, 0.1)),
    "Cyclist": ((1.76, 0.6, 1.73), (0.12, 0.05, 0.08)),
}


def hdl64_elevations(n_beams: int = 64) -> np.ndarray:
    """Beam elevations in radians, top beam first: the HDL-64E table for 64 beams (upper
    block +2..-8.33 deg at 1/3 deg, lower block -8.83..-24.9 deg), interpolated over the beam
    index for other counts (keeping the field of view and the denser upper block)."""
    n_beams = check_int("n_beams", n_beams, min_value=1)
    upper = 2.0 - np.arange(32) / 3.0
    lower = np.linspace(-8.83, -24.9, 32)
    table = np.concatenate([upper, lower])
    if n_beams == 64:
        deg = table
    else:
        deg = np.interp(np.linspace(0, 63, n_beams), np.arange(64), table)
    return np.radians(deg)


# ----------------------------------------------------------------------------- surfaces

# name: (albedo low, albedo high, drop probability, porosity, see-through depth)
# see-through: glass returns come with probability GLASS_PASS from up to that many metres behind it
_MATERIALS = {
    "road": (0.25, 0.4, 0.0, 0.0, 0.0),
    "lane": (0.5, 0.75, 0.0, 0.0, 0.0),
    "sidewalk": (0.3, 0.5, 0.0, 0.0, 0.0),
    "curb": (0.3, 0.5, 0.0, 0.0, 0.0),
    "facade": (0.2, 0.5, 0.0, 0.0, 0.0),
    "roof": (0.15, 0.4, 0.0, 0.0, 0.0),
    "window": (0.1, 0.4, 0.3, 0.0, 4.0),
    "wall": (0.25, 0.55, 0.0, 0.0, 0.0),
    "foliage": (0.3, 0.6, 0.0, 0.4, 0.0),
    "trunk": (0.2, 0.4, 0.0, 0.0, 0.0),
    "pole": (0.3, 0.6, 0.0, 0.0, 0.0),
    "car_paint": (0.05, 0.6, 0.0, 0.0, 0.0),
    "car_glass": (0.04, 0.15, 0.5, 0.0, 0.0),
    "tyre": (0.02, 0.08, 0.1, 0.0, 0.0),
    "person": (0.15, 0.5, 0.0, 0.0, 0.0),
    "bicycle": (0.2, 0.5, 0.0, 0.45, 0.0),
    "ego": (0.0, 0.0, 1.0, 0.0, 0.0),
}


class _Surfaces:
    """Table of surfaces (one per material instance): albedo, drop probability, porosity,
    see-through depth, and the labelled object it belongs to (-1 for background)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.albedo: list[float] = []
        self.drop: list[float] = []
        self.porosity: list[float] = []
        self.instance: list[int] = []
        self.see_through: list[float] = []

    def new(self, material: str, instance: int = -1, albedo: float | None = None) -> int:
        lo, hi, drop, por, deep = _MATERIALS[material]
        self.see_through.append(deep)
        a = float(self.rng.uniform(lo, hi)) if albedo is None else albedo
        self.albedo.append(a)
        self.drop.append(drop)
        self.porosity.append(por)
        self.instance.append(instance)
        return len(self.albedo) - 1

    def arrays(self):
        return (np.array(self.albedo), np.array(self.drop), np.array(self.see_through),
                np.array(self.instance, dtype=np.int64))


# ----------------------------------------------------------------------------- primitives


@dataclass
class _BoxGroup:
    """Axis-aligned parts in one yawed frame (an object, a building, a wall...).

    centre (3,), yaw (rad); parts: lo/hi (K, 3) corners in the frame; side/top surface ids
    (K,) (top is used for hits on a +-z face); windows (K,) bool: side hits on a window
    pattern use ``window_surface`` instead.
    """

    centre: np.ndarray
    yaw: float
    lo: np.ndarray
    hi: np.ndarray
    side: np.ndarray
    top: np.ndarray
    windows: np.ndarray = None
    window_surface: int = -1

    def bounds(self):
        """BEV bounding circle (cx, cy, radius) and z range of the whole group."""
        corners_r = np.sqrt(np.maximum(self.lo[:, 0] ** 2, self.hi[:, 0] ** 2)
                            + np.maximum(self.lo[:, 1] ** 2, self.hi[:, 1] ** 2))
        return (self.centre[0], self.centre[1], float(corners_r.max()),
                self.centre[2] + float(self.lo[:, 2].min()), self.centre[2] + float(self.hi[:, 2].max()))

    def intersect(self, o, dx, dy, dz):
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        rel = o - self.centre
        lo_ = np.array([c * rel[0] + s * rel[1], -s * rel[0] + c * rel[1], rel[2]])
        ld = (c * dx + s * dy, -s * dx + c * dy, dz)
        inv = [1.0 / np.where(np.abs(a) < 1e-12, 1e-12, a) for a in ld]
        best_t = np.full(dx.shape, np.inf)
        best_s = np.full(dx.shape, -1, dtype=np.int64)
        best_cos = np.zeros(dx.shape)
        for k in range(len(self.lo)):
            tn = []
            tf = []
            for a in range(3):
                t1 = (self.lo[k, a] - lo_[a]) * inv[a]
                t2 = (self.hi[k, a] - lo_[a]) * inv[a]
                tn.append(np.minimum(t1, t2))
                tf.append(np.maximum(t1, t2))
            tn = np.stack(tn)
            tnear = tn.max(axis=0)
            tfar = np.minimum(np.minimum(tf[0], tf[1]), tf[2])
            hit = (tnear <= tfar) & (tnear > 1e-6) & (tnear < best_t)
            if not hit.any():
                continue
            axis = tn.argmax(axis=0)
            cosv = np.abs(np.choose(axis, ld))
            surf = np.where(axis == 2, self.top[k], self.side[k])
            if self.windows is not None and self.windows[k]:
                # window pattern on the facades: 3.2 m storeys, 3.5 m bays
                px = lo_[0] + tnear * ld[0]
                py = lo_[1] + tnear * ld[1]
                zb = lo_[2] + tnear * ld[2] - self.lo[k, 2]
                u = np.where(axis == 0, py, px)
                win = (axis != 2) & (np.mod(zb, 3.2) > 1.0) & (np.mod(zb, 3.2) < 2.4) & (
                    np.mod(u, 3.5) > 0.8) & (np.mod(u, 3.5) < 2.6)
                surf = np.where(win, self.window_surface, surf)
            best_t = np.where(hit, tnear, best_t)
            best_s = np.where(hit, surf, best_s)
            best_cos = np.where(hit, cosv, best_cos)
        return best_t, best_s, best_cos


@dataclass
class _Cylinder:
    """Vertical cylinder (pole, trunk): axis (cx, cy), radius, z range."""

    cx: float
    cy: float
    r: float
    z0: float
    z1: float
    surface: int

    def bounds(self):
        return self.cx, self.cy, self.r, self.z0, self.z1

    def intersect(self, o, dx, dy, dz):
        ox, oy = o[0] - self.cx, o[1] - self.cy
        a = dx * dx + dy * dy
        b = 2 * (ox * dx + oy * dy)
        cc = ox * ox + oy * oy - self.r * self.r
        disc = b * b - 4 * a * cc
        ok = (disc >= 0) & (a > 1e-12)
        t = (-b - np.sqrt(np.where(ok, disc, 0))) / (2 * np.where(a > 1e-12, a, 1.0))
        z = o[2] + t * dz
        ok &= (t > 1e-6) & (z >= self.z0) & (z <= self.z1)
        t = np.where(ok, t, np.inf)
        # horizontal normal: cos incidence = |(p - axis) . d| / r
        t0 = np.where(ok, t, 0.0)
        px, py = ox + t0 * dx, oy + t0 * dy
        cosv = np.where(ok, np.abs(px * dx + py * dy) / self.r, 0.0)
        return t, np.full(dx.shape, self.surface, dtype=np.int64), np.clip(cosv, 0.0, 1.0)


@dataclass
class _Ellipsoid:
    """Axis-aligned ellipsoid (tree crown, bush): centre (3,), semi-axes (3,)."""

    centre: np.ndarray
    semi: np.ndarray
    surface: int

    def bounds(self):
        return (self.centre[0], self.centre[1], float(max(self.semi[0], self.semi[1])),
                self.centre[2] - self.semi[2], self.centre[2] + self.semi[2])

    def intersect(self, o, dx, dy, dz):
        oc = (o - self.centre) / self.semi
        ex, ey, ez = dx / self.semi[0], dy / self.semi[1], dz / self.semi[2]
        a = ex * ex + ey * ey + ez * ez
        b = 2 * (oc[0] * ex + oc[1] * ey + oc[2] * ez)
        cc = float(oc @ oc) - 1.0
        disc = b * b - 4 * a * cc
        ok = disc >= 0
        t = (-b - np.sqrt(np.where(ok, disc, 0))) / (2 * a)
        ok &= t > 1e-6
        t0 = np.where(ok, t, 0.0)
        t = np.where(ok, t, np.inf)
        # gradient of the implicit function gives the normal
        nx = (oc[0] + t0 * ex) / self.semi[0]
        ny = (oc[1] + t0 * ey) / self.semi[1]
        nz = (oc[2] + t0 * ez) / self.semi[2]
        nn = np.sqrt(nx * nx + ny * ny + nz * nz) + 1e-12
        cosv = np.where(ok, np.abs(nx * dx + ny * dy + nz * dz) / nn, 0.0)
        return t, np.full(dx.shape, self.surface, dtype=np.int64), cosv


# ----------------------------------------------------------------------------- scene


@dataclass
class _Ground:
    """Road along x between y_mid +- half (surface z = z0 + sx x + sy y), raised sidewalk
    level (+curb) outside it, an optional cross street x in [xc0, xc1] at road level."""

    z0: float
    sx: float
    sy: float
    y_mid: float
    half: float
    curb: float
    cross: tuple | None
    road: int
    lane: int
    sidewalk: int
    curb_s: int

    def height(self, x, y):
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        raised = np.abs(y - self.y_mid) > self.half
        if self.cross is not None:
            raised &= ~((x >= self.cross[0]) & (x <= self.cross[1]))
        return self.z0 + self.sx * x + self.sy * y + np.where(raised, self.curb, 0.0)

    def _on_road(self, x, y):
        m = np.abs(y - self.y_mid) <= self.half
        if self.cross is not None:
            m |= (x >= self.cross[0]) & (x <= self.cross[1])
        return m

    def intersect(self, o, dx, dy, dz):
        nz = math.sqrt(1 + self.sx ** 2 + self.sy ** 2)
        den = dz - self.sx * dx - self.sy * dy
        den = np.where(np.abs(den) < 1e-12, -1e-12, den)
        cos_plane = np.abs(den) / nz
        best_t = np.full(dx.shape, np.inf)
        best_s = np.full(dx.shape, -1, dtype=np.int64)
        best_c = np.zeros(dx.shape)

        def take(t, ok, surf, cosv):
            nonlocal best_t, best_s, best_c
            ok = ok & (t > 1e-6) & (t < best_t)
            best_t = np.where(ok, t, best_t)
            best_s = np.where(ok, surf, best_s)
            best_c = np.where(ok, cosv, best_c)

        for level in (0.0, self.curb):
            t = (self.z0 + level + self.sx * o[0] + self.sy * o[1] - o[2]) / den
            x, y = o[0] + t * dx, o[1] + t * dy
            road = self._on_road(x, y)
            if level == 0.0:
                # lane markings: dashed centre line, solid edge lines
                yc = np.abs(y - self.y_mid)
                mark = ((yc < 0.07) & (np.mod(x, 9.0) < 3.0)) | (np.abs(yc - (self.half - 0.3)) < 0.07)
                if self.cross is not None:
                    mark &= ~((x >= self.cross[0]) & (x <= self.cross[1]))
                take(t, road, np.where(mark, self.lane, self.road), cos_plane)
            else:
                take(t, ~road, self.sidewalk, cos_plane)
        # curb faces: vertical planes y = y_mid +- half (and x = xc0 / xc1 at the cross street)
        faces = [(1, self.y_mid - self.half), (1, self.y_mid + self.half)]
        if self.cross is not None:
            faces += [(0, self.cross[0]), (0, self.cross[1])]
        for axis, v in faces:
            d = dy if axis == 1 else dx
            d = np.where(np.abs(d) < 1e-12, 1e-12, d)
            t = (v - o[axis]) / d
            x, y, z = o[0] + t * dx, o[1] + t * dy, o[2] + t * dz
            zg = self.z0 + self.sx * x + self.sy * y
            ok = (z >= zg) & (z <= zg + self.curb)
            if axis == 1 and self.cross is not None:
                ok &= ~((x >= self.cross[0]) & (x <= self.cross[1]))
            if axis == 0:
                ok &= np.abs(y - self.y_mid) > self.half
            take(t, ok, self.curb_s, np.abs(d))
        return best_t, best_s, best_c


@dataclass
class _Scene:
    ground: _Ground
    prims: list
    surfaces: _Surfaces
    boxes: np.ndarray  # (M, 7) float64
    names: list = field(default_factory=list)


def _rect_parts(parts):
    """parts: list of (x0, x1, y0, y1, z0, z1, side, top[, windows]) -> BoxGroup arrays."""
    lo = np.array([[p[0], p[2], p[4]] for p in parts], dtype=np.float64)
    hi = np.array([[p[1], p[3], p[5]] for p in parts], dtype=np.float64)
    side = np.array([p[6] for p in parts], dtype=np.int64)
    top = np.array([p[7] for p in parts], dtype=np.int64)
    return lo, hi, side, top


def _object_group(cls: str, box: np.ndarray, inst: int, surf: _Surfaces) -> _BoxGroup:
    """Build the parts of a labelled object inside its box (x, y, z, l, w, h, yaw)."""
    l, w, h = box[3], box[4], box[5]
    m = PART_INSET
    hx, hy, hz = l / 2 - m, w / 2 - m, h / 2
    b = -hz  # box bottom in the frame
    if cls == "Car":
        paint = surf.new("car_paint", inst)
        glass = surf.new("car_glass", inst)
        tyre = surf.new("tyre", inst)
        zb = b + 0.62 * h
        wr = 0.31
        wx = hx - 0.55
        parts = [
            (-hx, hx, -hy, hy, b + 0.28, zb, paint, paint),
            (-0.36 * l, 0.2 * l, -hy + 0.08, hy - 0.08, zb, hz - 0.03, glass, paint),
        ]
        for sx in (-1, 1):
            for sy in (-1, 1):
                yc = sy * (hy - 0.11)
                parts.append((sx * wx - wr, sx * wx + wr, yc - 0.11, yc + 0.11, b + 0.03, b + 0.3, tyre, tyre))
    elif cls == "Pedestrian":
        cloth = surf.new("person", inst)
        skin = surf.new("person", inst)
        legs_x = min(0.16, hx)
        parts = [
            (-legs_x, legs_x, -min(0.17, hy), min(0.17, hy), b + 0.03, b + 0.47 * h, cloth, cloth),
            (-0.13, 0.13, -min(0.24, hy), min(0.24, hy), b + 0.47 * h, b + 0.82 * h, cloth, cloth),
            (-0.1, 0.1, -0.09, 0.09, b + 0.82 * h + 0.02, hz - 0.03, skin, skin),
        ]
    elif cls == "Cyclist":
        bike = surf.new("bicycle", inst)
        rider = surf.new("person", inst)
        parts = [
            (-hx, hx, -0.05, 0.05, b + 0.03, b + 0.62, bike, bike),
            (-0.1, 0.25, -min(0.15, hy), min(0.15, hy), b + 0.35, b + 0.9, rider, rider),
            (-0.32, 0.08, -min(0.22, hy), min(0.22, hy), b + 0.9, b + 0.82 * h, rider, rider),
            (-0.05, 0.15, -0.09, 0.09, b + 0.82 * h + 0.02, hz - 0.03, rider, rider),
        ]
    else:  # pragma: no cover
        raise ValueError(cls)
    lo, hi, side, top = _rect_parts(parts)
    return _BoxGroup(box[:3].copy(), float(box[6]), lo, hi, side, top)


def _build_scene(rng: np.random.Generator, n_objects: int | None, ego_xs=(0.0,)) -> _Scene:
    """Random street scene; ``ego_xs`` are the sensor's x positions (kept free of objects)."""
    surf = _Surfaces(rng)
    # ground: road along x, ego in the right-hand lane (y = 0), road centre to its left
    half = float(rng.uniform(4.2, 6.5))
    y_mid = float(rng.uniform(1.6, 2.0))
    cross = None
    if rng.random() < 0.5:
        xc = float(rng.choice([-1, 1]) * rng.uniform(15, 45))
        cw = float(rng.uniform(8, 14))
        cross = (xc - cw / 2, xc + cw / 2)
    ground = _Ground(
        z0=-SENSOR_HEIGHT, sx=float(rng.uniform(-0.015, 0.015)), sy=float(rng.uniform(-0.005, 0.005)),
        y_mid=y_mid, half=half, curb=float(rng.uniform(0.1, 0.18)), cross=cross,
        road=surf.new("road"), lane=surf.new("lane"), sidewalk=surf.new("sidewalk"), curb_s=surf.new("curb"),
    )
    prims: list = []
    # BEV circles (x, y, radius) kept free: the ego car at every sweep position first
    occupied: list[tuple[float, float, float]] = [(ex - 0.9, 0.0, 2.6) for ex in ego_xs]

    def in_cross(x0, x1, margin=1.0):
        return cross is not None and x1 > cross[0] - margin and x0 < cross[1] + margin

    def free(x, y, r):
        return all((x - a) ** 2 + (y - b) ** 2 > (r + c) ** 2 for a, b, c in occupied)

    # the sensor's mounting posts block a few low rays (no return); placed per sweep
    ego = surf.new("ego")
    for _ in MOUNT_POSTS:
        prims.append(_Cylinder(0.0, 0.0, 0.0, 0.0, 0.0, ego))

    sidewalk_w = {}
    for side in (-1, 1):
        edge = y_mid + side * half  # curb line
        sw = float(rng.uniform(2.0, 4.0))
        sidewalk_w[side] = sw
        # street furniture on the sidewalk: poles near the curb, trees a bit further in
        x = float(rng.uniform(-100, -85))
        while x < 100:
            if not in_cross(x - 1, x + 1) and abs(x) > 1.5:
                kind = rng.random()
                if kind < 0.45:
                    y = edge + side * 0.5
                    r = float(rng.uniform(0.07, 0.15))
                    zg = float(ground.height(x, y))
                    prims.append(_Cylinder(x, y, r, zg - 0.1, zg + float(rng.uniform(4, 9)), surf.new("pole")))
                    occupied.append((x, y, r + 0.1))
                elif kind < 0.85:
                    y = edge + side * min(1.3, sw / 2)
                    r = float(rng.uniform(0.12, 0.3))
                    zg = float(ground.height(x, y))
                    th = float(rng.uniform(2.6, 3.6))
                    prims.append(_Cylinder(x, y, r, zg - 0.1, zg + th + 0.5, surf.new("trunk")))
                    a = float(rng.uniform(1.3, 3.0))
                    c = float(rng.uniform(1.3, 2.6))
                    prims.append(_Ellipsoid(np.array([x, y, zg + th + c * 0.9]), np.array([a, a * float(rng.uniform(0.8, 1.2)), c]),
                                            surf.new("foliage")))
                    occupied.append((x, y, r + 0.1))
            x += float(rng.uniform(9, 28))
        # small unlabelled clutter: bollards, bins, utility boxes, benches, parked bicycles, signs
        x = float(rng.uniform(-80, -70))
        while x < 80:
            x += float(rng.uniform(3, 14))
            if in_cross(x - 2, x + 2) or abs(x) < 1.5:
                continue
            kind = rng.random()
            if kind < 0.25:  # bollard at the curb
                y, r = edge + side * 0.3, float(rng.uniform(0.06, 0.1))
                if not free(x, y, r):
                    continue
                zg = float(ground.height(x, y))
                prims.append(_Cylinder(x, y, r, zg - 0.1, zg + float(rng.uniform(0.8, 1.1)), surf.new("pole")))
                occupied.append((x, y, r + 0.1))
                continue
            y = edge + side * float(rng.uniform(0.5, max(0.6, sw - 0.5)))
            if kind < 0.45:  # bin
                l_, w_, h_, mat = float(rng.uniform(0.5, 0.7)), float(rng.uniform(0.5, 0.7)), float(rng.uniform(0.9, 1.2)), "wall"
            elif kind < 0.6:  # utility box
                l_, w_, h_, mat = float(rng.uniform(0.6, 1.0)), float(rng.uniform(0.4, 0.6)), float(rng.uniform(1.0, 1.5)), "pole"
            elif kind < 0.75:  # bench
                l_, w_, h_, mat = float(rng.uniform(1.5, 2.0)), 0.5, float(rng.uniform(0.45, 0.8)), "wall"
            elif kind < 0.9:  # parked bicycle
                l_, w_, h_, mat = 1.7, 0.1, 1.0, "bicycle"
            else:  # sign post with a plate
                l_, w_, h_, mat = 0.6, 0.06, float(rng.uniform(2.2, 3.0)), "pole"
            r = 0.5 * math.hypot(l_, w_) + 0.1
            if not free(x, y, r):
                continue
            zg = float(ground.height(x, y))
            m_ = surf.new(mat)
            yaw = float(rng.uniform(-0.2, 0.2)) + (math.pi / 2 if rng.random() < 0.3 else 0.0)
            if kind >= 0.9:
                lo = np.array([[-0.04, -0.04, -0.1], [-l_ / 2, -w_ / 2, h_ - 0.6]])
                hi = np.array([[0.04, 0.04, h_], [l_ / 2, w_ / 2, h_]])
                sides = np.array([m_, m_])
            else:
                lo = np.array([[-l_ / 2, -w_ / 2, -0.1]])
                hi = np.array([[l_ / 2, w_ / 2, h_]])
                sides = np.array([m_])
            prims.append(_BoxGroup(np.array([x, y, zg]), yaw, lo, hi, sides, sides))
            occupied.append((x, y, r))
        # a row of buildings, walls, hedges and gaps behind the sidewalk
        x = float(rng.uniform(-125, -110))
        while x < 120:
            length = float(rng.uniform(8, 32))
            x0, x1 = x, x + length
            x = x1 + (float(rng.uniform(0.5, 6)) if rng.random() < 0.3 else 0.0)
            if in_cross(x0, x1, margin=2.0):  # stop at the cross street, resume after it
                x = max(x, cross[1] + 2.0)
                if x0 > cross[0] - 8.0:
                    continue
                x1 = cross[0] - 2.0
                length = x1 - x0
            kind = rng.random()
            back = edge + side * sw  # back of the sidewalk
            xm = (x0 + x1) / 2
            zg = float(ground.height(xm, back + side * 1.0))
            if kind < 0.65:  # building
                setback = float(rng.uniform(0.0, 3.0)) if rng.random() < 0.5 else 0.0
                depth = float(rng.uniform(8, 20))
                height = float(rng.uniform(4, 20))
                yn = back + side * setback  # the facade facing the street
                yc = yn + side * depth / 2
                lo = np.array([[-length / 2, -depth / 2, -1.0]])
                hi = np.array([[length / 2, depth / 2, height]])
                facade = surf.new("facade")
                grp = _BoxGroup(np.array([xm, yc, zg]), float(rng.normal(0, 0.015)), lo, hi,
                                np.array([facade]), np.array([surf.new("roof")]), np.array([True]), surf.new("window"))
                prims.append(grp)
                if setback > 2.0 and rng.random() < 0.6:  # bushes in the front yard
                    for _ in range(int(rng.integers(1, 4))):
                        bx = float(rng.uniform(x0 + 1, x1 - 1))
                        by = back + side * float(rng.uniform(0.6, setback - 0.6))
                        s = float(rng.uniform(0.4, 1.0))
                        prims.append(_Ellipsoid(np.array([bx, by, float(ground.height(bx, by)) + 0.2 * s]),
                                                np.array([s * 1.3, s, s * float(rng.uniform(0.6, 1.0))]), surf.new("foliage")))
            elif kind < 0.8:  # wall or fence
                height = float(rng.uniform(0.8, 2.5))
                yc = back + side * float(rng.uniform(0.2, 1.5))
                lo = np.array([[-length / 2, -0.12, -0.5]])
                hi = np.array([[length / 2, 0.12, height]])
                s_ = surf.new("wall")
                prims.append(_BoxGroup(np.array([xm, yc, zg]), 0.0, lo, hi, np.array([s_]), np.array([s_])))
            elif kind < 0.92:  # hedge
                height = float(rng.uniform(0.7, 1.8))
                yc = back + side * float(rng.uniform(0.6, 1.5))
                lo = np.array([[-length / 2, -0.5, -0.3]])
                hi = np.array([[length / 2, 0.5, height]])
                s_ = surf.new("foliage")
                prims.append(_BoxGroup(np.array([xm, yc, zg]), 0.0, lo, hi, np.array([s_]), np.array([s_])))
            else:  # an open patch (lawn, field) with scattered bushes the sensor sees between
                for _ in range(int(rng.integers(2, 9))):
                    bx = float(rng.uniform(x0, x1))
                    by = back + side * float(rng.uniform(0.8, 12.0))
                    sz = float(rng.uniform(0.4, 1.3))
                    prims.append(_Ellipsoid(np.array([bx, by, float(ground.height(bx, by)) + 0.2 * sz]),
                                            np.array([sz * float(rng.uniform(0.8, 1.6)), sz, sz * float(rng.uniform(0.5, 1.0))]),
                                            surf.new("foliage")))

    # the street may end (a bend, a T-junction) in a row of buildings across it
    x_lim = [-MAX_RANGE, MAX_RANGE]
    for k, end in enumerate((-1, 1)):
        if rng.random() < 0.5:
            xe = end * float(rng.uniform(55, 110))
            depth = float(rng.uniform(10, 20))
            width = 2 * half + 60.0
            lo = np.array([[-depth / 2, -width / 2, -1.0]])
            hi = np.array([[depth / 2, width / 2, float(rng.uniform(6, 20))]])
            xc = xe + end * depth / 2
            prims.append(_BoxGroup(np.array([xc, y_mid, float(ground.height(xe, y_mid))]), 0.0, lo, hi,
                                   np.array([surf.new("facade")]), np.array([surf.new("roof")]), np.array([True]),
                                   surf.new("window")))
            x_lim[k] = xe - end * 3.0

    # labelled objects
    if n_objects is None:
        n_objects = int(rng.integers(30, 45))
    boxes, names = [], []
    lanes_right = [y_mid - 1.75]  # same direction as ego
    lanes_left = [y_mid + 1.75]
    if half > 6.2:
        lanes_right.append(y_mid - 4.0)
        lanes_left.append(y_mid + 4.0)
    for _ in range(n_objects):
        u = rng.random()
        cls = "Car" if u < 0.68 else ("Pedestrian" if u < 0.9 else "Cyclist")
        mean, sd = CLASS_SIZES[cls]
        lwh = np.maximum(np.array(mean) + rng.normal(0, 1, 3) * np.array(sd), np.array(mean) * 0.7)
        l, w, h = (float(v) for v in lwh)
        for _attempt in range(25):
            mode = rng.random()
            side = -1 if rng.random() < 0.5 else 1
            edge = y_mid + side * half
            on_sidewalk = False
            if cls == "Car":
                if mode < 0.6:  # parked along a curb, facing the travel direction of that side
                    x = float(rng.uniform(-70, 70))
                    y = edge - side * (w / 2 + float(rng.uniform(0.15, 0.45)))
                    yaw = (0.0 if side < 0 else math.pi) + float(rng.normal(0, 0.04))
                    if in_cross(x - l, x + l):
                        continue
                elif mode < 0.9 or cross is None:  # in traffic
                    x = float(rng.uniform(-75, 75))
                    if rng.random() < 0.5:
                        y, yaw = float(rng.choice(lanes_right)), 0.0
                    else:
                        y, yaw = float(rng.choice(lanes_left)), math.pi
                    y += float(rng.normal(0, 0.25))
                    yaw += float(rng.normal(0, 0.03))
                else:  # in the cross street
                    x = float(rng.uniform(cross[0] + 1.5, cross[1] - 1.5))
                    y = float(rng.uniform(y_mid + half + 4, y_mid + half + 45)) * side
                    yaw = side * math.pi / 2 * (1 if rng.random() < 0.5 else -1) + float(rng.normal(0, 0.03))
            elif cls == "Pedestrian":
                if mode < 0.8:  # on a sidewalk
                    x = float(rng.uniform(-45, 45))
                    y = edge + side * float(rng.uniform(0.5, sidewalk_w[side] - 0.5))
                    on_sidewalk = True
                else:  # crossing the road
                    x = float(rng.uniform(-30, 30))
                    y = y_mid + float(rng.uniform(-half + 0.5, half - 0.5))
                yaw = float(rng.uniform(-math.pi, math.pi))
            else:  # cyclist near the right edge of its lane
                x = float(rng.uniform(-50, 50))
                if rng.random() < 0.6:
                    y, yaw = y_mid - half + float(rng.uniform(0.6, 1.4)), 0.0
                else:
                    y, yaw = y_mid + half - float(rng.uniform(0.6, 1.4)), math.pi
                yaw += float(rng.normal(0, 0.08))
            r = 0.5 * math.hypot(l, w) + 0.25
            if not (x_lim[0] + r < x < x_lim[1] - r) or not free(x, y, r):
                continue
            zg = float(ground.height(x, y))
            if not on_sidewalk and cls != "Pedestrian" and abs(zg - (ground.z0 + ground.sx * x + ground.sy * y)) > 1e-9:
                continue  # a vehicle must stand on the road surface
            occupied.append((x, y, r))
            yaw = (yaw + math.pi) % (2 * math.pi) - math.pi
            box = np.array([x, y, zg + h / 2, l, w, h, yaw])
            prims.append(_object_group(cls, box, len(boxes), surf))
            boxes.append(box)
            names.append(cls)
            break
    return _Scene(ground, prims, surf, np.array(boxes, dtype=np.float64).reshape(-1, 7), names)


# ----------------------------------------------------------------------------- ray casting


class _Rays:
    """The sensor's ray grid: beams (B,) x columns (C,), top beam first."""

    def __init__(self, rng, n_beams: int, step_deg: float):
        self.elev = hdl64_elevations(n_beams)
        self.B = n_beams
        self.C = int(round(360.0 / step_deg))
        self.step = 2 * math.pi / self.C
        # per-laser azimuth offsets (< half a step) and intensity gains, fixed per scan
        off = rng.uniform(-0.45, 0.45, n_beams) * self.step
        self.gain = rng.uniform(0.85, 1.15, n_beams)
        az = -math.pi + (np.arange(self.C) + 0.5)[None, :] * self.step + off[:, None]
        ce = np.cos(self.elev)[:, None]
        self.dx = ce * np.cos(az)
        self.dy = ce * np.sin(az)
        self.dz = np.broadcast_to(np.sin(self.elev)[:, None], (self.B, self.C)).copy()

    def cull(self, o, cx, cy, rad, zlo, zhi):
        """Beam and column indices whose rays may reach a primitive's bounding cylinder."""
        ddx, ddy = cx - o[0], cy - o[1]
        d = math.hypot(ddx, ddy)
        if d <= rad + 0.05:
            cols = None
            rmin = 0.01
        else:
            ha = math.asin(rad / d)
            azc = math.atan2(ddy, ddx)
            c0 = math.floor((azc - ha + math.pi) / self.step - 0.5) - 1
            c1 = math.ceil((azc + ha + math.pi) / self.step - 0.5) + 1
            cols = None if c1 - c0 + 1 >= self.C else np.arange(c0, c1 + 1) % self.C
            rmin = d - rad
        rmax = d + rad
        zl, zh = zlo - o[2], zhi - o[2]
        el_lo = math.atan2(zl, rmin if zl < 0 else rmax)
        el_hi = math.atan2(zh, rmin if zh > 0 else rmax)
        beams = np.nonzero((self.elev >= el_lo - 1e-3) & (self.elev <= el_hi + 1e-3))[0]
        return beams, cols


def _cast(scene: _Scene, rays: _Rays, origin: np.ndarray, rng: np.random.Generator):
    """First hit of every ray from ``origin``: (t, surface, cos incidence) arrays (B, C)."""
    porosity = np.array(scene.surfaces.porosity)
    background = np.array(scene.surfaces.instance) < 0
    t, s, cosv = scene.ground.intersect(origin, rays.dx, rays.dy, rays.dz)
    for prim in scene.prims:
        cx, cy, rad, zlo, zhi = prim.bounds()
        beams, cols = rays.cull(origin, cx, cy, rad, zlo, zhi)
        if len(beams) == 0:
            continue
        rows = slice(beams[0], beams[-1] + 1)  # contiguous: elevations are monotone
        idx = (rows, slice(None)) if cols is None else (rows, cols)
        pt, ps, pc = prim.intersect(origin, rays.dx[idx], rays.dy[idx], rays.dz[idx])
        hit = pt < t[idx]
        if not hit.any():
            continue
        por = porosity[np.maximum(ps, 0)]
        if por.max() > 0:
            # porous surfaces (foliage, bicycles): some rays pass; in foliage the others stop
            # a little inside (labelled objects keep their surface, so their points stay in the box)
            u = rng.random(pt.shape)
            hit &= u >= por
            pt = pt + np.where((por > 0) & background[np.maximum(ps, 0)], u * 0.25, 0.0)
        t[idx] = np.where(hit, pt, t[idx])
        s[idx] = np.where(hit, ps, s[idx])
        cosv[idx] = np.where(hit, pc, cosv[idx])
    return t, s, cosv


def _measure(rays: _Rays, origin, t, s, cosv, scene: _Scene, rng, max_range, range_noise, dropout):
    """Turn first hits into returns: detection, dropout, noise, quantisation, reflectance."""
    albedo, drop, deep, inst = scene.surfaces.arrays()
    hit = np.isfinite(t) & (s >= 0)
    b_idx, c_idx = np.nonzero(hit)  # row-major: beam by beam (top first), columns in azimuth order
    t = t[hit]
    s = s[hit]
    # building windows: most returns come from the rooms behind the glass
    d = deep[s]
    inside = (d > 0) & (rng.random(t.shape) < GLASS_PASS)
    t = t + np.where(inside, rng.random(t.shape) * d, 0.0)
    cosv = np.clip(cosv[hit], 0.0, 1.0)
    a = albedo[s]
    speckle = np.exp(rng.normal(0.0, SPECKLE_SIGMA, t.shape))
    strength = a * (0.1 + 0.9 * np.sqrt(cosv)) * (DETECT_R0 / np.maximum(t, 1e-3)) ** 2 * speckle
    keep = (strength > 1.0) & (rng.random(t.shape) >= drop[s]) & (rng.random(t.shape) >= dropout)
    keep &= t <= max_range
    noise = np.clip(rng.normal(0.0, range_noise, t.shape), -3 * range_noise, 3 * range_noise)
    r = np.round((t + noise) / 0.002) * 0.002  # 2 mm range resolution
    refl = a * (0.6 + 0.4 * cosv) * rays.gain[b_idx] * np.exp(rng.normal(0.0, REFL_SPECKLE, t.shape))
    refl = refl - FADE_PER_M * np.maximum(t - FADE_START, 0.0)
    refl = np.round(np.clip(np.where(refl < REFL_FLOOR, 0.0, refl), 0.0, 1.0), 2)
    b_idx, c_idx, r, refl, s = b_idx[keep], c_idx[keep], r[keep], refl[keep], s[keep]
    pts = np.stack([
        origin[0] + r * rays.dx[b_idx, c_idx],
        origin[1] + r * rays.dy[b_idx, c_idx],
        origin[2] + r * rays.dz[b_idx, c_idx],
        refl,
    ], axis=1)
    return pts, inst[s], b_idx


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

    rng = np.random.default_rng(seed)
    ego_xs = [-(n_sweeps - 1 - k) * ego_speed * sweep_period for k in range(n_sweeps)]
    scene = _build_scene(rng, n_objects, ego_xs)
    rays = _Rays(rng, n_beams, azimuth_step_deg)
    pts_l, inst_l, ring_l = [], [], []
    for ox in ego_xs:
        origin = np.array([ox, 0.0, ox * scene.ground.sx])  # the sensor follows the road slope
        for post, (az, dist, rad, top) in zip(scene.prims, MOUNT_POSTS):
            post.cx = ox + dist * math.cos(math.radians(az))
            post.cy = dist * math.sin(math.radians(az))
            post.r, post.z0, post.z1 = rad, origin[2] - 1.0, origin[2] + top
        t, s, cosv = _cast(scene, rays, origin, rng)
        pts, inst, ring = _measure(rays, origin, t, s, cosv, scene, rng, max_range, range_noise, dropout)
        pts_l.append(pts)
        inst_l.append(inst)
        ring_l.append(ring)
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
