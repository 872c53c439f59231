"""Q1: CSR sparse softmax (WORKLOADS.md), forward and forward+backward.

120,000 CSR rows, lengths ``torch.randint(1, 65, (120000,))`` after ``torch.manual_seed(0)``,
N(0, 1) float32 values, int64 crow (torch's CSR default). Baselines, same run: a plain-torch
segment softmax (``scatter_reduce`` amax + exp + ``index_add``, the row index of every entry
precomputed, as graph libraries keep it) and ``torch.sparse.softmax`` on the equivalent COO
tensor. pcops: ``backend="triton"`` and ``backend="cuda"`` (CUDA C++, NVRTC); for CUDA C++ also
each group shape of ``pcops.cuda.sparse_softmax.VARIANTS`` (kernels called directly; ``(auto)``
marks the one the op picks for Q1), and Triton grouped rows with the group width the op does not
pick (``--csr-sub``, default 16). fwd+bwd rows reset the grads to None before each call;
``launches per call``: GPU kernels of one eager fwd+bwd call (torch profiler). Eager, [graph]
and [graph xK steady] rows: see ``_fused_bench.py``.
"""

import time

import torch

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
from pcops.triton import sparse_softmax as tri

Q1_ROWS = 120000


def segment_softmax(values, row, rows):
    vmax = torch.full((rows,), float("-inf"), device=values.device, dtype=values.dtype)
    vmax = vmax.scatter_reduce(0, row, values, reduce="amax", include_self=True)
    e = (values - vmax.index_select(0, row)).exp()
    total = torch.zeros(rows, device=values.device, dtype=values.dtype).index_add_(0, row, e)
    return e / total.index_select(0, row)


def bench_q1_steady(rows, values, crow, row_ids, dy, fwd_floor, fb_floor, notes):
    """Steady-state rows of Q1: segment softmax (baseline), pcops triton, pcops cuda, fwd and
    fwd+bwd (``grad_step``), each call on its own copy of values, crow and row ids (and dy);
    fills ``notes["Q1"]``."""
    wl = "Q1"
    nnz = values.numel()
    crow_bytes = crow.numel() * crow.element_size()
    fwd_bytes = 2 * nnz * values.element_size() + crow_bytes  # values read, y written, crow read
    fb_bytes = 4 * nnz * values.element_size() + crow_bytes  # + dy read, dvalues written
    l2 = l2_bytes()
    k = steady_k(fwd_bytes, l2)
    info = steady_plan(wl, k, l2, fwd_bytes, fb_bytes)
    impls = {  # f(values, crow, row_ids), the order and names of the Q1 fwd+bwd rows
        "torch segment softmax": lambda v, c, r: segment_softmax(v, r, Q1_ROWS),
        "pcops triton": lambda v, c, r: pcops.sparse_softmax(v, c, backend="triton"),
        "pcops cuda": lambda v, c, r: pcops.sparse_softmax(v, c, backend="cuda"),
    }
    structure = [(crow.clone(), row_ids.clone()) for _ in range(k)]
    vs = [values.clone() for _ in range(k)]
    steady_rows(
        rows,
        wl,
        "(fwd)",
        k,
        impls,
        lambda f: [lambda v=v, s=s: f(v, *s) for v, s in zip(vs, structure)],
        fwd_floor,
        Q1_ROWS,
        info,
    )
    vrs = [values.clone().requires_grad_(True) for _ in range(k)]
    dys = [dy.clone() for _ in range(k)]
    steady_rows(
        rows,
        wl,
        "(fwd+bwd)",
        k,
        impls,
        lambda f: [grad_step(lambda v=v, s=s: f(v, *s), (v,), d) for v, s, d in zip(vrs, structure, dys)],
        fb_floor,
        Q1_ROWS,
        info,
    )
    notes[wl] = info


