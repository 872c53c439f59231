"""Scenes for :mod:`pcops.sim`: materials and the surface table, the parts of labelled
objects, and the random street scene (ground, buildings, vegetation, clutter, labelled cars,
pedestrians and cyclists) built from one ``numpy.random.Generator``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .clutter import add_street_clutter
from .raycast import _BoxGroup, _Cylinder, _Ellipsoid, _Ground, _rect_parts
from .sensor import MAX_RANGE, MOUNT_POSTS, SENSOR_HEIGHT

# ----------------------------------------------------------------------------- objects

PART_INSET = 0.07  # m: object parts stay this far inside their box (> 3 sigma noise + 2 mm quantum)

# KITTI mean sizes (l, w, h) and spreads, metres.
CLASS_SIZES = {
    "Car": ((3.9, 1.6, 1.56), (0.35, 0.09, 0.1)),
    "Pedestrian": ((0.8, 0.62, 1.76), (0.15, 0.08, 0.1)),
    "Cyclist": ((1.76, 0.6, 1.73), (0.12, 0.05, 0.08)),
}


# Scene version 2 (issue 22): vans and trucks (labelled Van, Truck: ignored for Car, as KITTI
# does), four car body types and pedestrians with separate legs and arms.
# type: (share, mean (l, w, h), clearance, belt line / h, cabin rear x / l, windshield base x / l, wheel radius)
CAR_TYPES = {
    "compact": (0.3, (3.5, 1.55, 1.5), 0.14, 0.55, -0.45, 0.12, 0.28),
    "hatchback": (0.3, (3.9, 1.6, 1.52), 0.15, 0.56, -0.44, 0.1, 0.3),
    "sedan": (0.25, (4.3, 1.68, 1.46), 0.15, 0.58, -0.3, 0.16, 0.31),
    "suv": (0.15, (4.5, 1.8, 1.75), 0.22, 0.55, -0.44, 0.14, 0.36),
}
CAR_TYPE_SD = (0.2, 0.06, 0.06)
VEHICLE_SIZES_V2 = {"Van": ((5.1, 1.9, 2.2), (0.4, 0.1, 0.15)), "Truck": ((10.1, 2.6, 3.3), (1.8, 0.15, 0.3))}
CLASS_SHARES_V2 = (("Car", 0.6), ("Van", 0.06), ("Truck", 0.03), ("Pedestrian", 0.2), ("Cyclist", 0.11))
VEHICLES = ("Car", "Van", "Truck")
_SHARES_V2 = np.cumsum([c for _, c in CLASS_SHARES_V2])
_CAR_TYPE_NAMES = list(CAR_TYPES)
_CAR_TYPE_P = [CAR_TYPES[t][0] for t in _CAR_TYPE_NAMES]


# ----------------------------------------------------------------------------- surfaces

# name: (albedo low, albedo high, drop probability, porosity, see-through depth)
# see-through: glass returns come with probability GLASS_PASS from up to that many metres behind it
_MATERIALS = {
    "road": (0.25, 0.4, 0.0, 0.0, 0.0),
    "lane": (0.5, 0.75, 0.0, 0.0, 0.0),
    "sidewalk": (0.3, 0.5, 0.0, 0.0, 0.0),
    "curb": (0.3, 0.5, 0.0, 0.0, 0.0),
    "facade": (0.2, 0.5, 0.0, 0.0, 0.0),
    "roof": (0.15, 0.4, 0.0, 0.0, 0.0),
    "window": (0.1, 0.4, 0.3, 0.0, 4.0),
    "wall": (0.25, 0.55, 0.0, 0.0, 0.0),
    "foliage": (0.3, 0.6, 0.0, 0.4, 0.0),
    "trunk": (0.2, 0.4, 0.0, 0.0, 0.0),
    "pole": (0.3, 0.6, 0.0, 0.0, 0.0),
    "car_paint": (0.05, 0.6, 0.0, 0.0, 0.0),
    "car_glass": (0.04, 0.15, 0.5, 0.0, 0.0),
    "tyre": (0.02, 0.08, 0.1, 0.0, 0.0),
    "person": (0.15, 0.5, 0.0, 0.0, 0.0),
    "bicycle": (0.2, 0.5, 0.0, 0.45, 0.0),
    "ego": (0.0, 0.0, 1.0, 0.0, 0.0),
}


# scene version 2: probability that a return reads reflectance 0 (dark or weak returns; fitted to
# the real scans' share of zero readings: about 4 % on the ground, 10-15 % above it within 20 m)
ZERO_READING_V2 = {"road": 0.04, "lane": 0.02, "sidewalk": 0.04, "curb": 0.04}
ZERO_READING_V2_OTHER = 0.1


class _Surfaces:
    """Table of surfaces (one per material instance): albedo, drop probability, porosity,
    see-through depth, and the labelled object it belongs to (-1 for background)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.albedo: list[float] = []
        self.drop: list[float] = []
        self.porosity: list[float] = []
        self.instance: list[int] = []
        self.see_through: list[float] = []
        self.zero_reading: list[float] = []  # read by scene version 2's reflectance only

    def new(self, material: str, instance: int = -1, albedo: float | None = None) -> int:
        lo, hi, drop, por, deep = _MATERIALS[material]
        self.see_through.append(deep)
        self.zero_reading.append(ZERO_READING_V2.get(material, ZERO_READING_V2_OTHER))
        a = float(self.rng.uniform(lo, hi)) if albedo is None else albedo
        self.albedo.append(a)
        self.drop.append(drop)
        self.porosity.append(por)
        self.instance.append(instance)
        return len(self.albedo) - 1

    def arrays(self):
        return (
            np.array(self.albedo),
            np.array(self.drop),
            np.array(self.see_through),
            np.array(self.instance, dtype=np.int64),
        )


