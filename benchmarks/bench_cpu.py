"""C1: the CPU path against the CPU peers (fpsample, scipy cKDTree, open3d) in one process.

Usage: ``python benchmarks/bench_cpu.py [--quick] [--out benchmarks/results]``. Runs every
``benchmarks/cpu_<op>.py`` module's ``run(threads, quick)`` at one thread and at all threads and
writes ``cpu.json`` (device, versions, date, commit, rows). A peer that is not installed is
skipped and named in the rows' notes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--only", default=None, help="comma-separated op modules (cpu_<op>.py)")
    args = ap.parse_args()
    mods = sorted(p.stem for p in HERE.glob("cpu_*.py"))
    if args.only:
        mods = [m for m in mods if m[len("cpu_") :] in args.only.split(",")]
    rows = []
    all_threads = os.cpu_count() or 1
    for threads in sorted({1, all_threads}):
        torch.set_num_threads(threads)
        for m in mods:
            mod = importlib.import_module(m)
            for r in mod.run(threads, args.quick):
                r.setdefault("threads", threads)
                rows.append(r)
                print(json.dumps(r))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    rec = {
        "workload": "C1",
        "device": platform.processor() or platform.machine(),
        "cpus": all_threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": str(datetime.date.today()),
        "commit": commit,
        "rows": rows,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "cpu.json").write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
