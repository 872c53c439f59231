"""Fused kernels for point-transformer blocks: LayerNorm+GELU(+dropout), Swish+dropout+residual,
and softmax over CSR rows (attention over variable-size neighbourhoods).

Each op: public function (checks, docstring) → ``torch.ops.pcops.<op>`` → the reference on the
CPU, Triton (or CUDA C++ for the CSR softmax) on CUDA; a fake function for ``torch.compile``;
a backward that is itself a custom op with the same CPU/CUDA split.

Dropout and randomness: the GPU kernels draw the keep-mask with Philox (``tl.rand(seed, i)``
for flat element ``i``), so the backward regenerates the mask from the seed instead of storing
it. The seed is one int64 drawn per call from ``generator`` (default: the default generator of
the input's device) with ``torch.randint`` on that generator's device, i.e. a tiny device-side
draw for a CUDA generator (no host synchronisation) or a host draw for a CPU generator (no GPU
synchronisation either; the 8-byte value is copied to the device asynchronously). CUDA graphs:
with a CUDA generator (the default) the draw is captured like any torch RNG op and every replay
gets a fresh seed, so training-mode dropout is graph-safe; a CPU generator is not (its draw is
a host operation that a graph cannot replay). The CPU path draws its mask from a CPU generator
seeded with the same seed, so the CPU and GPU masks differ; each is reproducible.
"""
from __future__ import annotations

import torch

from . import _checks
from .reference import fused as _ref

__all__ = ["fused_layer_norm_gelu", "fused_swish_dropout_residual", "sparse_softmax"]

_APPROXIMATE = ("tanh", "none")
_BACKENDS = ("triton", "cuda")
_SEED_HIGH = 2**63 - 1