def bench_sparse_softmax(rows, rep, launches, csr_subs=(16,), steady=None):
    torch.manual_seed(0)
    lengths = torch.randint(1, 65, (Q1_ROWS,))
    crow = torch.zeros(Q1_ROWS + 1, dtype=torch.int64)
    crow[1:] = lengths.cumsum(0)
    nnz = int(crow[-1])
    values = torch.randn(nnz).cuda()
    crow = crow.cuda()
    row_ids = torch.repeat_interleave(torch.arange(Q1_ROWS, device="cuda"), lengths.cuda())
    cols = torch.arange(nnz, device="cuda") - crow[row_ids]
    coo = torch.sparse_coo_tensor(
        torch.stack([row_ids, cols]), values, (Q1_ROWS, 64), check_invariants=False
    ).coalesce()
    fwd_floor = (2 * nnz * 4 + crow.numel() * 8) / BANDWIDTH * 1e3
    fb_floor = fwd_floor + (3 * nnz * 4 + crow.numel() * 8) / BANDWIDTH * 1e3
    for backend in ("triton", "cuda"):
        err = (
            (pcops.sparse_softmax(values, crow, backend=backend) - segment_softmax(values, row_ids, Q1_ROWS))
            .abs()
            .max()
            .item()
        )
        print(f"Q1 {backend}: max |pcops - segment softmax| = {err:.3g}")
    wl = "Q1"
    fwd = {
        "torch segment softmax": lambda: segment_softmax(values, row_ids, Q1_ROWS),
        "torch.sparse.softmax (COO)": lambda: torch.sparse.softmax(coo, 1),
        "pcops triton": lambda: pcops.sparse_softmax(values, crow, backend="triton"),
        "pcops cuda": lambda: pcops.sparse_softmax(values, crow, backend="cuda"),
    }
    base = None
    for impl, fn in fwd.items():
        # torch.sparse.softmax on COO is timed eagerly only (it is not meant for graph capture)
        t = timed_pair(rows, wl, impl + " (fwd)", fn, rep, fwd_floor, Q1_ROWS, base, graph="COO" not in impl)
        base = base or t
    fwd_base = base or {}
    vr = values.clone().requires_grad_(True)
    dy = torch.randn(nnz, device="cuda")

    def fwd_bwd(f, accumulate=False):
        return grad_step(f, (vr,), dy, accumulate)

    fb = {
        "torch segment softmax": fwd_bwd(lambda: segment_softmax(vr, row_ids, Q1_ROWS)),
        "pcops triton": fwd_bwd(lambda: pcops.sparse_softmax(vr, crow, backend="triton")),
        "pcops cuda": fwd_bwd(lambda: pcops.sparse_softmax(vr, crow, backend="cuda")),
    }
    base = None
    for impl, fn in fb.items():
        t = timed_pair(rows, wl, impl + " (fwd+bwd)", fn, rep, fb_floor, Q1_ROWS, base)
        base = base or t
    graph_row(
        rows,
        wl,
        "pcops triton (fwd+bwd, accumulate)",
        fwd_bwd(lambda: pcops.sparse_softmax(vr, crow, backend="triton"), accumulate=True),
        rep,
        fb_floor,
        Q1_ROWS,
        (base or {}).get(True),
    )
    if steady is not None:
        bench_q1_steady(rows, values, crow, row_ids, dy, fwd_floor, fb_floor, steady)
    # Triton grouped rows with the group width the op does not pick (--csr-sub), then the CUDA C++
    # group shapes (pcops.cuda.sparse_softmax.VARIANTS); kernels called directly
    auto_sub = tri._group_shape(Q1_ROWS, nnz)[0]
    for sub in [s for s in csr_subs if s != auto_sub]:
        vpt = 4 if sub == 32 else 8
        kw = dict(sub=sub, vpt=vpt)
        err = (tri.sparse_softmax(values, crow, **kw) - segment_softmax(values, row_ids, Q1_ROWS)).abs().max().item()
        print(f"Q1 triton grouped sub={sub}: max |pcops - segment softmax| = {err:.3g}")
        graph_row(
            rows,
            wl,
            f"pcops triton grouped sub={sub} (fwd)",
            lambda kw=kw: tri.sparse_softmax(values, crow, **kw),
            rep,
            fwd_floor,
            Q1_ROWS,
            fwd_base.get(True),
        )
        graph_row(
            rows,
            wl,
            f"pcops triton grouped sub={sub} (fwd+bwd kernels)",
            lambda kw=kw: tri.sparse_softmax_backward(dy, tri.sparse_softmax(values, crow, **kw), crow, **kw),
            rep,
            fb_floor,
            Q1_ROWS,
            (base or {}).get(True),
        )
    graph_row(
        rows,
        wl,
        f"pcops triton grouped sub={auto_sub} (default) (fwd+bwd kernels)",
        lambda: tri.sparse_softmax_backward(dy, tri.sparse_softmax(values, crow), crow),
        rep,
        fb_floor,
        Q1_ROWS,
        (base or {}).get(True),
    )
    from pcops.cuda import sparse_softmax as cu

    auto = cu.choose_variant(Q1_ROWS, nnz)
    for v in cu.VARIANTS:
        name = f"pcops cuda {v}{' (auto)' if v == auto else ''}"
        err = (
            (cu.sparse_softmax(values, crow, variant=v) - segment_softmax(values, row_ids, Q1_ROWS)).abs().max().item()
        )
        print(f"Q1 cuda {v}: max |pcops - segment softmax| = {err:.3g}")
        graph_row(
            rows,
            wl,
            f"{name} (fwd)",
            lambda v=v: cu.sparse_softmax(values, crow, variant=v),
            rep,
            fwd_floor,
            Q1_ROWS,
            fwd_base.get(True),
        )
        graph_row(
            rows,
            wl,
            f"{name} (fwd+bwd kernels)",
            lambda v=v: cu.sparse_softmax_backward(dy, cu.sparse_softmax(values, crow, variant=v), crow, variant=v),
            rep,
            fb_floor,
            Q1_ROWS,
            (base or {}).get(True),
        )
    for backend in ("triton", "cuda"):
        launches[f"Q1 {backend}"] = count_launches(
            f"Q1 {backend}", {"fwd+bwd": fwd_bwd(lambda: pcops.sparse_softmax(vr, crow, backend=backend))}
        )


