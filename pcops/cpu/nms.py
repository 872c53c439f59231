"""Rotated BEV IoU and greedy rotated NMS on the CPU (numba): the reference's decisions, fast.

Algorithm: the boxes are ranked exactly as the reference ranks them (``pcops.reference.nms.
sort_order``: stable descending sort, NaN as −inf), then the textbook greedy pass (a box is
dropped when its IoU with a kept, higher-ranked box of its group is ``> iou_threshold``), where
each candidate is tested only against the kept boxes whose bounding circles can touch its own:
kept boxes sit in a uniform bird's-eye-view hash grid (cell = the largest typical circle
diameter), so a candidate visits its 3 × 3 cells instead of every kept box, and stops at the
first kept box that suppresses it. This is the culling of Zhou et al.'s OpenPCDet
``nms_gpu`` / mmcv ``nms_rotated`` (bounding-circle test before clipping), without their N×N
mask: memory is O(N).

IoU: the reference's own arithmetic, operation for operation, so every decision matches it:
float64 Sutherland–Hodgman clipping of box ``a`` (the kept box) by the four edge lines of box
``b`` in ``a``'s local frame, with the fixed vertex count 4 → 8 → 16 → 32 → 64 (each edge emits
two points), the same 1e-12-relative inclusive inside tests, the nested-rectangle rule, the
shoelace sum in the order ``torch.sum`` adds 64 float64 values on this build (4 lanes × 4
partial sums) and ``Tensor.norm``'s fused multiply-add. cos/sin and the circle radii come from
torch itself (the calls the reference makes), so they are the same bits.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .. import cpu as _cpu
from ..reference import nms as _ref

__all__ = ["nms_bev", "boxes_iou_bev"]

# the reference's relative tolerance of its inclusive inside tests
_TOL = _ref._TOL
# vertices after the four clipping steps of the reference (4 · 2^4)
_VERTS = 64
# a candidate whose search window spans more cells than this scans the kept list instead
_MAX_CELLS = 64
# cells are indexed by int64 coordinates clamped to ±2^30 (monotone, so neighbours stay neighbours)
_CELL_CLAMP = float(1 << 30)
# circles larger than this many median radii do not set the cell size (they go to a short list)
_OUTLIER = 8.0
# cell side over the search half-width of a median box
_CELL = 1.0


@intrinsic
def _fma(typingctx, a, b, c):
    """``a·b + c`` rounded once (``llvm.fma``): ``Tensor.norm`` accumulates ``x² + y²`` this way."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f64], ir.FunctionType(f64, [f64, f64, f64]))
        return builder.call(fn, args)

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _normal(ax, ay, bx, by):
    """Unit inward normal of the line a → b, as ``reference._inward_normal`` rounds it."""
    ex = bx - ax
    ey = by - ay
    n = math.sqrt(_fma(ey, ey, ex * ex))
    return -(ey / n), ex / n


@numba.njit(cache=True, nogil=True)
def _clip(px, py, k, ox, oy, ax, ay, bx, by, tol):
    """One step of ``reference._clip``: the ``k`` vertices ``(px, py)`` → ``2k`` in ``(ox, oy)``."""
    nx, ny = _normal(ax, ay, bx, by)
    for i in range(k):
        j = i + 1 if i + 1 < k else 0
        pxi, pyi, qxi, qyi = px[i], py[i], px[j], py[j]
        dp = (pxi - ax) * nx + (pyi - ay) * ny  # signed distances to the line
        dq = (qxi - ax) * nx + (qyi - ay) * ny
        pin = dp >= -tol
        qin = dq >= -tol
        t = 0.0
        if pin != qin:
            t = min(max(dp / (dp - dq), 0.0), 1.0)
        # an end inside stays; a crossing edge emits its crossing point; an end outside is projected
        xx = pxi + t * (qxi - pxi)
        yy = pyi + t * (qyi - pyi)
        if pin:
            ox[2 * i], oy[2 * i] = pxi, pyi
        elif qin:
            ox[2 * i], oy[2 * i] = xx, yy
        else:
            ox[2 * i], oy[2 * i] = pxi - dp * nx, pyi - dp * ny
        if qin:
            ox[2 * i + 1], oy[2 * i + 1] = qxi, qyi
        elif pin:
            ox[2 * i + 1], oy[2 * i + 1] = xx, yy
        else:
            ox[2 * i + 1], oy[2 * i + 1] = qxi - dq * nx, qyi - dq * ny


