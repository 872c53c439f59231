"""pcops.sim (the LiDAR simulator), the data/ samples it made, and pcops.viz."""

import importlib.util
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pcops import io, sim

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SAMPLE_SEEDS = (0, 1, 2)
RANGE_BINS = [0, 5, 10, 20, 30, 40, 60, 80, 120]


@pytest.fixture(scope="module")
def scan0():
    return sim.simulate_scan(0)


def _load_make_samples():
    spec = importlib.util.spec_from_file_location("make_samples", ROOT / "scripts" / "make_samples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stats(pts: np.ndarray):
    r = np.hypot(pts[:, 0], pts[:, 1])
    hist = np.histogram(r, bins=RANGE_BINS)[0] / max(len(pts), 1)
    return len(pts), float((pts[:, 2] < -1.4).mean()), hist


# ----------------------------------------------------------------------------- the scan


def test_scan_layout(scan0):
    s = scan0
    n, m = len(s.points), len(s.names)
    assert s.points.dtype == torch.float32 and s.points.shape == (n, 4)
    assert 90_000 <= n <= 140_000
    assert s.boxes.dtype == torch.float32 and s.boxes.shape == (m, 7) and m > 0
    assert set(s.names) <= {"Car", "Van", "Truck", "Pedestrian", "Cyclist"}
    assert s.num_points_in_box.dtype == torch.int64 and s.num_points_in_box.shape == (m,)
    assert s.num_object_points.shape == (m,) and s.instance.shape == (n,) and s.ring.shape == (n,)
    assert bool(torch.isfinite(s.points).all())
    refl = s.points[:, 3]
    assert 0 <= refl.min() and refl.max() <= 1
    assert torch.equal(torch.round(refl * 100) / 100, refl.double().mul(100).round().div(100).float())
    r = torch.linalg.vector_norm(s.points[:, :3], dim=1)
    assert r.max() <= sim.MAX_RANGE + 0.1 and r.min() > 2.0
    # full 360 degrees like a raw velodyne .bin
    az = torch.atan2(s.points[:, 1], s.points[:, 0])
    assert np.histogram(az.numpy(), bins=36, range=(-math.pi, math.pi))[0].min() > 0
    # heading wrapped, sizes near KITTI's class means
    assert (s.boxes[:, 6].abs() <= math.pi + 1e-6).all()
    for cls, (mean, _sd) in sim.CLASS_SIZES.items():
        sel = [i for i, nm in enumerate(s.names) if nm == cls]
        if sel:
            dims = s.boxes[sel, 3:6]
            assert ((dims > 0.6 * torch.tensor(mean)) & (dims < 1.5 * torch.tensor(mean))).all(), cls


def test_deterministic_and_seeded():
    a = sim.simulate_scan(5)
    b = sim.simulate_scan(5)
    c = sim.simulate_scan(6)
    assert torch.equal(a.points, b.points) and torch.equal(a.boxes, b.boxes) and a.names == b.names
    assert torch.equal(a.num_points_in_box, b.num_points_in_box)
    assert len(a.points) != len(c.points) or not torch.equal(a.points, c.points)


def test_objects_contain_their_points(scan0):
    s = scan0
    pts, inst, boxes = s.points.numpy(), s.instance.numpy(), s.boxes.numpy()
    assert (inst >= -1).all() and inst.max() < len(boxes)
    for k in range(len(boxes)):
        own = pts[inst == k]
        assert sim.points_in_boxes_count(own, boxes[k : k + 1])[0] == len(own), k
    np.testing.assert_array_equal(s.num_points_in_box.numpy(), sim.points_in_boxes_count(pts, boxes))
    assert torch.equal(s.num_object_points, torch.bincount(s.instance[s.instance >= 0], minlength=len(boxes)))
    assert (s.num_points_in_box >= s.num_object_points).all()
    # occlusion and range: some objects are hidden or nearly so, near ones get many points
    assert s.num_object_points.min() <= 2 and s.num_object_points.max() >= 500


# documented in pcops.sim's "Labels" paragraph: class shares of the labelled objects and their
# BEV distances from the sensor, over a split of scenes
CLASS_SHARE_BOUNDS = {"Car": (0.58, 0.76), "Pedestrian": (0.15, 0.33), "Cyclist": (0.04, 0.15)}
DISTANCE_SHARE_BOUNDS = {(0, 30): (0.33, 0.57), (30, 50): (0.2, 0.44), (50, 100): (0.13, 0.35)}


CLASS_SHARE_BOUNDS_V2 = {
    "Car": (0.48, 0.68),
    "Van": (0.02, 0.11),
    "Truck": (0.003, 0.05),
    "Pedestrian": (0.12, 0.3),
    "Cyclist": (0.06, 0.19),
}


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_class_mix_and_distances_within_documented_bounds(version):
    names, dists = [], []
    for seed in range(1000, 1016):  # fresh seeds, not the samples'
        s = sim.simulate_scan(seed, scene_version=version)
        names += list(s.names)
        dists += np.hypot(s.boxes[:, 0].numpy(), s.boxes[:, 1].numpy()).tolist()
    n = len(names)
    assert n > 400, n
    bounds = CLASS_SHARE_BOUNDS if version == 1 else CLASS_SHARE_BOUNDS_V2
    for cls, (lo, hi) in bounds.items():
        share = names.count(cls) / n
        assert lo <= share <= hi, (cls, share)
    assert set(names) <= set(bounds), set(names)
    d = np.array(dists)
    assert d.max() < 100.0, d.max()
    for (a, b), (lo, hi) in DISTANCE_SHARE_BOUNDS.items():
        share = float(((d >= a) & (d < b)).mean())
        assert lo <= share <= hi, ((a, b), share)


def test_scene_version_2_objects_and_determinism():
    """Version 2 (vans, trucks, car body types, pedestrians with limbs): every object's returns
    lie inside its box, vehicles of every kind are labelled, and a seed gives the same scan."""
    seen = set()
    for seed in (7, 8):
        s = sim.simulate_scan(seed, scene_version=2)
        pts, inst, boxes = s.points.numpy(), s.instance.numpy(), s.boxes.numpy()
        for k in range(len(boxes)):
            own = pts[inst == k]
            assert sim.points_in_boxes_count(own, boxes[k : k + 1])[0] == len(own), (seed, k, s.names[k])
        seen |= set(s.names)
        for cls, (mean, _sd) in sim.scene.VEHICLE_SIZES_V2.items():
            sel = [i for i, nm in enumerate(s.names) if nm == cls]
            if sel:
                dims = s.boxes[sel, 3:6]
                assert ((dims > 0.6 * torch.tensor(mean)) & (dims < 1.6 * torch.tensor(mean))).all(), cls
    assert {"Car", "Van", "Pedestrian", "Cyclist"} <= seen, seen
    a, b = sim.simulate_scan(8, scene_version=2), sim.simulate_scan(8, scene_version=2)
    assert torch.equal(a.points, b.points) and torch.equal(a.boxes, b.boxes) and a.names == b.names
    assert torch.equal(a.points, sim.simulate_scan(8).points)  # the default
    assert not torch.equal(a.boxes, sim.simulate_scan(8, scene_version=1).boxes)  # a different scene from version 1
    with pytest.raises(ValueError, match="scene_version"):
        sim.simulate_scan(0, scene_version=3)


def test_boxes_do_not_overlap(scan0):
    b = scan0.boxes.numpy().astype(np.float64)
    for i in range(len(b)):
        for j in range(i + 1, len(b)):
            d = math.hypot(b[i, 0] - b[j, 0], b[i, 1] - b[j, 1])
            assert d > 0.5 * (math.hypot(b[i, 3], b[i, 4]) + math.hypot(b[j, 3], b[j, 4])), (i, j)


def test_lidar_structure(scan0):
    """Rings on the ground, first-hit shadows, density falling with range."""
    s = scan0
    pts, ring = s.points.numpy(), s.ring.numpy()
    r = np.hypot(pts[:, 0], pts[:, 1])
    ground = (s.instance.numpy() < 0) & (pts[:, 2] < -1.4) & (r < 30)
    # ring structure: on the ground, each beam lands at one range band, farther for higher beams
    med = np.array([np.median(r[ground & (ring == b)]) for b in range(40, 64)])
    assert (np.diff(med) < 0).all()
    for b in (45, 55):
        rb = r[ground & (ring == b)]
        assert np.percentile(rb, 90) - np.percentile(rb, 10) < 0.35 * np.median(rb)
    # density on the ground falls with range (points per square metre)
    areas = [(a, a + 5) for a in (5, 10, 20)]
    dens = [np.count_nonzero(ground & (r >= a) & (r < b)) / (math.pi * (b * b - a * a)) for a, b in areas]
    assert dens[0] > dens[1] > dens[2]
    # shadow: behind the object with the most points, the ground in its azimuth sector is empty
    k = int(torch.argmax(s.num_object_points))
    own = pts[s.instance.numpy() == k]
    az_o = np.arctan2(own[:, 1], own[:, 0])
    lo, hi = np.percentile(az_o, [30, 70])
    assert hi - lo < math.pi / 2
    az = np.arctan2(pts[:, 1], pts[:, 0])
    r_obj = np.hypot(own[:, 0], own[:, 1]).max()
    behind = (az > lo) & (az < hi) & (r > r_obj + 1.0) & (pts[:, 2] < np.min(own[:, 2]))
    in_front = (az > lo) & (az < hi) & (r < np.hypot(own[:, 0], own[:, 1]).min() - 0.5)
    assert np.count_nonzero(behind) < 0.05 * max(np.count_nonzero(in_front), 1)


def test_speed_default_scene():
    sim.simulate_scan(11)  # warm-up (imports, allocator)
    t0 = time.perf_counter()
    s = sim.simulate_scan(12)
    dt = time.perf_counter() - t0
    print(f"\nsimulate_scan(12): {len(s.points)} points in {dt:.3f} s")
    assert dt < 4.0  # target <= 2 s on one core; slack for a loaded test machine


def test_knobs():
    base = sim.simulate_scan(3)
    few = sim.simulate_scan(3, n_beams=16)
    assert few.ring.max() < 16 and len(few.points) < 0.4 * len(base.points)
    coarse = sim.simulate_scan(3, azimuth_step_deg=0.36)
    assert 0.4 * len(base.points) < len(coarse.points) < 0.6 * len(base.points)
    two = sim.simulate_scan(3, n_sweeps=2)
    assert 1.6 * len(base.points) < len(two.points) < 2.4 * len(base.points)
    assert torch.equal(two.boxes, base.boxes)
    empty = sim.simulate_scan(3, n_objects=0)
    assert empty.boxes.shape == (0, 7) and empty.names == [] and empty.num_points_in_box.shape == (0,)
    assert (empty.instance == -1).all()
    many = sim.simulate_scan(3, n_objects=60)
    assert len(many.names) > len(base.names)
    clean = sim.simulate_scan(3, range_noise=0.0, dropout=0.0)
    assert len(clean.points) > len(base.points)
    near = sim.simulate_scan(3, max_range=30.0)
    assert torch.linalg.vector_norm(near.points[:, :3], dim=1).max() <= 30.0 + 0.07


def test_million_points():
    t0 = time.perf_counter()
    s = sim.simulate_scan(0, azimuth_step_deg=0.09, n_sweeps=5)
    dt = time.perf_counter() - t0
    print(f"\nsimulate_scan(0, azimuth_step_deg=0.09, n_sweeps=5): {len(s.points)} points in {dt:.2f} s")
    assert 1_000_000 <= len(s.points) <= 2_000_000


def test_hdl64_elevations():
    e = np.degrees(sim.hdl64_elevations())
    assert e.shape == (64,) and e[0] == pytest.approx(2.0) and e[-1] == pytest.approx(-24.9)
    assert (np.diff(e) < 0).all()
    assert np.diff(e[:32]).mean() == pytest.approx(-1 / 3, abs=1e-3)  # upper block 1/3 deg
    assert np.diff(e[32:]).mean() == pytest.approx(-0.518, abs=1e-2)  # lower block ~1/2 deg
    e32 = np.degrees(sim.hdl64_elevations(32))
    assert e32.shape == (32,) and e32[0] == pytest.approx(2.0) and e32[-1] == pytest.approx(-24.9)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_beams"):
        sim.simulate_scan(0, n_beams=0)
    with pytest.raises(ValueError, match="seed"):
        sim.simulate_scan(-1)
    with pytest.raises(TypeError, match="seed"):
        sim.simulate_scan(1.5)
    with pytest.raises(TypeError, match="azimuth_step_deg"):
        sim.simulate_scan(0, azimuth_step_deg="fine")
    with pytest.raises(ValueError, match="range_noise"):
        sim.simulate_scan(0, range_noise=0.5)
    with pytest.raises(ValueError, match="n_sweeps"):
        sim.simulate_scan(0, n_sweeps=0)
    with pytest.raises(ValueError, match="dropout"):
        sim.simulate_scan(0, dropout=1.5)
    with pytest.raises(ValueError, match="max_range"):
        sim.simulate_scan(0, max_range=0.0)


# ----------------------------------------------------------------------------- data/ samples


def test_data_samples_regenerate_byte_identical(tmp_path):
    mod = _load_make_samples()
    written = mod.make_samples(tmp_path, preview=False)
    assert len(written) == 2 * len(SAMPLE_SEEDS)
    for seed in SAMPLE_SEEDS:
        for suffix in (".bin", ".txt"):
            name = f"sample_{seed:03d}{suffix}"
            committed = DATA / name
            assert committed.exists(), f"{committed} missing: run python scripts/make_samples.py"
            assert (tmp_path / name).read_bytes() == committed.read_bytes(), (
                f"{name}: regenerating with seed {seed} gives different bytes"
            )
    # and a second regeneration is identical to the first
    again = tmp_path / "again"
    mod.make_samples(again, seeds=(0,), preview=False)
    assert (again / "sample_000.bin").read_bytes() == (tmp_path / "sample_000.bin").read_bytes()


def test_data_samples_files():
    for seed in SAMPLE_SEEDS:
        b = DATA / f"sample_{seed:03d}.bin"
        assert b.stat().st_size <= 2.5e6
        pts = io.read_points(b)
        lab = io.read_labels(DATA / f"sample_{seed:03d}.txt")
        assert pts.shape[1] == 4 and len(lab.names) == len(lab.boxes) > 0
        np.testing.assert_array_equal(lab.num_points.numpy(), sim.points_in_boxes_count(pts.numpy(), lab.boxes.numpy()))
    png = DATA / "sample_000_bev.png"
    assert png.exists() and png.stat().st_size < 300_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (DATA / "README.md").exists()


def test_statistics_vs_kitti(kitti_dir):
    """Simulated samples vs the real KITTI frames: point count within +-30 %, ground fraction
    (z < -1.4 m) within +-0.15, range histograms close (total variation < 0.15)."""
    real = [_stats(io.read_points(kitti_dir / "velodyne" / f"{f}.bin").numpy()) for f in ("000000", "000001")]
    k_n = np.mean([s[0] for s in real])
    k_g = np.mean([s[1] for s in real])
    k_h = np.mean([s[2] for s in real], axis=0)
    lines = [f"range bins (m): {RANGE_BINS}"]
    for f, (n, g, h) in zip(("000000", "000001"), real):
        lines.append(f"KITTI {f}: points {n}, ground fraction {g:.3f}, range hist {np.round(h, 3).tolist()}")
    lines.append(f"KITTI mean  : points {k_n:.0f}, ground fraction {k_g:.3f}, range hist {np.round(k_h, 3).tolist()}")
    ok = True
    for seed in SAMPLE_SEEDS:
        n, g, h = _stats(sim.simulate_scan(seed).points.numpy())
        tv = 0.5 * np.abs(h - k_h).sum()
        lines.append(
            f"sim seed {seed}: points {n} ({n / k_n - 1:+.1%}), ground fraction {g:.3f} "
            f"({g - k_g:+.3f}), range hist {np.round(h, 3).tolist()} (TV distance {tv:.3f})"
        )
        ok &= abs(n / k_n - 1) <= 0.30 and abs(g - k_g) <= 0.15 and tv < 0.15
    print("\n" + "\n".join(lines))
    assert ok, "\n".join(lines)


# ----------------------------------------------------------------------------- viz


def test_draw_bev(tmp_path, scan0):
    from pcops import viz

    s = scan0
    path = tmp_path / "bev.png"
    dets = s.boxes[:3].clone()
    dets[:, 0] += 0.3
    out = viz.draw_bev(
        s.points,
        boxes=dets,
        gt_boxes=s.boxes,
        path=path,
        labels=["a", "b", "c"],
        color_by="reflectance",
        inches=3,
        dpi=60,
    )
    assert out is None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = viz.draw_bev(s.points[:100].numpy(), gt_boxes=np.zeros((0, 7)))
    assert fig is not None and len(fig.axes) == 1
    corners = viz.box_corners_bev(np.array([[1.0, 2.0, 0.0, 4.0, 2.0, 1.0, math.pi / 2]]))
    np.testing.assert_allclose(corners[0, 0], [0.0, 4.0], atol=1e-12)  # front-left corner
    with pytest.raises(ValueError, match="color_by"):
        viz.draw_bev(s.points, color_by="rainbow")
    with pytest.raises(ValueError, match="points"):
        viz.draw_bev(torch.zeros(5, 2))
    with pytest.raises(ValueError, match="reflectance"):
        viz.draw_bev(torch.zeros(5, 3), color_by="reflectance")


@pytest.mark.parametrize("n", [0, 1, 7919, 120_268])
def test_simulated_points_exact_size(n):
    a = sim.simulated_points(n, seed=1)
    assert a.shape == (n, 4) and a.dtype == torch.float32
    assert torch.equal(a, sim.simulated_points(n, seed=1))


def test_simulated_points_more_than_one_sweep():
    a = sim.simulated_points(250_000, seed=0)
    assert a.shape == (250_000, 4)
    with pytest.raises(ValueError, match="n_points"):
        sim.simulated_points(-1)
    with pytest.raises(ValueError, match="n_points"):
        sim.simulated_points(10_000_000, n_sweeps=1)


# --- realism statistics (pcops.sim.stats, issue 22) --------------------------------------------

# the simulator's distance from the shared KITTI scans (20 simulated scans, stop 25: range 0.128,
# elevation 0.109, intensity 0.206); a change that moves the simulator further away fails here
REALISM_BOUNDS = {"range_m": 0.2, "elevation_deg": 0.2, "intensity": 0.3}
# scene version 2's reflectance model (fitted to these histograms): 0.14 on 20 scans, v1 0.21
REALISM_BOUNDS_V2 = {"range_m": 0.2, "elevation_deg": 0.2, "intensity": 0.18}


def test_histograms_and_total_variation():
    from pcops.sim import stats

    a = sim.simulate_scan(seed=3).points
    h = stats.scan_histograms([a])
    assert all(abs(v.sum() - 1) < 1e-9 for v in h.values())
    assert stats.compare([a], [a]) == {k: 0.0 for k in stats.BINS}
    far = a.clone()
    far[:, :2] *= 100  # every point beyond the range bins: nothing left to compare
    assert stats.total_variation(h["intensity"], stats.scan_histograms([a + 0.5])["intensity"]) > 0.5
    assert stats.scan_histograms([far])["range_m"].sum() == 0
    ppo = stats.points_per_object([5, 7, 100], [5.0, 8.0, 65.0])
    assert ppo["median"][0] == 6.0 and ppo["n"][0] == 2 and ppo["median"][-1] == 100.0 and ppo["median"][1] is None
    with pytest.raises(ValueError, match="points"):
        stats.scan_histograms([a[:, :3]])
    with pytest.raises(ValueError, match="same bins"):
        stats.total_variation(h["intensity"], h["range_m"])


@pytest.mark.parametrize("version", [1, 2])
def test_realism_against_kitti(kitti_dir, version):
    import pcops.io
    from pcops.sim import stats

    real = [pcops.io.read_points(p) for p in sorted((kitti_dir / "velodyne").glob("*.bin"))]
    tv = stats.compare(real, [sim.simulate_scan(seed=s, scene_version=version).points for s in range(6)])
    print(f"\n[sim realism v{version}] total variation vs KITTI: " + ", ".join(f"{k} {v:.3f}" for k, v in tv.items()))
    for k, bound in (REALISM_BOUNDS if version == 1 else REALISM_BOUNDS_V2).items():
        assert 0 < tv[k] <= bound, (k, tv[k])


def test_version_2_clutter_stays_on_the_sidewalk():
    """Every clutter object's reserved footprint lies behind the curb and inside the sidewalk's
    band, and the footprints do not overlap (``pcops.sim.clutter``, scene version 2)."""
    import numpy as np

    from pcops.sim.clutter import add_street_clutter
    from pcops.sim.scene import _Surfaces

    class Flat:
        def height(self, x, y):
            return -1.73

    for seed in range(20):
        rng = np.random.default_rng(seed)
        side, edge, sw = (1, 5.0, 3.0) if seed % 2 else (-1, -3.0, 2.2)
        occupied, prims = [], []

        def free(x, y, r):
            return all((x - a) ** 2 + (y - b) ** 2 > (r + c) ** 2 for a, b, c in occupied)

        add_street_clutter(rng, Flat(), _Surfaces(rng), prims, occupied, edge, side, sw, lambda *a, **k: False, free)
        assert len(occupied) > 10 and len(prims) >= len(occupied)
        for x, y, r in occupied:
            assert (y - edge) * side >= r, (seed, x, y, r)  # behind the curb line
            assert abs(x) >= 2.0
        xy = np.array([(x, y) for x, y, _ in occupied])
        rr = np.array([r for _, _, r in occupied])
        d = np.hypot(*(xy[:, None] - xy[None]).transpose(2, 0, 1)) + np.eye(len(rr)) * 1e9
        assert (d >= rr[:, None] + rr[None]).all(), seed


def test_version_2_laser_blocks():
    """Scene version 2's sensor: the lower block ends at -24.33 deg, and each block fires from its
    emitter height above the origin, so a return of beam ``b`` at range ``R`` lies on the ray from
    ``(0, 0, dz_block)`` at the beam's elevation (version 1: from the origin)."""
    import numpy as np

    from pcops.sim.sensor import BLOCK_HEIGHTS_V2, LOWEST_BEAM_V2

    assert np.degrees(sim.hdl64_elevations(64, 2))[-1] == pytest.approx(LOWEST_BEAM_V2)
    assert np.array_equal(sim.hdl64_elevations(64, 1), sim.hdl64_elevations(64))
    for version in (1, 2):
        s = sim.simulate_scan(5, scene_version=version)
        p, ring = s.points.double().numpy(), s.ring.numpy()
        elev = sim.hdl64_elevations(64, version)
        dz = np.where(ring < 32, BLOCK_HEIGHTS_V2[0], BLOCK_HEIGHTS_V2[1]) if version == 2 else 0.0
        z = p[:, 2] - dz
        e = np.arctan2(z, np.hypot(p[:, 0], p[:, 1]))
        far = np.hypot(p[:, 0], p[:, 1]) > 5.0  # range noise and the 2 mm quantum are < 0.01 deg there
        assert np.abs(np.degrees(e - elev[ring])[far]).max() < 0.05, version
