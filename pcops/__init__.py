"""pcops: point-cloud 3D perception operators for PyTorch.

Every op is registered under ``torch.ops.pcops`` with a plain-PyTorch reference (the CPU
path and the test oracle), a GPU path (Triton, or CUDA C++ compiled at run time with
NVRTC), a fake implementation for ``torch.compile`` and, where it applies, a backward.
"""
from __future__ import annotations

import importlib as _importlib

__version__ = "0.1.0"

# Public modules; each defines ``__all__`` with its public names.
_OP_MODULES = (
    "pillar_scatter",
    "voxelize",
    "nms",
    "sampling",
    "kernel_map",
    "fused",
)

__all__: list[str] = []
for _m in _OP_MODULES:
    try:
        _mod = _importlib.import_module(f"pcops.{_m}")
    except ModuleNotFoundError as _e:  # a module not written yet (development only)
        if _e.name != f"pcops.{_m}":
            raise
        continue
    for _n in getattr(_mod, "__all__", ()):
        globals()[_n] = getattr(_mod, _n)
        __all__.append(_n)
del _m
