"""Where the host time of an eager forward + backward of ``fused_layer_norm_gelu`` goes (issue 19).

    python benchmarks/autograd_overhead.py --out DIR     # CUDA; writes DIR/autograd_overhead_cuda.json

µs per call (``dispatch_overhead.host_us_per_call``: back-to-back calls, median of 5 rounds) of
pcops and torch (``F.layer_norm`` + ``F.gelu``) on a tiny (4×64) and the L1 (4096×768) input:
forward with and without inputs that need gradients, forward + backward through
``sum().backward()``, ``backward(gy)``, ``autograd.grad`` and with the autograd engine's device
threads off, the backward op through the dispatcher and its kernel function alone, and the time
spent inside pcops' Python backward formula.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402
from pcops import _library  # noqa: E402

from common import environment  # noqa: E402
from dispatch_overhead import host_us_per_call  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--out", default=".")
out_dir = ap.parse_args().out
if not torch.cuda.is_available():
    sys.exit("autograd_overhead: needs a CUDA device")
dev = "cuda"
g = torch.Generator().manual_seed(0)
res = {}


def T(name, fn, calls=300):
    res[name] = round(host_us_per_call(fn, dev, calls), 1)
    print(f"{name:70s} {res[name]:8.1f} us", flush=True)


for rows, n in ((4, 64), (4096, 768)):
    x = torch.randn(rows, n, generator=g).to(dev)
    w = torch.rand(n, generator=g).to(dev)
    b = torch.rand(n, generator=g).to(dev)
    xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
    gy = torch.randn(rows, n, device=dev)
    tag = f"{rows}x{n}"
    T(f"{tag} pcops fwd no grad", lambda: pcops.fused_layer_norm_gelu(x, w, b))
    T(f"{tag} torch fwd no grad", lambda: F.gelu(F.layer_norm(x, (n,), w, b), approximate="tanh"))
    T(f"{tag} pcops fwd (inputs require grad, no backward)", lambda: pcops.fused_layer_norm_gelu(xg, wg, bg))
    T(f"{tag} pcops fwd+bwd sum().backward()", lambda: pcops.fused_layer_norm_gelu(xg, wg, bg).sum().backward())
    T(
        f"{tag} torch fwd+bwd sum().backward()",
        lambda: F.gelu(F.layer_norm(xg, (n,), wg, bg), approximate="tanh").sum().backward(),
    )
    T(f"{tag} pcops fwd+bwd backward(gy)", lambda: pcops.fused_layer_norm_gelu(xg, wg, bg).backward(gy))
    T(
        f"{tag} torch fwd+bwd backward(gy)",
        lambda: F.gelu(F.layer_norm(xg, (n,), wg, bg), approximate="tanh").backward(gy),
    )
    T(
        f"{tag} pcops fwd+bwd autograd.grad(gy)",
        lambda: torch.autograd.grad(pcops.fused_layer_norm_gelu(xg, wg, bg), (xg, wg, bg), gy),
    )
    try:
        torch.autograd.set_multithreading_enabled(False)
        T(
            f"{tag} pcops fwd+bwd backward(gy), autograd multithreading off",
            lambda: pcops.fused_layer_norm_gelu(xg, wg, bg).backward(gy),
        )
        T(
            f"{tag} torch fwd+bwd backward(gy), autograd multithreading off",
            lambda: F.gelu(F.layer_norm(xg, (n,), wg, bg), approximate="tanh").backward(gy),
        )
    finally:
        torch.autograd.set_multithreading_enabled(True)
    y, mean, rstd = torch.ops.pcops.layer_norm_gelu(x, w, b, 1e-5, "tanh", 0.0, None)
    T(
        f"{tag} backward op direct (torch.ops)",
        lambda: torch.ops.pcops.layer_norm_gelu_backward(gy, x, w, b, mean, rstd, "tanh", 0.0, None),
    )
    T(
        f"{tag} backward kernel fn direct",
        lambda: _library.OPS["layer_norm_gelu_backward"].kernels["cuda"](gy, x, w, b, mean, rstd, "tanh", 0.0, None),
    )

# time spent inside the Python backward formula and setup_context, per call
op = _library.OPS["layer_norm_gelu"]
inner = {"bwd": [], "setup": []}
ob, osu = op._backward, op._setup_context


def tb(ctx, *a):
    t = time.perf_counter()
    r = ob(ctx, *a)
    inner["bwd"].append(time.perf_counter() - t)
    return r


def ts(ctx, i, o):
    t = time.perf_counter()
    osu(ctx, i, o)
    inner["setup"].append(time.perf_counter() - t)


op._backward, op._setup_context = tb, ts
x = torch.randn(4, 64, device=dev, requires_grad=True)
w = torch.rand(64, device=dev, requires_grad=True)
b = torch.rand(64, device=dev, requires_grad=True)
gy = torch.randn(4, 64, device=dev)
for _ in range(300):
    pcops.fused_layer_norm_gelu(x, w, b).backward(gy)
torch.cuda.synchronize()
for k, v in inner.items():
    res[f"inside {k} (median us)"] = round(statistics.median(v[50:]) * 1e6, 1)
    print(k, res[f"inside {k} (median us)"])
op._backward, op._setup_context = ob, osu
Path(out_dir).mkdir(parents=True, exist_ok=True)
env = environment()
record = {"benchmark": "autograd_overhead", **{k: env[k] for k in ("device", "torch", "triton", "date", "commit")}}
record["rows"] = [{"case": k, "host_us_per_call": v} for k, v in res.items()]
(Path(out_dir) / "autograd_overhead_cuda.json").write_text(json.dumps(record, indent=1))
