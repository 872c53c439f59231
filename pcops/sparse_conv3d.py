"""Sparse 3D convolution on a kernel map (``pcops.sparse_conv_kernel_map``): implicit GEMM on
the out-in table, deterministic forward and backward.

Call path: ``sparse_conv3d`` (checks) → ``torch.ops.pcops.sparse_conv3d`` → the implementation
``backend`` resolves to (``pcops._backend``): the reference (``pcops.reference.kernel_map``) on
the CPU and for float64, Triton (``pcops.triton.sparse_conv3d``) on CUDA; the registered backward
runs the forward's choice.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _backend, _checks, _library
from .kernel_map import KernelMap
from .reference import kernel_map as _ref

__all__ = ["sparse_conv3d"]

_OP = "sparse_conv3d"
_SUPPORTED = ("auto", "triton", "reference")


def sparse_conv3d(
    features: torch.Tensor,
    kernel_map: KernelMap,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    activation: Optional[str] = None,
    precision: str = "auto",
    backend: str = "auto",
) -> torch.Tensor:
    """Sparse 3D convolution with a kernel map: ``out[o] = bias + sum_k features[in(o, k)] @ weight[k]``.

    Args:
        features: ``(N, C_in)`` float32/float16/bfloat16/float64, one row per input voxel
            (the rows of the ``coords`` the map was built from).
        kernel_map: a ``KernelMap`` from ``sparse_conv_kernel_map`` (or ``KernelMap.inverse``).
        weight: ``(K, C_in, C_out)`` of ``features.dtype``, offset ``k = (kz * Ky + ky) * Kx + kx``
            (dense ``F.conv3d`` weight ``w`` maps to ``w.permute(2, 3, 4, 1, 0).reshape(K, C_in, C_out)``).
        bias: optional ``(C_out,)``.
        activation: None, or ``"relu"``: ``max(out, 0)`` applied in the GEMM's epilogue (no
            separate pass; the gradient is masked where the output is 0). With an eval-mode
            BatchNorm folded into ``weight`` and ``bias`` this is conv + BN + ReLU in one launch
            (``pcops.nn.fuse_for_inference`` does that for a whole network).
        precision: how the Triton GEMMs multiply float32 inputs (forward and backward; 16-bit
            inputs always use tensor cores with float32 accumulation): ``"auto"`` (default: TF32
            where ``torch.backends.cuda.matmul.allow_tf32`` is set, else IEEE), ``"ieee"`` (FMA,
            exact float32 products), ``"tf32"`` (tensor cores, 10-bit mantissas: about 1e-3
            relative error), ``"tf32x3"`` (each operand split into a TF32 high and low part,
            three tensor-core products: about float32's accuracy, 1e-6 relative, faster than
            IEEE (``benchmarks/NOTES.md``); results differ from IEEE's in the last bits). The
            reference path ignores it (torch's matmul).
        backend: ``"auto"`` (default: the Triton implicit GEMM on CUDA for float32/float16/
            bfloat16, the reference on the CPU and for float64), ``"triton"`` (CUDA tensors only;
            float64 raises ``TypeError``) or ``"reference"`` (plain torch, any device). There is no
            CUDA C++ implementation (``"cuda"`` raises ``ValueError``).

    Returns:
        ``(M, C_out)`` of ``features.dtype``, one row per ``kernel_map.out_coords`` row.

    Example:
        >>> coords = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.int32)
        >>> km = pcops.sparse_conv_kernel_map(coords, (1, 1, 2), kernel_size=(1, 1, 3), subm=True)
        >>> pcops.sparse_conv3d(torch.tensor([[1.0], [2.0]]), km, torch.ones(3, 1, 1))  # sum of neighbours
        tensor([[3.],
                [3.]])

    Implicit GEMM on ``out_in``, deterministic (bit-identical run to run: no atomics, sum orders
    fixed by the shapes), forward and backward (features: through the inverse table; weight:
    gathered rows ᵀ @ grad). Triton (``pcops.triton.sparse_conv3d``): a tile of output rows ×
    channels gathers its inputs offset by offset into tensor-core dots (float32 accumulation;
    float32 inputs as ``precision`` says), skipping offsets none of its rows uses; 1 launch
    forward, 3 backward plus the inverse table. Reference: gather ``(M, K_chunk, C_in)`` and one
    matmul per chunk of offsets.
    Gradients w.r.t. features, weight and bias; no double backward. No host synchronisation
    on CUDA.
    """
    _backend.check(backend, _OP, _SUPPORTED)
    act = _activation(activation)
    check_precision(precision)
    if not isinstance(kernel_map, KernelMap):
        raise TypeError(f"kernel_map: expected a KernelMap, got {type(kernel_map).__name__}")
    out_in = kernel_map.out_in
    _checks.check_tensor("features", features, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    _checks.check_tensor("weight", weight, dtypes=(features.dtype,), ndim=3)
    _checks.check_same_device(features=features, weight=weight, bias=bias, kernel_map=out_in)
    if weight.shape[0] != out_in.shape[1] or weight.shape[1] != features.shape[1]:
        raise ValueError(
            f"weight: expected shape (K={out_in.shape[1]}, C_in={features.shape[1]}, C_out), got {tuple(weight.shape)}"
        )
    if bias is not None:
        _checks.check_tensor("bias", bias, dtypes=(features.dtype,), ndim=1)
        if bias.shape[0] != weight.shape[2]:
            raise ValueError(f"bias: expected shape ({weight.shape[2]},), got {tuple(bias.shape)}")
    if (
        out_in.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and out_in.numel()
        and int(out_in.max()) >= features.shape[0]
    ):
        raise ValueError(
            f"features: the kernel map refers to input row {int(out_in.max())}, but features has "
            f"{features.shape[0]} rows"
        )
    chosen = _backend.resolve(backend, _OP, features, supported=_SUPPORTED)
    _backend.refuse_float64(chosen, features, "features")
    return _library.call(
        torch.ops.pcops.sparse_conv3d.default,
        features.contiguous(),
        weight.contiguous(),
        bias,
        out_in,
        backend,
        act,
        False,
        precision,
    )


PRECISIONS = ("auto", "ieee", "tf32", "tf32x3")


def check_precision(precision) -> str:
    """``precision`` checked against ``PRECISIONS``."""
    if not isinstance(precision, str):
        raise TypeError(f"precision: expected one of {PRECISIONS}, got {type(precision).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    return precision


_ACTIVATIONS = {None: "none", "none": "none", "relu": "relu"}


def _activation(activation) -> str:
    """The op's ``activation`` string (``"none"`` / ``"relu"``) for the public argument."""
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"activation: expected None or 'relu', got {type(activation).__name__}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected None or 'relu', got {activation!r}")
    return _ACTIVATIONS[activation]


