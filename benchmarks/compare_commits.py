"""Issue 16's closing check: the default GPU paths of two commits, row by row, in one GPU run.

The README's headline workloads and issue 21's sparse convolutions (WORKLOADS.md ids) on an OLD
and a NEW tree, eager (CUDA events around single public calls) and captured (CUDA-graph replay of
the sync-free form: ``pad_to_max``, ``padded``, ``pad_pairs``, the static sparse encoder;
PointPillars through its ``capture``); times and outputs compared::

    PYTHONPATH=. python benchmarks/compare_commits.py --old .cmp/old --new . \\
        --scan .cmp/data/000001.bin --out $OUT/compare_commits.json [--quick] [--only E1 N1 ...]

Each tree runs in its own subprocess (cwd and PYTHONPATH = the tree; ``pcops`` and ``pcops.models``
are asserted to come from it). The trees alternate (new, old, old, new), a row's time is the median
over the rounds, the first round's outputs are compared with ``torch.equal``, and both PointPillars
load one state dict (the NEW tree's shipped weights). ``--smoke-cpu``: every call once on small
CPU inputs (no timing, no graphs), an API check without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROWS = ("E1-fp32", "E1-fp16", "E2-fp16", "N1", "V1", "F1", "K1", "S1", "L2", "Q1", "P1-fwd", "P1-fwd+bwd",
        "S2-fp16", "S2-tf32", "S3")  # fmt: skip
GRAPH_CALLS = {"V1": 20, "N1": 10, "S1": 20, "L2": 10, "Q1": 20, "P1-fwd": 20, "P1-fwd+bwd": 20, "K1": 4, "F1": 1,
               "S3": 10}  # fmt: skip
VOXEL, RANGE = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
V3_VOXEL, V3_LOW, V3_GRID_XYZ = (0.05, 0.05, 0.1), (0.0, -40.0, -3.0), (1408, 1600, 40)


# ---------------------------------------------------------------- worker (one tree, one process)
def import_tree(tree: Path):
    """``pcops`` from ``tree`` only: drop an editable install's finder (it would map
    ``pcops.models`` to the installed checkout) and the script's folder from the path."""
    sys.meta_path[:] = [f for f in sys.meta_path if not ("__editable__" in repr(f) and "pcops" in repr(f))]
    sys.path[:] = [str(tree)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    import pcops

    assert Path(pcops.__file__).resolve().is_relative_to(tree), f"pcops from {pcops.__file__}, not {tree}"
    return pcops


def load_points(path: str, n: int | None = None):
    pts = torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(-1, 4))
    return pts if n is None else pts[:n].clone()


def nms_inputs(n: int):
    """WORKLOADS.md's NMS boxes: numpy default_rng(0), x, y, z, dx, dy, dz, heading, then scores."""
    rng = np.random.default_rng(0)
    bounds = [(0, 69.12), (-39.68, 39.68), (-2, 0), (3.2, 4.7), (1.4, 2.0), (1.4, 1.7), (-np.pi, np.pi)]
    cols = [rng.uniform(lo, hi, n) for lo, hi in bounds]
    scores = rng.uniform(0, 1, n)
    return torch.from_numpy(np.stack(cols, 1)).float(), torch.from_numpy(scores).float()


def clouds(xyz, batch: int, n: int):
    """F1/K1 clouds: ``batch`` random subsets of ``n`` scan points (seed 0; subsets may overlap)."""
    g = torch.Generator().manual_seed(0)
    return torch.stack([xyz[torch.randperm(xyz.shape[0], generator=g)[:n]] for _ in range(batch)]).contiguous()


def v3_voxels(points):
    """S1 input: the unique V3 voxels as int32 ``(0, z, y, x)``, sorted (plain torch)."""
    cell = ((points[:, :3] - torch.tensor(V3_LOW)) / torch.tensor(V3_VOXEL)).floor().long()
    inside = ((cell >= 0) & (cell < torch.tensor(V3_GRID_XYZ))).all(1)
    zyx = torch.unique(cell[inside].flip(1), dim=0)
    return torch.cat([torch.zeros_like(zyx[:, :1]), zyx], 1).int()


