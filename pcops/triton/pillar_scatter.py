"""Triton kernels for pillar scatter (PointPillars' BEV pseudo-image) and its adjoint.

Three launches in the forward: fill the winner map with −1, one atomic_max per pillar into
the winner map (highest pillar index wins a cell: deterministic), then one pass over the
canvas that writes every element exactly once (zeros included), so the canvas needs no
separate memset. The canvas write (B·C·H·W elements) is the memory floor; the winner map
(B·H·W int32) is 1/C of it. The adjoint streams the canvas gradient in cell order (sequential
HBM pages) into each owner's row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from . import _launch

# The canvas pass's tile: the best of the steady sweep in benchmarks/bench_pillar_scatter.py
# (benchmarks/NOTES.md, P1). Cells per program: coalesced 16-byte stores along the cells.
_CANVAS_BLOCK_HW = 1024
# channels per inner step of the canvas pass (a 2-D [C, HW] tile)
_CANVAS_BLOCK_C = 4
# channels per program of the canvas pass (the grid's third axis slices the channels: more
# programs in flight for few cells)
_CANVAS_C_PER_PROGRAM = 8
# pillars per program in the winner pass
_PILLAR_BLOCK = 256


@triton.jit
def _pillar_cell(coords_ptr, p, live, batch_size, grid_h, grid_w):
    """``(batch, y, x, inside)`` of pillars ``p`` (``z`` is not needed); pillars outside the
    grid (or past the end: ``live`` false) are not ``inside`` and are skipped by every pass,
    so nothing is ever read or written out of bounds."""
    b = tl.load(coords_ptr + p * 4 + 0, mask=live, other=-1)
    y = tl.load(coords_ptr + p * 4 + 2, mask=live, other=-1)
    x = tl.load(coords_ptr + p * 4 + 3, mask=live, other=-1)
    inside = live & (b >= 0) & (b < batch_size) & (y >= 0) & (y < grid_h) & (x >= 0) & (x < grid_w)
    return b, y, x, inside


@triton.jit
def _pillar_winner_kernel(
    coords_ptr,  # (P, 4) int32 (batch, z, y, x), contiguous
    winner_ptr,  # (B*H*W,) int32, pre-filled with -1
    num_pillars,  # P
    batch_size,  # B
    grid_h,  # H
    grid_w,  # W
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    p = pid * BLOCK + tl.arange(0, BLOCK)
    live = p < num_pillars
    b, y, x, inside = _pillar_cell(coords_ptr, p, live, batch_size, grid_h, grid_w)
    cell = (b * grid_h + y) * grid_w + x
    # the highest pillar index wins a shared cell, whatever the order of the atomics
    tl.atomic_max(winner_ptr + cell, p, mask=inside)


@triton.jit
def _pillar_canvas_kernel(
    features_ptr,  # (P, C) contiguous
    winner_ptr,  # (B*H*W,) int32, -1 = empty cell
    canvas_ptr,  # (B, C, H, W) contiguous output
    num_channels,  # C
    hw,  # H*W
    BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr,
    C_PER_PROGRAM: tl.constexpr,  # channels per program (grid axis 2: ceil(C / C_PER_PROGRAM) slices)
):
    pid_hw = tl.program_id(0)
    b = tl.program_id(1)
    c_lo = tl.program_id(2) * C_PER_PROGRAM
    offs = pid_hw * BLOCK_HW + tl.arange(0, BLOCK_HW)
    in_hw = offs < hw
    owner = tl.load(winner_ptr + b * hw + offs, mask=in_hw, other=-1).to(tl.int64)
    has = owner >= 0
    canvas_base = canvas_ptr + b.to(tl.int64) * num_channels * hw
    # every canvas element is written once: the owner's feature or zero
    for c0 in range(0, C_PER_PROGRAM, BLOCK_C):
        ch = c_lo + c0 + tl.arange(0, BLOCK_C)
        in_c = ch < num_channels
        vals = tl.load(
            features_ptr + owner[None, :] * num_channels + ch[:, None],
            mask=in_c[:, None] & has[None, :],
            other=0.0,
        )
        tl.store(
            canvas_base + ch[:, None].to(tl.int64) * hw + offs[None, :],
            vals,
            mask=in_c[:, None] & in_hw[None, :],
        )


@triton.jit
def _pillar_gather_cells_kernel(
    canvas_ptr,  # (B, C, H, W) contiguous
    winner_ptr,  # (B*H*W,) int32
    out_ptr,  # (P, C) output, zero-filled
    num_channels,  # C
    hw,  # H*W
    BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr,
):
    """The adjoint streaming over the canvas: cells in order (sequential HBM pages), each owner's
    channels written into its row; pillars owning no cell keep the zero fill."""
    pid_hw = tl.program_id(0)
    b = tl.program_id(1)
    offs = pid_hw * BLOCK_HW + tl.arange(0, BLOCK_HW)
    in_hw = offs < hw
    owner = tl.load(winner_ptr + b * hw + offs, mask=in_hw, other=-1)
    has = owner >= 0
    row = owner.to(tl.int64) * num_channels
    base = b.to(tl.int64) * num_channels * hw
    for c0 in range(0, num_channels, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        m = has[None, :] & (ch < num_channels)[:, None]
        vals = tl.load(canvas_ptr + base + ch[:, None].to(tl.int64) * hw + offs[None, :], mask=m, other=0.0)
        tl.store(out_ptr + row[None, :] + ch[:, None], vals, mask=m)


def pillar_winner_map(coords: torch.Tensor, batch_size: int, grid_h: int, grid_w: int) -> torch.Tensor:
    """Winner map ``(B*H*W,)`` int32: the highest index of the pillars landing in each cell, −1 if none.

    Args:
        coords: ``(P, 4)`` int32 contiguous ``(batch, z, y, x)``; rows outside the grid are skipped.
    """
    winner = torch.full((batch_size * grid_h * grid_w,), -1, dtype=torch.int32, device=coords.device)
    num_pillars = coords.shape[0]
    if num_pillars:
        grid = (_launch.cdiv(num_pillars, _PILLAR_BLOCK),)
        _launch.launch(
            _pillar_winner_kernel, grid, coords, winner, num_pillars, batch_size, grid_h, grid_w, BLOCK=_PILLAR_BLOCK
        )
    return winner


def pillar_scatter(
    features: torch.Tensor,
    coords: torch.Tensor,
    batch_size: int,
    grid_h: int,
    grid_w: int,
    *,
    block_hw: int = _CANVAS_BLOCK_HW,
    block_c: int = _CANVAS_BLOCK_C,
    num_warps: int = 4,
    c_per_program: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter pillar features into a BEV canvas.

    Args:
        features: ``(P, C)`` float tensor, contiguous.
        coords: ``(P, 4)`` int32 ``(batch, z, y, x)``, contiguous.
        block_hw, block_c, num_warps: the canvas-pass tile (cells × channels) and warps; the
            defaults were picked by the sweep in ``benchmarks/bench_pillar_scatter.py``.
        c_per_program: channels per program (rounded up to a multiple of ``block_c``; more
            programs in flight for few cells); default ``_CANVAS_C_PER_PROGRAM``.
    Returns:
        ``(canvas (B, C, H, W), winner (B*H*W,) int32)``; no host synchronisation.
    """
    num_channels = features.shape[1]
    winner = pillar_winner_map(coords, batch_size, grid_h, grid_w)
    canvas = torch.empty((batch_size, num_channels, grid_h, grid_w), dtype=features.dtype, device=features.device)
    hw = grid_h * grid_w
    if canvas.numel():
        per = c_per_program or _CANVAS_C_PER_PROGRAM
        per = _launch.cdiv(per, block_c) * block_c
        grid = (_launch.cdiv(hw, block_hw), batch_size, _launch.cdiv(num_channels, per))
        _launch.launch(
            _pillar_canvas_kernel,
            grid,
            features,
            winner,
            canvas,
            num_channels,
            hw,
            BLOCK_C=block_c,
            BLOCK_HW=block_hw,
            C_PER_PROGRAM=per,
            num_warps=num_warps,
        )
    return canvas, winner


