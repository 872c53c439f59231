"""Fast CPU implementations of pcops ops (issue 20), compiled with numba (the optional ``cpu`` extra).

One file per op, named as in the other folders (``pcops/cpu/fps.py``, ``knn.py``, ``nms.py``,
...). On CPU tensors ``backend="auto"`` runs these when numba is importable and the plain-torch
reference otherwise (``backend="reference"`` always runs the reference, the test oracle). They
return exactly what the reference returns (same ties, padding and non-finite handling). Threads
follow ``torch.get_num_threads()``; compiled code is cached on disk (numba ``cache=True``).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["numba_available", "num_threads"]


@functools.lru_cache(maxsize=None)
def numba_available() -> bool:
    """numba imports (checked once per process)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def num_threads() -> int:
    """The thread count the CPU kernels use: ``torch.get_num_threads()``."""
    return max(1, torch.get_num_threads())
