"""Timing helpers shared by bench_layer_norm_gelu.py and bench_sparse_softmax.py.

Each figure is timed twice: eager calls (the host launch cost included: one Python call, its
checks and the custom-op dispatch) and replays of a CUDA graph of the same call (the GPU time a
captured pipeline sees). Neither flushes the L2 cache nor rotates inputs. ``floor`` = bytes that
must move (inputs once, outputs once) / 4.3 TB/s; ``of_floor`` = floor / median.

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

from common import bench, bench_steady, gpu_activities, row

BANDWIDTH = 4.3e12  # bytes/s, the measured H200 copy bandwidth of WORKLOADS.md
# steady-state rows ([graph xK steady]): K calls on K rotating input copies in one CUDA graph,
# K the smallest count whose working set (inputs + outputs of the K calls) is STEADY_L2_FACTOR
# times the L2 cache, at least STEADY_MIN_K (spreads the replay's launch latency, ≈ 10-20 µs,
# over that many calls), at most STEADY_MAX_K
STEADY_L2_FACTOR = 3
STEADY_MIN_K = 8
STEADY_MAX_K = 32
STEADY_REP = 50


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
        rows.append(
            row(
                wl,
                impl + (" [graph]" if mode else ""),
                t,
                items=items,
                unit="rows/s",
                baseline=base,
                floor_ms=floor_ms,
                of_floor=floor_ms / t["median_ms"],
            )
        )
        out[mode] = t
    return out


def count_launches(wl, fns):
    """GPU kernels per eager call of each ``fns`` entry (torch profiler, 3 calls); printed."""
    out = {}
    for name, fn in fns.items():
        act = gpu_activities(fn, iters=3)
        out[name] = {
            "launches": act.get("kernels"),
            "copies": act.get("copies"),
            "gpu_us": act.get("gpu_us"),
            "per_call_us": act.get("per_call_us"),
            **({"error": act["error"]} if "error" in act else {}),
        }
        print(
            f"{wl} {name}: {act.get('kernels')} launches per call ({act.get('copies')} copies), "
            f"GPU {act.get('gpu_us', float('nan')):.1f} µs"
        )
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
    info = {
        "K": k,
        "l2_bytes": l2,
        "fwd_bytes_per_call": fwd_bytes,
        "fwd+bwd_bytes_per_call": fb_bytes,
        "fwd_working_set_MB": k * fwd_bytes / 1e6,
        "fwd+bwd_working_set_MB": k * fb_bytes / 1e6,
    }
    print(
        f"{wl}: steady rows: K = {k} calls per graph on {k} input copies; working set (inputs + outputs) "
        f"fwd {k * fwd_bytes / 1e6:.0f} MB, fwd+bwd {k * fb_bytes / 1e6:.0f} MB "
        f"({k * fwd_bytes / l2:.1f}x / {k * fb_bytes / l2:.1f}x the {l2 / 1e6:.0f} MB L2)"
    )
    if k * fwd_bytes < STEADY_L2_FACTOR * l2:
        print(
            f"{wl}: steady rows: working set below {STEADY_L2_FACTOR}x L2 at K = STEADY_MAX_K "
            f"(inputs partly served from L2)"
        )
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
        rows.append(
            row(
                wl,
                name,
                t,
                items=items,
                unit="rows/s",
                baseline=base,
                floor_ms=floor_ms,
                of_floor=floor_ms / t["median_ms"],
            )
        )
        print(
            f"{wl} {name}: {t['median_ms']:.4f} ms per call (one replay of {k} calls {t['graph_ms_median']:.4f} ms; "
            f"{STEADY_REP} replays back to back {t['back_to_back_ms']:.4f} ms per call)"
        )
        info[f"{impl} {label}"] = {
            "ms_per_call": t["median_ms"],
            "graph_ms_median": t["graph_ms_median"],
            "back_to_back_ms_per_call": t["back_to_back_ms"],
        }
    info["wall_s"] = info.get("wall_s", 0.0) + time.perf_counter() - t0


def graph_row(rows, wl, impl, fn, rep, floor_ms, items, baseline=None):
    """A CUDA-graph-only timing row (``baseline``: a graph timing of the same workload)."""
    try:
        t = bench(fn, rep=rep, graph=True)
    except Exception as e:  # reported, not fatal
        print(f"{wl} {impl}: {type(e).__name__}: {e}")
        return None
    rows.append(
        row(
            wl,
            impl + " [graph]",
            t,
            items=items,
            unit="rows/s",
            baseline=baseline,
            floor_ms=floor_ms,
            of_floor=floor_ms / t["median_ms"],
        )
    )
    return t
