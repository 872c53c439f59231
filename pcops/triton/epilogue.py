"""Triton kernel of ``pcops.bias_relu``: bias + ReLU in one pass, optionally written into a
channel slice of a concatenation buffer (the PointPillars backbone's convolution epilogue; see
``pcops.epilogue``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from . import _launch


@triton.jit
def _bias_relu_kernel(
    y_ptr,  # (B, C, H, W) input, any strides
    bias_ptr,  # (C,) same dtype as y or float32
    out_ptr,  # (B, C_out_total, H, W) output, any strides (may be y itself)
    num_pixels,  # B * H * W
    hw,  # H * W
    width,  # W
    channels,  # C
    channel_offset,  # first output channel of this slice
    ys_b,
    ys_c,
    ys_h,
    ys_w,  # input strides in elements
    os_b,
    os_c,
    os_h,
    os_w,  # output strides in elements
    BLOCK_P: tl.constexpr,  # pixels per program
    BLOCK_C: tl.constexpr,  # channels per program (power of two)
):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_p = p < num_pixels
    in_c = c < channels
    p64 = p.to(tl.int64)
    b = p64 // hw
    rem = p64 - b * hw
    h = rem // width
    w = rem - h * width
    c64 = c.to(tl.int64)
    mask = in_p[:, None] & in_c[None, :]
    src = y_ptr + (b * ys_b + h * ys_h + w * ys_w)[:, None] + (c64 * ys_c)[None, :]
    y = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + c, mask=in_c, other=0.0).to(tl.float32)
    out = tl.maximum(y + bias[None, :], 0.0)
    dst = out_ptr + (b * os_b + h * os_h + w * os_w)[:, None] + ((c64 + channel_offset) * os_c)[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mask)


def bias_relu(
    y: torch.Tensor, bias: torch.Tensor, out: torch.Tensor | None = None, channel_offset: int = 0
) -> torch.Tensor:
    """``out[:, offset:offset + C] = relu(y + bias[:, None, None])`` in one pass (one launch, no sync).

    Args:
        y: ``(B, C, H, W)`` any strides (channels-last is the fast case), float32/float16/bfloat16.
        bias: ``(C,)``.
        out: ``(B, C_total, H, W)`` with ``C_total >= offset + C``, same ``B, H, W``; default ``y``
            itself (in place).
        channel_offset: first channel of the slice of ``out`` to write.
    Returns:
        ``out``.

    The launcher of ``pcops.bias_relu`` (the registered op, with the argument checks, the CPU
    reference and ``torch.compile`` support); called directly it skips the dispatcher.
    """
    if y.dim() != 4 or bias.shape != (y.shape[1],):
        raise ValueError(f"y, bias: expected (B, C, H, W) and (C,), got {tuple(y.shape)} and {tuple(bias.shape)}")
    out = y if out is None else out
    bsz, channels, height, width = y.shape
    if (
        out.dim() != 4
        or out.shape[0] != bsz
        or out.shape[2:] != y.shape[2:]
        or out.shape[1] < channel_offset + channels
    ):
        raise ValueError(f"out: expected (B, >= {channel_offset + channels}, H, W) like y, got {tuple(out.shape)}")
    num_pixels = bsz * height * width
    if num_pixels == 0 or channels == 0:
        return out
    block_c = min(64, _launch.next_power_of_2(channels))
    block_p = max(16, 4096 // block_c)
    grid = (_launch.cdiv(num_pixels, block_p), _launch.cdiv(channels, block_c))
    _launch.launch(
        _bias_relu_kernel,
        grid,
        y,
        bias,
        out,
        num_pixels,
        height * width,
        width,
        channels,
        channel_offset,
        *y.stride(),
        *out.stride(),
        BLOCK_P=block_p,
        BLOCK_C=block_c,
        num_warps=4,
    )
    return out
