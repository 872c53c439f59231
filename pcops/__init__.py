"""pcops: point-cloud 3D perception operators for PyTorch.

Every op is registered under ``torch.ops.pcops`` with a plain-PyTorch reference (the CPU
path and the test oracle), a GPU path (Triton, or CUDA C++ compiled at run time with
NVRTC), a fake implementation for ``torch.compile`` and, where it applies, a backward.

``import pcops`` registers the ops and imports nothing else: Triton and the kernels load
inside the GPU implementations, and ``pcops.nn``, ``pcops.io``, ``pcops.sim``, ``pcops.viz``
and ``pcops.models`` load on first use (``tests/test_import_time.py`` checks both).
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
    "sparse_conv3d",
    "masked_batch_norm",
    "pfn",
    "epilogue",
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

from . import _lazy_dynamo  # noqa: E402

_lazy_dynamo.install()  # the first eager call does not import torch._dynamo (see the module)

# Loaded on first attribute access, so that `import pcops` stays light.
_LAZY_SUBMODULES = ("nn", "io", "sim", "viz", "models")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"pcops.{name}")
    raise AttributeError(f"module 'pcops' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


class _SourceModelsFinder:
    """Finds ``pcops.models`` in a source checkout (``PYTHONPATH=.``), on first import.

    An installed pcops maps the top-level ``models/`` folder to ``pcops.models`` (pyproject);
    a plain checkout has no such package, so this finder (last on ``sys.meta_path``) maps the
    name to the folder.
    """

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != "pcops.models":
            return None
        import importlib.util
        from pathlib import Path

        src = Path(__file__).resolve().parent.parent / "models"
        if not (src / "__init__.py").exists():
            return None
        return importlib.util.spec_from_file_location(
            fullname, src / "__init__.py", submodule_search_locations=[str(src)]
        )


def _install_models_finder() -> None:
    import sys

    if not any(getattr(f, "__name__", "") == "_SourceModelsFinder" for f in sys.meta_path):
        sys.meta_path.append(_SourceModelsFinder)


_install_models_finder()