@numba.njit(cache=True, nogil=True)
def _inside_all(px, py, rx, ry, tol):
    """All four points ``(px, py)`` inside the rectangle ``(rx, ry)`` within ``tol``."""
    for k in range(4):
        j = (k + 1) % 4
        nx, ny = _normal(rx[k], ry[k], rx[j], ry[j])
        for i in range(4):
            if not ((px[i] - rx[k]) * nx + (py[i] - ry[k]) * ny >= -tol):
                return False
    return True


@numba.njit(cache=True, nogil=True)
def _corners(cx, cy, dx, dy, c, s, rx, ry):
    """``reference._corners`` of one rectangle (counter-clockwise from (+, +)) into ``rx, ry``."""
    hx = dx / 2
    hy = dy / 2
    lx = (hx, -hx, -hx, hx)
    ly = (hy, hy, -hy, -hy)
    for k in range(4):
        rx[k] = cx + lx[k] * c - ly[k] * s
        ry[k] = cy + lx[k] * s + ly[k] * c


@numba.njit(cache=True, nogil=True)
def _intersection(a, csa, i, b, csb, j, work):
    """``reference.intersection_area_pairs`` of the rows ``a[i]`` and ``b[j]`` (``(·, 5)`` float64).

    ``csa, csb (·, 2)``: torch's cos/sin of the headings; ``work (8, 64)`` float64 scratch.
    """
    ax, ay, bx, by = work[0], work[1], work[2], work[3]
    px, py, qx, qy = work[4], work[5], work[6], work[7]
    # local origin: the centre of a
    _corners(0.0, 0.0, a[i, 2], a[i, 3], csa[i, 0], csa[i, 1], ax, ay)
    ox = b[j, 0] - a[i, 0]
    oy = b[j, 1] - a[i, 1]
    _corners(ox, oy, b[j, 2], b[j, 3], csb[j, 0], csb[j, 1], bx, by)
    scale = abs(ox) + abs(oy) + a[i, 2] + a[i, 3] + b[j, 2] + b[j, 3]
    tol = _TOL * scale
    for k in range(4):
        px[k], py[k] = ax[k], ay[k]
    k = 4
    for e in range(4):
        f = (e + 1) % 4
        _clip(px, py, k, qx, qy, bx[e], by[e], bx[f], by[f], tol)
        px, py, qx, qy = qx, qy, px, py
        k *= 2
    # shoelace, summed as torch.sum adds a contiguous row of 64 float64: per lane of 4, four
    # sequential partial sums of stride 16, added in order; then the lanes in order
    total = 0.0
    for lane in range(4):
        part = 0.0
        for v in range(4):
            acc = 0.0
            for r in range(4):
                e = 16 * r + 4 * v + lane
                f = e + 1 if e + 1 < _VERTS else 0
                acc += px[e] * py[f] - py[e] * px[f]
            part = acc if v == 0 else part + acc
        total += part
    area = max(0.5 * total, 0.0)
    # one rectangle inside the other: the intersection is that rectangle, exactly (a in b wins)
    area_a = a[i, 2] * a[i, 3]
    area_b = b[j, 2] * b[j, 3]
    if _inside_all(ax, ay, bx, by, tol):
        area = area_a
    elif _inside_all(bx, by, ax, ay, tol):
        area = area_b
    return min(area, min(area_a, area_b))


@numba.njit(cache=True, nogil=True)
def _touch(a, rada, i, b, radb, j):
    """``reference._pair_candidates``: the bounding circles of ``a[i]`` and ``b[j]`` touch."""
    d = math.hypot(a[i, 0] - b[j, 0], a[i, 1] - b[j, 1])
    return d <= (rada[i] + radb[j]) * (1 + 1e-9) + 1e-12


