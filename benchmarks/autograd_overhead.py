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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402
from pcops import _library  # noqa: E402

from bench_layer_norm_gelu import torch_ln_gelu as _torch_ln_gelu  # noqa: E402
from common import environment  # noqa: E402
from dispatch_overhead import host_us_per_call  # noqa: E402


def layer_cases(dev: str, res: dict, calls: int = 300) -> None:
    """Host µs per call of each way to run the forward (+ backward), into ``res``."""
    g = torch.Generator().manual_seed(0)

    def timed(name, fn):
        res[name] = round(host_us_per_call(fn, dev, calls), 1)
        print(f"{name:70s} {res[name]:8.1f} us", flush=True)

    fused = pcops.fused_layer_norm_gelu
    for rows, n in ((4, 64), (4096, 768)):
        x = torch.randn(rows, n, generator=g).to(dev)
        w, b = torch.rand(n, generator=g).to(dev), torch.rand(n, generator=g).to(dev)
        xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
        gy = torch.randn(rows, n, device=dev)
        tag = f"{rows}x{n}"
        timed(f"{tag} pcops fwd no grad", lambda: fused(x, w, b))
        timed(f"{tag} torch fwd no grad", lambda: _torch_ln_gelu(x, w, b))
        timed(f"{tag} pcops fwd (inputs require grad, no backward)", lambda: fused(xg, wg, bg))
        timed(f"{tag} pcops fwd+bwd sum().backward()", lambda: fused(xg, wg, bg).sum().backward())
        timed(f"{tag} torch fwd+bwd sum().backward()", lambda: _torch_ln_gelu(xg, wg, bg).sum().backward())
        timed(f"{tag} pcops fwd+bwd backward(gy)", lambda: fused(xg, wg, bg).backward(gy))
        timed(f"{tag} torch fwd+bwd backward(gy)", lambda: _torch_ln_gelu(xg, wg, bg).backward(gy))
        timed(
            f"{tag} pcops fwd+bwd autograd.grad(gy)", lambda: torch.autograd.grad(fused(xg, wg, bg), (xg, wg, bg), gy)
        )
        try:  # the backward on the calling thread instead of the engine's device thread
            torch.autograd.set_multithreading_enabled(False)
            off = "autograd multithreading off"
            timed(f"{tag} pcops fwd+bwd backward(gy), {off}", lambda: fused(xg, wg, bg).backward(gy))
            timed(f"{tag} torch fwd+bwd backward(gy), {off}", lambda: _torch_ln_gelu(xg, wg, bg).backward(gy))
        finally:
            torch.autograd.set_multithreading_enabled(True)
        _, mean, rstd = torch.ops.pcops.layer_norm_gelu(x, w, b, 1e-5, "tanh", 0.0, None)
        args = (gy, x, w, b, mean, rstd, "tanh", 0.0, None)
        timed(f"{tag} backward op direct (torch.ops)", lambda: torch.ops.pcops.layer_norm_gelu_backward(*args))
        kernel = _library.OPS["layer_norm_gelu_backward"].kernels[dev]
        timed(f"{tag} backward kernel fn direct", lambda: kernel(*args))


def inside_formula(dev: str, res: dict, calls: int = 300) -> None:
    """Median µs per call spent inside the registered backward formula and ``setup_context``."""
    op = _library.OPS["layer_norm_gelu"]
    inner = {"bwd": [], "setup": []}
    backward, setup = op._backward, op._setup_context

    def timed_backward(ctx, *grads):
        t = time.perf_counter()
        out = backward(ctx, *grads)
        inner["bwd"].append(time.perf_counter() - t)
        return out

    def timed_setup(ctx, inputs, output):
        t = time.perf_counter()
        setup(ctx, inputs, output)
        inner["setup"].append(time.perf_counter() - t)

    op._backward, op._setup_context = timed_backward, timed_setup
    try:
        x = torch.randn(4, 64, device=dev, requires_grad=True)
        w = torch.rand(64, device=dev, requires_grad=True)
        b = torch.rand(64, device=dev, requires_grad=True)
        gy = torch.randn(4, 64, device=dev)
        for _ in range(calls):
            pcops.fused_layer_norm_gelu(x, w, b).backward(gy)
        if dev == "cuda":
            torch.cuda.synchronize()
    finally:
        op._backward, op._setup_context = backward, setup
    for k, v in inner.items():
        res[f"inside {k} (median us)"] = round(statistics.median(v[50:]) * 1e6, 1)
        print(k, res[f"inside {k} (median us)"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    out_dir = Path(ap.parse_args().out)
    if not torch.cuda.is_available():
        sys.exit("autograd_overhead: needs a CUDA device")
    res: dict = {}
    layer_cases("cuda", res)
    inside_formula("cuda", res)
    env = environment()
    record = {"benchmark": "autograd_overhead", **{k: env[k] for k in ("device", "torch", "triton", "date", "commit")}}
    record["rows"] = [{"case": k, "host_us_per_call": v} for k, v in res.items()]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "autograd_overhead_cuda.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
