#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: the README's test command.
# On a machine without a GPU the Triton kernels run under the CPU interpreter (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
python -m pytest tests -q -rs "$@"