def tensors(obj) -> list:
    """Every tensor of an output (tuples, NamedTuples, lists; ints become tensors), on the CPU."""
    if isinstance(obj, torch.Tensor):
        return [obj.detach().cpu().clone()]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors(o)]
    return [torch.tensor(obj)]


def fwd_bwd(f, leaves, dy):
    """One forward + backward as a training step runs it (grads reset to None first)."""

    def run():
        for t in leaves:
            t.grad = None
        y = f()
        y.backward(dy)
        return [y.detach()] + [t.grad for t in leaves]

    return run


def build(rid: str, pcops, ctx: dict) -> dict:
    """``{"eager": fn, "captured": fn, "self_captured": bool}`` for one row, inputs on ctx["dev"]."""
    dev, smoke = ctx["dev"], ctx["smoke"]
    scan = ctx["scan"]
    if rid.startswith("E"):
        model = ctx["model"]
        model.impl, model.dtype = "fast", torch.float16 if rid.endswith("fp16") else torch.float32
        if rid.startswith("E1"):
            args, cap_args = (scan.to(dev),), (scan.to(dev),)
        else:
            scans = [scan, ctx["scan2"]] * (1 if smoke else 4)
            lengths = [s.shape[0] for s in scans]
            batch = torch.cat(scans).to(dev)
            args, cap_args = (batch, torch.tensor(lengths, device=dev)), (batch, lengths)
        eager = lambda: model(*args)  # noqa: E731
        if smoke:  # capture needs CUDA: only check that the API is there
            assert callable(getattr(model, "capture", None)), "the model has no capture()"
            return {"eager": eager, "captured": None, "self_captured": True}
        graphed = model.capture(*cap_args)
        return {"eager": eager, "captured": lambda: graphed(*cap_args), "self_captured": True}
    if rid == "V1":
        pts = scan.to(dev)
        call = lambda **kw: pcops.voxelize(pts, VOXEL, RANGE, 32, 40000, **kw)  # noqa: E731
        return {"eager": call, "captured": lambda: call(pad_to_max=True)}
    if rid == "N1":
        n = 256 if smoke else 4096
        boxes, scores = (t.to(dev) for t in nms_inputs(n))
        call = lambda **kw: pcops.nms_bev(boxes, scores, 0.5, **kw)  # noqa: E731
        return {"eager": call, "captured": lambda: call(post_max_size=n, padded=True)}
    if rid in ("F1", "K1"):
        b, n = (2, 1024) if smoke else (8, 16384)
        pts = clouds(scan[:, :3].contiguous(), b, n).to(dev)
        if rid == "F1":
            call = lambda: pcops.farthest_point_sample(pts, 128 if smoke else 4096)  # noqa: E731
        else:
            call = lambda: pcops.knn(pts, pts, 16)  # noqa: E731
        return {"eager": call, "captured": call}
    if rid == "S1":
        coords = v3_voxels(scan).to(dev)
        shape = tuple(reversed(V3_GRID_XYZ))
        call = lambda **kw: pcops.sparse_conv_kernel_map(coords, shape, 3, subm=True, **kw)  # noqa: E731
        return {"eager": call, "captured": lambda: call(pad_pairs=True)}
    if rid.startswith("S2") or rid == "S3":
        return sparse_conv_row(rid, pcops, ctx)
    g = torch.Generator().manual_seed(0)
    if rid == "L2":
        m, c = (256 if smoke else 131072), 256
        x = torch.randn(m, c, generator=g).bfloat16()
        w = (1 + 0.1 * torch.randn(c, generator=g)).bfloat16()
        b = (0.1 * torch.randn(c, generator=g)).bfloat16()
        dy = torch.randn(m, c, generator=g).bfloat16().to(dev)
        leaves = [t.to(dev).requires_grad_(True) for t in (x, w, b)]
        call = fwd_bwd(lambda: pcops.fused_layer_norm_gelu(*leaves), leaves, dy)
        return {"eager": call, "captured": call}
    if rid == "Q1":
        rows = 2000 if smoke else 120000
        torch.manual_seed(0)
        lengths = torch.randint(1, 65, (rows,))
        crow = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(dev)
        values = torch.randn(int(lengths.sum()))
        dy = torch.randn(values.shape[0]).to(dev)
        vr = values.to(dev).requires_grad_(True)
        call = fwd_bwd(lambda: pcops.sparse_softmax(vr, crow), [vr], dy)
        return {"eager": call, "captured": call}
    if rid.startswith("P1"):
        p, h, w = (500 if smoke else 16000), 496, 432
        lin = torch.randperm(h * w, generator=g)[:p]
        coords = torch.stack([torch.zeros_like(lin), torch.zeros_like(lin), lin // w, lin % w], 1).int().to(dev)
        feats = torch.randn(p, 64, generator=g).to(dev)
        if rid == "P1-fwd":
            call = lambda: pcops.pillar_scatter(feats, coords, 1, (h, w))  # noqa: E731
        else:
            dy = torch.randn(1, 64, h, w, generator=g).to(dev)
            fr = feats.clone().requires_grad_(True)
            call = fwd_bwd(lambda: pcops.pillar_scatter(fr, coords, 1, (h, w)), [fr], dy)
        return {"eager": call, "captured": call}
    raise ValueError(f"unknown row {rid!r}")


def sparse_conv_row(rid: str, pcops, ctx: dict) -> dict:
    """Issue 21's rows (WORKLOADS.md): S2, OpenPCDet's ``VoxelBackBone8x`` in eval on the V3 voxels
    (mean features; weights from ``torch.manual_seed(0)``, the same in both trees while the
    constructor's order is), eager as a detector calls it and captured in its static, fused form
    (fp16; ``S2-tf32``: float32 with ``precision="tf32"``, captured only); S3, one SubMConv3d
    64 → 64 fp16 with its map kept on BIG (the scan tiled 10×, jittered; the plain scan under
    ``--smoke-cpu``, float32)."""
    from pcops import nn as pnn
    from pcops.models.second import VoxelBackBone8x, mean_vfe

    dev, smoke = ctx["dev"], ctx["smoke"]
    scan = ctx["scan"].to(dev)
    grid = dict(voxel_size=V3_VOXEL, point_cloud_range=(*V3_LOW, 70.4, 40.0, 1.0), max_points_per_voxel=5)
    shape = tuple(reversed(V3_GRID_XYZ))
    dtype = torch.float32 if smoke or rid == "S2-tf32" else torch.float16
    torch.manual_seed(0)
    if rid == "S3":
        pts = scan
        if not smoke:
            g = torch.Generator(device=dev).manual_seed(0)
            pts = torch.cat([scan + torch.cat([torch.randn(scan.shape[0], 3, generator=g, device=dev) * 0.05,
                                               torch.zeros_like(scan[:, 3:])], 1) for _ in range(10)])  # fmt: skip
        v = pcops.voxelize(pts, **grid, max_voxels=pts.shape[0])
        conv = pnn.SubMConv3d(64, 64, 3, bias=False, indice_key="s3").to(dev, dtype)
        x = pnn.SparseConvTensor(torch.randn(v.coords.shape[0], 64, device=dev, dtype=dtype), v.coords, shape, 1)

        def call():
            with torch.no_grad():
                return conv(x).features

        call()  # builds the map, kept under "s3"
        return {"eager": call, "captured": call}
    net = VoxelBackBone8x(4, V3_GRID_XYZ, static_capacity=(80_000, 60_000, 40_000, 40_000)).to(dev, dtype).eval()
    v = pcops.voxelize(scan, **grid, max_voxels=40000)
    vp = pcops.voxelize(scan, **grid, max_voxels=40000, pad_to_max=True)
    feats, feats_p = mean_vfe(v.voxels, v.num_points).to(dtype), mean_vfe(vp.voxels, vp.num_points).to(dtype)
    fused = pnn.fuse_for_inference(net)
    if rid == "S2-tf32":
        for m in fused.modules():
            if hasattr(m, "precision"):
                m.precision = "tf32"

    def eager():
        with torch.no_grad():
            return net.forward_voxels(feats, v.coords, 1)["encoded_spconv_tensor"].features

    def static():
        with torch.no_grad():
            t = pnn.SparseConvTensor(feats_p, vp.coords, fused.sparse_shape, 1, static=True)
            return fused(t)["encoded_spconv_tensor"].features

    return {"eager": None if rid == "S2-tf32" else eager, "captured": static}


def time_eager(fn, warmup: int, rep: int) -> float:
    """Median ms of ``rep`` calls, each between two CUDA events and a sync, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph(fn, calls: int, warmup: int, rep: int):
    """``calls`` calls captured in one CUDA graph after 3 side-stream warm-up rounds (compiles and
    autotuning happen outside the capture); median ms per call of the replays, last call's output."""

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn() for _ in range(calls)]  # all kept: each call writes its own memory
    ms = time_eager(graph.replay, warmup, rep) / calls
    torch.cuda.synchronize()
    return ms, outs[-1]


def make_model(ctx: dict, tree: Path, tag: str, weights: Path):
    from pcops.models.pointpillars import PointPillars

    models_file = Path(sys.modules["pcops.models"].__file__).resolve()
    assert models_file.is_relative_to(tree), f"pcops.models from {models_file}, not {tree}"
    if not weights.exists():
        assert tag == "new", "the NEW tree writes the shared weights first"
        try:
            state = PointPillars.pretrained().state_dict()
        except (AttributeError, FileNotFoundError):  # no shipped weights: seeded random init
            torch.manual_seed(0)
            state = PointPillars().state_dict()
        torch.save(state, weights)
    model = PointPillars()
    model.load_state_dict(torch.load(weights, map_location="cpu"))
    if hasattr(model, "weights_source"):
        model.weights_source = str(weights)  # loaded weights: no "untrained" warning
    return model.to(ctx["dev"]).eval()


def worker(a, tree: Path, tag: str, rnd: int, out_dir: Path) -> None:
    pcops, smoke, save = import_tree(tree), a.smoke_cpu, rnd == 0
    small, dev = (20000, torch.device("cpu")) if smoke else (None, torch.device("cuda"))
    ctx = {"dev": dev, "smoke": smoke, "scan": load_points(a.scan, small), "scan2": load_points(a.scan2, small)}
    result = {"tree": str(tree), "tag": tag, "round": rnd, "pcops": pcops.__file__, "rows": {}}
    if not smoke:
        import triton

        result.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    res_path = out_dir / f"{tag}_{rnd}.json"
    warm, rep_e, rep_g = (3, 50, 50) if a.quick else (5, 100, 200)
    for rid in a.only:
        rec = result["rows"][rid] = {}
        t0 = time.perf_counter()
        try:
            if rid.startswith("E") and "model" not in ctx:
                ctx["model"] = make_model(ctx, tree, tag, out_dir / "pointpillars_state.pt")
            spec = build(rid, pcops, ctx)
            outs = {}
            for form, fn in ((f, spec[f]) for f in ("eager", "captured") if spec[f] is not None):
                if smoke:
                    outs[form] = tensors(fn())
                    continue
                if form == "eager" or spec.get("self_captured"):
                    rec[form] = time_eager(fn, warm, rep_e if form == "eager" else rep_g)
                    ret = fn()
                else:
                    rec[form], ret = time_graph(fn, GRAPH_CALLS.get(rid, 1), warm, rep_g)
                torch.cuda.synchronize()
                outs[form] = tensors(ret) if save else None
            if save:
                torch.save(outs, out_dir / f"{tag}_{rid}.pt")
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the others still run
            rec["error"] = f"{type(e).__name__}: {e}"[:500]
        spec = ret = outs = None  # the row's graphs and outputs go before the next row
        if not smoke:
            torch.cuda.empty_cache()
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"[{tag} round {rnd}] {rid}: {rec}", flush=True)
        res_path.write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------- parent
