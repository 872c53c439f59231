"""Issue 19's eager table for one tree: the median CUDA-event time of single public calls (200
calls, warm), and the per-call time of a Python loop of 100 back-to-back calls, on the real
workloads (KITTI 000001; WORKLOADS.md ids), with the in-process baselines (torch eager and
``torch.compile`` for the fused ops, torch index assignment for P1) in the same process.

    PYTHONPATH=. python benchmarks/eager_calls.py --out DIR [--tag NAME]   # DIR/eager_calls[_NAME].json

Before/after a change: run it from two trees (``PYTHONPATH=<tree>``, ``--tag old`` / ``--tag new``)
alternately, old, new, old, new, in one GPU session (the host's speed drifts between sessions);
``results/eager_calls.json`` holds such rounds.

fwd+bwd rows: ``f(leaves).backward(dy)`` with the leaves' ``.grad`` reset to None first (as
``benchmarks/bench_layer_norm_gelu.py``); P1 fwd+bwd: ``canvas.backward(dy)`` with a random ``dy``
of the canvas shape (what a following convolution hands back). Rows marked "autograd single-thread"
run the same step under ``torch.autograd.set_multithreading_enabled(False)``: the backward runs on
the calling thread instead of being handed to the autograd engine's CUDA device thread (the
hand-off's wake-ups are a large part of a small backward's host time, for torch and pcops alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402
from bench_sparse_softmax import Q1_ROWS, segment_softmax  # noqa: E402
from common import S2_V3 as V3, environment, load_scan  # noqa: E402

V1 = dict(voxel_size=(0.16, 0.16, 4.0), point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1), max_points_per_voxel=32,
          max_voxels=16000)  # fmt: skip
SHAPE = [41, 1600, 1408]


def event_ms(fn, rep: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def loop_ms(fn, n: int = 100) -> float:
    """Per call: 100 back-to-back calls between two CUDA events (best of 3 rounds)."""
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / n)
    return best


def grad_step(f, leaves, dy, single_thread: bool = False):
    def run():
        for t in leaves:
            t.grad = None
        f().backward(dy)

    if not single_thread:
        return run

    def run_single():
        with torch.autograd.set_multithreading_enabled(False):
            run()

    return run_single


def cases() -> dict:
    pts = load_scan("000001")[0].cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    coords = pcops.voxelize(pts, **V3).coords
    out = {
        "S1 subm map": lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, 3, subm=True),
        "S1 subm map, pad_pairs": lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, 3, subm=True, pad_pairs=True),
        "S1 strided map": lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, 3, 2, 1),
        "V3 hard voxelization": lambda: pcops.voxelize(pts, **V3),
        "V1 hard voxelization": lambda: pcops.voxelize(pts, **V1),
        "V1 dynamic": lambda: pcops.dynamic_voxelize(pts, V1["voxel_size"], V1["point_cloud_range"]),
        "V1 dynamic cells_only": lambda: pcops.dynamic_voxelize(
            pts, V1["voxel_size"], V1["point_cloud_range"], cells_only=True
        ),
    }
    # P1: the V1 pillars, 64 channels, batch 1, KITTI's 496 x 432 canvas
    pc = pcops.voxelize(pts, **V1).coords
    pf = torch.randn(pc.shape[0], 64, device="cuda", generator=g)
    pfg = pf.clone().requires_grad_(True)
    dcan = torch.randn(1, 64, 496, 432, device="cuda", generator=g)
    idx = (pc[:, 2].long() * 432 + pc[:, 3].long()).contiguous()

    def torch_scatter(f):
        canvas = f.new_zeros(64, 496 * 432)
        canvas[:, idx] = f.t()
        return canvas.view(1, 64, 496, 432)

    out["P1 fwd"] = lambda: pcops.pillar_scatter(pf, pc, 1, (496, 432))
    out["P1 fwd, torch index assignment"] = lambda: torch_scatter(pf)
    out["P1 fwd+bwd"] = grad_step(lambda: pcops.pillar_scatter(pfg, pc, 1, (496, 432)), (pfg,), dcan)
    out["P1 fwd+bwd, torch index assignment"] = grad_step(lambda: torch_scatter(pfg), (pfg,), dcan)
    if hasattr(torch.autograd, "set_multithreading_enabled"):
        out["P1 fwd+bwd, autograd single-thread"] = grad_step(
            lambda: pcops.pillar_scatter(pfg, pc, 1, (496, 432)), (pfg,), dcan, True
        )
        out["P1 fwd+bwd, torch index assignment, autograd single-thread"] = grad_step(
            lambda: torch_scatter(pfg), (pfg,), dcan, True
        )

    # L1-L3: fused LayerNorm + GELU against torch eager and torch.compile (default mode)
    def torch_ln(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), approximate="tanh")

    compiled = torch.compile(torch_ln)
    for wl, m, n, dt in (("L1", 4096, 768, torch.float32), ("L2", 131072, 256, torch.bfloat16),
                         ("L3", 131072, 64, torch.float32)):  # fmt: skip
        x = torch.randn(m, n, device="cuda", generator=g).to(dt)
        w, b = (torch.randn(n, device="cuda", generator=g).to(dt) for _ in range(2))  # torch needs x.dtype
        dy = torch.randn(m, n, device="cuda", generator=g).to(dt)
        leaves = tuple(t.clone().requires_grad_(True) for t in (x, w, b))
        for name, f in (("pcops", pcops.fused_layer_norm_gelu), ("torch eager", torch_ln), ("torch.compile", compiled)):
            out[f"{wl} fwd, {name}"] = lambda f=f, x=x, w=w, b=b: f(x, w, b)
            out[f"{wl} fwd+bwd, {name}"] = grad_step(lambda f=f, lv=leaves: f(*lv), leaves, dy)
            if wl == "L2" and name != "torch.compile":
                out[f"{wl} fwd+bwd, {name}, autograd single-thread"] = grad_step(
                    lambda f=f, lv=leaves: f(*lv), leaves, dy, True
                )

    # Q1: CSR softmax against torch's segment softmax (scatter_reduce + index_add)
    gc = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 65, (Q1_ROWS,), generator=gc)
    crow = torch.zeros(Q1_ROWS + 1, dtype=torch.int64)
    crow[1:] = lengths.cumsum(0)
    crow = crow.cuda()
    row_ids = torch.repeat_interleave(torch.arange(Q1_ROWS, device="cuda"), lengths.cuda())
    v = torch.randn(int(crow[-1]), device="cuda", generator=g)
    vg, dv = v.clone().requires_grad_(True), torch.randn_like(v)
    out["Q1 fwd, pcops"] = lambda: pcops.sparse_softmax(v, crow)
    out["Q1 fwd, torch segment softmax"] = lambda: segment_softmax(v, row_ids, Q1_ROWS)
    out["Q1 fwd+bwd, pcops"] = grad_step(lambda: pcops.sparse_softmax(vg, crow), (vg,), dv)
    out["Q1 fwd+bwd, torch segment softmax"] = grad_step(lambda: segment_softmax(vg, row_ids, Q1_ROWS), (vg,), dv)
    seg_compiled = torch.compile(segment_softmax)
    out["Q1 fwd, torch.compile segment softmax"] = lambda: seg_compiled(v, row_ids, Q1_ROWS)
    out["Q1 fwd+bwd, torch.compile segment softmax"] = grad_step(lambda: seg_compiled(vg, row_ids, Q1_ROWS), (vg,), dv)
    if hasattr(torch.autograd, "set_multithreading_enabled"):
        for name, f in (("pcops", lambda: pcops.sparse_softmax(vg, crow)),
                        ("torch segment softmax", lambda: segment_softmax(vg, row_ids, Q1_ROWS))):  # fmt: skip
            out[f"Q1 fwd+bwd, {name}, autograd single-thread"] = grad_step(f, (vg,), dv, True)

    # N1: rotated BEV NMS of 4,096 boxes (bench_nms.make), the variable-length form (one sync) and
    # OpenPCDet's PointPillars setting (pre 4,096, post 500, padded, no sync)
    from bench_nms import make

    nb, ns = make(4096)
    out["N1 nms thr 0.01"] = lambda: pcops.nms_bev(nb, ns, 0.01)
    out["N1 nms thr 0.5"] = lambda: pcops.nms_bev(nb, ns, 0.5)
    out["N1 nms thr 0.01, pre 4096 post 500 padded"] = lambda: pcops.nms_bev(nb, ns, 0.01, 4096, 500, True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--tag", default="")
    p.add_argument(
        "--native",
        choices=("on", "off"),
        default="on",
        help="the native host path (pcops._native) loaded before timing (on) or turned off (off)",
    )
    p.add_argument("--only", default=None, help="run only the workloads whose name starts with one of these (a,b)")
    a = p.parse_args()
    from pcops import _native

    if a.native == "off":
        import os

        os.environ["PCOPS_NATIVE_HOST"] = "0"
    else:
        _native.request(wait=True)  # (the ops it takes register their shape classes at their first calls)
    rows = []
    for name, fn in cases().items():
        if a.only and not name.startswith(tuple(a.only.split(","))):
            continue
        r = {"workload": name, "event_ms": round(event_ms(fn), 4), "loop_ms": round(loop_ms(fn), 4)}
        rows.append(r)
        print(f"{name:40s} event {r['event_ms']:.4f} ms  loop {r['loop_ms']:.4f} ms", flush=True)
    env = environment()
    res = {"benchmark": "eager_calls", "environment": env, "pcops_file": pcops.__file__, "rows": rows,
           "native_host_path": _native.status()}  # fmt: skip
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        name = "eager_calls" + (f"_{a.tag}" if a.tag else "") + ".json"
        (Path(a.out) / name).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
