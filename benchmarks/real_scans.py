"""Run the shipped PointPillars weights on real KITTI frames and report every labelled object.

Usage: ``python benchmarks/real_scans.py [KITTI_TRAINING_DIR] [--out benchmarks/results/real_scans.json]``
(the JSON record of ``python -m pcops.models realscan``, ``pcops.models.realscan``)
(default: ``../shared/data/kitti/training``; skips with a message when absent). Per labelled object
(camera-frame KITTI labels converted to the LiDAR frame): class, distance, LiDAR points in its box,
the best BEV IoU with a detection of any class and that detection's class and score, and
detected = BEV IoU >= 0.5 with score >= 0.3; plus the detections with score >= 0.5 inside the
camera's field of view that overlap no labelled object (false positives by issue 22's rule).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import torch

from pcops.models.pointpillars import PointPillars
from pcops.models.realscan import evaluate_real_scans, print_report

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?", default=str(REPO.parent / "shared" / "data" / "kitti" / "training"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "real_scans.json"))
    args = ap.parse_args()
    root = Path(args.root)
    if not (root / "velodyne").is_dir():
        print(f"skipped: no KITTI folder at {root}")
        return 0
    rec = evaluate_real_scans(PointPillars.pretrained(), root)
    print_report(rec)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
    except OSError:
        commit = None
    rec = {
        "weights": "models/weights/pointpillars_sim.pt",
        "device": "cpu (" + platform.processor() + ")",
        "torch": torch.__version__,
        "commit": commit,
        **rec,
    }
    Path(args.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
