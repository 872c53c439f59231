"""The sensor of :mod:`pcops.sim`: the HDL-64E-like beam table, the ray grid (with the
culling of rays against a primitive's bounds) and the measurement model that turns first hits
into returns (detection, dropout, range noise, quantisation, reflectance)."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_int

if TYPE_CHECKING:
    from .scene import _Scene


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
# scene version 2's reflectance (issue 22), fitted to the two real KITTI scans' histograms
# (benchmarks/sim_realism.py): surfaces 15 % brighter, and returns that read 0 (dark or weak) with
# a per-material probability (scene.ZERO_READING_V2)
REFL_GAIN_V2 = 1.15
# scene version 2's laser head (fitted to the real scans' elevations: the top beam reads +2.33 deg
# at 30-50 m and +4 deg at 6 m, i.e. +2 deg from 0.21 m above the origin; the lowest ground points
# read -23.7 deg): the lower block ends at -24.33 deg (the data sheet's field of view), and the
# upper and lower blocks' emitters sit this far above the sensor origin, metres
LOWEST_BEAM_V2 = -24.33
BLOCK_HEIGHTS_V2 = (0.21, 0.05)
# sensor mounting posts: (azimuth deg, distance m, radius m, top z relative to the sensor m)
MOUNT_POSTS = tuple((az, 0.9, 0.12, -0.25) for az in (45.0, -45.0, 135.0, -135.0))


def hdl64_elevations(n_beams: int = 64, version: int = 1) -> np.ndarray:
    """Beam elevations in radians, top beam first: the HDL-64E table for 64 beams (upper
    block +2..-8.33 deg at 1/3 deg, lower block -8.83..-24.9 deg; ``version`` 2: down to the
    data sheet's -24.33 deg), interpolated over the beam index for other counts (keeping the
    field of view and the denser upper block)."""
    n_beams = check_int("n_beams", n_beams, min_value=1)
    upper = 2.0 - np.arange(32) / 3.0
    lower = np.linspace(-8.83, -24.9 if version == 1 else LOWEST_BEAM_V2, 32)
    table = np.concatenate([upper, lower])
    if n_beams == 64:
        deg = table
    else:
        deg = np.interp(np.linspace(0, 63, n_beams), np.arange(64), table)
    return np.radians(deg)


# ----------------------------------------------------------------------------- rays


class _Rays:
    """The sensor's ray grid: beams (B,) x columns (C,), top beam first."""

    def __init__(self, rng, n_beams: int, step_deg: float, version: int = 1):
        self.elev = hdl64_elevations(n_beams, version)
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

    def blocks(self):
        """Scene version 2: ``(first beam, rays of the block, emitter height)`` of the upper and
        lower blocks (the first and second half of the beams), each a view of these rays."""
        half = (self.B + 1) // 2
        out = []
        for (b0, b1), dz in zip(((0, half), (half, self.B)), BLOCK_HEIGHTS_V2):
            if b1 > b0:
                view = copy.copy(self)
                view.elev, view.gain = self.elev[b0:b1], self.gain[b0:b1]
                view.dx, view.dy, view.dz = self.dx[b0:b1], self.dy[b0:b1], self.dz[b0:b1]
                view.B = b1 - b0
                out.append((b0, view, dz))
        return out

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


def _measure(rays: _Rays, origin, t, s, cosv, scene: _Scene, rng, max_range, range_noise, dropout, version=1):
    """Turn first hits into returns: detection, dropout, noise, quantisation, reflectance
    (``version`` 2: the reflectance model of ``REFL_GAIN_V2``; version 1 draws what it always drew)."""
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
    refl = refl * (REFL_GAIN_V2 if version > 1 else 1.0) - FADE_PER_M * np.maximum(t - FADE_START, 0.0)
    if version > 1:
        refl = np.where(rng.random(t.shape) < np.asarray(scene.surfaces.zero_reading)[s], 0.0, refl)
    refl = np.round(np.clip(np.where(refl < REFL_FLOOR, 0.0, refl), 0.0, 1.0), 2)
    b_idx, c_idx, r, refl, s = b_idx[keep], c_idx[keep], r[keep], refl[keep], s[keep]
    pts = np.stack(
        [
            origin[0] + r * rays.dx[b_idx, c_idx],
            origin[1] + r * rays.dy[b_idx, c_idx],
            origin[2] + r * rays.dz[b_idx, c_idx],
            refl,
        ],
        axis=1,
    )
    return pts, inst[s], b_idx
