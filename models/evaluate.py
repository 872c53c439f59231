"""KITTI-style average precision for 3-D detectors: AP|R40 in BEV and 3-D, per class and by range.

Definition (documented because the simulator has no camera, so KITTI's 2-D-box difficulty levels
do not exist):

* **AP|R40**: precision interpolated (the maximum precision at any recall ``>= r``) at the 40
  recall positions ``r = 1/40, 2/40, ..., 1`` and averaged, in percent (KITTI's metric since 2019).
* **Matching**, per scan and class, detections in descending score order (ties: input order): a
  detection is a true positive when its best IoU with a still unmatched *valid* ground truth
  reaches the threshold (BEV rotated IoU or 3-D IoU, ``pcops.boxes_iou_bev`` / ``boxes_iou_3d`` on
  the detections' device); otherwise, when it reaches the threshold with an *ignored* ground
  truth, it is ignored (neither true nor false positive); otherwise it is a false positive. A
  second detection of a matched object is a false positive (a duplicate).
* **Thresholds**: IoU 0.7 for Car, 0.5 for Pedestrian and Cyclist (KITTI's).
* **Valid / ignored ground truth**: an object of the class with at least ``min_points`` (5) LiDAR
  points inside its box and its centre inside ``point_cloud_range`` (the detector's range: the
  simulator labels all 360 degrees, KITTI only the camera's view) is valid; one with fewer is ignored (like KITTI's DontCare), and so are the
  neighbouring classes KITTI ignores (``Van`` for Car, ``Person_sitting`` for Pedestrian).
* **Range breakdown** (as Waymo reports LEVEL and range): for a bin ``[lo, hi)`` of BEV distance
  from the sensor, ground truth outside the bin is ignored, and an unmatched detection outside the
  bin is ignored rather than counted as a false positive. Bins: 0-30, 30-50, 50+ m.
* A class with no valid ground truth has AP ``nan`` (reported as ``null``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
import torch

import pcops

__all__ = ["SceneResult", "average_precision_r40", "evaluate", "IOU_THRESHOLDS", "RANGES", "count_points_in_boxes"]

IOU_THRESHOLDS = {"Car": 0.7, "Pedestrian": 0.5, "Cyclist": 0.5}
NEIGHBOURS = {"Car": ("Van",), "Pedestrian": ("Person_sitting",), "Cyclist": ()}
RANGES = {"0-30m": (0.0, 30.0), "30-50m": (30.0, 50.0), "50m+": (50.0, math.inf)}


class SceneResult(NamedTuple):
    """One scan's detections and ground truth (tensors on any one device)."""

    det_boxes: torch.Tensor  # (K, 7) float32
    det_scores: torch.Tensor  # (K,) float32
    det_names: Sequence[str]  # K class names
    gt_boxes: torch.Tensor  # (M, 7) float32
    gt_names: Sequence[str]  # M class names (any KITTI class)
    gt_num_points: torch.Tensor  # (M,) int64 points inside each box


