"""Point-cloud and label readers/writers: KITTI, nuScenes, NumPy, PCD/PLY, and pcops' own labels.

Not an op module (nothing here is registered with ``torch.library``); import it as
``pcops.io``. Everything returns CPU tensors; move them with ``.to(device)``.

Points
    :func:`read_points` / :func:`write_points` pick the format from the file name:

    ============== ========================================================== ===
    suffix         layout                                                     C
    ============== ========================================================== ===
    ``.pcd.bin``   nuScenes: little-endian float32 (x, y, z, intensity, ring)   5
    ``.bin``       KITTI velodyne: little-endian float32 (x, y, z, reflectance) 4
    ``.npy``       NumPy array (N, C), C >= 3, any real dtype (cast to float32)  C
    ``.pcd``       Point Cloud Library format, through open3d (extra)         3/4
    ``.ply``       Polygon file format, through open3d (extra)                3/4
    ============== ========================================================== ===

    Coordinates are metres in the sensor (LiDAR) frame: x forward, y left, z up.

Boxes
    LiDAR-frame boxes are ``(M, 7)`` float32 ``(x, y, z, dx, dy, dz, heading)`` in
    OpenPCDet's convention: (x, y, z) is the box *centre* (not the bottom), dx/dy/dz the
    extents along the box's own x (length), y (width) and z (height) axes, and heading the
    rotation about +z from the LiDAR +x axis (counter-clockwise seen from above), wrapped
    to [-pi, pi).

KITTI labels (camera frame)
    :func:`read_kitti_label` reads ``label_2/*.txt`` (type, truncated, occluded, alpha, 2-D
    bbox (4), h w l, bottom-centre x y z in rectified camera coordinates, rotation_y) and
    converts each object to a LiDAR box with ``calib/*.txt`` as OpenPCDet does:
    ``xyz_lidar = inv(R0_rect_4x4 @ Tr_velo_to_cam_4x4) @ [xyz_rect, 1]``, then
    ``z += h / 2``, ``(dx, dy, dz) = (l, w, h)``, ``heading = -(pi / 2 + rotation_y)``.
    ``DontCare`` lines are skipped.

pcops labels (LiDAR frame)
    :func:`write_labels` / :func:`read_labels` use a small text format made for this
    project: UTF-8, one object a line, fields separated by single spaces::

        # pcops labels v1: name x y z dx dy dz heading num_points   (LiDAR frame, m, rad)
        Car 12.3456 -3.2100 -0.9500 3.9000 1.6000 1.5600 0.0312 812

    ``name`` has no spaces; the seven box numbers follow the box convention above;
    ``num_points`` is the number of scan points inside the box, or ``-1`` when unknown
    (it may be left out when reading). Lines starting with ``#`` and blank lines are
    ignored.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch

__all__ = [
    "read_points",
    "write_points",
    "KittiCalib",
    "read_calib",
    "KittiObject",
    "read_kitti_objects",
    "read_kitti_label",
    "camera_boxes_to_lidar",
    "Labels",
    "read_labels",
    "write_labels",
]

_BIN_FEATURES = {".pcd.bin": 5, ".bin": 4}
_OPEN3D_HINT = "install the optional extra: pip install 'pcops[open3d]'"
LABELS_HEADER = "# pcops labels v1: name x y z dx dy dz heading num_points   (LiDAR frame, m, rad)"


def _suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".pcd.bin"):
        return ".pcd.bin"
    return path.suffix.lower()


def _existing_file(path, what: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a path (str or os.PathLike), got {type(path).__name__}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what}: no such file: {p}")
    if not p.is_file():
        raise ValueError(f"{what}: not a regular file: {p}")
    return p


def _import_open3d(path: Path):
    try:
        import open3d  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"reading or writing {path.suffix} files ({path}) needs open3d; {_OPEN3D_HINT}") from e
    return open3d


def _has_attribute(tensor_map, key: str) -> bool:
    try:
        return key in tensor_map
    except TypeError:  # older open3d bindings without __contains__
        return bool(tensor_map.contains(key))


# --------------------------------------------------------------------------- points


def read_points(path, num_features: int | None = None) -> torch.Tensor:
    """Read a point cloud file into an ``(N, C)`` float32 CPU tensor.

    Args:
        path: file path; the format comes from its suffix (see the module docstring):
            ``.bin`` (KITTI, C = 4), ``.pcd.bin`` (nuScenes, C = 5), ``.npy`` (C from the
            array), ``.pcd`` / ``.ply`` (through open3d: C = 3, or 4 when the file has an
            intensity field).
        num_features: for raw float32 ``.bin`` files only, the number of float32 values per
            point when it differs from the suffix's default (e.g. 5 for a nuScenes sweep saved
            as plain ``.bin``).

    Returns:
        ``(N, C)`` float32 tensor (x, y, z, then the extra channels), metres.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a raw file whose size is not a multiple of the record size, a ``.npy``
            array that is not 2-D with at least 3 columns, or an unknown suffix.
        ImportError: ``.pcd`` / ``.ply`` without open3d installed (names the
            ``pcops[open3d]`` extra).
    """
    p = _existing_file(path, "path")
    suf = _suffix(p)
    if suf in _BIN_FEATURES:
        c = _BIN_FEATURES[suf] if num_features is None else num_features
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"num_features: expected a positive int, got {num_features!r}")
        size = p.stat().st_size
        rec = 4 * c
        if size % rec:
            raise ValueError(
                f"{p}: file size {size} bytes is not a multiple of the record size {rec} bytes "
                f"({c} float32 values per point); wrong format or truncated file?"
            )
        arr = np.fromfile(p, dtype="<f4").reshape(-1, c)
        return torch.from_numpy(arr.astype(np.float32, copy=False))
    if num_features is not None:
        raise ValueError(f"num_features: only applies to raw .bin files, not {suf} ({p})")
    if suf == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{p}: not a readable .npy array ({e})") from e
        if arr.ndim != 2 or arr.shape[1] < 3:
            raise ValueError(f"{p}: expected a 2-D array (N, C) with C >= 3, got shape {arr.shape}")
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"{p}: expected a real-valued array, got dtype {arr.dtype}")
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    if suf in (".pcd", ".ply"):
        o3d = _import_open3d(p)
        pc = o3d.t.io.read_point_cloud(str(p))
        xyz = pc.point.positions.numpy().astype(np.float32)
        cols = [xyz]
        if _has_attribute(pc.point, "intensity"):
            cols.append(pc.point.intensity.numpy().reshape(-1, 1).astype(np.float32))
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(cols, axis=1)))
    raise ValueError(f"{p}: unknown point-cloud suffix {suf!r}; expected .bin, .pcd.bin, .npy, .pcd or .ply")


def write_points(path, points) -> None:
    """Write an ``(N, C)`` point array in the format named by the file suffix.

    ``.bin`` needs C = 4 and ``.pcd.bin`` C = 5 (little-endian float32 records, the layout
    :func:`read_points` reads); ``.npy`` stores float32 (N, C); ``.pcd`` / ``.ply`` go through
    open3d (x, y, z and, when C >= 4, column 3 as intensity). The output is a pure function
    of the values, so writing the same points twice gives byte-identical files.

    Args:
        path: destination file (its folder must exist).
        points: ``(N, C)`` tensor or array, C >= 3, converted to float32.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a path (str or os.PathLike), got {type(path).__name__}")
    p = Path(path)
    if isinstance(points, torch.Tensor):
        arr = points.detach().cpu().numpy()
    elif isinstance(points, np.ndarray):
        arr = points
    else:
        raise TypeError(f"points: expected a torch.Tensor or numpy array, got {type(points).__name__}")
    if arr.ndim != 2 or arr.shape[1] < 3:
        raise ValueError(f"points: expected shape (N, C) with C >= 3, got {tuple(arr.shape)}")
    arr = np.ascontiguousarray(arr, dtype="<f4")
    suf = _suffix(p)
    if suf in _BIN_FEATURES:
        c = _BIN_FEATURES[suf]
        if arr.shape[1] != c:
            raise ValueError(f"points: {suf} files hold {c} values per point, got shape {tuple(arr.shape)}")
        arr.tofile(p)
    elif suf == ".npy":
        np.save(p, arr, allow_pickle=False)
    elif suf in (".pcd", ".ply"):
        o3d = _import_open3d(p)
        pc = o3d.t.geometry.PointCloud()
        pc.point.positions = o3d.core.Tensor(np.ascontiguousarray(arr[:, :3]))
        if arr.shape[1] >= 4:
            pc.point.intensity = o3d.core.Tensor(np.ascontiguousarray(arr[:, 3:4]))
        if not o3d.t.io.write_point_cloud(str(p), pc):
            raise OSError(f"{p}: open3d could not write the file")
    else:
        raise ValueError(f"path: unknown point-cloud suffix {suf!r} ({p}); expected .bin, .pcd.bin, .npy, .pcd or .ply")