@numba.njit(cache=True, nogil=True)
def _iou(a, csa, i, b, csb, j, work):
    """BEV IoU of two valid, positive-area rows whose circles touch (``reference.boxes_iou_bev``)."""
    inter = _intersection(a, csa, i, b, csb, j, work)
    union = a[i, 2] * a[i, 3] + b[j, 2] * b[j, 3] - inter
    return inter / union if union > 0 else 0.0


@numba.njit(cache=True, nogil=True)
def _clip_axis(px, py, k, ox, oy, on_y, sign, bound):
    """Textbook Sutherland–Hodgman step: keep the part of the ``k``-gon where ``sign·coord ≤
    bound`` (``coord`` = y if ``on_y`` else x); returns the new vertex count (into ``ox, oy``)."""
    n = 0
    for i in range(k):
        j = i - 1 if i > 0 else k - 1
        ci = sign * (py[i] if on_y else px[i]) - bound
        cj = sign * (py[j] if on_y else px[j]) - bound
        if (ci <= 0) != (cj <= 0):
            t = cj / (cj - ci)
            ox[n] = px[j] + t * (px[i] - px[j])
            oy[n] = py[j] + t * (py[i] - py[j])
            n += 1
        if ci <= 0:
            ox[n], oy[n] = px[i], py[i]
            n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _margin(scale, area):
    """Decisions closer than this to the threshold run the reference's arithmetic: far above the
    error of every bound below and of the reference itself (its 1e-12 · scale inside tolerance
    moves its area by < 1e-11 · scale², its IoU by < 2e-11 · scale² / union)."""
    return 1e-8 * scale * scale / area


@numba.njit(cache=True, nogil=True)
def _suppresses(rec, bev, cs, rad, i, j, thr, work):
    """``reference IoU(bev[i], bev[j]) > thr`` (i kept, j the candidate; both live, positive area),
    mostly decided by cheap bounds and an 8-vertex clipping instead of the 64-vertex one.

    ``rec (M, 9)``: ``x, y, dx/2, dy/2, cos, sin, radius, area, 1/area`` per row. Each test below is a
    necessary condition for a true IoU ``> thr − margin`` (:func:`_margin`), so it can only reject
    pairs the reference rejects; an 8-vertex IoU within ``margin`` of ``thr`` goes to :func:`_iou`.
    """
    xa, ya, hax, hay, ca, sa, ra, area_a = rec[i, :8]
    xb, yb, hbx, hby, cb, sb, rb, area_b = rec[j, :8]
    ox, oy = xb - xa, yb - ya
    d2 = ox * ox + oy * oy
    rt = (ra + rb) * (1 + 1e-9) + 1e-12
    if d2 > rt * rt * (1 + 1e-9):
        return False  # the bounding circles do not touch: the reference's IoU is exactly 0
    scale = abs(ox) + abs(oy) + 2 * (hax + hay + hbx + hby)
    margin = _margin(scale, max(area_a, area_b))
    lo = thr - margin
    if lo > 0:
        # IoU > lo needs inter > t·(Aa + Ab); the area of b beyond a line at distance s > 0 from its
        # centre is at most Ab/2 · (1 − s / rb) (convex in s), and a lies beyond d − ra
        t = lo / (1 + lo)
        k1 = max(1 - 2 * t * (1 + area_a / area_b), 0.0)
        k2 = max(1 - 2 * t * (1 + area_b / area_a), 0.0)
        reach = min(ra + rb * k1, rb + ra * k2) * (1 + 1e-9) + 1e-12
        if d2 > reach * reach * (1 + 1e-9):
            return False
    # b in a's frame: centre (u, v), relative heading (cd, sd)
    u, v = ox * ca + oy * sa, oy * ca - ox * sa
    cd, sd = cb * ca + sb * sa, sb * ca - cb * sa
    # the intersection lies in the overlap of the two rectangles' extents along a's axes, and b's
    eu, ev = abs(cd) * hbx + abs(sd) * hby, abs(sd) * hbx + abs(cd) * hby
    ub_a = max(min(hax, u + eu) - max(-hax, u - eu), 0.0) * max(min(hay, v + ev) - max(-hay, v - ev), 0.0)
    u2, v2 = -(ox * cb + oy * sb), -(oy * cb - ox * sb)
    eu, ev = abs(cd) * hax + abs(sd) * hay, abs(sd) * hax + abs(cd) * hay
    ub_b = max(min(hbx, u2 + eu) - max(-hbx, u2 - eu), 0.0) * max(min(hby, v2 + ev) - max(-hby, v2 - ev), 0.0)
    ub = min(min(ub_a, ub_b), min(area_a, area_b))
    if ub / (area_a + area_b - ub) < lo:
        return False
    # textbook clipping of b by a's axis-aligned rectangle
    px, py, qx, qy = work[0], work[1], work[2], work[3]
    for k in range(4):
        sx = 1.0 if k == 0 or k == 3 else -1.0
        sy = 1.0 if k < 2 else -1.0
        px[k] = u + sx * hbx * cd - sy * hby * sd
        py[k] = v + sx * hbx * sd + sy * hby * cd
    k = _clip_axis(px, py, 4, qx, qy, False, 1.0, hax)
    k = _clip_axis(qx, qy, k, px, py, False, -1.0, hax)
    k = _clip_axis(px, py, k, qx, qy, True, 1.0, hay)
    k = _clip_axis(qx, qy, k, px, py, True, -1.0, hay)
    inter = 0.0
    for e in range(k):
        f = e + 1 if e + 1 < k else 0
        inter += px[e] * py[f] - py[e] * px[f]
    inter = min(max(0.5 * inter, 0.0), min(area_a, area_b))
    iou = inter / (area_a + area_b - inter)
    if iou > thr + margin:
        return True
    if iou < lo:
        return False
    return _touch(bev, rad, i, bev, rad, j) and _iou(bev, cs, i, bev, cs, j, work) > thr


