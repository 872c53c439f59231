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
    "fps",
    "knn",
    "kernel_map",
    "layer_norm_gelu",
    "swish_dropout_residual",
    "sparse_softmax",
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

from . import nn  # noqa: E402  (module forms: pcops.nn.LayerNormGELU)


def _register_models_from_source() -> None:
    """Make ``pcops.models`` importable from a source checkout (``PYTHONPATH=.``).

    An installed pcops maps the top-level ``models/`` folder to ``pcops.models`` (pyproject);
    a plain checkout has no such package, so register the folder under that name here
    (``models/__init__.py`` is import-light, so this costs nothing).
    """
    import importlib.util
    import sys
    from pathlib import Path

    if "pcops.models" in sys.modules:
        return
    src = Path(__file__).resolve().parent.parent / "models"
    if not (src / "__init__.py").exists() or importlib.util.find_spec("pcops.models") is not None:
        return
    spec = importlib.util.spec_from_file_location("pcops.models", src / "__init__.py", submodule_search_locations=[str(src)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["pcops.models"] = module
    spec.loader.exec_module(module)


_register_models_from_source()
