"""The second pass of hard voxelization (``pcops.triton.voxelize``): per-voxel output rows.

``_voxel_scatter_kernel`` (CSR mode) lays each kept voxel's points out as a CSR segment in
arrival order; ``_voxel_rows_kernel`` maps each packed output row to its sample's voxel, keeps
the voxel's ``max_points_per_voxel`` lowest point indices (a sort of the CSR segment, or the
ranked list of the lists mode), gathers the points into ``voxels`` with the zero padding in the
same pass, and writes ``coords``, ``num_points``, ``point_to_voxel`` and the per-sample counts.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _voxel_scatter_kernel(
    lrb_ptr,  # (N,) int32 list row of each kept-voxel point, -1 none
    posb_ptr,  # (N,) int32 arrival position of the point in its list row
    cnt_ptr,  # (B * S,) int32 points per list row minus one
    csum_ptr,  # (B * S,) int32 inclusive cumulative sum of cnt
    seg_ptr,  # (N,) int32 out: the points of list row l at [start(l), start(l) + count(l)), arrival order
    num_points,
    BLOCK: tl.constexpr,
    REVERSE: tl.constexpr,  # tests: lay segments out in reverse arrival order (the rows kernel must merge)
):
    """CSR mode: every point of a kept voxel to its arrival position in its voxel's segment.
    ``start(l) = csum[l] + l - cnt[l]``: the counts are stored minus one, so the inclusive sum of
    the true counts up to ``l`` is ``csum[l] + l + 1``."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = p < num_points
    lr = tl.load(lrb_ptr + p, mask=live, other=-1)
    m = live & (lr >= 0)
    pos = tl.load(posb_ptr + p, mask=m, other=0)
    cnt = tl.load(cnt_ptr + lr, mask=m, other=0)  # count - 1
    start = tl.load(csum_ptr + lr, mask=m, other=0) + lr - cnt
    if REVERSE:
        pos = cnt - pos
    tl.store(seg_ptr + start + pos, p, mask=m)


