"""Training data for PointPillars: KITTI-format folders (real KITTI or pcops' simulated split),
OpenPCDet's augmentations, and batching.

Layout (the KITTI object benchmark's)::

    root/ImageSets/{train,val}.txt          one frame id per line
    root/training/velodyne/<id>.bin          float32 (x, y, z, reflectance)
    root/training/label_2/<id>.txt           KITTI labels (camera frame)
    root/training/calib/<id>.txt             KITTI calibration
    root/gt_database.npz                     (written by ``generate`` or :func:`build_gt_database`)
    root/pcops_sim.json                      only in simulated splits: how they were made

:func:`generate_split` writes a simulated split in this layout (worker processes, a progress
bar), so a user with the real KITTI dataset trains with the same command. Simulated splits have
no camera: their calibration is KITTI's axis permutation, and every point is used; for a real
KITTI folder only the points inside the camera image are used (OpenPCDet's ``FOV_POINTS_ONLY``),
since objects outside it are not labelled.

Augmentations (OpenPCDet ``pointpillar.yaml``), split by where they are cheap:

* in the loader workers (NumPy, per scan): ground-truth sampling from the database (up to 15
  objects per class, each with >= 5 points, rejected when its box overlaps an existing or an
  accepted box: a conservative axis-aligned test on the boxes' corners), and the draw of the
  random parameters;
* on the GPU (:func:`pcops.models.augment.augment_batch`, vectorised over the packed batch): removal of the scan's
  points inside the pasted boxes, random flip about x, global rotation ±π/4, global scaling
  0.95-1.05, point shuffle, and dropping boxes whose centre leaves the range. Per-point work on
  the GPU keeps the workers light (the GPU machine's cores are slow), so the loader keeps up.
  Optionally (``train --sensor-aug``) also :class:`~pcops.models.augment.SensorAug`, for the transfer from simulated to
  real scans: object scaling, beam dropout, reflectance gain and noise, sensor height.

Classes outside ``config.class_names`` (Van, Truck, Misc, DontCare, ...) are not trained on;
they are kept as ``ignore`` boxes for the evaluation (KITTI ignores a Car detection on a Van).
"""

from __future__ import annotations

import json
import logging
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .config import PointPillarsConfig

__all__ = [
    "KittiDataset",
    "Batch",
    "collate",
    "generate_split",
    "build_gt_database",
    "EpochSampler",
    "write_kitti_label",
    "points_in_boxes_mask",
]

log = logging.getLogger("pcops.models")

# KITTI's velodyne -> camera axis permutation (x forward, y left, z up -> x right, y down, z forward)
SIM_CALIB = """P0: 721.5377 0 609.5593 0 0 721.5377 172.854 0 0 0 1 0
P1: 721.5377 0 609.5593 -387.5744 0 721.5377 172.854 0 0 0 1 0
P2: 721.5377 0 609.5593 44.85728 0 721.5377 172.854 0.2163791 0 0 1 0.002745884
P3: 721.5377 0 609.5593 -339.5242 0 721.5377 172.854 2.199936 0 0 1 0.002729905
R0_rect: 1 0 0 0 1 0 0 0 1
Tr_velo_to_cam: 0 -1 0 0 0 0 -1 0 1 0 0 0
Tr_imu_to_velo: 1 0 0 0 0 1 0 0 0 0 1 0
"""
IMAGE_SIZE = (1242, 375)  # KITTI's image (width, height) for the field-of-view filter
GT_SAMPLE_GROUPS = {"Car": 15, "Pedestrian": 15, "Cyclist": 15}  # SAMPLE_GROUPS
GT_MIN_POINTS = 5  # filter_by_min_points
ROT_RANGE = (-math.pi / 4, math.pi / 4)  # WORLD_ROT_ANGLE
SCALE_RANGE = (0.95, 1.05)  # WORLD_SCALE_RANGE
FAR = 1.0e4  # metres: where removed points are moved (the voxelizer drops them as out of range)
TRAIN_SEED_BASE, VAL_SEED_BASE = 1_000_000, 2_000_000  # simulator seeds of the two splits: disjoint


