"""Pillar scatter: PointPillars' scatter of pillar features into the bird's-eye-view canvas.

This file is the op's contract and the model for every other op in pcops:
public function (docstring + argument checks) → ``torch.ops.pcops.pillar_scatter`` →
the implementation ``backend`` resolves to (``pcops._backend``: the reference on the CPU, Triton
or CUDA C++ on CUDA) → kernel; plus a fake (shape) function and a registered backward.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import _backend, _checks, _library, _native
from .reference import pillar_scatter as _ref

__all__ = ["pillar_scatter"]


def pillar_scatter(
    features: torch.Tensor,
    coords: torch.Tensor,
    batch_size: int,
    grid_hw: Sequence[int],
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Scatter pillar features into a dense BEV pseudo-image (PointPillars, Lang et al., CVPR 2019).

    Args:
        features: ``(P, C)`` float32/float16/bfloat16/float64, one feature vector per pillar.
        coords: ``(P, 4)`` int32 ``(batch, z, y, x)`` cell of each pillar, as OpenPCDet's
            ``voxel_coords`` (``z`` is ignored: pillars span the height). int64 is accepted
            and converted.
        batch_size: ``B`` ≥ 1, the number of canvases.
        grid_hw: ``(H, W)`` ≥ 1, the canvas size in cells (``y`` indexes H, ``x`` indexes W).
        backend: ``"auto"`` (default: on CUDA the Triton forward and the CUDA C++ backward where
            it applies, see Gradient; the reference on the CPU and for float64 features),
            ``"triton"``, ``"cuda"`` (CUDA C++ from ``csrc/pillar_scatter.cu`` compiled at run time
            with NVRTC; both CUDA tensors only, forward and backward) or ``"reference"`` (any
            device). The backward runs the forward's choice.

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
    canvas pass), the backward 2 (zero fill, then a pass reading the canvas gradient in cell
    order: ``csrc`` ``pillar_gather_b4x4`` for 4-byte floats with C and H·W multiples of 4 and
    16-byte aligned data, the Triton one otherwise; ``"auto"`` takes the CUDA C++ one where it
    applies and NVRTC loads; ``"cuda"`` raises ``ValueError`` for other canvases).

    Host path: on CUDA, float32 features with C and H·W multiples of 4 (16-byte aligned, int32
    coords) are taken by the native host path (``pcops._native``: checks, allocations and the
    launches in C++, the gradient a C++ autograd node; once its build is loaded and a call has
    run on the device) with the CUDA C++ kernels for forward and backward (``"auto"`` and
    ``"cuda"``): the same canvas and gradient as the Python path, bit for bit.

    Example:
        >>> features = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> coords = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 0]], dtype=torch.int32)  # (batch, z, y, x)
        >>> pcops.pillar_scatter(features, coords, batch_size=1, grid_hw=(2, 2))[0, 0]
        tensor([[0., 1.],
                [3., 0.]])
    """
    host = None if torch.compiler.is_compiling() else _native.MODULE  # takes what it can (pcops._native)
    if host is not None:
        canvas = host.ps_forward(features, coords, batch_size, grid_hw, backend)
        if canvas is not None:
            return canvas
    _checks.check_tensor("features", features, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    _checks.check_tensor("coords", coords, dtypes=_checks.INT_DTYPES, ndim=2, last_dim=4)
    _checks.check_same_device(features=features, coords=coords)
    if coords.shape[0] != features.shape[0]:
        raise ValueError(f"coords: expected {features.shape[0]} rows (one per row of features), got {coords.shape[0]}")
    batch_size = _checks.check_int("batch_size", batch_size, min_value=1)
    if isinstance(grid_hw, (str, bytes)) or not hasattr(grid_hw, "__len__") or len(grid_hw) != 2:
        raise TypeError(f"grid_hw: expected a pair (H, W), got {grid_hw!r}")
    grid_h = _checks.check_int("grid_hw[0]", grid_hw[0], min_value=1)
    grid_w = _checks.check_int("grid_hw[1]", grid_hw[1], min_value=1)
    _backend.resolve(backend, "pillar_scatter", features)  # bad values fail before the dispatch
    coords = (coords if coords.dtype == torch.int32 else coords.to(torch.int32)).contiguous()  # (.to costs a call)
    canvas, _ = _library.call(
        torch.ops.pcops.pillar_scatter.default, features.contiguous(), coords, batch_size, grid_h, grid_w, backend
    )
    return canvas


# --- registration: one schema per op; ``backend`` picks the implementation (pcops._backend) -------


_nvrtc_available = _backend.nvrtc_available


def _scatter_impl(backend: str, features: torch.Tensor) -> str:
    """``"reference"``, ``"triton"`` or ``"cuda"`` for the forward (``"auto"`` on CUDA: Triton)."""
    impl = _backend.resolve(backend, "pillar_scatter", features)
    return "reference" if impl == "cpu" else impl


def _scatter_run(impl, features, coords, batch_size, grid_h, grid_w):
    if impl == "reference":
        return _ref.pillar_scatter(features, coords, batch_size, grid_h, grid_w)
    if features.is_cuda and features.device.index not in _NATIVE_DONE:
        _native_register(features.device)
    if impl == "cuda":
        from .cuda import pillar_scatter as gpu
    else:
        from .triton import pillar_scatter as gpu
    return gpu.pillar_scatter(features, coords, batch_size, grid_h, grid_w)


@_library.custom_op("pcops::pillar_scatter", mutates_args=(), device_types=("cpu", "cuda"))
def _pillar_scatter(
    features: torch.Tensor, coords: torch.Tensor, batch_size: int, grid_h: int, grid_w: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = _scatter_impl(backend, features)
    _backend.log_kernel("pillar_scatter", impl)
    return _scatter_run(impl, features, coords, batch_size, grid_h, grid_w)


@_pillar_scatter.register_fake
def _pillar_scatter_fake(features, coords, batch_size, grid_h, grid_w, backend):
    torch._check(features.dim() == 2, lambda: "features: expected a 2-D tensor")
    torch._check(coords.dim() == 2 and coords.shape[1] == 4, lambda: "coords: expected shape (P, 4)")
    torch._check(coords.shape[0] == features.shape[0], lambda: "coords: expected one row per pillar")
    canvas = features.new_empty((batch_size, features.shape[1], grid_h, grid_w))
    winner = coords.new_empty((batch_size * grid_h * grid_w,), dtype=torch.int32)
    return canvas, winner


def _gather_impl(backend: str, canvas: torch.Tensor) -> str:
    """The backward's implementation: ``"auto"`` on CUDA takes the CUDA C++ stream where it applies
    (and NVRTC loads), else Triton's; ``"cuda"`` raises for a canvas its kernel does not take."""
    # auto_cuda="auto": "auto" must reach the CUDA C++ test below (resolve's default would say "triton")
    impl = _backend.resolve(backend, "pillar_scatter", canvas, auto_cuda="auto")
    if impl in ("cpu", "reference", "triton"):
        return "reference" if impl == "cpu" else impl
    from .cuda import pillar_scatter as cu

    if cu.gather_supported(canvas) and (backend == "cuda" or _nvrtc_available()):
        return "cuda"
    if backend == "auto":
        return "triton"
    raise ValueError(
        "backend: the 'cuda' backward needs 4-byte floats with C and H*W multiples of 4 and 16-byte aligned data, "
        f"got a {canvas.dtype} canvas of shape {tuple(canvas.shape)}; use backend='auto' or 'triton'"
    )


@_library.custom_op("pcops::pillar_gather", mutates_args=(), device_types=("cpu", "cuda"))
def _pillar_gather(canvas: torch.Tensor, coords: torch.Tensor, winner: torch.Tensor, backend: str) -> torch.Tensor:
    canvas = canvas.contiguous()
    impl = _gather_impl(backend, canvas)
    _backend.log_kernel("pillar_gather", impl)
    if impl == "reference":
        return _ref.pillar_gather(canvas, coords, winner)
    if impl == "cuda":
        from .cuda import pillar_scatter as gpu
    else:
        from .triton import pillar_scatter as gpu
    return gpu.pillar_gather(canvas, coords, winner)


@_pillar_gather.register_fake
def _pillar_gather_fake(canvas, coords, winner, backend):
    torch._check(canvas.dim() == 4, lambda: "canvas: expected a 4-D tensor")
    return canvas.new_empty((coords.shape[0], canvas.shape[1]))


def _setup_context(ctx, inputs, output):
    _, coords, *_, backend = inputs
    _, winner = output
    ctx.save_for_backward(coords, winner)
    ctx.mark_non_differentiable(winner)
    ctx.backend = backend


def _backward(ctx, grad_canvas, _grad_winner):
    coords, winner = ctx.saved_tensors
    grad_features = _library.call(
        torch.ops.pcops.pillar_gather.default, grad_canvas.contiguous(), coords, winner, ctx.backend
    )
    return grad_features, None, None, None, None, None


_pillar_scatter.register_autograd(_backward, setup_context=_setup_context)


def _gather_setup_context(ctx, inputs, output):
    canvas, coords, winner, backend = inputs
    ctx.save_for_backward(coords, winner)
    ctx.shape = canvas.shape
    ctx.backend = backend


def _gather_backward(ctx, grad_out):
    # double backward: the adjoint of the gather is the scatter (non-owners get nothing)
    coords, winner = ctx.saved_tensors
    batch_size, _, grid_h, grid_w = ctx.shape
    canvas, _ = _library.call(
        torch.ops.pcops.pillar_scatter.default, grad_out.contiguous(), coords, batch_size, grid_h, grid_w, ctx.backend
    )
    return canvas, None, None, None


_pillar_gather.register_autograd(_gather_backward, setup_context=_gather_setup_context)


_NATIVE_DONE: set = set()  # device indices whose kernels the native host path has (or cannot have)


def _native_register(device: torch.device) -> None:
    """Hand ``csrc/pillar_scatter.cu``'s kernels for ``device`` to the native host path (once per
    device; the first CUDA call starts the module's build)."""
    host = _native.loaded()
    if host is None:
        return
    _NATIVE_DONE.add(device.index)
    if not _nvrtc_available():
        return
    from .cuda import pillar_scatter as cu
    from ._nvrtc import get_kernel

    try:
        names = ("pillar_winner", "pillar_canvas_b4x4", "pillar_gather_b4x4")
        handles = [get_kernel("pillar_scatter.cu", k, device)._handle for k in names]
    except Exception as e:  # noqa: BLE001 - NVRTC cannot build them here: the Python path stays
        _backend.logger.warning("pcops: pillar_scatter's CUDA C++ kernels are unavailable to the native path (%s)", e)
        return
    host.ps_register(device.index, *handles, cu._VECS_PER_SLICE)


def _native_gather(grad_canvas, coords, winner):
    """The native path's backward where its kernel does not take the gradient (or with
    ``create_graph``): the Python path's gather op."""
    return _library.call(torch.ops.pcops.pillar_gather.default, grad_canvas, coords, winner, "auto")


_native.on_load(lambda host: host.ps_init(_native_gather))
