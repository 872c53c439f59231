"""Fused LayerNorm + GELU (+ dropout): the MLP block of point transformers in one kernel.

Public function (checks, docstring) → ``torch.ops.pcops.layer_norm_gelu`` → the reference on the
CPU, Triton on CUDA (``pcops/triton/layer_norm_gelu.py``); a fake function for ``torch.compile``;
a backward that is itself a custom op (``pcops/triton/layer_norm_gelu_backward.py``). Dropout
seeds: ``pcops._dropout``.
"""

from __future__ import annotations

import torch

from . import _backend, _checks, _dropout, _library, _native
from .reference import layer_norm_gelu as _ref

__all__ = ["fused_layer_norm_gelu"]

_OP = "layer_norm_gelu"
_APPROXIMATE = ("tanh", "none")
_SUPPORTED = ("auto", "triton", "reference")


def fused_layer_norm_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    approximate: str = "tanh",
    dropout_p: float = 0.0,
    training: bool = False,
    generator: torch.Generator | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``dropout(gelu(layer_norm(x, (N,), weight, bias, eps)))`` in one pass over ``x``.

    The MLP block of point transformers (PCT, Point Transformer) in a single kernel: LayerNorm
    (Ba et al., 2016) over the last dimension, GELU (Hendrycks & Gimpel, 2016), then inverted
    dropout (Srivastava et al., 2014) when ``training`` and ``dropout_p > 0``.

    Args:
        x: ``(..., N)`` float32/float16/bfloat16/float64, any leading shape, ``N ≥ 1``.
        weight, bias: ``(N,)`` float tensors on ``x``'s device (their dtype may differ from
            ``x``'s, e.g. float32 parameters with bfloat16 activations).
        eps: added to the biased variance, > 0.
        approximate: ``"tanh"`` (default; the tanh form of GELU) or ``"none"`` (exact, erf).
        dropout_p: drop probability in [0, 1); kept values are scaled by ``1 / (1 - p)``.
        training: dropout applies only when True (as ``F.dropout``).
        generator: source of the dropout seed (default: the default generator of ``x``'s device).
        backend: ``"auto"`` (default: Triton on CUDA, the reference on the CPU and for float64),
            ``"triton"`` (CUDA tensors, not float64) or ``"reference"`` (plain torch on any
            device; its dropout mask comes from a CPU generator, and reading the seed syncs).
            There is no ``"cuda"`` (CUDA C++) implementation: it raises ``ValueError``.

    Returns:
        ``(..., N)`` of ``x.dtype``. Statistics are computed in float32 (two-pass variance).
        With ``dropout_p=0`` or ``training=False`` this is exactly ``F.gelu(F.layer_norm(x),
        approximate)`` up to float32 rounding — except that on CUDA a bfloat16 or float16 ``x``
        with ``approximate="tanh"`` takes the tanh from the hardware (``tanh.approx.f32``,
        relative error ≈ 2^-11: about one float16 rounding, below a bfloat16 one), as does the
        bfloat16 backward (``pcops.triton.layer_norm_gelu.FAST_TANH_FWD_DTYPES`` / ``FAST_TANH_BWD_DTYPES``).

    Gradient: exact w.r.t. ``x``, ``weight`` and ``bias`` (the GELU derivative and the full
    LayerNorm derivative), the dropout mask regenerated from the seed. ``dweight``/``dbias`` are
    reduced over rows in two fixed-order stages: deterministic, no atomics. No host
    synchronisation on the GPU (forward: 1 launch, +1 for the seed with dropout; backward: 2,
    the backward kernel and the column sum; nothing for the unused mean/rstd gradients).

    Host path: on CUDA, a call without dropout is taken by the native host path (``pcops._native``:
    checks, allocations and launches in C++, the gradient a C++ autograd node; once its build is
    loaded and the shape class has run once), which launches the same kernels with the same
    arguments: the results are the same bits.

    Example:
        >>> x = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16)
        >>> w, b = torch.ones(256, device="cuda"), torch.zeros(256, device="cuda")
        >>> y = pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.1, training=True)
    """
    host = None if torch.compiler.is_compiling() else _native.MODULE  # takes what it can (pcops._native)
    if host is not None:
        y = host.lng_forward(x, weight, bias, eps, approximate, dropout_p, training, backend)
        if y is not None:
            return y
    _checks.check_tensor("x", x, dtypes=_checks.FLOAT_DTYPES, min_last_dim=1)
    n = x.shape[-1]
    _checks.check_tensor("weight", weight, dtypes=_checks.FLOAT_DTYPES, ndim=1)
    _checks.check_tensor("bias", bias, dtypes=_checks.FLOAT_DTYPES, ndim=1)
    for name, t in (("weight", weight), ("bias", bias)):
        if t.shape[0] != n:
            raise ValueError(f"{name}: expected shape ({n},) (the last dimension of x), got {tuple(t.shape)}")
    _checks.check_same_device(x=x, weight=weight, bias=bias)
    eps = _checks.check_float("eps", eps, min_value=0.0, min_open=True)
    if approximate not in _APPROXIMATE:
        raise ValueError(f"approximate: expected one of {_APPROXIMATE}, got {approximate!r}")
    dropout_p = _dropout.check_p(dropout_p)
    training = _dropout.check_training(training)
    _resolve(backend, x)  # early, named errors (the registered kernels resolve again)
    seed = _dropout.draw_seed(x.device, generator) if training and dropout_p > 0 else None
    x2 = x.contiguous() if x.dim() == 2 else x.reshape(-1, n).contiguous()  # (2-D: no reshape / view)
    y, _, _ = _library.call(
        torch.ops.pcops.layer_norm_gelu.default,
        x2,
        weight.contiguous(),
        bias.contiguous(),
        eps,
        approximate,
        dropout_p,
        seed,
        backend,
    )
    return y if x.dim() == 2 else y.view(x.shape)


def _resolve(backend: str, x: torch.Tensor) -> str:
    """``"triton"`` or ``"reference"`` (which also serves ``"cpu"``: the op has no separate CPU path)."""
    chosen = _backend.resolve(backend, _OP, x, supported=_SUPPORTED)
    _backend.refuse_float64(chosen, x, "x")
    return "triton" if chosen == "triton" else "reference"


# --- registration ---------------------------------------------------------------------------


def _reference(x, weight, bias, eps, approximate, dropout_p, seed):
    _backend.log_kernel(_OP, "reference")  # (with dropout the mask costs a host read of the seed)
    keep = _dropout.reference_keep(seed, x.shape, dropout_p)
    return _ref.layer_norm_gelu(x, weight, bias, eps, approximate, dropout_p, keep)


@_library.custom_op("pcops::layer_norm_gelu", mutates_args=(), device_types="cpu")
def _layer_norm_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    approximate: str,
    dropout_p: float,
    seed: torch.Tensor | None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _resolve(backend, x)  # "triton" on CPU tensors raises
    return _reference(x, weight, bias, eps, approximate, dropout_p, seed)


@_layer_norm_gelu.register_kernel("cuda")
def _layer_norm_gelu_cuda(x, weight, bias, eps, approximate, dropout_p, seed, backend="auto"):
    if _resolve(backend, x) == "reference":
        return _reference(x, weight, bias, eps, approximate, dropout_p, seed)
    from .triton import layer_norm_gelu as impl

    return impl.layer_norm_gelu(x, weight, bias, eps, approximate, dropout_p, seed)


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@_layer_norm_gelu.register_fake
def _layer_norm_gelu_fake(x, weight, bias, eps, approximate, dropout_p, seed, backend="auto"):
    torch._check(x.dim() == 2, lambda: "x: expected a 2-D (rows, N) tensor")
    torch._check(weight.shape == (x.shape[1],), lambda: "weight: expected shape (N,)")
    torch._check(bias.shape == (x.shape[1],), lambda: "bias: expected shape (N,)")
    rows = x.shape[0]
    return torch.empty_like(x), x.new_empty((rows,), dtype=_stat_dtype(x)), x.new_empty((rows,), dtype=_stat_dtype(x))


def _reference_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed):
    _backend.log_kernel("layer_norm_gelu_backward", "reference")
    keep = _dropout.reference_keep(seed, x.shape, dropout_p)
    return _ref.layer_norm_gelu_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, keep)


@_library.custom_op("pcops::layer_norm_gelu_backward", mutates_args=(), device_types="cpu")
def _layer_norm_gelu_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    approximate: str,
    dropout_p: float,
    seed: torch.Tensor | None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _resolve(backend, x)
    return _reference_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed)


@_layer_norm_gelu_backward.register_kernel("cuda")
def _layer_norm_gelu_backward_cuda(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed, backend="auto"):
    if _resolve(backend, x) == "reference":
        return _reference_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed)
    from .triton import layer_norm_gelu_backward as impl

    return impl.layer_norm_gelu_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed)


@_layer_norm_gelu_backward.register_fake
def _layer_norm_gelu_backward_fake(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed, backend="auto"):
    torch._check(grad_y.shape == x.shape, lambda: "grad_y: expected the shape of x")
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def _lng_setup_context(ctx, inputs, output):
    x, weight, bias, _eps, approximate, dropout_p, seed, backend = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd, seed)
    ctx.approximate = approximate
    ctx.dropout_p = dropout_p
    ctx.backend = backend
    ctx.mark_non_differentiable(mean, rstd)
    # mean/rstd never receive a gradient: without this autograd would fill two (rows,) zero
    # tensors (two extra launches per backward) only for the backward to ignore them
    ctx.set_materialize_grads(False)


def _lng_backward(ctx, grad_y, _grad_mean, _grad_rstd):
    if grad_y is None:  # y unused by the loss (possible now that grads are not materialised)
        return None, None, None, None, None, None, None, None
    x, weight, bias, mean, rstd, seed = ctx.saved_tensors
    dx, dweight, dbias = _backward_op(
        grad_y.contiguous(), x, weight, bias, mean, rstd, ctx.approximate, ctx.dropout_p, seed, ctx.backend
    )
    return dx, dweight, dbias, None, None, None, None, None


_layer_norm_gelu.register_autograd(_lng_backward, setup_context=_lng_setup_context)


def _backward_op(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed=None, backend="auto"):
    """The backward op: for the Python path's autograd node, and for the native path's where its
    kernels are not registered yet (or with ``create_graph``; the op then registers them)."""
    return _library.call(
        torch.ops.pcops.layer_norm_gelu_backward.default,
        grad_y,
        x,
        weight,
        bias,
        mean,
        rstd,
        approximate,
        dropout_p,
        seed,
        backend,
    )


_native.on_load(lambda host: host.lng_init(_backward_op))