def equal(x, y) -> bool:
    """``torch.equal``, except that NaNs in the same places count as equal."""
    if torch.equal(x, y):
        return True
    if not x.is_floating_point():
        return False
    nan = x.isnan()
    return torch.equal(nan, y.isnan()) and torch.equal(x[~nan], y[~nan])


def compare(old: list | None, new: list | None):
    """(identical, max |new - old| over float outputs or a reason) of two output lists."""
    if old is None or new is None:
        return None, "outputs missing"
    if len(old) != len(new):
        return False, f"{len(old)} vs {len(new)} outputs"
    same, diff = True, 0.0
    for x, y in zip(old, new):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False, f"{x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        if not equal(x, y):
            same = False
            if x.is_floating_point():
                diff = max(diff, (x.double() - y.double()).abs().nan_to_num(float("inf")).max().item())
    return same, None if same else f"max abs diff {diff:.3g}"


def git_head(tree: Path) -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, timeout=20)
        return r.stdout.strip() or None
    except OSError:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", default=".cmp/old")
    p.add_argument("--new", default=".")
    p.add_argument("--scan", default=".cmp/data/000001.bin")
    p.add_argument("--scan2", help="E2's second scan (default: 000000.bin next to --scan, else --scan)")
    p.add_argument("--out", default="compare_commits.json")
    p.add_argument("--quick", action="store_true", help="fewer repetitions, one round per tree")
    p.add_argument("--rounds", type=int, help="processes per tree (default 2, --quick 1)")
    p.add_argument("--only", nargs="+", help="row ids or prefixes (E1, N1, P1-fwd, ...)")
    p.add_argument("--smoke-cpu", action="store_true", help="one call per row on small CPU inputs")
    p.add_argument("--old-commit", default="7e456aa")
    p.add_argument("--new-commit", help="default: git rev-parse HEAD in --new, else $PCOPS_COMMIT")
    p.add_argument("--timeout", type=float, default=280, help="seconds per worker process")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)  # TREE TAG ROUND TMP
    a = p.parse_args()
    if a.worker:
        return worker(a, Path(a.worker[0]).resolve(), a.worker[1], int(a.worker[2]), Path(a.worker[3]))
    only = [r for r in ROWS if not a.only or any(r.lower().startswith(o.lower()) for o in a.only)]
    if not only:
        p.error(f"--only: no row matches {a.only}; rows: {', '.join(ROWS)}")
    trees = {"new": Path(a.new).resolve(), "old": Path(a.old).resolve()}
    scan = Path(a.scan).resolve()
    scan2 = Path(a.scan2).resolve() if a.scan2 else scan.with_name("000000.bin")
    scan2 = scan2 if scan2.exists() else scan
    rounds = 1 if a.smoke_cpu else (a.rounds or (1 if a.quick else 2))
    order = [t for r in range(rounds) for t in (("new", "old") if r % 2 == 0 else ("old", "new"))]
    tmp = Path(tempfile.mkdtemp(prefix="compare_commits_"))
    runs: dict[str, list] = {"new": [], "old": []}
    t_start = time.perf_counter()
    for tag in order:
        rnd, tree = len(runs[tag]), trees[tag]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), tag, str(rnd), str(tmp)]
        cmd += ["--scan", str(scan), "--scan2", str(scan2), "--only", *only]
        cmd += ["--quick"] * a.quick + ["--smoke-cpu"] * a.smoke_cpu
        print(f"== {tag} round {rnd}: {tree} ({time.perf_counter() - t_start:.0f} s)", flush=True)
        err = None
        try:  # cwd and PYTHONPATH = the tree: its pcops, models and csrc
            proc = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, timeout=a.timeout)
            err = f"worker exit status {proc.returncode}" if proc.returncode else None
        except (subprocess.TimeoutExpired, OSError) as e:  # over --timeout, or no such tree
            err = f"worker {type(e).__name__}: {str(e)[-150:]}"
        res_file = tmp / f"{tag}_{rnd}.json"
        runs[tag].append({**(json.loads(res_file.read_text()) if res_file.exists() else {"rows": {}}), "error": err})
    rows, slow = [], []
    for rid in only:
        outs = {t: torch.load(tmp / f"{t}_{rid}.pt") if (tmp / f"{t}_{rid}.pt").exists() else {} for t in runs}
        recs = {t: [r["rows"].get(rid, {}) for r in runs[t]] for t in runs}
        errors = sorted({f"{rid} {t}: {x['error']}" for t in recs for x in recs[t] if "error" in x})
        for form in ("eager", "captured"):
            ms = {t: [x.get(form) for x in recs[t]] for t in recs}
            med = {t: statistics.median(v) if (v := [x for x in ms[t] if x is not None]) else None for t in ms}
            ratio = med["new"] / med["old"] if med["new"] and med["old"] else None
            same, note = compare(outs["old"].get(form), outs["new"].get(form))
            rows.append(dict(row=rid, form=form, old_ms=med["old"], new_ms=med["new"], ratio=ratio, identical=same))
            rows[-1].update(note=note, old_ms_rounds=ms["old"], new_ms_rounds=ms["new"], errors=errors)
            slow += [rows[-1]] if ratio and ratio > 1.05 else []
    fmt = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    print("\n| workload | form | old ms | new ms | new/old | identical outputs |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        ident = {True: "yes", False: f"**no** ({r['note']})", None: f"- ({r['note']})"}[r["identical"]]
        cells = [r["row"], r["form"], fmt(r["old_ms"]), fmt(r["new_ms"]), fmt(r["ratio"], 3), ident]
        print("| " + " | ".join(cells) + " |")
    worker_errors = [f"{t} worker: {r['error']}" for t in runs for r in runs[t] if r["error"]]
    for msg in sorted({e for r in rows for e in r["errors"]}) + worker_errors:
        print("error", msg)
    print("\nslowdowns over 5 %: " + (", ".join(f"{r['row']} {r['form']} x{r['ratio']:.3f}" for r in slow) or "none"))
    first = next((r for t in order for r in runs[t] if r.get("device")), {})
    report = dict(device=first.get("device", "cpu (smoke)" if a.smoke_cpu else None), torch=torch.__version__)
    report.update(triton=first.get("triton"), date=datetime.datetime.now(datetime.timezone.utc).isoformat())
    new_commit = a.new_commit or git_head(trees["new"]) or os.environ.get("PCOPS_COMMIT")
    report.update(old_commit=a.old_commit, new_commit=new_commit)
    report.update(scan=str(scan), scan2=str(scan2), quick=a.quick, smoke_cpu=a.smoke_cpu, rounds=rounds, order=order)
    report.update(graph_calls_per_replay=GRAPH_CALLS, seconds=round(time.perf_counter() - t_start, 1), rows=rows)
    report.update(slowdowns_over_5_percent=[f"{r['row']} {r['form']}" for r in slow], workers=runs["new"] + runs["old"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    shutil.rmtree(tmp, ignore_errors=True)  # the compared outputs (hundreds of MB on the GPU workloads)
    print(f"wrote {a.out} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
