"""Scene version 2's extra street clutter (issue 22): unlabelled objects of a pedestrian's or a
cyclist's size (hydrants, street shrubs, planters, parked scooters, A-boards, columns, people-sized
sign posts), dense along both sidewalks.

Real streets have many such objects; a scene without them teaches the detector that any upright
thing of a person's size is a person. They are hard negatives: unlabelled, so a detection on
one is a false positive in the simulated evaluation as well. Version 1 scenes do not call this
module (they stay byte-identical)."""

from __future__ import annotations

import math

import numpy as np

from .raycast import _BoxGroup, _Cylinder, _Ellipsoid, _rect_parts

# kind: share of the draws
_KINDS = (
    ("hydrant", 0.16),
    ("shrub", 0.22),
    ("planter", 0.14),
    ("scooter", 0.14),
    ("board", 0.1),
    ("column", 0.1),
    ("post", 0.14),
)
_CUM = np.cumsum([p for _, p in _KINDS])
SPACING = (2.0, 9.0)  # m between draws along a sidewalk


def _box(surf, x, y, zg, yaw, parts, mat):
    """A ``_BoxGroup`` of axis-aligned parts ``(x0, x1, y0, y1, z0, z1)`` sharing one material."""
    m = surf.new(mat)
    return _BoxGroup(np.array([x, y, zg]), yaw, *_rect_parts([(*p, m, m) for p in parts]))


def add_street_clutter(rng, ground, surf, prims, occupied, edge, side, sidewalk_w, in_cross, free) -> None:
    """Append version 2's clutter on the sidewalk whose curb line is ``y = edge`` (``side`` ±1 away
    from the road, ``sidewalk_w`` wide) to ``prims``, and its footprints to ``occupied``. Every
    object stays on the sidewalk: its footprint circle (the one reserved) lies behind the curb."""
    x = float(rng.uniform(-75, -70))
    while x < 75:
        x += float(rng.uniform(*SPACING))
        if in_cross(x - 2, x + 2) or abs(x) < 2.0:
            continue
        kind = _KINDS[int(np.searchsorted(_CUM, rng.random() * _CUM[-1], side="right"))][0]
        off = float(rng.uniform(0.35, max(0.5, sidewalk_w - 0.35)))  # from the curb
        yaw = float(rng.uniform(-math.pi, math.pi))

        def spot(r):
            """``(y, ground z)`` with the footprint of radius ``r`` behind the curb, or None if taken."""
            y = edge + side * max(off, r + 0.05)
            return (y, float(ground.height(x, y))) if free(x, y, r) else None

        if kind == "hydrant":
            r = float(rng.uniform(0.1, 0.18))
            if (at := spot(r + 0.1)) is None:
                continue
            y, zg = at
            prims.append(_Cylinder(x, y, r, zg - 0.1, zg + float(rng.uniform(0.55, 0.95)), surf.new("pole")))
            occupied.append((x, y, r + 0.1))
        elif kind == "shrub":  # a thin trunk with a crown at a person's height
            s = float(rng.uniform(0.3, 0.7))
            top = float(rng.uniform(1.2, 2.4))
            semi = np.array([s, s * float(rng.uniform(0.7, 1.3)), s * float(rng.uniform(0.8, 1.5))])
            r = float(semi[:2].max()) + 0.1
            if (at := spot(r)) is None:
                continue
            y, zg = at
            prims.append(_Cylinder(x, y, float(rng.uniform(0.03, 0.08)), zg - 0.1, zg + top - s, surf.new("trunk")))
            prims.append(_Ellipsoid(np.array([x, y, zg + top - semi[2]]), semi, surf.new("foliage")))
            occupied.append((x, y, r))
        elif kind == "planter":  # a box with a bush on it
            a, b, h = float(rng.uniform(0.4, 0.8)), float(rng.uniform(0.3, 0.6)), float(rng.uniform(0.4, 0.9))
            r = math.hypot(a, b) + 0.1
            if (at := spot(r)) is None:
                continue
            y, zg = at
            prims.append(_box(surf, x, y, zg, yaw, [(-a, a, -b, b, -0.1, h)], "wall"))
            s = float(rng.uniform(0.3, 0.6))
            prims.append(_Ellipsoid(np.array([x, y, zg + h + 0.6 * s]), np.array([a, b, s]), surf.new("foliage")))
            occupied.append((x, y, r))
        elif kind == "scooter":  # a parked scooter or motorbike: body, seat, handlebar column
            ln, h = float(rng.uniform(1.4, 2.1)), float(rng.uniform(0.9, 1.3))
            hl = ln / 2
            r = math.hypot(hl, 0.35) + 0.1
            if (at := spot(r)) is None:
                continue
            y, zg = at
            parts = [
                (-hl, hl, -0.12, 0.12, 0.1, 0.5),
                (-hl + 0.2, 0.1, -0.17, 0.17, 0.5, 0.75),
                (hl - 0.3, hl - 0.15, -0.05, 0.05, 0.5, h - 0.05),
                (hl - 0.3, hl - 0.15, -0.35, 0.35, h - 0.05, h),
            ]
            prims.append(_box(surf, x, y, zg, yaw, parts, "bicycle" if rng.random() < 0.5 else "car_paint"))
            occupied.append((x, y, r))
        elif kind == "board":  # an A-board or a standing sign panel
            w, h = float(rng.uniform(0.5, 0.9)), float(rng.uniform(0.8, 1.6))
            r = math.hypot(w / 2, 0.15) + 0.1
            if (at := spot(r)) is None:
                continue
            y, zg = at
            prims.append(_box(surf, x, y, zg, yaw, [(-w / 2, w / 2, -0.15, 0.15, -0.1, h)], "wall"))
            occupied.append((x, y, r))
        elif kind == "column":  # an arcade column or a pillar at the back of the sidewalk
            a = float(rng.uniform(0.15, 0.4))
            off = max(0.5, sidewalk_w - a - 0.1)
            if (at := spot(a * 1.5)) is None:
                continue
            y, zg = at
            prims.append(_box(surf, x, y, zg, 0.0, [(-a, a, -a, a, -0.1, float(rng.uniform(2.5, 4.5)))], "facade"))
            occupied.append((x, y, a * 1.5))
        else:  # a post of a person's height with a box on it (parking meter, ticket machine, mailbox)
            h = float(rng.uniform(1.1, 1.8))
            bw = float(rng.uniform(0.2, 0.45))
            r = math.hypot(bw / 2, 0.15) + 0.1
            if (at := spot(r)) is None:
                continue
            y, zg = at
            parts = [(-0.05, 0.05, -0.05, 0.05, -0.1, h - 0.4), (-bw / 2, bw / 2, -0.15, 0.15, h - 0.45, h)]
            prims.append(_box(surf, x, y, zg, yaw, parts, "pole"))
            occupied.append((x, y, r))
