"""L1-L3: fused LayerNorm+GELU; Q1: CSR sparse softmax (WORKLOADS.md), forward and forward+backward.

L1 4,096 × 768 float32, L2 131,072 × 256 bfloat16, L3 131,072 × 64 float32 (eps 1e-5, tanh
GELU). Baselines, same run: eager ``F.gelu(F.layer_norm(...), approximate="tanh")`` and its
``torch.compile``d version. Q1: 120,000 CSR rows, lengths ``torch.randint(1, 65, (120000,))``
after ``torch.manual_seed(0)``, N(0, 1) float32 values, int64 crow (torch's CSR default).
Baselines: a plain-torch segment softmax (``scatter_reduce`` amax + exp + ``index_add``, the
row index of every entry precomputed, as graph libraries keep it) and ``torch.sparse.softmax``
on the equivalent COO tensor. pcops: Triton and CUDA C++ (NVRTC) both; for CUDA C++ also each
group shape of ``pcops.cuda.sparse_softmax.VARIANTS`` (kernels called directly; ``(auto)``
marks the one the op picks for Q1), and Triton grouped rows with the group width the op does
not pick (``--csr-sub``, default 16; the "tile" layout measured 0.037 / 0.069 ms on the H200).

fwd+bwd rows: ``y = f(x, w, b); y.backward(dy)`` with the leaves' ``.grad`` reset to None
before each call (what ``optimizer.zero_grad()`` does by default since torch 2.0), so autograd
hands the backward's gradient tensors over instead of adding them into existing ones; every
implementation is timed the same way. ``(fwd+bwd, accumulate)``: pcops with the grads kept
across calls (autograd then adds dx into x.grad: one more elementwise kernel moving
``3·M·N·size`` bytes, 0.048 ms on L2 — the gap between fwd + bwd kernel and fwd+bwd measured
before). ``launches per call`` (printed, and in the notes): GPU kernels one eager call runs
(torch profiler): pcops L2 fwd, fwd+bwd and fwd+bwd with accumulation, Q1 fwd+bwd.

Backward variants (``pcops.triton.fused.BWD_VARIANTS``; the default is "tiled"): for each of
L1-L3, graph-captured rows ``pcops triton bwd=<variant> (fwd+bwd)`` (the public op and
autograd, the variant selected with the module-level ``BWD_VARIANT``) and ``(bwd kernel)`` rows
timing the backward op alone (``torch.ops.pcops.layer_norm_gelu_backward``: backward kernel +
column sum; floor: x, dy read, dx written) for the default and each variant; the notes record
each variant's max |gradient − default's| (dx, dweight, dbias), its grid, the autotuned forward
config and the per-kernel GPU time of L2 fwd+bwd (torch profiler). ``--bwd-variants a,b``
picks the variants (default: on L2 only, "tiled-exact" (the exact GELU derivative) and the
pipelined "tiled-async4", "tiled-async6", "tiled-async4-16"; the hardware-tanh and
16-bit-only ones never on float32 rows;
``all``; ``rowrange``: the row-range kernel, 0.34 ms on L2, autotuned on first use;
``none``: skip). On L2 each variant's backward + column-sum kernel
times come from the torch profiler too (``bwd_gpu_us``; the graph rows include a launch).

Forward variants (``--fwd-variants default|all|none``): graph rows ``pcops triton fwd=<name>
(fwd)`` with max |y − default|, |mean|, |rstd| printed and in the notes (``fwd_variants``):
``FWD_SWEEP`` per workload — entries of ``pcops.triton.fused.FWD_VARIANTS`` (persistent grid,
x loads pipelined through shared memory), ``wb-tile`` (weight/bias loaded in the tile layout),
on 16-bit rows ``exact-tanh`` (the exp2 GELU instead of the default ``tanh.approx``; the flag
rows at the autotuned config, fixed); ``all``: every entry everywhere; for L1 and L2
every tile config of the autotuner's pruned space at a fixed launch (``cfg
BLOCK_MxTILESxwarps``: which config is fastest in graph replays, against the one the
autotuner took, printed as ``autotuned forward config`` with the autotuner's own timings); on
L2 the profiler's kernel time of each ``FWD_VARIANTS`` entry (``gpu_us``).

Each figure is timed twice: eager calls (the host launch cost included: one Python call, its
checks and the custom-op dispatch) and replays of a CUDA graph of the same call (the GPU time a
captured pipeline sees). Neither flushes the L2 cache nor rotates inputs: every row replays the
same tensors (L1's 25 MB of x and y stay in the 50 MB L2). A [graph] row is one replay between
two events and a synchronisation, so for a kernel of a few µs it is mostly launch overhead,
which differs between runs for every implementation alike (L1 torch.compile [graph]: 0.016 ms
in one H200 run, 0.027 in another); the L1 forward kernel's own time is printed from the
profiler (``L1 fwd: ... GPU µs``), the autotuner's back-to-back graph timing with the configs. ``floor`` = bytes that must move (inputs once, outputs once) / 4.3 TB/s;
``of_floor`` = floor / median.

Steady-state rows ``<impl> (fwd) [graph xK steady]`` and ``<impl> (fwd+bwd) [graph xK steady]``
(``common.bench_steady``): the per-call GPU time of the op when K calls run back to back in ONE
CUDA graph, i.e. what a captured model pays per call (kernels + ≈ 1 µs per graph node, the
replay's launch latency spread over K calls). The inputs rotate so that no call is served by the
L2 cache: call i works on its own copy i of x (L1-L3; of dy and the x/weight/bias leaves for
fwd+bwd; weight/bias shared in fwd) or of values, crow and the row ids (Q1; and dy), K the smallest
count whose K calls touch (inputs + outputs) at least ``STEADY_L2_FACTOR`` (3) times the L2 (50 MB on
the H200), at least ``STEADY_MIN_K`` (8: the ≈ 10-20 µs replay latency / 8 per call) and at most
``STEADY_MAX_K`` (32); K and the working sets are printed and in the notes (``steady_state``),
with each row's one-replay time and the per-call time of ``STEADY_REP`` replays queued back to
back (launch latency hidden). Rows for L1-L3: torch eager, pcops triton (the public op),
torch.compile (the function the other rows compiled); Q1: torch segment softmax, pcops triton,
pcops cuda (``pcops.sparse_softmax(backend=...)``). fwd+bwd calls are those of the other fwd+bwd
rows (``grad_step``: grads reset to None, ``y.backward(dy)``). Ratios: baseline (torch eager,
segment softmax) steady / this steady; floors per call as the other rows.
"""
import time