# ----------------------------------------------------------------------------- geometry helpers


def box_corners_bev(boxes: np.ndarray) -> np.ndarray:
    """``(M, 7)`` boxes → ``(M, 4, 2)`` BEV corners."""
    c, s = np.cos(boxes[:, 6]), np.sin(boxes[:, 6])
    hx, hy = boxes[:, 3] / 2, boxes[:, 4] / 2
    local = np.stack(
        [np.stack([hx, hy], 1), np.stack([-hx, hy], 1), np.stack([-hx, -hy], 1), np.stack([hx, -hy], 1)], 1
    )
    rot = np.stack([np.stack([c, -s], 1), np.stack([s, c], 1)], 1)  # (M, 2, 2)
    return np.einsum("mij,mkj->mki", rot, local) + boxes[:, None, :2]


def points_in_boxes(points: np.ndarray, boxes: np.ndarray, cell: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """``(N, 3+)`` points, ``(M, 7)`` boxes → ``(point index, box index)`` int64 pairs of the points
    inside each box, faces included (NumPy, float64 tests), sorted by box.

    The points are bucketed once into ``cell``-metre squares (a radix sort of 16-bit square
    numbers); each box then tests only the points of the squares its bounding circle touches, all
    boxes in one vectorised pass."""
    p = np.asarray(points)[:, :3]
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    none = np.zeros(0, np.int64)
    if len(boxes) == 0 or len(p) == 0:
        return none, none
    px, py = np.ascontiguousarray(p[:, 0]), np.ascontiguousarray(p[:, 1])  # column by column: fast
    lo = (float(px.min()), float(py.min()))
    extent = (float(px.max()) - lo[0], float(py.max()) - lo[1])
    span = (int(extent[0] / cell) + 1, int(extent[1] / cell) + 1)
    while span[0] * span[1] >= 2**15:  # 16-bit square numbers: coarser squares for huge extents
        cell *= 1.5
        span = (int(extent[0] / cell) + 1, int(extent[1] / cell) + 1)
    inv = np.float32(1.0 / cell)
    ii = np.minimum(((px - np.float32(lo[0])) * inv).astype(np.int16), span[0] - 1)
    jj = np.minimum(((py - np.float32(lo[1])) * inv).astype(np.int16), span[1] - 1)
    key = ii * np.int16(span[1]) + jj
    order = np.argsort(key, kind="stable")  # radix sort
    bounds = np.searchsorted(key[order], np.arange(span[0] * span[1] + 1, dtype=np.int32))
    # each box's rectangle of squares (its bounding circle + the float32 square numbers' rounding)
    r = 0.5 * np.hypot(boxes[:, 3], boxes[:, 4]) + 1e-3
    i0 = np.clip(np.floor((boxes[:, 0] - r - lo[0]) / cell), 0, span[0] - 1).astype(np.int64)
    i1 = np.clip(np.floor((boxes[:, 0] + r - lo[0]) / cell), 0, span[0] - 1).astype(np.int64)
    j0 = np.clip(np.floor((boxes[:, 1] - r - lo[1]) / cell), 0, span[1] - 1).astype(np.int64)
    j1 = np.clip(np.floor((boxes[:, 1] + r - lo[1]) / cell), 0, span[1] - 1).astype(np.int64)
    # one row of squares (a contiguous run of square numbers) per box and x-index
    rows = i1 - i0 + 1
    row_box = np.repeat(np.arange(len(boxes)), rows)
    row_first = np.cumsum(rows) - rows
    a = i0[row_box] + np.arange(len(row_box)) - row_first[row_box]
    start = bounds[a * span[1] + j0[row_box]]
    count = bounds[a * span[1] + j1[row_box] + 1] - start
    # the candidates: every point of those runs, with its box
    cand_box = np.repeat(row_box, count)
    near = order[np.repeat(start - (np.cumsum(count) - count), count) + np.arange(len(cand_box))]
    q = p[near].astype(np.float64)
    c, s, half = np.cos(boxes[:, 6]), np.sin(boxes[:, 6]), boxes[:, 3:6] / 2
    dx, dy = q[:, 0] - boxes[cand_box, 0], q[:, 1] - boxes[cand_box, 1]
    cb, sb = c[cand_box], s[cand_box]
    inside = np.abs(q[:, 2] - boxes[cand_box, 2]) <= half[cand_box, 2]
    inside &= np.abs(cb * dx + sb * dy) <= half[cand_box, 0]
    inside &= np.abs(cb * dy - sb * dx) <= half[cand_box, 1]
    return near[inside], cand_box[inside]


def points_in_boxes_mask(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``(N, 3+)`` points, ``(M, 7)`` boxes → ``(M, N)`` bool, faces included (NumPy, float64)."""
    out = np.zeros((len(boxes), len(points)), dtype=bool)
    pi, bi = points_in_boxes(points, boxes)
    out[bi, pi] = True
    return out


def write_kitti_label(path, boxes: np.ndarray, names, calib_text: str = SIM_CALIB) -> None:
    """Write LiDAR-frame boxes ``(M, 7)`` as a KITTI ``label_2`` file (camera frame, via ``calib_text``'s
    R0_rect and Tr_velo_to_cam; 2-D boxes, truncation and occlusion are written as 0)."""
    from pcops.io import read_calib

    tmp = Path(path).with_suffix(".calib.tmp")
    tmp.write_text(calib_text)
    try:
        calib = read_calib(tmp)
    finally:
        tmp.unlink()
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    bottom = boxes[:, :3].copy()
    bottom[:, 2] -= boxes[:, 5] / 2
    cam = calib.lidar_to_rect(bottom)
    lines = []
    for (x, y, z), b, name in zip(cam, boxes, names):
        ry = -b[6] - math.pi / 2
        ry = (ry + math.pi) % (2 * math.pi) - math.pi
        alpha = ry - math.atan2(x, z)
        lines.append(
            f"{name} 0.00 0 {alpha:.4f} 0.00 0.00 0.00 0.00 {b[5]:.4f} {b[4]:.4f} {b[3]:.4f} "
            f"{x:.4f} {y:.4f} {z:.4f} {ry:.4f}"
        )
    Path(path).write_text("".join(line + "\n" for line in lines))


# ----------------------------------------------------------------------------- generation


def _generate_one(args) -> dict:
    """Simulate one frame, write its files; return its database entries (train) and counts."""
    root, frame, seed, with_db, pcr, scene_version = args
    from pcops.sim import simulate_scan

    scan = simulate_scan(seed, scene_version=scene_version)
    pts = scan.points.numpy()
    boxes = scan.boxes.numpy()
    names = list(scan.names)
    train = Path(root) / "training"
    pts.astype(np.float32).tofile(train / "velodyne" / f"{frame}.bin")
    write_kitti_label(train / "label_2" / f"{frame}.txt", boxes, names)
    (train / "calib" / f"{frame}.txt").write_text(SIM_CALIB)
    out = {"frame": frame, "names": names, "num_points": scan.num_points_in_box.numpy()}
    if with_db:
        keep = [
            i
            for i, n in enumerate(names)
            if n in GT_SAMPLE_GROUPS
            and int(scan.num_points_in_box[i]) >= GT_MIN_POINTS
            and pcr[0] <= boxes[i, 0] < pcr[3]
            and pcr[1] <= boxes[i, 1] < pcr[4]
        ]
        masks = points_in_boxes_mask(pts, boxes[keep]) if keep else np.zeros((0, len(pts)), bool)
        out["db"] = [(names[i], boxes[i], pts[m]) for i, m in zip(keep, masks)]
    return out


def _progress(iterable, total: int, desc: str, enabled: bool = True):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is in the 'train' extra; without it, log every 10 %

        def plain():
            for i, x in enumerate(iterable, start=1):
                if enabled and (i == total or i % max(total // 10, 1) == 0):
                    log.info("%s: %d / %d", desc, i, total)
                yield x

        return plain()
    return tqdm(iterable, total=total, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=2.0)


def generate_split(
    root,
    n_train: int = 3712,
    n_val: int = 1000,
    workers: int | None = None,
    config: PointPillarsConfig | None = None,
    progress: bool = True,
    scene_version: int = 2,
) -> dict:
    """Write a simulated split in the KITTI layout (see the module docstring) and its ground-truth
    database. Frame ``i`` of train is ``pcops.sim.simulate_scan(1_000_000 + i)``, of val
    ``simulate_scan(2_000_000 + i)``: disjoint seeds, the same files on every machine.
    ``scene_version`` goes to ``simulate_scan`` (2, the default and the shipped weights' data: vans
    and trucks, labelled ``Van`` / ``Truck``, which training ignores and evaluation treats as KITTI
    does; 1: the earlier scenes).
    Returns the split's summary (also written to ``pcops_sim.json``)."""
    cfg = config or PointPillarsConfig()
    root = Path(root)
    for sub in ("velodyne", "label_2", "calib"):
        (root / "training" / sub).mkdir(parents=True, exist_ok=True)
    (root / "ImageSets").mkdir(parents=True, exist_ok=True)
    jobs, splits = [], {"train": [], "val": []}
    for split, n, base in (("train", n_train, TRAIN_SEED_BASE), ("val", n_val, VAL_SEED_BASE)):
        for i in range(n):
            frame = f"{len(jobs):06d}"
            splits[split].append(frame)
            jobs.append((str(root), frame, base + i, split == "train", tuple(cfg.point_cloud_range), scene_version))
    for split, frames in splits.items():
        (root / "ImageSets" / f"{split}.txt").write_text("".join(f + "\n" for f in frames))
    workers = workers or max(1, (os.cpu_count() or 2))
    db_names, db_boxes, db_points = [], [], []
    class_counts: dict = {}
    with ProcessPoolExecutor(workers) as pool:
        results = pool.map(_generate_one, jobs, chunksize=4)
        for res in _progress(results, len(jobs), "generate", progress):
            for n in res["names"]:
                class_counts[n] = class_counts.get(n, 0) + 1
            for name, box, pts in res.get("db", ()):
                db_names.append(name)
                db_boxes.append(box)
                db_points.append(pts)
    _save_db(root / "gt_database.npz", db_names, db_boxes, db_points)
    summary = {
        "n_train": n_train,
        "n_val": n_val,
        "scene_version": scene_version,
        "train_seeds": [TRAIN_SEED_BASE, TRAIN_SEED_BASE + n_train],
        "val_seeds": [VAL_SEED_BASE, VAL_SEED_BASE + n_val],
        "objects": class_counts,
        "gt_database": {c: db_names.count(c) for c in GT_SAMPLE_GROUPS},
        "fov_only": False,
    }
    (root / "pcops_sim.json").write_text(json.dumps(summary, indent=1))
    return summary


def _save_db(path, names, boxes, points) -> None:
    offsets = np.zeros(len(points) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in points])
    np.savez(
        path,
        names=np.array(names, dtype="U16"),
        boxes=np.array(boxes, np.float32).reshape(-1, 7),
        points=np.concatenate(points).astype(np.float32) if points else np.zeros((0, 4), np.float32),
        offsets=offsets,
    )


def build_gt_database(root, config: PointPillarsConfig | None = None, split: str = "train") -> Path:
    """Write ``root/gt_database.npz`` from a KITTI-format folder's labelled split (objects of the
    sampled classes with >= 5 points, centres inside the range)."""
    cfg = config or PointPillarsConfig()
    ds = KittiDataset(root, split, cfg, augment=False)
    names, boxes, points = [], [], []
    pcr = cfg.point_cloud_range
    for i in range(len(ds)):
        pts, bx, nm, _, _ = ds.load(i)
        keep = [
            j
            for j, n in enumerate(nm)
            if n in GT_SAMPLE_GROUPS and pcr[0] <= bx[j, 0] < pcr[3] and pcr[1] <= bx[j, 1] < pcr[4]
        ]
        for j, m in zip(keep, points_in_boxes_mask(pts, bx[keep]) if keep else []):
            if m.sum() >= GT_MIN_POINTS:
                names.append(nm[j])
                boxes.append(bx[j])
                points.append(pts[m])
    path = Path(root) / "gt_database.npz"
    _save_db(path, names, boxes, points)
    return path


# ----------------------------------------------------------------------------- dataset


class EpochSampler(torch.utils.data.Sampler):
    """Yields ``(index, epoch)`` pairs, shuffled per epoch from ``seed`` (so persistent loader workers
    draw their augmentations from ``(seed, epoch, index)``: reproducible and resumable)."""

    def __init__(self, n: int, seed: int, shuffle: bool = True, start_epoch: int = 0):
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, start_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch))
        else:
            order = torch.arange(self.n)
        return iter([(int(i), self.epoch) for i in order])