def _draw_seed(device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """One Philox seed ``(1,)`` int64 on ``device``, drawn once per call (see the module docstring)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    gen_device = generator.device if generator is not None else device
    seed = torch.randint(0, _SEED_HIGH, (1,), dtype=torch.int64, device=gen_device, generator=generator)
    # host → device copies of 8 bytes need no wait; a device → host copy must complete before use
    return seed.to(device, non_blocking=device.type == "cuda")


def _check_p(dropout_p) -> float:
    return _checks.check_float("dropout_p", dropout_p, min_value=0.0, max_value=1.0, max_open=True)


def _check_training(training) -> bool:
    if not isinstance(training, bool):
        raise TypeError(f"training: expected a bool, got {type(training).__name__}")
    return training


def fused_layer_norm_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    approximate: str = "tanh",
    dropout_p: float = 0.0,
    training: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``dropout(gelu(layer_norm(x, (N,), weight, bias, eps)))`` in one pass over ``x``.

    The MLP block of point transformers (PCT, Point Transformer) in a single kernel: LayerNorm
    (Ba et al., 2016) over the last dimension, GELU (Hendrycks & Gimpel, 2016), then inverted
    dropout (Srivastava et al., 2014) when ``training`` and ``dropout_p > 0``.

    Args:
        x: ``(..., N)`` float32/float16/bfloat16 (float64 runs the plain-torch composition on
            every device), any leading shape, ``N ≥ 1``.
        weight, bias: ``(N,)`` float tensors on ``x``'s device (their dtype may differ from
            ``x``'s, e.g. float32 parameters with bfloat16 activations).
        eps: added to the biased variance, > 0.
        approximate: ``"tanh"`` (default; the tanh form of GELU) or ``"none"`` (exact, erf).
        dropout_p: drop probability in [0, 1); kept values are scaled by ``1 / (1 - p)``.
        training: dropout applies only when True (as ``F.dropout``).
        generator: source of the dropout seed (default: the default generator of ``x``'s device).

    Returns:
        ``(..., N)`` of ``x.dtype``. Statistics are computed in float32 (two-pass variance).
        With ``dropout_p=0`` or ``training=False`` this is exactly ``F.gelu(F.layer_norm(x),
        approximate)`` up to float32 rounding — except that on CUDA a bfloat16 or float16 ``x``
        with ``approximate="tanh"`` takes the tanh from the hardware (``tanh.approx.f32``,
        relative error ≈ 2^-11: about one float16 rounding, below a bfloat16 one), as does the
        bfloat16 backward (``pcops.triton.fused.FAST_TANH_FWD_DTYPES`` / ``FAST_TANH_BWD_DTYPES``).

    Gradient: exact w.r.t. ``x``, ``weight`` and ``bias`` (the GELU derivative and the full
    LayerNorm derivative), the dropout mask regenerated from the seed. ``dweight``/``dbias`` are
    reduced over rows in two fixed-order stages: deterministic, no atomics. No host
    synchronisation on the GPU (forward: 1 launch, +1 for the seed with dropout; backward: 2,
    the backward kernel and the column sum; nothing for the unused mean/rstd gradients).
    """
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
    dropout_p = _check_p(dropout_p)
    training = _check_training(training)
    seed = _draw_seed(x.device, generator) if training and dropout_p > 0 else None
    x2 = x.reshape(-1, n).contiguous()
    y, _, _ = torch.ops.pcops.layer_norm_gelu(
        x2, weight.contiguous(), bias.contiguous(), eps, approximate, dropout_p, seed
    )
    return y.view(x.shape)


def fused_swish_dropout_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    dropout_p: float,
    training: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``dropout(x · sigmoid(x)) + residual`` in one elementwise pass (Swish/SiLU, Ramachandran et al., 2017).

    Args:
        x: any shape, float32/float16/bfloat16 (float64: plain torch).
        residual: same shape, dtype and device as ``x``.
        dropout_p: drop probability in [0, 1) (kept values scaled by ``1 / (1 - p)``).
        training: dropout applies only when True.
        generator: source of the dropout seed (see the module docstring).

    Returns:
        a tensor like ``x``. Gradient w.r.t. ``x`` (``g·m/(1-p)·s·(1 + x(1 - s))``, the mask
        regenerated from the seed) and ``residual`` (``g``). No host synchronisation.
    """
    _checks.check_tensor("x", x, dtypes=_checks.FLOAT_DTYPES)
    _checks.check_tensor("residual", residual, dtypes=(x.dtype,))
    if residual.shape != x.shape:
        raise ValueError(f"residual: expected shape {tuple(x.shape)} (the shape of x), got {tuple(residual.shape)}")
    _checks.check_same_device(x=x, residual=residual)
    dropout_p = _check_p(dropout_p)
    training = _check_training(training)
    seed = _draw_seed(x.device, generator) if training and dropout_p > 0 else None
    return torch.ops.pcops.swish_dropout_residual(x.contiguous(), residual.contiguous(), dropout_p, seed)


def _check_crow(crow: torch.Tensor, nnz: int) -> None:
    if crow[0] != 0:
        raise ValueError(f"crow_indices: expected crow_indices[0] == 0, got {int(crow[0])}")
    if int(crow[-1]) != nnz:
        raise ValueError(f"crow_indices: expected crow_indices[-1] == nnz == {nnz}, got {int(crow[-1])}")
    if crow.numel() > 1 and bool((crow[1:] < crow[:-1]).any()):
        i = int((crow[1:] < crow[:-1]).nonzero()[0, 0])
        raise ValueError(
            f"crow_indices: expected a non-decreasing sequence, got crow_indices[{i}] = {int(crow[i])} > "
            f"crow_indices[{i + 1}] = {int(crow[i + 1])}"
        )


def sparse_softmax(
    values: torch.Tensor,
    crow_indices: torch.Tensor | None = None,
    *,
    backend: str = "triton",
    validate: bool | None = None,
) -> torch.Tensor:
    """Softmax over the stored values of each CSR row (attention over variable-size neighbourhoods).

    ``y[j] = exp(v[j] - max_row) / Σ_row exp(v[k] - max_row)`` for the entries ``j`` of a row,
    as ``torch.sparse.softmax`` over the stored entries (unstored entries are absent, not zero).

    Args:
        values: ``(nnz,)`` float32/float16/bfloat16 (float64: plain torch on every device), or a
            2-D ``torch.sparse_csr_tensor`` (then ``crow_indices`` must be None).
        crow_indices: ``(rows + 1,)`` int32/int64 CSR row pointers: ``crow[0] == 0``,
            non-decreasing, ``crow[-1] == nnz``. Empty rows are allowed.
        backend: the CUDA implementation: ``"triton"`` (default) or ``"cuda"`` (CUDA C++ from
            ``csrc/sparse_softmax.cu``, NVRTC). Both give each row a group of 4-32 lanes sized
            from the mean row length (no host sync), several short rows per warp, the row in
            registers up to 32-128 entries (Q1's lengths 1..64: 8 lanes × 8 entries, 4 rows per
            warp); longer rows loop over chunks (Triton) or go to the whole block (CUDA C++).
            Ignored on the CPU.
        validate: check ``crow_indices``. Default: on the CPU only; on CUDA the check needs a
            host synchronisation, so it runs only when asked (the kernels clamp row ranges to
            ``[0, nnz]``, so an invalid ``crow`` never reads or writes out of bounds).

    Returns:
        ``(nnz,)`` like ``values`` (or a CSR tensor with the same structure). Stored −inf values
        give 0; a row whose values are all −inf gives zeros, not NaN. Numerically stable (the
        row max is subtracted); accumulation in float32.

    Gradient: w.r.t. ``values``, ``dx = y · (g - Σ_row g·y)`` (not through the CSR-tensor form).
    No host synchronisation on the GPU (1 launch forward, 1 backward).
    """
    if isinstance(values, torch.Tensor) and values.layout == torch.sparse_csr:
        if crow_indices is not None:
            raise ValueError("crow_indices: expected None when values is a sparse CSR tensor")
        if values.dim() != 2:
            raise ValueError(f"values: expected a 2-D sparse CSR tensor, got shape {tuple(values.shape)}")
        crow, col = values.crow_indices(), values.col_indices()
        y = sparse_softmax(values.values(), crow, backend=backend, validate=validate)
        return torch.sparse_csr_tensor(crow, col, y, values.shape, check_invariants=False)
    _checks.check_tensor("values", values, dtypes=_checks.FLOAT_DTYPES, ndim=1)
    if crow_indices is None:
        raise TypeError("crow_indices: expected a tensor (values is not a sparse CSR tensor)")
    _checks.check_tensor("crow_indices", crow_indices, dtypes=_checks.INT_DTYPES, ndim=1)
    if crow_indices.numel() < 1:
        raise ValueError("crow_indices: expected at least one entry (rows + 1), got an empty tensor")
    _checks.check_same_device(values=values, crow_indices=crow_indices)
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {_BACKENDS}, got {backend!r}")
    if validate is None:
        validate = crow_indices.device.type == "cpu"
    if validate:
        _check_crow(crow_indices, values.numel())
    return torch.ops.pcops.sparse_softmax(values.contiguous(), crow_indices.contiguous(), backend)


# --- registration: LayerNorm+GELU ---------------------------------------------------------


def _ref_keep(seed, shape, p):
    return None if seed is None else _ref.dropout_keep_mask(int(seed[0]), shape, p, device=seed.device)


@torch.library.custom_op("pcops::layer_norm_gelu", mutates_args=(), device_types="cpu")
def _layer_norm_gelu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, approximate: str,
    dropout_p: float, seed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _ref.layer_norm_gelu(x, weight, bias, eps, approximate, dropout_p, _ref_keep(seed, x.shape, dropout_p))


@_layer_norm_gelu.register_kernel("cuda")
def _layer_norm_gelu_cuda(x, weight, bias, eps, approximate, dropout_p, seed):
    if x.dtype == torch.float64:  # debugging dtype: plain torch (the mask costs a host read of the seed)
        return _ref.layer_norm_gelu(x, weight, bias, eps, approximate, dropout_p, _ref_keep(seed, x.shape, dropout_p))
    from .triton import fused as impl

    return impl.layer_norm_gelu(x, weight, bias, eps, approximate, dropout_p, seed)


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@_layer_norm_gelu.register_fake
def _layer_norm_gelu_fake(x, weight, bias, eps, approximate, dropout_p, seed):
    torch._check(x.dim() == 2, lambda: "x: expected a 2-D (rows, N) tensor")
    torch._check(weight.shape == (x.shape[1],), lambda: "weight: expected shape (N,)")
    torch._check(bias.shape == (x.shape[1],), lambda: "bias: expected shape (N,)")
    rows = x.shape[0]
    return torch.empty_like(x), x.new_empty((rows,), dtype=_stat_dtype(x)), x.new_empty((rows,), dtype=_stat_dtype(x))


@torch.library.custom_op("pcops::layer_norm_gelu_backward", mutates_args=(), device_types="cpu")
def _layer_norm_gelu_backward(
    grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor,
    rstd: torch.Tensor, approximate: str, dropout_p: float, seed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    keep = _ref_keep(seed, x.shape, dropout_p)
    return _ref.layer_norm_gelu_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, keep)


@_layer_norm_gelu_backward.register_kernel("cuda")
def _layer_norm_gelu_backward_cuda(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed):
    if x.dtype == torch.float64:
        keep = _ref_keep(seed, x.shape, dropout_p)
        return _ref.layer_norm_gelu_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, keep)
    from .triton import fused as impl

    return impl.layer_norm_gelu_backward(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed)


@_layer_norm_gelu_backward.register_fake
def _layer_norm_gelu_backward_fake(grad_y, x, weight, bias, mean, rstd, approximate, dropout_p, seed):
    torch._check(grad_y.shape == x.shape, lambda: "grad_y: expected the shape of x")
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def _lng_setup_context(ctx, inputs, output):
    x, weight, bias, _eps, approximate, dropout_p, seed = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd, seed)
    ctx.approximate = approximate
    ctx.dropout_p = dropout_p
    ctx.mark_non_differentiable(mean, rstd)
    # mean/rstd never receive a gradient: without this autograd would fill two (rows,) zero
    # tensors (two extra launches per backward) only for the backward to ignore them
    ctx.set_materialize_grads(False)


def _lng_backward(ctx, grad_y, _grad_mean, _grad_rstd):
    if grad_y is None:  # y unused by the loss (possible now that grads are not materialised)
        return None, None, None, None, None, None, None
    x, weight, bias, mean, rstd, seed = ctx.saved_tensors
    dx, dweight, dbias = torch.ops.pcops.layer_norm_gelu_backward(
        grad_y.contiguous(), x, weight, bias, mean, rstd, ctx.approximate, ctx.dropout_p, seed
    )
    return dx, dweight, dbias, None, None, None, None


_layer_norm_gelu.register_autograd(_lng_backward, setup_context=_lng_setup_context)


# --- registration: Swish+dropout+residual -------------------------------------------------


@torch.library.custom_op("pcops::swish_dropout_residual", mutates_args=(), device_types="cpu")
def _swish_dropout_residual(
    x: torch.Tensor, residual: torch.Tensor, dropout_p: float, seed: torch.Tensor | None
) -> torch.Tensor:
    return _ref.swish_dropout_residual(x, residual, dropout_p, _ref_keep(seed, x.shape, dropout_p))


@_swish_dropout_residual.register_kernel("cuda")
def _swish_dropout_residual_cuda(x, residual, dropout_p, seed):
    if x.dtype == torch.float64:
        return _ref.swish_dropout_residual(x, residual, dropout_p, _ref_keep(seed, x.shape, dropout_p))
    from .triton import fused as impl

    return impl.swish_dropout_residual(x, residual, dropout_p, seed)


@_swish_dropout_residual.register_fake
def _swish_dropout_residual_fake(x, residual, dropout_p, seed):
    torch._check(residual.shape == x.shape, lambda: "residual: expected the shape of x")
    return torch.empty_like(x)


@torch.library.custom_op("pcops::swish_dropout_backward", mutates_args=(), device_types="cpu")
def _swish_dropout_backward(grad: torch.Tensor, x: torch.Tensor, dropout_p: float, seed: torch.Tensor | None) -> torch.Tensor:
    return _ref.swish_dropout_backward(grad, x, dropout_p, _ref_keep(seed, x.shape, dropout_p))


@_swish_dropout_backward.register_kernel("cuda")
def _swish_dropout_backward_cuda(grad, x, dropout_p, seed):
    if x.dtype == torch.float64:
        return _ref.swish_dropout_backward(grad, x, dropout_p, _ref_keep(seed, x.shape, dropout_p))
    from .triton import fused as impl

    return impl.swish_dropout_backward(grad, x, dropout_p, seed)


@_swish_dropout_backward.register_fake
def _swish_dropout_backward_fake(grad, x, dropout_p, seed):
    torch._check(grad.shape == x.shape, lambda: "grad: expected the shape of x")
    return torch.empty_like(x)


def _swish_setup_context(ctx, inputs, output):
    x, _residual, dropout_p, seed = inputs
    ctx.save_for_backward(x, seed)
    ctx.dropout_p = dropout_p


def _swish_backward(ctx, grad):
    x, seed = ctx.saved_tensors
    dx = torch.ops.pcops.swish_dropout_backward(grad.contiguous(), x, ctx.dropout_p, seed)
    return dx, grad, None, None


_swish_dropout_residual.register_autograd(_swish_backward, setup_context=_swish_setup_context)


# --- registration: CSR softmax ------------------------------------------------------------


def _softmax_impl(backend: str):
    if backend == "cuda":
        from .cuda import sparse_softmax as impl
    else:
        from .triton import fused as impl
    return impl


@torch.library.custom_op("pcops::sparse_softmax", mutates_args=(), device_types="cpu")
def _sparse_softmax(values: torch.Tensor, crow_indices: torch.Tensor, backend: str) -> torch.Tensor:
    return _ref.sparse_softmax(values, crow_indices)


@_sparse_softmax.register_kernel("cuda")
def _sparse_softmax_cuda(values, crow_indices, backend):
    if values.dtype == torch.float64:  # plain torch (no host sync: scatter_reduce + index_add)
        return _ref.sparse_softmax(values, crow_indices)
    return _softmax_impl(backend).sparse_softmax(values, crow_indices)


@_sparse_softmax.register_fake
def _sparse_softmax_fake(values, crow_indices, backend):
    torch._check(values.dim() == 1, lambda: "values: expected a 1-D tensor")
    torch._check(crow_indices.dim() == 1, lambda: "crow_indices: expected a 1-D tensor")
    return torch.empty_like(values)


@torch.library.custom_op("pcops::sparse_softmax_backward", mutates_args=(), device_types="cpu")
def _sparse_softmax_backward(grad: torch.Tensor, out: torch.Tensor, crow_indices: torch.Tensor, backend: str) -> torch.Tensor:
    return _ref.sparse_softmax_backward(grad, out, crow_indices)


@_sparse_softmax_backward.register_kernel("cuda")
def _sparse_softmax_backward_cuda(grad, out, crow_indices, backend):
    if out.dtype == torch.float64:
        return _ref.sparse_softmax_backward(grad, out, crow_indices)
    return _softmax_impl(backend).sparse_softmax_backward(grad, out, crow_indices)


@_sparse_softmax_backward.register_fake
def _sparse_softmax_backward_fake(grad, out, crow_indices, backend):
    torch._check(grad.shape == out.shape, lambda: "grad: expected the shape of the output")
    return torch.empty_like(out)


def _softmax_setup_context(ctx, inputs, output):
    _values, crow_indices, backend = inputs
    ctx.save_for_backward(output, crow_indices)
    ctx.backend = backend


def _softmax_backward(ctx, grad):
    out, crow_indices = ctx.saved_tensors
    return torch.ops.pcops.sparse_softmax_backward(grad.contiguous(), out, crow_indices, ctx.backend), None, None


_sparse_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup_context)