@numba.njit(cache=True, nogil=True)
def _cell(v, lo, c):
    """Grid coordinate of ``v``: monotone in ``v`` and clamped, so any finite input fits int64."""
    return np.int64(np.floor(min(max((v - lo) / c, -_CELL_CLAMP), _CELL_CLAMP)))


@numba.njit(cache=True, nogil=True)
def _slot(keys, ix, iy, insert):
    """Open-addressing slot of cell ``(ix, iy)`` in ``keys (T, 3)`` rows ``(ix, iy, used)``;
    −1 when absent and ``insert`` is false."""
    mask = keys.shape[0] - 1
    h = ((ix * 73856093) ^ (iy * 19349663)) & mask
    while True:
        if keys[h, 2] == 0:
            if not insert:
                return -1
            keys[h, 0], keys[h, 1], keys[h, 2] = ix, iy, 1
            return h
        if keys[h, 0] == ix and keys[h, 1] == iy:
            return h
        h = (h + 1) & mask


@numba.njit(cache=True, nogil=True)
def _window(rj, aj, rmax, amin, amax, thr):
    """Half-width of the square around a candidate (radius ``rj``, area ``aj``) that holds the centre
    of every kept box of radius <= ``rmax`` (areas in ``[amin, amax]``) that can suppress it:
    touching circles, narrowed by :func:`_suppresses`' reach bound at the worst radius and areas."""
    h = rj + rmax
    lo = thr - _margin(4.3 * (rmax + rj) + 1e-9, aj)  # the largest margin of any such pair
    if lo > 0:
        t = lo / (1 + lo)
        k1 = max(1 - 2 * t * (1 + amin / aj), 0.0)
        k2 = max(1 - 2 * t * (1 + aj / amax), 0.0)
        h = min(rmax + rj * k1, rj + rmax * k2)
    return h * (1 + 1e-6) + 1e-9


