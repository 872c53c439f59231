"""One-call GPU check: the GPU tests and every benchmark, results as JSON in one folder.

    python scripts/gpu_check.py OUT_DIR [--tests PATTERN] [--bench NAME ...] [--skip-tests]

Writes ``OUT_DIR/pytest_<file>.log``, ``OUT_DIR/bench_<name>.log``, ``OUT_DIR/<benchmark>.json``
(device, torch/triton versions, commit, date in each), ``OUT_DIR/summary.json``, and all of it
again as one archive ``OUT_DIR.tgz`` beside the folder. Meant for a short rented GPU slot: run it
from the repository root on the GPU machine (``PYTHONPATH=.`` or an editable install).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out")
    p.add_argument("--tests", default="tests", help="pytest target(s), space separated")
    p.add_argument("--pytest-args", default="", help="extra pytest arguments")
    p.add_argument("--bench", nargs="*", default=None, help="benchmark names (bench_<name>.py); default all")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--bench-timeout", type=int, default=180)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--marker", default="gpu", help="pytest -m expression on the GPU ('' for all tests)")
    p.add_argument("--test-timeout", type=int, default=240, help="seconds per test file")
    p.add_argument("--jobs", type=int, default=6, help="test files run side by side")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    summary = {"tests": None, "benchmarks": {}}
    if not a.skip_tests:
        # one pytest process per test file, several side by side (Triton compiles on the CPU),
        # each bounded in time so that one hung kernel cannot eat the whole GPU slot
        t0 = time.time()
        files = []
        for target in a.tests.split():
            path = ROOT / target
            files += sorted(path.glob("test_*.py")) if path.is_dir() else [path]
        extra = a.pytest_args.split() + (["-m", a.marker] if a.marker else [])
        try:
            import pytest_timeout  # noqa: F401

            extra += ["--timeout=120"]
        except ImportError:
            pass
        running, results = [], {}
        pending = list(files)
        while pending or running:
            while pending and len(running) < a.jobs:
                f = pending.pop(0)
                log = open(out / f"pytest_{f.stem}.log", "w")
                cmd = [
                    sys.executable,
                    "-m",
                    "pytest",
                    str(f),
                    "-q",
                    "-rfEs",
                    "-p",
                    "no:cacheprovider",
                    "--durations=8",
                    *extra,
                ]
                running.append(
                    (
                        f,
                        log,
                        time.time(),
                        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                    )
                )
            time.sleep(0.5)
            for item in list(running):
                f, log, started, proc = item
                if proc.poll() is None and time.time() - started > a.test_timeout:
                    proc.kill()
                    proc.wait()
                    log.write(f"\nKILLED after {a.test_timeout} s\n")
                if proc.poll() is not None:
                    log.close()
                    running.remove(item)
                    lines = (out / f"pytest_{f.stem}.log").read_text().splitlines()
                    results[f.stem] = {
                        "returncode": proc.returncode,
                        "seconds": round(time.time() - started, 1),
                        "last": lines[-1] if lines else "",
                    }
                    print(
                        f"--- {f.stem}: rc={proc.returncode} {results[f.stem]['seconds']} s: {results[f.stem]['last']}"
                    )
        summary["tests"] = {"seconds": round(time.time() - t0, 1), "files": results}
    if not a.skip_bench:
        names = a.bench or sorted(p.stem[len("bench_") :] for p in (ROOT / "benchmarks").glob("bench_*.py")) + [
            "host_overhead",
            "dispatch_overhead",
            "autograd_overhead",
            "peer_spconv",  # exits at once unless spconv is on PYTHONPATH (../shared/tools/spconv)
        ]
        for name in names:
            t0 = time.time()
            script = ROOT / "benchmarks" / f"bench_{name}.py"
            if not script.exists():  # the host-time scripts: benchmarks/<name>.py
                script = ROOT / "benchmarks" / f"{name}.py"
            cmd = [sys.executable, str(script), "--out", str(out)] + (["--quick"] if a.quick else [])
            try:
                r = subprocess.run(
                    cmd, cwd=ROOT / "benchmarks", env=env, capture_output=True, text=True, timeout=a.bench_timeout
                )
                rc, text = r.returncode, r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:
                rc, text = (
                    "timeout",
                    (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
                )
            summary["benchmarks"][name] = {"returncode": rc, "seconds": round(time.time() - t0, 1)}
            (out / f"bench_{name}.log").write_text(text)
            print(f"--- bench_{name}: rc={rc} ({time.time() - t0:.1f} s)")
            print("\n".join(text.splitlines()[-30:]))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    # one archive of everything: remote GPU slots often return only a few files
    import tarfile

    with tarfile.open(out.parent / f"{out.name}.tgz", "w:gz") as tar:
        tar.add(out, arcname=out.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
