"""Sampling and grouping: farthest point sampling, K nearest neighbours, ball query, gather.

The point-set operators of PointNet++ (Qi et al., NeurIPS 2017) and its descendants (3DSSD,
Point Transformer). One batching convention everywhere, as PyTorch3D: clouds are padded to
``(B, N, 3)`` with ``lengths (B,)`` valid counts (``None``: every cloud has ``N`` points), and an
unbatched ``(N, 3)`` cloud is accepted and returned without the batch dimension.

Distances are squared Euclidean distances computed from coordinate differences,
``dx*dx + dy*dy + dz*dz`` in that order and without fused multiply-adds, on every device: the
CPU reference (``pcops.reference.sampling``) and the GPU kernels agree bit for bit, so ties
resolve identically (always to the lowest index).
"""
from __future__ import annotations

import torch

from . import _checks
from .reference import sampling as _ref

__all__ = ["farthest_point_sample", "knn", "ball_query", "gather_points"]

_BACKENDS = ("auto", "triton", "cuda")
_POINT_DTYPES = _checks.FLOAT_DTYPES


# --- argument handling shared by the public functions ----------------------------------------


def _check_cloud(name: str, points) -> tuple[torch.Tensor, bool]:
    """``(B, N, 3)`` or ``(N, 3)`` float tensor → ``((B, N, 3), was_unbatched)``."""
    _checks.check_tensor(name, points, dtypes=_POINT_DTYPES, ndim=(2, 3), last_dim=3)
    return (points.unsqueeze(0), True) if points.dim() == 2 else (points, False)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    # half precision is widened: distances are accumulated and returned in float32
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _can_check(t: torch.Tensor) -> bool:
    """Value checks run on CPU tensors only (free there), and not while torch.compile traces."""
    return t.device.type == "cpu" and t.numel() > 0 and not torch.compiler.is_compiling()


def _check_lengths(name: str, lengths, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """``lengths (B,)`` integer counts in ``[0, N]`` → int64 on ``device`` (``None``: all ``N``).

    The range is checked on the CPU only; on the GPU that would cost a host synchronisation, so
    the kernels clamp counts to ``[0, N]`` instead.
    """
    if lengths is None:
        return torch.full((batch,), n, dtype=torch.int64, device=device)
    _checks.check_tensor(name, lengths, dtypes=_checks.INT_DTYPES, ndim=1)
    if lengths.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like the points), got {lengths.device}")
    if lengths.shape[0] != batch:
        raise ValueError(f"{name}: expected {batch} counts (one per cloud), got {lengths.shape[0]}")
    if _can_check(lengths):
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > n:
            raise ValueError(f"{name}: expected counts in [0, {n}], got {lengths.tolist()}")
    return lengths.to(torch.int64).contiguous()


def _check_backend(backend) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {_BACKENDS}, got {backend!r}")
    return backend


# --- farthest point sampling ------------------------------------------------------------------


