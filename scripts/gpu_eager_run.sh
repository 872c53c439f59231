#!/usr/bin/env bash
# On a GPU machine (repo root, PYTHONPATH=.): the native host path built first, every GPU test
# (scripts/gpu_tests.sh), then issue 19's eager table with the native path on, the same rows with it
# off, and the per-op host-overhead breakdown; everything under OUT_DIR.
#   bash scripts/gpu_eager_run.sh OUT_DIR [test seconds]
set -u
out=${1:-out}; limit=${2:-300}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "from pcops import _native; _native.request(wait=True); print('native host path:', _native.status())" \
  | tee -a "$out/gpu.txt"
bash scripts/gpu_tests.sh "$out" "$limit"
python3 benchmarks/eager_calls.py --out "$out" --tag native_on 2>&1 | tail -80
python3 benchmarks/eager_calls.py --out "$out" --tag native_off --native off --only L,Q,P1,S1,V,N1 2>&1 | tail -60
python3 benchmarks/host_overhead.py --quick --no-e1 --out "$out" 2>&1 | tail -40
