"""Host time of eager calls, per public op, split into layers; and the kernel launches per call.

Every public op runs on inputs so small that its host time is the whole call (the GPU work is
a few µs), back to back, and is timed three ways:

- ``call``: the public function (argument checks + dispatch + kernel),
- ``op``: ``torch.ops.pcops.<op>`` with the arguments the public function passed to it (recorded
  once with a ``TorchDispatchMode``), called as the wrapper calls it (``pcops._library.call``):
  dispatch + kernel,
- ``kernel``: the registered Python kernel of the device called directly (``pcops._library``):
  the launcher, its auxiliary torch ops and its launches, no dispatcher (below autograd, as in
  a call, where no input requires grad),

so ``wrapper = call − op`` (the argument checks; for a forward + backward row also the ``sum()``,
the autograd engine and the gradient accumulation) and ``dispatch = op − kernel``. Where a call
runs several pcops ops (a forward and its backward), ``op`` and ``kernel`` sum over them. Per call it also counts the
top-level torch ops inside the kernels (``aux_ops``, CPU profiler) and, on CUDA, the GPU kernels
launched (``launches``, CUDA profiler: memsets/copies excluded). µs are medians of 5 rounds of
back-to-back calls (the GPU synchronised after each round).

    python benchmarks/host_overhead.py --device cuda --out DIR    # writes DIR/host_overhead_cuda.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402
from pcops import _library  # noqa: E402

from dispatch_overhead import host_us_per_call  # noqa: E402


def cases(dev: str) -> dict:
    """Public calls on tiny inputs (the same shapes on every device)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.rand(*shape, generator=g).to(dev)

    pts = r(64, 3)
    p4 = (torch.rand(200, 4, generator=g) * torch.tensor([60.0, 60.0, 3.0, 1.0]) - torch.tensor([0, 30.0, 2, 0])).to(
        dev
    )
    grid = dict(voxel_size=(0.16, 0.16, 4.0), point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1))
    x, w, b = torch.randn(4, 64, generator=g).to(dev), r(64), r(64)
    xg = x.clone().requires_grad_(True)
    boxes7 = torch.cat([r(16, 2) * 20, r(16, 1), 1 + r(16, 3), r(16, 1)], 1)
    scores, groups = r(16), (torch.arange(16) % 3).to(dev)
    crow, v = torch.tensor([0, 3, 8], device=dev), torch.randn(8, generator=g).to(dev)
    vg = v.clone().requires_grad_(True)
    cells = torch.randperm(64, generator=g)[:30]
    coords = torch.stack(
        [torch.zeros(30, dtype=torch.long), torch.zeros(30, dtype=torch.long), cells // 8, cells % 8], 1
    )
    coords = coords.int().to(dev)
    feats = torch.randn(30, 16, generator=g).to(dev)
    fg = feats.clone().requires_grad_(True)
    coords3 = (
        torch.stack([torch.zeros(30, dtype=torch.long), cells % 4, (cells // 4) % 4, cells // 16], 1).int().to(dev)
    )
    km = pcops.sparse_conv_kernel_map(coords3, (4, 4, 4), 3, subm=True, pad_pairs=True)
    wc = torch.randn(27, 16, 8, generator=g).to(dev)
    vox = torch.zeros(30, 8, 4, device=dev)
    vox[:, :3] = r(30, 3, 4)
    npts = torch.full((30,), 3, dtype=torch.int32, device=dev)
    pw, pb = pcops.fold_batchnorm(r(16, 10), r(16) + 0.5, r(16), r(16), r(16) + 0.5, 1e-3)
    canvas = torch.zeros(1, 16, 8, 8, device=dev)
    y4, out4 = torch.randn(1, 16, 8, 8, generator=g).to(dev), torch.zeros(1, 32, 8, 8, device=dev)
    p2v = (torch.arange(200) % 50).to(dev)
    b16 = r(16)

    def backward(fn, leaf):
        def run():
            leaf.grad = None
            fn().sum().backward()

        return run

    return {
        "knn": lambda: pcops.knn(pts, pts, 4),
        "ball_query": lambda: pcops.ball_query(pts, pts, 0.3, 4),
        "gather_points": lambda: pcops.gather_points(pts, torch.zeros(64, 4, dtype=torch.long, device=dev)),
        "farthest_point_sample": lambda: pcops.farthest_point_sample(pts, 8),
        "voxelize": lambda: pcops.voxelize(p4, **grid, max_points_per_voxel=32, max_voxels=1000),
        "voxelize pad_to_max": lambda: pcops.voxelize(
            p4, **grid, max_points_per_voxel=32, max_voxels=1000, pad_to_max=True
        ),
        "dynamic_voxelize": lambda: pcops.dynamic_voxelize(p4, **grid),
        "dynamic_voxelize cells_only": lambda: pcops.dynamic_voxelize(p4, **grid, cells_only=True),
        "voxel_reduce mean": lambda: pcops.voxel_reduce(p4, p2v, 50),
        "pillar_scatter": lambda: pcops.pillar_scatter(feats, coords, 1, (8, 8)),
        "pillar_scatter fwd+bwd": backward(lambda: pcops.pillar_scatter(fg, coords, 1, (8, 8)), fg),
        "pfn_scatter": lambda: pcops.pfn_scatter(vox, npts, coords, pw, pb, canvas, (0.16, 0.16, 4.0), (0, -39.68, -3)),
        "bias_relu": lambda: pcops.bias_relu(y4, b16, out4, 8),
        "sparse_conv_kernel_map subm": lambda: pcops.sparse_conv_kernel_map(coords3, (4, 4, 4), 3, subm=True),
        "sparse_conv3d": lambda: pcops.sparse_conv3d(feats, km, wc),
        "boxes_iou_bev": lambda: pcops.boxes_iou_bev(boxes7, boxes7),
        "boxes_iou_3d": lambda: pcops.boxes_iou_3d(boxes7, boxes7),
        "nms_bev": lambda: pcops.nms_bev(boxes7, scores, 0.5),
        "batched_nms_bev padded": lambda: pcops.batched_nms_bev(
            boxes7, scores, groups, 0.5, post_max_size=8, padded=True
        ),
        "sparse_softmax": lambda: pcops.sparse_softmax(v, crow),
        "sparse_softmax fwd+bwd": backward(lambda: pcops.sparse_softmax(vg, crow), vg),
        "fused_layer_norm_gelu": lambda: pcops.fused_layer_norm_gelu(x, w, b),
        "fused_layer_norm_gelu fwd+bwd": backward(lambda: pcops.fused_layer_norm_gelu(xg, w, b), xg),
        "fused_swish_dropout_residual": lambda: pcops.fused_swish_dropout_residual(x, x, 0.0, training=False),
    }


class _Record(TorchDispatchMode):
    """The pcops ops a call runs (the outermost ones) and their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "pcops":
            assert not kwargs, f"{func}: pcops ops take no keyword-only arguments"
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


# GPU kernels launched per call of each case (CUDA profiler, memsets and copies excluded), as
# measured on the H200 (benchmarks/results/host_overhead_cuda.json); tests/test_host_overhead.py
# fails when a call launches more. The forward + backward rows include the ``sum()`` and the
# autograd engine's gradient fills.
LAUNCHES = {
    "knn": 9,
    "ball_query": 5,
    "gather_points": 6,
    "farthest_point_sample": 8,
    "voxelize": 6,
    "voxelize pad_to_max": 6,
    "dynamic_voxelize": 3,
    "dynamic_voxelize cells_only": 1,
    "voxel_reduce mean": 11,
    "pillar_scatter": 3,
    "pillar_scatter fwd+bwd": 9,
    "pfn_scatter": 2,
    "bias_relu": 1,
    "sparse_conv_kernel_map subm": 4,
    "sparse_conv3d": 1,
    "boxes_iou_bev": 1,
    "boxes_iou_3d": 1,
    "nms_bev": 3,
    "batched_nms_bev padded": 3,
    "sparse_softmax": 1,
    "sparse_softmax fwd+bwd": 5,
    "fused_layer_norm_gelu": 1,
    "fused_layer_norm_gelu fwd+bwd": 6,
    "fused_swish_dropout_residual": 1,
}


def launch_counts(dev: str = "cuda") -> dict:
    """``{case: GPU kernels launched by one call}`` (no timing)."""
    return {name: _profile_counts(fn, dev)[1] for name, fn in cases(dev).items()}


def _profile_counts(fn, dev: str) -> tuple[int, int | None]:
    """(top-level torch ops inside ``fn``, CUDA kernels launched by it) per call."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    fn()
    with profile(activities=acts) as prof:
        fn()
        if dev == "cuda":
            torch.cuda.synchronize()
    ev = prof.events()
    aux = sum(1 for e in ev if e.name.startswith("aten::") and (e.cpu_parent is None or "::" not in e.cpu_parent.name))
    if dev != "cuda":
        return aux, None
    gpu = [e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = sum(1 for e in gpu if "memset" not in e.name.lower() and "memcpy" not in e.name.lower())
    return aux, launches


def measure(dev: str, calls: int) -> list[dict]:
    rows = []
    for name, fn in cases(dev).items():
        rec = _Record()
        with rec:
            fn()
        ops = [(f, a, k) for f, a, k in rec.calls]
        kernels = []
        for f, a, k in ops:
            op = _library.OPS[f._opname]
            kernels.append((op.kernels.get(dev) or op.kernels.get("any"), a, k))

        def run_ops(ops=ops):  # as the public wrappers call them (pcops._library.call)
            for f, a, _ in ops:
                _library.call(f, *a)

        def run_kernels(kernels=kernels):  # below autograd where the call runs them so
            for kern, a, _ in kernels:
                if torch.is_grad_enabled() and torch._C._any_requires_grad(*a):
                    kern(*a)
                else:
                    with torch._C._AutoDispatchBelowAutograd():
                        kern(*a)

        t_call = host_us_per_call(fn, dev, calls)
        t_op = host_us_per_call(run_ops, dev, calls)
        t_kernel = host_us_per_call(run_kernels, dev, calls)
        aux, _ = _profile_counts(run_kernels, dev)
        _, launches = _profile_counts(fn, dev)
        row = {
            "op": name,
            "call_us": round(t_call, 2),
            "wrapper_us": round(t_call - t_op, 2),
            "dispatch_us": round(t_op - t_kernel, 2),
            "kernel_us": round(t_kernel, 2),
            "pcops_ops": "+".join(f._opname for f, _, _ in ops),
            "aux_torch_ops": aux,
            "launches": launches,
        }
        rows.append(row)
        print("  ".join(f"{k} {v}" for k, v in row.items()))
    return rows


def baselines(dev: str, calls: int) -> dict:
    """Host µs per call of the layers every op is built from: one eager torch op, one Triton
    launch through ``kernel[grid]`` and through ``pcops.triton._launch`` (CUDA only), and a
    forward + backward through autograd of a torch op and of a Python ``autograd.Function``
    (the engine's cost that every ``fwd+bwd`` row above includes)."""
    x = torch.randn(64, device=dev)
    leaf = x.clone().requires_grad_(True)

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def fwd_bwd(f):
        def run():
            leaf.grad = None
            f(leaf).sum().backward()

        return run

    out = {
        "torch op (x * 2)": host_us_per_call(lambda: x * 2, dev, calls),
        "torch fwd+bwd ((x * 2).sum().backward())": host_us_per_call(fwd_bwd(lambda t: t * 2), dev, calls),
        "autograd.Function fwd+bwd": host_us_per_call(fwd_bwd(Twice.apply), dev, calls),
    }
    if dev == "cuda":
        from _launch_probe import probe

        y = torch.empty_like(x)
        out["Triton launch, kernel[grid]"] = host_us_per_call(lambda: probe[(1,)](x, y, 64, BLOCK=64), dev, calls)
        from pcops.triton import _launch

        out["Triton launch, pcops.triton._launch"] = host_us_per_call(
            lambda: _launch.launch(probe, (1,), x, y, 64, BLOCK=64), dev, calls
        )
    for k, v in out.items():
        print(f"baseline {k:45s} {v:8.2f} µs")
    return {k: round(v, 2) for k, v in out.items()}


class _StageProbe:
    """A PointPillars ``stage_timer``: host µs per stage (``perf_counter``, the GPU not waited
    for unless the stage itself syncs) and, while ``profiling``, a ``record_function`` range per
    stage so that the launches can be attributed."""

    def __init__(self):
        self.host_us: dict[str, list[float]] = {}
        self.profiling = False

    def __call__(self, name: str):
        import contextlib
        import time

        @contextlib.contextmanager
        def cm():
            rf = torch.profiler.record_function(f"stage::{name}") if self.profiling else contextlib.nullcontext()
            t0 = time.perf_counter()
            with rf:
                yield
            self.host_us.setdefault(name, []).append((time.perf_counter() - t0) * 1e6)

        return cm()


def _launches_under(events, prefix: str) -> dict[str, dict[str, int]]:
    """Per profiler range named ``prefix<name>``: ``kernels``, the GPU kernels attached to the CPU
    events below it (memsets and copies excluded), and ``launch_calls``, the CUDA runtime/driver
    launch calls (``*LaunchKernel*``) that started inside its time window."""

    def kernels(e) -> int:
        own = sum(1 for k in e.kernels if "memset" not in k.name.lower() and "memcpy" not in k.name.lower())
        return own + sum(kernels(c) for c in e.cpu_children)

    calls = [e.time_range.start for e in events if "LaunchKernel" in e.name]
    out: dict[str, dict[str, int]] = {}
    for e in events:
        if e.name.startswith(prefix):
            d = out.setdefault(e.name[len(prefix) :], {"kernels": 0, "launch_calls": 0})
            d["kernels"] += kernels(e)
            d["launch_calls"] += sum(1 for t in calls if e.time_range.start <= t <= e.time_range.end)
    return out


def e1_stages(calls: int = 50) -> dict:
    """E1 (PointPillars on KITTI 000001, shipped weights, fp32 and fp16) called eagerly: per stage
    the host µs (median over ``calls``) and the GPU kernels launched; plus the whole call's host
    µs and CUDA-event ms. CUDA only."""
    import statistics

    from common import load_scan
    from torch.profiler import ProfilerActivity, profile

    from pcops.models import PointPillars

    pts = load_scan("000001")[0].cuda()
    res = {}
    for dtype in ("fp32", "fp16"):
        model = PointPillars.pretrained(dtype=torch.float16) if dtype == "fp16" else PointPillars.pretrained()
        model = model.cuda().eval()
        probe = _StageProbe()
        model.stage_timer = probe
        for _ in range(10):
            model(pts)
        torch.cuda.synchronize()
        probe.host_us.clear()
        call_us = host_us_per_call(lambda: model(pts), "cuda", calls, rounds=3)
        host = {k: round(statistics.median(v), 1) for k, v in probe.host_us.items()}
        probe.profiling = True
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model(pts)
            torch.cuda.synchronize()
        probe.profiling = False
        launches = _launches_under(prof.events(), "stage::")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(calls):
            start.record()
            model(pts)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        res[dtype] = {
            "call_host_us": round(call_us, 1),
            "call_ms_cuda_events": round(statistics.median(times), 3),
            "stages": {k: {"host_us": host[k], **launches.get(k, {})} for k in host},
        }
        print(f"E1 {dtype}: {res[dtype]}")
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument("--calls", type=int, default=500, help="back-to-back calls per round")
    p.add_argument("--quick", action="store_true", help="100 calls per round")
    p.add_argument("--out", default=None)
    p.add_argument("--no-e1", action="store_true", help="skip the PointPillars eager stages (CUDA)")
    p.add_argument(
        "--native",
        choices=("on", "off"),
        default="on",
        help="the native host path (pcops._native) loaded before timing (on) or turned off (off)",
    )
    a = p.parse_args()
    from common import environment
    from pcops import _native

    if a.native == "off":
        import os

        os.environ["PCOPS_NATIVE_HOST"] = "0"
    elif a.device == "cuda":
        _native.request(wait=True)  # (the ops it takes register their shape classes at their first calls)
    torch.set_num_threads(1)
    rows = measure(a.device, 100 if a.quick else a.calls)
    env = environment()
    res = {
        "benchmark": "host_overhead",
        "environment": env,
        "device": env["device"],
        "torch": env["torch"],
        "date": env["date"][:10],
        "commit": env["commit"],
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "rows": rows,
        "baselines_us": baselines(a.device, 100 if a.quick else a.calls),
        "native_host_path": _native.status(),
    }
    if a.device == "cuda" and not a.no_e1:
        res["e1_eager_stages"] = e1_stages(20 if a.quick else 50)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        suffix = "" if a.native == "on" else "_python"
        (Path(a.out) / f"host_overhead_{a.device}{suffix}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
