"""Bias + ReLU into a channel slice in plain PyTorch: the CPU path and the test oracle."""

from __future__ import annotations

import torch


def bias_relu(y: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, channel_offset: int) -> None:
    """``out[:, offset:offset + C] = relu(y + bias[:, None, None])`` in place, computed in float32
    (float64 for float64 ``y``) and rounded to ``out.dtype``."""
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    value = torch.relu(y.to(acc) + bias.to(acc)[:, None, None])
    out[:, channel_offset : channel_offset + y.shape[1]] = value.to(out.dtype)
