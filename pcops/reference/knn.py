"""KNN, ball query and gather in plain PyTorch: the CPU path and the test oracle.

Every cloud is padded ``(B, N, 3)`` with ``lengths (B,)``. Squared distances are always
``dx*dx + dy*dy + dz*dz`` summed in that order from coordinate differences (never the
``|a|² + |b|² - 2ab`` expansion), so the GPU kernels, which do the same arithmetic without
fused multiply-adds, reproduce these results bit for bit, ties included.
"""

from __future__ import annotations

import torch


def sq_dist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a - b|²`` over the last dimension (size 3), as ``(dx*dx + dy*dy) + dz*dz``."""
    d = a - b
    dx, dy, dz = d.unbind(-1)
    return dx * dx + dy * dy + dz * dz


def knn(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    k: int,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact K nearest neighbours by brute force.

    ``query (B, Nq, 3)``, ``ref (B, Nr, 3)`` → ``dists (B, Nq, k)`` ascending squared distances
    and ``idx (B, Nq, k)`` int64; equal distances are ordered by index (a stable sort); slots past
    a cloud's valid reference count, and rows of padded queries, are ``inf`` / −1.
    Differentiable w.r.t. ``query`` and ``ref`` through plain torch ops (the gradient oracle).
    """
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    device = query.device
    ref_valid = torch.arange(nr, device=device)[None, :] < ref_lengths.long()[:, None]  # (B, Nr)
    q_valid = torch.arange(nq, device=device)[None, :] < query_lengths.long()[:, None]  # (B, Nq)
    dists, idxs = [], []
    take = min(k, nr)
    for q0 in range(0, nq, chunk):  # bounded memory: (B, chunk, Nr) distances at a time
        d = sq_dist(query[:, q0 : q0 + chunk, None, :], ref[:, None, :, :])
        d = d.masked_fill(~ref_valid[:, None, :], float("inf"))
        d_sorted, order = torch.sort(d, dim=2, stable=True)  # ties keep index order
        d_sorted, order = d_sorted[:, :, :take], order[:, :, :take]
        ok = torch.gather(ref_valid, 1, order.flatten(1)).view_as(order)
        ok = ok & q_valid[:, q0 : q0 + chunk, None]
        dists.append(d_sorted.masked_fill(~ok, float("inf")))
        idxs.append(order.masked_fill(~ok, -1))
    dist = torch.cat(dists, 1) if dists else query.new_empty((batch, 0, take))
    idx = torch.cat(idxs, 1) if idxs else torch.empty((batch, 0, take), dtype=torch.int64, device=device)
    if take < k:  # fewer reference points than k: pad
        dist = torch.cat([dist, dist.new_full((batch, nq, k - take), float("inf"))], 2)
        idx = torch.cat([idx, idx.new_full((batch, nq, k - take), -1)], 2)
    return dist, idx


def knn_backward(
    grad_dists: torch.Tensor, query: torch.Tensor, ref: torch.Tensor, idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``dists = |query_i - ref_idx|²``: ``2 g (q - r)`` to the query, minus that to the ref."""
    batch, nq, k = idx.shape
    valid = idx >= 0
    safe = idx.clamp(min=0)
    r_sel = torch.gather(ref, 1, safe.view(batch, nq * k, 1).expand(-1, -1, 3)).view(batch, nq, k, 3)
    g = (2 * grad_dists)[..., None] * (query[:, :, None, :] - r_sel)  # (B, Nq, k, 3)
    g = g.where(valid[..., None], 0)  # after the product: a padded slot of a non-finite query gives 0
    grad_query = g.sum(2)
    grad_ref = torch.zeros_like(ref)
    grad_ref.scatter_add_(1, safe.view(batch, nq * k, 1).expand(-1, -1, 3), -g.reshape(batch, nq * k, 3))
    return grad_query, grad_ref


def ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    radius: float,
    k: int,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` reference points (in index order) with ``|q - r|² < radius²``.

    Returns ``idx (B, Nq, k)`` int64 padded with −1 and ``counts (B, Nq)`` int64 (filled slots).
    A mask and its running count (cumsum) give each hit its slot.
    """
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    device = query.device
    r2 = torch.tensor(radius * radius, dtype=query.dtype)  # radius² (in double) rounded to the points' dtype
    ref_valid = torch.arange(nr, device=device)[None, :] < ref_lengths.long()[:, None]
    q_valid = torch.arange(nq, device=device)[None, :] < query_lengths.long()[:, None]
    out = torch.full((batch, nq, k), -1, dtype=torch.int64, device=device)
    counts = torch.zeros((batch, nq), dtype=torch.int64, device=device)
    for q0 in range(0, nq, chunk):
        q1 = min(nq, q0 + chunk)
        hit = sq_dist(query[:, q0:q1, None, :], ref[:, None, :, :]) < r2.to(device)
        hit = hit & ref_valid[:, None, :] & q_valid[:, q0:q1, None]
        slot = hit.long().cumsum(2) - 1  # the slot each hit goes to, in index order
        keep = hit & (slot < k)
        b, q, r = keep.nonzero(as_tuple=True)
        out[b, q + q0, slot[b, q, r]] = r
        counts[:, q0:q1] = keep.sum(2)
    return out, counts


def gather_points(points: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``points (B, N, C)``, ``idx (B, ...)`` int64 → ``(B, ..., C)``; −1 gives zeros."""
    batch, _, channels = points.shape
    flat = idx.reshape(batch, -1)
    valid = flat >= 0
    out = torch.gather(points, 1, flat.clamp(min=0)[..., None].expand(-1, -1, channels))
    out = out * valid[..., None].to(points.dtype)
    return out.view(*idx.shape, channels)


def gather_points_backward(grad: torch.Tensor, idx: torch.Tensor, num_points: int) -> torch.Tensor:
    """The adjoint of ``gather_points``: ``(B, N, C)`` sums of the gradient rows per index."""
    batch = idx.shape[0]
    channels = grad.shape[-1]
    flat = idx.reshape(batch, -1)
    g = grad.reshape(batch, -1, channels) * (flat >= 0)[..., None].to(grad.dtype)
    out = grad.new_zeros((batch, num_points, channels))
    out.scatter_add_(1, flat.clamp(min=0)[..., None].expand(-1, -1, channels), g)
    return out
