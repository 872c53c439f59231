#!/usr/bin/env bash
# Set up (if needed) and run the main job: the PointPillars demo on the sample scans in data/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
python -m pcops.models.demo "$@"