import torch
import torch.nn.functional as F

from common import bench, bench_steady, gpu_activities, parse_args, report, row

import pcops
from pcops.triton import fused as tri

BANDWIDTH = 4.3e12  # bytes/s, the measured H200 copy bandwidth of WORKLOADS.md
LN_WORKLOADS = [("L1", 4096, 768, torch.float32), ("L2", 131072, 256, torch.bfloat16), ("L3", 131072, 64, torch.float32)]
Q1_ROWS = 120000
# steady-state rows ([graph xK steady]): K calls on K rotating input copies in one CUDA graph,
# K the smallest count whose working set (inputs + outputs of the K calls) is STEADY_L2_FACTOR
# times the L2 cache, at least STEADY_MIN_K (spreads the replay's launch latency, ≈ 10-20 µs,
# over that many calls), at most STEADY_MAX_K
STEADY_L2_FACTOR = 3
STEADY_MIN_K = 8
STEADY_MAX_K = 32
STEADY_REP = 50


def torch_ln_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), approximate="tanh")


def pcops_ln_gelu(x, w, b):
    return pcops.fused_layer_norm_gelu(x, w, b, 1e-5, "tanh")


def segment_softmax(values, row, rows):
    vmax = torch.full((rows,), float("-inf"), device=values.device, dtype=values.dtype)
    vmax = vmax.scatter_reduce(0, row, values, reduce="amax", include_self=True)
    e = (values - vmax.index_select(0, row)).exp()
    total = torch.zeros(rows, device=values.device, dtype=values.dtype).index_add_(0, row, e)
    return e / total.index_select(0, row)


def timed_pair(rows, wl, impl, fn, rep, floor_ms, items, baseline=None, graph=True):
    """Eager and (with ``graph``) CUDA-graph timings of ``fn``: ``{False: eager, True: graph}``.

    Ratios are to ``baseline`` (the first implementation of the workload) in the same mode.
    """
    out = {}
    for mode in (False, True) if graph else (False,):
        try:
            t = bench(fn, rep=rep, graph=mode)
        except Exception as e:  # reported, not fatal
            print(f"{wl} {impl} graph={mode}: {type(e).__name__}: {e}")
            continue
        base = (baseline or {}).get(mode, t)
        rows.append(row(wl, impl + (" [graph]" if mode else ""), t, items=items, unit="rows/s", baseline=base,
                        floor_ms=floor_ms, of_floor=floor_ms / t["median_ms"]))
        out[mode] = t
    return out