# --------------------------------------------------------------------------- KITTI calibration

_CALIB_ALIASES = {"R_rect": "R0_rect", "Tr_velo_cam": "Tr_velo_to_cam", "Tr_imu_velo": "Tr_imu_to_velo"}


@dataclass(frozen=True)
class KittiCalib:
    """KITTI object-benchmark calibration (float64 NumPy matrices).

    Attributes:
        P2: (3, 4) left colour camera projection (rectified), or None when absent.
        R0_rect: (3, 3) rectifying rotation of the reference camera.
        Tr_velo_to_cam: (3, 4) LiDAR -> (unrectified) reference camera transform.
        matrices: every ``NAME: values`` line of the file, reshaped to (3, 4) for 12 values
            and (3, 3) for 9, others kept flat.
    """

    R0_rect: np.ndarray
    Tr_velo_to_cam: np.ndarray
    P2: np.ndarray | None
    matrices: dict

    def _rect_to_lidar_matrix(self) -> np.ndarray:
        r0 = np.eye(4)
        r0[:3, :3] = self.R0_rect
        v2c = np.eye(4)
        v2c[:3, :4] = self.Tr_velo_to_cam
        return np.linalg.inv(r0 @ v2c)

    def rect_to_lidar(self, xyz: np.ndarray) -> np.ndarray:
        """(M, 3) rectified-camera points -> (M, 3) LiDAR points (float64)."""
        xyz = np.asarray(xyz, dtype=np.float64).reshape(-1, 3)
        hom = np.concatenate([xyz, np.ones((len(xyz), 1))], axis=1)
        return (hom @ self._rect_to_lidar_matrix().T)[:, :3]

    def lidar_to_rect(self, xyz: np.ndarray) -> np.ndarray:
        """(M, 3) LiDAR points -> (M, 3) rectified-camera points (float64)."""
        xyz = np.asarray(xyz, dtype=np.float64).reshape(-1, 3)
        hom = np.concatenate([xyz, np.ones((len(xyz), 1))], axis=1)
        return hom @ self.Tr_velo_to_cam.T @ self.R0_rect.T


