"""Launcher for ``csrc/pillar_scatter.cu`` (CUDA C++ compiled at run time with NVRTC)."""

from __future__ import annotations

import ctypes

import torch

from .._nvrtc import get_kernel

_THREADS = 256
# 4-channel vectors per thread in the quad kernels (grid z = C / 4 / this): the fastest of the
# sweep in benchmarks/bench_pillar_scatter.py (benchmarks/NOTES.md, P1)
_VECS_PER_SLICE = 2


def _quads(tensor: torch.Tensor, num_channels: int, hw: int) -> bool:
    """The quad kernels apply: 4-byte elements, C % 4 == 0, H*W % 4 == 0, 16-byte aligned data."""
    return tensor.element_size() == 4 and num_channels % 4 == 0 and hw % 4 == 0 and tensor.data_ptr() % 16 == 0


def _quad_grid(hw: int, batch_size: int, num_channels: int, vecs_per_slice: int) -> tuple[int, int, int]:
    vecs = num_channels // 4
    return (-(-(hw // 4) // _THREADS), batch_size, -(-vecs // vecs_per_slice))


def pillar_scatter(
    features: torch.Tensor,
    coords: torch.Tensor,
    batch_size: int,
    grid_h: int,
    grid_w: int,
    *,
    vecs_per_slice: int = _VECS_PER_SLICE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``pcops.triton.pillar_scatter.pillar_scatter``; no host synchronisation.

    ``pillar_canvas_b4x4`` (4 cells per thread, 16-byte stores) where it applies (4-byte floats,
    C and H·W multiples of 4, 16-byte aligned), else one cell per thread per element size.

    Args:
        features: ``(P, C)`` contiguous, any 2/4/8-byte float dtype.
        coords: ``(P, 4)`` int32 contiguous.
        vecs_per_slice: 4-channel vectors per thread of the quad kernel (the benchmark sweeps it).
    Returns:
        ``(canvas (B, C, H, W), winner (B*H*W,) int32)``.
    """
    num_pillars, num_channels = features.shape
    hw = grid_h * grid_w
    winner = torch.full((batch_size * hw,), -1, dtype=torch.int32, device=features.device)
    canvas = torch.empty((batch_size, num_channels, grid_h, grid_w), dtype=features.dtype, device=features.device)
    if num_pillars:
        get_kernel("pillar_scatter.cu", "pillar_winner", features.device)(
            ((num_pillars + _THREADS - 1) // _THREADS,),
            (_THREADS,),
            [
                coords,
                winner,
                ctypes.c_int(num_pillars),
                ctypes.c_int(batch_size),
                ctypes.c_int(grid_h),
                ctypes.c_int(grid_w),
            ],
        )
    if canvas.numel():
        if _quads(features, num_channels, hw):
            get_kernel("pillar_scatter.cu", "pillar_canvas_b4x4", features.device)(
                _quad_grid(hw, batch_size, num_channels, vecs_per_slice),
                (_THREADS,),
                [features, winner, canvas, ctypes.c_int(num_channels), ctypes.c_int(hw), ctypes.c_int(vecs_per_slice)],
            )
            return canvas, winner
        kernel = get_kernel("pillar_scatter.cu", f"pillar_canvas_b{features.element_size()}", features.device)
        kernel(
            ((hw + _THREADS - 1) // _THREADS, batch_size),
            (_THREADS,),
            [features, winner, canvas, ctypes.c_int(num_channels), ctypes.c_int(hw), ctypes.c_int(batch_size)],
        )
    return canvas, winner


def gather_supported(canvas: torch.Tensor) -> bool:
    """``pillar_gather`` below handles this canvas: 4-byte floats, C and H·W multiples of 4, 16-byte
    aligned."""
    _, num_channels, grid_h, grid_w = canvas.shape
    return _quads(canvas, num_channels, grid_h * grid_w)


def pillar_gather(canvas: torch.Tensor, coords: torch.Tensor, winner: torch.Tensor) -> torch.Tensor:
    """Adjoint of the scatter, streaming over the canvas (``pillar_gather_b4x4``): ``(P, C)`` rows
    read at each pillar's cell, 0 where it does not own it. Needs ``gather_supported(canvas)``.

    Args:
        canvas: ``(B, C, H, W)`` contiguous 4-byte floats; coords: ``(P, 4)`` int32 (only P is
            used: the winner map says which pillar owns each cell); winner: ``(B*H*W,)`` int32.
    Two launches (zero fill of the output, the stream); no host synchronisation.
    """
    batch_size, num_channels, grid_h, grid_w = canvas.shape
    hw = grid_h * grid_w
    out = torch.zeros((coords.shape[0], num_channels), dtype=canvas.dtype, device=canvas.device)
    if out.numel() and canvas.numel():
        get_kernel("pillar_scatter.cu", "pillar_gather_b4x4", canvas.device)(
            _quad_grid(hw, batch_size, num_channels, _VECS_PER_SLICE),
            (_THREADS,),
            [canvas, winner, out, ctypes.c_int(num_channels), ctypes.c_int(hw), ctypes.c_int(_VECS_PER_SLICE)],
        )
    return out