@numba.njit(cache=True, nogil=True)
def _nms_sorted(bev, cs, rad, live, groups, thr, max_keep):
    """Greedy NMS over rows already in rank order → kept row positions ``(K,)`` int64.

    ``bev (M, 5)`` float64, ``cs (M, 2)`` cos/sin, ``rad (M,)`` circle radii, ``live (M,)`` bool
    (valid box and non-NaN score), ``groups (M,)`` int64 (all equal without ``idxs``), ``thr`` the
    IoU threshold, ``max_keep`` the cap (``post_max_size`` or M).
    """
    m = bev.shape[0]
    keep = np.empty(max_keep, np.int64)
    nk = 0
    # live boxes of positive area are the only ones with a nonzero IoU: they alone need the grid
    pos = np.zeros(m, np.bool_)
    rec = np.empty((m, 9))
    npos = 0
    lo_x, lo_y, amin, amax = np.inf, np.inf, np.inf, 0.0
    for j in range(m):
        area = bev[j, 2] * bev[j, 3]
        rec[j] = (bev[j, 0], bev[j, 1], bev[j, 2] / 2, bev[j, 3] / 2, cs[j, 0], cs[j, 1], rad[j], area, 1 / area)
        if live[j] and bev[j, 2] > 0 and bev[j, 3] > 0:
            pos[j] = True
            npos += 1
            lo_x, lo_y = min(lo_x, bev[j, 0]), min(lo_y, bev[j, 1])
            amin, amax = min(amin, rec[j, 7]), max(amax, rec[j, 7])
    radii, areas = np.empty(npos), np.empty(npos)
    q = 0
    for j in range(m):
        if pos[j]:
            radii[q], areas[q] = rad[j], rec[j, 7]
            q += 1
    # grid boxes: radius <= rmax, the largest radius outliers aside (those go to a list that every
    # candidate checks); cell = the search window of a median box, so a window spans ~3 x 3 cells
    rmax = 0.0
    if npos:
        rmed = np.median(radii)
        for r in radii:
            if r <= _OUTLIER * rmed:
                rmax = max(rmax, r)
    c = _CELL * _window(rmed, np.median(areas), rmax, amin, amax, thr) if npos else 1.0
    if not c > 0:
        c = 1.0
    tsize = 2
    while tsize < 2 * npos + 2:
        tsize *= 2
    keys = np.zeros((tsize, 3), np.int64)
    head = np.full(tsize, -1, np.int64)  # first kept box of each occupied cell
    nxt = np.full(m, -1, np.int64)  # next kept box in the same cell
    big = np.empty(m, np.int64)  # kept boxes wider than a cell
    nbig = 0
    work = np.empty((8, _VERTS))
    for j in range(m):
        if nk == max_keep:
            break
        if not live[j]:
            continue
        if not pos[j]:
            keep[nk] = j  # zero area: IoU 0 with everything, never suppressed, never suppresses
            nk += 1
            continue
        gone = False
        xj, yj, rj, aj, inv_aj = rec[j, 0], rec[j, 1], rad[j], rec[j, 7], rec[j, 8]
        h = _window(rj, aj, rmax, amin, amax, thr)
        # _suppresses' reach test with the largest margin of any grid pair: a cheap first filter
        far2 = ((rj + rmax) * (1 + 1e-6) + 1e-9) ** 2
        lo = thr - _margin(4.3 * (rmax + rj) + 1e-9, aj)
        tw = 2 * lo / (1 + lo) if lo > 0 else 0.0
        x0, x1 = _cell(bev[j, 0] - h, lo_x, c), _cell(bev[j, 0] + h, lo_x, c)
        y0, y1 = _cell(bev[j, 1] - h, lo_y, c), _cell(bev[j, 1] + h, lo_y, c)
        if (x1 - x0 + 1) * (y1 - y0 + 1) > _MAX_CELLS:
            for t in range(nk):  # a huge candidate: every kept box
                i = keep[t]
                if pos[i] and groups[i] == groups[j] and _suppresses(rec, bev, cs, rad, i, j, thr, work):
                    gone = True
                    break
        else:
            for ix in range(x0, x1 + 1):
                for iy in range(y0, y1 + 1):
                    s = _slot(keys, ix, iy, False)
                    i = head[s] if s >= 0 else -1
                    while i >= 0 and not gone:
                        ox, oy = rec[i, 0] - xj, rec[i, 1] - yj
                        d2 = ox * ox + oy * oy
                        if d2 <= far2:
                            ri, ai = rec[i, 6], rec[i, 7]
                            k1 = max(1 - tw - tw * ai * inv_aj, 0.0)
                            k2 = max(1 - tw - tw * aj * rec[i, 8], 0.0)
                            reach = min(ri + rj * k1, rj + ri * k2) * (1 + 1e-6) + 1e-9
                            if d2 <= reach * reach and groups[i] == groups[j]:
                                gone = _suppresses(rec, bev, cs, rad, i, j, thr, work)
                        i = nxt[i]
                    if gone:
                        break
                if gone:
                    break
            t = 0
            while t < nbig and not gone:
                i = big[t]
                gone = groups[i] == groups[j] and _suppresses(rec, bev, cs, rad, i, j, thr, work)
                t += 1
        if gone:
            continue
        keep[nk] = j
        nk += 1
        if rj <= rmax:
            s = _slot(keys, _cell(bev[j, 0], lo_x, c), _cell(bev[j, 1], lo_y, c), True)
            nxt[j] = head[s]
            head[s] = j
        else:
            big[nbig] = j
            nbig += 1
    return keep[:nk]


