"""Convolution epilogue: bias + ReLU in one pass, optionally into a channel slice of a larger map.

PyTorch adds a convolution's bias with a broadcast ``add_`` that is not vectorised on
channels-last outputs, then ``relu_`` reads and writes the tensor again, and ``torch.cat`` copies
concatenated maps once more. Here a convolution runs without bias and one pass reads its output
once and writes ``relu(y + bias)`` in place, or straight into its slice of the concatenated map (so
no ``torch.cat``): the PointPillars backbone's epilogue.

Contract: :func:`bias_relu` (checks) → ``torch.ops.pcops.bias_relu`` (writes ``out`` in place) →
the implementation ``backend`` resolves to (``pcops._backend``: the reference on the CPU, Triton on
CUDA) → kernel; plus a fake function. Inference only (no backward).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _backend, _checks, _library
from .reference import epilogue as _ref

__all__ = ["bias_relu"]

_BACKENDS = ("auto", "triton", "reference")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def bias_relu(
    y: torch.Tensor,
    bias: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    channel_offset: int = 0,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``out[:, offset:offset + C] = relu(y + bias[:, None, None])`` in one pass.

    Args:
        y: ``(B, C, H, W)`` any strides (channels-last is the fast case), float32/float16/bfloat16
            (float64 with the reference).
        bias: ``(C,)``, a float dtype (added in float32).
        out: ``(B, C_total, H, W)``, any strides, with ``C_total ≥ channel_offset + C`` and the same
            ``B, H, W``; default ``y`` itself (in place).
        channel_offset: first channel of the slice of ``out`` to write, ``≥ 0``.
        backend: ``"auto"`` (default: Triton on CUDA; the reference on the CPU and for float64
            ``y``), ``"triton"`` (CUDA tensors only) or ``"reference"`` (any device).

    Returns:
        ``out``, written in place (computed in float32, rounded to ``out.dtype``). On CUDA one
        launch, no host sync.

    Example:
        >>> y = torch.tensor([[[[-1.0, 2.0]]]])  # (1, 1, 1, 2)
        >>> out = torch.zeros(1, 2, 1, 2)
        >>> pcops.bias_relu(y, torch.tensor([0.5]), out, channel_offset=1)[0, :, 0]
        tensor([[0.0000, 0.0000],
                [0.0000, 2.5000]])
    """
    _checks.check_tensor("y", y, dtypes=_DTYPES, ndim=4)
    _checks.check_tensor("bias", bias, dtypes=_DTYPES, ndim=1)
    if bias.shape[0] != y.shape[1]:
        raise ValueError(f"bias: expected shape ({y.shape[1]},) (one per channel of y), got {tuple(bias.shape)}")
    channel_offset = _checks.check_int("channel_offset", channel_offset, min_value=0)
    if out is None:
        out = y
    else:
        _checks.check_tensor("out", out, dtypes=_DTYPES, ndim=4)
    bsz, channels, height, width = y.shape
    if out.shape[0] != bsz or out.shape[2:] != y.shape[2:] or out.shape[1] < channel_offset + channels:
        raise ValueError(
            f"out: expected shape ({bsz}, >= {channel_offset + channels}, {height}, {width}) "
            f"(channel_offset + C channels, like y), got {tuple(out.shape)}"
        )
    _checks.check_same_device(y=y, bias=bias, out=out)
    _backend.resolve(backend, "bias_relu", y, supported=_BACKENDS)
    _library.call(torch.ops.pcops.bias_relu.default, y, bias, out, channel_offset, backend)
    return out


# --- registration -------------------------------------------------------------------------------


@_library.custom_op("pcops::bias_relu", mutates_args=("out",), device_types=("cpu", "cuda"))
def _bias_relu(y: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, channel_offset: int, backend: str) -> None:
    impl = _backend.resolve(backend, "bias_relu", y, supported=_BACKENDS)  # "auto" on CUDA: Triton
    impl = "reference" if impl == "cpu" else impl
    _backend.log_kernel("bias_relu", impl)
    if impl == "reference":
        _ref.bias_relu(y, bias, out, channel_offset)
        return
    from .triton import epilogue as tri

    tri.bias_relu(y, bias, out, channel_offset)


@_bias_relu.register_fake
def _bias_relu_fake(y, bias, out, channel_offset, backend):
    torch._check(y.dim() == 4 and out.dim() == 4, lambda: "y, out: expected 4-D tensors")
    torch._check(bias.shape[0] == y.shape[1], lambda: "bias: expected one value per channel of y")
    return None