class KittiDataset(torch.utils.data.Dataset):
    """Frames of a KITTI-format folder (see the module docstring).

    Args:
        root: the folder (holding ``ImageSets/`` and ``training/``).
        split: ``"train"``, ``"val"`` or any ``ImageSets/<split>.txt``.
        config: the model config (class names, range).
        augment: draw OpenPCDet's augmentations (training); ``__getitem__`` then takes
            ``(index, epoch)`` pairs (see :class:`EpochSampler`).
        seed: augmentation seed.
        fov_only: keep only points inside the camera image; default: True for real KITTI, False
            for simulated splits (``pcops_sim.json`` present).

    Missing files raise ``FileNotFoundError`` naming the frame when the dataset is built (checked
    once, not mid-epoch); scans with non-finite points lose those points (counted in
    ``skipped_points`` of the item); unknown classes are not trained on and are counted in
    :attr:`class_counts`.
    """

    def __init__(
        self,
        root,
        split: str,
        config: PointPillarsConfig | None = None,
        augment: bool = False,
        seed: int = 0,
        fov_only: bool | None = None,
    ):
        self.root = Path(root)
        self.config = config or PointPillarsConfig()
        self.augment = augment
        self.seed = seed
        ids_file = self.root / "ImageSets" / f"{split}.txt"
        if not ids_file.is_file():
            raise FileNotFoundError(f"root: no split file {ids_file} (expected a KITTI-format folder)")
        self.frames = [s.strip() for s in ids_file.read_text().split() if s.strip()]
        self.base = self.root / "training"
        missing = [
            f"{sub}/{f}{ext}"
            for f in self.frames
            for sub, ext in (("velodyne", ".bin"), ("label_2", ".txt"), ("calib", ".txt"))
            if not (self.base / sub / f"{f}{ext}").is_file()
        ]
        if missing:
            raise FileNotFoundError(
                f"root: {len(missing)} files of split {split!r} are missing, e.g. {missing[:5]} under {self.base}"
            )
        self.simulated = (self.root / "pcops_sim.json").is_file()
        self.fov_only = (not self.simulated) if fov_only is None else fov_only
        self.class_names = self.config.class_names
        self.class_counts: dict = {}
        self._db = None

    def __len__(self) -> int:
        return len(self.frames)

    def load(self, i: int):
        """Frame ``i``: ``(points (N, 4), boxes (M, 7), names, fov-filtered flag, non-finite count)`` NumPy."""
        from pcops.io import read_calib, read_kitti_label

        f = self.frames[i]
        pts = np.fromfile(self.base / "velodyne" / f"{f}.bin", dtype=np.float32).reshape(-1, 4)
        finite = np.isfinite(pts).all(axis=1)
        bad = int((~finite).sum())
        if bad:
            pts = pts[finite]
        boxes, names = read_kitti_label(self.base / "label_2" / f"{f}.txt", self.base / "calib" / f"{f}.txt")
        boxes = boxes.numpy()
        if self.fov_only:
            calib = read_calib(self.base / "calib" / f"{f}.txt")
            if calib.P2 is not None:
                rect = calib.lidar_to_rect(pts[:, :3])
                uvw = np.concatenate([rect, np.ones((len(rect), 1))], 1) @ calib.P2.T
                u, v = uvw[:, 0] / uvw[:, 2], uvw[:, 1] / uvw[:, 2]
                keep = (uvw[:, 2] > 0) & (u >= 0) & (u < IMAGE_SIZE[0]) & (v >= 0) & (v < IMAGE_SIZE[1])
                pts = pts[keep]
        return pts, boxes, names, self.fov_only, bad

    def _database(self):
        if self._db is None:
            path = self.root / "gt_database.npz"
            if not path.is_file():
                raise FileNotFoundError(f"root: no {path}; run build_gt_database(root) or `generate` first")
            z = np.load(path)
            self._db = {k: z[k] for k in z.files}
            self._db["by_class"] = {c: np.nonzero(self._db["names"] == c)[0] for c in GT_SAMPLE_GROUPS}
        return self._db

    def _sample_objects(self, rng, boxes: np.ndarray):
        """Ground-truth sampling: up to SAMPLE_GROUPS objects per class that overlap nothing."""
        db = self._database()
        cap = len(boxes) + sum(GT_SAMPLE_GROUPS.values())
        lo, hi, m = np.zeros((cap, 2)), np.zeros((cap, 2)), len(boxes)  # BEV rectangles taken so far
        if m:
            corners = box_corners_bev(boxes)
            lo[:m], hi[:m] = corners.min(axis=1), corners.max(axis=1)
        out_boxes, out_names, out_pts = [], [], []
        for cls, n in GT_SAMPLE_GROUPS.items():
            pool = db["by_class"].get(cls, np.zeros(0, np.int64))
            if cls not in self.class_names or len(pool) == 0:
                continue
            pick = pool[rng.choice(len(pool), size=min(n, len(pool)), replace=False)]
            cand = db["boxes"][pick]
            corners = box_corners_bev(cand)
            clo, chi = corners.min(axis=1), corners.max(axis=1)
            for j, k in enumerate(pick):
                a, b = lo[:m], hi[:m]
                if np.any(
                    (clo[j, 0] < b[:, 0]) & (chi[j, 0] > a[:, 0]) & (clo[j, 1] < b[:, 1]) & (chi[j, 1] > a[:, 1])
                ):
                    continue
                lo[m], hi[m] = clo[j], chi[j]
                m += 1
                out_boxes.append(cand[j])
                out_names.append(cls)
                out_pts.append(db["points"][db["offsets"][k] : db["offsets"][k + 1]])
        return out_boxes, out_names, out_pts

    def __getitem__(self, item):
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        pts, boxes, names, _, bad = self.load(i)
        keep = np.array([n in self.class_names for n in names], dtype=bool)
        for n in names:
            self.class_counts[n] = self.class_counts.get(n, 0) + 1
        labels = np.array([self.class_names.index(n) + 1 if k else 0 for n, k in zip(names, keep)], dtype=np.int64)
        sampled = np.zeros((0, 7), np.float32)
        aug = np.array([0.0, 0.0, 1.0], dtype=np.float32)  # flip, rotation, scale
        n_scene = len(pts)
        owner = np.full(len(pts), -1, np.int16)
        if self.augment:
            reach = _can_enter_range(boxes, self.config.point_cloud_range)
            boxes, labels, keep = boxes[reach], labels[reach], keep[reach]
            pts = pts[_points_can_enter_range(pts, self.config.point_cloud_range)]
            rng = np.random.default_rng([self.seed, epoch, i])
            sb, sn, sp = self._sample_objects(rng, boxes)
            sampled = np.array(sb, np.float32).reshape(-1, 7)
            # one pass over the scan for its labelled boxes and the pasted ones: the scan's points inside
            # pasted boxes are removed; the others keep the first labelled box holding them (owner)
            pi, bi = points_in_boxes(pts, np.concatenate([boxes[keep], sampled]))
            k_scene = int(keep.sum())
            first = np.full(len(pts), np.iinfo(np.int16).max, np.int16)
            np.minimum.at(first, pi[bi < k_scene], bi[bi < k_scene].astype(np.int16))  # the first box
            owner = np.where(first < k_scene, first, -1).astype(np.int16)
            live = np.ones(len(pts), bool)
            live[pi[bi >= k_scene]] = False
            pts, owner = pts[live], owner[live]
            n_scene = len(pts)
            if sb:
                boxes = np.concatenate([boxes, sampled])
                labels = np.concatenate([labels, [self.class_names.index(n) + 1 for n in sn]])
                keep = np.concatenate([keep, np.ones(len(sn), bool)])
                pts = np.concatenate([pts] + sp)  # a pasted object's points: its box's (pasted boxes overlap nothing)
                owner = np.concatenate([owner] + [np.full(len(q), k_scene + j, np.int16) for j, q in enumerate(sp)])
            aug = np.array([float(rng.random() < 0.5), rng.uniform(*ROT_RANGE), rng.uniform(*SCALE_RANGE)], np.float32)
        return {
            "points": torch.from_numpy(np.ascontiguousarray(pts, dtype=np.float32)),
            "n_scene": n_scene,
            "boxes": torch.from_numpy(np.ascontiguousarray(boxes[keep], dtype=np.float32).reshape(-1, 7)),
            "labels": torch.from_numpy(labels[keep]),
            "ignore_boxes": torch.from_numpy(np.ascontiguousarray(boxes[~keep], dtype=np.float32).reshape(-1, 7)),
            "ignore_names": [n for n, k in zip(names, keep[: len(names)]) if not k],
            "sampled": torch.from_numpy(sampled),
            "aug": torch.from_numpy(aug),
            "frame": self.frames[i],
            "skipped_points": bad,
            "owner": torch.from_numpy(owner),
        }


