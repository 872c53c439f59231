"""Triton kernels for rotated BEV IoU and rotated NMS (a portable GPU path; ``csrc/nms.cu`` is the fast one).

IoU of one pair, in float32 (``_pair_inter``):

1. Work in box ``a``'s own frame: ``a`` becomes the axis-aligned rectangle ``|x| ≤ hx_a, |y| ≤ hy_a``
   (its clip lines are exact), ``b``'s centre is rotated by ``-heading_a`` (a local origin: no
   cancellation at x ≈ 70 m) and its axes by the heading *difference*, whose sine/cosine come from
   a Cody–Waite range reduction + minimax polynomials (``_sincos``, ~1 ulp, the same on every device
   and in the interpreter; the difference is carried as an exact two-sum pair, so headings far from
   each other lose nothing to its rounding); identical headings give exactly (0, 1).
2. If one rectangle lies inside the other (within a few ulps of each test's own terms, per axis, so
   thin boxes keep their accuracy), the intersection is that rectangle's area ``dx·dy`` exactly:
   identical boxes give IoU 1 exactly.
3. Otherwise clip ``b``'s quadrilateral by the slab ``|x| ≤ hx_a`` then ``|y| ≤ hy_a``
   (Sutherland–Hodgman with a fixed vertex count: every edge emits its inside part, or, when it lies
   wholly outside, its two ends clamped onto the slab boundary; the extra points lie on a clip line,
   so they add no area and the result is continuous in the inputs: no special case for shared edges
   or corners), then take the shoelace area of the 16 points.

Divisions are IEEE (``tl.div_rn``: Triton's ``/`` is a 2-ulp approximation on NVIDIA), so an
IoU of identical boxes is exactly 1 and exactly representable IoUs compare exactly with the
threshold. Pairs whose bounding circles do not touch, invalid boxes (non-finite, negative size)
and zero-area boxes give 0. Accuracy: within 4e-6 of the float64 reference on the hard cases of
``tests/test_boxes_iou.py`` (down to 1 cm wide boxes, x ≈ 70 m), ~3e-7 on random car-sized pairs.

NMS: ``_nms_mask_kernel`` writes the upper-triangular ``IoU > thr`` bitmask in 64-bit words
(sorted order), ``_nms_pass_kernel`` (one program) walks the 64-box tiles: it resolves
a tile sequentially from its diagonal word block, then ORs the kept boxes' rows into the "removed"
words of the later tiles. Triton cannot skip single pairs inside a tile, so its mask kernel clips
every pair of a tile with at least one candidate; ``csrc/nms.cu`` compacts the candidates first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from . import _launch

# tile of the IoU matrix kernel
_IOU_BLOCK = 32
# boxes per mask word (bits of int64) and rows per mask program
_WORD = 64
# words per step of the OR phase of the NMS pass
_PASS_BLOCK_W = 32


@triton.jit
def _sincos(x, x_lo):
    """(sin, cos) of ``x + x_lo`` in float32 (``x_lo`` a tiny correction, e.g. the rounding error of a
    difference): Cody–Waite reduction by π/2 (3-part constant), cephes minimax polynomials."""
    k = tl.floor(x * 0.6366197723675814 + 0.5)
    r = x - k * 1.5703125
    r = r - k * 4.837512969970703125e-4
    r = r - k * 7.54978995489188216e-8
    r = r + x_lo
    r2 = r * r
    s = r + r * r2 * (-1.6666654611e-1 + r2 * (8.3321608736e-3 + r2 * -1.9515295891e-4))
    c = 1.0 - 0.5 * r2 + r2 * r2 * (4.166664568298827e-2 + r2 * (-1.388731625493765e-3 + r2 * 2.443315711809948e-5))
    q = k.to(tl.int32) & 3
    sin = tl.where(q == 0, s, tl.where(q == 1, c, tl.where(q == 2, -s, -c)))
    cos = tl.where(q == 0, c, tl.where(q == 1, -s, tl.where(q == 2, -c, s)))
    return sin, cos


@triton.jit
def _slab(px, py, qx, qy, h):
    """The part of segment p→q with |x| ≤ h, as two points; a segment wholly outside gives its ends
    clamped onto the boundary line (collinear with the neighbouring exit/entry points: no area)."""
    d = qx - px
    par = d == 0.0
    inv = tl.div_rn(1.0, tl.where(par, 1.0, d))
    ta = (-h - px) * inv
    tb = (h - px) * inv
    inside_par = tl.abs(px) <= h
    t0 = tl.where(par, tl.where(inside_par, 0.0, 1.0), tl.maximum(tl.minimum(ta, tb), 0.0))
    t1 = tl.where(par, tl.where(inside_par, 1.0, 0.0), tl.minimum(tl.maximum(ta, tb), 1.0))
    hit = t0 <= t1
    ey = qy - py
    # keep the exact vertex when the interval ends at it
    ax = tl.where(hit & (t0 != 0.0), px + t0 * d, px)
    ay = tl.where(hit & (t0 != 0.0), py + t0 * ey, py)
    bx = tl.where(hit & (t1 != 1.0), px + t1 * d, qx)
    by = tl.where(hit & (t1 != 1.0), py + t1 * ey, qy)
    bx = tl.where(hit, bx, qx)
    by = tl.where(hit, by, qy)
    ax = tl.minimum(tl.maximum(ax, -h), h)
    bx = tl.minimum(tl.maximum(bx, -h), h)
    return ax, ay, bx, by


@triton.jit
def _cross(ax, ay, bx, by):
    return ax * by - ay * bx


@triton.jit
def _pair_inter(xa, ya, dxa, dya, ha, xb, yb, dxb, dyb, hb):
    """BEV intersection area of rectangles a and b (broadcast float32 tensors, valid boxes)."""
    hxa = dxa * 0.5
    hya = dya * 0.5
    hxb = dxb * 0.5
    hyb = dyb * 0.5
    sa, ca = _sincos(ha, 0.0)
    # the heading difference as an exact pair (dh + dh_lo = hb - ha, Knuth's two-sum)
    dh = hb - ha
    bv = dh - hb
    dh_lo = (hb - (dh - bv)) + (-ha - bv)
    sd, cd = _sincos(dh, dh_lo)
    # b's centre in a's frame (local origin: the subtraction is exact for nearby boxes)
    wx = xb - xa
    wy = yb - ya
    ox = ca * wx + sa * wy
    oy = ca * wy - sa * wx
    # b's half-axes in a's frame
    ux = cd * hxb
    uy = sd * hxb
    vx = -sd * hyb
    vy = cd * hyb
    area_a = dxa * dya
    area_b = dxb * dyb
    # containment within a few ulps of the terms of each test (per axis: thin boxes stay exact)
    ulps = 4.0 * 1.1920928955078125e-07
    w1 = tl.abs(wx) + tl.abs(wy)
    ex = tl.abs(ux) + tl.abs(vx)
    ey = tl.abs(uy) + tl.abs(vy)
    b_in_a = (tl.abs(ox) + ex <= hxa + ulps * (w1 + hxa + ex)) & (tl.abs(oy) + ey <= hya + ulps * (w1 + hya + ey))
    # a's centre and half-axes in b's frame
    pbx = -(cd * ox + sd * oy)
    pby = -(cd * oy - sd * ox)
    fx = tl.abs(cd * hxa) + tl.abs(sd * hya)
    fy = tl.abs(sd * hxa) + tl.abs(cd * hya)
    a_in_b = (tl.abs(pbx) + fx <= hxb + ulps * (w1 + hxb + fx)) & (tl.abs(pby) + fy <= hyb + ulps * (w1 + hyb + fy))
    # b's corners, counter-clockwise
    c0x = ox + ux + vx
    c0y = oy + uy + vy
    c1x = ox - ux + vx
    c1y = oy - uy + vy
    c2x = ox - ux - vx
    c2y = oy - uy - vy
    c3x = ox + ux - vx
    c3y = oy + uy - vy
    # stage 1: clip each edge by |x| <= hxa -> 8 points p0..p7
    p0x, p0y, p1x, p1y = _slab(c0x, c0y, c1x, c1y, hxa)
    p2x, p2y, p3x, p3y = _slab(c1x, c1y, c2x, c2y, hxa)
    p4x, p4y, p5x, p5y = _slab(c2x, c2y, c3x, c3y, hxa)
    p6x, p6y, p7x, p7y = _slab(c3x, c3y, c0x, c0y, hxa)
    # stage 2: clip each of the 8 edges by |y| <= hya -> 16 points; shoelace over them
    a0y, a0x, b0y, b0x = _slab(p0y, p0x, p1y, p1x, hya)
    a1y, a1x, b1y, b1x = _slab(p1y, p1x, p2y, p2x, hya)
    a2y, a2x, b2y, b2x = _slab(p2y, p2x, p3y, p3x, hya)
    a3y, a3x, b3y, b3x = _slab(p3y, p3x, p4y, p4x, hya)
    a4y, a4x, b4y, b4x = _slab(p4y, p4x, p5y, p5x, hya)
    a5y, a5x, b5y, b5x = _slab(p5y, p5x, p6y, p6x, hya)
    a6y, a6x, b6y, b6x = _slab(p6y, p6x, p7y, p7x, hya)
    a7y, a7x, b7y, b7x = _slab(p7y, p7x, p0y, p0x, hya)
    twice = _cross(a0x, a0y, b0x, b0y) + _cross(b0x, b0y, a1x, a1y)
    twice += _cross(a1x, a1y, b1x, b1y) + _cross(b1x, b1y, a2x, a2y)
    twice += _cross(a2x, a2y, b2x, b2y) + _cross(b2x, b2y, a3x, a3y)
    twice += _cross(a3x, a3y, b3x, b3y) + _cross(b3x, b3y, a4x, a4y)
    twice += _cross(a4x, a4y, b4x, b4y) + _cross(b4x, b4y, a5x, a5y)
    twice += _cross(a5x, a5y, b5x, b5y) + _cross(b5x, b5y, a6x, a6y)
    twice += _cross(a6x, a6y, b6x, b6y) + _cross(b6x, b6y, a7x, a7y)
    twice += _cross(a7x, a7y, b7x, b7y) + _cross(b7x, b7y, a0x, a0y)
    inter = tl.maximum(twice * 0.5, 0.0)
    inter = tl.where(b_in_a, area_b, tl.where(a_in_b, area_a, inter))
    return tl.minimum(inter, tl.minimum(area_a, area_b))


@triton.jit
def _load_box(ptr, idx, live, stride, BEV5: tl.constexpr):
    """(x, y, z, dx, dy, dz, heading, ok) float32 of rows ``idx``; ok = finite and sizes >= 0.
    Rows that are not ``live`` or not ok are replaced by a harmless unit box."""
    base = ptr + idx.to(tl.int64) * stride
    x = tl.load(base + 0, mask=live, other=0.0).to(tl.float32)
    y = tl.load(base + 1, mask=live, other=0.0).to(tl.float32)
    if BEV5:
        z = tl.zeros_like(x)
        dx = tl.load(base + 2, mask=live, other=1.0).to(tl.float32)
        dy = tl.load(base + 3, mask=live, other=1.0).to(tl.float32)
        dz = tl.zeros_like(x)
        h = tl.load(base + 4, mask=live, other=0.0).to(tl.float32)
    else:
        z = tl.load(base + 2, mask=live, other=0.0).to(tl.float32)
        dx = tl.load(base + 3, mask=live, other=1.0).to(tl.float32)
        dy = tl.load(base + 4, mask=live, other=1.0).to(tl.float32)
        dz = tl.load(base + 5, mask=live, other=1.0).to(tl.float32)
        h = tl.load(base + 6, mask=live, other=0.0).to(tl.float32)
    big = 3.0e38
    # |v| <= big is false for nan and +-inf
    ok = live & (tl.abs(x) <= big) & (tl.abs(y) <= big) & (tl.abs(h) <= big) & (tl.abs(z) <= big)
    ok = ok & (dx >= 0.0) & (dy >= 0.0) & (dz >= 0.0) & (dx <= big) & (dy <= big) & (dz <= big)
    x = tl.where(ok, x, 0.0)
    y = tl.where(ok, y, 0.0)
    z = tl.where(ok, z, 0.0)
    dx = tl.where(ok, dx, 1.0)
    dy = tl.where(ok, dy, 1.0)
    dz = tl.where(ok, dz, 1.0)
    h = tl.where(ok, h, 0.0)
    return x, y, z, dx, dy, dz, h, ok


@triton.jit
def _touch(xa, ya, dxa, dya, xb, yb, dxb, dyb):
    """Bounding circles touch (conservatively): pairs outside have no overlap."""
    ra = 0.5 * tl.sqrt(dxa * dxa + dya * dya)
    rb = 0.5 * tl.sqrt(dxb * dxb + dyb * dyb)
    wx = xb - xa
    wy = yb - ya
    reach = (ra + rb) * 1.0001 + 1e-6
    return wx * wx + wy * wy <= reach * reach


@triton.jit
def _boxes_iou_kernel(
    a_ptr,  # (N, C) boxes, C = 5 or >= 7, any float dtype
    b_ptr,  # (M, C) boxes
    out_ptr,  # (N, M) float32/float64 IoU
    n,  # N
    m,  # M
    stride_a,  # C of boxes_a
    stride_b,  # C of boxes_b
    BEV5: tl.constexpr,  # both have 5 columns (x, y, dx, dy, heading)
    THREE_D: tl.constexpr,  # multiply by the height overlap (7+ columns)
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    xa, ya, za, dxa, dya, dza, ha, oka = _load_box(a_ptr, rows, rows < n, stride_a, BEV5)
    xb, yb, zb, dxb, dyb, dzb, hb, okb = _load_box(b_ptr, cols, cols < m, stride_b, BEV5)
    xa, ya, za, dxa, dya, dza, ha = (
        xa[:, None],
        ya[:, None],
        za[:, None],
        dxa[:, None],
        dya[:, None],
        dza[:, None],
        ha[:, None],
    )
    xb, yb, zb, dxb, dyb, dzb, hb = (
        xb[None, :],
        yb[None, :],
        zb[None, :],
        dxb[None, :],
        dyb[None, :],
        dzb[None, :],
        hb[None, :],
    )
    ok = oka[:, None] & okb[None, :] & _touch(xa, ya, dxa, dya, xb, yb, dxb, dyb)
    inter = tl.where(ok, _pair_inter(xa, ya, dxa, dya, ha, xb, yb, dxb, dyb, hb), 0.0)
    if THREE_D:
        top = tl.minimum(za + dza * 0.5, zb + dzb * 0.5)
        bottom = tl.maximum(za - dza * 0.5, zb - dzb * 0.5)
        inter = inter * tl.maximum(top - bottom, 0.0)
        size_a = tl.where(oka[:, None], dxa * dya * dza, 0.0)
        size_b = tl.where(okb[None, :], dxb * dyb * dzb, 0.0)
    else:
        size_a = tl.where(oka[:, None], dxa * dya, 0.0)
        size_b = tl.where(okb[None, :], dxb * dyb, 0.0)
    union = size_a + size_b - inter
    iou = tl.where(union > 0.0, tl.div_rn(inter, tl.where(union > 0.0, union, 1.0)), 0.0)
    live = (rows < n)[:, None] & (cols < m)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * m + cols[None, :], iou.to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def _nms_mask_kernel(
    boxes_ptr,  # (N, C) boxes in input order, C = 5 or >= 7
    order_ptr,  # (M,) int64: sorted position -> box index
    groups_ptr,  # (M,) int64 group of each sorted box (read only when HAS_GROUPS)
    mask_ptr,  # (M, W) int64 output: bit b of word w of row i = IoU(i, 64w+b) > thr and 64w+b > i
    m,  # M boxes after pre_max_size
    words,  # W = ceil(M / 64)
    stride,  # C
    thr,  # float32 IoU threshold
    BEV5: tl.constexpr,
    HAS_GROUPS: tl.constexpr,
):
    rt = tl.program_id(0)
    ct = tl.program_id(1)
    # only the upper triangle (ct >= rt) is ever read by the pass
    if ct >= rt:
        lane = tl.arange(0, 64)
        i = rt * 64 + lane
        j = ct * 64 + lane
        li = i < m
        lj = j < m
        ia = tl.load(order_ptr + i, mask=li, other=0)
        ib = tl.load(order_ptr + j, mask=lj, other=0)
        xa, ya, za, dxa, dya, dza, ha, oka = _load_box(boxes_ptr, ia, li, stride, BEV5)
        xb, yb, zb, dxb, dyb, dzb, hb, okb = _load_box(boxes_ptr, ib, lj, stride, BEV5)
        xa, ya, dxa, dya, ha = xa[:, None], ya[:, None], dxa[:, None], dya[:, None], ha[:, None]
        xb, yb, dxb, dyb, hb = xb[None, :], yb[None, :], dxb[None, :], dyb[None, :], hb[None, :]
        cand = oka[:, None] & okb[None, :] & (j[None, :] > i[:, None])
        if HAS_GROUPS:
            ga = tl.load(groups_ptr + i, mask=li, other=0)
            gb = tl.load(groups_ptr + j, mask=lj, other=0)
            cand = cand & (ga[:, None] == gb[None, :])
        cand = cand & _touch(xa, ya, dxa, dya, xb, yb, dxb, dyb)
        word = tl.zeros([64], dtype=tl.int64)
        # skip the clipping when no pair of the tile can overlap
        if tl.max(cand.to(tl.int32)) > 0:
            inter = _pair_inter(xa, ya, dxa, dya, ha, xb, yb, dxb, dyb, hb)
            union = dxa * dya + dxb * dyb - inter
            iou = tl.where(union > 0.0, tl.div_rn(inter, tl.where(union > 0.0, union, 1.0)), 0.0)
            hit = cand & (iou > thr)
            # distinct powers of two: their sum is their OR
            word = tl.sum(tl.where(hit, tl.full([1, 64], 1, tl.int64) << lane[None, :].to(tl.int64), 0), axis=1)
        tl.store(mask_ptr + i.to(tl.int64) * words + ct, word, mask=li)


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _nms_pass_kernel(
    mask_ptr,  # (M, W) int64 bitmask from _nms_mask_kernel
    removed_ptr,  # (W,) int64 scratch, zero-filled: boxes suppressed so far
    boxes_ptr,  # (N, C) boxes (validity of each kept candidate)
    scores_ptr,  # (N,) scores (NaN = invalid)
    order_ptr,  # (M,) int64 sorted position -> box index
    out_ptr,  # (P,) int64 output: kept box indices, -1 padded
    count_ptr,  # () int64 output: number kept (<= P)
    m,  # M
    words,  # W
    post,  # P, the output length (cap on the number kept)
    stride,  # C
    BEV5: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    lane = tl.arange(0, 64)
    one = tl.full([64], 1, tl.int64)
    count = 0
    for t in range(0, words):
        if count < post:
            rows = t * 64 + lane
            live = rows < m
            idx = tl.load(order_ptr + rows, mask=live, other=0)
            _x, _y, _z, _dx, _dy, _dz, _h, ok = _load_box(boxes_ptr, idx, live, stride, BEV5)
            s = tl.load(scores_ptr + idx, mask=live, other=0.0)
            ok = ok & (s == s)
            diag = tl.load(mask_ptr + rows.to(tl.int64) * words + t, mask=live, other=0)
            # invalid boxes (and rows past M) start out removed
            rem = tl.load(removed_ptr + t) | tl.sum(tl.where(ok, 0, one << lane.to(tl.int64)), axis=0)
            kept = tl.full([], 0, tl.int64)
            # greedy inside the tile: box b is kept unless a kept box before it removed it
            for b in range(64):
                free = ((rem >> b) & 1) == 0
                d_b = tl.sum(tl.where(lane == b, diag, 0), axis=0)
                rem = tl.where(free, rem | d_b, rem)
                kept = tl.where(free, kept | (tl.full([], 1, tl.int64) << b), kept)
            keep_lane = ((kept >> lane.to(tl.int64)) & 1) != 0
            pos = count + tl.cumsum(keep_lane.to(tl.int32), axis=0) - 1
            tl.store(out_ptr + pos, idx, mask=keep_lane & (pos < post))
            count += tl.sum(keep_lane.to(tl.int32), axis=0)
            # the kept boxes' rows remove boxes in the later tiles
            for w0 in range(t + 1, words, BLOCK_W):
                ws = w0 + tl.arange(0, BLOCK_W)
                lw = ws < words
                blk = tl.load(
                    mask_ptr + rows[:, None].to(tl.int64) * words + ws[None, :],
                    mask=keep_lane[:, None] & lw[None, :],
                    other=0,
                )
                acc = tl.reduce(blk, 0, _or)
                old = tl.load(removed_ptr + ws, mask=lw, other=0)
                tl.store(removed_ptr + ws, old | acc, mask=lw)
            tl.debug_barrier()
    count = tl.minimum(count, post)
    for p0 in range(0, post, 1024):
        p = p0 + tl.arange(0, 1024)
        tl.store(out_ptr + p, tl.full([1024], -1, tl.int64), mask=(p >= count) & (p < post))
    tl.store(count_ptr, count.to(tl.int64))


def boxes_iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor, three_d: bool) -> torch.Tensor:
    """IoU matrix of two box sets (BEV, or 3D with ``three_d``).

    Args:
        boxes_a: ``(N, C)`` contiguous, C = 5 or ≥ 7 (≥ 7 for 3D), any float dtype.
        boxes_b: ``(M, C')``, same rules.
    Returns:
        ``(N, M)`` float32 (float64 for float64 boxes, computed in float32); no host sync.
    """
    n, m = boxes_a.shape[0], boxes_b.shape[0]
    out_dtype = torch.float64 if boxes_a.dtype == torch.float64 else torch.float32
    out = torch.empty((n, m), dtype=out_dtype, device=boxes_a.device)
    if n and m:
        a, b = boxes_a, boxes_b
        if a.shape[1] != b.shape[1] and 5 in (a.shape[1], b.shape[1]):
            # mixed layouts: bring both to (x, y, dx, dy, heading)
            a = a if a.shape[1] == 5 else a[:, [0, 1, 3, 4, 6]].contiguous()
            b = b if b.shape[1] == 5 else b[:, [0, 1, 3, 4, 6]].contiguous()
        bev5 = a.shape[1] == 5
        grid = (_launch.cdiv(n, _IOU_BLOCK), _launch.cdiv(m, _IOU_BLOCK))
        _launch.launch(
            _boxes_iou_kernel,
            grid,
            a,
            b,
            out,
            n,
            m,
            a.shape[1],
            b.shape[1],
            BEV5=bev5,
            THREE_D=three_d,
            BLOCK=_IOU_BLOCK,
        )
    return out


def sort_order(scores: torch.Tensor, pre_max_size: int | None) -> torch.Tensor:
    """``(M,)`` int64: descending stable score order (NaN ranks as −inf), the first ``pre_max_size``."""
    key = torch.nan_to_num(scores, nan=float("-inf"))
    order = torch.sort(key, descending=True, stable=True).indices
    return order if pre_max_size is None else order[:pre_max_size]


def nms_mask(
    boxes: torch.Tensor, order: torch.Tensor, groups: torch.Tensor | None, iou_threshold: float
) -> torch.Tensor:
    """Upper-triangular suppression bitmask ``(M, ceil(M/64))`` int64 in sorted order (lower words unset).

    Args:
        boxes: ``(N, C)`` contiguous, C = 5 or ≥ 7.
        order: ``(M,)`` int64 sorted position → box index.
        groups: ``(M,)`` int64 group per sorted box, or None.
    """
    m = order.shape[0]
    words = _launch.cdiv(m, _WORD)
    mask = torch.empty((m, words), dtype=torch.int64, device=boxes.device)
    if m:
        g = groups if groups is not None else order
        _launch.launch(
            _nms_mask_kernel,
            (words, words),
            boxes,
            order,
            g,
            mask,
            m,
            words,
            boxes.shape[1],
            iou_threshold,
            BEV5=boxes.shape[1] == 5,
            HAS_GROUPS=groups is not None,
        )
    return mask


def nms_pass(mask, boxes, scores, order, out_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy pass over the bitmask in one program: ``(indices (out_len,) −1 padded, count ())``."""
    m, words = mask.shape
    out = torch.empty((out_len,), dtype=torch.int64, device=boxes.device)
    count = torch.empty((), dtype=torch.int64, device=boxes.device)
    removed = torch.zeros((max(words, 1),), dtype=torch.int64, device=boxes.device)
    _launch.launch(
        _nms_pass_kernel,
        (1,),
        mask,
        removed,
        boxes,
        scores,
        order,
        out,
        count,
        m,
        words,
        out_len,
        boxes.shape[1],
        BEV5=boxes.shape[1] == 5,
        BLOCK_W=_PASS_BLOCK_W,
        num_warps=2,
    )
    return out, count


def nms_sorted(boxes, scores, order, groups, iou_threshold: float, out_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bitmask + greedy pass on score-sorted boxes; no host sync (2 launches).

    Args:
        boxes: ``(N, C)`` contiguous, C = 5 or ≥ 7; scores: ``(N,)`` (NaN = invalid box).
        order: ``(M,)`` int64 sorted position → box index; groups: ``(M,)`` int64 or None.
        out_len: length of the −1 padded output.
    Returns:
        ``(indices (out_len,) int64, count () int64)``.
    """
    mask = nms_mask(boxes, order, groups, iou_threshold)
    return nms_pass(mask, boxes, scores, order, out_len)


def nms_bev(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded):
    """Rotated NMS on the GPU: one stable sort, the bitmask kernel, the single-program greedy pass.

    Args:
        boxes: ``(N, C)`` contiguous, C = 5 or ≥ 7; scores ``(N,)``; idxs ``(N,)`` int64 or None.
    Returns:
        ``(indices, count ())``: padded ``(post_max_size,)`` with −1, or ``(K,)`` when not ``padded``
        (one host sync, reading ``count``).
    """
    order = sort_order(scores, pre_max_size)
    m = order.shape[0]
    out_len = post_max_size if padded else min(m, post_max_size or m)
    if m == 0:
        out = torch.full((out_len,), -1, dtype=torch.int64, device=boxes.device)
        return out, torch.zeros((), dtype=torch.int64, device=boxes.device)
    groups = idxs[order] if idxs is not None else None
    out, count = nms_sorted(boxes, scores, order, groups, iou_threshold, out_len)
    if padded:
        return out, count
    k = int(count)  # the one host sync of the variable-length form
    return out[:k].clone(), count