# ----------------------------------------------------------------------------- scene


@dataclass
class _Scene:
    ground: _Ground
    prims: list
    surfaces: _Surfaces
    boxes: np.ndarray  # (M, 7) float64
    names: list = field(default_factory=list)


def _object_group(cls: str, box: np.ndarray, inst: int, surf: _Surfaces, style: str | None = None) -> _BoxGroup:
    """Build the parts of a labelled object inside its box (x, y, z, l, w, h, yaw); ``style``: the
    version-2 shape (a car type of ``CAR_TYPES``, ``"limbs"`` for a pedestrian), else version 1's."""
    l, w, h = box[3], box[4], box[5]
    m = PART_INSET
    hx, hy, hz = l / 2 - m, w / 2 - m, h / 2
    b = -hz  # box bottom in the frame
    if style is not None or cls in ("Van", "Truck"):
        parts = _parts_v2(cls, style, l, h, hx, hy, hz, inst, surf)
    elif cls == "Car":
        paint = surf.new("car_paint", inst)
        glass = surf.new("car_glass", inst)
        tyre = surf.new("tyre", inst)
        zb = b + 0.62 * h
        wr = 0.31
        wx = hx - 0.55
        parts = [
            (-hx, hx, -hy, hy, b + 0.28, zb, paint, paint),
            (-0.36 * l, 0.2 * l, -hy + 0.08, hy - 0.08, zb, hz - 0.03, glass, paint),
        ] + _wheels((-wx, wx), wr, hy, b, b + 0.3, tyre)
    elif cls == "Pedestrian":
        cloth = surf.new("person", inst)
        skin = surf.new("person", inst)
        legs_x = min(0.16, hx)
        parts = [
            (-legs_x, legs_x, -min(0.17, hy), min(0.17, hy), b + 0.03, b + 0.47 * h, cloth, cloth),
            (-0.13, 0.13, -min(0.24, hy), min(0.24, hy), b + 0.47 * h, b + 0.82 * h, cloth, cloth),
            (-0.1, 0.1, -0.09, 0.09, b + 0.82 * h + 0.02, hz - 0.03, skin, skin),
        ]
    elif cls == "Cyclist":
        bike = surf.new("bicycle", inst)
        rider = surf.new("person", inst)
        parts = [
            (-hx, hx, -0.05, 0.05, b + 0.03, b + 0.62, bike, bike),
            (-0.1, 0.25, -min(0.15, hy), min(0.15, hy), b + 0.35, b + 0.9, rider, rider),
            (-0.32, 0.08, -min(0.22, hy), min(0.22, hy), b + 0.9, b + 0.82 * h, rider, rider),
            (-0.05, 0.15, -0.09, 0.09, b + 0.82 * h + 0.02, hz - 0.03, rider, rider),
        ]
    else:  # pragma: no cover
        raise ValueError(cls)
    lo, hi, side, top = _rect_parts(parts)
    return _BoxGroup(box[:3].copy(), float(box[6]), lo, hi, side, top)