def _points_can_enter_range(pts: np.ndarray, pcr, margin: float = 1.0) -> np.ndarray:
    """``(N,)`` bool: points that some flip / rotation (±π/4) / scaling could bring inside the range's
    x-y rectangle (with a margin; also covers :class:`~pcops.models.augment.SensorAug`'s object
    scaling): the others only cost memory and time in the batch. A point at distance r and azimuth
    a ends at azimuth a' with ``|a'| >= |a| - π/4`` and must have ``|a'| <= π/2`` and
    ``r' |sin a'| < y_max`` with ``r' >= 0.95 r``; the bounds are exact up to the margin. Without
    trigonometry: ``|a| <= 3π/4`` is ``x >= -|y|``, and for ``|a| > π/4``,
    ``r sin(|a| - π/4) = (|y| - x) / √2``."""
    x, ay = pts[:, 0], np.abs(pts[:, 1])  # float32: the margin covers its rounding
    half_width = max(abs(pcr[1]), abs(pcr[4])) + margin
    far = math.hypot(max(abs(pcr[0]), abs(pcr[3])) + margin, half_width) / SCALE_RANGE[0]
    lateral_max = np.float32(half_width * math.sqrt(2.0) / SCALE_RANGE[0])
    return (x >= -ay) & ((ay - x) < lateral_max) & (x * x + ay * ay <= np.float32(far * far))


