#!/usr/bin/env bash
# Run every test file's GPU tests (-m gpu) on a GPU machine, one pytest process per file in parallel
# (the Triton / NVRTC compiles are CPU-bound), and write one combined log: bash scripts/gpu_tests.sh OUT_DIR [secs]
set -u
out=${1:-out}; limit=${2:-280}
mkdir -p "$out" /tmp/gpu_tests
for f in tests/test_*.py; do
  name=$(basename "$f" .py)
  ( timeout "$limit" python -m pytest "$f" -m gpu -q -p no:cacheprovider -rfEs --no-header > /tmp/gpu_tests/$name.log 2>&1
    echo "exit=$?" >> /tmp/gpu_tests/$name.log ) &
done
wait
for f in /tmp/gpu_tests/*.log; do echo "=== $(basename "$f" .log): $(grep -E '(passed|failed|error|no tests ran|deselected)' "$f" | tail -1) $(tail -1 "$f")"; done | tee "$out/gpu_summary.txt"
for f in /tmp/gpu_tests/*.log; do echo "=== $(basename "$f")"; grep -vE '^(\.|s|F|E)+( +\[ *[0-9]+%\])?$' "$f" | tail -80; done > "$out/gpu_tests.log"
