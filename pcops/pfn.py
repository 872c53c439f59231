"""PointPillars' pillar feature net fused with the pillar scatter (PillarVFE + PointPillarScatter).

Contract: :func:`pfn_scatter` (checks) → ``torch.ops.pcops.pfn_scatter`` (writes ``canvas`` in
place) → the implementation ``backend`` resolves to (``pcops._backend``: the reference on the CPU,
Triton on CUDA) → kernel; plus a fake function. Inference only (no backward: the folded BatchNorm
is an eval-mode network). :func:`fold_batchnorm` prepares the weights.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _backend, _checks, _library
from .reference import pfn as _ref

__all__ = ["pfn_scatter", "fold_batchnorm"]

# decorated features per point: x, y, z, r, 3 offsets to the point mean, 3 to the pillar centre
NUM_DECORATED = 10
_BACKENDS = ("auto", "triton", "reference")
_CANVAS_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def fold_batchnorm(
    linear_weight: torch.Tensor,
    bn_weight: torch.Tensor,
    bn_bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold an eval-mode BatchNorm into the preceding bias-free linear layer:
    ``W' = W·s``, ``b' = β − μ·s`` with ``s = γ / sqrt(σ² + ε)``.

    Args:
        linear_weight: ``(C, 10)`` ``nn.Linear`` weight.
        bn_weight, bn_bias, running_mean, running_var: ``(C,)`` BatchNorm parameters and statistics.
        eps: BatchNorm epsilon.
    Returns:
        ``(weight (10, C), bias (C,))`` float32, contiguous, ready for :func:`pfn_scatter`.

    Example:
        >>> w, b = pcops.fold_batchnorm(torch.ones(2, 10), torch.ones(2), torch.zeros(2), torch.zeros(2),
        ...                             torch.full((2,), 3.0), eps=1.0)
        >>> w[0], b
        (tensor([0.5000, 0.5000]), tensor([0., 0.]))
    """
    scale = bn_weight.float() / torch.sqrt(running_var.float() + eps)
    weight = (linear_weight.float() * scale[:, None]).t().contiguous()
    bias = (bn_bias.float() - running_mean.float() * scale).contiguous()
    return weight, bias


