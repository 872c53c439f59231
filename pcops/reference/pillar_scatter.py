"""Pillar scatter in plain PyTorch: the CPU path and the test oracle.

Duplicates are resolved by a winner map: each BEV cell takes the pillar with the highest
index that lands on it (as if pillars were assigned in order, last write wins), so the
result is deterministic and the GPU path can reproduce it exactly.
"""

from __future__ import annotations

import torch


def pillar_winner_map(coords: torch.Tensor, batch_size: int, grid_h: int, grid_w: int) -> torch.Tensor:
    """Index of the pillar that owns each cell, ``(batch_size * H * W,)`` int32, −1 for none.

    Raises ``ValueError`` when a coordinate lies outside the grid (the CPU path checks; the GPU
    path skips such pillars instead, see ``pcops.pillar_scatter``).
    """
    b, y, x = coords[:, 0].long(), coords[:, 2].long(), coords[:, 3].long()
    bad = (b < 0) | (b >= batch_size) | (y < 0) | (y >= grid_h) | (x < 0) | (x >= grid_w)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"coords: row {i} = {coords[i].tolist()} lies outside batch_size={batch_size}, grid_hw=({grid_h}, {grid_w})"
        )
    lin = (b * grid_h + y) * grid_w + x
    winner = torch.full((batch_size * grid_h * grid_w,), -1, dtype=torch.int64, device=coords.device)
    winner.scatter_reduce_(0, lin, torch.arange(coords.shape[0], device=coords.device), reduce="amax")
    return winner.to(torch.int32)


def pillar_scatter(
    features: torch.Tensor, coords: torch.Tensor, batch_size: int, grid_h: int, grid_w: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(canvas (B, C, H, W), winner (B*H*W,) int32)``."""
    winner = pillar_winner_map(coords, batch_size, grid_h, grid_w)
    num_channels = features.shape[1]
    # cells × channels, gathered from the winning pillar (zero row for empty cells)
    padded = torch.cat([features, features.new_zeros(1, num_channels)])
    cells = padded[winner.long().where(winner >= 0, features.shape[0])]
    canvas = cells.view(batch_size, grid_h * grid_w, num_channels).transpose(1, 2)
    return canvas.reshape(batch_size, num_channels, grid_h, grid_w).contiguous(), winner


def pillar_gather(canvas: torch.Tensor, coords: torch.Tensor, winner: torch.Tensor) -> torch.Tensor:
    """The adjoint of ``pillar_scatter``: ``(P, C)`` rows read from ``canvas (B, C, H, W)`` at each
    pillar's cell, zero for pillars that do not own their cell (duplicates that lost) or lie outside
    the grid."""
    batch_size, num_channels, grid_h, grid_w = canvas.shape
    num_pillars = coords.shape[0]
    b, y, x = coords[:, 0].long(), coords[:, 2].long(), coords[:, 3].long()
    inside = (b >= 0) & (b < batch_size) & (y >= 0) & (y < grid_h) & (x >= 0) & (x < grid_w)
    lin = ((b * grid_h + y) * grid_w + x).where(inside, 0)
    owns = inside & (winner.long()[lin] == torch.arange(num_pillars, device=coords.device))
    flat = canvas.permute(0, 2, 3, 1).reshape(-1, num_channels)
    return flat[lin] * owns.unsqueeze(1).to(canvas.dtype)