# --- registration: one schema; ``backend`` picks the implementation (pcops._backend) -------------


def _impl(backend: str, features: torch.Tensor) -> str:
    impl = _backend.resolve(backend, _OP, features, supported=_SUPPORTED)
    return "reference" if impl == "cpu" else impl


@_library.custom_op("pcops::sparse_conv3d", mutates_args=(), device_types=("cpu", "cuda"))
def _sparse_conv3d(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_in: torch.Tensor,
    backend: str = "auto",
    activation: str = "none",
    symmetric: bool = False,
    precision: str = "auto",
) -> torch.Tensor:
    impl = _impl(backend, features)
    relu = _activation(activation) == "relu"
    check_precision(precision)
    _backend.log_kernel(_OP, impl)
    if impl == "triton":
        from .triton import sparse_conv3d as tri

        return tri.sparse_conv3d(features, weight, bias, out_in, relu, precision)
    return _ref.sparse_conv3d(features, weight, bias, out_in, relu=relu)


@_sparse_conv3d.register_fake
def _sparse_conv3d_fake(
    features, weight, bias, out_in, backend="auto", activation="none", symmetric=False, precision="auto"
):
    torch._check(features.dim() == 2 and weight.dim() == 3, lambda: "features (N, C_in), weight (K, C_in, C_out)")
    torch._check(weight.shape[0] == out_in.shape[1], lambda: "weight: expected K rows (one per kernel offset)")
    torch._check(weight.shape[1] == features.shape[1], lambda: "weight: expected C_in = features.shape[1]")
    return features.new_empty((out_in.shape[0], weight.shape[2]))


@_library.custom_op("pcops::sparse_conv3d_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _sparse_conv3d_backward(
    grad_out: torch.Tensor,
    features: torch.Tensor,
    weight: torch.Tensor,
    out_in: torch.Tensor,
    backend: str = "auto",
    symmetric: bool = False,
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = _impl(backend, features)
    _backend.log_kernel(_OP + "_backward", impl)
    if impl == "triton":
        from .triton import sparse_conv3d as tri

        return tri.sparse_conv3d_backward(grad_out, features, weight, out_in, symmetric, precision)
    return _ref.sparse_conv3d_backward(grad_out, features, weight, out_in, True, True)


@_sparse_conv3d_backward.register_fake
def _sparse_conv3d_backward_fake(grad_out, features, weight, out_in, backend="auto", symmetric=False, precision="auto"):
    return torch.empty_like(features), torch.empty_like(weight)


def _conv_setup_context(ctx, inputs, output):
    features, weight, bias, out_in, backend, activation, symmetric, precision = inputs
    ctx.relu = activation == "relu"
    ctx.symmetric = symmetric
    ctx.precision = precision
    ctx.save_for_backward(features, weight, out_in, output if ctx.relu else None)
    ctx.has_bias = bias is not None
    ctx.backend = backend


def _conv_backward(ctx, grad_out):
    features, weight, out_in, out = ctx.saved_tensors
    if ctx.relu:  # the epilogue's ReLU: no gradient where the output was clamped to 0
        grad_out = torch.where(out > 0, grad_out, torch.zeros((), dtype=grad_out.dtype, device=grad_out.device))
    grad_features, grad_weight = _library.call(
        torch.ops.pcops.sparse_conv3d_backward.default,
        grad_out.contiguous(),
        features,
        weight,
        out_in,
        ctx.backend,
        ctx.symmetric,
        ctx.precision,
    )
    grad_bias = grad_out.sum(0) if ctx.has_bias else None
    return grad_features, grad_weight, grad_bias, None, None, None, None, None


_sparse_conv3d.register_autograd(_conv_backward, setup_context=_conv_setup_context)