def count_launches(wl, fns):
    """GPU kernels per eager call of each ``fns`` entry (torch profiler, 3 calls); printed."""
    out = {}
    for name, fn in fns.items():
        act = gpu_activities(fn, iters=3)
        out[name] = {"launches": act.get("kernels"), "copies": act.get("copies"), "gpu_us": act.get("gpu_us"),
                     "per_call_us": act.get("per_call_us"), **({"error": act["error"]} if "error" in act else {})}
        print(f"{wl} {name}: {act.get('kernels')} launches per call ({act.get('copies')} copies), "
              f"GPU {act.get('gpu_us', float('nan')):.1f} µs")
    return out


def grad_step(fn, leaves, dy, accumulate=False):
    """One fwd+bwd call: ``fn().backward(dy)``, the ``leaves``' ``.grad`` reset to None first
    unless ``accumulate`` (``optimizer.zero_grad(set_to_none=True)``); every fwd+bwd row uses it."""

    def run():
        if not accumulate:
            for t in leaves:
                t.grad = None
        fn().backward(dy)

    return run


def l2_bytes():
    """The GPU's L2 cache in bytes (50 MB on the H200; 50 MiB when the property is missing)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def steady_k(bytes_per_call, l2):
    """Calls per graph of the steady rows: the smallest K with K · bytes_per_call ≥
    STEADY_L2_FACTOR · l2, clamped to [STEADY_MIN_K, STEADY_MAX_K]."""
    k = -(-STEADY_L2_FACTOR * l2 // max(1, bytes_per_call))  # ceiling division
    return int(min(STEADY_MAX_K, max(STEADY_MIN_K, k)))


def steady_plan(wl, k, l2, fwd_bytes, fb_bytes):
    """Prints and returns K and the working sets of one workload's steady rows."""
    info = {"K": k, "l2_bytes": l2, "fwd_bytes_per_call": fwd_bytes, "fwd+bwd_bytes_per_call": fb_bytes,
            "fwd_working_set_MB": k * fwd_bytes / 1e6, "fwd+bwd_working_set_MB": k * fb_bytes / 1e6}
    print(f"{wl}: steady rows: K = {k} calls per graph on {k} input copies; working set (inputs + outputs) "
          f"fwd {k * fwd_bytes / 1e6:.0f} MB, fwd+bwd {k * fb_bytes / 1e6:.0f} MB "
          f"({k * fwd_bytes / l2:.1f}x / {k * fb_bytes / l2:.1f}x the {l2 / 1e6:.0f} MB L2)")
    if k * fwd_bytes < STEADY_L2_FACTOR * l2:
        print(f"{wl}: steady rows: working set below {STEADY_L2_FACTOR}x L2 at K = STEADY_MAX_K "
              f"(inputs partly served from L2)")
    return info


def steady_rows(rows, wl, label, k, impls, make_fns, floor_ms, items, info):
    """Rows ``<impl> <label> [graph x<k> steady]``: ``bench_steady(make_fns(f))`` for each
    ``impls`` entry (name -> op function), ``make_fns`` giving the K callables on the K input
    copies; ratios to the first implementation that ran (the baseline, same K and rotation)."""
    t0 = time.perf_counter()
    base = None
    for impl, f in impls.items():
        name = f"{impl} {label} [graph x{k} steady]"
        try:
            t = bench_steady(make_fns(f), rep=STEADY_REP)
        except Exception as e:  # reported, not fatal
            print(f"{wl} {name}: {type(e).__name__}: {e}")
            continue
        base = base or t
        rows.append(row(wl, name, t, items=items, unit="rows/s", baseline=base, floor_ms=floor_ms,
                        of_floor=floor_ms / t["median_ms"]))
        print(f"{wl} {name}: {t['median_ms']:.4f} ms per call (one replay of {k} calls {t['graph_ms_median']:.4f} ms; "
              f"{STEADY_REP} replays back to back {t['back_to_back_ms']:.4f} ms per call)")
        info[f"{impl} {label}"] = {"ms_per_call": t["median_ms"], "graph_ms_median": t["graph_ms_median"],
                                   "back_to_back_ms_per_call": t["back_to_back_ms"]}
    info["wall_s"] = info.get("wall_s", 0.0) + time.perf_counter() - t0


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
    del xs
    leaves = [tuple(t.clone().requires_grad_(True) for t in (x, w, b)) for _ in range(k)]
    dys = [dy.clone() for _ in range(k)]
    steady_rows(rows, wl, "(fwd+bwd)", k, impls,
                lambda f: [grad_step(lambda lv=lv: f(*lv), lv, d) for lv, d in zip(leaves, dys)], fb_floor, m, info)
    notes[wl] = info


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
    steady_rows(rows, wl, "(fwd)", k, impls, lambda f: [lambda v=v, s=s: f(v, *s) for v, s in zip(vs, structure)],
                fwd_floor, Q1_ROWS, info)
    vrs = [values.clone().requires_grad_(True) for _ in range(k)]
    dys = [dy.clone() for _ in range(k)]
    steady_rows(rows, wl, "(fwd+bwd)", k, impls,
                lambda f: [grad_step(lambda v=v, s=s: f(v, *s), (v,), d) for v, s, d in zip(vrs, structure, dys)],
                fb_floor, Q1_ROWS, info)
    notes[wl] = info