def read_calib(path) -> KittiCalib:
    """Parse a KITTI ``calib/*.txt`` file (``NAME: v1 v2 ...`` per line).

    Recognises the object benchmark's names (P0-P3, R0_rect, Tr_velo_to_cam,
    Tr_imu_to_velo) and the tracking benchmark's spellings (R_rect, Tr_velo_cam,
    Tr_imu_velo). Raises FileNotFoundError for a missing file and ValueError naming the file
    and line for an unparsable line or a missing R0_rect / Tr_velo_to_cam.
    """
    p = _existing_file(path, "calib_path")
    mats: dict[str, np.ndarray] = {}
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        if not sep:
            parts = line.split()  # tracking files: "R_rect 1 0 0 ..."
            key, rest = parts[0], " ".join(parts[1:])
        key = _CALIB_ALIASES.get(key.strip(), key.strip())
        try:
            vals = np.array([float(v) for v in rest.split()], dtype=np.float64)
        except ValueError:
            raise ValueError(f"{p}:{lineno}: could not parse the numbers of {key!r}: {line.strip()!r}") from None
        if vals.size == 12:
            vals = vals.reshape(3, 4)
        elif vals.size == 9:
            vals = vals.reshape(3, 3)
        mats[key] = vals
    for need, shape in (("R0_rect", (3, 3)), ("Tr_velo_to_cam", (3, 4))):
        if need not in mats:
            raise ValueError(f"{p}: no {need} line (needed to convert camera labels to the LiDAR frame)")
        if mats[need].shape != shape:
            raise ValueError(f"{p}: {need} has {mats[need].size} values, expected {shape[0] * shape[1]}")
    return KittiCalib(R0_rect=mats["R0_rect"], Tr_velo_to_cam=mats["Tr_velo_to_cam"], P2=mats.get("P2"), matrices=mats)


