"""Triton kernel of ``pcops.pfn_scatter``: the fused pillar feature net (PointPillars' PillarVFE
with one PFN layer) + pillar scatter.

``BLOCK_P`` pillars per program: load their ``T`` point slots, decorate each point with the
offsets to the pillar's point mean and to the pillar centre (OpenPCDet's ``PillarVFE``: ``x, y,
z, r, f_cluster, f_center``), zero the padding slots *after* decoration, apply the linear layer
with the BatchNorm folded in (one ``tl.dot``), ReLU, take the max over the ``T`` slots and store
the ``C`` results straight into the BEV canvas at the pillar's cell. The ``(P, T, C)``
intermediate of the unfused network never reaches memory: the kernel reads ``P·T·4`` floats and
writes ``P·C`` (the canvas itself is zeroed by the caller); programs past the valid-row count
exit at once.

Padding slots count in the max, as in OpenPCDet: their features are zero, so they contribute
``relu(b')``. The canvas may be contiguous ``(B, C, H, W)`` or channels-last (its strides are
passed), float32 or float16/bfloat16 (the store rounds).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pfn import NUM_DECORATED, fold_batchnorm  # noqa: F401 (fold_batchnorm: its old import path)
from . import _launch

# pillars per program
_DOT_PILLARS = 4


@triton.jit
def _pillar_header(num_points_ptr, coords_ptr, row, in_rows, batch_size, grid_h, grid_w):
    """Point count and (batch, z, y, x) cell of pillar row(s) ``row`` (int64, scalar or block),
    and whether each is live: a real pillar inside the canvas (only live rows are ever written)."""
    n = tl.load(num_points_ptr + row, mask=in_rows, other=0)
    b = tl.load(coords_ptr + row * 4 + 0, mask=in_rows, other=-1)
    cz = tl.load(coords_ptr + row * 4 + 1, mask=in_rows, other=0)
    cy = tl.load(coords_ptr + row * 4 + 2, mask=in_rows, other=-1)
    cx = tl.load(coords_ptr + row * 4 + 3, mask=in_rows, other=-1)
    live = in_rows & (n > 0) & (b >= 0) & (b < batch_size) & (cy >= 0) & (cy < grid_h)
    live = live & (cx >= 0) & (cx < grid_w)
    return n, b, cz, cy, cx, live


@triton.jit
def _pfn_scatter_dot_kernel(
    voxels_ptr,  # (M, T, F) float32, zero-padded point slots, F >= 4 (x, y, z, r, ...)
    num_points_ptr,  # (M,) int32, valid slots per pillar (0 = unused capacity row)
    coords_ptr,  # (M, 4) int32 (batch, z, y, x)
    count_ptr,  # (1,) int32, number of valid rows of M (rows >= count are skipped)
    weight_ptr,  # (10, C) float32, linear weight with the BatchNorm scale folded in (row k = feature k)
    bias_ptr,  # (C,) float32, folded BatchNorm shift
    canvas_ptr,  # (B, C, H, W) output, any strides (contiguous or channels-last)
    num_rows,  # M
    num_slots,  # T, point slots per pillar
    num_feats,  # F, features per point slot
    num_channels,  # C
    batch_size,  # B
    grid_h,  # H
    grid_w,  # W
    stride_b,  # canvas strides in elements
    stride_c,
    stride_y,
    stride_x,
    voxel_x,  # voxel size in metres
    voxel_y,
    voxel_z,
    x_offset,  # voxel_x / 2 + range xmin: centre of cell 0
    y_offset,
    z_offset,
    BLOCK_P: tl.constexpr,  # pillars per program
    BLOCK_T: tl.constexpr,  # >= T, power of two
    BLOCK_C: tl.constexpr,  # >= C, power of two
):
    """The decorated features of ``BLOCK_P`` pillars form a ``(P·T, 16)`` matrix (10 columns used)
    multiplied by the folded weight with one ``tl.dot`` in IEEE float32 (no TF32)."""
    pid = tl.program_id(0)
    count = tl.minimum(tl.load(count_ptr), num_rows)
    if pid * BLOCK_P >= count:
        return
    rows = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    in_rows = rows < count
    rows64 = rows.to(tl.int64)
    n, b, cz, cy, cx, live = _pillar_header(num_points_ptr, coords_ptr, rows64, in_rows, batch_size, grid_h, grid_w)

    t = tl.arange(0, BLOCK_T)
    in_t = t < num_slots
    ld = live[:, None] & in_t[None, :]
    base = voxels_ptr + (rows64 * num_slots * num_feats)[:, None] + (t * num_feats)[None, :]
    px = tl.load(base + 0, mask=ld, other=0.0).to(tl.float32)  # (P, T)
    py = tl.load(base + 1, mask=ld, other=0.0).to(tl.float32)
    pz = tl.load(base + 2, mask=ld, other=0.0).to(tl.float32)
    pr = tl.load(base + 3, mask=ld, other=0.0).to(tl.float32)
    n_f = tl.maximum(n, 1).to(tl.float32)
    mx = tl.sum(px, axis=1) / n_f
    my = tl.sum(py, axis=1) / n_f
    mz = tl.sum(pz, axis=1) / n_f
    ctr_x = cx.to(tl.float32) * voxel_x + x_offset
    ctr_y = cy.to(tl.float32) * voxel_y + y_offset
    ctr_z = cz.to(tl.float32) * voxel_z + z_offset
    valid = t[None, :] < n[:, None]

    # the (P, T, 16) feature tensor, column k = decorated feature k (k >= 10: zero)
    k = tl.arange(0, 16)[None, None, :]
    x = tl.where(k == 0, px[:, :, None], 0.0)
    x = tl.where(k == 1, py[:, :, None], x)
    x = tl.where(k == 2, pz[:, :, None], x)
    x = tl.where(k == 3, pr[:, :, None], x)
    x = tl.where(k == 4, (px - mx[:, None])[:, :, None], x)
    x = tl.where(k == 5, (py - my[:, None])[:, :, None], x)
    x = tl.where(k == 6, (pz - mz[:, None])[:, :, None], x)
    x = tl.where(k == 7, (px - ctr_x[:, None])[:, :, None], x)
    x = tl.where(k == 8, (py - ctr_y[:, None])[:, :, None], x)
    x = tl.where(k == 9, (pz - ctr_z[:, None])[:, :, None], x)
    x = tl.where(valid[:, :, None], x, 0.0)  # padding slots zeroed after decoration
    x = tl.reshape(x, (BLOCK_P * BLOCK_T, 16))

    c = tl.arange(0, BLOCK_C)
    in_c = c < num_channels
    kk = tl.arange(0, 16)
    w = tl.load(
        weight_ptr + kk[:, None] * num_channels + c[None, :], mask=(kk[:, None] < 10) & in_c[None, :], other=0.0
    )
    acc = tl.dot(x, w, input_precision="ieee")  # (P*T, C) float32
    acc = tl.maximum(acc + tl.load(bias_ptr + c, mask=in_c, other=0.0)[None, :], 0.0)
    acc = tl.reshape(acc, (BLOCK_P, BLOCK_T, BLOCK_C))
    acc = tl.where(in_t[None, :, None], acc, 0.0)  # block padding slots never win (ReLU >= 0)
    out = tl.max(acc, axis=1)  # (P, C)

    cell = b.to(tl.int64) * stride_b + cy.to(tl.int64) * stride_y + cx.to(tl.int64) * stride_x
    dst = canvas_ptr + cell[:, None] + (c.to(tl.int64) * stride_c)[None, :]
    tl.store(dst, out.to(canvas_ptr.dtype.element_ty), mask=live[:, None] & in_c[None, :])


def pfn_scatter(
    voxels: torch.Tensor,
    num_points: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    canvas: torch.Tensor,
    voxel_size: tuple[float, float, float],
    range_min: tuple[float, float, float],
    count: torch.Tensor | None = None,
    variant: str | None = None,
) -> torch.Tensor:
    """Run the fused pillar feature net and write each pillar's features into ``canvas``.

    Args:
        voxels: ``(M, T, F)`` float32 point slots per pillar (zero padded), ``F >= 4``.
        num_points: ``(M,)`` int32 valid slots per pillar; rows with 0 are skipped.
        coords: ``(M, 4)`` int32 ``(batch, z, y, x)`` cells; rows outside the canvas are skipped.
        weight: ``(10, C)`` float32 folded weight (see :func:`fold_batchnorm`).
        bias: ``(C,)`` float32 folded bias.
        canvas: ``(B, C, H, W)`` output, zeroed by the caller, any strides, float32/float16/bfloat16.
            Cells without a pillar are left untouched. Two pillars on one cell is a caller error
            (the voxelizer never produces it); the last store wins, unordered.
        voxel_size: ``(vx, vy, vz)`` metres.
        range_min: ``(xmin, ymin, zmin)`` metres of the point-cloud range.
        count: optional ``(1,)`` int32 device tensor: only rows ``< count`` are read (the fixed-capacity
            voxelizer's output count; no host synchronisation). Default: all ``M`` rows.
        variant: ``None`` or ``"dot"``, the one kernel (kept for old callers).
    Returns:
        ``canvas`` (written in place). One launch of ``ceil(M / 4)`` programs; no host synchronisation.

    The launcher of ``pcops.pfn_scatter`` (the registered op, with the argument checks, the CPU
    reference and ``torch.compile`` support); called directly it skips the dispatcher.
    """
    num_rows, num_slots, num_feats = voxels.shape
    num_channels = canvas.shape[1]
    if weight.shape != (NUM_DECORATED, num_channels) or bias.shape != (num_channels,):
        raise ValueError(
            f"weight: expected ({NUM_DECORATED}, {num_channels}) and bias ({num_channels},), "
            f"got {tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    if num_feats < 4:
        raise ValueError(f"voxels: expected at least 4 features per point, got shape {tuple(voxels.shape)}")
    if count is None:
        count = torch.full((1,), num_rows, dtype=torch.int32, device=voxels.device)
    if num_rows == 0:
        return canvas
    voxels = voxels.contiguous()
    vx, vy, vz = (float(v) for v in voxel_size)
    x0, y0, z0 = (float(v) for v in range_min)
    sb, sc, sy, sx = canvas.stride()
    if variant not in (None, "dot"):
        raise ValueError(f"variant: expected None or 'dot' (the one kernel), got {variant!r}")
    args = (
        voxels,
        num_points.to(torch.int32).contiguous(),
        coords.to(torch.int32).contiguous(),
        count.to(torch.int32),
        weight.contiguous(),
        bias.contiguous(),
        canvas,
    )
    geometry = (
        num_slots,
        num_feats,
        num_channels,
        canvas.shape[0],
        canvas.shape[2],
        canvas.shape[3],
        sb,
        sc,
        sy,
        sx,
        vx,
        vy,
        vz,
        vx / 2 + x0,
        vy / 2 + y0,
        vz / 2 + z0,
    )
    block_t, block_c = _launch.next_power_of_2(num_slots), _launch.next_power_of_2(num_channels)
    _launch.launch(
        _pfn_scatter_dot_kernel,
        (_launch.cdiv(num_rows, _DOT_PILLARS),),
        *args,
        num_rows,
        *geometry,
        BLOCK_P=_DOT_PILLARS,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
        num_warps=4,
    )
    return canvas
