"""Dataset inference: ``python -m pcops.models infer --data FOLDER --weights W --out DIR``.

Runs PointPillars over every scan of a folder or a KITTI split (CUDA: the fast path captured in
one CUDA graph per batch size, :class:`~pcops.models.graph.GraphedPointPillars`; CPU: eager),
sharded over the ranks under ``torchrun`` (whole batches, as the evaluation shards them), and
writes one detection file per scan, ``DIR/<frame>.txt``, in the LiDAR frame::

    # pcops detections (LiDAR frame; metres, radians): name x y z dx dy dz heading score
    Car 12.3456 -3.2100 -0.9000 3.9000 1.6000 1.5600 0.3000 0.9123

one line per box: class name, box centre ``x y z``, size ``dx dy dz`` (length along the heading,
width, height), ``heading`` (yaw about z from the x axis) and ``score``, 4 decimals, by descending
score; a scan without detections has the header only. :func:`read_detections` reads them back.
With ``--kitti-labels`` (and calibration files beside the scans), ``DIR/label_2/<frame>.txt`` also
holds KITTI camera-frame labels with the score as the 16th field (the 2-D box is the projection
of the 3-D box into image 2, clipped to KITTI's 1242 x 375 image).

Inputs (:func:`find_scans`): a KITTI root with ``--split NAME`` (``ImageSets/NAME.txt``, scans in
``training/velodyne``, or ``testing/velodyne`` for ``test``); a KITTI root without a split (every
scan of ``training/velodyne``); a folder with ``velodyne/``; or a folder of point-cloud files
(``.bin``, ``.npy``, ``.pcd``, ``.ply``: whatever :func:`pcops.io.read_points` reads).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from . import distributed as dd
from .data import IMAGE_SIZE, _progress

__all__ = ["find_scans", "infer", "write_detections", "read_detections", "DET_HEADER"]

DET_HEADER = "# pcops detections (LiDAR frame; metres, radians): name x y z dx dy dz heading score"
SUFFIXES = (".bin", ".npy", ".pcd", ".ply")


def _frame(path: Path) -> str:
    name = path.name
    return name[: -len(".pcd.bin")] if name.endswith(".pcd.bin") else path.stem


def find_scans(data, split: str | None = None) -> list[tuple[str, Path, Path | None]]:
    """``(frame, scan path, calib path or None)`` of every scan to run, in order (see the module
    docstring for the layouts). Raises ``FileNotFoundError`` / ``ValueError`` naming ``data`` or ``split``."""
    root = Path(data)
    if not root.is_dir():
        raise FileNotFoundError(f"data: no folder {root}")
    if split is not None:
        ids_file = root / "ImageSets" / f"{split}.txt"
        if not ids_file.is_file():
            raise FileNotFoundError(f"split: no split file {ids_file}")
        sub = "testing" if split == "test" and (root / "testing" / "velodyne").is_dir() else "training"
        frames = [s.strip() for s in ids_file.read_text().split() if s.strip()]
        out = []
        for f in frames:
            scan = root / sub / "velodyne" / f"{f}.bin"
            if not scan.is_file():
                raise FileNotFoundError(f"split: frame {f} of {split!r} has no scan {scan}")
            calib = root / sub / "calib" / f"{f}.txt"
            out.append((f, scan, calib if calib.is_file() else None))
        return out
    for folder in (root / "training" / "velodyne", root / "velodyne", root):
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES)
            if files or folder == root:
                break
    if not files:
        raise ValueError(f"data: no point-cloud files ({', '.join(SUFFIXES)}) in {root}")
    out = []
    for p in files:
        calib = p.parent.parent / "calib" / f"{_frame(p)}.txt"
        out.append((_frame(p), p, calib if calib.is_file() else None))
    return out


def write_detections(path, boxes, scores, names) -> None:
    """One detection file (the module docstring's format): ``boxes (K, 7)``, ``scores (K,)``, K names."""
    b = torch.as_tensor(boxes).detach().cpu().double().numpy().reshape(-1, 7)
    s = torch.as_tensor(scores).detach().cpu().double().numpy().reshape(-1)
    if len(s) != len(b) or len(names) != len(b):
        raise ValueError(f"scores: expected {len(b)} scores and names (one per box), got {len(s)} and {len(names)}")
    lines = [DET_HEADER]
    for n, row, sc in zip(names, b, s):
        nums = " ".join(f"{v:.4f}".replace("-0.0000", "0.0000") for v in row)
        lines.append(f"{n} {nums} {sc:.4f}")
    Path(path).write_text("\n".join(lines) + "\n")


def read_detections(path) -> tuple[torch.Tensor, torch.Tensor, list]:
    """A detection file → ``(boxes (K, 7) float32, scores (K,) float32, names)``."""
    boxes, scores, names = [], [], []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if len(f) != 9:
            raise ValueError(f"{path}:{lineno}: expected 'name x y z dx dy dz heading score', got {line!r}")
        names.append(f[0])
        boxes.append([float(v) for v in f[1:8]])
        scores.append(float(f[8]))
    return torch.tensor(boxes, dtype=torch.float32).reshape(-1, 7), torch.tensor(scores, dtype=torch.float32), names


def _corners(b: np.ndarray) -> np.ndarray:
    """``(K, 7)`` LiDAR boxes → ``(K, 8, 3)`` corners."""
    c, s = np.cos(b[:, 6]), np.sin(b[:, 6])
    sx = np.array([1, 1, -1, -1, 1, 1, -1, -1]) / 2
    sy = np.array([1, -1, -1, 1, 1, -1, -1, 1]) / 2
    sz = np.array([1, 1, 1, 1, -1, -1, -1, -1]) / 2
    lx, ly, lz = sx * b[:, 3:4], sy * b[:, 4:5], sz * b[:, 5:6]
    x = b[:, 0:1] + c[:, None] * lx - s[:, None] * ly
    y = b[:, 1:2] + s[:, None] * lx + c[:, None] * ly
    return np.stack([x, y, b[:, 2:3] + lz], axis=-1)


def write_kitti_detections(path, boxes, scores, names, calib_path) -> None:
    """KITTI ``label_2`` lines (camera frame) with the score as the 16th field."""
    from pcops.io import read_calib

    calib = read_calib(calib_path)
    b = torch.as_tensor(boxes).detach().cpu().double().numpy().reshape(-1, 7)
    s = torch.as_tensor(scores).detach().cpu().double().numpy().reshape(-1)
    bottom = b[:, :3].copy()
    bottom[:, 2] -= b[:, 5] / 2
    cam = calib.lidar_to_rect(bottom)
    lines = []
    for k, ((x, y, z), row, name, sc) in enumerate(zip(cam, b, names, s)):
        ry = -row[6] - math.pi / 2
        ry = (ry + math.pi) % (2 * math.pi) - math.pi
        alpha = ry - math.atan2(x, z)
        x1 = y1 = x2 = y2 = 0.0
        if calib.P2 is not None:
            rect = calib.lidar_to_rect(_corners(row[None])[0])
            uvw = np.concatenate([rect, np.ones((8, 1))], 1) @ calib.P2.T
            if np.all(uvw[:, 2] > 1e-3):
                u, v = uvw[:, 0] / uvw[:, 2], uvw[:, 1] / uvw[:, 2]
                x1, x2 = np.clip([u.min(), u.max()], 0, IMAGE_SIZE[0] - 1)
                y1, y2 = np.clip([v.min(), v.max()], 0, IMAGE_SIZE[1] - 1)
        lines.append(
            f"{name} 0.00 0 {alpha:.4f} {x1:.2f} {y1:.2f} {x2:.2f} {y2:.2f} {row[5]:.4f} {row[4]:.4f} {row[3]:.4f} "
            f"{x:.4f} {y:.4f} {z:.4f} {ry:.4f} {sc:.4f}"
        )
    Path(path).write_text("".join(line + "\n" for line in lines))


class _Scans(torch.utils.data.Dataset):
    def __init__(self, scans):
        self.scans = scans

    def __len__(self) -> int:
        return len(self.scans)

    def __getitem__(self, i):
        from pcops.io import read_points

        frame, path, calib = self.scans[i]
        pts = read_points(path)
        return frame, pts[torch.isfinite(pts).all(dim=1)], calib


def _collate(items):
    return items


@torch.no_grad()
def infer(
    model,
    scans: list,
    out,
    batch_size: int = 1,
    workers: int = 2,
    capture: bool | None = None,
    kitti_labels: bool = False,
    progress: bool = True,
) -> dict:
    """Detect on ``scans`` (from :func:`find_scans`), this rank's share of them under a process
    group, and write the detection files into ``out``. ``capture``: replay CUDA graphs (default:
    on CUDA). Returns the throughput record (every rank's scans and seconds; the same on all ranks)."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    if kitti_labels:
        missing = [f for f, _, c in scans if c is None]
        if missing:
            raise ValueError(f"kitti_labels: no calibration file for {len(missing)} scans, e.g. {missing[:3]}")
    env = dd.current()
    device = next(model.parameters()).device
    capture = device.type == "cuda" if capture is None else capture
    if capture and device.type != "cuda":
        raise ValueError(f"capture: CUDA graphs need the model on a CUDA device, got {device}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if kitti_labels:
        (out / "label_2").mkdir(exist_ok=True)
    model.eval()
    mine = dd.shard_batches(len(scans), batch_size, env.rank, env.world_size)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(_Scans(scans), mine),
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=_collate,
        pin_memory=device.type == "cuda",
    )
    names_of = model.config.class_names
    graphs: dict = {}
    capture_s = 0.0
    warn = model.warn_on_dropped_voxels
    model.warn_on_dropped_voxels = False
    if env.enabled:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    try:
        for items in _progress(loader, math.ceil(len(mine) / batch_size), "infer", progress and env.is_main):
            pts = torch.cat([p for _, p, _ in items]).to(device, non_blocking=True)
            lengths = [len(p) for _, p, _ in items]
            if capture:
                g = graphs.get(len(items))
                if g is None or max(lengths) > g.max_points:
                    tc = time.perf_counter()
                    g = graphs[len(items)] = model.capture(pts, lengths if len(items) > 1 else None)
                    capture_s += time.perf_counter() - tc
                det = g(pts, lengths if len(items) > 1 else None)
            else:
                det = model(pts, torch.tensor(lengths, device=device))
            counts = det.count.tolist()
            boxes, scores, labels = det.boxes.cpu(), det.scores.cpu(), det.labels.cpu()
            for b, (frame, _, calib) in enumerate(items):
                n = counts[b]
                names = [names_of[i - 1] for i in labels[b, :n].tolist()]
                write_detections(out / f"{frame}.txt", boxes[b, :n], scores[b, :n], names)
                if kitti_labels:
                    write_kitti_detections(out / "label_2" / f"{frame}.txt", boxes[b, :n], scores[b, :n], names, calib)
    finally:
        model.warn_on_dropped_voxels = warn
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    mode = "cuda graph" if capture else "eager"
    mine_rec = {
        "rank": env.rank,
        "scans": len(mine),
        "seconds": round(seconds, 3),
        "capture_seconds": round(capture_s, 3),
    }
    mine_rec["scans_per_s"] = round(len(mine) / max(seconds - capture_s, 1e-9), 2)
    ranks = dd.gather_ordered([(env.rank, mine_rec)])
    slowest = max(r["seconds"] - r["capture_seconds"] for r in ranks)
    return {
        "scans": len(scans),
        "world_size": env.world_size,
        "batch_size": batch_size,
        "mode": mode,
        "device": str(device.type),
        "out": str(out),
        "per_rank": ranks,
        "total_scans_per_s": round(len(scans) / max(slowest, 1e-9), 2),
    }
