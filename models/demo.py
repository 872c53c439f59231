"""PointPillars demo: detect objects in LiDAR scans, time every stage, draw bird's-eye views.

Run ``python -m pcops.models.demo [paths ...] [--weights CKPT] [--device cpu|cuda] [--out DIR]``.

Inputs: files (KITTI ``.bin``, nuScenes ``.pcd.bin``, ``.npy``, ``.pcd``/``.ply`` with open3d) or
folders of them; by default the sample scans in the repository's ``data/`` folder, else the real
KITTI samples in ``../shared/data/kitti/training/velodyne``. For each scan it prints the median
time of every stage over ``--repeats`` runs after ``--warmup`` runs (CUDA events on the GPU,
``perf_counter`` on the CPU), the total, and the number of detections, and writes
``<out>/<scan>_bev.png`` with the points, the detections (red) and the ground truth (green) when a
label file is found (pcops labels ``<scan>.txt`` / ``<scan>.labels.txt`` / ``labels/<scan>.txt``
beside the scan, or KITTI ``label_2`` + ``calib`` next to ``velodyne``).

Weights: by default the PointPillars weights shipped with pcops (``PointPillars.pretrained()``,
trained on pcops' simulated KITTI-like scans: ``benchmarks/results/train_pointpillars.json``);
``--weights`` loads an OpenPCDet checkpoint or a pcops training export; ``--random-weights`` uses
seeded random weights (meaningless boxes, for timing only). The optional picture needs matplotlib
(``pip install 'pcops[viz]'``): the demo checks for it before computing anything. Without scan paths
and without ``data/`` (an installed package), it uses the sample scans shipped in the wheel.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import pcops
import pcops.io

from .config import PointPillarsConfig
from .pointpillars import PointPillars
from .random_init import randomize_
from .timing import StageTimer, null_timer

_REPO = Path(__file__).resolve().parents[1]
_SUFFIXES = (".pcd.bin", ".bin", ".npy", ".pcd", ".ply")


def _is_scan(p: Path) -> bool:
    return p.is_file() and any(p.name.endswith(s) for s in _SUFFIXES)


def default_scans() -> list[Path]:
    """The repository's ``data/`` scans (or the copy shipped in the wheel), else the real KITTI
    samples beside the repository."""
    shipped = Path(pcops.__file__).resolve().parent / "data"
    for folder in (
        _REPO / "data",
        shipped,
        Path.cwd() / "data",
        _REPO.parent / "shared" / "data" / "kitti" / "training" / "velodyne",
    ):
        scans = sorted(p for p in folder.glob("*") if _is_scan(p)) if folder.is_dir() else []
        if scans:
            return scans
    return []


def expand(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for s in paths:
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if _is_scan(q))
            if not found:
                raise SystemExit(f"paths: no point-cloud files ({', '.join(_SUFFIXES)}) in folder {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise SystemExit(f"paths: {p} does not exist")
    return out


def _stem(p: Path) -> str:
    name = p.name
    for s in _SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return p.stem


def find_labels(scan: Path):
    """Ground-truth ``(boxes (M, 7), names)`` for a scan, or ``None``."""
    stem = _stem(scan)
    for cand in (
        scan.with_name(stem + ".txt"),
        scan.with_name(stem + ".labels.txt"),
        scan.parent / "labels" / f"{stem}.txt",
    ):
        if cand.is_file():
            try:
                lab = pcops.io.read_labels(cand)
                return lab.boxes, list(lab.names)
            except ValueError:
                continue
    label, calib = scan.parent.parent / "label_2" / f"{stem}.txt", scan.parent.parent / "calib" / f"{stem}.txt"
    if label.is_file() and calib.is_file():
        boxes, names = pcops.io.read_kitti_label(label, calib)
        return boxes, list(names)
    return None


def _draw(points, det, n, gt, path: Path, title: str, cfg, min_score: float) -> None:
    from pcops import viz

    keep = (det.scores[0, :n] >= min_score).cpu()
    labels = det.labels[0, :n].cpu()[keep].tolist()
    classes = [cfg.class_names[int(i) - 1] if 0 < int(i) <= cfg.num_classes else "?" for i in labels]
    gt_boxes, gt_names = gt if gt is not None else (None, None)
    viz.draw_bev(
        points,
        det.boxes[0, :n].cpu()[keep],
        gt_boxes,
        str(path),
        labels=classes,
        classes=classes,
        scores=det.scores[0, :n].cpu()[keep],
        gt_labels=gt_names,
        title=title,
        detector_range=cfg.point_cloud_range,
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pcops.models.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", help="scan files or folders (default: data/ or ../shared/data KITTI samples)")
    p.add_argument(
        "--weights",
        default=None,
        help="OpenPCDet PointPillars checkpoint (.pth) or pcops export; default: the shipped weights",
    )
    p.add_argument("--random-weights", action="store_true", help="seeded random weights instead (timing only)")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--out", default="out", help="folder for the BEV pictures (default: out/)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per scan (default: 20 on GPU, 3 on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default: 5 on GPU, 1 on CPU)")
    p.add_argument("--max-scans", type=int, default=None, help="use only the first N scans")
    p.add_argument(
        "--impl", default="fast", choices=("fast", "reference"), help="pcops fast path or plain-torch reference"
    )
    p.add_argument("--fp16", action="store_true", help="fast path: float16 backbone and head")
    p.add_argument("--graph", action="store_true", help="also time the CUDA-graph-captured pipeline (GPU only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--no-draw", action="store_true", help="skip the pictures")
    p.add_argument(
        "--min-score", type=float, default=0.3, help="draw detections with at least this score (default 0.3)"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    gpu = device.type == "cuda"
    repeats = args.repeats if args.repeats is not None else (20 if gpu else 3)
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    if repeats < 1 or warmup < 0:
        raise SystemExit("--repeats must be >= 1 and --warmup >= 0")
    if not args.no_draw:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SystemExit(
                "the demo draws with matplotlib, which is not installed: pip install 'pcops[viz]' (or pass --no-draw)"
            ) from None
    if args.weights and args.random_weights:
        raise SystemExit("--weights and --random-weights: give one of them")
    scans = expand(args.paths) if args.paths else default_scans()
    if not scans:
        raise SystemExit("no scans given and none found in data/ or ../shared/data/kitti/training/velodyne")
    if args.max_scans is not None:
        scans = scans[: args.max_scans]

    cfg = PointPillarsConfig()
    model = PointPillars(cfg, impl=args.impl, dtype=torch.float16 if args.fp16 else torch.float32)
    if args.random_weights:
        calib_points = pcops.io.read_points(scans[0])
        randomize_(model, args.seed, calib_points)
        weights = f"random (seed {args.seed})"
        print(
            f"weights: RANDOM (seed {args.seed}, BatchNorm statistics from {scans[0].name}): the detections "
            "below are meaningless boxes (timing only)"
        )
    elif args.weights:
        model = PointPillars.pretrained(args.weights, impl=args.impl, dtype=model.dtype)
        weights = Path(args.weights).name
        print(f"weights: {args.weights}")
    else:
        model = PointPillars.pretrained(impl=args.impl, dtype=model.dtype)
        weights = "pcops sim-trained"
        print(
            "weights: pcops' shipped PointPillars weights, trained on simulated KITTI-like scans "
            "(benchmarks/results/train_pointpillars.json; on real KITTI scans: python -m pcops.models realscan)"
        )
    model = model.to(device)
    out_dir = Path(args.out)
    if not args.no_draw:
        out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"device: {torch.cuda.get_device_name(device) if gpu else 'cpu'}; impl: {args.impl}"
        f"{' fp16' if args.fp16 else ''}; {len(scans)} scan(s); median of {repeats} run(s) after {warmup} warm-up"
    )

    for scan in scans:
        points = pcops.io.read_points(scan)[:, : cfg.num_point_features].contiguous()
        if points.shape[1] < cfg.num_point_features:  # xyz only: zero intensity
            points = torch.cat([points, points.new_zeros(points.shape[0], cfg.num_point_features - points.shape[1])], 1)
        pts = points.to(device)
        timer = StageTimer(device)
        model.stage_timer = timer
        for _ in range(warmup):
            model(pts)
        timer.reset()
        wall = []
        for _ in range(repeats):
            timer.new_run()
            if gpu:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            det = model(pts)
            if gpu:
                torch.cuda.synchronize(device)
            wall.append((time.perf_counter() - t0) * 1e3)
        model.stage_timer = null_timer
        stats = timer.summary()
        n = int(det.count[0])
        print(f"\n{scan.name}: {points.shape[0]:,} points, {n} detections")
        for name, s in stats.items():
            print(f"  {name:<12} {s['median_ms']:9.3f} ms   (min {s['min_ms']:.3f}, max {s['max_ms']:.3f})")
        wall.sort()
        print(f"  {'wall':<12} {wall[len(wall) // 2]:9.3f} ms   (end to end incl. Python and launch overhead)")
        if args.graph:
            if not gpu:
                print("  graph: skipped (CUDA graphs need --device cuda)")
            else:
                graphed = model.capture(pts)
                graphed(pts)
                g_ms = []
                for _ in range(max(repeats, 10)):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    graphed(pts)
                    e.record()
                    e.synchronize()
                    g_ms.append(s.elapsed_time(e))
                g_ms.sort()
                print(
                    f"  {'graph':<12} {g_ms[len(g_ms) // 2]:9.3f} ms   (one CUDA graph replay, points to padded boxes)"
                )
        if not args.no_draw:
            gt = find_labels(scan)
            png = out_dir / f"{_stem(scan)}_bev.png"
            total = stats.get("total", {}).get("median_ms", wall[len(wall) // 2])
            title = (
                f"{scan.name}: PointPillars ({args.impl}{', fp16' if args.fp16 else ''}), weights: {weights}; "
                f"{n} detections ({int((det.scores[0, :n] >= args.min_score).sum())} drawn, score >= "
                f"{args.min_score}), {total:.1f} ms on {'GPU' if gpu else 'CPU'}"
            )
            _draw(points, det, n, gt, png, title, cfg, args.min_score)
            if png.exists():
                print(f"  picture: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