@numba.njit(cache=True, nogil=True, parallel=True)
def _iou_matrix(a, csa, rada, oka, b, csb, radb, okb):
    """``(N, M)`` float64 IoU of the rows of ``a`` and ``b`` (``ok``: valid with positive area)."""
    n, m = a.shape[0], b.shape[0]
    out = np.zeros((n, m))
    for r in numba.prange(n):
        if not oka[r]:
            continue
        work = np.empty((8, _VERTS))
        for col in range(m):
            if okb[col] and _touch(a, rada, r, b, radb, col):
                out[r, col] = _iou(a, csa, r, b, csb, col, work)
    return out


def _prepare(bev: torch.Tensor):
    """``(bev, cos/sin, radii)`` as numpy float64, computed by the torch calls the reference makes."""
    cs = torch.stack([torch.cos(bev[:, 4]), torch.sin(bev[:, 4])], 1)
    rad = 0.5 * torch.hypot(bev[:, 2], bev[:, 3])
    return bev.numpy(), cs.numpy(), rad.numpy()


@_cpu.keeps_torch_threads
def nms_bev(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    pre_max_size: int | None = None,
    post_max_size: int | None = None,
    idxs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kept indices ``(K,)`` int64 into ``boxes`` (CPU tensors), in descending score order.

    Equal to ``pcops.reference.nms.nms_bev`` (the same ranking, ties to the lower index, and the
    same IoU bits): ``boxes (N, 5|≥7)`` any float dtype, ``scores (N,)``, ``idxs (N,)`` int64 groups.
    Single-threaded (the greedy pass is sequential), so the thread count cannot change it.
    """
    order = _ref.sort_order(scores, pre_max_size)
    bev = _ref.bev_columns(boxes)[order].double().contiguous()
    live = (_ref.box_valid(bev) & ~torch.isnan(scores[order])).numpy()
    groups = idxs[order] if idxs is not None else torch.zeros(order.shape[0], dtype=torch.int64)
    m = order.shape[0]
    cap = m if post_max_size is None else min(m, post_max_size)
    bev_np, cs, rad = _prepare(bev)
    pos = _nms_sorted(bev_np, cs, rad, live, groups.contiguous().numpy(), float(iou_threshold), cap)
    return order[torch.from_numpy(pos)]


def boxes_iou_bev(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """``(N, M)`` float64 rotated BEV IoU of CPU boxes ``(N, 5|≥7)``, ``(M, 5|≥7)``: the reference's
    values (0 where either box is invalid or has zero area), rows in parallel."""
    a = _ref.bev_columns(boxes_a).double().contiguous()
    b = _ref.bev_columns(boxes_b).double().contiguous()
    oka = (_ref.box_valid(a) & (a[:, 2] > 0) & (a[:, 3] > 0)).numpy()
    okb = (_ref.box_valid(b) & (b[:, 2] > 0) & (b[:, 3] > 0)).numpy()
    numba.set_num_threads(min(_cpu.num_threads(), numba.config.NUMBA_NUM_THREADS))
    return torch.from_numpy(_iou_matrix(*_prepare(a), oka, *_prepare(b), okb))
