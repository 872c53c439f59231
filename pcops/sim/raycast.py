"""Ray casting for :mod:`pcops.sim`: the scene's primitives (yawed box groups, vertical
cylinders, ellipsoids, the ground with road, sidewalks and curbs), each with its vectorised
ray intersection, and the first-hit cast of the sensor's rays into a scene."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .scene import _Scene
    from .sensor import _Rays


# ----------------------------------------------------------------------------- primitives


def _rect_parts(parts):
    """parts: list of (x0, x1, y0, y1, z0, z1, side, top[, windows]) -> BoxGroup arrays."""
    lo = np.array([[p[0], p[2], p[4]] for p in parts], dtype=np.float64)
    hi = np.array([[p[1], p[3], p[5]] for p in parts], dtype=np.float64)
    side = np.array([p[6] for p in parts], dtype=np.int64)
    top = np.array([p[7] for p in parts], dtype=np.int64)
    return lo, hi, side, top


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
        corners_r = np.sqrt(
            np.maximum(self.lo[:, 0] ** 2, self.hi[:, 0] ** 2) + np.maximum(self.lo[:, 1] ** 2, self.hi[:, 1] ** 2)
        )
        return (
            self.centre[0],
            self.centre[1],
            float(corners_r.max()),
            self.centre[2] + float(self.lo[:, 2].min()),
            self.centre[2] + float(self.hi[:, 2].max()),
        )

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
                win = (
                    (axis != 2)
                    & (np.mod(zb, 3.2) > 1.0)
                    & (np.mod(zb, 3.2) < 2.4)
                    & (np.mod(u, 3.5) > 0.8)
                    & (np.mod(u, 3.5) < 2.6)
                )
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
        return (
            self.centre[0],
            self.centre[1],
            float(max(self.semi[0], self.semi[1])),
            self.centre[2] - self.semi[2],
            self.centre[2] + self.semi[2],
        )

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


# ----------------------------------------------------------------------------- ground


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
        nz = math.sqrt(1 + self.sx**2 + self.sy**2)
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


# ----------------------------------------------------------------------------- ray casting


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