def _wheels(xs, wr, hy, b, top, tyre) -> list:
    """Four or more wheels (one pair per axle position in ``xs``), 0.22 m wide, inside the box."""
    parts = []
    for x in xs:
        for sy in (-1, 1):
            yc = sy * (hy - 0.11)
            parts.append((x - wr, x + wr, yc - 0.11, yc + 0.11, b + 0.03, top, tyre, tyre))
    return parts


def _parts_v2(cls, style, l, h, hx, hy, hz, inst, surf) -> list:
    """Version-2 part lists (see ``CAR_TYPES``); every part stays inside the inset box."""
    b = -hz
    if cls in VEHICLES:
        paint = surf.new("car_paint", inst)
        glass = surf.new("car_glass", inst)
        tyre = surf.new("tyre", inst)
    if cls == "Car":
        _, _, clear, belt, cx0, cx1, wr = CAR_TYPES[style]
        zb = b + belt * h
        nose = hx - 0.12 * l  # the hood's front drops toward the bumper
        wx = hx - max(0.5, 0.14 * l)
        return [
            (-hx, nose, -hy, hy, b + clear, zb, paint, paint),
            (nose, hx, -hy, hy, b + clear, zb - 0.07, paint, paint),
            (max(cx0 * l, -hx + 0.1), cx1 * l, -hy + 0.08, hy - 0.08, zb, hz - 0.03, glass, paint),
        ] + _wheels((-wx, wx), wr, hy, b, b + clear + 0.05, tyre)
    if cls == "Van":
        zb = b + 0.45 * h
        wx = hx - 0.7
        return [
            (-hx, hx, -hy, hy, b + 0.3, zb, paint, paint),
            (-hx, hx - 0.75, -hy, hy, zb, hz - 0.03, paint, paint),
            (hx - 0.75, hx - 0.35, -hy + 0.05, hy - 0.05, zb, hz - 0.25, glass, paint),
        ] + _wheels((-wx, wx), 0.33, hy, b, b + 0.35, tyre)
    if cls == "Truck":
        cab = hx - 2.3
        cargo = surf.new("wall", inst)
        return [
            (-hx, hx, -0.45, 0.45, b + 0.45, b + 1.05, paint, paint),  # chassis
            (cab, hx, -hy, hy, b + 0.6, b + 0.5 * h, paint, paint),
            (cab + 0.2, hx - 0.15, -hy + 0.05, hy - 0.05, b + 0.5 * h, b + 0.85 * h, glass, paint),
            (-hx, cab - 0.2, -hy, hy, b + 1.05, hz - 0.03, cargo, cargo),
        ] + _wheels((hx - 0.9, -hx + 1.2, -hx + 2.6), 0.5, hy, b, b + 1.0, tyre)
    if cls == "Pedestrian":  # legs and arms apart, swung by a stride
        cloth = surf.new("person", inst)
        skin = surf.new("person", inst)
        reach = max(hx - 0.08, 0.0)
        s = float(np.clip(surf.rng.uniform(-0.2, 0.2), -reach, reach))
        hip, shoulder = b + 0.47 * h, b + 0.8 * h
        arm_out = min(0.27, hy)
        arm_in = arm_out - 0.07
        torso = min(0.19, arm_in - 0.01)
        parts = [
            (s - 0.07, s + 0.07, -min(0.16, hy), -0.03, b + 0.03, hip, cloth, cloth),
            (-s - 0.07, -s + 0.07, 0.03, min(0.16, hy), b + 0.03, hip, cloth, cloth),
            (-0.12, 0.12, -torso, torso, hip, b + 0.82 * h, cloth, cloth),
            (-0.1, 0.1, -0.09, 0.09, b + 0.82 * h + 0.02, hz - 0.03, skin, skin),
        ]
        a = float(np.clip(0.6 * s, -(hx - 0.05), hx - 0.05))
        if arm_in > torso:
            parts += [
                (-a - 0.05, -a + 0.05, -arm_out, -arm_in, b + 0.5 * h, shoulder, cloth, cloth),
                (a - 0.05, a + 0.05, arm_in, arm_out, b + 0.5 * h, shoulder, cloth, cloth),
            ]
        return parts
    raise ValueError(cls)  # pragma: no cover