def pfn_scatter(
    voxels: torch.Tensor,
    num_points: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    canvas: torch.Tensor,
    voxel_size: Sequence[float],
    range_min: Sequence[float],
    count: Optional[torch.Tensor] = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """The fused pillar feature net: each pillar's features written into ``canvas`` at its cell
    (PointPillars, Lang et al., CVPR 2019; OpenPCDet's ``PillarVFE`` with one PFN layer,
    ``use_absolute_xyz``, no distance, eval-mode BatchNorm folded by :func:`fold_batchnorm`).

    Per pillar: the ``T`` point slots ``(x, y, z, r)`` are decorated with the offsets to the
    pillar's point mean (sum over all slots / valid count) and to its cell centre
    (``coord · voxel + voxel / 2 + range_min``), padding slots (``t ≥ num_points``) are zeroed after
    decoration, then ``relu(features @ weight + bias)`` is taken over the slots' max (padding
    slots count, as in OpenPCDet: they contribute ``relu(bias)``).

    Args:
        voxels: ``(M, T, F)`` float32/float16/bfloat16/float64 point slots per pillar (zero padded),
            ``F ≥ 4``; only the first 4 features are used.
        num_points: ``(M,)`` int32/int64 valid slots per pillar; rows with 0 are skipped.
        coords: ``(M, 4)`` int32/int64 ``(batch, z, y, x)`` cells; rows outside the canvas are skipped.
        weight: ``(10, C)`` float32 folded weight; bias: ``(C,)`` float32 folded bias.
        canvas: ``(B, C, H, W)`` output, any strides (channels-last is fine), float32/float16/
            bfloat16 (float64 with the reference), zeroed by the caller; written in place. Cells
            without a live pillar are left untouched. Two live pillars on one cell is a caller
            error (the voxelizer never produces it): on the GPU the last store wins, unordered.
        voxel_size: ``(vx, vy, vz)`` metres; range_min: ``(xmin, ymin, zmin)`` metres.
        count: optional ``(1,)`` integer tensor on the same device: only rows ``< count`` are read
            (the fixed-capacity voxelizer's output count; no host sync). Default: all ``M`` rows.
        backend: ``"auto"`` (default: Triton on CUDA; the reference on the CPU and for float64
            voxels), ``"triton"`` (CUDA tensors only) or ``"reference"`` (any device).

    Returns:
        ``canvas``. On CUDA one launch, no host sync; computed in float32.

    Example:
        >>> voxels = torch.tensor([[[0.1, 0.2, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]]])  # one pillar, T = 2
        >>> w, b = torch.ones(10, 3), torch.zeros(3)
        >>> canvas = torch.zeros(1, 3, 2, 2)
        >>> out = pcops.pfn_scatter(voxels, torch.tensor([1]), torch.tensor([[0, 0, 1, 0]]), w, b, canvas,
        ...                         (0.16, 0.16, 4.0), (0.0, -0.16, -3.0))
        >>> out[0, :, 1, 0]  # x, y, z, r, 0, 0, 0 (mean offsets), 0.02, 0.12, 1.0 (centre offsets), summed
        tensor([1.9400, 1.9400, 1.9400])
    """
    _checks.check_tensor("voxels", voxels, dtypes=_checks.FLOAT_DTYPES, ndim=3)
    if voxels.shape[2] < 4:
        raise ValueError(
            f"voxels: expected at least 4 features per point (x, y, z, r), got shape {tuple(voxels.shape)}"
        )
    rows = voxels.shape[0]
    _checks.check_tensor("num_points", num_points, dtypes=_checks.INT_DTYPES, ndim=1)
    _checks.check_tensor("coords", coords, dtypes=_checks.INT_DTYPES, ndim=2, last_dim=4)
    _checks.check_tensor("canvas", canvas, dtypes=_CANVAS_DTYPES, ndim=4)
    channels = canvas.shape[1]
    _checks.check_tensor("weight", weight, dtypes=(torch.float32,), ndim=2)
    _checks.check_tensor("bias", bias, dtypes=(torch.float32,), ndim=1)
    if num_points.shape[0] != rows or coords.shape[0] != rows:
        raise ValueError(
            f"num_points, coords: expected {rows} rows (one per pillar of voxels), "
            f"got {num_points.shape[0]} and {coords.shape[0]}"
        )
    if tuple(weight.shape) != (NUM_DECORATED, channels) or tuple(bias.shape) != (channels,):
        raise ValueError(
            f"weight: expected ({NUM_DECORATED}, {channels}) and bias ({channels},) for a canvas of "
            f"{channels} channels, got {tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    if count is not None:
        _checks.check_tensor("count", count, dtypes=_checks.INT_DTYPES)
        if count.numel() != 1:
            raise ValueError(f"count: expected one value, got shape {tuple(count.shape)}")
    _checks.check_same_device(
        voxels=voxels, num_points=num_points, coords=coords, weight=weight, bias=bias, canvas=canvas, count=count
    )
    voxel_size = list(_checks.check_floats("voxel_size", voxel_size, 3, positive=True))
    range_min = list(_checks.check_floats("range_min", range_min, 3))
    _backend.resolve(backend, "pfn_scatter", voxels, supported=_BACKENDS)
    _library.call(
        torch.ops.pcops.pfn_scatter.default,
        voxels.contiguous(),
        num_points.to(torch.int32).contiguous(),
        coords.to(torch.int32).contiguous(),
        weight.contiguous(),
        bias.contiguous(),
        canvas,
        voxel_size,
        range_min,
        count,
        backend,
    )
    return canvas


# --- registration -------------------------------------------------------------------------------


@_library.custom_op("pcops::pfn_scatter", mutates_args=("canvas",), device_types=("cpu", "cuda"))
def _pfn_scatter(
    voxels: torch.Tensor,
    num_points: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    canvas: torch.Tensor,
    voxel_size: list[float],
    range_min: list[float],
    count: Optional[torch.Tensor],
    backend: str,
) -> None:
    impl = _backend.resolve(backend, "pfn_scatter", voxels, supported=_BACKENDS)  # "auto" on CUDA: Triton
    impl = "reference" if impl == "cpu" else impl
    _backend.log_kernel("pfn_scatter", impl)
    if impl == "reference":
        _ref.pfn_scatter(voxels, num_points, coords, weight, bias, canvas, voxel_size, range_min, count)
        return
    from .triton import pfn as tri

    tri.pfn_scatter(voxels, num_points, coords, weight, bias, canvas, voxel_size, range_min, count=count)


@_pfn_scatter.register_fake
def _pfn_scatter_fake(voxels, num_points, coords, weight, bias, canvas, voxel_size, range_min, count, backend):
    torch._check(voxels.dim() == 3 and voxels.shape[2] >= 4, lambda: "voxels: expected shape (M, T, >= 4)")
    torch._check(
        num_points.shape[0] == voxels.shape[0] and coords.shape[0] == voxels.shape[0],
        lambda: "num_points, coords: expected one row per pillar",
    )
    torch._check(canvas.dim() == 4 and weight.shape[1] == canvas.shape[1], lambda: "weight: expected (10, C)")
    return None
