"""pcops.io: point readers/writers, KITTI label and calibration parsing, pcops labels."""

import math

import numpy as np
import pytest
import torch

from pcops import io
from pcops.sim import points_in_boxes_count

# The KITTI convention's LiDAR -> camera axes: x_cam = -y_lidar, y_cam = -z_lidar, z_cam = x_lidar.
_AXES_CALIB = """P0: 700 0 600 0 0 700 180 0 0 0 1 0
P2: 700 0 600 45 0 700 180 0.2 0 0 1 0.003
R0_rect: 1 0 0 0 1 0 0 0 1
Tr_velo_to_cam: 0 -1 0 0 0 0 -1 0 1 0 0 0
Tr_imu_to_velo: 1 0 0 0 0 1 0 0 0 0 1 0
"""


def _rand_points(n, c, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, c, generator=g) * 100 - 50).float()


# ----------------------------------------------------------------------------- points


@pytest.mark.parametrize("n", [0, 1, 7, 1009])
@pytest.mark.parametrize("name,c", [("scan.bin", 4), ("sweep.pcd.bin", 5), ("pts.npy", 3), ("pts.npy", 6)])
def test_points_round_trip(tmp_path, n, name, c):
    pts = _rand_points(n, c, seed=n)
    path = tmp_path / name
    io.write_points(path, pts)
    back = io.read_points(path)
    assert back.dtype == torch.float32 and back.shape == (n, c)
    assert torch.equal(back, pts)
    # writing again is byte-identical
    first = path.read_bytes()
    io.write_points(path, pts.numpy())
    assert path.read_bytes() == first


def test_bin_layout_is_raw_little_endian_float32(tmp_path):
    pts = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "a.bin"
    io.write_points(path, pts)
    assert path.read_bytes() == pts.astype("<f4").tobytes()
    # a nuScenes sweep saved as plain .bin reads with num_features=5
    pts5 = np.arange(15, dtype=np.float32).reshape(3, 5)
    pts5.tofile(tmp_path / "b.bin")
    assert torch.equal(io.read_points(tmp_path / "b.bin", num_features=5), torch.from_numpy(pts5))


def test_npy_other_dtypes_cast_to_float32(tmp_path):
    arr = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.save(tmp_path / "d.npy", arr)
    out = io.read_points(tmp_path / "d.npy")
    assert out.dtype == torch.float32 and torch.equal(out, torch.from_numpy(arr).float())


def test_read_points_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        io.read_points(tmp_path / "missing.bin")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 20)  # 20 bytes: not a multiple of 16
    with pytest.raises(ValueError, match=r"bad\.bin.*20 bytes.*multiple of the record size 16"):
        io.read_points(bad)
    bad5 = tmp_path / "bad.pcd.bin"
    bad5.write_bytes(b"\0" * 32)  # not a multiple of 20
    with pytest.raises(ValueError, match=r"bad\.pcd\.bin.*record size 20"):
        io.read_points(bad5)
    np.save(tmp_path / "flat.npy", np.zeros(9, dtype=np.float32))
    with pytest.raises(ValueError, match=r"flat\.npy.*2-D"):
        io.read_points(tmp_path / "flat.npy")
    (tmp_path / "x.xyz").write_text("1 2 3\n")
    with pytest.raises(ValueError, match="unknown point-cloud suffix"):
        io.read_points(tmp_path / "x.xyz")
    with pytest.raises(ValueError, match="num_features"):
        io.read_points(bad, num_features=0)
    with pytest.raises(TypeError, match="path"):
        io.read_points(123)


