"""Run the shipped PointPillars weights on real KITTI frames and report every labelled object.

Usage: ``python benchmarks/real_scans.py [KITTI_TRAINING_DIR] [--out benchmarks/results/real_scans.json]``
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

import numpy as np
import torch

import pcops
import pcops.io
from pcops.models.evaluate import count_points_in_boxes
from pcops.models.pointpillars import PointPillars

REPO = Path(__file__).resolve().parents[1]


def in_fov(boxes: torch.Tensor, calib) -> np.ndarray:
    rect = calib.lidar_to_rect(boxes[:, :3].numpy())
    uvw = np.concatenate([rect, np.ones((len(rect), 1))], 1) @ calib.P2.T
    u = uvw[:, 0] / uvw[:, 2]
    return (uvw[:, 2] > 0) & (u >= 0) & (u < 1242)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?", default=str(REPO.parent / "shared" / "data" / "kitti" / "training"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "real_scans.json"))
    args = ap.parse_args()
    root = Path(args.root)
    if not (root / "velodyne").is_dir():
        print(f"skipped: no KITTI folder at {root}")
        return 0
    model = PointPillars.pretrained()
    cfg = model.config
    rows, fps = [], []
    for scan in sorted((root / "velodyne").glob("*.bin")):
        frame = scan.stem
        pts = pcops.io.read_points(scan)
        boxes, names = pcops.io.read_kitti_label(root / "label_2" / f"{frame}.txt", root / "calib" / f"{frame}.txt")
        calib = pcops.io.read_calib(root / "calib" / f"{frame}.txt")
        det = model(pts)
        n = int(det.count[0])
        db, ds, dl = det.boxes[0, :n], det.scores[0, :n], det.labels[0, :n]
        iou = pcops.boxes_iou_bev(boxes, db) if len(boxes) and n else torch.zeros(len(boxes), n)
        npts = count_points_in_boxes(pts, boxes)
        for i, name in enumerate(names):
            j = int(iou[i].argmax()) if n else -1
            best = float(iou[i, j]) if n else 0.0
            rows.append(
                {
                    "frame": frame,
                    "class": name,
                    "distance_m": round(float(torch.linalg.norm(boxes[i, :2])), 1),
                    "points_in_box": int(npts[i]),
                    "best_bev_iou": round(best, 3),
                    "det_class": cfg.class_names[int(dl[j]) - 1] if n and best > 0 else None,
                    "det_score": round(float(ds[j]), 3) if n and best > 0 else None,
                    "detected": bool(best >= 0.5 and n and float(ds[j]) >= 0.3),
                }
            )
        r = cfg.point_cloud_range
        strong = (ds >= 0.5).numpy()
        fov = in_fov(db.cpu(), calib) if n else np.zeros(0, bool)
        overlap = (iou.max(dim=0).values > 0).numpy() if len(boxes) and n else np.zeros(n, bool)
        for j in np.nonzero(strong & fov & ~overlap)[0]:
            fps.append(
                {
                    "frame": frame,
                    "class": cfg.class_names[int(dl[j]) - 1],
                    "score": round(float(ds[j]), 3),
                    "x": round(float(db[j, 0]), 1),
                    "y": round(float(db[j, 1]), 1),
                }
            )
        print(f"{frame}: {len(names)} labelled, {n} detections, {int(strong.sum())} with score >= 0.5")
    for row in rows:
        print(row)
    print("false positives (score >= 0.5, camera view, no overlap):", fps)
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
        "objects": rows,
        "false_positives": fps,
        "range": list(r),
        "rule": "detected: BEV IoU >= 0.5 with any detection of score >= 0.3",
    }
    Path(args.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
