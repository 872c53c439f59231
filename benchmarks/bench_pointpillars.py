"""E1/E2: PointPillars end to end (OpenPCDet KITTI pointpillar.yaml), points on the GPU → final boxes.

E1: SCAN, batch 1. Implementations, all in this run: the plain-torch reference path (pcops'
reference ops, OpenPCDet's module structure: the baseline), and the pcops fast path (fused PFN
kernel, folded BatchNorm, fused head, sync-free post-processing), eager and CUDA-graph captured,
fp32 (TF32 convolutions, PyTorch's default) and fp16; per-stage medians (CUDA events around each
stage of an eager run) and the total (CUDA events around the whole call, median of ≥ 50 runs).
Graph stages: each stage captured in its own CUDA graph and replayed alone (the split of the graph total).
E2: 8 scans (the KITTI samples repeated) packed as one batch of 8; scans per second.

Weights are random (seeded, BatchNorm statistics from SCAN, see ``pcops.models.random_init.randomize_``):
the time does not depend on them except through the boxes reaching NMS (the fast path always
hands the 4,096 top-scoring anchors to the padded NMS, those under the score threshold marked
invalid with a NaN score; the reference path's detection count is in the notes).
Goals (issue 8): E1 ≤ 1.5 ms fp32 and ≤ 1.0 ms fp16 graph-captured; E2 ≥ 2,000 scans/s fp16.
"""

from __future__ import annotations

import contextlib

import torch

from common import gpu_activities, bench, load_scan, parse_args, report, row

from pcops.models.pointpillars import PointPillars
from pcops.models.random_init import randomize_
from pcops.models.timing import StageTimer, null_timer


def stage_rows(model, pts, lengths, workload, impl, rep, base_stages):
    timer = StageTimer(pts.device)
    model.stage_timer = timer
    try:
        for _ in range(5):
            model(pts, lengths)
        timer.reset()
        for _ in range(rep):
            timer.new_run()
            model(pts, lengths)
        torch.cuda.synchronize()
    finally:
        model.stage_timer = null_timer
    rows = []
    for name, s in timer.summary().items():
        base = base_stages.get(name) if base_stages else None
        rows.append(row(f"{workload} stage {name}", impl, {**s, "runs": rep}, baseline=base))
    return rows, timer.summary()


PROFILES: dict | None = {}  # per-kernel GPU time of some stages, written into the JSON notes
PROFILED: set = set()


