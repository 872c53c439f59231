#!/usr/bin/env bash
# T1 on a GPU machine: generate the simulated split (if absent), train PointPillars, evaluate, export the
# weights. Usage: bash benchmarks/train_pointpillars.sh DATA_DIR RUN_DIR EPOCHS [extra train flags...]
# Writes RUN_DIR/train_result.json, RUN_DIR/pointpillars_sim.pt and RUN_DIR/log.txt.
set -euo pipefail
data=$1; run=$2; epochs=$3; shift 3
mkdir -p "$run"
cores=$(nproc)
if [ ! -f "$data/pcops_sim.json" ]; then
  /usr/bin/time -f "generate: %e s" python -m pcops.models generate --out "$data" --workers "$cores" --no-progress 2>&1 | tail -3
fi
python -m pcops.models train --data "$data" --out "$run" --epochs "$epochs" --workers $((cores - 2)) \
  --no-progress --export "$run/pointpillars_sim.pt" "$@" 2>&1 | tee "$run/log.txt" | grep -v "^ *\[" | tail -60
