"""N1/N2: rotated BEV NMS, 4,096 boxes (IoU threshold 0.01 and 0.5) and 16,384 boxes (0.5); and
the batched form at E2's post-processing (8 scans × 4,096 boxes, threshold 0.01, pre 4,096, post 500).

Boxes from WORKLOADS.md (``numpy.random.default_rng(0)`` per workload, x, y, z, dx, dy, dz,
heading, score drawn in that order, one array of N at a time), on the GPU.

Implementations, all in the same run:
* pcops ``nms_bev``, the default on CUDA (CUDA C++: ``nms_rank`` sort + prepared boxes,
  ``nms_mask_b`` tile mask, ``nms_pass_b`` pipelined pass; three launches): the variable-length
  form (one host sync to size the output), the padded form eager (no sync) and captured in a CUDA
  graph (with the profiler's per-kernel GPU µs in ``gpu_activities``), and each of its three
  kernels captured alone (``stage`` rows: kernel time + ~2 µs of graph launch; the pass also
  with the other block sizes among 256, 512 and 1024 threads).
* the Triton backend (padded, graph; with ``--quick`` only that row, few repetitions: ~8 ms (N1)
  and ~110 ms (N2) per call on the H200); the notes' ``equal_outputs`` say per workload whether
  it gives the CUDA pipeline's outputs.
* OpenPCDet's PointPillars setting (pre 4,096, post 500, padded, graph) on N1 at 0.01; and the
  same with the input PointPillars gives it (boxes in top-k order, NaN scores below the score
  threshold: here all but the first 400).
* B8: ``pcops.nms_bev`` on boxes ``(8, 4096, 7)`` (one set of launches, graph and eager) against
  the loop of 8 per-scan calls it replaces in PointPillars' batch-8 post-processing (graph; the
  baseline of that workload).
* baseline, plain torch: the float64 clipping reference IoU (``pcops.reference.nms``) on the GPU
  for the pairs whose bounding circles touch, ``IoU > thr`` copied to the host, greedy loop on
  the host (the peers' structure: GPU mask, host loop); fewer repetitions (it is slow).
* ``torchvision.ops.nms`` on the boxes' axis-aligned bounds (an easier problem: no rotation);
  skipped with a note where torchvision is not installed.

Repetitions: 100 (``--quick``: 30) per row, except the slow rows (the baseline: 5 at N1, 2 at N2;
Triton with ``--quick``). Each row's ``runs`` says how many were timed; the notes give the
wall-clock seconds spent per workload.
The peers measured elsewhere on the H200 (issue 5): OpenPCDet ``nms_gpu`` 2.2-2.5 ms (N1) and
28.6 ms (N2), mmcv ``nms_rotated`` 50.4 ms (N2); they are not installed here.
"""

import math
import os
import time

import numpy as np
import torch

from common import bench, gpu_activities, parse_args, report, row

import pcops
from pcops.cuda import nms as cuda_impl
from pcops.reference import nms as ref

WORKLOADS = [("N1", 4096, 0.01), ("N1", 4096, 0.5), ("N2", 16384, 0.5)]
BATCH = (8, 4096, 0.01, 4096, 500)  # scans, boxes per scan, threshold, pre, post (E2's NMS)


def make(n):
    rng = np.random.default_rng(0)
    cols = [
        rng.uniform(0, 69.12, n),
        rng.uniform(-39.68, 39.68, n),
        rng.uniform(-2, 0, n),
        rng.uniform(3.2, 4.7, n),
        rng.uniform(1.4, 2.0, n),
        rng.uniform(1.4, 1.7, n),
        rng.uniform(-math.pi, math.pi, n),
    ]
    scores = rng.uniform(0, 1, n)
    boxes = torch.from_numpy(np.stack(cols, 1)).float().cuda()
    return boxes, torch.from_numpy(scores).float().cuda()


