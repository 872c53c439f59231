"""Per-point voxel cells (``dynamic_voxelize(cells_only=True)``): one launch, no fill, no sync;
and the cell arithmetic every voxelization kernel shares (exactly the reference's float32 math)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _launch


@triton.jit
def _voxel_cell(v, lo, hi, size, cells):
    """Cell index along one axis (int32) and the in-range test, exactly the reference's float32 math."""
    c = tl.floor(tl.math.div_rn(v - lo, size))
    ok = (v >= lo) & (v < hi) & (c < cells)
    return tl.where(ok, c, 0.0).to(tl.int32), ok


def _bmax(batch: int) -> int:
    """Samples as one vector up to 16 of them (one round trip instead of one per sample)."""
    return _launch.next_power_of_2(batch) if batch <= 16 else 0


def _grid_size(voxel_size, point_cloud_range):
    from ..reference.voxelize import grid_size

    return grid_size(voxel_size, point_cloud_range)


@triton.jit
def _point_cells_kernel(
    points_ptr,  # (N, C) contiguous, any float dtype
    lengths_ptr,  # (B,) int32/int64 sample lengths (unused without HAS_LENGTHS)
    out_ptr,  # (N, 4) int32 (b, z, y, x), -1 rows out of range
    num_points,
    num_channels,
    batch_size,
    x_lo,
    y_lo,
    z_lo,
    x_hi,
    y_hi,
    z_hi,
    vx,
    vy,
    vz,
    gx,
    gy,
    gz,
    HAS_LENGTHS: tl.constexpr,
    BMAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = p < num_points
    if HAS_LENGTHS:  # the sample of each point, as _voxelize_kernel finds it
        if BMAX > 0:
            j = tl.arange(0, BMAX)
            ends = tl.cumsum(tl.load(lengths_ptr + j, mask=j < batch_size, other=0).to(tl.int32), axis=0)
            ends = tl.where(j < batch_size, ends, 2147483647)
            b = tl.sum((ends[None, :] <= p[:, None]).to(tl.int32), axis=1)
        else:
            b = tl.full((BLOCK,), batch_size, tl.int32)
            acc = tl.program_id(0) * 0
            for i in range(batch_size):
                end = acc + tl.load(lengths_ptr + i).to(tl.int32)
                b = tl.where((p >= acc) & (p < end), i, b)
                acc = end
        ok = live & (b < batch_size)
    else:
        b = tl.zeros((BLOCK,), tl.int32)
        ok = live
    row = points_ptr + p.to(tl.int64) * num_channels
    cx, okx = _voxel_cell(tl.load(row + 0, mask=live, other=0.0).to(tl.float32), x_lo, x_hi, vx, gx)
    cy, oky = _voxel_cell(tl.load(row + 1, mask=live, other=0.0).to(tl.float32), y_lo, y_hi, vy, gy)
    cz, okz = _voxel_cell(tl.load(row + 2, mask=live, other=0.0).to(tl.float32), z_lo, z_hi, vz, gz)
    ok = ok & okx & oky & okz
    out = out_ptr + p.to(tl.int64) * 4
    tl.store(out + 0, tl.where(ok, b, -1), mask=live)
    tl.store(out + 1, tl.where(ok, cz, -1), mask=live)
    tl.store(out + 2, tl.where(ok, cy, -1), mask=live)
    tl.store(out + 3, tl.where(ok, cx, -1), mask=live)


def point_cells(points, lengths, voxel_size, point_cloud_range, block: int = 512):
    """``(N, 4)`` int32 cell of every point (−1 rows out of range): one launch, no fill, no sync."""
    n, num_channels = points.shape
    out = torch.empty((n, 4), dtype=torch.int32, device=points.device)
    if n == 0:
        return out
    batch = 1 if lengths is None else lengths.numel()
    gx, gy, gz = _grid_size(voxel_size, point_cloud_range)
    args = (
        points,
        lengths if lengths is not None else out,
        out,
        n,
        num_channels,
        batch,
        *(float(v) for v in point_cloud_range),
        *(float(v) for v in voxel_size),
        gx,
        gy,
        gz,
    )
    kwargs = dict(HAS_LENGTHS=lengths is not None, BMAX=_bmax(batch), BLOCK=block, num_warps=4)
    _launch.launch(_point_cells_kernel, (_launch.cdiv(n, block),), *args, **kwargs)
    if points.is_cuda and block == 512:
        _native_register(args, kwargs, lengths)
    return out


_NATIVE_DONE: set = set()  # the launches handed to the native host path (or found not registrable)


def _native_register(args: tuple, kwargs: dict, lengths) -> None:
    """Hand this launch's kernel to the native host path (``pcops._native``;
    ``csrc/host/voxelize_cells.cpp`` passes the arguments in this order), once per grid, dtypes,
    sample count and Triton specialisation of the point count."""
    from .. import _native

    host = _native.loaded()
    if host is None:
        return
    points = args[0]
    n, num_channels, batch = args[3], args[4], args[5]
    done = (points.device.index, points.dtype, None if lengths is None else lengths.dtype, args[6:15], num_channels,
            batch, _native.spec(n))  # fmt: skip
    if done in _NATIVE_DONE or not _native.registrable(*args[:3]):
        return
    _NATIVE_DONE.add(done)
    bound = _native.bind(_point_cells_kernel, (_launch.cdiv(n, kwargs["BLOCK"]),), args, kwargs, "pppiiifffffffffiii")
    if bound is not None:
        host.pc_register(points, lengths, list(args[6:12]), list(args[12:15]), *bound, kwargs["BLOCK"], *args[15:18])
