"""Pillar scatter: PointPillars' scatter of pillar features into the bird's-eye-view canvas.

This file is the op's contract and the model for every other op in pcops:
public function (docstring + argument checks) → ``torch.ops.pcops.pillar_scatter`` →
the implementation registered for the tensor's device (``reference`` on the CPU, Triton or
CUDA C++ on CUDA) → kernel; plus a fake (shape) function and a registered backward.
"""
from __future__ import annotations

from typing import Sequence

import torch

from . import _checks
from .reference import pillar_scatter as _ref

__all__ = ["pillar_scatter"]

_BACKENDS = ("triton", "cuda")


def pillar_scatter(
    features: torch.Tensor,
    coords: torch.Tensor,
    batch_size: int,
    grid_hw: Sequence[int],
    *,
    backend: str = "triton",
) -> torch.Tensor:
    """Scatter pillar features into a dense BEV pseudo-image (PointPillars, Lang et al., CVPR 2019).

    Args:
        features: ``(P, C)`` float32/float16/bfloat16/float64, one feature vector per pillar.
        coords: ``(P, 4)`` int32 ``(batch, z, y, x)`` cell of each pillar, as OpenPCDet's
            ``voxel_coords`` (``z`` is ignored: pillars span the height). int64 is accepted
            and converted.
        batch_size: ``B`` ≥ 1, the number of canvases.
        grid_hw: ``(H, W)`` ≥ 1, the canvas size in cells (``y`` indexes H, ``x`` indexes W).
        backend: the CUDA implementation: ``"triton"`` (default) or ``"cuda"`` (CUDA C++ from
            ``csrc/pillar_scatter.cu`` compiled at run time with NVRTC). Ignored on the CPU.

    Returns:
        ``(B, C, H, W)`` canvas of ``features.dtype``, zero where no pillar lands.

    Duplicates: when several pillars share a cell, the one with the highest index wins (as if
    they were assigned in order); the result is deterministic on every device, and the
    gradient reaches the winner only.

    Out-of-grid coordinates: the CPU path raises ``ValueError``; the GPU paths cannot check
    without a host synchronisation, so they skip such pillars (nothing is written out of
    bounds and their gradient is zero).

    Gradient: w.r.t. ``features`` only, a gather from the canvas gradient. No host
    synchronisation on the GPU: the forward takes 3 launches (winner-map fill, winner atomics,
    canvas pass), the backward 2 (zero fill, then ``csrc`` ``pillar_gather_b4x4`` reading the
    canvas gradient in cell order, for 4-byte floats with C and H·W multiples of 4) or 1 (a Triton
    gather per pillar, otherwise); see ``_GATHER``.
    """
    _checks.check_tensor("features", features, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    _checks.check_tensor("coords", coords, dtypes=_checks.INT_DTYPES, ndim=2, last_dim=4)
    _checks.check_same_device(features=features, coords=coords)
    if coords.shape[0] != features.shape[0]:
        raise ValueError(
            f"coords: expected {features.shape[0]} rows (one per row of features), got {coords.shape[0]}"
        )
    batch_size = _checks.check_int("batch_size", batch_size, min_value=1)
    if isinstance(grid_hw, (str, bytes)) or not hasattr(grid_hw, "__len__") or len(grid_hw) != 2:
        raise TypeError(f"grid_hw: expected a pair (H, W), got {grid_hw!r}")
    grid_h = _checks.check_int("grid_hw[0]", grid_hw[0], min_value=1)
    grid_w = _checks.check_int("grid_hw[1]", grid_hw[1], min_value=1)
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {_BACKENDS}, got {backend!r}")
    coords = coords.to(torch.int32).contiguous()
    canvas, _ = torch.ops.pcops.pillar_scatter(features.contiguous(), coords, batch_size, grid_h, grid_w, backend)
    return canvas


# --- registration: one schema, one implementation per device key --------------------------


@torch.library.custom_op("pcops::pillar_scatter", mutates_args=(), device_types="cpu")
def _pillar_scatter(
    features: torch.Tensor, coords: torch.Tensor, batch_size: int, grid_h: int, grid_w: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ref.pillar_scatter(features, coords, batch_size, grid_h, grid_w)


@_pillar_scatter.register_kernel("cuda")
def _pillar_scatter_cuda(features, coords, batch_size, grid_h, grid_w, backend):
    if backend == "cuda":
        from .cuda import pillar_scatter as impl
    else:
        from .triton import pillar_scatter as impl
    return impl.pillar_scatter(features, coords, batch_size, grid_h, grid_w)


@_pillar_scatter.register_fake
def _pillar_scatter_fake(features, coords, batch_size, grid_h, grid_w, backend):
    torch._check(features.dim() == 2, lambda: "features: expected a 2-D tensor")
    torch._check(coords.dim() == 2 and coords.shape[1] == 4, lambda: "coords: expected shape (P, 4)")
    torch._check(coords.shape[0] == features.shape[0], lambda: "coords: expected one row per pillar")
    canvas = features.new_empty((batch_size, features.shape[1], grid_h, grid_w))
    winner = coords.new_empty((batch_size * grid_h * grid_w,), dtype=torch.int32)
    return canvas, winner


@torch.library.custom_op("pcops::pillar_gather", mutates_args=(), device_types="cpu")
def _pillar_gather(canvas: torch.Tensor, coords: torch.Tensor, winner: torch.Tensor) -> torch.Tensor:
    return _ref.pillar_gather(canvas, coords, winner)


# the backward's kernel on CUDA: "cuda" (csrc pillar_gather_b4x4, streaming over the canvas in cell
# order, where it applies: 4-byte floats, C and H*W multiples of 4; else Triton), "triton_stream" (the
# same order in Triton), "triton" (one gather per pillar and channel: C reads at stride H*W each)
_GATHER = "cuda"


@_pillar_gather.register_kernel("cuda")
def _pillar_gather_cuda(canvas, coords, winner):
    from .triton import pillar_scatter as tri

    canvas = canvas.contiguous()
    if _GATHER == "cuda":
        from .cuda import pillar_scatter as cu

        if cu.gather_supported(canvas):
            return cu.pillar_gather(canvas, coords, winner)
    return tri.pillar_gather(canvas, coords, winner, stream=_GATHER != "triton")


@_pillar_gather.register_fake
def _pillar_gather_fake(canvas, coords, winner):
    torch._check(canvas.dim() == 4, lambda: "canvas: expected a 4-D tensor")
    return canvas.new_empty((coords.shape[0], canvas.shape[1]))


def _setup_context(ctx, inputs, output):
    _, coords, *_ = inputs
    _, winner = output
    ctx.save_for_backward(coords, winner)
    ctx.mark_non_differentiable(winner)


def _backward(ctx, grad_canvas, _grad_winner):
    coords, winner = ctx.saved_tensors
    grad_features = torch.ops.pcops.pillar_gather(grad_canvas.contiguous(), coords, winner)
    return grad_features, None, None, None, None, None


_pillar_scatter.register_autograd(_backward, setup_context=_setup_context)


def _gather_setup_context(ctx, inputs, output):
    canvas, coords, winner = inputs
    ctx.save_for_backward(coords, winner)
    ctx.shape = canvas.shape


def _gather_backward(ctx, grad_out):
    # double backward: the adjoint of the gather is the scatter (non-owners get nothing)
    coords, winner = ctx.saved_tensors
    batch_size, _, grid_h, grid_w = ctx.shape
    canvas, _ = torch.ops.pcops.pillar_scatter(grad_out.contiguous(), coords, batch_size, grid_h, grid_w, "triton")
    return canvas, None, None


_pillar_gather.register_autograd(_gather_backward, setup_context=_gather_setup_context)
