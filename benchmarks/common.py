"""Shared benchmark harness: timing, workloads from ../shared/WORKLOADS.md, and reporting.

Timing follows WORKLOADS.md: CUDA events after warm-up, median of ≥ 50 runs with the min-max
spread, everything the op needs included (allocation, all kernels, any host sync). Each
figure is reported with a throughput and a ratio to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# S2 of issue 21: SECOND's middle encoder on the V3 voxels of a KITTI scan. The static form's
# strided convs keep (conv2, conv3, conv4, conv_out) rows: a 3³ stride-2 conv can output more
# voxels than it gets (scan 000001: 40,000 → 71,146 → 45,158 → 19,643 → 14,449), so these hold
# KITTI's scans at 40,000 voxels with room; the benchmarks record the dropped count (must be 0).
S2_V3 = dict(voxel_size=(0.05, 0.05, 0.1), point_cloud_range=(0, -40, -3, 70.4, 40, 1), max_points_per_voxel=5,
             max_voxels=40000)  # fmt: skip
S2_STATIC_CAPACITY = (80_000, 60_000, 40_000, 40_000)


def set_sparse_precision(module, precision: str) -> None:
    """Every ``pcops.nn`` sparse conv of ``module`` multiplies float32 as ``precision``."""
    from pcops.nn.sparse import _SparseConv3d

    for m in module.modules():
        if isinstance(m, _SparseConv3d):
            m.precision = precision


def data_root() -> Path:
    """Real data: ``$PCOPS_DATA`` or ``../shared/data``, else the git-ignored copy ``.gpu/data``."""
    for p in (os.environ.get("PCOPS_DATA"), ROOT.parent / "shared" / "data", ROOT / ".gpu" / "data"):
        if p and (Path(p) / "kitti").exists():
            return Path(p)
    return ROOT.parent / "shared" / "data"


def load_scan(frame: str = "000001") -> tuple[torch.Tensor, str]:
    """SCAN of WORKLOADS.md: ``(N, 4)`` float32 and a description of its source."""
    path = data_root() / "kitti" / "training" / "velodyne" / f"{frame}.bin"
    if path.exists():
        return torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(-1, 4)), f"KITTI {frame}.bin"
    from pcops.sim import simulate_scan  # synthetic fallback of the same size, as WORKLOADS.md asks

    pts = simulate_scan(seed=int(frame)).points
    return pts, "synthetic scan (pcops.sim; KITTI samples absent)"


def bench(fn, *, warmup: int = 10, rep: int = 100, graph: bool = False) -> dict:
    """Time ``fn()`` on the GPU: median/min/max ms over ``rep`` runs, each bracketed by CUDA events.

    With ``graph=True`` the call is captured once in a CUDA graph and its replays are timed
    (launch overhead ≈ 1 µs per node instead of ≈ 7-12 µs per eager launch).
    """
    run = _capture([fn])[0].replay if graph else fn
    times = _event_times(run, warmup, rep)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": rep}


@contextlib.contextmanager
def patched(module, attrs: dict):
    """Set module-level settings (``{name: value}``, e.g. a launcher's variant constants) for the
    duration of a ``with`` block; the old values come back afterwards, also on errors."""
    saved = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield module
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def _capture(fns):
    """``(graph, outputs)``: the calls ``fns`` warmed up on a side stream (3 rounds: compilation,
    autotuning and lazy allocations happen outside the capture), then captured in order in one
    CUDA graph; ``outputs`` holds what each captured call returned."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [fn() for fn in fns]
    return g, outs


def captured_train_step(model, run) -> dict:
    """A training step captured in one CUDA graph (PyTorch's whole-network capture recipe): ``run()``
    does the forward and ``backward()`` of ``model`` (train mode) on static tensors. Warm-up on a
    side stream, gradients set to None before the capture so that the graph owns them; replays
    accumulate nothing (each replay rewrites the gradients). Returns ``bench``'s keys for the
    replays and ``grads_bit_identical``: two replays give the same gradients, bit for bit."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            run()
    torch.cuda.current_stream().wait_stream(s)
    model.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    grads = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    times = _event_times(g.replay, 5, 50)
    same = len(grads[0]) > 0 and all(torch.equal(a, b) for a, b in zip(*grads))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": 50,
            "grads_bit_identical": same}  # fmt: skip


def _event_times(run, warmup: int, rep: int) -> list[float]:
    """ms of ``rep`` calls of ``run()``, each between two CUDA events and a synchronisation, after
    ``warmup`` untimed calls."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def bench_steady(fns, *, warmup: int = 5, rep: int = 50) -> dict:
    """Steady-state GPU time per call of K calls run back to back in one CUDA graph.

    ``fns`` is a list of K zero-argument callables, each working on its own input tensors
    (typically the same op on K distinct copies of its inputs). They are warmed up on a side
    stream (3 rounds of all K, as ``bench(graph=True)`` does: compilation, autotuning, lazy
    allocations happen outside the capture), then all K calls are captured in ONE
    ``torch.cuda.CUDAGraph`` and ``rep`` replays are timed, each between two CUDA events and a
    synchronisation, after ``warmup`` untimed replays. The values each call returns are kept
    alive during the capture, so every call writes its own output memory, as the layers of a
    captured model do (dropped at once, the next call could reuse the same block).

    What it measures: what a captured pipeline pays per call of the op, i.e. the kernels' time
    plus ≈ 1 µs per graph node, with the replay's own launch latency (the host submitting the
    graph, ≈ 10-20 µs seen by the events; all of a one-call ``bench(graph=True)`` row of a
    µs-scale kernel) spread over K calls (≈ launch / K per call, left in). ``back_to_back_ms``
    is the other bound: ``rep`` replays queued between one pair of events, per call; when a
    replay takes longer than the host needs to submit the next, the launch latency overlaps
    the previous replay and this is the GPU time alone.

    Why the inputs must rotate: K calls on the SAME tensors would read x from the L2 cache
    (50 MB on the H200) from the second call on whenever inputs + outputs fit, which no real
    pipeline gets (each layer reads what the previous one wrote, once). Give each callable its
    own copies and choose K so that the bytes the K calls touch (inputs + outputs) are several
    times the L2 size: then each call finds its inputs evicted by the K - 1 calls before it.

    Returns the keys of ``bench`` (``median_ms``/``min_ms``/``max_ms`` per call: the replay's
    time divided by K; ``runs`` = ``rep``) plus ``calls_per_graph`` (K), ``graph_ms_median``
    (one replay, undivided) and ``back_to_back_ms`` (per call).
    """
    fns = list(fns)
    k = len(fns)
    if k == 0:
        raise ValueError("fns: expected at least one callable, got an empty list")
    if rep < 1:
        raise ValueError(f"rep: expected >= 1, got {rep}")
    g, outs = _capture(fns)  # outs kept: each call's output stays allocated (own memory)
    times = _event_times(g.replay, warmup, rep)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(rep):
        g.replay()
    end.record()
    end.synchronize()
    back_to_back = start.elapsed_time(end) / (rep * k)
    del outs
    median = statistics.median(times)
    return {
        "median_ms": median / k,
        "min_ms": min(times) / k,
        "max_ms": max(times) / k,
        "runs": rep,
        "calls_per_graph": k,
        "graph_ms_median": median,
        "back_to_back_ms": back_to_back,
    }


def bench_cpu(fn, *, warmup: int = 2, rep: int = 10) -> dict:
    """Wall-clock timing for CPU paths (perf_counter), same keys as ``bench``."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": rep}


def bench_cpu_pair(fa, fb, *, warmup: int = 2, rep: int = 10) -> tuple[dict, dict]:
    """Time two CPU calls interleaved (a b, then b a, ...): on a machine shared with other jobs
    the load drifts within seconds, and timing one call's runs after the other's puts that drift
    into their ratio. Returns one ``bench_cpu`` dict per call."""
    import time

    for _ in range(warmup):
        fa()
        fb()
    times = ([], [])
    for r in range(rep):
        for which in (0, 1) if r % 2 == 0 else (1, 0):
            fn = fa if which == 0 else fb
            t0 = time.perf_counter()
            fn()
            times[which].append((time.perf_counter() - t0) * 1e3)
    return tuple({"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t), "runs": rep} for t in times)


def environment() -> dict:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("PCOPS_COMMIT", commit),
    }


def row(
    workload: str,
    impl: str,
    timing: dict,
    *,
    items: float | None = None,
    unit: str = "points/s",
    baseline: dict | None = None,
    **extra,
) -> dict:
    """One result row; ``items / median`` gives the throughput, ``baseline median / median`` the speed-up."""
    r = {"workload": workload, "impl": impl, **timing}
    if items is not None:
        r["throughput"] = items / (timing["median_ms"] * 1e-3)
        r["throughput_unit"] = unit
    if baseline is not None:
        r["speedup_vs_baseline"] = baseline["median_ms"] / timing["median_ms"]
    r.update(extra)
    return r


def report(rows: list[dict], name: str, out_dir: str | os.PathLike | None, notes: dict | None = None) -> dict:
    """Print a table and write ``<out_dir>/<name>.json`` with the environment."""
    result = {"benchmark": name, "environment": environment(), "notes": notes or {}, "results": rows}
    print(f"\n== {name} ({result['environment']['device']}, torch {torch.__version__})")
    print(f"{'workload':<22}{'impl':<34}{'median ms':>11}{'min':>9}{'max':>9}{'throughput':>14}{'x base':>8}")
    for r in rows:
        tp = f"{r['throughput']:.3g}" if "throughput" in r else ""
        sp = f"{r['speedup_vs_baseline']:.2f}" if "speedup_vs_baseline" in r else ""
        print(
            f"{r['workload']:<22}{r['impl']:<34}{r['median_ms']:>11.4f}{r['min_ms']:>9.4f}{r['max_ms']:>9.4f}{tp:>14}{sp:>8}"
        )
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / f"{name}.json").write_text(json.dumps(result, indent=1))
    return result


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=None, help="folder for the JSON result")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    return p.parse_args()


def gpu_activities(fn, iters: int = 10) -> dict:
    """What one call of ``fn`` runs on the GPU, from the torch profiler (a diagnostic, never a failure).

    Returns ``{"kernels": n, "copies": n (memcpy/memset, e.g. a host sync reading a size),
    "per_call_us": {name: mean µs per call}, "gpu_us": total GPU µs per call}`` averaged over
    ``iters`` calls after one warm-up, or ``{"error": ...}`` when the profiler is unavailable.
    The per-kernel times say where a pipeline's GPU time goes; compare their sum with the
    event-timed median to see the host/launch overhead.
    """
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        per: dict[str, float] = {}
        for e in events:
            per[e.name[:80]] = per.get(e.name[:80], 0.0) + e.device_time / iters
        copies = sum(1 for e in events if e.name.lower().startswith(("memcpy", "memset"))) / iters
        return {
            "kernels": len(events) / iters - copies,
            "copies": copies,
            "per_call_us": dict(sorted(per.items(), key=lambda kv: -kv[1])),
            "gpu_us": sum(per.values()),
        }
    except Exception as e:  # noqa: BLE001 - informative only
        return {"error": repr(e)}


def numba_first_call_rows(script: str, workload: str, note: str) -> list[dict]:
    """The first call's cost in a fresh process, with numba's on-disk cache and with an empty one
    (the one-off compile after installing): ``script`` prints the first and the second call's ms."""
    import tempfile

    rows = []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as empty:
        for label, extra in [("numba cache warm", {}), ("empty numba cache: compile", {"NUMBA_CACHE_DIR": empty})]:
            res = subprocess.run(
                [sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True, timeout=600
            )
            impl = f"pcops first call (fresh process, {label})"
            if res.returncode:
                rows.append({"workload": workload, "impl": impl, "note": res.stderr[-300:]})
                continue
            first, second = (float(v) for v in res.stdout.split())
            rows.append(
                {
                    "workload": workload,
                    "impl": impl,
                    "median_ms": first,
                    "second_call_ms": second,
                    "runs": 1,
                    "note": note,
                }
            )
    return rows