# --------------------------------------------------------------------------- KITTI labels


class KittiObject(NamedTuple):
    """One line of a KITTI ``label_2`` file (camera frame, as written)."""

    type: str
    truncated: float
    occluded: int
    alpha: float
    bbox: tuple  # (left, top, right, bottom) pixels
    dimensions: tuple  # (h, w, l) metres
    location: tuple  # (x, y, z) bottom centre, rectified camera frame, metres
    rotation_y: float  # yaw around the camera's y axis (pointing down), radians, [-pi, pi]
    score: float | None  # only in result files (16th field)


def read_kitti_objects(label_path) -> list[KittiObject]:
    """Parse a KITTI ``label_2`` file into :class:`KittiObject` rows (DontCare included).

    Raises ValueError naming the file and line for a line with other than 15 or 16 fields
    or a field that is not a number.
    """
    p = _existing_file(label_path, "label_path")
    objs = []
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        f = line.split()
        if not f:
            continue
        if len(f) not in (15, 16):
            raise ValueError(f"{p}:{lineno}: expected 15 fields (16 with a score), got {len(f)}: {line.strip()!r}")
        try:
            v = [float(x) for x in f[1:]]
        except ValueError:
            raise ValueError(f"{p}:{lineno}: non-numeric field in {line.strip()!r}") from None
        objs.append(
            KittiObject(
                type=f[0],
                truncated=v[0],
                occluded=int(v[1]),
                alpha=v[2],
                bbox=tuple(v[3:7]),
                dimensions=tuple(v[7:10]),
                location=tuple(v[10:13]),
                rotation_y=v[13],
                score=v[14] if len(v) == 15 else None,
            )
        )
    return objs


def _wrap_angle(a: np.ndarray) -> np.ndarray:
    """Wrap radians to [-pi, pi)."""
    return (a + np.pi) % (2 * np.pi) - np.pi


def camera_boxes_to_lidar(boxes_camera, calib: KittiCalib) -> torch.Tensor:
    """Convert KITTI camera boxes to LiDAR boxes (OpenPCDet's ``boxes3d_kitti_camera_to_lidar``).

    Args:
        boxes_camera: ``(M, 7)`` array/tensor ``(x, y, z, l, h, w, rotation_y)`` with (x, y, z)
            the bottom centre in rectified camera coordinates (note the label file's order is
            h, w, l).
        calib: from :func:`read_calib`.

    Returns:
        ``(M, 7)`` float32 LiDAR boxes ``(x, y, z, dx, dy, dz, heading)``, z at the centre,
        heading = -(pi/2 + rotation_y) wrapped to [-pi, pi).
    """
    b = np.asarray(
        boxes_camera.detach().cpu().numpy() if isinstance(boxes_camera, torch.Tensor) else boxes_camera,
        dtype=np.float64,
    ).reshape(-1, 7)
    xyz = calib.rect_to_lidar(b[:, :3])
    l, h, w, ry = b[:, 3], b[:, 4], b[:, 5], b[:, 6]
    xyz[:, 2] += h / 2
    out = np.stack([xyz[:, 0], xyz[:, 1], xyz[:, 2], l, w, h, _wrap_angle(-(np.pi / 2 + ry))], axis=1)
    return torch.from_numpy(out.astype(np.float32))


