"""C1 rows for farthest point sampling on the CPU: F1 and F2 (WORKLOADS.md), called by bench_cpu.py.

F1: 8 random 16,384-point subsets of SCAN xyz (seed 0, ``bench_fps.f1_clouds``), 4,096 samples
each; F2: SCAN xyz (120,268 points), 16,384 samples; start index 0. Implementations: pcops'
CPU path (``backend="auto"``: the numba bucket FPS), its plain-torch reference (timed once: seconds
per call) and fpsample's ``bucket_fps_kdline_sampling`` with h = 7 (the peer named in issue 20;
at more than one thread the 8 F1 clouds go to a thread pool, as a user would). Each row carries
``ratio_vs_best_peer`` = its median / fpsample's median in the same run, their runs interleaved
(below 1: faster) and whether its indices equal the reference's. ``python benchmarks/cpu_fps.py``
prints the rows.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import pcops
from pcops.reference import fps as ref

from bench_fps import f1_clouds
from common import bench_cpu, bench_cpu_pair, load_scan, numba_first_call_rows

FPSAMPLE_H = 7  # the KD-tree height issue 20 names (128 buckets)

_FIRST_CALL = """
import time, torch
t0 = time.perf_counter()
import pcops
pts = torch.rand(2, 4096, 3)
t1 = time.perf_counter()
pcops.farthest_point_sample(pts, 256)
t2 = time.perf_counter()
pcops.farthest_point_sample(pts, 256)
t3 = time.perf_counter()
print((t2 - t1) * 1e3, (t3 - t2) * 1e3)
"""


def _workloads():
    scan, source = load_scan()
    xyz = scan[:, :3].contiguous()
    return [("F1", f1_clouds(xyz), 4096, source), ("F2", xyz[None].contiguous(), 16384, source)]


def _fpsample(clouds: np.ndarray, m: int, threads: int):
    import fpsample

    def one(c):
        return fpsample.bucket_fps_kdline_sampling(c, m, FPSAMPLE_H, start_idx=0)

    if threads == 1 or len(clouds) == 1:
        return np.stack([one(c) for c in clouds])
    with ThreadPoolExecutor(threads) as pool:
        return np.stack(list(pool.map(one, clouds)))


def _first_call_rows() -> list[dict]:
    """The first call's cost in a fresh process (numba cache warm, and empty)."""
    return numba_first_call_rows(
        _FIRST_CALL,
        "fresh process, 2 x 4,096 -> 256",
        "first call minus a second identical call = numba load/compile cost",
    )


def run(threads: int, quick: bool) -> list[dict]:
    """F1 and F2 rows at ``threads`` threads (``torch.set_num_threads`` is already set by the caller)."""
    torch.set_num_threads(threads)
    rows = []
    try:
        import fpsample  # noqa: F401

        peer_note = None
    except ImportError:
        peer_note = "fpsample not installed (pip install fpsample): no peer row"
    rep = 5 if quick else 20
    for name, clouds, m, source in _workloads():
        batch, n, _ = clouds.shape
        full = torch.full((batch,), n)
        start = torch.zeros(batch, dtype=torch.int64)
        t0 = time.perf_counter()
        expected = ref.farthest_point_sample(clouds, full, start, m)  # seconds: timed once
        ms = (time.perf_counter() - t0) * 1e3
        t_ref = {"median_ms": ms, "min_ms": ms, "max_ms": ms, "runs": 1}
        got = pcops.farthest_point_sample(clouds, m)
        base = {"workload": name, "threads": threads, "points": n, "clouds": batch, "samples": m, "scan": source}
        peer_ms = None
        peer_row = None
        if peer_note is None:
            c_np = clouds.numpy()
            peer = _fpsample(c_np, m, threads)
            # interleaved with pcops' runs: the machine's load drifts (see bench_cpu_pair)
            t_pc, t_peer = bench_cpu_pair(
                lambda: pcops.farthest_point_sample(clouds, m), lambda: _fpsample(c_np, m, threads), warmup=1, rep=rep
            )
            peer_ms = t_peer["median_ms"]
            peer_row = {
                **base,
                "impl": f"fpsample bucket_fps_kdline_sampling (h = {FPSAMPLE_H})"
                + (" in a thread pool" if threads > 1 and batch > 1 else ""),
                **t_peer,
                "ratio_vs_best_peer": 1.0,
                "equal_reference": bool(np.array_equal(peer, expected.numpy())),
            }
        else:
            t_pc = bench_cpu(lambda: pcops.farthest_point_sample(clouds, m), warmup=1, rep=rep)
        for impl, t, idx in [
            ("pcops cpu (numba bucket FPS)", t_pc, got),
            ("pcops reference (plain torch)", t_ref, expected),
        ]:
            r = {**base, "impl": impl, **t, "equal_reference": bool(torch.equal(idx, expected))}
            r["samples_per_s"] = batch * m / (t["median_ms"] * 1e-3)
            if peer_ms:
                r["ratio_vs_best_peer"] = t["median_ms"] / peer_ms
            else:
                r["note"] = peer_note
            rows.append(r)
        if peer_row:
            peer_row["samples_per_s"] = batch * m / (peer_ms * 1e-3)
            rows.append(peer_row)
    if threads == 1:
        rows += _first_call_rows()
    return rows


if __name__ == "__main__":
    for t in sorted({1, os.cpu_count() or 1}):
        for r in run(t, quick="--quick" in sys.argv):
            print(json.dumps(r))
