"""L1-L3: fused LayerNorm+GELU (WORKLOADS.md), forward and forward+backward.

L1 4,096 × 768 float32, L2 131,072 × 256 bfloat16, L3 131,072 × 64 float32 (eps 1e-5, tanh
GELU). Baselines, same run: eager ``F.gelu(F.layer_norm(...), approximate="tanh")`` and its
``torch.compile``d version.

fwd+bwd rows: ``y = f(x, w, b); y.backward(dy)`` with the leaves' ``.grad`` reset to None
before each call (what ``optimizer.zero_grad()`` does by default since torch 2.0), so autograd
hands the backward's gradient tensors over instead of adding them into existing ones; every
implementation is timed the same way. ``(fwd+bwd, accumulate)``: pcops with the grads kept
across calls (autograd then adds dx into x.grad: one more elementwise kernel moving
``3·M·N·size`` bytes). ``launches per call`` (printed, and in the notes): GPU kernels one eager
call runs (torch profiler): L2 fwd, fwd+bwd and fwd+bwd with accumulation; the L1 forward
kernel's own time (its [graph] row is mostly replay overhead). The autotuned forward config and
the autotuner's graph timings of each config are printed and in the notes. Eager, [graph] and
[graph xK steady] rows: see ``_fused_bench.py``.
"""

import time

import torch
import torch.nn.functional as F

from common import parse_args, report
from _fused_bench import (
    BANDWIDTH,
    STEADY_L2_FACTOR,
    STEADY_MAX_K,
    STEADY_MIN_K,
    STEADY_REP,
    count_launches,
    grad_step,
    graph_row,
    l2_bytes,
    steady_k,
    steady_plan,
    steady_rows,
    timed_pair,
)

import pcops
from pcops.triton import layer_norm_gelu as tri

LN_WORKLOADS = [
    ("L1", 4096, 768, torch.float32),
    ("L2", 131072, 256, torch.bfloat16),
    ("L3", 131072, 64, torch.float32),
]


def torch_ln_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), approximate="tanh")


def pcops_ln_gelu(x, w, b):
    return pcops.fused_layer_norm_gelu(x, w, b, 1e-5, "tanh")


def bench_ln_steady(rows, wl, x, w, b, dy, impls, fwd_floor, fb_floor, notes):
    """Steady-state rows of one LayerNorm+GELU workload: each implementation ``f(x, w, b)`` of
    ``impls`` (fwd, then fwd+bwd through ``grad_step``) on K rotating copies of x (and dy and
    the leaves for fwd+bwd; weight/bias shared in fwd); fills ``notes[wl]``."""
    m, n = x.shape
    size = x.element_size()
    fwd_bytes = (2 * m * n + 2 * n) * size  # x read, y written (+ weight, bias)
    fb_bytes = (4 * m * n + 4 * n) * size  # x, dy read, y, dx written (+ weight, bias, their grads)
    l2 = l2_bytes()
    k = steady_k(fwd_bytes, l2)
    info = steady_plan(wl, k, l2, fwd_bytes, fb_bytes)
    xs = [x.clone() for _ in range(k)]
    steady_rows(rows, wl, "(fwd)", k, impls, lambda f: [lambda xi=xi: f(xi, w, b) for xi in xs], fwd_floor, m, info)
    xs.clear()  # free the copies (the lambdas ran inside steady_rows)
    leaves = [tuple(t.clone().requires_grad_(True) for t in (x, w, b)) for _ in range(k)]
    dys = [dy.clone() for _ in range(k)]
    steady_rows(
        rows,
        wl,
        "(fwd+bwd)",
        k,
        impls,
        lambda f: [grad_step(lambda lv=lv: f(*lv), lv, d) for lv, d in zip(leaves, dys)],
        fb_floor,
        m,
        info,
    )
    notes[wl] = info


