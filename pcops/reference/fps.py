"""Farthest point sampling in plain PyTorch: the CPU path and the test oracle.

``points (B, N, 3)`` padded with ``lengths (B,)``. Squared distances are ``dx*dx + dy*dy + dz*dz``
summed in that order from coordinate differences (``pcops.reference.knn.sq_dist``), so the GPU
kernels, which do the same arithmetic without fused multiply-adds, return the same indices.
"""

from __future__ import annotations

import torch

from .knn import sq_dist


def farthest_point_sample(
    points: torch.Tensor, lengths: torch.Tensor, start_idx: torch.Tensor, num_samples: int
) -> torch.Tensor:
    """Greedy farthest point sampling, all clouds at once (one Python step per sample).

    ``points (B, N, 3)`` float32, ``lengths (B,)``, ``start_idx (B,)`` → ``(B, M)`` int64. Each step
    picks the point whose squared distance to the chosen set is largest (lowest index on ties);
    chosen points are never picked again; rows are padded with −1 past ``min(M, length)``; a
    cloud whose start index is outside ``[0, length)`` gets a row of −1.
    """
    batch, n, _ = points.shape
    device = points.device
    lengths = lengths.long().clamp(0, n)
    out = torch.full((batch, num_samples), -1, dtype=torch.int64, device=device)
    if batch == 0 or n == 0 or num_samples == 0:
        return out
    rows = torch.arange(batch, device=device)
    valid = torch.arange(n, device=device)[None, :] < lengths[:, None]
    # running squared distance to the chosen set: −1 for padding (and, later, chosen points)
    min_dist = torch.full((batch, n), float("inf"), dtype=points.dtype, device=device)
    min_dist = min_dist.where(valid, -1.0)
    start_ok = (start_idx >= 0) & (start_idx < lengths)
    lengths = lengths.where(start_ok, 0)  # a cloud with an invalid start gets a row of −1
    sel = start_idx.long().clamp(0, n - 1)
    for s in range(num_samples):
        active = s < lengths
        out[:, s] = sel.where(active, -1)
        centre = points[rows, sel]  # (B, 3)
        dist = sq_dist(points, centre[:, None, :])
        min_dist = torch.minimum(min_dist, dist)
        min_dist[rows, sel] = -1.0  # a chosen point is never chosen again
        sel = min_dist.argmax(dim=1)  # first maximum: lowest index on ties
    return out
