#!/usr/bin/env bash
# Set up .venv/ (scripts/setup.sh) and run the PointPillars demo on the sample scans in data/.
# Arguments go to the demo (python -m pcops.models.demo --help).
set -euo pipefail
cd "$(dirname "$0")/.."
PCOPS_SETUP=demo source scripts/setup.sh
set -x
python -m pcops.models.demo "$@"
