"""Launcher for ``csrc/pillar_scatter.cu`` (CUDA C++ compiled at run time with NVRTC)."""
from __future__ import annotations

import ctypes

import torch

from .._nvrtc import get_kernel

_THREADS = 256


def pillar_scatter(
    features: torch.Tensor, coords: torch.Tensor, batch_size: int, grid_h: int, grid_w: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``pcops.triton.pillar_scatter.pillar_scatter``; no host synchronisation.

    Args:
        features: ``(P, C)`` contiguous, any 2/4/8-byte float dtype.
        coords: ``(P, 4)`` int32 contiguous.
    Returns:
        ``(canvas (B, C, H, W), winner (B*H*W,) int32)``.
    """
    num_pillars, num_channels = features.shape
    hw = grid_h * grid_w
    winner = torch.full((batch_size * hw,), -1, dtype=torch.int32, device=features.device)
    canvas = torch.empty((batch_size, num_channels, grid_h, grid_w), dtype=features.dtype, device=features.device)
    if num_pillars:
        get_kernel("pillar_scatter.cu", "pillar_winner", features.device)(
            ((num_pillars + _THREADS - 1) // _THREADS,), (_THREADS,),
            [coords, winner, ctypes.c_int(num_pillars), ctypes.c_int(batch_size),
             ctypes.c_int(grid_h), ctypes.c_int(grid_w)],
        )
    if canvas.numel():
        name = f"pillar_canvas_b{features.element_size()}"
        if features.element_size() == 4 and num_channels % 4 == 0:
            name += "v"  # 16-byte row loads
        kernel = get_kernel("pillar_scatter.cu", name, features.device)
        kernel(
            ((hw + _THREADS - 1) // _THREADS, batch_size), (_THREADS,),
            [features, winner, canvas, ctypes.c_int(num_channels), ctypes.c_int(hw), ctypes.c_int(batch_size)],
        )
    return canvas, winner
