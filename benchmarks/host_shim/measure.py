"""Lab (issue 19): host µs of a LayerNorm + GELU forward through pcops' Python path, through a C++
shim launching the same compiled Triton kernel (``lng_shim.cpp``), and through torch; and the cost
of Triton's launcher with tensor vs integer pointer arguments. GPU only; writes JSON to argv[1]."""

import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import pcops  # noqa: E402
from pcops.triton import _launch  # noqa: E402
from pcops.triton import layer_norm_gelu as impl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build import build  # noqa: E402

os.environ["PCOPS_NATIVE_HOST"] = "0"  # the Python path first (no background build while it is timed)
dev = torch.device("cuda")
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
t0 = time.perf_counter()
so = build("/tmp/pcops_shim")
out["build_s"] = round(time.perf_counter() - t0, 1)
spec = importlib.util.spec_from_file_location("pcops_host_shim", so)
shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shim)


def setup(m, n=768):
    x = torch.randn(m, n, device=dev)
    w, b = torch.randn(n, device=dev), torch.randn(n, device=dev)
    y = pcops.fused_layer_norm_gelu(x, w, b)
    y = pcops.fused_layer_norm_gelu(x, w, b)
    torch.cuda.synchronize()
    key = next(k for k in impl._FWD_PLANS if k[0] == n and k[1] == impl._m_class(m) and k[2] == torch.float32)
    rows, kw = impl._FWD_PLANS[key]
    args = (x, w, b, torch.empty_like(x), torch.empty(m, device=dev), torch.empty(m, device=dev), x, m, n, 1e-5, 0.0)
    compiled = impl._layer_norm_gelu_fwd_kernel[(-(-m // rows),)](*args, **kw)
    runtime = [t for t in compiled.src.signature.values() if t != "constexpr"]
    assert runtime == ["*fp32"] * 7 + ["i32", "i32", "fp32", "fp32"], compiled.src.signature
    md = compiled.metadata
    assert md.num_ctas == 1 and not md.global_scratch_size and not md.profile_scratch_size
    kid = shim.bind(compiled.function, rows, md.num_warps, md.shared)
    stream = torch._C._cuda_getCurrentRawStream(dev.index or 0)
    ys = shim.lng_forward(x, w, b, 1e-5, kid, stream)
    torch.cuda.synchronize()
    ref = impl.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    same = torch.equal(ys[0], y) and torch.equal(ys[1], ref[1]) and torch.equal(ys[2], ref[2])
    info = _launch._BY_ID[id(impl._layer_norm_gelu_fwd_kernel)]
    hit = info.bound[_launch._key(info, torch._C._cuda_getDevice(), args, kw)]
    return x, w, b, kid, stream, same, args, hit, -(-m // rows)


def host_us(f, n=3000):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        s = time.perf_counter()
        for _ in range(n):
            f()
        best.append((time.perf_counter() - s) / n * 1e6)
        torch.cuda.synchronize()
    return round(min(best), 2), round(statistics.median(best), 2)


def event_ms(f, n=200):
    for _ in range(20):
        f()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return round(statistics.median(ts), 4)


rows = {}
for m, label in ((64, "small 64x768"), (4096, "L1 4096x768")):
    x, w, b, kid, stream, same, args, hit, grid = setup(m)
    run, function, coop, pdl, meta, tail = hit
    ptrs = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    fns = {
        "pcops.fused_layer_norm_gelu": lambda: pcops.fused_layer_norm_gelu(x, w, b),
        "pcops.triton impl (allocs + launch)": lambda: impl.layer_norm_gelu(x, w, b, 1e-5, "tanh"),
        "C++ shim (checks, allocs, cuLaunchKernel)": lambda: shim.lng_forward(x, w, b, 1e-5, kid, stream),
        "C++ shim + stream lookup": lambda: shim.lng_forward(x, w, b, 1e-5, kid, torch._C._cuda_getCurrentRawStream(0)),
        "Triton launcher, tensor args": lambda: run(
            grid, 1, 1, stream, function, coop, pdl, None, None, meta, None, None, None, *args, *tail
        ),
        "Triton launcher, int pointers": lambda: run(
            grid, 1, 1, stream, function, coop, pdl, None, None, meta, None, None, None, *ptrs, *tail
        ),
        "_launch.launch": lambda: _launch.launch(
            impl._layer_norm_gelu_fwd_kernel,
            (grid,),
            *args,
            **impl._FWD_PLANS[next(k for k in impl._FWD_PLANS if k[0] == 768 and k[1] == impl._m_class(m))][1],
        ),
        "torch F.gelu(F.layer_norm)": lambda: F.gelu(F.layer_norm(x, (768,), w, b), approximate="tanh"),
        "torch x * 2": lambda: x * 2,
    }
    xr, wr, br = x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    dy = torch.randn_like(x)
    fns["pcops fwd+bwd"] = lambda: pcops.fused_layer_norm_gelu(xr, wr, br).backward(dy)
    fns["torch fwd+bwd"] = lambda: F.gelu(F.layer_norm(xr, (768,), wr, br), approximate="tanh").backward(dy)
    r = {"shim output identical": same}
    for name, f in fns.items():
        r[name] = {"host_us_min_median": host_us(f)}
        if m == 4096 and "launcher" not in name and "_launch" not in name:
            r[name]["event_ms"] = event_ms(f)
    rows[label] = r
    print(label, json.dumps(r, indent=1), flush=True)
# P1 (pillar scatter, KITTI-sized: 16,000 pillars, 64 channels, 496 × 432), Python path and torch
g = torch.Generator(device="cuda").manual_seed(0)
lin = torch.randperm(496 * 432, device="cuda", generator=g)[:16000]
p_coords = torch.stack([torch.zeros_like(lin), torch.zeros_like(lin), lin // 432, lin % 432], 1).int()
p_feats = torch.randn(16000, 64, device="cuda", generator=g)
p_fr = p_feats.clone().requires_grad_(True)
p_dy = torch.randn(1, 64, 496, 432, device="cuda", generator=g)


def torch_p1(f):
    canvas = f.new_zeros(64, 496 * 432)
    canvas[:, lin] = f.t()
    return canvas.view(1, 64, 496, 432)


p1 = {
    "pcops fwd": lambda: pcops.pillar_scatter(p_feats, p_coords, 1, (496, 432)),
    "pcops fwd+bwd": lambda: pcops.pillar_scatter(p_fr, p_coords, 1, (496, 432)).backward(p_dy),
    "torch fwd": lambda: torch_p1(p_feats),
    "torch fwd+bwd": lambda: torch_p1(p_fr).backward(p_dy),
}
rows["P1"] = {name: {"event_ms": event_ms(f), "host_us_min_median": host_us(f, 1000)} for name, f in p1.items()}
# dynamic V1 cells only (KITTI scan 000001 when PCOPS_DATA has it, else 120,000 uniform points)
scan_path = Path(os.environ.get("PCOPS_DATA", "/nonexistent")) / "kitti/training/velodyne/000001.bin"
if scan_path.exists():
    import numpy as np

    v_points = torch.from_numpy(np.fromfile(scan_path, dtype=np.float32).reshape(-1, 4)).to(dev)
else:
    v_points = torch.rand(120000, 4, device=dev) * 80 - 20
V_VS, V_PCR = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
cells = lambda: pcops.dynamic_voxelize(v_points, V_VS, V_PCR, cells_only=True)  # noqa: E731
rows["V1 cells_only"] = {
    "points": v_points.shape[0],
    "pcops": {"event_ms": event_ms(cells), "host_us_min_median": host_us(cells, 1000)},
}
print("P1", json.dumps(rows["P1"]), flush=True)

# the product path (pcops._native): built and loaded here, the shape classes registered by a Python-path call
from pcops import _native  # noqa: E402

os.environ["PCOPS_NATIVE_HOST"] = "1"

t0 = time.perf_counter()
_native.request(wait=True)
out["native_status"] = _native.status()
out["native_build_s"] = round(time.perf_counter() - t0, 1)
for m, label in ((64, "small 64x768"), (4096, "L1 4096x768")):
    x = torch.randn(m, 768, device=dev)
    w, b = torch.randn(768, device=dev), torch.randn(768, device=dev)
    ref = impl.layer_norm_gelu(x, w, b, 1e-5, "tanh")[0]
    pcops.fused_layer_norm_gelu(x, w, b)  # registers the class
    host = _native.MODULE
    got = host.lng_forward(x, w, b, 1e-5, "tanh", 0.0, False, "auto") if host is not None else None
    r = rows[label]
    r["native path taken"] = got is not None
    r["native output identical"] = got is not None and torch.equal(got, ref)
    r["pcops.fused_layer_norm_gelu, native"] = {
        "host_us_min_median": host_us(lambda: pcops.fused_layer_norm_gelu(x, w, b))
    }
    xr, wr, br = x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    dy = torch.randn_like(x)
    for _ in range(2):  # the first backward registers its kernels (the Python backward)
        pcops.fused_layer_norm_gelu(xr, wr, br).backward(dy)
    r["native backward registered"] = list(host.lng_plans()) if host is not None else None
    r["pcops fwd+bwd, native"] = {
        "host_us_min_median": host_us(lambda: pcops.fused_layer_norm_gelu(xr, wr, br).backward(dy))
    }
    if m == 4096:
        r["pcops fwd+bwd, native"]["event_ms"] = event_ms(lambda: pcops.fused_layer_norm_gelu(xr, wr, br).backward(dy))
        r["torch fwd+bwd, again"] = {
            "event_ms": event_ms(lambda: F.gelu(F.layer_norm(xr, (768,), wr, br), approximate="tanh").backward(dy))
        }
        torch.autograd.set_multithreading_enabled(False)
        r["pcops fwd+bwd, native, autograd single-thread"] = {
            "event_ms": event_ms(lambda: pcops.fused_layer_norm_gelu(xr, wr, br).backward(dy))
        }
        r["torch fwd+bwd, autograd single-thread"] = {
            "event_ms": event_ms(lambda: F.gelu(F.layer_norm(xr, (768,), wr, br), approximate="tanh").backward(dy))
        }
        torch.autograd.set_multithreading_enabled(True)
    if m == 4096:
        r["pcops.fused_layer_norm_gelu, native"]["event_ms"] = event_ms(lambda: pcops.fused_layer_norm_gelu(x, w, b))
        r["torch F.gelu(F.layer_norm), again"] = {
            "event_ms": event_ms(lambda: F.gelu(F.layer_norm(x, (768,), w, b), approximate="tanh"))
        }
    print(label, "native", json.dumps({k: v for k, v in r.items() if "native" in k}), flush=True)
ref_canvas = pcops.pillar_scatter(p_feats, p_coords, 1, (496, 432))  # registers the device's kernels
host = _native.MODULE
got = host.ps_forward(p_feats, p_coords, 1, (496, 432), "auto") if host is not None else None
rows["P1"]["native path taken"] = got is not None
rows["P1"]["native output identical"] = got is not None and torch.equal(got, ref_canvas)
for name in ("pcops fwd", "pcops fwd+bwd"):
    rows["P1"][name + ", native"] = {"event_ms": event_ms(p1[name]), "host_us_min_median": host_us(p1[name], 1000)}
for name in ("torch fwd", "torch fwd+bwd"):
    rows["P1"][name + ", again"] = {"event_ms": event_ms(p1[name])}
torch.autograd.set_multithreading_enabled(False)
for name in ("pcops fwd+bwd", "torch fwd+bwd"):
    rows["P1"][name + ", native, autograd single-thread"] = {"event_ms": event_ms(p1[name])}
torch.autograd.set_multithreading_enabled(True)
print("P1 native", json.dumps(rows["P1"]), flush=True)
ref_cells = cells()
got = host.pc_forward(v_points, V_VS, V_PCR, None, "auto") if host is not None else None
rows["V1 cells_only"]["native output identical"] = got is not None and torch.equal(got, ref_cells)
rows["V1 cells_only"]["pcops, native"] = {"event_ms": event_ms(cells), "host_us_min_median": host_us(cells, 1000)}
print("V1 cells", json.dumps(rows["V1 cells_only"]), flush=True)
out["rows"] = rows
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