def _can_enter_range(boxes: np.ndarray, pcr, margin: float = 1.0) -> np.ndarray:
    """Boxes whose centre some flip / rotation (±π/4) / scaling could bring into the range (a
    conservative test on a few angles with a margin): the others never become targets, and dropping
    them early keeps the batched target assignment small."""
    if len(boxes) == 0:
        return np.zeros(0, bool)
    x, y = boxes[:, 0:1].astype(np.float64), np.abs(boxes[:, 1:2]).astype(np.float64)
    ang = np.linspace(ROT_RANGE[0], ROT_RANGE[1], 9)[None, :]
    ok = np.zeros(len(boxes), bool)
    for s in SCALE_RANGE:
        for sy in (1.0, -1.0):
            xr = s * (x * np.cos(ang) - sy * y * np.sin(ang))
            yr = s * (x * np.sin(ang) + sy * y * np.cos(ang))
            ok |= (
                (xr >= pcr[0] - margin) & (xr < pcr[3] + margin) & (yr >= pcr[1] - margin) & (yr < pcr[4] + margin)
            ).any(1)
    return ok


class Batch(NamedTuple):
    """A packed batch (CPU tensors from :func:`collate`, moved with :meth:`to`)."""

    points: torch.Tensor  # (N, 4) float32, scans back to back
    lengths: torch.Tensor  # (B,) int64 points per scan
    scene: torch.Tensor  # (N,) bool: the point came from the scan (not from a pasted object)
    sample_index: torch.Tensor  # (N,) int64 scan of each point
    gt_boxes: torch.Tensor  # (B, G, 7) float32, padded
    gt_labels: torch.Tensor  # (B, G) int64 1..C, 0 = padding
    sampled_boxes: torch.Tensor  # (B, S, 7) pasted boxes (the loader removed the scan's points inside them), padded
    sampled_valid: torch.Tensor  # (B, S) bool
    aug: torch.Tensor  # (B, 3) flip, rotation, scale
    frames: list
    owner: torch.Tensor | None = None  # (N,) int32 column of gt_boxes holding the point (first such box), -1: none
    host_lengths: tuple = ()  # the points per scan as Python ints (host copies: no sync to read)
    class_slices: tuple = ()  # per class id 1..C: (start, stop) columns of gt_boxes holding that class

    def to(self, device, non_blocking: bool = True) -> "Batch":
        return Batch(*(t.to(device, non_blocking=non_blocking) if isinstance(t, torch.Tensor) else t for t in self))


