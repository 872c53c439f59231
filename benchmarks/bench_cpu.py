"""C1: the CPU path against the CPU peers (fpsample, scipy cKDTree, open3d) in one process.

Usage: ``python benchmarks/bench_cpu.py [--quick] [--only fps,knn,nms,voxelize] [--out
benchmarks/results] [--note TEXT]``. Runs every ``benchmarks/cpu_<op>.py`` module's ``run(threads,
quick)`` at one thread and at all threads, in this one process, and writes ``cpu_<op>.json`` per
module (device = the CPU model, core count, versions of torch/numba and the peers, date, commit,
load average at the start, notes, rows). A peer that is not installed is skipped and named in the
rows' notes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for pkg in ("numba", "numpy", "scipy", "fpsample", "open3d"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--only", default=None, help="comma-separated op modules (cpu_<op>.py)")
    ap.add_argument("--note", default="", help="added to every file's notes (e.g. the machine's load)")
    args = ap.parse_args()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    mods = sorted(p.stem for p in HERE.glob("cpu_*.py"))
    if args.only:
        mods = [m for m in mods if m[len("cpu_") :] in args.only.split(",")]
    rows = {m: [] for m in mods}
    all_threads = os.cpu_count() or 1
    for threads in sorted({1, all_threads}):
        torch.set_num_threads(threads)
        for m in mods:
            mod = importlib.import_module(m)
            for r in mod.run(threads, args.quick):
                r.setdefault("threads", threads)
                rows[m].append(r)
                print(json.dumps(r), flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    notes = [f"load average at the start (1, 5, 15 min): {load}" if load else ""]
    notes += [args.note] if args.note else []
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for m, mrows in rows.items():
        rec = {
            "workload": "C1",
            "module": f"benchmarks/{m}.py",
            "device": cpu_model(),
            "cpus": all_threads,
            **versions(),
            "date": str(datetime.date.today()),
            "commit": commit,
            "quick": args.quick,
            "notes": [n for n in notes if n],
            "rows": mrows,
        }
        (Path(args.out) / f"{m}.json").write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
