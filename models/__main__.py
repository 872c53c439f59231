"""``python -m pcops.models <subcommand>``: generate a simulated split, train, evaluate, infer, realscan.

Also installed as the ``pcops-models`` console script. ``python -m pcops.models.demo`` runs the demo.
``train``, ``evaluate`` and ``infer`` run data-parallel under ``torchrun --nproc_per_node=N``
(see :mod:`pcops.models.distributed`); rank 0 prints the results.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def _common(p):
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--workers", type=int, default=None, help="loader / generator worker processes")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _dist(p):
    p.add_argument(
        "--dist-backend",
        choices=("nccl", "gloo"),
        default=None,
        help="under torchrun: the process-group backend (default: nccl on CUDA, gloo on the CPU)",
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pcops.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write a simulated split in the KITTI layout")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--train", type=int, default=3712, help="training scans")
    g.add_argument("--val", type=int, default=1000, help="validation scans (disjoint seeds)")
    g.add_argument("--scene-version", type=int, default=2, choices=(1, 2),
                   help="pcops.sim scenes: 2 (default, the shipped weights' data: vans, trucks, car types, limbs, "
                        "clutter) or 1 (the earlier, simpler scenes)")  # fmt: skip
    _common(g)
    t = sub.add_parser("train", help="train PointPillars (OpenPCDet's recipe), then evaluate")
    t.add_argument("--data", required=True, help="KITTI-format folder (real KITTI or a generated split)")
    t.add_argument("--out", default="out/train")
    t.add_argument("--epochs", type=int, default=40)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=0.003)
    t.add_argument("--amp", choices=("bf16", "fp16", "none"), default="bf16")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    t.add_argument("--resume", default=None, help="checkpoint.pt to resume from")
    t.add_argument("--eval-split", default="val", help="split evaluated at the end ('' for none)")
    t.add_argument("--export", default=None, help="also write shipped-format weights (fp16) here")
    t.add_argument("--deterministic", action="store_true", help="deterministic cuDNN (slower)")
    t.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds of training: the one-cycle schedule is fitted to it after 70 steps",
    )
    t.add_argument("--sync-bn", action="store_true", help="under torchrun: SyncBatchNorm over all ranks")
    t.add_argument(
        "--sensor-aug",
        action="store_true",
        help="also the sim-to-real augmentations (object scale, beam dropout, reflectance, sensor height)",
    )
    t.add_argument("--precise-bn-batches", type=int, default=20, help="BatchNorm re-estimation batches (0: off)")
    _common(t)
    _dist(t)
    e = sub.add_parser("evaluate", help="AP|R40 of weights on a split")
    e.add_argument("--data", required=True)
    e.add_argument("--split", default="val")
    e.add_argument("--weights", default=None, help="weights (default: the shipped ones)")
    e.add_argument("--max-scans", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=16)
    _common(e)
    _dist(e)
    i = sub.add_parser("infer", help="detect on a folder or split, write LiDAR-frame detection files")
    i.add_argument("--data", required=True, help="KITTI root, a folder with velodyne/, or a folder of scans")
    i.add_argument("--split", default=None, help="ImageSets/<split>.txt of a KITTI root (default: every scan)")
    i.add_argument("--weights", default=None, help="weights (default: the shipped ones)")
    i.add_argument("--out", required=True, help="output folder: <frame>.txt per scan")
    i.add_argument("--batch-size", type=int, default=1, help="scans per forward (per rank)")
    i.add_argument("--eager", action="store_true", help="no CUDA graph on CUDA")
    i.add_argument("--kitti-labels", action="store_true", help="also write KITTI camera-frame labels (needs calib)")
    _common(i)
    _dist(i)
    r = sub.add_parser("realscan", help="per-object results and false positives on real KITTI-format scans")
    r.add_argument("--data", required=True, help="a KITTI training folder (velodyne/, label_2/, calib/)")
    r.add_argument("--weights", default=None, help="weights (default: the shipped ones)")
    r.add_argument("--out", default=None, help="folder for realscan.json and a BEV picture per scan")
    r.add_argument("--score", type=float, default=0.3, help="detection score threshold")
    r.add_argument("--fp-score", type=float, default=0.5, help="score threshold of false positives")
    r.add_argument("--iou", type=float, default=0.5, help="BEV IoU of a detected object")
    _common(r)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workers = args.workers if args.workers is not None else 4
    if args.command == "realscan":
        from .pointpillars import PointPillars
        from .realscan import evaluate_real_scans, print_report

        model = PointPillars.pretrained(args.weights).to(device).eval()
        rec = evaluate_real_scans(
            model, args.data, score=args.score, fp_score=args.fp_score, iou=args.iou, out=args.out
        )
        print_report(rec)
        return 0
    if args.command == "generate":
        from .data import generate_split

        summary = generate_split(
            args.out,
            args.train,
            args.val,
            workers=args.workers,
            progress=not args.no_progress,
            scene_version=args.scene_version,
        )
        print(json.dumps(summary, indent=1))
        return 0
    from . import distributed as dd

    try:
        rc = _run(args, device, workers, dd)
    except BaseException:
        dd.cleanup(wait=False)
        raise
    dd.cleanup()
    return rc


def _run(args, device, workers, dd) -> int:
    import torch

    if args.command == "train":
        from .train import TrainConfig, export_weights, train

        cfg = TrainConfig(
            data=args.data,
            out=args.out,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            amp=args.amp,
            workers=workers,
            seed=args.seed,
            device=device,
            max_steps=args.max_steps,
            resume=args.resume,
            eval_split=args.eval_split or None,
            deterministic=args.deterministic,
            time_budget=args.time_budget,
            progress=not args.no_progress,
            sync_bn=args.sync_bn,
            sensor_aug=args.sensor_aug,
            precise_bn_batches=args.precise_bn_batches,
            dist_backend=args.dist_backend,
        )
        from .pointpillars import PointPillars

        torch.manual_seed(args.seed)  # the initial weights (rank 0's; DDP broadcasts them)
        model = PointPillars()
        record = train(cfg, model)
        main = dd.current().is_main
        if args.export and main:
            record["exported_bytes"] = export_weights(model, args.export)
        if main:
            print(json.dumps({k: v for k, v in record.items() if k != "history"}, indent=1))
        return 0
    env, device = dd.setup(device, args.dist_backend)
    if args.command == "evaluate":
        from .pointpillars import PointPillars
        from .train import evaluate_dataset

        model = PointPillars.pretrained(args.weights).to(device)
        res = evaluate_dataset(
            model, args.data, args.split, args.batch_size, workers, not args.no_progress, max_scans=args.max_scans
        )
        if env.is_main:
            res["world_size"] = env.world_size
            print(json.dumps(res, indent=1))
        return 0
    if args.command == "infer":
        from .infer import find_scans, infer
        from .pointpillars import PointPillars

        scans = find_scans(args.data, args.split)
        model = PointPillars.pretrained(args.weights).to(device)
        rec = infer(
            model,
            scans,
            args.out,
            batch_size=args.batch_size,
            workers=workers,
            capture=False if args.eager else None,
            kitti_labels=args.kitti_labels,
            progress=not args.no_progress,
        )
        if env.is_main:
            print(json.dumps(rec, indent=1))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