def read_kitti_label(label_path, calib_path) -> tuple[torch.Tensor, list[str]]:
    """Read a KITTI ``label_2`` file as LiDAR-frame boxes.

    Args:
        label_path: ``label_2/XXXXXX.txt``.
        calib_path: the matching ``calib/XXXXXX.txt`` (R0_rect and Tr_velo_to_cam are used).

    Returns:
        ``boxes`` ``(M, 7)`` float32 ``(x, y, z, dx, dy, dz, heading)`` (OpenPCDet convention,
        see the module docstring) and ``names``, the M class names in file order. ``DontCare``
        lines are skipped; every other class (Car, Van, Truck, Pedestrian, Person_sitting,
        Cyclist, Tram, Misc) is kept.

    Raises:
        FileNotFoundError / ValueError naming the file (and line) for missing files and
        malformed lines.
    """
    objs = [o for o in read_kitti_objects(label_path) if o.type != "DontCare"]
    calib = read_calib(calib_path)
    if not objs:
        return torch.zeros((0, 7), dtype=torch.float32), []
    cam = np.array([(*o.location, o.dimensions[2], o.dimensions[0], o.dimensions[1], o.rotation_y) for o in objs])
    return camera_boxes_to_lidar(cam, calib), [o.type for o in objs]


# --------------------------------------------------------------------------- pcops labels


class Labels(NamedTuple):
    """LiDAR-frame labels: ``boxes (M, 7)`` float32, ``names`` (M class names), and
    ``num_points (M,)`` int64 (-1 where unknown)."""

    boxes: torch.Tensor
    names: list
    num_points: torch.Tensor


def write_labels(path, boxes, names: Sequence[str], num_points=None) -> None:
    """Write LiDAR-frame labels in the pcops text format (see the module docstring).

    Numbers are written with 4 decimals (0.1 mm / 0.1 mrad), so writing the same labels
    twice gives byte-identical files.

    Args:
        path: destination ``.txt`` file.
        boxes: ``(M, 7)`` tensor or array ``(x, y, z, dx, dy, dz, heading)``.
        names: M class names without whitespace.
        num_points: optional ``(M,)`` integer counts of points inside each box.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a path (str or os.PathLike), got {type(path).__name__}")
    b = boxes.detach().cpu().numpy() if isinstance(boxes, torch.Tensor) else np.asarray(boxes)
    if b.ndim != 2 or b.shape[1] != 7:
        raise ValueError(f"boxes: expected shape (M, 7), got {tuple(b.shape)}")
    names = list(names)
    if len(names) != len(b):
        raise ValueError(f"names: expected {len(b)} names (one per box), got {len(names)}")
    for n in names:
        if not isinstance(n, str) or not n or any(ch.isspace() for ch in n) or n.startswith("#"):
            raise ValueError(f"names: class names must be non-empty strings without spaces or a leading '#', got {n!r}")
    if num_points is None:
        counts = [-1] * len(b)
    else:
        c = num_points.detach().cpu().numpy() if isinstance(num_points, torch.Tensor) else np.asarray(num_points)
        if c.shape != (len(b),):
            raise ValueError(f"num_points: expected shape ({len(b)},), got {tuple(c.shape)}")
        counts = [int(x) for x in c]
    lines = [LABELS_HEADER]
    for n, row, k in zip(names, b.astype(np.float64), counts):
        nums = " ".join(f"{float(v):.4f}".replace("-0.0000", "0.0000") for v in row)
        lines.append(f"{n} {nums} {k}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_labels(path) -> Labels:
    """Read a pcops label file (see the module docstring) into :class:`Labels`.

    Raises FileNotFoundError for a missing file and ValueError naming the file and line for
    a line without 8 or 9 fields or with a non-numeric value.
    """
    p = _existing_file(path, "path")
    boxes, names, counts = [], [], []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        f = s.split()
        if len(f) not in (8, 9):
            raise ValueError(
                f"{p}:{lineno}: expected 'name x y z dx dy dz heading [num_points]' (8 or 9 fields), "
                f"got {len(f)}: {s!r}"
            )
        try:
            vals = [float(x) for x in f[1:8]]
            k = int(f[8]) if len(f) == 9 else -1
        except ValueError:
            raise ValueError(f"{p}:{lineno}: non-numeric field in {s!r}") from None
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"{p}:{lineno}: non-finite value in {s!r}")
        names.append(f[0])
        boxes.append(vals)
        counts.append(k)
    bt = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 7)
    return Labels(bt, names, torch.tensor(counts, dtype=torch.int64))