# the default backward sweep (each variant one compilation on a host that compiles slowly): L2
# only (L1 and L3 have no backward goals), without the old prefetch variants (three H200 runs,
# never ahead of "tiled") and "tiled-async3" (between "tiled" and "tiled-async4")
# ("tiled-fast" and "tiled-async4-fast" are "tiled" and "tiled-async4" on bfloat16 rows)
_NOT_IN_DEFAULT = ("tiled-noprefetch", "tiled-pf2", "tiled-async3", "tiled-fast", "tiled-async4-fast")
_L1_L3_DEFAULT = ()


def _same_as_another(variant, dtype, wl, sweep_default):
    """Whether a backward variant is left out on this workload: on float32 rows the hardware-tanh
    and 16-values-per-16-bit-thread variants compile to another variant's kernel; the default
    sweep keeps compilations few (see above)."""
    cfg = tri.BWD_VARIANTS.get(variant, {})
    if dtype == torch.float32 and (cfg.get("fast_tanh") or "per_thread16" in cfg):
        return True
    if sweep_default:
        return variant in _NOT_IN_DEFAULT or (wl != "L2" and variant not in _L1_L3_DEFAULT)
    return False


def bench_layer_norm(rows, rep, compile_baseline, launches, variants=(), variant_notes=None, fwd_notes=None,
                     sweep_default=False, fwd_everything=False, steady=None):
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
        fwd_graph_base = None
        for impl, fn in fwd.items():
            t = timed_pair(rows, wl, impl + " (fwd)", fn, rep, fwd_floor, m, base)
            base = base or t
            if impl == "pcops triton":
                fwd_graph_base = t.get(True)
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
        graph_row(rows, wl, "pcops triton (fwd+bwd, accumulate)", fwd_bwd(pcops_ln_gelu, accumulate=True), rep,
                  fb_floor, m, (base or {}).get(True))
        if steady is not None:  # the same implementations (torch.compile: the function compiled above)
            impls = {"torch eager": torch_ln_gelu, "pcops triton": pcops_ln_gelu}
            if compiled is not None:
                impls["torch.compile"] = compiled
            bench_ln_steady(rows, wl, x, w, b, dy, impls, fwd_floor, fb_floor, steady)
        config = getattr(tri._layer_norm_gelu_fwd_tuned, "best_config", None)
        print(f"{wl}: autotuned forward config {config}")
        launches[wl] = {"fwd_config": str(config)}
        if wl == "L2":  # the same launches for L1 and L3 (one profiler session each costs ~0.5 s)
            launches[wl].update(count_launches(wl, {
                "fwd": lambda: pcops_ln_gelu(x, w, b), "fwd+bwd": fwd_bwd(pcops_ln_gelu),
                "fwd+bwd, accumulate": fwd_bwd(pcops_ln_gelu, accumulate=True)}))
        elif wl == "L1":  # the kernel's own time: the [graph] row of a ≈ 7 µs kernel is mostly replay overhead
            launches[wl].update(count_launches(wl, {"fwd": lambda: pcops_ln_gelu(x, w, b)}))
        if fwd_notes is not None:
            bench_fwd_variants(rows, rep, wl, x, w, b, fwd_graph_base, fwd_notes, everything=fwd_everything)
        if variants or variant_notes is not None:
            wl_variants = [v for v in variants if not _same_as_another(v, dtype, wl, sweep_default)]
            bench_bwd_variants(rows, rep, wl, x, w, b, dy, (base or {}).get(True), wl_variants,
                               variant_notes if variant_notes is not None else {})


