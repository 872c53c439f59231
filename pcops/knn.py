"""K nearest neighbours, ball query and gather: the grouping ops of PointNet++ (Qi et al., NeurIPS
2017) and its descendants (3DSSD, Point Transformer).

Clouds are padded ``(B, N, 3)`` with ``lengths (B,)`` (``None``: all points), or one unbatched
``(N, 3)`` cloud. Distances are squared Euclidean distances computed from coordinate differences,
``dx*dx + dy*dy + dz*dz`` in that order and without fused multiply-adds, on every device: the
reference (``pcops.reference.knn``) and the GPU kernels agree bit for bit, so ties resolve
identically (always to the lowest index).
"""

from __future__ import annotations

import torch

from . import _backend, _checks, _clouds, _finite, _library
from . import cpu as _cpu
from .reference import knn as _ref

__all__ = ["knn", "ball_query", "gather_points"]


# --- K nearest neighbours ---------------------------------------------------------------------


def knn(
    query: torch.Tensor,
    ref: torch.Tensor,
    k: int,
    query_lengths: torch.Tensor | None = None,
    ref_lengths: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact K nearest neighbours of each query point among the reference points of its cloud.

    Args:
        query: ``(B, Nq, 3)`` padded clouds (or ``(Nq, 3)``), any float dtype.
        ref: ``(B, Nr, 3)`` (or ``(Nr, 3)``), same batch size and device as ``query``.
        k: ``K`` ≥ 1 neighbours; ``K`` may exceed the number of reference points.
        query_lengths, ref_lengths: ``(B,)`` valid counts (``None``: all points).
        backend: ``"auto"`` (CUDA tensors: the CUDA C++ kernel for ``K ≤ 32`` where NVRTC is
            installed, else Triton; CPU tensors: the numba KD-tree of ``pcops.cpu.knn`` where numba
            is installed, else the reference; float64 inputs: the reference), ``"cuda"``
            (``K ≤ 32``), ``"triton"`` (CUDA float32/float16/bfloat16 inputs only: both compute
            in float32, an explicit one raises where it cannot run) or ``"reference"`` (the
            plain-torch oracle, any device).

    Returns:
        ``(dists, idx)``, both ``(B, Nq, K)`` (or ``(Nq, K)``): squared distances in ascending
        order (float32; float64 for float64 inputs) and int64 indices into ``ref``. Slots past a
        cloud's valid reference count, and the rows of padded queries, hold ``inf`` / −1.

    Non-finite points (a NaN or ±inf coordinate; the same on every backend, ``pcops._finite``):
    a non-finite reference point is never a neighbour (it does not count towards the cloud's
    valid references), a non-finite query gets a row of ``inf`` / −1.

    Ties: equal distances are ordered by reference index (lowest first), identically on every
    device: distances come from coordinate differences (``dx*dx + dy*dy + dz*dz``, no FMA), not
    the ``|a|²+|b|²-2ab`` expansion, which loses precision for close points far from the origin.

    Gradient: ``dists`` is differentiable w.r.t. ``query`` and ``ref`` (registered backward,
    ``2 g (q - r)``); on the GPU the reference gradient is summed with atomics, so its last bits
    may vary between runs. ``idx`` is not differentiable. No host synchronisation.

    Example:
        >>> pts = torch.rand(2, 1000, 3)
        >>> dists, idx = pcops.knn(pts, pts, 16)  # (2, 1000, 16) each; idx[..., 0] is the point itself
        >>> neighbours = pcops.gather_points(pts, idx)  # (2, 1000, 16, 3)

    Notes:
        GPU algorithm: queries and references are sorted along a Morton (Z-order) curve per cloud,
        the references cut into tiles of 32 with bounding boxes (and superblocks of 4-8 tiles).
        The CUDA C++ kernel (``csrc/knn.cu``, NVRTC) gives each query one thread with its top K
        sorted in registers; a block of 32 sorted queries visits superblocks outward from its own
        position along the curve and reads a tile only if some query is within its current K-th
        distance of the tile's box (an exact test). The Triton kernel uses the same scheme with a
        block of queries per program.

        CPU algorithm (``pcops.cpu.knn``): a median-split KD-tree per reference cloud with box
        pruning, queries in parallel over ``torch.get_num_threads()`` threads; the reference's
        result bit for bit, whatever the thread count.
    """
    k = _checks.check_int("k", k, min_value=1)
    q, r, ql, rl, unbatched = _clouds.check_pair(query, ref, query_lengths, ref_lengths)
    _backend.resolve(backend, "knn", q)  # validates the name and the device before the op
    dists, idx = _library.call(torch.ops.pcops.knn.default, q, r, ql, rl, k, backend)
    return (dists[0], idx[0]) if unbatched else (dists, idx)


def _check_gpu_dtype(backend: str, op: str, t: torch.Tensor) -> None:
    # the GPU kernels compute in float32; float64 keeps the exact reference (under "auto" only)
    if t.dtype == torch.float64:
        raise ValueError(
            f"backend: {backend!r} {op} computes in float32, got float64 inputs; use backend='auto' or 'reference'"
        )


@_library.custom_op("pcops::knn", mutates_args=(), device_types="cpu")
def _knn(
    query: torch.Tensor, ref: torch.Tensor, query_lengths: torch.Tensor, ref_lengths: torch.Tensor, k: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = _backend.resolve(backend, "knn", query)  # "triton" / "cuda" on CPU tensors raise
    if impl == "cpu" and query.dtype == torch.float32 and _cpu.numba_available():
        from .cpu import knn as cpu_knn  # imported on first use: numba is an optional extra

        _backend.log_kernel("knn", "cpu")
        return _finite.knn(cpu_knn.knn, query, ref, query_lengths, ref_lengths, k)
    _backend.log_kernel("knn", "reference")
    return _finite.knn(_ref.knn, query, ref, query_lengths, ref_lengths, k)


@_knn.register_kernel("cuda")
def _knn_cuda(query, ref, query_lengths, ref_lengths, k, backend):
    impl = _backend.resolve(backend, "knn", query, auto_cuda="auto")
    if impl == "reference":
        _backend.log_kernel("knn", "reference")
        return _finite.knn(_ref.knn, query, ref, query_lengths, ref_lengths, k)
    _check_gpu_dtype(backend, "knn", query)
    from .cuda import knn as cuda_knn

    # "auto": the CUDA kernel for K <= 32 where NVRTC is installed, else Triton (decided up front)
    if impl == "cuda" or (impl == "auto" and cuda_knn.supported(query, k)):
        return _finite.knn(cuda_knn.knn, query, ref, query_lengths, ref_lengths, k)
    from .triton import knn as triton_knn

    return _finite.knn(triton_knn.knn, query, ref, query_lengths, ref_lengths, k)


@_knn.register_fake
def _knn_fake(query, ref, query_lengths, ref_lengths, k, backend):
    torch._check(query.dim() == 3 and query.shape[2] == 3, lambda: "query: expected shape (B, Nq, 3)")
    torch._check(ref.dim() == 3 and ref.shape[2] == 3, lambda: "ref: expected shape (B, Nr, 3)")
    torch._check(ref.shape[0] == query.shape[0], lambda: "ref: expected the batch size of query")
    shape = (query.shape[0], query.shape[1], k)
    return query.new_empty(shape), query.new_empty(shape, dtype=torch.int64)


@_library.custom_op("pcops::knn_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _knn_backward(
    grad_dists: torch.Tensor, query: torch.Tensor, ref: torch.Tensor, idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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
    grad_query, grad_ref = _library.call(torch.ops.pcops.knn_backward.default, grad_dists.contiguous(), query, ref, idx)
    return grad_query, grad_ref, None, None, None, None


_knn.register_autograd(_knn_bwd, setup_context=_knn_setup_context)


# --- ball query -------------------------------------------------------------------------------

_BALL_BACKENDS = ("auto", "triton", "reference")  # no CUDA C++ kernel


def ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    radius: float,
    k: int,
    query_lengths: torch.Tensor | None = None,
    ref_lengths: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` reference points within ``radius`` of each query (PointNet++ grouping).

    Args:
        query: ``(B, Nq, 3)`` (or ``(Nq, 3)``), any float dtype (compared in float32, or float64).
        ref: ``(B, Nr, 3)`` (or ``(Nr, 3)``).
        radius: ball radius > 0, in the points' units; a point is inside when its squared
            distance is strictly less than ``radius²``.
        k: ``K`` ≥ 1 slots per query.
        query_lengths, ref_lengths: ``(B,)`` valid counts (``None``: all points).
        backend: ``"auto"`` (CUDA tensors: Triton, on a grid of sorted cells, or the scan of
            every reference for more than 511 samples or coordinates beyond 2¹⁷ radii; CPU
            tensors: the numba KD-tree of ``pcops.cpu.knn`` where numba is installed, else the
            reference; float64 inputs: the reference), ``"triton"`` (CUDA float32/float16/
            bfloat16 inputs only) or ``"reference"``; there is no CUDA C++ kernel (``"cuda"``
            raises).

    Returns:
        ``(idx, counts)``: ``idx (B, Nq, K)`` int64, the first ``K`` hits **in index order**
        (PointNet++ / PyTorch3D semantics, not the nearest ones), and ``counts (B, Nq)`` int64,
        how many slots are filled (``min(K, hits)``).

    Padding convention: unfilled slots are **−1** (PyTorch3D), never a repeated index. PointNet++
    instead repeats the first hit; to get that, use
    ``idx.where(idx >= 0, idx[..., :1])`` (a query with no hit then keeps −1; ``gather_points``
    turns −1 into zeros). Padded queries get ``counts = 0``. Deterministic; no host sync on the GPU.

    Non-finite points (a NaN or ±inf coordinate; every backend): a non-finite reference point is
    never inside a ball; a non-finite query gets −1 slots and ``counts = 0``.

    Example:
        >>> centres = torch.rand(2, 64, 3)
        >>> pts = torch.rand(2, 1000, 3)
        >>> idx, counts = pcops.ball_query(centres, pts, 0.2, 32)  # (2, 64, 32), (2, 64)
        >>> groups = pcops.gather_points(pts, idx)  # (2, 64, 32, 3), zeros in unfilled slots
    """
    radius = _checks.check_float("radius", radius, min_value=0.0, min_open=True)
    k = _checks.check_int("k", k, min_value=1)
    q, r, ql, rl, unbatched = _clouds.check_pair(query, ref, query_lengths, ref_lengths)
    _backend.resolve(backend, "ball_query", q, supported=_BALL_BACKENDS)
    idx, counts = _library.call(torch.ops.pcops.ball_query.default, q, r, ql, rl, radius, k, backend)
    return (idx[0], counts[0]) if unbatched else (idx, counts)


@_library.custom_op("pcops::ball_query", mutates_args=(), device_types="cpu")
def _ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    radius: float,
    k: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = _backend.resolve(backend, "ball_query", query, supported=_BALL_BACKENDS)
    if impl == "cpu" and query.dtype == torch.float32 and _cpu.numba_available():
        from .cpu import knn as cpu_knn

        _backend.log_kernel("ball_query", "cpu")
        return _finite.ball_query(cpu_knn.ball_query, query, ref, query_lengths, ref_lengths, radius, k)
    _backend.log_kernel("ball_query", "reference")
    return _finite.ball_query(_ref.ball_query, query, ref, query_lengths, ref_lengths, radius, k)


@_ball_query.register_kernel("cuda")
def _ball_query_cuda(query, ref, query_lengths, ref_lengths, radius, k, backend):
    impl = _backend.resolve(backend, "ball_query", query, supported=_BALL_BACKENDS)
    if impl == "reference":
        _backend.log_kernel("ball_query", "reference")
        return _finite.ball_query(_ref.ball_query, query, ref, query_lengths, ref_lengths, radius, k)
    _check_gpu_dtype(backend, "ball_query", query)
    from .triton import ball_query_grid

    return ball_query_grid.ball_query(query, ref, query_lengths, ref_lengths, radius, k)  # the policy inside


@_ball_query.register_fake
def _ball_query_fake(query, ref, query_lengths, ref_lengths, radius, k, backend):
    torch._check(query.dim() == 3 and ref.dim() == 3, lambda: "query, ref: expected (B, N, 3)")
    torch._check(ref.shape[0] == query.shape[0], lambda: "ref: expected the batch size of query")
    return (
        query.new_empty((query.shape[0], query.shape[1], k), dtype=torch.int64),
        query.new_empty((query.shape[0], query.shape[1]), dtype=torch.int64),
    )


# --- gather -----------------------------------------------------------------------------------


def gather_points(points: torch.Tensor, idx: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """Gather rows of ``points`` by index per cloud (PointNet++'s ``gather_operation`` / grouping).

    Args:
        points: ``(B, N, C)`` features or coordinates (or ``(N, C)`` for one cloud), float dtype.
        idx: ``(B, ...)`` int32/int64 indices in ``[-1, N)`` (or ``(...)`` with unbatched points),
            e.g. the output of ``farthest_point_sample``, ``knn`` or ``ball_query``.
        backend: ``"auto"`` or ``"reference"``: both run the same torch gather on every device
            (a memory-bound copy torch already does well); there is no Triton or CUDA C++ kernel.

    Returns:
        ``(B, ..., C)`` (or ``(..., C)``) of ``points.dtype``; index −1 gives a zero row.

    Gradient: w.r.t. ``points``, the sum of the gradient rows gathered from each point (a
    scatter-add; with atomics on the GPU, so the last bits may vary between runs). Indices
    outside ``[-1, N)`` raise on the CPU; on the GPU they are undefined behaviour (a device
    assert from the gather), as checking them would need a host synchronisation.

    Example:
        >>> pts = torch.rand(2, 1000, 3)
        >>> idx = pcops.farthest_point_sample(pts, 64)
        >>> pcops.gather_points(pts, idx).shape
        torch.Size([2, 64, 3])
    """
    _backend.check(backend, "gather_points", ("auto", "reference"))
    _checks.check_tensor("points", points, dtypes=_checks.FLOAT_DTYPES, ndim=(2, 3))
    _checks.check_tensor("idx", idx, dtypes=_checks.INT_DTYPES)
    _checks.check_same_device(points=points, idx=idx)
    unbatched = points.dim() == 2
    if unbatched:
        points, idx = points.unsqueeze(0), idx.unsqueeze(0)
    elif idx.dim() == 0 or idx.shape[0] != points.shape[0]:
        raise ValueError(f"idx: expected batch size {points.shape[0]} (as points), got shape {tuple(idx.shape)}")
    n = points.shape[1]
    if _clouds.can_check(idx):
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -1 or hi >= n:
            raise ValueError(f"idx: expected indices in [-1, {n}), got values in [{lo}, {hi}]")
    out = _library.call(torch.ops.pcops.gather_points.default, points.contiguous(), idx.to(torch.int64).contiguous())
    return out[0] if unbatched else out


@_library.custom_op("pcops::gather_points", mutates_args=(), device_types=("cpu", "cuda"))
def _gather_points(points: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    # one torch gather on every device: it is a memory-bound copy torch already does well
    return _ref.gather_points(points, idx)


@_gather_points.register_fake
def _gather_points_fake(points, idx):
    torch._check(points.dim() == 3, lambda: "points: expected (B, N, C)")
    torch._check(idx.dim() >= 1 and idx.shape[0] == points.shape[0], lambda: "idx: expected (B, ...)")
    return points.new_empty((*idx.shape, points.shape[2]))


@_library.custom_op("pcops::gather_points_backward", mutates_args=(), device_types=("cpu", "cuda"))
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
    return _library.call(torch.ops.pcops.gather_points_backward.default, grad.contiguous(), idx, ctx.num_points), None


def _gather_backward_setup_context(ctx, inputs, output):
    _, idx, _ = inputs
    ctx.save_for_backward(idx)


def _gather_backward_bwd(ctx, grad):
    # double backward: the adjoint of the scatter-add is the gather
    (idx,) = ctx.saved_tensors
    return _library.call(torch.ops.pcops.gather_points.default, grad.contiguous(), idx), None, None


_gather_points.register_autograd(_gather_bwd, setup_context=_gather_setup_context)
_gather_points_backward.register_autograd(_gather_backward_bwd, setup_context=_gather_backward_setup_context)
