"""Fused Swish + dropout + residual: ``dropout(x · sigmoid(x)) + residual`` in one elementwise pass.

Public function → ``torch.ops.pcops.swish_dropout_residual`` → the reference on the CPU, Triton
on CUDA (``pcops/triton/swish_dropout_residual.py``); a fake function; a backward custom op with
the same split. Dropout seeds: ``pcops._dropout``.
"""

from __future__ import annotations

import torch

from . import _backend, _checks, _dropout, _library
from .reference import swish_dropout_residual as _ref

__all__ = ["fused_swish_dropout_residual"]

_OP = "swish_dropout_residual"
_SUPPORTED = ("auto", "triton", "reference")


def fused_swish_dropout_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    dropout_p: float,
    training: bool = True,
    generator: torch.Generator | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``dropout(x · sigmoid(x)) + residual`` in one elementwise pass (Swish/SiLU, Ramachandran et al., 2017).

    Args:
        x: any shape, float32/float16/bfloat16/float64.
        residual: same shape, dtype and device as ``x``.
        dropout_p: drop probability in [0, 1) (kept values scaled by ``1 / (1 - p)``).
        training: dropout applies only when True.
        generator: source of the dropout seed (see ``pcops._dropout``).
        backend: ``"auto"`` (default: Triton on CUDA, the reference on the CPU and for float64),
            ``"triton"`` (CUDA tensors, not float64) or ``"reference"`` (plain torch on any
            device). No ``"cuda"`` implementation: it raises ``ValueError``.

    Returns:
        a tensor like ``x``. Gradient w.r.t. ``x`` (``g·m/(1-p)·s·(1 + x(1 - s))``, the mask
        regenerated from the seed) and ``residual`` (``g``). No host synchronisation.

    Example:
        >>> x, r = torch.randn(4096, 64, device="cuda"), torch.randn(4096, 64, device="cuda")
        >>> y = pcops.fused_swish_dropout_residual(x, r, dropout_p=0.1)
    """
    _checks.check_tensor("x", x, dtypes=_checks.FLOAT_DTYPES)
    _checks.check_tensor("residual", residual, dtypes=(x.dtype,))
    if residual.shape != x.shape:
        raise ValueError(f"residual: expected shape {tuple(x.shape)} (the shape of x), got {tuple(residual.shape)}")
    _checks.check_same_device(x=x, residual=residual)
    dropout_p = _dropout.check_p(dropout_p)
    training = _dropout.check_training(training)
    _resolve(backend, x)  # early, named errors (the registered kernels resolve again)
    seed = _dropout.draw_seed(x.device, generator) if training and dropout_p > 0 else None
    return _library.call(
        torch.ops.pcops.swish_dropout_residual.default, x.contiguous(), residual.contiguous(), dropout_p, seed, backend
    )


def _resolve(backend: str, x: torch.Tensor) -> str:
    """``"triton"`` or ``"reference"`` (which also serves ``"cpu"``: the op has no separate CPU path)."""
    chosen = _backend.resolve(backend, _OP, x, supported=_SUPPORTED)
    _backend.refuse_float64(chosen, x, "x")
    return "triton" if chosen == "triton" else "reference"


# --- registration ---------------------------------------------------------------------------


def _reference(x, residual, dropout_p, seed):
    _backend.log_kernel(_OP, "reference")
    return _ref.swish_dropout_residual(x, residual, dropout_p, _dropout.reference_keep(seed, x.shape, dropout_p))


@_library.custom_op("pcops::swish_dropout_residual", mutates_args=(), device_types="cpu")
def _swish_dropout_residual(
    x: torch.Tensor, residual: torch.Tensor, dropout_p: float, seed: torch.Tensor | None, backend: str = "auto"
) -> torch.Tensor:
    _resolve(backend, x)  # "triton" on CPU tensors raises
    return _reference(x, residual, dropout_p, seed)


@_swish_dropout_residual.register_kernel("cuda")
def _swish_dropout_residual_cuda(x, residual, dropout_p, seed, backend="auto"):
    if _resolve(backend, x) == "reference":
        return _reference(x, residual, dropout_p, seed)
    from .triton import swish_dropout_residual as impl

    _backend.log_kernel(_OP, "_swish_dropout_residual_kernel")
    return impl.swish_dropout_residual(x, residual, dropout_p, seed)


@_swish_dropout_residual.register_fake
def _swish_dropout_residual_fake(x, residual, dropout_p, seed, backend="auto"):
    torch._check(residual.shape == x.shape, lambda: "residual: expected the shape of x")
    return torch.empty_like(x)


def _reference_backward(grad, x, dropout_p, seed):
    _backend.log_kernel("swish_dropout_backward", "reference")
    return _ref.swish_dropout_backward(grad, x, dropout_p, _dropout.reference_keep(seed, x.shape, dropout_p))


@_library.custom_op("pcops::swish_dropout_backward", mutates_args=(), device_types="cpu")
def _swish_dropout_backward(
    grad: torch.Tensor, x: torch.Tensor, dropout_p: float, seed: torch.Tensor | None, backend: str = "auto"
) -> torch.Tensor:
    _resolve(backend, x)
    return _reference_backward(grad, x, dropout_p, seed)


@_swish_dropout_backward.register_kernel("cuda")
def _swish_dropout_backward_cuda(grad, x, dropout_p, seed, backend="auto"):
    if _resolve(backend, x) == "reference":
        return _reference_backward(grad, x, dropout_p, seed)
    from .triton import swish_dropout_residual as impl

    _backend.log_kernel("swish_dropout_backward", "_swish_dropout_bwd_kernel")
    return impl.swish_dropout_backward(grad, x, dropout_p, seed)


@_swish_dropout_backward.register_fake
def _swish_dropout_backward_fake(grad, x, dropout_p, seed, backend="auto"):
    torch._check(grad.shape == x.shape, lambda: "grad: expected the shape of x")
    return torch.empty_like(x)


def _swish_setup_context(ctx, inputs, output):
    x, _residual, dropout_p, seed, backend = inputs
    ctx.save_for_backward(x, seed)
    ctx.dropout_p = dropout_p
    ctx.backend = backend


def _swish_backward(ctx, grad):
    x, seed = ctx.saved_tensors
    dx = _library.call(
        torch.ops.pcops.swish_dropout_backward.default, grad.contiguous(), x, ctx.dropout_p, seed, ctx.backend
    )
    return dx, grad, None, None, None


_swish_dropout_residual.register_autograd(_swish_backward, setup_context=_swish_setup_context)
