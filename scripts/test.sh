#!/usr/bin/env bash
# The README's test command: set up .venv/ (scripts/setup.sh) and run the fast tier of the tests,
# `pytest -m "not slow"` (≤ 5 min on a 2-core machine). Arguments go to pytest after the defaults:
#   bash scripts/test.sh -m slow          # the slow tier instead (a later -m wins)
#   bash scripts/test.sh -x tests/test_io.py
# On a machine without a GPU the Triton kernels run under the CPU interpreter (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PCOPS_SETUP=test source scripts/setup.sh
set -x
python -m pytest -m "not slow" -rs "$@"