def torch_baseline(boxes, scores, thr):
    """Plain torch: sort, reference IoU of candidate pairs on the GPU, mask to the host, greedy loop."""
    order = torch.sort(scores, descending=True, stable=True).indices
    b = boxes[order]
    over = (ref.boxes_iou_bev(b, b) > thr).cpu().numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep = []
    for i in range(len(order)):
        if not removed[i]:
            keep.append(i)
            removed |= over[i]
    return order[torch.tensor(keep, device=boxes.device)]


def axis_aligned(boxes):
    """(x1, y1, x2, y2) bounds of the rotated BEV rectangles (for torchvision's NMS)."""
    c, s = boxes[:, 6].cos().abs(), boxes[:, 6].sin().abs()
    hx = 0.5 * (boxes[:, 3] * c + boxes[:, 4] * s)
    hy = 0.5 * (boxes[:, 3] * s + boxes[:, 4] * c)
    return torch.stack([boxes[:, 0] - hx, boxes[:, 1] - hy, boxes[:, 0] + hx, boxes[:, 1] + hy], 1)


def same(a, b):
    return a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def main():
    args = parse_args(__doc__)
    rep = 30 if args.quick else 100
    warm = 3 if args.quick else 10
    try:
        import torchvision
    except ImportError:
        torchvision = None
    rows, notes = (
        [],
        {
            "torchvision": getattr(torchvision, "__version__", "not installed"),
            "peers_not_installed": "OpenPCDet iou3d_nms, mmcv nms_rotated (issue 5 quotes their H200 figures)",
            "host_cpus": len(os.sched_getaffinity(0)),
            "torch_cpu_threads": torch.get_num_threads(),
            "wall_s": {},
            "equal_outputs": {},
        },
    )
    for wl, n, thr in WORKLOADS:
        t0 = time.perf_counter()
        boxes, scores = make(n)
        name = f"{wl} N={n} thr={thr}"
        kw = dict(items=n, unit="boxes/s")
        want = torch_baseline(boxes, scores, thr)  # also the baseline's warm-up
        base = bench(lambda: torch_baseline(boxes, scores, thr), warmup=0, rep=2 if n > 4096 else 5)
        rows.append(row(name, "torch: ref IoU on GPU + host loop", base, baseline=base, **kw))
        if torchvision is not None:
            aabb = axis_aligned(boxes)
            t = bench(lambda: torchvision.ops.nms(aabb, scores, thr), warmup=warm, rep=rep)
            rows.append(row(name, "torchvision.ops.nms (axis-aligned)", t, baseline=base, **kw))

        # the default CUDA pipeline (rank sort, mask, pass)
        got = pcops.nms_bev(boxes, scores, thr)  # compiles; the first warm-up
        var = lambda: pcops.nms_bev(boxes, scores, thr)
        pad = lambda: pcops.nms_bev(boxes, scores, thr, post_max_size=n, padded=True)
        t = bench(var, warmup=warm, rep=rep)
        rows.append(
            row(
                name,
                "pcops cuda (1 sync)",
                t,
                baseline=base,
                kept=got.numel(),
                agrees_with_baseline=got.tolist() == want.tolist(),
                **kw,
            )
        )
        t = bench(pad, warmup=warm, rep=rep)
        rows.append(row(name, "pcops cuda padded", t, baseline=base, **kw))
        t = bench(pad, warmup=warm, rep=rep, graph=True)
        rows.append(
            row(name, "pcops cuda padded, graph", t, baseline=base, gpu_activities=gpu_activities(pad, iters=5), **kw)
        )
        order, sbox, sg = cuda_impl.rank_prepare(boxes[None], scores[None], None, n)
        mask, invalid = cuda_impl.mask_b(sbox, None, thr)
        for stage, fn in (
            ("rank sort", lambda: cuda_impl.rank_prepare(boxes[None], scores[None], None, n)),
            ("mask_b", lambda: cuda_impl.mask_b(sbox, None, thr)),
            ("pass_b", lambda: cuda_impl.pass_b(mask, invalid, order, n)),
        ):
            t = bench(fn, warmup=warm, rep=rep, graph=True)
            rows.append(row(name, f"  stage cuda: {stage} (graph)", t, **kw))
        for threads in (256, 512, 1024):  # the pass with other threads per block (default: pass_threads)
            if threads == cuda_impl.pass_threads(mask.shape[2]):
                continue
            fn = lambda threads=threads: cuda_impl.pass_b(mask, invalid, order, n, threads=threads)
            t = bench(fn, warmup=warm, rep=rep, graph=True)
            rows.append(
                row(
                    name,
                    f"  stage cuda: pass_b {threads} threads (graph)",
                    t,
                    equal=same(fn(), cuda_impl.pass_b(mask, invalid, order, n)),
                    **kw,
                )
            )

        outs = {"new": pad()}

        # Triton backend
        slow = args.quick
        r = (2 if n > 4096 else 5) if slow else rep
        tpad = lambda: pcops.nms_bev(boxes, scores, thr, post_max_size=n, padded=True, backend="triton")
        tpad()  # compiles
        t = bench(tpad, warmup=1 if slow else warm, rep=r, graph=True)
        notes["equal_outputs"][name] = same(tpad(), outs["new"])
        rows.append(row(name, "pcops triton padded, graph", t, baseline=base, **kw))
        if not slow:
            t = bench(tpad, warmup=warm, rep=r)
            rows.append(
                row(name, "pcops triton padded", t, baseline=base, gpu_activities=gpu_activities(tpad, iters=2), **kw)
            )

        if wl == "N1" and thr == 0.01:
            e1 = lambda: pcops.nms_bev(boxes, scores, thr, pre_max_size=4096, post_max_size=500, padded=True)
            t = bench(e1, warmup=warm, rep=rep, graph=True)
            rows.append(row(name, "pcops pre 4096 / post 500, graph", t, baseline=base, **kw))
            # what PointPillars passes: top-k order (scores descending) and NaN below the score
            # threshold (here all but the first 400)
            s_top, perm = torch.sort(scores, descending=True)
            b_top = boxes[perm].contiguous()
            s_top = s_top.clone()
            s_top[400:] = float("nan")
            e1m = lambda: pcops.nms_bev(b_top, s_top, thr, pre_max_size=4096, post_max_size=500, padded=True)
            t = bench(e1m, warmup=warm, rep=rep, graph=True)
            rows.append(row(name, "pcops top-k order + NaN tail (400 valid), graph", t, baseline=base, **kw))
        notes["wall_s"][name] = round(time.perf_counter() - t0, 2)

    # B8: the batched form vs the per-scan loop (PointPillars at batch 8)
    t0 = time.perf_counter()
    bsz, n, thr, pre, post = BATCH
    boxes, scores = make(bsz * n)
    b8, s8 = boxes.view(bsz, n, 7), scores.view(bsz, n)
    name = f"B8 {bsz}x{n} thr={thr}"
    kw = dict(items=bsz * n, unit="boxes/s")
    batched = lambda: pcops.nms_bev(b8, s8, thr, pre_max_size=pre, post_max_size=post, padded=True)
    loop_new = lambda: [
        pcops.nms_bev(b8[i], s8[i], thr, pre_max_size=pre, post_max_size=post, padded=True) for i in range(bsz)
    ]
    got = batched()
    stack = lambda outs: (torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs]))
    notes["equal_outputs"][name] = same(got, stack(loop_new()))
    base = bench(loop_new, warmup=warm, rep=rep, graph=True)
    rows.append(row(name, "loop of 8, pcops cuda, graph", base, baseline=base, **kw))
    t = bench(batched, warmup=warm, rep=rep, graph=True)
    rows.append(
        row(
            name,
            "pcops cuda batched (B, N, 7), graph",
            t,
            baseline=base,
            kept=got[1].tolist(),
            gpu_activities=gpu_activities(batched, iters=5),
            **kw,
        )
    )
    t = bench(batched, warmup=warm, rep=rep)
    rows.append(row(name, "pcops cuda batched (B, N, 7)", t, baseline=base, **kw))
    notes["wall_s"][name] = round(time.perf_counter() - t0, 2)
    report(rows, "nms", args.out, notes=notes)


if __name__ == "__main__":
    main()