def _build_scene(rng: np.random.Generator, n_objects: int | None, ego_xs=(0.0,), version: int = 1) -> _Scene:
    """Random street scene; ``ego_xs`` are the sensor's x positions (kept free of objects);
    ``version`` 2 adds vans, trucks, car body types, pedestrians with limbs, cars turning at
    the intersection at any heading and dense person-sized clutter (:mod:`.clutter`); version 1
    draws exactly what it always drew."""
    surf = _Surfaces(rng)
    # ground: road along x, ego in the right-hand lane (y = 0), road centre to its left
    half = float(rng.uniform(4.2, 6.5))
    y_mid = float(rng.uniform(1.6, 2.0))
    cross = None
    if rng.random() < 0.5:
        xc = float(rng.choice([-1, 1]) * rng.uniform(15, 45))
        cw = float(rng.uniform(8, 14))
        cross = (xc - cw / 2, xc + cw / 2)
    ground = _Ground(
        z0=-SENSOR_HEIGHT,
        sx=float(rng.uniform(-0.015, 0.015)),
        sy=float(rng.uniform(-0.005, 0.005)),
        y_mid=y_mid,
        half=half,
        curb=float(rng.uniform(0.1, 0.18)),
        cross=cross,
        road=surf.new("road"),
        lane=surf.new("lane"),
        sidewalk=surf.new("sidewalk"),
        curb_s=surf.new("curb"),
    )
    prims: list = []
    # BEV circles (x, y, radius) kept free: the ego car at every sweep position first
    occupied: list[tuple[float, float, float]] = [(ex - 0.9, 0.0, 2.6) for ex in ego_xs]

    def in_cross(x0, x1, margin=1.0):
        return cross is not None and x1 > cross[0] - margin and x0 < cross[1] + margin

    def free(x, y, r):
        return all((x - a) ** 2 + (y - b) ** 2 > (r + c) ** 2 for a, b, c in occupied)

    # the sensor's mounting posts block a few low rays (no return); placed per sweep
    ego = surf.new("ego")
    for _ in MOUNT_POSTS:
        prims.append(_Cylinder(0.0, 0.0, 0.0, 0.0, 0.0, ego))

    sidewalk_w = {}
    for side in (-1, 1):
        edge = y_mid + side * half  # curb line
        sw = float(rng.uniform(2.0, 4.0))
        sidewalk_w[side] = sw
        # street furniture on the sidewalk: poles near the curb, trees a bit further in
        x = float(rng.uniform(-100, -85))
        while x < 100:
            if not in_cross(x - 1, x + 1) and abs(x) > 1.5:
                kind = rng.random()
                if kind < 0.45:
                    y = edge + side * 0.5
                    r = float(rng.uniform(0.07, 0.15))
                    zg = float(ground.height(x, y))
                    prims.append(_Cylinder(x, y, r, zg - 0.1, zg + float(rng.uniform(4, 9)), surf.new("pole")))
                    occupied.append((x, y, r + 0.1))
                elif kind < 0.85:
                    y = edge + side * min(1.3, sw / 2)
                    r = float(rng.uniform(0.12, 0.3))
                    zg = float(ground.height(x, y))
                    th = float(rng.uniform(2.6, 3.6))
                    prims.append(_Cylinder(x, y, r, zg - 0.1, zg + th + 0.5, surf.new("trunk")))
                    a = float(rng.uniform(1.3, 3.0))
                    c = float(rng.uniform(1.3, 2.6))
                    prims.append(
                        _Ellipsoid(
                            np.array([x, y, zg + th + c * 0.9]),
                            np.array([a, a * float(rng.uniform(0.8, 1.2)), c]),
                            surf.new("foliage"),
                        )
                    )
                    occupied.append((x, y, r + 0.1))
            x += float(rng.uniform(9, 28))
        # small unlabelled clutter: bollards, bins, utility boxes, benches, parked bicycles, signs
        x = float(rng.uniform(-80, -70))
        while x < 80:
            x += float(rng.uniform(3, 14))
            if in_cross(x - 2, x + 2) or abs(x) < 1.5:
                continue
            kind = rng.random()
            if kind < 0.25:  # bollard at the curb
                y, r = edge + side * 0.3, float(rng.uniform(0.06, 0.1))
                if not free(x, y, r):
                    continue
                zg = float(ground.height(x, y))
                prims.append(_Cylinder(x, y, r, zg - 0.1, zg + float(rng.uniform(0.8, 1.1)), surf.new("pole")))
                occupied.append((x, y, r + 0.1))
                continue
            y = edge + side * float(rng.uniform(0.5, max(0.6, sw - 0.5)))
            if kind < 0.45:  # bin
                l_, w_, h_, mat = (
                    float(rng.uniform(0.5, 0.7)),
                    float(rng.uniform(0.5, 0.7)),
                    float(rng.uniform(0.9, 1.2)),
                    "wall",
                )
            elif kind < 0.6:  # utility box
                l_, w_, h_, mat = (
                    float(rng.uniform(0.6, 1.0)),
                    float(rng.uniform(0.4, 0.6)),
                    float(rng.uniform(1.0, 1.5)),
                    "pole",
                )
            elif kind < 0.75:  # bench
                l_, w_, h_, mat = float(rng.uniform(1.5, 2.0)), 0.5, float(rng.uniform(0.45, 0.8)), "wall"
            elif kind < 0.9:  # parked bicycle
                l_, w_, h_, mat = 1.7, 0.1, 1.0, "bicycle"
            else:  # sign post with a plate
                l_, w_, h_, mat = 0.6, 0.06, float(rng.uniform(2.2, 3.0)), "pole"
            r = 0.5 * math.hypot(l_, w_) + 0.1
            if not free(x, y, r):
                continue
            zg = float(ground.height(x, y))
            m_ = surf.new(mat)
            yaw = float(rng.uniform(-0.2, 0.2)) + (math.pi / 2 if rng.random() < 0.3 else 0.0)
            if kind >= 0.9:
                lo = np.array([[-0.04, -0.04, -0.1], [-l_ / 2, -w_ / 2, h_ - 0.6]])
                hi = np.array([[0.04, 0.04, h_], [l_ / 2, w_ / 2, h_]])
                sides = np.array([m_, m_])
            else:
                lo = np.array([[-l_ / 2, -w_ / 2, -0.1]])
                hi = np.array([[l_ / 2, w_ / 2, h_]])
                sides = np.array([m_])
            prims.append(_BoxGroup(np.array([x, y, zg]), yaw, lo, hi, sides, sides))
            occupied.append((x, y, r))
        if version > 1:
            add_street_clutter(rng, ground, surf, prims, occupied, edge, side, sw, in_cross, free)
        # a row of buildings, walls, hedges and gaps behind the sidewalk
        x = float(rng.uniform(-125, -110))
        while x < 120:
            length = float(rng.uniform(8, 32))
            x0, x1 = x, x + length
            x = x1 + (float(rng.uniform(0.5, 6)) if rng.random() < 0.3 else 0.0)
            if in_cross(x0, x1, margin=2.0):  # stop at the cross street, resume after it
                x = max(x, cross[1] + 2.0)
                if x0 > cross[0] - 8.0:
                    continue
                x1 = cross[0] - 2.0
                length = x1 - x0
            kind = rng.random()
            back = edge + side * sw  # back of the sidewalk
            xm = (x0 + x1) / 2
            zg = float(ground.height(xm, back + side * 1.0))
            if kind < 0.65:  # building
                setback = float(rng.uniform(0.0, 3.0)) if rng.random() < 0.5 else 0.0
                depth = float(rng.uniform(8, 20))
                height = float(rng.uniform(4, 20))
                yn = back + side * setback  # the facade facing the street
                yc = yn + side * depth / 2
                lo = np.array([[-length / 2, -depth / 2, -1.0]])
                hi = np.array([[length / 2, depth / 2, height]])
                facade = surf.new("facade")
                grp = _BoxGroup(
                    np.array([xm, yc, zg]),
                    float(rng.normal(0, 0.015)),
                    lo,
                    hi,
                    np.array([facade]),
                    np.array([surf.new("roof")]),
                    np.array([True]),
                    surf.new("window"),
                )
                prims.append(grp)
                if setback > 2.0 and rng.random() < 0.6:  # bushes in the front yard
                    for _ in range(int(rng.integers(1, 4))):
                        bx = float(rng.uniform(x0 + 1, x1 - 1))
                        by = back + side * float(rng.uniform(0.6, setback - 0.6))
                        s = float(rng.uniform(0.4, 1.0))
                        prims.append(
                            _Ellipsoid(
                                np.array([bx, by, float(ground.height(bx, by)) + 0.2 * s]),
                                np.array([s * 1.3, s, s * float(rng.uniform(0.6, 1.0))]),
                                surf.new("foliage"),
                            )
                        )
            elif kind < 0.8:  # wall or fence
                height = float(rng.uniform(0.8, 2.5))
                yc = back + side * float(rng.uniform(0.2, 1.5))
                lo = np.array([[-length / 2, -0.12, -0.5]])
                hi = np.array([[length / 2, 0.12, height]])
                s_ = surf.new("wall")
                prims.append(_BoxGroup(np.array([xm, yc, zg]), 0.0, lo, hi, np.array([s_]), np.array([s_])))
            elif kind < 0.92:  # hedge
                height = float(rng.uniform(0.7, 1.8))
                yc = back + side * float(rng.uniform(0.6, 1.5))
                lo = np.array([[-length / 2, -0.5, -0.3]])
                hi = np.array([[length / 2, 0.5, height]])
                s_ = surf.new("foliage")
                prims.append(_BoxGroup(np.array([xm, yc, zg]), 0.0, lo, hi, np.array([s_]), np.array([s_])))
            else:  # an open patch (lawn, field) with scattered bushes the sensor sees between
                for _ in range(int(rng.integers(2, 9))):
                    bx = float(rng.uniform(x0, x1))
                    by = back + side * float(rng.uniform(0.8, 12.0))
                    sz = float(rng.uniform(0.4, 1.3))
                    prims.append(
                        _Ellipsoid(
                            np.array([bx, by, float(ground.height(bx, by)) + 0.2 * sz]),
                            np.array([sz * float(rng.uniform(0.8, 1.6)), sz, sz * float(rng.uniform(0.5, 1.0))]),
                            surf.new("foliage"),
                        )
                    )

    # the street may end (a bend, a T-junction) in a row of buildings across it
    x_lim = [-MAX_RANGE, MAX_RANGE]
    for k, end in enumerate((-1, 1)):
        if rng.random() < 0.5:
            xe = end * float(rng.uniform(55, 110))
            depth = float(rng.uniform(10, 20))
            width = 2 * half + 60.0
            lo = np.array([[-depth / 2, -width / 2, -1.0]])
            hi = np.array([[depth / 2, width / 2, float(rng.uniform(6, 20))]])
            xc = xe + end * depth / 2
            prims.append(
                _BoxGroup(
                    np.array([xc, y_mid, float(ground.height(xe, y_mid))]),
                    0.0,
                    lo,
                    hi,
                    np.array([surf.new("facade")]),
                    np.array([surf.new("roof")]),
                    np.array([True]),
                    surf.new("window"),
                )
            )
            x_lim[k] = xe - end * 3.0

    # labelled objects
    if n_objects is None:
        n_objects = int(rng.integers(30, 45))
    boxes, names = [], []
    lanes_right = [y_mid - 1.75]  # same direction as ego
    lanes_left = [y_mid + 1.75]
    if half > 6.2:
        lanes_right.append(y_mid - 4.0)
        lanes_left.append(y_mid + 4.0)
    for _ in range(n_objects):
        u = rng.random()
        style = None
        if version == 1:
            cls = "Car" if u < 0.68 else ("Pedestrian" if u < 0.9 else "Cyclist")
            mean, sd = CLASS_SIZES[cls]
        else:
            cls = CLASS_SHARES_V2[int(np.searchsorted(_SHARES_V2, u * _SHARES_V2[-1], side="right"))][0]
            mean, sd = VEHICLE_SIZES_V2.get(cls) or CLASS_SIZES[cls]
            if cls == "Car":
                style = _CAR_TYPE_NAMES[int(rng.choice(len(_CAR_TYPE_NAMES), p=_CAR_TYPE_P))]
                mean, sd = CAR_TYPES[style][1], CAR_TYPE_SD
            elif cls == "Pedestrian":
                style = "limbs"
        lwh = np.maximum(np.array(mean) + rng.normal(0, 1, 3) * np.array(sd), np.array(mean) * 0.7)
        l, w, h = (float(v) for v in lwh)
        for _attempt in range(25):
            mode = rng.random()
            side = -1 if rng.random() < 0.5 else 1
            edge = y_mid + side * half
            on_sidewalk = False
            if cls in VEHICLES:
                if version > 1 and cross is not None and mode >= 0.95:  # turning at the intersection
                    x = float(rng.uniform(cross[0] + 2.0, cross[1] - 2.0))
                    y = y_mid + float(rng.uniform(-half + 1.5, half - 1.5))
                    yaw = float(rng.uniform(-math.pi, math.pi))
                elif mode < 0.6:  # parked along a curb, facing the travel direction of that side
                    x = float(rng.uniform(-70, 70))
                    y = edge - side * (w / 2 + float(rng.uniform(0.15, 0.45)))
                    yaw = (0.0 if side < 0 else math.pi) + float(rng.normal(0, 0.04))
                    if in_cross(x - l, x + l):
                        continue
                elif mode < 0.9 or cross is None:  # in traffic
                    x = float(rng.uniform(-75, 75))
                    if rng.random() < 0.5:
                        y, yaw = float(rng.choice(lanes_right)), 0.0
                    else:
                        y, yaw = float(rng.choice(lanes_left)), math.pi
                    y += float(rng.normal(0, 0.25))
                    yaw += float(rng.normal(0, 0.03))
                else:  # in the cross street
                    x = float(rng.uniform(cross[0] + 1.5, cross[1] - 1.5))
                    y = float(rng.uniform(y_mid + half + 4, y_mid + half + 45)) * side
                    yaw = side * math.pi / 2 * (1 if rng.random() < 0.5 else -1) + float(rng.normal(0, 0.03))
            elif cls == "Pedestrian":
                if mode < 0.8:  # on a sidewalk
                    x = float(rng.uniform(-45, 45))
                    y = edge + side * float(rng.uniform(0.5, sidewalk_w[side] - 0.5))
                    on_sidewalk = True
                else:  # crossing the road
                    x = float(rng.uniform(-30, 30))
                    y = y_mid + float(rng.uniform(-half + 0.5, half - 0.5))
                yaw = float(rng.uniform(-math.pi, math.pi))
            else:  # cyclist near the right edge of its lane
                x = float(rng.uniform(-50, 50))
                if rng.random() < 0.6:
                    y, yaw = y_mid - half + float(rng.uniform(0.6, 1.4)), 0.0
                else:
                    y, yaw = y_mid + half - float(rng.uniform(0.6, 1.4)), math.pi
                yaw += float(rng.normal(0, 0.08))
            r = 0.5 * math.hypot(l, w) + 0.25
            if not (x_lim[0] + r < x < x_lim[1] - r) or not free(x, y, r):
                continue
            zg = float(ground.height(x, y))
            if not on_sidewalk and cls != "Pedestrian" and abs(zg - (ground.z0 + ground.sx * x + ground.sy * y)) > 1e-9:
                continue  # a vehicle must stand on the road surface
            occupied.append((x, y, r))
            yaw = (yaw + math.pi) % (2 * math.pi) - math.pi
            box = np.array([x, y, zg + h / 2, l, w, h, yaw])
            prims.append(_object_group(cls, box, len(boxes), surf, style))
            boxes.append(box)
            names.append(cls)
            break
    return _Scene(ground, prims, surf, np.array(boxes, dtype=np.float64).reshape(-1, 7), names)
