"""N1/N2: rotated BEV NMS, 4,096 boxes (IoU threshold 0.01 and 0.5) and 16,384 boxes (0.5).

Boxes from WORKLOADS.md (``numpy.random.default_rng(0)`` per workload, x, y, z, dx, dy, dz,
heading, score drawn in that order, one array of N at a time), on the GPU.

Implementations, all in the same run:
* pcops ``nms_bev`` (CUDA C++ mask + single-block pass, the default on CUDA; and the Triton
  backend): the variable-length form (one host sync to size the output), the padded form eager
  (no sync) and the padded form captured in a CUDA graph; plus OpenPCDet's PointPillars setting
  (pre 4,096, post 500, padded, graph) on N1 at 0.01.
* baseline, plain torch: the float64 clipping reference IoU (``pcops.reference.nms``) on the GPU
  for the pairs whose bounding circles touch, ``IoU > thr`` copied to the host, greedy loop on
  the host (the peers' structure: GPU mask, host loop); fewer repetitions (it is slow).

Repetitions: 100 (``--quick``: 30) per row, except the slow rows: the baseline (5 at N1, 2 at
N2) and, with ``--quick``, the Triton backend (10 at N1, 5 at N2: about 8 and 110 ms per call on
the H200), so that ``--quick`` stays within about 35 s. Each row's ``runs`` says how many were timed; the notes give
the wall-clock seconds spent per workload.
* pass v1 rows (CUDA): the same pipeline with the first pass kernel ``nms_pass``
  (``pass_variant="v1"``; the default is the pipelined ``nms_pass_v2``), graph-captured and
  kernel-only; the notes' ``pass_v2_equals_v1`` say per workload whether the outputs (pass kernel
  on the same mask, padded N and padded 500) are equal, computed in the run.
* ``torchvision.ops.nms`` on the boxes' axis-aligned bounds (an easier problem: no rotation);
  skipped with a note where torchvision is not installed.
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
from pcops.reference import nms as ref
from pcops.triton import nms as tri

WORKLOADS = [("N1", 4096, 0.01), ("N1", 4096, 0.5), ("N2", 16384, 0.5)]


def make(n):
    rng = np.random.default_rng(0)
    cols = [
        rng.uniform(0, 69.12, n), rng.uniform(-39.68, 39.68, n), rng.uniform(-2, 0, n),
        rng.uniform(3.2, 4.7, n), rng.uniform(1.4, 2.0, n), rng.uniform(1.4, 1.7, n), rng.uniform(-math.pi, math.pi, n),
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


def _impl(backend):
    if backend == "cuda":
        from pcops.cuda import nms as impl
    else:
        from pcops.triton import nms as impl
    return impl


def pass_impl(variant):
    """``pcops.cuda.nms`` with the private pass kernel ``variant`` (``"v1"`` or ``"v2"``), for
    ``pcops.triton.nms.nms_bev`` (the path ``pcops.nms_bev(backend="cuda")`` takes, without the
    custom-op dispatch; rows with it are graph-captured or kernel-only, so that costs nothing)."""
    import functools
    import types

    from pcops.cuda import nms as cuda_impl

    return types.SimpleNamespace(nms_sorted=functools.partial(cuda_impl.nms_sorted, pass_variant=variant))


def main():
    args = parse_args(__doc__)
    rep = 30 if args.quick else 100
    warm = 3 if args.quick else 10
    try:
        import torchvision
    except ImportError:
        torchvision = None
    rows, notes = [], {"torchvision": getattr(torchvision, "__version__", "not installed"),
                       "peers_not_installed": "OpenPCDet iou3d_nms, mmcv nms_rotated (issue 5 quotes their H200 figures)",
                       "host_cpus": len(os.sched_getaffinity(0)), "torch_cpu_threads": torch.get_num_threads(),
                       "wall_s": {}, "pass_v2_equals_v1": {}}
    for wl, n, thr in WORKLOADS:
        t0 = time.perf_counter()
        boxes, scores = make(n)
        name = f"{wl} N={n} thr={thr}"
        want = torch_baseline(boxes, scores, thr)  # also the baseline's warm-up
        base = bench(lambda: torch_baseline(boxes, scores, thr), warmup=0, rep=2 if n > 4096 else 5)
        rows.append(row(name, "torch: ref IoU on GPU + host loop", base, items=n, unit="boxes/s", baseline=base))
        if torchvision is not None:
            aabb = axis_aligned(boxes)
            t = bench(lambda: torchvision.ops.nms(aabb, scores, thr), warmup=warm, rep=rep)
            rows.append(row(name, "torchvision.ops.nms (axis-aligned)", t, items=n, unit="boxes/s", baseline=base))
        for backend in ("cuda", "triton"):
            # the Triton backend takes about 8 ms (N1) and 110 ms (N2) per call on the H200:
            # fewer repetitions with --quick (10 at N1, 5 at N2)
            slow = args.quick and backend == "triton" and n > 4096
            r, w = (5, 1) if slow else (10, warm) if args.quick and backend == "triton" else (rep, warm)
            got = pcops.nms_bev(boxes, scores, thr, backend=backend)  # compiles; the first warm-up
            agree = got.tolist() == want.tolist()
            var = lambda: pcops.nms_bev(boxes, scores, thr, backend=backend)
            pad = lambda: pcops.nms_bev(boxes, scores, thr, post_max_size=n, padded=True, backend=backend)
            activities = gpu_activities(pad, iters=1 if slow else 5)
            t = bench(var, warmup=w, rep=r)
            rows.append(row(name, f"pcops {backend} (1 sync)", t, items=n, unit="boxes/s", baseline=base,
                            kept=got.numel(), agrees_with_baseline=agree))
            t = bench(pad, warmup=w, rep=r)
            rows.append(row(name, f"pcops {backend} padded", t, items=n, unit="boxes/s", baseline=base,
                            gpu_activities=activities))
            t = bench(pad, warmup=0 if slow else w, rep=r, graph=True)  # graph=True runs 3 calls before capture
            rows.append(row(name, f"pcops {backend} padded, graph", t, items=n, unit="boxes/s", baseline=base))
            # stages (graph-free, eager launches): sort, mask, pass
            impl = _impl(backend)
            order = tri.sort_order(scores, None)
            mask = impl.nms_mask(boxes, order, None, thr)
            t_sort = bench(lambda: tri.sort_order(scores, None), warmup=warm, rep=rep)
            t_mask = bench(lambda: impl.nms_mask(boxes, order, None, thr), warmup=w, rep=r)
            t_pass = bench(lambda: impl.nms_pass(mask, boxes, scores, order, n), warmup=warm, rep=rep)
            for stage, tt in (("sort", t_sort), ("mask kernel", t_mask), ("pass kernel", t_pass)):
                rows.append(row(name, f"  stage {backend}: {stage}", tt, items=n, unit="boxes/s"))
            if backend == "cuda":
                # the first pass kernel nms_pass (v1) vs the default nms_pass_v2: same mask, same sort
                v1, v2 = pass_impl("v1"), pass_impl("v2")
                out1, c1 = impl.nms_pass(mask, boxes, scores, order, n, pass_variant="v1")
                out2, c2 = impl.nms_pass(mask, boxes, scores, order, n, pass_variant="v2")
                pad1 = lambda: tri.nms_bev(boxes, scores, None, thr, None, n, True, v1)
                p1, p2 = pad1(), pad()
                post1 = tri.nms_bev(boxes, scores, None, thr, None, 500, True, v1)
                post2 = tri.nms_bev(boxes, scores, None, thr, None, 500, True, v2)
                same = (out1.tolist() == out2.tolist() and int(c1) == int(c2) and p1[0].tolist() == p2[0].tolist()
                        and int(p1[1]) == int(p2[1]) and post1[0].tolist() == post2[0].tolist()
                        and int(post1[1]) == int(post2[1]))
                notes["pass_v2_equals_v1"][name] = same
                t = bench(pad1, warmup=w, rep=r, graph=True)
                rows.append(row(name, "pcops cuda padded, graph (pass v1)", t, items=n, unit="boxes/s", baseline=base,
                                equals_v2=same))
                t = bench(lambda: impl.nms_pass(mask, boxes, scores, order, n, pass_variant="v1"), warmup=warm, rep=rep)
                rows.append(row(name, "  stage cuda: pass kernel v1", t, items=n, unit="boxes/s", equals_v2=same))
        if wl == "N1" and thr == 0.01:
            e1 = lambda: pcops.nms_bev(boxes, scores, thr, pre_max_size=4096, post_max_size=500, padded=True)
            t = bench(e1, warmup=warm, rep=rep, graph=True)
            rows.append(row(name, "pcops pre 4096 / post 500, graph", t, items=n, unit="boxes/s", baseline=base))
            v1 = pass_impl("v1")
            e1v1 = lambda: tri.nms_bev(boxes, scores, None, thr, 4096, 500, True, v1)
            t = bench(e1v1, warmup=warm, rep=rep, graph=True)
            rows.append(row(name, "pcops cuda pre 4096 / post 500, graph (pass v1)", t, items=n, unit="boxes/s",
                            baseline=base))
        notes["wall_s"][name] = round(time.perf_counter() - t0, 2)
    report(rows, "nms", args.out, notes=notes)


if __name__ == "__main__":
    main()
