"""Rotated BEV IoU and greedy rotated NMS in plain PyTorch: the CPU path and the test oracle.

IoU: float64 Sutherland–Hodgman clipping of box ``a``'s rectangle by the four edge lines of
box ``b``, with every coordinate taken relative to the centre of ``a`` (a local origin, so boxes
at x ≈ 70 m lose nothing to cancellation). The clipping keeps a fixed vertex count: each edge
of the polygon emits two points (its inside part, or its projection on the clip line when it
lies wholly outside), so vertices may repeat and extra vertices lie on the clip line; neither
changes the shoelace area, and the result is a continuous function of the inputs (no
discontinuity when edges coincide or vertices sit on the other box's boundary). Inside tests
are inclusive with a 1e-12-relative tolerance and, when one rectangle lies inside the other
within that tolerance, the intersection *is* the inner rectangle's area ``dx·dy``, so
identical boxes (and a box nested in another) give IoU exactly 1 (resp. the exact area ratio).

NMS: sort by score once (descending, stable: equal scores keep the lower index first), then
the textbook greedy loop: a box is suppressed when its IoU with a higher-ranked kept box is
``> iou_threshold`` (OpenPCDet's rule).

Box validity: a box whose BEV values are not all finite, or with a negative size, is
*invalid*: its IoU with anything (itself included) is 0; in NMS it is never kept and never
suppresses anything (a NaN score makes a box invalid too). The public functions raise on
negative sizes for CPU tensors; GPU paths cannot check without a host sync and apply this rule.
"""

from __future__ import annotations

import torch

# relative tolerance of the inclusive inside tests (float64)
_TOL = 1e-12
# pairs per chunk of the exact clipping (each pair holds a 64-vertex polygon): small on the CPU
# (cache-sized temporaries), large on a GPU (fewer launches)
_CHUNK = 1 << 15
_CHUNK_GPU = 1 << 18


def bev_columns(boxes: torch.Tensor) -> torch.Tensor:
    """``(N, 5)`` ``(x, y, dx, dy, heading)`` from ``(N, 5)`` or ``(N, ≥7)`` OpenPCDet boxes."""
    if boxes.shape[-1] == 5:
        return boxes
    return boxes[..., [0, 1, 3, 4, 6]]


