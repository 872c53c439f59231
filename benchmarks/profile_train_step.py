"""Where a PointPillars training step spends its time on the GPU (issue 22's training budget).

Runs ``--warmup`` steps, then ``--steps`` unsynchronised steps (the loop's real step time), then
``--marked`` synchronised steps split by stage (``train_step``'s marks), then ``--profiled`` steps
under ``torch.profiler``: the top CUDA kernels and CPU ops by self time. Writes one JSON.

    python benchmarks/profile_train_step.py --data SIM --out prof.json [--sensor-aug]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from common import environment
from pcops.models.data import EpochSampler, KittiDataset
from pcops.models.pointpillars import PointPillars
from pcops.models.train import TrainConfig, _build_optimizer, _loader, train_step


def _table(prof, key: str, n: int) -> list[dict]:
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:n]
    return [{"name": e.key[:120], "calls": e.count, "self_ms_per_step": round(getattr(e, key) / 1000, 3)} for e in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--sensor-aug", action="store_true")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--marked", type=int, default=20)
    ap.add_argument("--profiled", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    torch.backends.cudnn.benchmark = True
    cfg = TrainConfig(
        data=args.data,
        out="/tmp/profile_train_step",
        batch_size=args.batch_size,
        sensor_aug=args.sensor_aug,
        device=args.device,
        amp="bf16" if device.type == "cuda" else "none",
    )
    model = PointPillars().to(device).train()
    ds = KittiDataset(cfg.data, "train", model.config, augment=True, seed=0)
    sampler = EpochSampler(len(ds), 0, shuffle=True, start_epoch=0)
    loader = _loader(ds, cfg.batch_size, sampler, args.workers, args.device, drop_last=True)
    total = args.warmup + args.steps + args.marked + args.profiled
    opt, sched = _build_optimizer(model, cfg, total + 10)
    batches, epoch = [], 0
    while len(batches) < total:  # the batches are loaded first: the figures are the step's, not the loader's
        sampler.set_epoch(epoch)
        for b in loader:
            batches.append(b.to(device))
            if len(batches) == total:
                break
        epoch += 1
    points = [int(b.points.shape[0]) for b in batches]
    step = 0
    for b in batches[: args.warmup]:
        train_step(model, b, opt, sched, cfg, None, step)
        step += 1
    sync()
    t0 = time.perf_counter()
    for b in batches[args.warmup : args.warmup + args.steps]:
        train_step(model, b, opt, sched, cfg, None, step)
        step += 1
    sync()
    step_ms = 1000 * (time.perf_counter() - t0) / args.steps
    stages: dict = {}
    for b in batches[args.warmup + args.steps : args.warmup + args.steps + args.marked]:
        marks: list = []
        train_step(model, b, opt, sched, cfg, None, step, marks)
        step += 1
        for (_, a), (name, t) in zip(marks, marks[1:]):
            stages[name] = stages.get(name, 0.0) + (t - a) * 1000 / args.marked
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for b in batches[total - args.profiled :]:
            train_step(model, b, opt, sched, cfg, None, step)
            step += 1
        sync()
    scale = 1.0 / args.profiled
    cuda = _table(prof, "self_device_time_total", 30)
    cpu = _table(prof, "self_cpu_time_total", 30)
    for r in cuda + cpu:
        r["self_ms_per_step"] = round(r["self_ms_per_step"] * scale, 3)
        r["calls"] = round(r["calls"] * scale, 1)
    kernels = sum(e.self_device_time_total for e in prof.key_averages()) / 1000 * scale
    rec = {
        "workload": f"one PointPillars training step, batch {args.batch_size}, bf16 autocast"
        + (", --sensor-aug" if args.sensor_aug else ""),
        **environment(),
        "points_per_batch_mean": round(sum(points) / len(points)),
        "step_ms_unsynchronised": round(step_ms, 2),
        "stage_ms_synchronised": {k: round(v, 2) for k, v in stages.items()},
        "cuda_kernel_ms_per_step": round(kernels, 2),
        "top_cuda": cuda,
        "top_cpu": cpu,
    }
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)
    print(json.dumps({k: v for k, v in rec.items() if k not in ("top_cuda", "top_cpu")}, indent=1))
    for r in cuda[:20]:
        print(f"{r['self_ms_per_step']:8.3f} ms {r['calls']:7.1f}x  {r['name']}")


if __name__ == "__main__":
    main()
