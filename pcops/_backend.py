"""The one backend contract of every pcops op.

Every public op takes ``backend: str = "auto"`` with the same vocabulary:

``"auto"``
    The op's documented default for the tensors' device: on CUDA its fastest kernel (Triton or
    CUDA C++), on the CPU its CPU path; float64 inputs run the reference (the GPU kernels compute
    in float32). ``"auto"`` is the only value that ever falls back, and each op's docstring says how.
``"triton"`` / ``"cuda"``
    That GPU implementation, on CUDA tensors only. If it cannot run (not a CUDA tensor, NVRTC
    missing, an unsupported dtype or size), the call raises ``ValueError``/``RuntimeError`` naming
    the reason instead of silently running something else.
``"reference"``
    The plain-torch reference (``pcops.reference``), on any device: the test oracle.

:func:`resolve` turns the argument into the implementation that runs, in one place, and
:func:`log_kernel` reports at ``logging.DEBUG`` (logger ``"pcops"``) which kernel ran.
"""

from __future__ import annotations

import functools
import logging

import torch

__all__ = ["BACKENDS", "check", "resolve", "refuse_float64", "nvrtc_available", "log_kernel", "logger"]

BACKENDS = ("auto", "triton", "cuda", "reference")

logger = logging.getLogger("pcops")


def check(backend, op: str, supported: tuple[str, ...] = BACKENDS) -> str:
    """Validate ``backend`` against the shared vocabulary and the op's implementations.

    Raises ``TypeError`` for a non-string, ``ValueError`` for a name outside :data:`BACKENDS`
    or one this op does not implement (e.g. ``"cuda"`` for an op with no CUDA C++ kernel).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str (one of {BACKENDS}), got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend not in supported:
        raise ValueError(f"backend: {op} has no {backend!r} implementation; expected one of {supported}")
    return backend


def resolve(
    backend: str, op: str, *tensors: torch.Tensor, auto_cuda: str = "triton", supported: tuple[str, ...] = BACKENDS
) -> str:
    """The implementation that runs: ``"reference"``, ``"cpu"``, ``"triton"`` or ``"cuda"``.

    ``tensors`` are the op's float inputs (their device decides; float64 sends ``"auto"`` to the
    reference). ``auto_cuda`` is the op's default CUDA implementation. An explicit GPU backend
    on a CPU tensor raises ``ValueError``. ``"cpu"`` is returned for ``"auto"`` on CPU tensors: ops
    without a dedicated CPU path treat it as the reference.
    """
    backend = check(backend, op, supported)
    if backend == "reference":
        return "reference"
    on_cuda = bool(tensors) and tensors[0].device.type == "cuda"
    if backend == "auto":
        if any(t.dtype == torch.float64 for t in tensors):
            return "reference"
        return auto_cuda if on_cuda else "cpu"
    if not on_cuda:
        device = tensors[0].device if tensors else "cpu"
        raise ValueError(
            f"backend: {backend!r} runs on CUDA tensors only, got tensors on {device}; "
            "use backend='auto' or 'reference'"
        )
    return backend


def refuse_float64(chosen: str, tensor: torch.Tensor, name: str) -> None:
    """An explicitly requested GPU kernel computes in float32: float64 input raises ``TypeError``
    (``"auto"`` sends float64 to the reference instead)."""
    if chosen in ("triton", "cuda") and tensor.dtype == torch.float64:
        raise TypeError(
            f"{name}: backend={chosen!r} computes in float32 and takes float32/float16/bfloat16, got "
            "torch.float64; use backend='auto' or 'reference'"
        )


@functools.lru_cache(maxsize=None)
def nvrtc_available() -> bool:
    """NVRTC can be loaded (checked once per process): where it cannot, ``"auto"`` uses Triton."""
    try:
        from ._nvrtc import nvrtc

        nvrtc()
        return True
    except (RuntimeError, OSError):
        return False


def log_kernel(op: str, kernel: str) -> None:
    """Report which kernel ran (``logging.DEBUG`` on logger ``"pcops"``); free when disabled."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: %s", op, kernel)