@triton.jit
def _voxel_rows_kernel(
    points_ptr,  # (N, C) contiguous
    stats_ptr,  # (2, B) int32 per-sample voxel counts before / after (from the main kernel)
    drop_ptr,  # (B,) int32 dropped-point counters (start at -1)
    lists_ptr,  # (B * S, PB) int32 per-voxel lists of N - 1 - p (not CSR)
    cnt_ptr,  # (B * S,) int32 points per list row minus one (CSR only)
    csum_ptr,  # (B * S,) int32 inclusive cumulative sum of cnt (CSR only)
    seg_ptr,  # (N,) int32 the list rows' points, CSR segments in arrival order (CSR only)
    voxels_ptr,  # (R, P, C) output
    coords_ptr,  # (R, 4) int32 output
    npts_ptr,  # (R,) int32 output
    p2v_ptr,  # (N,) int64 point_to_voxel (kept points written here)
    nvox_ptr,  # (B,) int64 output: num_voxels
    ndp_ptr,  # (B,) int64 output: num_dropped_points
    ndv_ptr,  # (B,) int64 output: num_dropped_voxels
    num_points,
    num_channels,
    batch_size,
    num_rows,
    x_lo,
    y_lo,
    z_lo,
    vx,
    vy,
    vz,
    max_points,
    max_voxels,
    list_stride,
    PB: tl.constexpr,
    CB: tl.constexpr,
    ROWS: tl.constexpr,
    SB: tl.constexpr,
    BMAX: tl.constexpr,  # as in _voxelize_kernel
    C_EXACT: tl.constexpr,  # num_channels == CB: a constant row stride (vector loads and stores)
    CSR: tl.constexpr,  # the voxels' points come from CSR segments (arrival order) instead of ranked lists
):
    pid = tl.program_id(0)
    if C_EXACT:
        nc = CB
    else:
        nc = num_channels
    r = pid * ROWS + tl.arange(0, ROWS)
    # packed output row -> (sample, row in the sample)
    if BMAX > 0:
        j = tl.arange(0, BMAX)
        mj = j < batch_size
        n_j = tl.load(stats_ptr + batch_size + j, mask=mj, other=0) - tl.load(stats_ptr + j, mask=mj, other=0)
        incl = tl.cumsum(tl.minimum(n_j, max_voxels), axis=0)  # kept rows up to and including sample j
        incl = tl.where(mj, incl, 2147483647)
        le = incl[None, :] <= r[:, None]
        b = tl.sum(le.to(tl.int32), axis=1)
        base = tl.max(tl.where(le, incl[None, :], 0), axis=1)
        b = tl.where(b < batch_size, b, -1)
    else:
        b = tl.full((ROWS,), -1, tl.int32)
        base = tl.zeros((ROWS,), tl.int32)
        cum = pid * 0
        for i in range(batch_size):
            n_i = tl.load(stats_ptr + batch_size + i) - tl.load(stats_ptr + i)
            k_i = tl.minimum(n_i, max_voxels)
            inside = (r >= cum) & (r < cum + k_i)
            b = tl.where(inside, i, b)
            base = tl.where(inside, cum, base)
            cum += k_i
    in_rows = r < num_rows
    real = in_rows & (b >= 0)
    lrow = (b.to(tl.int64) * list_stride + (r - base)).to(tl.int64)

    jj = tl.arange(0, PB)
    if CSR:
        # the max_points smallest point indices of the segment, ascending: sort the first PB, then
        # merge each further chunk of PB (sort both, keep the lower half); padding sorts last
        big = 2147483647
        c = tl.load(cnt_ptr + lrow, mask=real, other=-1) + 1
        start = tl.load(csum_ptr + lrow, mask=real, other=0) + lrow + 1 - c
        seg = seg_ptr + start[:, None] + jj[None, :]
        best = tl.full((ROWS, PB), big, tl.int32)
        c_max = tl.max(c, axis=0)
        if c_max > 0:  # programs past the last voxel (pad_to_max) write padding only: no sort
            best = tl.sort(tl.load(seg, mask=jj[None, :] < c[:, None], other=big), dim=1)
            k = pid * 0 + PB
            while k < c_max:  # only programs holding a voxel of more than PB points
                chunk = tl.load(seg + k, mask=(jj[None, :] + k) < c[:, None], other=big)
                # segments are in arrival order, which follows the blocks' ticket order, so later
                # chunks rarely hold an index below the PB-th smallest so far: skip their sort
                if tl.max((tl.min(chunk, axis=1) < tl.max(best, axis=1)).to(tl.int32), axis=0) > 0:
                    both = tl.sort(tl.reshape(tl.join(best, chunk), (ROWS, 2 * PB)), dim=1)
                    best, _ = tl.split(tl.permute(tl.reshape(both, (ROWS, 2, PB)), (0, 2, 1)))
                k += PB
        has = (best < big) & (jj < max_points)[None, :]
        pidx = best.to(tl.int64)
        e = tl.where(has, num_points - 1 - best, -1)  # the lists' encoding, for the first point below
    else:
        e = tl.load(
            lists_ptr + lrow[:, None] * PB + jj[None, :], mask=real[:, None] & (jj < max_points)[None, :], other=-1
        )
        has = e >= 0
        pidx = (num_points - 1 - e).to(tl.int64)
    npts = tl.sum(has.to(tl.int32), axis=1)
    tl.store(npts_ptr + r, npts, mask=in_rows)
    r64 = r.to(tl.int64)
    tl.store(p2v_ptr + pidx, tl.zeros((ROWS, PB), tl.int64) + r64[:, None], mask=has)

    cc = tl.arange(0, CB)
    if C_EXACT:
        cmask = tl.full((1, 1, CB), 1, tl.int1)  # a constant mask keeps the accesses vectorised
    else:
        cmask = (cc < nc)[None, None, :]
    vals = tl.load(points_ptr + pidx[:, :, None] * nc + cc[None, None, :], mask=has[:, :, None] & cmask, other=0.0)
    out = voxels_ptr + (r64[:, None, None] * max_points + jj[None, :, None]) * nc + cc[None, None, :]
    tl.store(out, vals, mask=in_rows[:, None, None] & (jj < max_points)[None, :, None] & cmask)

    # coords from the voxel's first point (recomputed with the main kernel's arithmetic)
    fp = (num_points - 1 - tl.max(e, axis=1)).to(tl.int64)
    fx = tl.load(points_ptr + fp * nc + 0, mask=real, other=0.0).to(tl.float32)
    fy = tl.load(points_ptr + fp * nc + 1, mask=real, other=0.0).to(tl.float32)
    fz = tl.load(points_ptr + fp * nc + 2, mask=real, other=0.0).to(tl.float32)
    cx = tl.floor(tl.math.div_rn(fx - x_lo, vx)).to(tl.int32)
    cy = tl.floor(tl.math.div_rn(fy - y_lo, vy)).to(tl.int32)
    cz = tl.floor(tl.math.div_rn(fz - z_lo, vz)).to(tl.int32)
    crow = coords_ptr + r64 * 4
    tl.store(crow + 0, tl.where(real, b, -1), mask=in_rows)
    tl.store(crow + 1, tl.where(real, cz, -1), mask=in_rows)
    tl.store(crow + 2, tl.where(real, cy, -1), mask=in_rows)
    tl.store(crow + 3, tl.where(real, cx, -1), mask=in_rows)

    if pid == 0:
        for s0 in range(0, batch_size, SB):
            s = s0 + tl.arange(0, SB)
            ms = s < batch_size
            n_s = tl.load(stats_ptr + batch_size + s, mask=ms, other=0) - tl.load(stats_ptr + s, mask=ms, other=0)
            kept = tl.minimum(n_s, max_voxels)
            tl.store(nvox_ptr + s, kept.to(tl.int64), mask=ms)
            tl.store(ndp_ptr + s, (tl.load(drop_ptr + s, mask=ms, other=-1) + 1).to(tl.int64), mask=ms)
            tl.store(ndv_ptr + s, (n_s - kept).to(tl.int64), mask=ms)
