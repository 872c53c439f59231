"""Training-mode batch norm over the valid rows of a padded feature matrix (the static form of
``pcops.nn``'s sparse tensors, whose padding rows must not enter the statistics).

Contract: :func:`masked_batch_norm` (checks) → ``torch.ops.pcops.masked_batch_norm`` → the
implementation ``backend`` resolves to (``pcops._backend``: the reference on the CPU and for
float64, Triton on CUDA); registered backward ``torch.ops.pcops.masked_batch_norm_backward``; fake
functions for ``torch.compile`` and CUDA graphs.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _backend, _checks, _library
from .reference import masked_batch_norm as _ref

__all__ = ["masked_batch_norm"]

_OP = "masked_batch_norm"
_SUPPORTED = ("auto", "triton", "reference")


def masked_batch_norm(
    x: torch.Tensor,
    valid: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch norm with the statistics of the ``valid`` rows: ``y = (x − mean) / sqrt(var + eps) ·
    weight + bias`` for every row, ``mean`` and the biased ``var`` over the valid rows only.

    Args:
        x: ``(N, C)`` float32/float16/bfloat16 (float64 with the reference).
        valid: ``(N,)`` bool, the rows that enter the statistics (padding rows are still
            normalised: their outputs are defined, and gradients flow through them).
        weight, bias: optional ``(C,)`` affine parameters, any float dtype.
        eps: added to the variance.
        backend: ``"auto"`` (default: Triton on CUDA, the reference on the CPU and for float64),
            ``"triton"`` (CUDA tensors only) or ``"reference"`` (plain torch, any device).

    Returns:
        ``(y, mean, var)``: ``y`` of ``x.dtype``; ``mean``/``var`` ``(C,)`` float32 (float64 for
        float64 ``x``), the batch statistics, for a running-statistics update (they carry no
        gradient: only ``y`` is differentiable). With no valid row the statistics are 0.

    Example:
        >>> x = torch.tensor([[1.0], [3.0], [100.0]])
        >>> y, mean, var = pcops.masked_batch_norm(x, torch.tensor([True, True, False]))
        >>> y[:2].flatten(), mean, var
        (tensor([-1.0000,  1.0000]), tensor([2.]), tensor([1.]))

    Statistics in float32, summed over fixed chunks of rows: deterministic. Non-finite inputs
    propagate (a NaN in a valid row makes that column's statistics NaN). On CUDA 5 Triton
    launches forward and 3 backward, no other kernel, no host sync.
    Gradients with respect to ``x``, ``weight`` and ``bias``; no double backward.
    """
    _backend.check(backend, _OP, _SUPPORTED)
    _checks.check_tensor("x", x, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    _checks.check_tensor("valid", valid, dtypes=(torch.bool,), ndim=1)
    if valid.shape[0] != x.shape[0]:
        raise ValueError(f"valid: expected shape ({x.shape[0]},) (one per row of x), got {tuple(valid.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _checks.check_tensor(name, t, dtypes=_checks.FLOAT_DTYPES, ndim=1)
            if t.shape[0] != x.shape[1]:
                raise ValueError(f"{name}: expected shape ({x.shape[1]},), got {tuple(t.shape)}")
    _checks.check_same_device(x=x, valid=valid, weight=weight, bias=bias)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps: expected a number ≥ 0, got {eps!r}")
    chosen = _backend.resolve(backend, _OP, x, supported=_SUPPORTED)
    _backend.refuse_float64(chosen, x, "x")
    y, mean, var, _ = _library.call(
        torch.ops.pcops.masked_batch_norm.default, x.contiguous(), valid.contiguous(), weight, bias, float(eps), backend
    )
    return y, mean, var


def _impl(backend: str, x: torch.Tensor) -> str:
    impl = _backend.resolve(backend, _OP, x, supported=_SUPPORTED)
    return "triton" if impl == "triton" and x.dtype != torch.float64 else "reference"


@_library.custom_op("pcops::masked_batch_norm", mutates_args=(), device_types=("cpu", "cuda"))
def _masked_batch_norm(
    x: torch.Tensor,
    valid: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # (y, mean, var, count of valid rows): the public function drops the count
    impl = _impl(backend, x)
    _backend.log_kernel(_OP, impl)
    if impl == "triton":
        from .triton import masked_batch_norm as tri

        return tri.masked_batch_norm(x, valid, weight, bias, eps)
    return _ref.masked_batch_norm(x, valid, weight, bias, eps)


@_masked_batch_norm.register_fake
def _masked_batch_norm_fake(x, valid, weight, bias, eps, backend="auto"):
    c, dt = x.shape[1], _ref._acc(x)
    return torch.empty_like(x), x.new_empty((c,), dtype=dt), x.new_empty((c,), dtype=dt), x.new_empty((), dtype=dt)


@_library.custom_op("pcops::masked_batch_norm_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _masked_batch_norm_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    valid: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    var: torch.Tensor,
    count: torch.Tensor,
    eps: float,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = _impl(backend, x)
    _backend.log_kernel(_OP + "_backward", impl)
    if impl == "triton":
        from .triton import masked_batch_norm as tri

        return tri.masked_batch_norm_backward(grad_y, x, valid, weight, mean, var, count, eps)
    return _ref.masked_batch_norm_backward(grad_y, x, valid, weight, mean, var, count, eps)


@_masked_batch_norm_backward.register_fake
def _masked_batch_norm_backward_fake(grad_y, x, valid, weight, mean, var, count, eps, backend="auto"):
    c, dt = x.shape[1], _ref._acc(x)
    return torch.empty_like(x), x.new_empty((c,), dtype=dt), x.new_empty((c,), dtype=dt)


def _setup_context(ctx, inputs, output):
    x, valid, weight, bias, eps, backend = inputs
    _, mean, var, count = output
    ctx.save_for_backward(x, valid, weight, mean, var, count)
    ctx.eps, ctx.backend = eps, backend
    ctx.weight_dtype = weight.dtype if weight is not None else None
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, grad_y, grad_mean, grad_var, grad_count):
    x, valid, weight, mean, var, count = ctx.saved_tensors
    dx, dw, db = _library.call(
        torch.ops.pcops.masked_batch_norm_backward.default,
        grad_y.contiguous(),
        x,
        valid,
        weight,
        mean,
        var,
        count,
        ctx.eps,
        ctx.backend,
    )
    dw = dw.to(ctx.weight_dtype) if ctx.weight_dtype is not None else None
    db = db.to(ctx.bias_dtype) if ctx.bias_dtype is not None else None
    return dx, None, dw, db, None, None


_masked_batch_norm.register_autograd(_backward, setup_context=_setup_context)