def test_write_points_errors(tmp_path):
    with pytest.raises(ValueError, match="points"):
        io.write_points(tmp_path / "a.bin", torch.zeros(5, 3))  # .bin needs 4 columns
    with pytest.raises(ValueError, match="points"):
        io.write_points(tmp_path / "a.npy", torch.zeros(5))
    with pytest.raises(TypeError, match="points"):
        io.write_points(tmp_path / "a.npy", [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="suffix"):
        io.write_points(tmp_path / "a.txt", torch.zeros(5, 4))


def _has_open3d():
    try:
        import open3d  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("suffix", [".pcd", ".ply"])
def test_pcd_ply_through_open3d(tmp_path, suffix):
    pts = _rand_points(50, 4)
    path = tmp_path / f"cloud{suffix}"
    if not _has_open3d():
        with pytest.raises(ImportError, match=r"pcops\[open3d\]"):
            io.write_points(path, pts)
        path.write_text("not really a point cloud\n")
        with pytest.raises(ImportError, match=r"pcops\[open3d\]"):
            io.read_points(path)
        return
    io.write_points(path, pts)
    back = io.read_points(path)
    assert back.dtype == torch.float32
    torch.testing.assert_close(back[:, :3], pts[:, :3])


# ----------------------------------------------------------------------------- calibration and KITTI labels


def test_read_calib(tmp_path):
    p = tmp_path / "calib.txt"
    p.write_text(_AXES_CALIB)
    c = io.read_calib(p)
    assert c.R0_rect.shape == (3, 3) and c.Tr_velo_to_cam.shape == (3, 4) and c.P2.shape == (3, 4)
    assert set(c.matrices) == {"P0", "P2", "R0_rect", "Tr_velo_to_cam", "Tr_imu_to_velo"}
    xyz = np.array([[10.0, -1.0, -1.5], [3.0, 2.0, 0.5]])
    np.testing.assert_allclose(c.rect_to_lidar(c.lidar_to_rect(xyz)), xyz, atol=1e-12)
    np.testing.assert_allclose(c.lidar_to_rect(xyz)[0], [1.0, 1.5, 10.0])


def test_read_calib_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        io.read_calib(tmp_path / "nope.txt")
    p = tmp_path / "c.txt"
    p.write_text("R0_rect: 1 0 0 0 1 0 0 0 1\nTr_velo_to_cam: 0 -1 0 0 0 0 -1 zero 1 0 0 0\n")
    with pytest.raises(ValueError, match=r"c\.txt:2: .*Tr_velo_to_cam"):
        io.read_calib(p)
    p.write_text("R0_rect: 1 0 0 0 1 0 0 0 1\n")
    with pytest.raises(ValueError, match=r"c\.txt: no Tr_velo_to_cam"):
        io.read_calib(p)


def test_kitti_label_conversion(tmp_path):
    """Hand-checked conversion with the plain KITTI axes (R0_rect = I)."""
    calib = tmp_path / "calib.txt"
    calib.write_text(_AXES_CALIB)
    label = tmp_path / "label.txt"
    label.write_text(
        # type trunc occ alpha  bbox(4)            h    w    l    x    y    z    ry
        "Car 0.00 0 -1.57 100 150 200 250 1.50 1.60 3.90 1.00 1.50 10.00 0.00\n"
        "DontCare -1 -1 -10 503.89 169.71 590.61 190.13 -1 -1 -1 -1000 -1000 -1000 -10\n"
        "Pedestrian 0.00 0 0.3 1 2 3 4 1.80 0.60 0.80 -2.00 1.60 5.00 1.5707963\n"
    )
    boxes, names = io.read_kitti_label(label, calib)
    assert names == ["Car", "Pedestrian"]
    assert boxes.dtype == torch.float32 and boxes.shape == (2, 7)
    # car: lidar (x, y, z) = (z_cam, -x_cam, -y_cam + h / 2), (dx, dy, dz) = (l, w, h),
    # heading = -(pi/2 + ry): facing camera +x (ry = 0) is facing lidar -y
    exp_car = [10.0, -1.0, -1.5 + 0.75, 3.9, 1.6, 1.5, -math.pi / 2]
    torch.testing.assert_close(boxes[0], torch.tensor(exp_car), atol=1e-5, rtol=0)
    # pedestrian with ry = pi/2 (facing camera -z, toward the camera) -> heading -pi (facing
    # lidar -x), wrapped into [-pi, pi) before the float32 cast
    assert boxes[1, :3].tolist() == pytest.approx([5.0, 2.0, -1.6 + 0.9], abs=1e-5)
    assert abs(boxes[1, 6].item()) <= math.pi + 1e-6
    assert abs(abs(boxes[1, 6].item()) - math.pi) < 1e-5
    objs = io.read_kitti_objects(label)
    assert [o.type for o in objs] == ["Car", "DontCare", "Pedestrian"]
    assert objs[0].dimensions == (1.5, 1.6, 3.9) and objs[0].score is None


def test_kitti_label_only_dontcare(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text(_AXES_CALIB)
    label = tmp_path / "label.txt"
    label.write_text("DontCare -1 -1 -10 1 2 3 4 -1 -1 -1 -1000 -1000 -1000 -10\n")
    boxes, names = io.read_kitti_label(label, calib)
    assert boxes.shape == (0, 7) and names == []


def test_kitti_label_errors(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text(_AXES_CALIB)
    label = tmp_path / "label.txt"
    label.write_text("Car 0.00 0 -1.57 100 150 200 250 1.50 1.60 3.90 1.00 1.50 10.00 0.00\nCar 0 0 1 2 3\n")
    with pytest.raises(ValueError, match=r"label\.txt:2: expected 15 fields"):
        io.read_kitti_label(label, calib)
    label.write_text("Car 0.00 0 -1.57 100 150 200 250 1.50 1.60 3.90 1.00 abc 10.00 0.00\n")
    with pytest.raises(ValueError, match=r"label\.txt:1: non-numeric"):
        io.read_kitti_label(label, calib)
    with pytest.raises(FileNotFoundError, match="absent.txt"):
        io.read_kitti_label(tmp_path / "absent.txt", calib)
    label.write_text("Car 0.00 0 -1.57 100 150 200 250 1.50 1.60 3.90 1.00 1.50 10.00 0.00\n")
    with pytest.raises(FileNotFoundError, match="absent_calib.txt"):
        io.read_kitti_label(label, tmp_path / "absent_calib.txt")


def test_kitti_real_frames_boxes_contain_points(kitti_dir):
    """Every converted box of the real KITTI frames holds LiDAR points of its frame."""
    for frame in ("000000", "000001"):
        pts = io.read_points(kitti_dir / "velodyne" / f"{frame}.bin")
        assert pts.shape[1] == 4 and pts.dtype == torch.float32
        boxes, names = io.read_kitti_label(kitti_dir / "label_2" / f"{frame}.txt", kitti_dir / "calib" / f"{frame}.txt")
        assert "DontCare" not in names and len(names) == len(boxes) > 0
        counts = points_in_boxes_count(pts.numpy(), boxes.numpy())
        print(f"KITTI {frame}: {list(zip(names, counts.tolist()))}")
        assert (counts > 0).all(), (frame, names, counts)
        # box bottoms sit near the road, ~1.73 m below the sensor (far ones higher: the road climbs)
        bottoms = boxes[:, 2] - boxes[:, 5] / 2
        assert ((bottoms > -2.5) & (bottoms < -0.5)).all(), bottoms
    boxes, names = io.read_kitti_label(kitti_dir / "label_2" / "000001.txt", kitti_dir / "calib" / "000001.txt")
    assert names == ["Truck", "Car", "Cyclist"]
    car = boxes[names.index("Car")]
    assert car[3:6].tolist() == pytest.approx([3.69, 1.87, 1.67], abs=1e-5)  # (l, w, h) from "h w l"
    assert points_in_boxes_count(pts.numpy(), car[None].numpy())[0] > 0


# ----------------------------------------------------------------------------- pcops labels


@pytest.mark.parametrize("m", [0, 1, 5])
def test_labels_round_trip(tmp_path, m):
    g = torch.Generator().manual_seed(m)
    boxes = torch.rand(m, 7, generator=g) * 10 - 5
    names = ["Car", "Pedestrian", "Cyclist", "Car", "Van"][:m]
    counts = torch.arange(m, dtype=torch.int64) * 7
    path = tmp_path / "labels.txt"
    io.write_labels(path, boxes, names, counts)
    lab = io.read_labels(path)
    assert lab.names == names and torch.equal(lab.num_points, counts)
    assert lab.boxes.shape == (m, 7) and lab.boxes.dtype == torch.float32
    torch.testing.assert_close(lab.boxes, boxes, atol=6e-5, rtol=0)  # 4 decimals
    text = path.read_text()
    assert text.startswith("# pcops labels v1")
    io.write_labels(path, boxes.numpy(), names, counts.numpy())
    assert path.read_text() == text
    io.write_labels(path, boxes, names)  # counts unknown
    assert (io.read_labels(path).num_points == -1).all()


def test_labels_format_and_errors(tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("# comment\n\nCar 1 2 3 4 5 6 0.5\nPedestrian 1 2 3 0.5 0.5 1.7 -0.5 12\n")
    lab = io.read_labels(path)
    assert lab.names == ["Car", "Pedestrian"] and lab.num_points.tolist() == [-1, 12]
    path.write_text("Car 1 2 3 4 5 6\n")
    with pytest.raises(ValueError, match=r"l\.txt:1: expected 'name x y z dx dy dz heading"):
        io.read_labels(path)
    path.write_text("# header\nCar 1 2 3 4 5 6 7\nCar 1 2 3 4 five 6 7\n")
    with pytest.raises(ValueError, match=r"l\.txt:3: non-numeric"):
        io.read_labels(path)
    path.write_text("Car 1 2 3 4 5 6 nan\n")
    with pytest.raises(ValueError, match=r"l\.txt:1: non-finite"):
        io.read_labels(path)
    with pytest.raises(FileNotFoundError):
        io.read_labels(tmp_path / "none.txt")
    with pytest.raises(ValueError, match="names"):
        io.write_labels(path, torch.zeros(2, 7), ["Car"])
    with pytest.raises(ValueError, match="names"):
        io.write_labels(path, torch.zeros(1, 7), ["Big Car"])
    with pytest.raises(ValueError, match="boxes"):
        io.write_labels(path, torch.zeros(1, 6), ["Car"])
    with pytest.raises(ValueError, match="num_points"):
        io.write_labels(path, torch.zeros(2, 7), ["Car", "Car"], [1])
