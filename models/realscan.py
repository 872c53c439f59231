"""Run a detector on real KITTI-format scans and report every labelled object (issue 22's rule).

``python -m pcops.models realscan --data KITTI_TRAINING_DIR [--weights W] [--out DIR]`` prints,
per labelled object (camera-frame KITTI labels converted to the LiDAR frame): class, distance,
LiDAR points inside its box, the best BEV IoU with a detection of any class with that
detection's class and score, and whether it is detected (BEV IoU ≥ ``--iou`` with a detection
of score ≥ ``--score``); then the false positives: detections of score ≥ ``--fp-score`` inside
the camera's field of view that overlap no labelled object (DontCare, Van, Truck included).
With ``--out``: ``realscan.json`` and a bird's-eye view per scan (``<frame>_bev.png``, needs
matplotlib).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

__all__ = ["in_camera_view", "evaluate_real_scans"]

IMAGE_WIDTH = 1242  # KITTI's left colour camera


def in_camera_view(boxes: torch.Tensor, calib) -> np.ndarray:
    """``(M,)`` bool: box centres in front of the camera and inside the image's columns."""
    if len(boxes) == 0:
        return np.zeros(0, dtype=bool)
    rect = calib.lidar_to_rect(boxes[:, :3].numpy())
    uvw = np.concatenate([rect, np.ones((len(rect), 1))], 1) @ calib.P2.T
    u = uvw[:, 0] / uvw[:, 2]
    return (uvw[:, 2] > 0) & (u >= 0) & (u < IMAGE_WIDTH)


def evaluate_real_scans(
    model,
    root,
    *,
    score: float = 0.3,
    fp_score: float = 0.5,
    iou: float = 0.5,
    out=None,
    pictures: bool = True,
) -> dict:
    """The per-object table and false positives of ``model`` on every scan of a KITTI-format
    folder ``root`` (``velodyne/``, ``label_2/``, ``calib/``). Returns ``{"objects": [...],
    "false_positives": [...], "rule": ...}``; with ``out`` also writes them and the pictures."""
    import pcops
    import pcops.io

    from .evaluate import count_points_in_boxes

    root = Path(root)
    scans = sorted((root / "velodyne").glob("*.bin"))
    if not scans:
        raise ValueError(f"root: no velodyne/*.bin scans under {root}")
    for name in ("label_2", "calib"):
        if not (root / name).is_dir():
            raise ValueError(
                f"root: {root} has no {name}/ folder (a KITTI training folder has velodyne/, label_2/, calib/)"
            )
    device = next(model.parameters()).device
    names_of = model.config.class_names
    out = Path(out) if out is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    rows, fps = [], []
    for scan in scans:
        frame = scan.stem
        pts = pcops.io.read_points(scan)
        boxes, names = pcops.io.read_kitti_label(root / "label_2" / f"{frame}.txt", root / "calib" / f"{frame}.txt")
        calib = pcops.io.read_calib(root / "calib" / f"{frame}.txt")
        with torch.no_grad():
            det = model(pts.to(device))
        n = int(det.count[0])
        db, ds, dl = det.boxes[0, :n].float().cpu(), det.scores[0, :n].float().cpu(), det.labels[0, :n].cpu()
        ious = pcops.boxes_iou_bev(boxes, db) if len(boxes) and n else torch.zeros(len(boxes), n)
        npts = count_points_in_boxes(pts, boxes) if len(boxes) else []
        for i, name in enumerate(names):
            j = int(ious[i].argmax()) if n else -1
            best = float(ious[i, j]) if n else 0.0
            rows.append(
                {
                    "frame": frame,
                    "class": name,
                    "distance_m": round(float(torch.linalg.norm(boxes[i, :2])), 1),
                    "points_in_box": int(npts[i]),
                    "best_bev_iou": round(best, 3),
                    "det_class": names_of[int(dl[j]) - 1] if n and best > 0 else None,
                    "det_score": round(float(ds[j]), 3) if n and best > 0 else None,
                    "detected": bool(n and best >= iou and float(ds[j]) >= score),
                }
            )
        strong = (ds >= fp_score).numpy()
        overlap = (ious.max(dim=0).values > 0).numpy() if len(boxes) and n else np.zeros(n, dtype=bool)
        for j in np.nonzero(strong & in_camera_view(db, calib) & ~overlap)[0]:
            fps.append(
                {
                    "frame": frame,
                    "class": names_of[int(dl[j]) - 1],
                    "score": round(float(ds[j]), 3),
                    "x": round(float(db[j, 0]), 1),
                    "y": round(float(db[j, 1]), 1),
                }
            )
        if out is not None and pictures:
            from pcops import viz

            keep = ds >= score
            viz.draw_bev(
                pts,
                db[keep],
                boxes,
                out / f"{frame}_bev.png",
                scores=ds[keep],
                classes=[names_of[int(c) - 1] for c in dl[keep]],
                gt_labels=list(names),
                detector_range=model.config.point_cloud_range,
                title=f"KITTI {frame}: detections with score >= {score} (solid), labels (dashed)",
            )
    rule = (
        f"detected: BEV IoU >= {iou} with a detection of score >= {score}; false positive: score >= {fp_score}, "
        "inside the camera's view, overlapping no labelled object"
    )
    rec = {"objects": rows, "false_positives": fps, "rule": rule, "range": list(model.config.point_cloud_range)}
    if out is not None:
        (out / "realscan.json").write_text(json.dumps(rec, indent=1))
    return rec


def print_report(rec: dict) -> None:
    """The per-object table and the false positives, as text."""
    print(f"{'frame':7s} {'class':11s} {'dist m':>6s} {'points':>6s} {'IoU':>5s} {'detection':>16s} detected")
    for r in rec["objects"]:
        det = f"{r['det_class']} {r['det_score']}" if r["det_class"] else "-"
        print(
            f"{r['frame']:7s} {r['class']:11s} {r['distance_m']:6.1f} {r['points_in_box']:6d} "
            f"{r['best_bev_iou']:5.2f} {det:>16s} {'yes' if r['detected'] else 'no'}"
        )
    print(f"false positives ({rec['rule'].split('; ')[1]}): {len(rec['false_positives'])}")
    for f in rec["false_positives"]:
        print(f"  {f['frame']} {f['class']} score {f['score']} at x {f['x']} y {f['y']}")