# the default forward sweep per workload (each entry one compilation on a host that compiles
# slowly; ``--fwd-variants all``: every FWD_VARIANTS entry and flag row on every workload)
FWD_SWEEP = {
    "L1": ("persistent-s3", "wb-tile"),
    "L2": ("persistent-s3", "persistent-s4", "wb-tile", "exact-tanh"),
}
FWD_CONFIG_SWEEP = ("L1", "L2")  # every tile config of the autotuner's pruned space, fixed (no compilation)


def bench_fwd_variants(rows, rep, wl, x, w, b, fwd_base, notes, everything=False):
    """The forward variants on one workload, graph-captured, against the default (the autotuned
    tile kernel with the hardware tanh for 16-bit rows): ``FWD_VARIANTS``, the exact tanh and
    the weight/bias tile loads (16-bit rows), and for L1/L2 every tile config the autotuner
    chooses from (``fwd cfg BLOCK_MxTILESxwarps``), each with max |y - default|, |mean|, |rstd|."""
    m, n = x.shape
    size = x.element_size()
    floor = 2 * m * n * size / BANDWIDTH * 1e3
    ref_y, ref_mean, ref_rstd = (t.float() for t in tri.layer_norm_gelu(x, w, b, 1e-5, "tanh"))
    best = getattr(tri._layer_norm_gelu_fwd_tuned, "best_config", None)  # this workload's, just used
    info = {"default": dict(tri._FWD_LAST), "autotuned_config": str(best)}
    # the flag rows run the autotuned config at a fixed launch (one compilation each, no re-tuning)
    fixed = {} if best is None else dict(block_m=best.kwargs["BLOCK_M"], tiles=best.kwargs["TILES"],
                                         num_warps=best.num_warps)

    def check(name, fn):
        y, mean, rstd = fn()
        plan = dict(tri._FWD_LAST)
        diff = {"y": (y.float() - ref_y).abs().max().item(), "mean": (mean - ref_mean).abs().max().item(),
                "rstd": (rstd - ref_rstd).abs().max().item()}
        print(f"{wl} fwd={name}: max |out - default| {diff}; launch {plan}")
        t = graph_row(rows, wl, f"pcops triton fwd={name} (fwd)", fn, rep, floor, m, fwd_base)
        info[name] = {"max_abs_diff_vs_default": diff, "launch": plan, "graph_ms": t and t["median_ms"]}
        if wl == "L2" and name in tri.FWD_VARIANTS:  # the kernel's own GPU time (graph rows include a launch)
            act = gpu_activities(fn, iters=3)
            info[name]["gpu_us"] = act.get("gpu_us")
            print(f"{wl} fwd={name}: GPU {act.get('gpu_us', float('nan')):.1f} µs per call")

    sweep = FWD_SWEEP.get(wl, ()) if not everything else (*tri.FWD_VARIANTS, "wb-tile", "exact-tanh",
                                                            "persistent-s3 exact-tanh")
    half = x.element_size() == 2
    try:
        for v in sweep:
            if v in tri.FWD_VARIANTS:
                check(v, lambda v=v: tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant=v))
            elif v == "wb-tile":
                check(v, lambda: tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", wb_tile=True, **fixed))
            elif v == "exact-tanh" and half:
                check(v, lambda: tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", fast_tanh=False, **fixed))
            elif v == "persistent-s3 exact-tanh" and half:
                check(v, lambda: tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant="persistent-s3", fast_tanh=False))
        if wl in FWD_CONFIG_SWEEP:
            block_n, one_tile = tri._row_block_n(n, None)
            space = tri._prune_fwd(tri._FWD_CONFIGS, {"M": m}, BLOCK_N=block_n, ONE_TILE=one_tile,
                                   M_CLASS=tri._m_class(m))
            for c in space:
                bm, t, nw = c.kwargs["BLOCK_M"], c.kwargs["TILES"], c.num_warps
                check(f"cfg {bm}x{t}x{nw}", lambda bm=bm, t=t, nw=nw: tri.layer_norm_gelu(
                    x, w, b, 1e-5, "tanh", block_m=bm, tiles=t, num_warps=nw))
    except Exception as e:  # reported, not fatal
        print(f"{wl} forward variants: {type(e).__name__}: {e}")
    notes[wl] = info


def graph_row(rows, wl, impl, fn, rep, floor_ms, items, baseline=None):
    """A CUDA-graph-only timing row (``baseline``: a graph timing of the same workload)."""
    try:
        t = bench(fn, rep=rep, graph=True)
    except Exception as e:  # reported, not fatal
        print(f"{wl} {impl}: {type(e).__name__}: {e}")
        return None
    rows.append(row(wl, impl + " [graph]", t, items=items, unit="rows/s", baseline=baseline,
                    floor_ms=floor_ms, of_floor=floor_ms / t["median_ms"]))
    return t


def bench_bwd_variants(rows, rep, wl, x, w, b, dy, fb_base, variants, notes):
    """The backward variants on one workload (graph-captured) against the default; fills ``notes[wl]``."""
    m, n = x.shape
    size = x.element_size()
    fb_floor = 5 * m * n * size / BANDWIDTH * 1e3
    bwd_floor = 3 * m * n * size / BANDWIDTH * 1e3
    _, mean, rstd = torch.ops.pcops.layer_norm_gelu(x, w, b, 1e-5, "tanh", 0.0, None)
    default = tri.BWD_VARIANT

    def bwd_op():
        return torch.ops.pcops.layer_norm_gelu_backward(dy, x, w, b, mean, rstd, "tanh", 0.0, None)

    def grads():
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        pcops_ln_gelu(*leaves).backward(dy)
        return [t.grad.float() for t in leaves]

    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))

    def fwd_bwd():
        xr.grad = wr.grad = br.grad = None
        pcops_ln_gelu(xr, wr, br).backward(dy)

    info = {"default": default}
    bwd_base = None
    try:
        tri._TILED_LAST.clear()
        reference = grads()
        info["default_launch"] = dict(tri._TILED_LAST)
        bwd_base = graph_row(rows, wl, f"pcops triton bwd={default} (default) (bwd kernel)", bwd_op, rep, bwd_floor, m)
        if wl == "L2":
            act = gpu_activities(bwd_op, iters=3)
            info["default_bwd_gpu_us"] = act.get("per_call_us")
            print(f"{wl} bwd={default}: GPU {act.get('gpu_us', float('nan')):.1f} µs per call "
                  f"{act.get('per_call_us')}")
        for name in variants:
            tri.BWD_VARIANT = name
            tri._TILED_LAST.clear()
            got = grads()
            diff = {k: (a - d).abs().max().item() for k, a, d in zip(("dx", "dweight", "dbias"), got, reference)}
            scale = {k: d.abs().max().item() for k, d in zip(("dx", "dweight", "dbias"), reference)}
            plan = dict(tri._TILED_LAST)  # BLOCK_M, num_warps, programs of the launch grads() made
            info[name] = {"max_abs_diff_vs_default": diff, "max_abs_default": scale, **plan}
            print(f"{wl} bwd={name}: max |grad - default| {diff}; launch {plan}")
            fb = graph_row(rows, wl, f"pcops triton bwd={name} (fwd+bwd)", fwd_bwd, rep, fb_floor, m, fb_base)
            bw = graph_row(rows, wl, f"pcops triton bwd={name} (bwd kernel)", bwd_op, rep, bwd_floor, m, bwd_base)
            info[name]["fwd+bwd_graph_ms"] = fb and fb["median_ms"]
            info[name]["bwd_graph_ms"] = bw and bw["median_ms"]
            if wl == "L2":  # the kernels' own GPU time (backward + column sum)
                act = gpu_activities(bwd_op, iters=3)
                info[name]["bwd_gpu_us"] = act.get("per_call_us")
                print(f"{wl} bwd={name}: GPU {act.get('gpu_us', float('nan')):.1f} µs per call "
                      f"{act.get('per_call_us')}")
        if wl == "L2":  # where the GPU time of fwd+bwd goes
            tri.BWD_VARIANT = default
            info[f"profile_fwd+bwd_{default}"] = gpu_activities(fwd_bwd)
    finally:
        tri.BWD_VARIANT = default
    info["default_bwd_graph_ms"] = bwd_base and bwd_base["median_ms"]
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
    coo = torch.sparse_coo_tensor(torch.stack([row_ids, cols]), values, (Q1_ROWS, 64), check_invariants=False).coalesce()
    fwd_floor = (2 * nnz * 4 + crow.numel() * 8) / BANDWIDTH * 1e3
    fb_floor = fwd_floor + (3 * nnz * 4 + crow.numel() * 8) / BANDWIDTH * 1e3
    for backend in ("triton", "cuda"):
        err = (pcops.sparse_softmax(values, crow, backend=backend) - segment_softmax(values, row_ids, Q1_ROWS)).abs().max().item()
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
    graph_row(rows, wl, "pcops triton (fwd+bwd, accumulate)",
              fwd_bwd(lambda: pcops.sparse_softmax(vr, crow, backend="triton"), accumulate=True), rep, fb_floor,
              Q1_ROWS, (base or {}).get(True))
    if steady is not None:
        bench_q1_steady(rows, values, crow, row_ids, dy, fwd_floor, fb_floor, steady)
    # Triton grouped rows with the group width the op does not pick (--csr-sub), then the CUDA C++
    # group shapes (pcops.cuda.sparse_softmax.VARIANTS); kernels called directly
    auto_sub = tri._group_shape(Q1_ROWS, nnz)[0]
    for sub in [s for s in csr_subs if s != auto_sub]:
        vpt = 4 if sub == 32 else 8
        kw = dict(layout="grouped", sub=sub, vpt=vpt)
        err = (tri.sparse_softmax(values, crow, **kw) - segment_softmax(values, row_ids, Q1_ROWS)).abs().max().item()
        print(f"Q1 triton grouped sub={sub}: max |pcops - segment softmax| = {err:.3g}")
        graph_row(rows, wl, f"pcops triton grouped sub={sub} (fwd)", lambda kw=kw: tri.sparse_softmax(values, crow, **kw),
                  rep, fwd_floor, Q1_ROWS, fwd_base.get(True))
        graph_row(rows, wl, f"pcops triton grouped sub={sub} (fwd+bwd kernels)",
                  lambda kw=kw: tri.sparse_softmax_backward(dy, tri.sparse_softmax(values, crow, **kw), crow, **kw),
                  rep, fb_floor, Q1_ROWS, (base or {}).get(True))
    graph_row(rows, wl, f"pcops triton {tri.CSR_LAYOUT} sub={auto_sub} (default) (fwd+bwd kernels)",
              lambda: tri.sparse_softmax_backward(dy, tri.sparse_softmax(values, crow), crow), rep, fb_floor, Q1_ROWS,
              (base or {}).get(True))
    from pcops.cuda import sparse_softmax as cu

    auto = cu.choose_variant(Q1_ROWS, nnz)
    for v in cu.VARIANTS:
        name = f"pcops cuda {v}{' (auto)' if v == auto else ''}"
        err = (cu.sparse_softmax(values, crow, variant=v) - segment_softmax(values, row_ids, Q1_ROWS)).abs().max().item()
        print(f"Q1 cuda {v}: max |pcops - segment softmax| = {err:.3g}")
        graph_row(rows, wl, f"{name} (fwd)", lambda v=v: cu.sparse_softmax(values, crow, variant=v), rep, fwd_floor,
                  Q1_ROWS, fwd_base.get(True))
        graph_row(rows, wl, f"{name} (fwd+bwd kernels)",
                  lambda v=v: cu.sparse_softmax_backward(dy, cu.sparse_softmax(values, crow, variant=v), crow, variant=v),
                  rep, fb_floor, Q1_ROWS, (base or {}).get(True))
    for backend in ("triton", "cuda"):
        launches[f"Q1 {backend}"] = count_launches(f"Q1 {backend}", {
            "fwd+bwd": fwd_bwd(lambda: pcops.sparse_softmax(vr, crow, backend=backend))})