def graph_stage_rows(model, scans_gpu, tag, rep, workload="E1", cudnn_benchmark=False):
    """Each stage of the captured pipeline in its own CUDA graph (inputs from the previous stage):
    the per-stage split of the graph-captured total, for one scan or a batch (a list of scans)."""
    from pcops.models.graph import (
        GraphedPointPillars,
        cudnn_benchmark_mode as _cudnn_benchmark,
        fixed_voxelize as _fixed_voxelize,
    )
    import torch.nn.functional as F

    scans_gpu = scans_gpu if isinstance(scans_gpu, (list, tuple)) else [scans_gpu]
    cfg, dev, bsz = model.config, scans_gpu[0].device, len(scans_gpu)
    fp = model._fast_params(dev)
    cap = -(-max(max(s.shape[0] for s in scans_gpu), 131_072) // 1024) * 1024
    static = torch.full((bsz * cap, 4), GraphedPointPillars.PAD_VALUE, device=dev)
    for b, s in enumerate(scans_gpu):
        static[b * cap : b * cap + s.shape[0]] = s[:, :4]
    lengths = torch.full((bsz,), cap, dtype=torch.int32, device=dev)
    with torch.no_grad(), _cudnn_benchmark(cudnn_benchmark):
        vox = _fixed_voxelize(static, cfg, lengths)
        canvas = model._pfn_scatter(vox.voxels, vox.num_points, vox.coords, bsz, fp, count=vox.count)
        x = model._backbone_fast(canvas, fp)
        out = F.conv2d(x, fp.head_weight, fp.head_bias).permute(0, 2, 3, 1)
        stages = {
            "voxelize": lambda: _fixed_voxelize(static, cfg, lengths),
            "pfn+scatter": lambda: model._pfn_scatter(vox.voxels, vox.num_points, vox.coords, bsz, fp, count=vox.count),
            "backbone": lambda: model._backbone_fast(canvas, fp),
            "head": lambda: F.conv2d(x, fp.head_weight, fp.head_bias).permute(0, 2, 3, 1),
            "post": lambda: model._post_fast(out),
        }
        rows = []
        if PROFILES is not None and (workload, tag) not in PROFILED:
            PROFILED.add((workload, tag))  # where the GPU time of the big stages goes
            for name in ("voxelize", "pfn+scatter", "backbone", "post"):
                prof = gpu_activities(stages[name], iters=5)
                if "per_call_us" in prof:
                    prof["per_call_us"] = {k: round(v, 1) for k, v in list(prof["per_call_us"].items())[:12]}
                PROFILES[f"{workload} {tag} {name}"] = prof
        total = 0.0
        impl = f"pcops graph {tag}{' cudnn.benchmark' if cudnn_benchmark else ''} (stage alone)"
        for name, fn in stages.items():
            t = bench(fn, rep=rep, graph=True)
            total += t["median_ms"]
            rows.append(row(f"{workload} stage {name}", impl, t))
    rows.append(
        row(
            f"{workload} stage total",
            impl.replace("(stage alone)", "(sum of stages)"),
            {"median_ms": total, "min_ms": total, "max_ms": total, "runs": rep},
        )
    )
    return rows


@contextlib.contextmanager
def kernel_options(model, epilogue: str):
    """The model's backbone epilogue for the block, then restored."""
    saved = model.epilogue
    model.epilogue = epilogue
    try:
        yield
    finally:
        model.epilogue = saved


def main():
    args = parse_args(__doc__)
    rep = 30 if args.quick else 100
    scan, source = load_scan("000001")
    other, _ = load_scan("000000")
    pts = scan.cuda()
    model = randomize_(PointPillars(impl="reference"), seed=0, points=scan).cuda()
    rows, notes = [], {"scan": source, "points": int(scan.shape[0]), "weights": "random (seed 0)"}

    # ---- E1: batch 1
    model.impl, model.dtype = "reference", torch.float32
    notes["E1 detections reference"] = int(model(pts).count[0])
    base = bench(lambda: model(pts), rep=max(rep // 2, 50))
    rows.append(row("E1 total", "reference eager fp32", base, items=1, unit="scans/s", baseline=base))
    srows, base_stages = stage_rows(model, pts, None, "E1", "reference eager fp32", 50, None)
    rows += srows
    model.dtype = torch.float16
    t = bench(lambda: model(pts), rep=50)
    rows.append(row("E1 total", "reference eager fp16 (autocast)", t, items=1, unit="scans/s", baseline=base))
    for dtype, tag in ((torch.float32, "fp32"), (torch.float16, "fp16")):
        model.impl, model.dtype = "fast", dtype
        notes[f"E1 detections fast {tag}"] = int(model(pts).count[0])
        t = bench(lambda: model(pts), rep=rep)
        rows.append(row("E1 total", f"pcops eager {tag}", t, items=1, unit="scans/s", baseline=base))
        srows, _ = stage_rows(model, pts, None, "E1", f"pcops eager {tag}", 50, base_stages if tag == "fp32" else None)
        rows += srows
        graphed = model.capture(pts)
        t = bench(lambda: graphed(pts), rep=rep)
        rows.append(row("E1 total", f"pcops graph {tag}", t, items=1, unit="scans/s", baseline=base))
        # replay only (points already in the graph's buffer): the pipeline without the copy-in
        t = bench(graphed.graph.replay, rep=rep)
        rows.append(row("E1 total", f"pcops graph {tag} (replay only)", t, items=1, unit="scans/s", baseline=base))
        del graphed
        rows += graph_stage_rows(model, pts, tag, rep)
        # cuDNN's measured algorithm choice for the backbone (set for warm-up and capture only)
        graphed = model.capture(pts, cudnn_benchmark=True)
        t = bench(lambda: graphed(pts), rep=rep)
        rows.append(row("E1 total", f"pcops graph {tag} cudnn.benchmark", t, items=1, unit="scans/s", baseline=base))
        del graphed
    # fp32 with the backbone in NCHW (channels_last=False), graph-captured: the memory-format choice
    model.impl, model.dtype, model.channels_last = "fast", torch.float32, False
    graphed = model.capture(pts)
    t = bench(lambda: graphed(pts), rep=rep)
    rows.append(row("E1 total", "pcops graph fp32 NCHW", t, items=1, unit="scans/s", baseline=base))
    del graphed
    model.channels_last = None

    # ---- E2: 8 scans, batch 8
    scans = [scan, other] * 4
    lengths = [s.shape[0] for s in scans]
    batch = torch.cat(scans).cuda()
    lengths_dev = torch.tensor(lengths, device="cuda")
    model.impl, model.dtype = "reference", torch.float32
    base8 = bench(lambda: model(batch, lengths_dev), rep=20)
    rows.append(row("E2 B=8", "reference eager fp32", base8, items=8, unit="scans/s", baseline=base8))
    for dtype, tag in ((torch.float32, "fp32"), (torch.float16, "fp16")):
        model.impl, model.dtype = "fast", dtype
        t = bench(lambda: model(batch, lengths_dev), rep=rep // 2)
        rows.append(row("E2 B=8", f"pcops eager {tag}", t, items=8, unit="scans/s", baseline=base8))
        graphed = model.capture(batch, lengths)
        t = bench(lambda: graphed(batch, lengths), rep=rep)
        rows.append(row("E2 B=8", f"pcops graph {tag}", t, items=8, unit="scans/s", baseline=base8))
        del graphed
        if tag == "fp16":
            rows += graph_stage_rows(model, [s.cuda() for s in scans], tag, max(10, rep // 3), workload="E2")
    # ---- the fast path's backbone epilogue options (fp16, graph-captured)
    model.impl, model.dtype = "fast", torch.float16
    for epilogue in ("torch", "triton", "cudnn"):
        tag = f"fp16 epilogue={epilogue}"
        try:
            with kernel_options(model, epilogue):
                graphed = model.capture(pts)
                t = bench(lambda: graphed(pts), rep=rep)
                rows.append(row("E1 total", f"pcops graph {tag}", t, items=1, unit="scans/s", baseline=base))
                notes[f"E1 detections graph {tag}"] = int(graphed(pts).count[0])
                del graphed
                if epilogue != "torch":
                    graphed = model.capture(batch, lengths)
                    t = bench(lambda: graphed(batch, lengths), rep=rep)
                    rows.append(row("E2 B=8", f"pcops graph {tag}", t, items=8, unit="scans/s", baseline=base8))
                    del graphed
        except Exception as e:  # noqa: BLE001 - an option that fails here is reported, not fatal
            notes[f"error {tag}"] = repr(e)[:300]
    model.impl, model.dtype = "reference", torch.float32
    notes["gpu_activities (µs per call, top kernels)"] = PROFILES
    report(rows, "bench_pointpillars", args.out, notes)


if __name__ == "__main__":
    main()
