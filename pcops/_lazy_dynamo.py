"""Keep ``torch._dynamo`` out of eager op calls until something imports it.

``torch.library.custom_op`` wraps every device kernel in ``torch._disable_dynamo``, whose first
call imports ``torch._dynamo`` (and with it Triton): about 1 s on a CPU machine, paid by the
first eager call of any pcops op. Before ``torch._dynamo`` is imported nothing can be compiling
(``torch.compile`` imports it), so the wrapper has nothing to disable; this module gives each
kernel wrapper a ``__dynamo_disable`` that calls the kernel directly while ``torch._dynamo`` is
absent and builds torch's own ``torch._dynamo.disable`` wrapper as soon as it is present.
Where torch's internals differ from this layout the kernels are left as torch made them.
"""

from __future__ import annotations

import sys

__all__ = ["install"]


def _lazy(fn):
    real = None

    def call(*args, **kwargs):
        nonlocal real
        if real is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            import torch._dynamo

            real = torch._dynamo.disable(fn, recursive=True, wrapping=False)
        return real(*args, **kwargs)

    return call


def install(prefix: str = "pcops::") -> int:
    """Give the kernel wrappers of every custom op named ``prefix*`` the lazy disable; returns
    how many wrappers were changed (0 where torch's layout is not the expected one)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return 0
    changed = 0
    for name in list(OPDEFS.keys()):
        if not name.startswith(prefix):
            continue
        for wrapper in getattr(OPDEFS[name], "_backend_fns", {}).values():
            fn = getattr(wrapper, "__wrapped__", None)
            if fn is None or getattr(fn, "__dynamo_disable", None) is not None:
                continue
            fn.__dynamo_disable = _lazy(fn)
            changed += 1
    return changed
