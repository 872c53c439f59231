"""Point-cloud inputs shared by tests/test_fps.py and tests/test_knn.py (seeded, uneven batches)."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from _util import generator


def make_clouds(batch, n, seed, dtype=torch.float32, device="cpu", scale=1.0, full_first=True, duplicates=False):
    """Padded random clouds ``(B, N, 3)`` with uneven lengths (the first cloud full)."""
    g = generator(seed)
    pts = torch.randn(batch, n, 3, generator=g) * scale
    if duplicates and n > 1:  # every point repeated: all distances tie pairwise
        pts[:, 1::2] = pts[:, 0 : n - 1 : 2]
    lengths = torch.randint(0, n + 1, (batch,), generator=g)
    if full_first and batch:
        lengths[0] = n
    return pts.to(dtype).to(device), lengths.to(device)


def tie_grid_clouds(batch, n, seed, device):
    """Points on a coarse integer grid (many exactly equal distances), uneven lengths."""
    g = generator(seed)
    pts = torch.randint(-3, 4, (batch, n, 3), generator=g).float()
    lengths = torch.randint(1, n + 1, (batch,), generator=g)
    lengths[0] = n
    return pts.to(device), lengths.to(device)


# Oracles of the GPU tests are the plain-torch reference run ON THE GPU, once per input: it does the
# same IEEE float32 operations on either device (separate mul/add kernels, no FMA contraction;
# argmax and stable sort keep the first index on ties), so its GPU result is the CPU result (a test
# checks that), and it is much faster there than the CPU reference on 100k-point clouds.
_REFERENCES: dict = {}


def cached_reference(key, build):
    """``build()`` once per ``key`` for the whole test session (inputs and reference outputs)."""
    if key not in _REFERENCES:
        _REFERENCES[key] = build()
    return _REFERENCES[key]


def load_scan_xyz():
    """SCAN xyz from ``../shared/data``, ``$PCOPS_DATA`` or the GPU machine's ``.gpu/data`` copy (as the
    benchmarks), else skip."""
    root = Path(__file__).resolve().parents[1]
    for base in (root / ".." / "shared" / "data", os.environ.get("PCOPS_DATA"), root / ".gpu" / "data"):
        if base is None:
            continue
        path = Path(base) / "kitti" / "training" / "velodyne" / "000001.bin"
        if path.exists():
            raw = np.fromfile(path, dtype=np.float32).reshape(-1, 4)
            return torch.from_numpy(raw[:, :3].copy())
    pytest.skip("real KITTI samples not found (../shared/data or .gpu/data)")
