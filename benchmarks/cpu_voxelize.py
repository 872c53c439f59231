"""C1 rows for voxelization on the CPU: V1 and V2 (WORKLOADS.md), hard and dynamic, called by bench_cpu.py.

V1: SCAN (120,268 points) with PointPillars' KITTI grid (voxel (0.16, 0.16, 4) m, range
[0, -39.68, -3, 69.12, 39.68, 1], 32 points per voxel, 40,000 voxels); V2: BIG (SCAN tiled 10×,
each copy jittered by N(0, 0.05 m), seed 0: 1,202,680 points), same grid; dynamic = the voxel of
every point, no caps. Implementations: pcops' CPU path (``backend="auto"``: the numba hash-map
pass of ``pcops.cpu.voxelize``), its plain-torch reference (the before-figure) and open3d's
``voxel_down_sample`` (voxel 0.16 m cubes, from a numpy array: the ``PointCloud`` construction is
included, as a user pays it; it only downsamples: one averaged point per voxel, no caps, no
per-point index, so it is a peer of the dynamic rows more than of the hard ones). Each row carries
``ratio_vs_best_peer`` = its median / open3d's median in the same run (below 1: faster) and whether
its outputs equal the reference's. ``python benchmarks/cpu_voxelize.py`` prints the rows.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402

from common import bench_cpu, load_scan, numba_first_call_rows  # noqa: E402

GRID = dict(voxel_size=(0.16, 0.16, 4.0), point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1))
CAPS = dict(max_points_per_voxel=32, max_voxels=40000)

_FIRST_CALL = """
import time, torch
import pcops
pts = torch.rand(5000, 4) * 40
t1 = time.perf_counter()
pcops.voxelize(pts, (0.16, 0.16, 4.0), (0, -39.68, -3, 69.12, 39.68, 1), 32, 40000)
pcops.dynamic_voxelize(pts, (0.16, 0.16, 4.0), (0, -39.68, -3, 69.12, 39.68, 1))
t2 = time.perf_counter()
pcops.voxelize(pts, (0.16, 0.16, 4.0), (0, -39.68, -3, 69.12, 39.68, 1), 32, 40000)
pcops.dynamic_voxelize(pts, (0.16, 0.16, 4.0), (0, -39.68, -3, 69.12, 39.68, 1))
t3 = time.perf_counter()
print((t2 - t1) * 1e3, (t3 - t2) * 1e3)
"""


def big_cloud(scan: torch.Tensor) -> torch.Tensor:
    """BIG of WORKLOADS.md: SCAN tiled 10×, each copy's x, y, z jittered by N(0, 0.05 m), seed 0."""
    g = torch.Generator().manual_seed(0)
    big = scan.repeat(10, 1)
    big[:, :3] += torch.randn(big.shape[0], 3, generator=g) * 0.05
    return big


def _same(a, b) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def _open3d():
    try:
        import open3d as o3d
    except (ImportError, OSError) as e:  # OSError: a missing system library (libusb-1.0)
        return None, f"open3d not importable ({type(e).__name__}: {str(e)[:120]}): no peer row"
    return o3d, None


def _first_call_rows() -> list[dict]:
    """The first call's cost in a fresh process (numba cache warm, and empty)."""
    return numba_first_call_rows(
        _FIRST_CALL,
        "fresh process, 5,000 points, voxelize + dynamic_voxelize",
        "import excluded; first call minus the second = numba load/compile cost",
    )


def run(threads: int, quick: bool) -> list[dict]:
    """V1/V2 hard and dynamic rows at ``threads`` threads."""
    torch.set_num_threads(threads)
    o3d, peer_note = _open3d()
    scan, source = load_scan()
    rows = []
    for wl, pts in (("V1", scan), ("V2", big_cloud(scan))):
        n = pts.shape[0]
        rep = (5 if quick else 30) if wl == "V1" else (3 if quick else 10)
        peer_ms = None
        base = {"threads": threads, "points": n, "scan": source}
        if o3d is not None:
            xyz = pts[:, :3].double().numpy()

            def down():
                pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(xyz))
                return pc.voxel_down_sample(0.16)

            t = bench_cpu(down, warmup=1, rep=rep)
            peer_ms = t["median_ms"]
            rows.append(
                {
                    "workload": f"{wl} (open3d peer)",
                    **base,
                    "impl": "open3d voxel_down_sample (0.16 m, PointCloud from numpy included)",
                    **t,
                    "ratio_vs_best_peer": 1.0,
                    "voxels": len(down().points),
                    "note": "downsample only (one mean point per occupied 0.16 m cube, no range, caps or "
                    "per-point index); open3d " + o3d.__version__,
                }
            )
        for kind in ("hard", "dynamic"):
            if kind == "hard":
                call = lambda b: pcops.voxelize(pts, **GRID, **CAPS, backend=b)  # noqa: E731
            else:
                call = lambda b: pcops.dynamic_voxelize(pts, **GRID, backend=b)  # noqa: E731
            expected = call("reference")
            equal = _same(call("auto"), expected)
            for impl, b in (("pcops cpu (numba hash map)", "auto"), ("pcops reference (plain torch)", "reference")):
                t = bench_cpu(lambda: call(b), warmup=3, rep=rep)
                r = {"workload": f"{wl} {kind}", **base, "impl": impl, **t, "equal_reference": equal or b != "auto"}
                r["points_per_s"] = n / (t["median_ms"] * 1e-3)
                if peer_ms:
                    r["ratio_vs_best_peer"] = t["median_ms"] / peer_ms
                else:
                    r["note"] = peer_note
                rows.append(r)
            rows[-1]["voxels"] = int(expected[1].shape[0] if kind == "dynamic" else expected[0].shape[0])
    if threads == 1:
        rows += _first_call_rows()
    return rows


if __name__ == "__main__":
    for t in sorted({1, os.cpu_count() or 1}):
        for r in run(t, quick="--quick" in sys.argv):
            print(json.dumps(r))
