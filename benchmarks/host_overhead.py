"""Host time of eager calls: where the Python side of an op goes (cProfile), per public op.

An eager call of a pcops op pays the argument checks, the ``torch.library`` custom-op dispatch
(and autograd wrapper), the launcher and the Triton/NVRTC launches. On small inputs that host
time, not the GPU, is the eager figure, so this lists, per op, the host µs per call (wall clock
with the GPU idle-waiting: inputs are tiny) and the ten functions with the most own time.
``python benchmarks/host_overhead.py --out DIR`` (GPU only) writes ``host_overhead.json``.
"""

import cProfile
import io
import pstats
import time

import torch
import triton

from common import parse_args, report

import pcops


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def cases():
    dev = "cuda"
    x = torch.randn(64, 768, device=dev)
    w = torch.randn(768, device=dev)
    b = torch.randn(768, device=dev)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn_like(x)
    crow = torch.arange(0, 6401, 64, device=dev)
    v = torch.randn(6400, device=dev)
    pts = torch.rand(2000, 4, device=dev) * torch.tensor([60.0, 60.0, 3.0, 1.0], device=dev) - torch.tensor(
        [0.0, 30.0, 2.0, 0.0], device=dev
    )
    vcfg = dict(
        voxel_size=(0.16, 0.16, 4.0),
        point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1),
        max_points_per_voxel=32,
        max_voxels=40000,
        pad_to_max=True,
    )

    def fwd_bwd():
        xg.grad = None
        pcops.fused_layer_norm_gelu(xg, w, b).backward(dy)

    from pcops import layer_norm_gelu as op
    from pcops.triton import layer_norm_gelu as tri
    from pcops.triton import sparse_softmax as tri_softmax

    ln_args = (
        x,
        w,
        b,
        torch.empty_like(x),
        torch.empty(64, device=dev),
        torch.empty(64, device=dev),
        x,
        64,
        768,
        1e-5,
        0.0,
    )
    ln_meta = dict(APPROX_TANH=True, HAS_DROPOUT=False, ONE_TILE=True, EVEN_N=False, BLOCK_N=1024, FAST_TANH=False)

    return {
        "fused_layer_norm_gelu fwd": lambda: pcops.fused_layer_norm_gelu(x, w, b),
        # the layers of one call, outermost first: where the host time goes
        "  fwd under no_grad": lambda: _no_grad(lambda: pcops.fused_layer_norm_gelu(x, w, b)),
        "  torch.ops.pcops.layer_norm_gelu": lambda: torch.ops.pcops.layer_norm_gelu(x, w, b, 1e-5, "tanh", 0.0, None),
        "  registered cuda kernel fn": lambda: op._layer_norm_gelu_cuda(x, w, b, 1e-5, "tanh", 0.0, None),
        "  triton launcher": lambda: tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", 0.0, None),
        "  torch.empty_like x3 (allocation floor)": lambda: (
            torch.empty_like(x),
            torch.empty_like(w),
            torch.empty_like(b),
        ),
        "  launcher prelude (flags, outputs)": lambda: (
            tri._row_block_n(768, None),
            tri._fast_tanh(x.dtype, x.device, "tanh", tri.FAST_TANH_FWD_DTYPES),
            torch.empty_like(x),
            torch.empty(64, device=dev),
            torch.empty(64, device=dev),
        ),
        "  triton.autotune launch": lambda: tri._layer_norm_gelu_fwd_tuned[
            lambda c: (triton.cdiv(64, c["BLOCK_M"] * c["TILES"]),)
        ](*ln_args, **ln_meta, M_CLASS=0),
        "  plain JIT launch (fixed config)": lambda: tri._layer_norm_gelu_fwd_kernel[(32,)](
            *ln_args, **ln_meta, BLOCK_M=2, TILES=1, num_warps=4, M_CLASS=0
        ),
        "torch layer_norm+gelu fwd": lambda: torch.nn.functional.gelu(
            torch.nn.functional.layer_norm(x, (768,), w, b), approximate="tanh"
        ),
        "fused_layer_norm_gelu fwd+bwd": fwd_bwd,
        "sparse_softmax triton": lambda: pcops.sparse_softmax(v, crow),
        "  torch.ops.pcops.sparse_softmax": lambda: torch.ops.pcops.sparse_softmax(v, crow, "triton"),
        "  triton launcher ": lambda: tri_softmax.sparse_softmax(v, crow),
        "voxelize pad_to_max": lambda: pcops.voxelize(pts, **vcfg),
    }


def main():
    args = parse_args(__doc__)
    rows, notes = [], {}
    for name, fn in cases().items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host_us = (time.perf_counter() - t0) / n * 1e6  # enqueue time: the GPU work is tiny
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(10)
        top = [ln for ln in s.getvalue().splitlines() if ln.strip()[:1].isdigit()][:12]
        print(f"{name}: {host_us:.1f} µs host per eager call\n" + "\n".join(top))
        notes[name] = {"host_us_per_call": round(host_us, 1), "top_tottime": top}
        ms = host_us / 1000
        rows.append({"workload": "host", "impl": name, "median_ms": ms, "min_ms": ms, "max_ms": ms, "runs": n})
    report(rows, "host_overhead", args.out, notes=notes)


if __name__ == "__main__":
    main()