def main():
    import argparse
    import sys

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument(
        "--csr-sub",
        default="16",
        help="Triton grouped CSR softmax group widths to time besides the automatic one "
        "(comma-separated of 4, 8, 16, 32; '' for none)",
    )
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__)
    rep = 50 if args.quick else 100
    rows, launches, steady = [], {}, {}
    t0 = time.perf_counter()
    bench_sparse_softmax(rows, rep, launches, tuple(int(v) for v in known.csr_sub.split(",") if v), steady=steady)
    notes = {
        "bandwidth_for_floor": BANDWIDTH,
        "goals_ms": {"Q1 fwd": 0.03, "Q1 fwd+bwd": 0.07},
        "wall_s": {"Q1 (incl. autotune, NVRTC)": time.perf_counter() - t0},
        "timing": "eager rows include host launch cost; [graph] rows are CUDA-graph replays of the same call",
        "launches_per_call": launches,
        "steady_state": {
            "what": "'[graph xK steady]' rows: K calls back to back in ONE CUDA graph, each on its own copy of "
            "values + crow + row ids (and dy), K the smallest count >= %d (<= %d) whose K calls touch "
            ">= %dx the L2; median/min/max are one replay / K; back_to_back_ms: %d replays queued "
            "between two events, per call" % (STEADY_MIN_K, STEADY_MAX_K, STEADY_L2_FACTOR, STEADY_REP),
            **steady,
        },
    }
    report(rows, "sparse_softmax", args.out, notes=notes)


if __name__ == "__main__":
    main()
