"""Host time of an eager op call on tiny inputs, and what the operator registration costs.

Two tables, on the CPU or a CUDA device (``--device``):

1. The registration layer alone, in one process: a kernel that allocates one tensor, registered
   as ``torch.library.custom_op`` does, as ``pcops._library.custom_op`` does, and with no autograd
   kernel at all (the floor of a Python kernel), each called with inputs that do not and that do
   require grad.
2. Every public op on inputs so small that its host time is the whole call: µs per call (median
   of 5 rounds of back-to-back calls). With ``--old PATH`` (a checkout of another commit) the same
   calls run in that tree too, in alternating subprocesses, and each row gets the ratio new/old.

``python benchmarks/dispatch_overhead.py --device cpu --old .cmp/prev --out DIR`` writes
``DIR/dispatch_overhead_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def host_us_per_call(fn, device: str, calls: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the µs per call of ``calls`` back-to-back calls (the GPU
    synchronised after each round). Also ``host_overhead.py``'s timer."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(max(calls // 10, 20)):
        fn()
    sync()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def registration_layers(device: str, calls: int) -> dict:
    from pcops import _library

    x = torch.randn(8, device=device)
    xg = x.clone().requires_grad_(True)

    def kernel(x: torch.Tensor, k: int, s: str) -> torch.Tensor:
        return torch.empty_like(x)

    def fake(x, k, s):
        return torch.empty_like(x)

    def setup(ctx, inputs, output):
        pass

    def backward(ctx, g):
        return g, None, None

    a = torch.library.custom_op("bench_dispatch::torch_custom_op", kernel, mutates_args=())
    a.register_fake(fake)
    a.register_autograd(backward, setup_context=setup)
    b = _library.custom_op("pcops::bench_dispatch_pcops", mutates_args=())(kernel)
    b.register_fake(fake)
    b.register_autograd(backward, setup_context=setup)
    lib = torch.library.Library("bench_dispatch", "FRAGMENT")
    lib.define("no_autograd(Tensor x, int k, str s) -> Tensor")
    lib.impl("no_autograd", kernel, "CompositeExplicitAutograd")
    ops = {
        "torch.library.custom_op": torch.ops.bench_dispatch.torch_custom_op.default,
        "pcops._library.custom_op": torch.ops.pcops.bench_dispatch_pcops.default,
        "Library, no autograd kernel": torch.ops.bench_dispatch.no_autograd.default,
    }
    out = {}
    for name, op in ops.items():
        out[name] = {"no grad": host_us_per_call(lambda op=op: op(x, 3, "s"), device, calls)}
        if "no autograd" not in name:
            out[name]["input requires grad"] = host_us_per_call(lambda op=op: op(xg, 3, "s"), device, calls)
    out["torch.empty_like (the kernel's own work)"] = {
        "no grad": host_us_per_call(lambda: torch.empty_like(x), device, calls)
    }
    return out


def op_cases(device: str) -> dict:
    import pcops

    g = torch.Generator().manual_seed(0)
    pts = torch.rand(64, 3, generator=g).to(device)
    p4 = (torch.rand(200, 4, generator=g) * torch.tensor([60.0, 60.0, 3.0, 1.0]) - torch.tensor([0, 30.0, 2.0, 0])).to(
        device
    )
    vcfg = dict(voxel_size=(0.16, 0.16, 4.0), point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1))
    x = torch.randn(4, 64, generator=g).to(device)
    xg = x.clone().requires_grad_(True)
    w, b = torch.randn(64, generator=g).to(device), torch.randn(64, generator=g).to(device)
    boxes = torch.cat([torch.rand(16, 2, generator=g) * 20, 1 + torch.rand(16, 2, generator=g), torch.rand(16, 1)], 1)
    boxes, scores = boxes.to(device), torch.rand(16, generator=g).to(device)
    crow = torch.tensor([0, 3, 8], device=device)
    v = torch.randn(8, generator=g).to(device)
    feats = torch.randn(30, 16, generator=g).to(device)
    coords = torch.stack([torch.zeros(30, dtype=torch.int64), torch.arange(30) % 7, torch.arange(30) // 7], 1)
    coords = torch.cat([coords[:, :1], torch.zeros_like(coords[:, :1]), coords[:, 1:]], 1).int().to(device)

    def ln_fwd_bwd():
        xg.grad = None
        pcops.fused_layer_norm_gelu(xg, w, b).sum().backward()

    return {
        "knn 64 pts k 4": lambda: pcops.knn(pts, pts, 4),
        "ball_query 64 pts k 4": lambda: pcops.ball_query(pts, pts, 0.3, 4),
        "farthest_point_sample 64 -> 8": lambda: pcops.farthest_point_sample(pts, 8),
        "voxelize 200 pts": lambda: pcops.voxelize(p4, **vcfg, max_points_per_voxel=32, max_voxels=1000),
        "dynamic_voxelize 200 pts": lambda: pcops.dynamic_voxelize(p4, **vcfg),
        "pillar_scatter 30 pillars": lambda: pcops.pillar_scatter(feats, coords, 1, (8, 8)),
        "nms_bev 16 boxes": lambda: pcops.nms_bev(boxes, scores, 0.5),
        "sparse_softmax 8 values": lambda: pcops.sparse_softmax(v, crow),
        "fused_layer_norm_gelu 4x64 fwd": lambda: pcops.fused_layer_norm_gelu(x, w, b),
        "fused_layer_norm_gelu 4x64 fwd+bwd": ln_fwd_bwd,
    }


def worker(device: str, calls: int) -> dict:
    torch.set_num_threads(1)
    res = {}
    for name, fn in op_cases(device).items():
        try:
            res[name] = host_us_per_call(fn, device, calls)
        except Exception as e:  # an op missing in an older tree
            res[name] = f"{type(e).__name__}: {e}"[:200]
    return res


def _run_tree(tree: Path, device: str, calls: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(HERE / "dispatch_overhead.py"), "--worker", "--device", device, "--calls", str(calls)]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument("--quick", action="store_true", help="500 calls per round")
    p.add_argument("--calls", type=int, default=2000, help="back-to-back calls per round")
    p.add_argument("--old", default=None, help="a checkout of another commit: its calls too, and ratios")
    p.add_argument("--rounds", type=int, default=5, help="alternating subprocess runs per tree (--old)")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.device, args.calls)))
        return
    sys.path.insert(0, str(HERE))
    from common import environment

    torch.set_num_threads(1)
    if args.quick:
        args.calls = 500
    layers = registration_layers(args.device, args.calls * 5)
    print("registration layer (µs per call):")
    for name, r in layers.items():
        print(f"  {name:44s} " + "  ".join(f"{k}: {v:.2f}" for k, v in r.items()))
    new_runs, old_runs = [], []
    for _ in range(args.rounds if args.old else 1):
        new_runs.append(_run_tree(HERE.parent, args.device, args.calls))
        if args.old:
            old_runs.append(_run_tree(Path(args.old).resolve(), args.device, args.calls))
    rows = {}
    for name in new_runs[0]:
        new = [r[name] for r in new_runs]
        row = {"new_us": round(statistics.median(new), 2), "new_min_us": round(min(new), 2)}
        if old_runs and all(isinstance(r[name], float) for r in old_runs):
            old = [r[name] for r in old_runs]
            row.update(old_us=round(statistics.median(old), 2), old_min_us=round(min(old), 2))
            row.update(new_over_old=round(statistics.median(new) / statistics.median(old), 3),
                       new_over_old_min=round(min(new) / min(old), 3))  # fmt: skip
        rows[name] = row
        print(f"{name:40s} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    result = {
        "benchmark": "dispatch_overhead",
        "environment": environment(),
        "device": args.device,
        "threads": 1,
        "old_tree": None if not args.old else _describe(Path(args.old)),
        "registration_layer_us": {k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in layers.items()},
        "ops_us_per_call": rows,
        "method": f"median of 5 rounds x {args.calls} back-to-back calls per process; "
        f"{args.rounds if args.old else 1} alternating processes per tree: the median and the minimum "
        "of their medians (a shared machine's noise only adds time)",
    }
    with_rows(result)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"dispatch_overhead_{args.device}.json").write_text(json.dumps(result, indent=1))


def with_rows(result: dict) -> dict:
    """Add the flat ``rows`` and meta keys that ``scripts/results_table.py`` renders."""
    env = result["environment"]
    result.update(device=env["device"], torch=env["torch"], date=env["date"][:10], commit=env["commit"])
    rows = [
        {"call": f"registration: {name}", "case": case, "new_us": us}
        for name, cases in result["registration_layer_us"].items()
        for case, us in cases.items()
    ]
    rows += [{"call": name, "case": "public op, tiny input", **r} for name, r in result["ops_us_per_call"].items()]
    result["rows"] = rows
    return result


def _describe(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True
        ).stdout.strip()[:120]
    except OSError:
        return str(tree)


if __name__ == "__main__":
    main()