def farthest_point_sample(
    points: torch.Tensor,
    num_samples: int,
    lengths: torch.Tensor | None = None,
    start_idx: int | torch.Tensor = 0,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Farthest point sampling (iterative greedy, PointNet++ / Eldar et al. 1997).

    Starting from ``start_idx``, each step adds the point whose squared Euclidean distance to
    the already chosen set is largest.

    Args:
        points: ``(B, N, 3)`` padded clouds or one ``(N, 3)`` cloud; any float dtype. Distances
            are computed in float32 (float16/bfloat16/float64 inputs are converted).
        num_samples: ``M`` ≥ 1 samples per cloud.
        lengths: ``(B,)`` int32/int64 valid point counts in ``[0, N]`` (``None``: all ``N``).
            Points past a cloud's length are never chosen.
        start_idx: the first sample, an int or a ``(B,)`` integer tensor, in ``[0, length)``.
        backend: GPU implementation: ``"auto"`` (default: the CUDA C++ cluster kernel where the
            device and NVRTC allow it, else Triton), ``"triton"`` or ``"cuda"``. Ignored on the CPU.

    Returns:
        ``(B, M)`` (or ``(M,)``) int64 indices into each cloud, in selection order. A cloud with
        fewer than ``M`` valid points yields all of them, then −1 padding.

    Ties: the lowest index wins. A chosen point is never chosen again, so indices within a
    cloud are distinct even with duplicate points. Deterministic on every device; the CPU
    reference and the GPU kernels return identical indices.

    Checks: ``lengths`` and ``start_idx`` ranges are checked on the CPU; on the GPU they would
    need a host synchronisation, so there lengths are clamped to ``[0, N]`` and a cloud whose
    ``start_idx`` is outside ``[0, length)`` gets a row of −1. No host synchronisation on the GPU.

    GPU algorithm (sm_90+, CUDA C++ from ``csrc/fps.cu`` compiled at run time by NVRTC): each
    cloud is ordered along a Morton curve (one kernel and one sort) and cut into groups of 32
    consecutive points with bounding boxes. One CTA holds up to 16,384 points (coordinates in
    shared memory, running distances in registers); larger clouds take a thread-block cluster of
    2, 4 or 8 CTAs (up to 131,072 points). A step updates only the groups whose box is not farther
    from the new sample than their largest current distance (exact: rounding is monotone; late in
    the sampling about 2% of the groups of a KITTI cloud), then every warp publishes its candidate
    (distance, lowest index) and all warps reduce the candidates after one exchange: a
    ``__syncthreads`` in one CTA, asynchronous stores into every CTA's shared memory completing
    on mbarriers across a cluster. Clouds over 131,072 points, other GPUs and machines without
    NVRTC: Triton (one program per cloud, in registers up to 16,384 points, beyond that
    streaming the cloud from L2 every step: correct, slow).
    """
    points, unbatched = _check_cloud("points", points)
    batch, n, _ = points.shape
    num_samples = _checks.check_int("num_samples", num_samples, min_value=1)
    lengths = _check_lengths("lengths", lengths, batch, n, points.device)
    if isinstance(start_idx, torch.Tensor) and start_idx.dim() == 1:
        _checks.check_tensor("start_idx", start_idx, dtypes=_checks.INT_DTYPES)
        if start_idx.device != points.device:
            raise ValueError(f"start_idx: expected a tensor on {points.device} (like the points), got {start_idx.device}")
        if start_idx.shape[0] != batch:
            raise ValueError(f"start_idx: expected {batch} values (one per cloud), got {start_idx.shape[0]}")
        start = start_idx.to(torch.int64).contiguous()
    else:
        s = _checks.check_int("start_idx", start_idx, min_value=0)
        if s >= max(n, 1):
            raise ValueError(f"start_idx: expected an index in [0, {n}), got {s}")
        start = torch.full((batch,), s, dtype=torch.int64, device=points.device)
    if _can_check(start):
        bad = ((start < 0) | (start >= lengths)) & (lengths > 0)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"start_idx: cloud {i} has {int(lengths[i])} points, got start index {int(start[i])}")
    backend = _check_backend(backend)
    out = torch.ops.pcops.farthest_point_sample(
        points.to(torch.float32).contiguous(), lengths, start, num_samples, backend
    )
    return out[0] if unbatched else out


@torch.library.custom_op("pcops::farthest_point_sample", mutates_args=(), device_types="cpu")
def _fps(points: torch.Tensor, lengths: torch.Tensor, start_idx: torch.Tensor, num_samples: int, backend: str) -> torch.Tensor:
    return _ref.farthest_point_sample(points, lengths, start_idx, num_samples)


@_fps.register_kernel("cuda")
def _fps_cuda(points, lengths, start_idx, num_samples, backend):
    if backend in ("auto", "cuda"):
        from .cuda import sampling as cuda_impl

        if backend == "cuda" or cuda_impl.fps_supported(points):
            return cuda_impl.farthest_point_sample(points, lengths, start_idx, num_samples)
    from .triton import sampling as impl

    return impl.farthest_point_sample(points, lengths, start_idx, num_samples)


@_fps.register_fake
def _fps_fake(points, lengths, start_idx, num_samples, backend):
    torch._check(points.dim() == 3 and points.shape[2] == 3, lambda: "points: expected shape (B, N, 3)")
    torch._check(lengths.shape == (points.shape[0],), lambda: "lengths: expected shape (B,)")
    torch._check(start_idx.shape == (points.shape[0],), lambda: "start_idx: expected shape (B,)")
    return points.new_empty((points.shape[0], num_samples), dtype=torch.int64)


# --- K nearest neighbours ---------------------------------------------------------------------


def _check_pair(query, ref, query_lengths, ref_lengths):
    q, q_unbatched = _check_cloud("query", query)
    r, r_unbatched = _check_cloud("ref", ref)
    if q_unbatched != r_unbatched:
        raise ValueError(f"ref: expected a {query.dim()}-D tensor like query, got shape {tuple(ref.shape)}")
    _checks.check_same_device(query=q, ref=r)
    if q.shape[0] != r.shape[0]:
        raise ValueError(f"ref: expected batch size {q.shape[0]} (as query), got {r.shape[0]}")
    dtype = _compute_dtype(q) if q.dtype == r.dtype else torch.promote_types(_compute_dtype(q), _compute_dtype(r))
    self_query = ref is query
    q = q.to(dtype).contiguous()
    r = q if self_query else r.to(dtype).contiguous()
    ql = _check_lengths("query_lengths", query_lengths, q.shape[0], q.shape[1], q.device)
    if self_query and ref_lengths is query_lengths:
        rl = ql  # one tensor for both sides: the GPU path then sorts the cloud once
    else:
        rl = _check_lengths("ref_lengths", ref_lengths, r.shape[0], r.shape[1], r.device)
    return q, r, ql, rl, q_unbatched


def knn(
    query: torch.Tensor,
    ref: torch.Tensor,
    k: int,
    query_lengths: torch.Tensor | None = None,
    ref_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact K nearest neighbours of each query point among the reference points of its cloud.

    Args:
        query: ``(B, Nq, 3)`` padded clouds (or ``(Nq, 3)``), any float dtype.
        ref: ``(B, Nr, 3)`` (or ``(Nr, 3)``), same batch size and device as ``query``.
        k: ``K`` ≥ 1 neighbours; ``K`` may exceed the number of reference points.
        query_lengths, ref_lengths: ``(B,)`` valid counts (``None``: all points).

    Returns:
        ``(dists, idx)``, both ``(B, Nq, K)`` (or ``(Nq, K)``): squared distances in ascending
        order (float32; float64 for float64 inputs) and int64 indices into ``ref``. Slots past a
        cloud's valid reference count, and the rows of padded queries, hold ``inf`` / −1.

    Ties: equal distances are ordered by reference index (lowest first), identically on every
    device: distances come from coordinate differences (``dx*dx + dy*dy + dz*dz``, no FMA), not
    the ``|a|²+|b|²-2ab`` expansion, which loses precision for close points far from the origin.

    Gradient: ``dists`` is differentiable w.r.t. ``query`` and ``ref`` (registered backward,
    ``2 g (q - r)``); on the GPU the reference gradient is summed with atomics, so its last bits
    may vary between runs. ``idx`` is not differentiable.

    GPU algorithm: queries and references are sorted along a Morton (Z-order) curve per cloud,
    the references cut into tiles of 32 with bounding boxes (and superblocks of 4-8 tiles). For
    ``K ≤ 32`` a CUDA C++ kernel (``csrc/knn.cu``, NVRTC) gives each query one thread with its
    top K sorted in registers; a block of 32 sorted queries visits superblocks outward from its
    own position along the curve and reads a tile only if some query is within its current K-th
    distance of the tile's box (an exact test). Larger ``K`` (or no NVRTC) uses the Triton kernel
    of the same scheme, a block of queries per program. No host synchronisation.
    """
    k = _checks.check_int("k", k, min_value=1)
    q, r, ql, rl, unbatched = _check_pair(query, ref, query_lengths, ref_lengths)
    dists, idx = torch.ops.pcops.knn(q, r, ql, rl, k)
    return (dists[0], idx[0]) if unbatched else (dists, idx)


@torch.library.custom_op("pcops::knn", mutates_args=(), device_types="cpu")
def _knn(query: torch.Tensor, ref: torch.Tensor, query_lengths: torch.Tensor, ref_lengths: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _ref.knn(query, ref, query_lengths, ref_lengths, k)


@_knn.register_kernel("cuda")
def _knn_cuda(query, ref, query_lengths, ref_lengths, k):
    if query.dtype == torch.float64:  # the kernels work in float32; float64 keeps the exact reference
        return _ref.knn(query, ref, query_lengths, ref_lengths, k)
    from .cuda import knn as cuda_knn

    if cuda_knn.supported(query, k):  # CUDA C++ (NVRTC), K <= 32: one thread per query
        return cuda_knn.knn(query, ref, query_lengths, ref_lengths, k)
    from .triton import sampling as impl

    return impl.knn(query, ref, query_lengths, ref_lengths, k)


@_knn.register_fake
def _knn_fake(query, ref, query_lengths, ref_lengths, k):
    torch._check(query.dim() == 3 and query.shape[2] == 3, lambda: "query: expected shape (B, Nq, 3)")
    torch._check(ref.dim() == 3 and ref.shape[2] == 3, lambda: "ref: expected shape (B, Nr, 3)")
    torch._check(ref.shape[0] == query.shape[0], lambda: "ref: expected the batch size of query")
    shape = (query.shape[0], query.shape[1], k)
    return query.new_empty(shape), query.new_empty(shape, dtype=torch.int64)


@torch.library.custom_op("pcops::knn_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _knn_backward(grad_dists: torch.Tensor, query: torch.Tensor, ref: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _ref.knn_backward(grad_dists, query, ref, idx)


@_knn_backward.register_fake
def _knn_backward_fake(grad_dists, query, ref, idx):
    return torch.empty_like(query), torch.empty_like(ref)


def _knn_setup_context(ctx, inputs, output):
    query, ref, *_ = inputs
    _, idx = output
    ctx.save_for_backward(query, ref, idx)
    ctx.mark_non_differentiable(idx)


def _knn_bwd(ctx, grad_dists, _grad_idx):
    query, ref, idx = ctx.saved_tensors
    grad_query, grad_ref = torch.ops.pcops.knn_backward(grad_dists.contiguous(), query, ref, idx)
    return grad_query, grad_ref, None, None, None


_knn.register_autograd(_knn_bwd, setup_context=_knn_setup_context)


# --- ball query -------------------------------------------------------------------------------


def ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    radius: float,
    k: int,
    query_lengths: torch.Tensor | None = None,
    ref_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` reference points within ``radius`` of each query (PointNet++ grouping).

    Args:
        query: ``(B, Nq, 3)`` (or ``(Nq, 3)``), any float dtype (compared in float32, or float64).
        ref: ``(B, Nr, 3)`` (or ``(Nr, 3)``).
        radius: ball radius > 0, in the points' units; a point is inside when its squared
            distance is strictly less than ``radius²``.
        k: ``K`` ≥ 1 slots per query.
        query_lengths, ref_lengths: ``(B,)`` valid counts (``None``: all points).

    Returns:
        ``(idx, counts)``: ``idx (B, Nq, K)`` int64, the first ``K`` hits **in index order**
        (PointNet++ / PyTorch3D semantics, not the nearest ones), and ``counts (B, Nq)`` int64,
        how many slots are filled (``min(K, hits)``).

    Padding convention: unfilled slots are **−1** (PyTorch3D), never a repeated index. PointNet++
    instead repeats the first hit; to get that, use
    ``idx.where(idx >= 0, idx[..., :1])`` (a query with no hit then keeps −1; ``gather_points``
    turns −1 into zeros). Padded queries get ``counts = 0``. Deterministic; no host sync on the GPU.
    """
    radius = _checks.check_float("radius", radius, min_value=0.0, min_open=True)
    k = _checks.check_int("k", k, min_value=1)
    q, r, ql, rl, unbatched = _check_pair(query, ref, query_lengths, ref_lengths)
    idx, counts = torch.ops.pcops.ball_query(q, r, ql, rl, radius, k)
    return (idx[0], counts[0]) if unbatched else (idx, counts)


@torch.library.custom_op("pcops::ball_query", mutates_args=(), device_types="cpu")
def _ball_query(query: torch.Tensor, ref: torch.Tensor, query_lengths: torch.Tensor, ref_lengths: torch.Tensor, radius: float, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _ref.ball_query(query, ref, query_lengths, ref_lengths, radius, k)


@_ball_query.register_kernel("cuda")
def _ball_query_cuda(query, ref, query_lengths, ref_lengths, radius, k):
    if query.dtype == torch.float64:
        return _ref.ball_query(query, ref, query_lengths, ref_lengths, radius, k)
    from .triton import sampling as impl

    return impl.ball_query(query, ref, query_lengths, ref_lengths, radius, k)


@_ball_query.register_fake
def _ball_query_fake(query, ref, query_lengths, ref_lengths, radius, k):
    torch._check(query.dim() == 3 and ref.dim() == 3, lambda: "query, ref: expected (B, N, 3)")
    torch._check(ref.shape[0] == query.shape[0], lambda: "ref: expected the batch size of query")
    return (
        query.new_empty((query.shape[0], query.shape[1], k), dtype=torch.int64),
        query.new_empty((query.shape[0], query.shape[1]), dtype=torch.int64),
    )


# --- gather -----------------------------------------------------------------------------------


def gather_points(points: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Gather rows of ``points`` by index per cloud (PointNet++'s ``gather_operation`` / grouping).

    Args:
        points: ``(B, N, C)`` features or coordinates (or ``(N, C)`` for one cloud), float dtype.
        idx: ``(B, ...)`` int32/int64 indices in ``[-1, N)`` (or ``(...)`` with unbatched points),
            e.g. the output of ``farthest_point_sample``, ``knn`` or ``ball_query``.

    Returns:
        ``(B, ..., C)`` (or ``(..., C)``) of ``points.dtype``; index −1 gives a zero row.

    Gradient: w.r.t. ``points``, the sum of the gradient rows gathered from each point (a
    scatter-add; with atomics on the GPU, so the last bits may vary between runs). Indices
    outside ``[-1, N)`` raise on the CPU; on the GPU they are undefined behaviour (a device
    assert from the gather), as checking them would need a host synchronisation.
    """
    _checks.check_tensor("points", points, dtypes=_checks.FLOAT_DTYPES, ndim=(2, 3))
    _checks.check_tensor("idx", idx, dtypes=_checks.INT_DTYPES)
    _checks.check_same_device(points=points, idx=idx)
    unbatched = points.dim() == 2
    if unbatched:
        points, idx = points.unsqueeze(0), idx.unsqueeze(0)
    elif idx.dim() == 0 or idx.shape[0] != points.shape[0]:
        raise ValueError(f"idx: expected batch size {points.shape[0]} (as points), got shape {tuple(idx.shape)}")
    n = points.shape[1]
    if _can_check(idx):
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -1 or hi >= n:
            raise ValueError(f"idx: expected indices in [-1, {n}), got values in [{lo}, {hi}]")
    out = torch.ops.pcops.gather_points(points.contiguous(), idx.to(torch.int64).contiguous())
    return out[0] if unbatched else out


@torch.library.custom_op("pcops::gather_points", mutates_args=(), device_types=("cpu", "cuda"))
def _gather_points(points: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    # one torch gather on every device: it is a memory-bound copy torch already does well
    return _ref.gather_points(points, idx)


@_gather_points.register_fake
def _gather_points_fake(points, idx):
    torch._check(points.dim() == 3, lambda: "points: expected (B, N, C)")
    torch._check(idx.dim() >= 1 and idx.shape[0] == points.shape[0], lambda: "idx: expected (B, ...)")
    return points.new_empty((*idx.shape, points.shape[2]))


@torch.library.custom_op("pcops::gather_points_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _gather_points_backward(grad: torch.Tensor, idx: torch.Tensor, num_points: int) -> torch.Tensor:
    return _ref.gather_points_backward(grad, idx, num_points)


@_gather_points_backward.register_fake
def _gather_points_backward_fake(grad, idx, num_points):
    return grad.new_empty((idx.shape[0], num_points, grad.shape[-1]))


def _gather_setup_context(ctx, inputs, output):
    points, idx = inputs
    ctx.save_for_backward(idx)
    ctx.num_points = points.shape[1]


def _gather_bwd(ctx, grad):
    (idx,) = ctx.saved_tensors
    return torch.ops.pcops.gather_points_backward(grad.contiguous(), idx, ctx.num_points), None


def _gather_backward_setup_context(ctx, inputs, output):
    _, idx, _ = inputs
    ctx.save_for_backward(idx)


def _gather_backward_bwd(ctx, grad):
    # double backward: the adjoint of the scatter-add is the gather
    (idx,) = ctx.saved_tensors
    return torch.ops.pcops.gather_points(grad.contiguous(), idx), None, None


_gather_points.register_autograd(_gather_bwd, setup_context=_gather_setup_context)
_gather_points_backward.register_autograd(_gather_backward_bwd, setup_context=_gather_backward_setup_context)