def count_points_in_boxes(points: torch.Tensor, boxes: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """``(N, 3+)`` points, ``(M, 7)`` boxes → ``(M,)`` int64 points inside each box (faces included),
    on the points' device, in chunks of points (O(chunk · M) memory)."""
    out = torch.zeros(boxes.shape[0], dtype=torch.int64, device=points.device)
    if boxes.shape[0] == 0:
        return out
    b = boxes.to(points.device, torch.float32)
    c, s = torch.cos(b[:, 6]), torch.sin(b[:, 6])
    for i in range(0, points.shape[0], chunk):
        d = points[i : i + chunk, None, :3].float() - b[None, :, :3]
        lx = c * d[..., 0] + s * d[..., 1]
        ly = -s * d[..., 0] + c * d[..., 1]
        inside = (lx.abs() <= b[:, 3] / 2) & (ly.abs() <= b[:, 4] / 2) & (d[..., 2].abs() <= b[:, 5] / 2)
        out += inside.sum(dim=0)
    return out


def average_precision_r40(tp: np.ndarray, num_gt: int) -> float:
    """AP|R40 in percent of detections already sorted by descending score; ``tp`` is 1 for a true
    positive, 0 for a false positive (ignored detections removed). ``nan`` when ``num_gt == 0``."""
    if num_gt == 0:
        return float("nan")
    if len(tp) == 0:
        return 0.0
    tp = np.asarray(tp, dtype=np.float64)
    ctp = np.cumsum(tp)
    recall = ctp / num_gt
    precision = ctp / np.arange(1, len(tp) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    positions = np.arange(1, 41) / 40.0
    idx = np.searchsorted(recall, positions - 1e-12, side="left")
    vals = np.where(idx < len(envelope), envelope[np.minimum(idx, len(envelope) - 1)], 0.0)
    return float(vals.mean() * 100.0)


def _match(iv: np.ndarray, ii: np.ndarray, thr: float, det_out_of_bin: np.ndarray) -> np.ndarray:
    """Greedy matching of score-sorted detections: 1 (TP), 0 (FP) or -1 (ignored) per detection.
    ``iv (K, V)`` IoU with the valid ground truth, ``ii (K, I)`` with the ignored ones. Only
    detections reaching the threshold with some valid object need the sequential pass."""
    k = iv.shape[0]
    out = np.zeros(k, dtype=np.int64)
    if ii.shape[1]:
        out[ii.max(axis=1) >= thr] = -1
    out[det_out_of_bin] = -1
    if iv.shape[1]:
        hits = np.nonzero(iv.max(axis=1) >= thr)[0]
        used = np.zeros(iv.shape[1], dtype=bool)
        for j in hits:
            cand = np.where(used, -1.0, iv[j])
            best = int(cand.argmax())
            if cand[best] >= thr:
                used[best] = True
                out[j] = 1
            elif not (ii.shape[1] and ii[j].max() >= thr) and not det_out_of_bin[j]:
                out[j] = 0  # a duplicate of a matched object
    return out


def evaluate(
    scenes: Sequence[SceneResult],
    class_names: Sequence[str] = ("Car", "Pedestrian", "Cyclist"),
    min_points: int = 5,
    ranges: dict | None = None,
    iou_thresholds: dict | None = None,
    point_cloud_range: Sequence[float] | None = None,
) -> dict:
    """AP|R40 of every class, BEV and 3-D, overall and per range bin (see the module docstring).

    Returns ``{class: {"3d": AP, "bev": AP, "num_gt": n, "ranges": {bin: {"3d", "bev", "num_gt"}}}}``.
    """
    ranges = RANGES if ranges is None else ranges
    pcr = point_cloud_range
    thresholds = IOU_THRESHOLDS if iou_thresholds is None else iou_thresholds
    bins = {"all": (0.0, math.inf), **ranges}
    # per (class, bin, kind): lists of (score, tp) and gt counts
    acc = {(c, b, kind): [[], [], 0] for c in class_names for b in bins for kind in ("3d", "bev")}
    for sc in scenes:
        names_d = np.array(list(sc.det_names), dtype=object)
        names_g = np.array(list(sc.gt_names), dtype=object)
        gt_pts = sc.gt_num_points.cpu().numpy() if len(names_g) else np.zeros(0, np.int64)
        gt_dist = torch.linalg.norm(sc.gt_boxes[:, :2], dim=1).cpu().numpy() if len(names_g) else np.zeros(0)
        gxy = sc.gt_boxes[:, :2].cpu().numpy()
        # objects outside the detector's range are not labelled for it (as KITTI's outside the camera)
        gt_in_pcr = (
            np.ones(len(names_g), bool)
            if pcr is None
            else ((gxy[:, 0] >= pcr[0]) & (gxy[:, 0] < pcr[3]) & (gxy[:, 1] >= pcr[1]) & (gxy[:, 1] < pcr[4]))
        )
        all_scores = sc.det_scores.cpu().numpy()
        det_dist = torch.linalg.norm(sc.det_boxes[:, :2], dim=1).cpu().numpy()
        gboxes = sc.gt_boxes.to(sc.det_boxes.device)
        for c in class_names:
            thr = thresholds[c]
            didx = np.nonzero(names_d == c)[0]
            didx = didx[np.argsort(-all_scores[didx], kind="stable")]
            dscores, ddist = all_scores[didx], det_dist[didx]
            is_c = names_g == c
            is_nb = np.isin(names_g, NEIGHBOURS.get(c, ())) if len(names_g) else np.zeros(0, bool)
            if not len(didx) and not is_c.any():
                continue
            dboxes = sc.det_boxes[torch.as_tensor(didx, device=sc.det_boxes.device, dtype=torch.long)]
            for kind, iou_fn in (("3d", pcops.boxes_iou_3d), ("bev", pcops.boxes_iou_bev)):
                if len(didx) and len(names_g):
                    iou = iou_fn(dboxes, gboxes).cpu().numpy()
                else:
                    iou = np.zeros((len(didx), len(names_g)))
                for b, (lo, hi) in bins.items():
                    in_bin = (gt_dist >= lo) & (gt_dist < hi)
                    valid = is_c & (gt_pts >= min_points) & in_bin & gt_in_pcr
                    ignored = (is_c & ~valid) | is_nb
                    out_bin = ~((ddist >= lo) & (ddist < hi))
                    res = _match(iou[:, valid], iou[:, ignored], thr, out_bin)
                    entry = acc[(c, b, kind)]
                    keep = res >= 0
                    entry[0].extend(dscores[keep].tolist())
                    entry[1].extend(res[keep].tolist())
                    entry[2] += int(valid.sum())
    out: dict = {}
    for c in class_names:
        out[c] = {"ranges": {}}
        for b in bins:
            row = {}
            for kind in ("3d", "bev"):
                scores, tps, n_gt = acc[(c, b, kind)]
                order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
                ap = average_precision_r40(np.asarray(tps)[order], n_gt)
                row[kind] = None if math.isnan(ap) else round(ap, 2)
                row["num_gt"] = n_gt
            if b == "all":
                out[c].update(row)
            else:
                out[c]["ranges"][b] = row
    return out


def detections_to_scenes(det, class_names, gt: list) -> list:
    """Padded :class:`~pcops.models.outputs.Detections` of a batch + per-scan ground truth
    ``(boxes, names, num_points)`` → :class:`SceneResult` list (one host sync for the counts)."""
    counts = det.count.tolist()
    out = []
    for b, n in enumerate(counts):
        labels = det.labels[b, :n].tolist()
        boxes, names, npts = gt[b]
        out.append(
            SceneResult(
                det.boxes[b, :n].clone(),
                det.scores[b, :n].clone(),
                [class_names[i - 1] for i in labels],
                boxes,
                names,
                npts,
            )
        )
    return out
