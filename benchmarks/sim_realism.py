"""How far ``pcops.sim`` scans are from real KITTI scans, statistic by statistic (issue 22).

    python benchmarks/sim_realism.py [--sim 20] [--scene-version 1|2] [--out benchmarks/results/sim_realism.json]

Pools the real KITTI scans (``../shared/data`` or ``$PCOPS_DATA``; skips with a message when
absent) and ``--sim`` simulated scans (seeds 0, 1, ...), and reports the total variation of
their horizontal-range, elevation and reflectance histograms (``pcops.sim.stats``), plus the
median points inside labelled boxes per distance bin on both sides (the real side has few
objects: it is reported, not matched).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path

import numpy as np
import torch
from common import data_root

import pcops.io
from pcops.sim import simulate_scan
from pcops.sim import stats

ROOT = Path(__file__).resolve().parents[1]


def real_scans(root: Path):
    """``[(points, boxes, names)]`` of the KITTI frames under ``root`` (labels in the LiDAR frame)."""
    out = []
    for scan in sorted((root / "velodyne").glob("*.bin")):
        frame = scan.stem
        pts = pcops.io.read_points(scan)
        boxes, names = pcops.io.read_kitti_label(root / "label_2" / f"{frame}.txt", root / "calib" / f"{frame}.txt")
        out.append((pts, boxes, names))
    return out


def report(real, sims) -> dict:
    from pcops.models.evaluate import count_points_in_boxes

    tv = stats.compare([r[0] for r in real], [s.points for s in sims])
    real_counts, real_dist = [], []
    for pts, boxes, names in real:
        if len(boxes):
            n = count_points_in_boxes(pts, boxes)
            for i, name in enumerate(names):
                if name == "Car":
                    real_counts.append(int(n[i]))
                    real_dist.append(stats.distance(boxes[i]))
    sim_counts, sim_dist = [], []
    for s in sims:
        for i, name in enumerate(s.names):
            if name == "Car" and int(s.num_points_in_box[i]) > 0:
                sim_counts.append(int(s.num_points_in_box[i]))
                sim_dist.append(stats.distance(s.boxes[i]))
    return {
        "total_variation": tv,
        "points_per_car": {
            "real": stats.points_per_object(real_counts, real_dist),
            "sim": stats.points_per_object(sim_counts, sim_dist),
        },
        "points_per_scan": {
            "real": float(np.mean([len(r[0]) for r in real])),
            "sim": float(np.mean([len(s.points) for s in sims])),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", type=int, default=20, help="simulated scans (seeds 0 ..)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_realism.json"))
    ap.add_argument("--scene-version", type=int, default=1, choices=(1, 2), help="pcops.sim scene version")
    a = ap.parse_args()
    root = data_root() / "kitti" / "training"
    if not (root / "velodyne").is_dir():
        print(f"skipped: no KITTI scans at {root}")
        return 0
    real = real_scans(root)
    sims = [simulate_scan(seed=s, scene_version=a.scene_version) for s in range(a.sim)]
    rec = report(real, sims)
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    rec.update(real_frames=len(real), sim_scans=len(sims), scene_version=a.scene_version, date=str(datetime.date.today()), commit=commit,
               torch=torch.__version__)  # fmt: skip
    for k, v in rec["total_variation"].items():
        print(f"total variation {k:14s} {v:.3f}")
    for side in ("real", "sim"):
        ppc = rec["points_per_car"][side]
        print(f"points per car ({side}): " + ", ".join(
            f"{lo:.0f}-{hi:.0f} m: {m if m is None else round(m)} (n={n})"
            for lo, hi, m, n in zip(ppc["bins"][:-1], ppc["bins"][1:], ppc["median"], ppc["n"])))  # fmt: skip
    Path(a.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