def box_valid(bev: torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool: all five BEV values finite and both sizes ≥ 0."""
    return torch.isfinite(bev).all(-1) & (bev[..., 2] >= 0) & (bev[..., 3] >= 0)


def _corners(cx, cy, dx, dy, heading):
    """Corners ``x, y`` (each ``(P, 4)``), counter-clockwise, of rectangles centred at ``(cx, cy)``."""
    c, s = torch.cos(heading)[:, None], torch.sin(heading)[:, None]
    hx, hy = dx / 2, dy / 2
    # local corners (+,+), (-,+), (-,-), (+,-): counter-clockwise
    lx = torch.stack([hx, -hx, -hx, hx], -1)
    ly = torch.stack([hy, hy, -hy, -hy], -1)
    return cx[:, None] + lx * c - ly * s, cy[:, None] + lx * s + ly * c


def _inward_normal(ax, ay, bx, by):
    """Unit normal ``(nx, ny)`` (each ``(P, 1)``) of the lines ``a → b``, pointing to their left (inside)."""
    e = torch.stack([bx - ax, by - ay], -1)
    e = e / e.norm(dim=-1, keepdim=True)
    return -e[..., 1], e[..., 0]


def _clip(px, py, ax, ay, bx, by, tol):
    """Keep the part of the polygons ``(px, py)`` (each ``(P, K)``) left of the lines ``a → b``
    (``ax, ay, bx, by``: ``(P, 1)``); returns ``x, y`` (each ``(P, 2K)``).

    Each edge ``p → q`` emits two points: ``p`` or the entry point, ``q`` or the exit point; an edge
    wholly outside emits the projections of its ends on the line. Every point emitted from outside
    lies on the line, so the detours add no area. (x and y are kept apart: the same arithmetic as
    on ``(P, K, 2)`` point arrays, with fewer copies.)
    """
    nx, ny = _inward_normal(ax, ay, bx, by)
    qx, qy = px.roll(-1, dims=1), py.roll(-1, dims=1)
    dp = (px - ax) * nx + (py - ay) * ny  # signed distances to the line
    dq = (qx - ax) * nx + (qy - ay) * ny
    pin = dp >= -tol
    qin = dq >= -tol
    cross = pin != qin
    t = torch.where(cross, dp / torch.where(cross, dp - dq, 1.0), 0.0).clamp(0, 1)
    out = []
    for p, q, n in ((px, qx, nx), (py, qy, ny)):
        x = p + t * (q - p)  # the crossing point
        first = torch.where(pin, p, torch.where(qin, x, p - dp * n))
        second = torch.where(qin, q, torch.where(pin, x, q - dq * n))
        out.append(torch.stack([first, second], 2).reshape(p.shape[0], -1))
    return out


def _inside_all(px, py, rx, ry, tol):
    """``(P,)`` bool: every point ``(px, py)`` (``(P, K)``) is inside the rectangles ``(rx, ry)``
    (``(P, 4)``) within ``tol`` (``(P, 1)``)."""
    inside = torch.ones(px.shape, dtype=torch.bool, device=px.device)
    for k in range(4):
        ax, ay, bx, by = (
            rx[:, k : k + 1],
            ry[:, k : k + 1],
            rx[:, (k + 1) % 4 : (k + 1) % 4 + 1],
            ry[:, (k + 1) % 4 : (k + 1) % 4 + 1],
        )
        nx, ny = _inward_normal(ax, ay, bx, by)
        inside &= (px - ax) * nx + (py - ay) * ny >= -tol
    return inside.all(1)


def intersection_area_pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Intersection area of row-aligned rectangles ``a, b (P, 5)`` float64 (valid, positive sizes).

    Vectorised over the ``P`` pairs (no Python loop over pairs): four clipping steps on
    fixed-size ``(P, 4·2^k)`` vertex arrays, then the shoelace formula.
    """
    # local origin: the centre of a
    zero = torch.zeros_like(a[:, 0])
    ax, ay = _corners(zero, zero, a[:, 2], a[:, 3], a[:, 4])
    bx, by = _corners(b[:, 0] - a[:, 0], b[:, 1] - a[:, 1], b[:, 2], b[:, 3], b[:, 4])
    scale = (b[:, 0] - a[:, 0]).abs() + (b[:, 1] - a[:, 1]).abs() + a[:, 2] + a[:, 3] + b[:, 2] + b[:, 3]
    tol = (_TOL * scale)[:, None]
    px, py = ax, ay
    for k in range(4):
        j = (k + 1) % 4
        px, py = _clip(px, py, bx[:, k : k + 1], by[:, k : k + 1], bx[:, j : j + 1], by[:, j : j + 1], tol)
    qx, qy = px.roll(-1, dims=1), py.roll(-1, dims=1)
    area = 0.5 * (px * qy - py * qx).sum(-1)
    area = area.clamp(min=0)
    # one rectangle inside the other: the intersection is that rectangle, exactly
    area_a, area_b = a[:, 2] * a[:, 3], b[:, 2] * b[:, 3]
    area = torch.where(_inside_all(bx, by, ax, ay, tol), area_b, area)
    area = torch.where(_inside_all(ax, ay, bx, by, tol), area_a, area)
    return torch.minimum(area, torch.minimum(area_a, area_b))


def _pair_candidates(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(N, M)`` bool: bounding circles touch (pairs outside have IoU exactly 0)."""
    ra = 0.5 * torch.hypot(a[:, 2], a[:, 3])
    rb = 0.5 * torch.hypot(b[:, 2], b[:, 3])
    dist = torch.hypot(a[:, None, 0] - b[None, :, 0], a[:, None, 1] - b[None, :, 1])
    return dist <= (ra[:, None] + rb[None, :]) * (1 + 1e-9) + 1e-12


def overlap_bev(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """``(N, M)`` float64 BEV intersection areas of ``(N, 5|≥7)`` and ``(M, 5|≥7)`` boxes (0 for invalid)."""
    a = bev_columns(boxes_a).double()
    b = bev_columns(boxes_b).double()
    va, vb = box_valid(a), box_valid(b)
    # invalid boxes are replaced by a harmless far-away unit box and masked out
    dummy = torch.tensor([1e9, 1e9, 1.0, 1.0, 0.0], dtype=torch.float64, device=a.device)
    a = torch.where(va[:, None], a, dummy)
    b = torch.where(vb[:, None], b, dummy)
    pos_a, pos_b = (a[:, 2] > 0) & (a[:, 3] > 0), (b[:, 2] > 0) & (b[:, 3] > 0)
    cand = _pair_candidates(a, b) & (va & pos_a)[:, None] & (vb & pos_b)[None, :]
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    ii, jj = cand.nonzero(as_tuple=True)
    chunk = _CHUNK if a.device.type == "cpu" else _CHUNK_GPU
    for s in range(0, ii.numel(), chunk):
        i, j = ii[s : s + chunk], jj[s : s + chunk]
        out[i, j] = intersection_area_pairs(a[i], b[j])
    return out


def boxes_iou_bev(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """``(N, M)`` float64 rotated BEV IoU (0 where either box is invalid or has zero area)."""
    a, b = bev_columns(boxes_a).double(), bev_columns(boxes_b).double()
    inter = overlap_bev(a, b)
    area_a = torch.where(box_valid(a), a[:, 2] * a[:, 3], 0.0)
    area_b = torch.where(box_valid(b), b[:, 2] * b[:, 3], 0.0)
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / torch.where(union > 0, union, 1.0), 0.0)


def boxes_iou_bev_aligned(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """``(P,)`` float64 BEV IoU of row-aligned pairs ``boxes_a[i], boxes_b[i]`` (same rules as
    :func:`boxes_iou_bev`; for tests and hard-case tables)."""
    a, b = bev_columns(boxes_a).double(), bev_columns(boxes_b).double()
    va, vb = box_valid(a), box_valid(b)
    dummy = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64, device=a.device)
    ok = va & vb & (a[:, 2] > 0) & (a[:, 3] > 0) & (b[:, 2] > 0) & (b[:, 3] > 0)
    inter = torch.cat(
        [
            intersection_area_pairs(
                torch.where(ok[s : s + _CHUNK, None], a[s : s + _CHUNK], dummy),
                torch.where(ok[s : s + _CHUNK, None], b[s : s + _CHUNK], dummy),
            )
            for s in range(0, a.shape[0], _CHUNK)
        ]
        or [a.new_zeros(0)]
    )
    inter = torch.where(ok, inter, 0.0)
    union = torch.where(va, a[:, 2] * a[:, 3], 0.0) + torch.where(vb, b[:, 2] * b[:, 3], 0.0) - inter
    return torch.where(union > 0, inter / torch.where(union > 0, union, 1.0), 0.0)


def boxes_iou_3d(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """``(N, M)`` float64 3D IoU of ``(N, ≥7)`` boxes: BEV overlap × height overlap over the union volume.

    ``z`` is the box centre (OpenPCDet). Invalid boxes (non-finite, or a negative ``dz``) give 0.
    """
    a, b = boxes_a[:, :7].double(), boxes_b[:, :7].double()
    va = torch.isfinite(a).all(1) & (a[:, 5] >= 0)
    vb = torch.isfinite(b).all(1) & (b[:, 5] >= 0)
    inter_bev = overlap_bev(a, b)
    top = torch.minimum(a[:, None, 2] + a[:, None, 5] / 2, b[None, :, 2] + b[None, :, 5] / 2)
    bottom = torch.maximum(a[:, None, 2] - a[:, None, 5] / 2, b[None, :, 2] - b[None, :, 5] / 2)
    valid = va[:, None] & vb[None, :]
    inter = torch.where(valid, inter_bev * (top - bottom).clamp(min=0), 0.0)
    vol_a = torch.where(va & box_valid(bev_columns(a)), a[:, 3] * a[:, 4] * a[:, 5], 0.0)
    vol_b = torch.where(vb & box_valid(bev_columns(b)), b[:, 3] * b[:, 4] * b[:, 5], 0.0)
    union = vol_a[:, None] + vol_b[None, :] - inter
    return torch.where(union > 0, inter / torch.where(union > 0, union, 1.0), 0.0)


def sort_order(scores: torch.Tensor, pre_max_size: int | None = None) -> torch.Tensor:
    """Descending stable score order (NaN ranks as −inf), truncated to ``pre_max_size``."""
    key = torch.nan_to_num(scores.double(), nan=-float("inf"))
    order = torch.sort(key, descending=True, stable=True).indices
    return order if pre_max_size is None else order[:pre_max_size]


def nms_bev(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    pre_max_size: int | None = None,
    post_max_size: int | None = None,
    idxs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy rotated NMS; kept indices ``(K,)`` int64 into ``boxes``, in descending score order.

    Boxes with different ``idxs`` never suppress each other. Invalid boxes (see the module
    docstring) and NaN scores are never kept and never suppress.
    """
    order = sort_order(scores, pre_max_size)
    bev = bev_columns(boxes)[order].double()
    iou = boxes_iou_bev(bev, bev)
    if idxs is not None:
        g = idxs[order]
        iou = torch.where(g[:, None] == g[None, :], iou, 0.0)
    # the greedy loop runs on the host (one copy of the mask, no per-box device sync)
    suppressed = (~(box_valid(bev) & ~torch.isnan(scores[order]))).cpu().numpy()
    over = (iou > iou_threshold).cpu().numpy()
    keep: list[int] = []
    for i in range(order.numel()):
        if suppressed[i]:
            continue
        keep.append(i)
        if post_max_size is not None and len(keep) == post_max_size:
            break
        suppressed |= over[i]
    return order[torch.tensor(keep, dtype=torch.int64, device=order.device)]


def nms_bev_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    pre_max_size: int | None,
    post_max_size: int,
    idxs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices (post_max_size,) int64 padded with −1, count () int64)``."""
    keep = nms_bev(boxes, scores, iou_threshold, pre_max_size, post_max_size, idxs)
    out = torch.full((post_max_size,), -1, dtype=torch.int64, device=boxes.device)
    out[: keep.numel()] = keep
    return out, torch.tensor(keep.numel(), dtype=torch.int64, device=boxes.device)
