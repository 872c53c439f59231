"""Measurable statistics of LiDAR scans, to compare the simulator with real scans.

``scan_histograms`` pools normalised histograms over scans in the sensor frame (KITTI's: the
origin at the sensor): horizontal range, beam elevation, reflectance, and points per labelled
object against its distance; ``total_variation`` and ``compare`` give the distance between two
sets of scans per statistic (0: the same distribution, 1: disjoint). Used by
``benchmarks/sim_realism.py`` and its test (issue 22: improve the simulator by these, not by
the few labelled real boxes).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

__all__ = ["BINS", "scan_histograms", "total_variation", "compare", "points_per_object"]

BINS = {
    "range_m": np.arange(0.0, 80.5, 1.0),  # horizontal range sqrt(x² + y²)
    "elevation_deg": np.arange(-26.0, 4.5, 0.5),  # atan2(z, range) seen from the sensor (beams ~0.4° apart)
    "intensity": np.linspace(0.0, 1.0, 51),
}
DISTANCE_BINS = np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0])


def _xyzr(points) -> np.ndarray:
    pts = points.detach().cpu().numpy() if hasattr(points, "detach") else np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] < 4:
        raise ValueError(f"points: expected an (N, >=4) array of x, y, z, reflectance, got shape {pts.shape}")
    pts = pts[:, :4].astype(np.float64)
    return pts[np.isfinite(pts).all(axis=1)]


def scan_histograms(scans: Iterable) -> dict[str, np.ndarray]:
    """Normalised histograms (summing to 1) of the points of all ``scans`` (each ``(N, >=4)``),
    one per entry of :data:`BINS`; values outside a statistic's bins are not counted."""
    counts = {k: np.zeros(len(b) - 1) for k, b in BINS.items()}
    for scan in scans:
        p = _xyzr(scan)
        r = np.hypot(p[:, 0], p[:, 1])
        values = {"range_m": r, "elevation_deg": np.degrees(np.arctan2(p[:, 2], r)), "intensity": p[:, 3]}
        for k, v in values.items():
            counts[k] += np.histogram(v, BINS[k])[0]
    return {k: c / c.sum() if c.sum() else c for k, c in counts.items()}


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """``0.5 Σ |p - q|`` of two normalised histograms over the same bins."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p, q: expected histograms over the same bins, got shapes {p.shape} and {q.shape}")
    return float(0.5 * np.abs(p - q).sum())


def compare(real: Sequence, sim: Sequence) -> dict[str, float]:
    """Total variation between the pooled histograms of ``real`` and ``sim`` scans, per statistic."""
    hr, hs = scan_histograms(real), scan_histograms(sim)
    return {k: total_variation(hr[k], hs[k]) for k in BINS}


def points_per_object(counts: Sequence[int], distances: Sequence[float]) -> dict[str, list]:
    """Median points in the labelled boxes per distance bin (:data:`DISTANCE_BINS`): ``{"bins":
    edges, "median": [...], "n": [...]}`` (``None`` where a bin has no object)."""
    c, d = np.asarray(counts, dtype=np.float64), np.asarray(distances, dtype=np.float64)
    med, n = [], []
    for lo, hi in zip(DISTANCE_BINS[:-1], DISTANCE_BINS[1:]):
        sel = (d >= lo) & (d < hi)
        n.append(int(sel.sum()))
        med.append(float(np.median(c[sel])) if sel.any() else None)
    return {"bins": DISTANCE_BINS.tolist(), "median": med, "n": n}


def distance(box) -> float:
    """Horizontal distance of a box centre ``(x, y, ...)`` from the sensor."""
    return math.hypot(float(box[0]), float(box[1]))
