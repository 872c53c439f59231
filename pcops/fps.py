"""Farthest point sampling (PointNet++, Qi et al., NeurIPS 2017; Eldar et al. 1997).

Distances are squared Euclidean distances from coordinate differences, ``dx*dx + dy*dy + dz*dz``
in that order and without fused multiply-adds, on every device: the reference
(``pcops.reference.fps``) and the GPU kernels return identical indices, ties included.
"""

from __future__ import annotations

import torch

from . import _backend, _checks, _clouds, _finite, _library, cpu
from .reference import fps as _ref

__all__ = ["farthest_point_sample"]

_OP = "farthest_point_sample"


def farthest_point_sample(
    points: torch.Tensor,
    num_samples: int,
    lengths: torch.Tensor | None = None,
    start_idx: int | torch.Tensor = 0,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Farthest point sampling (iterative greedy).

    Starting from ``start_idx``, each step adds the point whose squared Euclidean distance to
    the already chosen set is largest.

    Args:
        points: ``(B, N, 3)`` padded clouds or one ``(N, 3)`` cloud; any float dtype. Distances
            are computed in float32 on every backend (float16/bfloat16/float64 inputs are
            converted first, so ``"auto"`` runs the GPU kernels on float64 inputs too).
        num_samples: ``M`` ≥ 1 samples per cloud.
        lengths: ``(B,)`` int32/int64 valid point counts in ``[0, N]`` (``None``: all ``N``).
            Points past a cloud's length are never chosen.
        start_idx: the first sample, an int or a ``(B,)`` integer tensor, in ``[0, length)``.
        backend: ``"auto"`` (CUDA tensors: the CUDA C++ kernel where it runs (sm_90+ with NVRTC,
            N ≤ 131,072, B ≤ 65,535), else Triton; CPU tensors: the bucket FPS of
            ``pcops.cpu.fps`` where numba is installed, else the reference), ``"cuda"``,
            ``"triton"`` (CUDA tensors only; ``"cuda"`` raises where its kernel cannot run) or
            ``"reference"`` (the plain-torch oracle, any device).

    Returns:
        ``(B, M)`` (or ``(M,)``) int64 indices into each cloud, in selection order. A cloud with
        fewer than ``M`` valid points yields all of them, then −1 padding.

    Ties: the lowest index wins. A chosen point is never chosen again, so indices within a
    cloud are distinct even with duplicate points. Deterministic on every device and backend.

    Non-finite points (a NaN or ±inf coordinate) are absent on every backend: never chosen, so a
    cloud with fewer finite points than ``M`` is padded with −1; a ``start_idx`` naming one starts
    from the cloud's lowest-index finite point instead (``pcops._finite``).

    Checks: ``lengths`` and ``start_idx`` ranges are checked on the CPU; on the GPU they would
    need a host synchronisation, so there lengths are clamped to ``[0, N]`` and a cloud whose
    ``start_idx`` is outside ``[0, length)`` gets a row of −1. No host synchronisation on the GPU.

    Example:
        >>> pts = torch.rand(2, 1000, 3)
        >>> idx = pcops.farthest_point_sample(pts, 64)  # (2, 64) int64
        >>> centres = pcops.gather_points(pts, idx)  # (2, 64, 3)

    Notes:
        CUDA kernel (``csrc/fps.cu``, NVRTC): each cloud is ordered along a Morton curve and cut
        into groups of 32 points with bounding boxes; one CTA holds up to 16,384 points
        (coordinates and running distances in shared memory), larger clouds take a thread-block
        cluster of 2, 4 or 8 CTAs. A step updates only the groups whose box is not farther from
        the new sample than their largest current distance (exact: rounding is monotone), then
        the warps exchange one record each (a ``__syncthreads``, or asynchronous stores into
        every CTA's shared memory across a cluster). Triton: one program per cloud, in registers
        up to 16,384 points, beyond that streaming the cloud from L2 every step (correct, slow).
        CPU (``pcops.cpu.fps``, numba): bucket FPS over a KD-tree (QuickFPS), a step visits only
        the buckets its new sample can move; the clouds of a batch run in parallel.
    """
    points, unbatched = _clouds.check_cloud("points", points)
    batch, n, _ = points.shape
    num_samples = _checks.check_int("num_samples", num_samples, min_value=1)
    lengths = _clouds.check_lengths("lengths", lengths, batch, n, points.device)
    if isinstance(start_idx, torch.Tensor) and start_idx.dim() == 1:
        _checks.check_tensor("start_idx", start_idx, dtypes=_checks.INT_DTYPES)
        if start_idx.device != points.device:
            raise ValueError(
                f"start_idx: expected a tensor on {points.device} (like the points), got {start_idx.device}"
            )
        if start_idx.shape[0] != batch:
            raise ValueError(f"start_idx: expected {batch} values (one per cloud), got {start_idx.shape[0]}")
        start = start_idx.to(torch.int64).contiguous()
    else:
        s = _checks.check_int("start_idx", start_idx, min_value=0)
        if s >= max(n, 1):
            raise ValueError(f"start_idx: expected an index in [0, {n}), got {s}")
        start = _clouds.filled(batch, s, points.device)
    if _clouds.can_check(start):
        bad = ((start < 0) | (start >= lengths)) & (lengths > 0)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"start_idx: cloud {i} has {int(lengths[i])} points, got start index {int(start[i])}")
    points = points.to(torch.float32).contiguous()
    _backend.resolve(backend, _OP, points)  # validates the name and the device before the op
    out = _library.call(torch.ops.pcops.farthest_point_sample.default, points, lengths, start, num_samples, backend)
    return out[0] if unbatched else out


@_library.custom_op("pcops::farthest_point_sample", mutates_args=(), device_types="cpu")
def _fps(
    points: torch.Tensor, lengths: torch.Tensor, start_idx: torch.Tensor, num_samples: int, backend: str
) -> torch.Tensor:
    impl = _backend.resolve(backend, _OP, points)  # "triton" / "cuda" on CPU tensors raise
    if impl == "cpu" and cpu.numba_available():
        from .cpu import fps as cpu_fps

        _backend.log_kernel(_OP, "cpu bucket FPS (numba)")
        return _finite.fps(cpu_fps.farthest_point_sample, points, lengths, start_idx, num_samples)
    _backend.log_kernel(_OP, "reference")
    return _finite.fps(_ref.farthest_point_sample, points, lengths, start_idx, num_samples)


@_fps.register_kernel("cuda")
def _fps_cuda(points, lengths, start_idx, num_samples, backend):
    impl = _backend.resolve(backend, _OP, points, auto_cuda="auto")
    if impl == "reference":
        _backend.log_kernel(_OP, "reference")
        return _finite.fps(_ref.farthest_point_sample, points, lengths, start_idx, num_samples)
    from .cuda import fps as cuda_fps

    # "auto": the CUDA kernel where it runs, else Triton (decided up front, no try/except)
    if impl == "cuda" or (impl == "auto" and cuda_fps.supported(points)):
        return _finite.fps(cuda_fps.farthest_point_sample, points, lengths, start_idx, num_samples)
    from .triton import fps as triton_fps

    return _finite.fps(triton_fps.farthest_point_sample, points, lengths, start_idx, num_samples)


@_fps.register_fake
def _fps_fake(points, lengths, start_idx, num_samples, backend):
    torch._check(points.dim() == 3 and points.shape[2] == 3, lambda: "points: expected shape (B, N, 3)")
    torch._check(lengths.shape == (points.shape[0],), lambda: "lengths: expected shape (B,)")
    torch._check(start_idx.shape == (points.shape[0],), lambda: "start_idx: expected shape (B,)")
    return points.new_empty((points.shape[0], num_samples), dtype=torch.int64)