def main():
    import argparse
    import sys

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline (saves its warm-up)")
    extra.add_argument("--bwd-variants", default="default",
                       help="LayerNorm+GELU backward variants to sweep: comma-separated names of "
                            "pcops.triton.fused.BWD_VARIANTS or 'rowrange', 'default' (on L2 only: tiled-exact, "
                            "tiled-async4, tiled-async6, tiled-async4-16), 'all' (every workload) or 'none'")
    extra.add_argument("--fwd-variants", default="default", choices=("default", "all", "none"),
                       help="LayerNorm+GELU forward sweep: 'default' (FWD_SWEEP per workload and every tile "
                            "config for L1/L2), 'all' (every FWD_VARIANTS entry and flag row everywhere), 'none'")
    extra.add_argument("--csr-sub", default="16",
                       help="Triton grouped CSR softmax group widths to time besides the automatic one "
                            "(comma-separated of 4, 8, 16, 32; '' for none)")
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__)
    rep = 50 if args.quick else 100
    rows = []
    t0 = time.perf_counter()
    launches = {}
    steady = {}
    bench_sparse_softmax(rows, rep, launches, tuple(int(v) for v in known.csr_sub.split(",") if v), steady=steady)
    t1 = time.perf_counter()
    known_variants = [*tri.BWD_VARIANTS, "rowrange"]
    if known.bwd_variants == "all":
        variants = [v for v in tri.BWD_VARIANTS if v != tri.BWD_VARIANT]
    elif known.bwd_variants == "default":
        variants = [v for v in tri.BWD_VARIANTS if v not in (tri.BWD_VARIANT, "tiled-plain")]
    elif known.bwd_variants == "none":
        variants = []
    else:
        variants = [v for v in known.bwd_variants.split(",") if v and v != tri.BWD_VARIANT]
        unknown = [v for v in variants if v not in known_variants]
        if unknown:
            raise SystemExit(f"--bwd-variants: unknown {unknown}; known: {known_variants}")
    variant_notes = {} if variants else None
    fwd_notes = None if known.fwd_variants == "none" else {}
    bench_layer_norm(rows, rep, compile_baseline=not known.no_compile, launches=launches, variants=variants,
                     variant_notes=variant_notes, fwd_notes=fwd_notes, sweep_default=known.bwd_variants == "default",
                     fwd_everything=known.fwd_variants == "all", steady=steady)
    t2 = time.perf_counter()
    notes = {
        "bandwidth_for_floor": BANDWIDTH,
        "goals_ms": {"L2 fwd": 0.045, "L2 fwd+bwd": 0.12, "L1 fwd": 0.012, "Q1 fwd": 0.03, "Q1 fwd+bwd": 0.07},
        "wall_s": {"Q1 (incl. autotune, NVRTC)": t1 - t0, "L1-L3 (incl. autotune, torch.compile)": t2 - t1},
        "timing": "eager rows include host launch cost; [graph] rows are CUDA-graph replays of the same call",
        "fwd+bwd": "leaves' .grad reset to None before each call (zero_grad(set_to_none=True)); "
                   "'accumulate' rows keep them (autograd adds dx into x.grad)",
        "launches_per_call": launches,
        "steady_state": {
            "what": "'[graph xK steady]' rows: K calls back to back in ONE CUDA graph, each on its own copy of "
                    "the inputs (x, or values + crow + row ids; dy and the leaves for fwd+bwd; LayerNorm weight/"
                    "bias shared in fwd), K the smallest count >= %d (<= %d) whose K calls touch >= %dx the L2 "
                    "(inputs + outputs), so no call finds its inputs in L2; median/min/max are one replay / K, "
                    "i.e. what a captured pipeline pays per call (kernels + ~1 us per graph node + the replay's "
                    "launch latency / K); graph_ms_median: one replay; back_to_back_ms: %d replays queued "
                    "between two events, per call (launch latency hidden). Baselines get the same K and "
                    "rotation; x base = baseline steady / this steady. The [graph] rows above them are one "
                    "replay of one call on the same tensors, mostly launch latency for µs-scale kernels."
                    % (STEADY_MIN_K, STEADY_MAX_K, STEADY_L2_FACTOR, STEADY_REP),
            **steady,
        },
    }
    if fwd_notes is not None:
        notes["fwd_variants"] = {
            "what": "LayerNorm+GELU forward variants (pcops.triton.fused.FWD_VARIANTS: persistent grid, x loads "
                    "pipelined through shared memory; 'exact-tanh': the exp2 GELU instead of tanh.approx; "
                    "'wb-tile': weight/bias loaded in the tile layout; 'cfg BMxTxW': a fixed tile config of the "
                    "autotuner's space). max_abs_diff_vs_default: against the default forward of the same run",
            **fwd_notes,
        }
    if variant_notes is not None:
        notes["bwd_variants"] = {
            "what": f"LayerNorm+GELU backward variants (pcops.triton.fused.BWD_VARIANTS; default "
                    f"{tri.BWD_VARIANT!r}). max_abs_diff_vs_default: max |variant - default| of dx, dweight, dbias "
                    "(float32 of the outputs; max_abs_default gives the scale); fwd+bwd rows with grads reset",
            "predicted_ms": {"L1 fwd [graph]": 0.024, "L1 fwd kernel": 0.007, "L2 fwd": 0.045,
                             "L2 fwd kernel": 0.0367, "L2 bwd kernel": 0.083, "L2 fwd+bwd": 0.1225,
                             "Q1 triton fwd": 0.019, "Q1 cuda fwd": 0.026},
            **variant_notes,
        }
    report(rows, "fused", args.out, notes=notes)


if __name__ == "__main__":
    main()