def bench_layer_norm(rows, rep, compile_baseline, launches, steady=None):
    compiled = torch.compile(torch_ln_gelu, dynamic=False) if compile_baseline else None
    for wl, m, n, dtype in LN_WORKLOADS:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
        b = (0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
        dy = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        size = x.element_size()
        fwd_floor = 2 * m * n * size / BANDWIDTH * 1e3
        fb_floor = 5 * m * n * size / BANDWIDTH * 1e3  # fwd: x, y; bwd: dy, x, dx
        err = (pcops_ln_gelu(x, w, b).float() - torch_ln_gelu(x, w, b).float()).abs().max().item()
        print(f"{wl}: max |pcops - torch| = {err:.3g}")
        timings = getattr(tri._layer_norm_gelu_fwd_tuned, "configs_timings", None) or {}  # this workload's tuning
        tuned = sorted((v[0] if isinstance(v, (list, tuple)) else v, str(k)) for k, v in timings.items())
        print(f"{wl}: forward autotune (CUDA-graph timing, ms): " + "; ".join(f"{t:.4f} {c}" for t, c in tuned))
        launches[f"{wl} fwd autotune"] = [[t, c] for t, c in tuned]
        fwd = {"torch eager": lambda: torch_ln_gelu(x, w, b), "pcops triton": lambda: pcops_ln_gelu(x, w, b)}
        if compiled is not None:
            fwd["torch.compile"] = lambda: compiled(x, w, b)
        base = None
        for impl, fn in fwd.items():
            t = timed_pair(rows, wl, impl + " (fwd)", fn, rep, fwd_floor, m, base)
            base = base or t
        xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))

        def fwd_bwd(f, accumulate=False):
            return grad_step(lambda: f(xr, wr, br), (xr, wr, br), dy, accumulate)

        fb = {"torch eager": fwd_bwd(torch_ln_gelu), "pcops triton": fwd_bwd(pcops_ln_gelu)}
        if compiled is not None:
            fb["torch.compile"] = fwd_bwd(compiled)
        base = None
        for impl, fn in fb.items():
            t = timed_pair(rows, wl, impl + " (fwd+bwd)", fn, rep, fb_floor, m, base)
            base = base or t
        graph_row(
            rows,
            wl,
            "pcops triton (fwd+bwd, accumulate)",
            fwd_bwd(pcops_ln_gelu, accumulate=True),
            rep,
            fb_floor,
            m,
            (base or {}).get(True),
        )
        if steady is not None:  # the same implementations (torch.compile: the function compiled above)
            impls = {"torch eager": torch_ln_gelu, "pcops triton": pcops_ln_gelu}
            if compiled is not None:
                impls["torch.compile"] = compiled
            bench_ln_steady(rows, wl, x, w, b, dy, impls, fwd_floor, fb_floor, steady)
        config = getattr(tri._layer_norm_gelu_fwd_tuned, "best_config", None)
        print(f"{wl}: autotuned forward config {config}")
        launches[wl] = {"fwd_config": str(config)}
        if wl == "L2":  # the same launches for L1 and L3 (one profiler session each costs ~0.5 s)
            launches[wl].update(
                count_launches(
                    wl,
                    {
                        "fwd": lambda: pcops_ln_gelu(x, w, b),
                        "fwd+bwd": fwd_bwd(pcops_ln_gelu),
                        "fwd+bwd, accumulate": fwd_bwd(pcops_ln_gelu, accumulate=True),
                    },
                )
            )
        elif wl == "L1":  # the kernel's own time: the [graph] row of a ≈ 7 µs kernel is mostly replay overhead
            launches[wl].update(count_launches(wl, {"fwd": lambda: pcops_ln_gelu(x, w, b)}))


def main():
    import argparse
    import sys

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline (saves its warm-up)")
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__)
    rep = 50 if args.quick else 100
    rows, launches, steady = [], {}, {}
    t0 = time.perf_counter()
    bench_layer_norm(rows, rep, compile_baseline=not known.no_compile, launches=launches, steady=steady)
    notes = {
        "bandwidth_for_floor": BANDWIDTH,
        "goals_ms": {"L2 fwd": 0.045, "L2 fwd+bwd": 0.12, "L1 fwd": 0.012},
        "wall_s": {"L1-L3 (incl. autotune, torch.compile)": time.perf_counter() - t0},
        "timing": "eager rows include host launch cost; [graph] rows are CUDA-graph replays of the same call",
        "fwd+bwd": "leaves' .grad reset to None before each call (zero_grad(set_to_none=True)); "
        "'accumulate' rows keep them (autograd adds dx into x.grad)",
        "launches_per_call": launches,
        "steady_state": {
            "what": "'[graph xK steady]' rows: K calls back to back in ONE CUDA graph, each on its own copy of "
            "the inputs (x; dy and the leaves for fwd+bwd; weight/bias shared in fwd), K the smallest "
            "count >= %d (<= %d) whose K calls touch >= %dx the L2 (inputs + outputs); median/min/max "
            "are one replay / K; back_to_back_ms: %d replays queued between two events, per call"
            % (STEADY_MIN_K, STEADY_MAX_K, STEADY_L2_FACTOR, STEADY_REP),
            **steady,
        },
    }
    report(rows, "layer_norm_gelu", args.out, notes=notes)


if __name__ == "__main__":
    main()
