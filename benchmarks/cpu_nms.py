"""C1 rows for rotated NMS on the CPU: N1 (4,096 boxes, IoU 0.01 and 0.5) and N2 (16,384, 0.5), one thread.

Boxes as WORKLOADS.md defines them (``numpy.random.default_rng(0)`` per workload: x, y, z, dx, dy,
dz, heading, then the scores, one array of N at a time), float32. Implementations: pcops' CPU
path (``backend="auto"``: the numba NMS of ``pcops.cpu.nms``) and its plain-torch reference (timed
once on N1 only: seconds per call; on N2 it would take minutes, so that row is left out and said
so). No CPU peer does rotated NMS (OpenPCDet's and mmcv's are GPU kernels). Rows only at one
thread (the goal of issue 20; the greedy pass is sequential). Called by ``bench_cpu.py``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pcops  # noqa: E402

from common import bench_cpu  # noqa: E402

WORKLOADS = [("N1", 4096, 0.01), ("N1", 4096, 0.5), ("N2", 16384, 0.5)]


def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The NMS boxes of WORKLOADS.md on the CPU: ``(n, 7)`` float32 boxes and ``(n,)`` scores."""
    rng = np.random.default_rng(0)
    lows_highs = [(0, 69.12), (-39.68, 39.68), (-2, 0), (3.2, 4.7), (1.4, 2.0), (1.4, 1.7), (-math.pi, math.pi)]
    cols = [rng.uniform(lo, hi, n) for lo, hi in lows_highs]
    scores = rng.uniform(0, 1, n)
    return torch.from_numpy(np.stack(cols, 1)).float(), torch.from_numpy(scores).float()


def run(threads: int, quick: bool) -> list[dict]:
    if threads != 1:
        return []
    torch.set_num_threads(1)
    rows = []
    for wl, n, thr in WORKLOADS:
        boxes, scores = make(n)
        got = pcops.nms_bev(boxes, scores, thr)
        t = bench_cpu(lambda: pcops.nms_bev(boxes, scores, thr), warmup=1, rep=5 if quick else 20)
        base = {"workload": f"{wl} IoU {thr}", "threads": 1, "boxes": n, "kept": int(got.numel())}
        r = {**base, "impl": "pcops cpu (numba)", **t, "boxes_per_s": n / (t["median_ms"] * 1e-3)}
        if wl == "N1":
            t0 = time.perf_counter()
            expected = pcops.nms_bev(boxes, scores, thr, backend="reference")
            ms = (time.perf_counter() - t0) * 1e3
            r["equal_reference"] = bool(torch.equal(got, expected))
            r["speedup_vs_reference"] = ms / t["median_ms"]
            rows.append(r)
            rows.append(
                {
                    **base,
                    "impl": "pcops reference (plain torch)",
                    "median_ms": ms,
                    "runs": 1,
                    "note": "timed once (seconds per call)",
                }
            )
        else:
            r["note"] = "reference not timed on N2 (minutes per call); no CPU peer does rotated NMS"
            rows.append(r)
    return rows


if __name__ == "__main__":
    for r in run(1, quick="--quick" in sys.argv):
        print(json.dumps(r))
