"""Helpers of the fused references: the arithmetic dtype and the CPU path's dropout mask.

The GPU kernels draw their keep-mask with Triton's Philox (``tl.rand(seed, i)`` for flat element
``i``); plain torch cannot reproduce that stream, so the references take the mask as ``keep`` (a
bool tensor: the tests pass the mask the Triton kernels draw) or draw it from a CPU
``torch.Generator`` seeded with ``seed`` (``dropout_keep_mask``), which the backward regenerates
the same way. Same seed → same mask on one device; the CPU and GPU masks differ.
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics and arithmetic dtype: float64 for float64 inputs, float32 for the rest."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dropout_keep_mask(seed: int, shape, p: float, device="cpu") -> torch.Tensor:
    """The CPU path's keep-mask: ``uniform(0, 1) >= p`` drawn from a generator seeded with ``seed``."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return (torch.rand(shape, generator=g) >= p).to(device)