def collate(items: list) -> Batch:
    """Pack scans back to back; ground truth padded with each class in its own block of columns
    (``class_slices``), so the target assignment compares each class's anchors with its boxes only."""
    bsz = len(items)
    lengths = torch.tensor([len(it["points"]) for it in items], dtype=torch.int64)
    n_cls = max([0] + [int(it["labels"].max()) for it in items if len(it["labels"])])
    per_class = [max(int((it["labels"] == c).sum()) for it in items) for c in range(1, n_cls + 1)]
    starts = np.concatenate([[0], np.cumsum(per_class)]).astype(int)
    g = max(1, int(starts[-1]))
    s = max(1, max(len(it["sampled"]) for it in items))
    gt_boxes = torch.zeros(bsz, g, 7)
    gt_labels = torch.zeros(bsz, g, dtype=torch.int64)
    sampled = torch.zeros(bsz, s, 7)
    sampled_valid = torch.zeros(bsz, s, dtype=torch.bool)
    scene = torch.zeros(int(lengths.sum()), dtype=torch.bool)
    owners = []
    start = 0
    for b, it in enumerate(items):
        column = torch.full((len(it["labels"]) + 1,), -1, dtype=torch.int32)  # the item's box j -> column; -1 -> -1
        for c in range(1, n_cls + 1):
            sel = it["labels"] == c
            k = int(sel.sum())
            gt_boxes[b, starts[c - 1] : starts[c - 1] + k] = it["boxes"][sel]
            gt_labels[b, starts[c - 1] : starts[c - 1] + k] = c
            column[:-1][sel] = torch.arange(int(starts[c - 1]), int(starts[c - 1]) + k, dtype=torch.int32)
        own = it.get("owner")
        owners.append(
            column[own.long()] if own is not None else torch.full((len(it["points"]),), -1, dtype=torch.int32)
        )
        sampled[b, : len(it["sampled"])] = it["sampled"]
        sampled_valid[b, : len(it["sampled"])] = True
        scene[start : start + it["n_scene"]] = True
        start += len(it["points"])
    return Batch(
        points=torch.cat([it["points"] for it in items]),
        lengths=lengths,
        scene=scene,
        sample_index=torch.repeat_interleave(torch.arange(bsz), lengths),
        gt_boxes=gt_boxes,
        gt_labels=gt_labels,
        sampled_boxes=sampled,
        sampled_valid=sampled_valid,
        aug=torch.stack([it["aug"] for it in items]),
        frames=[it["frame"] for it in items],
        owner=torch.cat(owners),
        host_lengths=tuple(int(n) for n in lengths),
        class_slices=tuple((int(starts[c]), int(starts[c + 1])) for c in range(n_cls)),
    )
