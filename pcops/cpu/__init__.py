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

__all__ = ["numba_available", "num_threads", "keeps_torch_threads"]


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


def keeps_torch_threads(fn):
    """Decorates a CPU entry point so that ``torch.get_num_threads()`` is the same after it as
    before: numba's first parallel launch starts its OpenMP pool with ``NUMBA_NUM_THREADS``,
    which resets the OpenMP thread count torch reads (a ``torch.set_num_threads(1)`` made
    before the first pcops CPU call came back as 2 on a 2-core machine)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        n = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            if torch.get_num_threads() != n:
                torch.set_num_threads(n)

    return wrapper
