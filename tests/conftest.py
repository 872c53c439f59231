"""Test set-up shared by every test file.

Without a CUDA device, Triton kernels run under the CPU interpreter: ``TRITON_INTERPRET=1``
must be set before any ``@triton.jit`` kernel is defined, i.e. before pcops is imported,
which is why it happens here at collection time. Tests marked ``interpret`` call the Triton
launchers directly on small CPU tensors and compare them with the reference.

Tiers: ``pytest -m "not slow"`` (the README's test command, ≤ 5 min on 2 cores) and
``pytest -m slow``. Besides tests marked ``slow`` where they are defined, every test whose name
contains ``_for_sm90`` (Triton or NVRTC compiling kernels for sm_90 without a GPU: 2-30 s each
on a 2-core machine) is in the slow tier.
"""

import os
from pathlib import Path

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
# the GPU machine has no ../shared: its runs point PCOPS_DATA at a copy (see scripts/gpu_check.py)
if not SHARED_DATA.exists() and os.environ.get("PCOPS_DATA"):
    SHARED_DATA = Path(os.environ["PCOPS_DATA"])
KITTI = SHARED_DATA / "kitti" / "training"


def pytest_report_header(config):
    return f"pcops tests: cuda={_HAS_CUDA} TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}"


@pytest.fixture
def kitti_dir():
    """The real KITTI samples beside the repo (``../shared/data/kitti/training``, or under
    ``$PCOPS_DATA`` where ``../shared`` is absent), or skip."""
    if not (KITTI / "velodyne" / "000001.bin").exists():
        pytest.skip(f"real KITTI samples not found at {KITTI}")
    return KITTI


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "_for_sm90" in item.name:
            item.add_marker(pytest.mark.slow)


def interpret_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def pytest_terminal_summary(terminalreporter):
    """Say how many Triton-interpreter tests ran, so CI logs show the kernels were exercised."""
    passed = [r for r in terminalreporter.stats.get("passed", []) if "interpret" in r.keywords]
    failed = [r for r in terminalreporter.stats.get("failed", []) if "interpret" in r.keywords]
    terminalreporter.write_line(
        f"Triton interpreter tests (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}): "
        f"{len(passed)} passed, {len(failed)} failed"
    )