def pillar_gather(
    canvas: torch.Tensor, coords: torch.Tensor, winner: torch.Tensor, *, block_hw: int = 256, block_c: int = 16
) -> torch.Tensor:
    """Adjoint of ``pillar_scatter``: ``(P, C)`` rows read at each pillar's cell (0 where it does not own it).

    Args:
        canvas: ``(B, C, H, W)`` contiguous (e.g. the gradient of the canvas).
        coords: ``(P, 4)`` int32 (only ``P`` is used); winner: ``(B*H*W,)`` int32 from the forward.
        block_hw, block_c: the tile (cells × channels) of ``_pillar_gather_cells_kernel``, which
            reads the canvas in cell order into a zero-filled output.
    Two launches (the zero fill, the stream); no host synchronisation.
    """
    batch_size, num_channels, grid_h, grid_w = canvas.shape
    out = torch.zeros((coords.shape[0], num_channels), dtype=canvas.dtype, device=canvas.device)
    hw = grid_h * grid_w
    if out.numel() and canvas.numel():
        _launch.launch(
            _pillar_gather_cells_kernel,
            (_launch.cdiv(hw, block_hw), batch_size),
            canvas,
            winner,
            out,
            num_channels,
            hw,
            BLOCK_C=block_c,
            BLOCK_HW=block_hw,
        )
    return out
