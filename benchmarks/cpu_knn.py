"""K1, K2, B1 on the CPU (WORKLOADS.md): pcops' KD-tree path vs scipy ``cKDTree`` in one process.

K1: the 8 F1 clouds (8 × 16,384 SCAN points), query = reference, K = 16 and 32. K2: SCAN xyz
against itself, K = 16. B1: centres = the F1 FPS samples (8 × 4,096, computed once), reference =
the F1 clouds, radius 0.8 m, K = 32, first K in index order. The peer's time includes building
its tree (``cKDTree(c)`` then ``query`` / ``query_ball_point`` with ``workers`` = the thread count,
then the first K sorted indices for ball query), its runs interleaved with pcops'. The reference
(brute force) is timed on a slice of the queries and scaled, said in its note. Called by ``bench_cpu.py``: ``run(threads, quick)``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402

from bench_fps import f1_clouds  # noqa: E402
from common import bench_cpu_pair, load_scan  # noqa: E402

_REF_QUERIES = 256  # queries the brute-force reference is timed on (it is O(Nq·Nr))


def _median_ms(fn, rep: int) -> float:
    fn()
    times = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _first_call_ms() -> float:
    code = (
        "import time, torch, pcops; p = torch.rand(2, 1000, 3); t0 = time.perf_counter(); "
        "pcops.knn(p, p, 16); pcops.ball_query(p, p, 0.1, 8); print((time.perf_counter() - t0) * 1e3)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE.parent)
    return float(out.stdout.strip().splitlines()[-1])


def run(threads: int, quick: bool) -> list[dict]:
    torch.set_num_threads(threads)
    rep = 3 if quick else 10
    scan, source = load_scan()
    xyz = scan[:, :3].contiguous()
    clouds = f1_clouds(xyz)
    centres = pcops.gather_points(clouds, pcops.farthest_point_sample(clouds, 4096)).contiguous()
    note_src = f"input: {source}"
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        cKDTree = None
    rows = []

    def add(workload, impl, ms, peer_ms, note=""):
        r = {"workload": workload, "impl": impl, "median_ms": round(ms, 3), "threads": threads}
        if peer_ms is not None:
            r["ratio_vs_best_peer"] = round(ms / peer_ms, 3)
        r["note"] = "; ".join(x for x in (note, note_src) if x)
        rows.append(r)

    cases = [("K1", clouds, 16), ("K1", clouds, 32), ("K2", xyz[None], 16)]
    for wl, pts, k in cases:
        name = f"{wl} K={k}"
        np_pts = pts.numpy()
        peer = None
        if cKDTree is not None:
            # interleaved with pcops' runs: the machine's load drifts (common.bench_cpu_pair)
            t_pc, t_peer = bench_cpu_pair(
                lambda: pcops.knn(pts, pts, k),
                lambda: [cKDTree(c).query(c, k, workers=threads) for c in np_pts],
                warmup=1,
                rep=rep,
            )
            peer, ms = t_peer["median_ms"], t_pc["median_ms"]
            add(name, "scipy cKDTree (build + query)", peer, peer)
        else:
            ms = _median_ms(lambda: pcops.knn(pts, pts, k), rep)
        add(name, "pcops cpu", ms, peer, "" if cKDTree else "scipy not installed")
        sub = pts[:1, :_REF_QUERIES].contiguous()
        scale = pts.shape[0] * pts.shape[1] / _REF_QUERIES
        ref_ms = _median_ms(lambda: pcops.knn(sub, pts[:1], k, backend="reference"), 1) * scale
        add(name, "pcops reference", ref_ms, peer, f"timed on {_REF_QUERIES} queries of one cloud, scaled ×{scale:.0f}")

    np_c, np_r = centres.numpy(), clouds.numpy()
    peer = None
    if cKDTree is not None:

        def peer_ball():
            for b in range(np_r.shape[0]):
                hits = cKDTree(np_r[b]).query_ball_point(np_c[b], 0.8, workers=threads, return_sorted=True)
                [h[:32] for h in hits]

        t_pc, t_peer = bench_cpu_pair(lambda: pcops.ball_query(centres, clouds, 0.8, 32), peer_ball, warmup=1, rep=rep)
        peer, ms = t_peer["median_ms"], t_pc["median_ms"]
        add("B1", "scipy cKDTree query_ball_point + first 32", peer, peer)
    else:
        ms = _median_ms(lambda: pcops.ball_query(centres, clouds, 0.8, 32), rep)
    add("B1", "pcops cpu", ms, peer)
    sub = centres[:1, :_REF_QUERIES].contiguous()
    scale = centres.shape[0] * centres.shape[1] / _REF_QUERIES
    ref_ms = _median_ms(lambda: pcops.ball_query(sub, clouds[:1], 0.8, 32, backend="reference"), 1) * scale
    add("B1", "pcops reference", ref_ms, peer, f"timed on {_REF_QUERIES} queries of one cloud, scaled ×{scale:.0f}")
    if threads == 1:
        rows.append(
            {
                "workload": "K1/B1 (2 × 1,000 points)",
                "impl": "pcops first call (fresh process)",
                "median_ms": round(_first_call_ms(), 1),
                "threads": threads,
                "note": "knn + ball_query, numba's on-disk cache warm (cache=True); import time excluded",
            }
        )
    return rows


if __name__ == "__main__":
    import json

    for t in sorted({1, torch.get_num_threads()}):
        for r in run(t, quick="--quick" in sys.argv):
            print(json.dumps(r))
