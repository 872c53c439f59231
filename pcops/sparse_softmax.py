"""Softmax over the stored values of each CSR row (attention over variable-size neighbourhoods).

Public function (checks, docstring) → ``torch.ops.pcops.sparse_softmax`` → the reference on the
CPU; on CUDA the Triton kernels (``pcops/triton/sparse_softmax.py``) or CUDA C++
(``csrc/sparse_softmax.cu``, ``backend="cuda"``); a fake function for ``torch.compile``; a
backward that is itself a custom op with the same split.
"""

from __future__ import annotations

import torch

from . import _backend, _checks, _library, _native
from .reference import sparse_softmax as _ref

__all__ = ["sparse_softmax"]

_OP = "sparse_softmax"


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
    backend: str = "auto",
    validate: bool | None = None,
) -> torch.Tensor:
    """Softmax over the stored values of each CSR row (attention over variable-size neighbourhoods).

    ``y[j] = exp(v[j] - max_row) / Σ_row exp(v[k] - max_row)`` for the entries ``j`` of a row,
    as ``torch.sparse.softmax`` over the stored entries (unstored entries are absent, not zero).

    Args:
        values: ``(nnz,)`` float32/float16/bfloat16/float64, or a 2-D ``torch.sparse_csr_tensor``
            (then ``crow_indices`` must be None).
        crow_indices: ``(rows + 1,)`` int32/int64 CSR row pointers: ``crow[0] == 0``,
            non-decreasing, ``crow[-1] == nnz``. Empty rows are allowed.
        backend: ``"auto"`` (default: Triton on CUDA, the reference on the CPU and for float64),
            ``"triton"``, ``"cuda"`` (CUDA C++ compiled with NVRTC; CUDA tensors and float32/16-bit
            values only) or ``"reference"`` (plain torch on any device). Both GPU kernels give
            each row a group of 4-32 lanes sized from the mean row length (no host sync), several
            short rows per warp, the row in registers up to 32-128 entries; longer rows loop over
            chunks (Triton) or go to the whole block (CUDA C++).
        validate: check ``crow_indices``. Default: on the CPU only; on CUDA the check needs a
            host synchronisation, so it runs only when asked (the kernels clamp row ranges to
            ``[0, nnz]``, so an invalid ``crow`` never reads or writes out of bounds).

    Returns:
        ``(nnz,)`` like ``values`` (or a CSR tensor with the same structure). Stored −inf values
        give 0; a row whose values are all −inf gives zeros, not NaN; a row holding a NaN or +inf
        value gives NaN in every entry, as ``torch.softmax`` (every backend). Numerically stable (the
        row max is subtracted); accumulation in float32 (float64 for float64).

    Gradient: w.r.t. ``values``, ``dx = y · (g - Σ_row g·y)`` (not through the CSR-tensor form).
    No host synchronisation on the GPU (1 launch forward, 1 backward).

    Host path: on CUDA (backend ``"auto"``/``"triton"``, ``validate`` off) the call is taken by the
    native host path (``pcops._native``: checks, allocation and launch in C++, the gradient a C++
    autograd node; once its build is loaded and the shape class has run once, its native call
    checked against the Python path's output), which launches the same kernel with the same
    arguments: the results are the same bits.

    Example:
        >>> crow = torch.tensor([0, 2, 2, 5])                  # rows of 2, 0 and 3 entries
        >>> y = pcops.sparse_softmax(torch.randn(5), crow)     # each row's entries sum to 1
    """
    compiling = torch.compiler.is_compiling()
    host = None if compiling else _native.serves(_OP)  # takes what it can (pcops._native)
    if host is not None:
        y = host.ss_forward(values, crow_indices, backend, validate)
        if y is not None:
            return y
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
    _backend.resolve(backend, _OP, values)  # early, named errors (the registered kernels resolve again)
    if validate is None:
        validate = crow_indices.device.type == "cpu"
    if validate:
        _check_crow(crow_indices, values.numel())
    y = _library.call(torch.ops.pcops.sparse_softmax.default, values.contiguous(), crow_indices.contiguous(), backend)
    if not compiling:  # (after a registration of this call's class: pcops._native.check)
        _native.check(_OP, lambda: _native.MODULE.ss_forward(values, crow_indices, backend, validate), y)
    return y


# --- registration -----------------------------------------------------------------------------


def _impl(backend: str, values: torch.Tensor):
    """The module that runs ``backend`` for ``values`` (the reference on the CPU and for float64)."""
    chosen = _backend.resolve(backend, _OP, values)
    _backend.refuse_float64(chosen, values, "values")
    if chosen == "cuda":
        from .cuda import sparse_softmax as impl
    elif chosen == "triton":
        from .triton import sparse_softmax as impl
    else:
        _backend.log_kernel(_OP, "reference")
        impl = _ref
    return impl


@_library.custom_op("pcops::sparse_softmax", mutates_args=(), device_types="cpu")
def _sparse_softmax(values: torch.Tensor, crow_indices: torch.Tensor, backend: str) -> torch.Tensor:
    return _impl(backend, values).sparse_softmax(values, crow_indices)


@_sparse_softmax.register_kernel("cuda")
def _sparse_softmax_cuda(values, crow_indices, backend):
    return _impl(backend, values).sparse_softmax(values, crow_indices)


@_sparse_softmax.register_fake
def _sparse_softmax_fake(values, crow_indices, backend):
    torch._check(values.dim() == 1, lambda: "values: expected a 1-D tensor")
    torch._check(crow_indices.dim() == 1, lambda: "crow_indices: expected a 1-D tensor")
    return torch.empty_like(values)


@_library.custom_op("pcops::sparse_softmax_backward", mutates_args=(), device_types="cpu")
def _sparse_softmax_backward(
    grad: torch.Tensor, out: torch.Tensor, crow_indices: torch.Tensor, backend: str
) -> torch.Tensor:
    return _impl(backend, out).sparse_softmax_backward(grad, out, crow_indices)


@_sparse_softmax_backward.register_kernel("cuda")
def _sparse_softmax_backward_cuda(grad, out, crow_indices, backend):
    return _impl(backend, out).sparse_softmax_backward(grad, out, crow_indices)


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
    return _backward_op(grad, out, crow_indices, ctx.backend), None, None


_sparse_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup_context)


def _backward_op(grad, out, crow_indices, backend):
    """The backward op: for the Python path's autograd node, and for the native path's where its
    kernel is not registered yet (or with ``create_graph``; the op then registers it)."""
    return _library.call(torch.ops.pcops.sparse_softmax_backward.default, grad.contiguous(), out, crow_indices, backend)


_native.on_load(lambda host: host.ss_init(_backward_op))
