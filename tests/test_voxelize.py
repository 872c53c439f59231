"""pcops.voxelize / dynamic_voxelize / voxel_reduce: FCFS oracle, reference vs Triton (interpreter, GPU),
caps, batches, dtypes, registration, bad input."""

import dataclasses

import numpy as np
import pytest
import torch

import pcops
from pcops.reference import voxelize as ref
from _util import generator, interpret, requires_cuda, run_compiler_script

V1 = dict(
    voxel_size=(0.16, 0.16, 4.0),
    point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1),
    max_points_per_voxel=32,
    max_voxels=40000,
)
V3 = dict(
    voxel_size=(0.05, 0.05, 0.1), point_cloud_range=(0, -40, -3, 70.4, 40, 1), max_points_per_voxel=5, max_voxels=40000
)
SMALL = dict(voxel_size=(0.7, 0.9, 0.6), point_cloud_range=(0, 0, 0, 4, 4.5, 1.8))


def oracle(points, voxel_size, point_cloud_range, max_points_per_voxel=None, max_voxels=None, lengths=None):
    """Sequential FCFS voxelizer (numpy float32 cells, a Python dict per sample): the semantics of
    spconv's CPU voxelizer / mmcv's deterministic mode. No caps → dynamic voxelization."""
    n = points.shape[0]
    xyz = points[:, :3].float().numpy()
    lo = np.asarray(point_cloud_range[:3], np.float32)
    hi = np.asarray(point_cloud_range[3:], np.float32)
    vs = np.asarray(voxel_size, np.float32)
    grid = np.asarray([round((point_cloud_range[i + 3] - point_cloud_range[i]) / voxel_size[i]) for i in range(3)])
    with np.errstate(invalid="ignore"):
        cell = np.floor((xyz - lo) / vs)
        ok = np.all((xyz >= lo) & (xyz < hi) & (cell >= 0) & (cell < grid), axis=1)
    cell = np.where(ok[:, None], cell, 0).astype(np.int64)
    lens = [n] if lengths is None else [int(v) for v in lengths]
    cap_p = max_points_per_voxel or n + 1
    cap_v = max_voxels or n + 1
    members, coords, p2v = [], [], np.full(n, -1, np.int64)
    nvox, ndp, ndv = [], [], []
    start = 0
    for b, length in enumerate(lens):
        table, kept_v, dp, dv = {}, 0, 0, 0
        for i in range(start, start + length):
            if not ok[i]:
                continue
            k = (cell[i, 0], cell[i, 1], cell[i, 2])
            r = table.get(k)
            if r is None:
                if kept_v >= cap_v:
                    r = -1
                    dv += 1
                else:
                    r = len(members)
                    kept_v += 1
                    members.append([])
                    coords.append([b, k[2], k[1], k[0]])
                table[k] = r
            if r < 0 or len(members[r]) >= cap_p:
                dp += 1
                continue
            members[r].append(i)
            p2v[i] = r
        nvox.append(kept_v)
        ndp.append(dp)
        ndv.append(dv)
        start += length
    return members, torch.tensor(coords, dtype=torch.int32).reshape(-1, 4), torch.from_numpy(p2v), nvox, ndp, ndv


def assert_matches_oracle(out, points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths=None):
    members, coords, p2v, nvox, ndp, ndv = oracle(
        points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths
    )
    m = len(members)
    assert out.voxels.shape[0] == m and out.voxels.dtype == points.dtype
    assert torch.equal(out.coords, coords)
    assert torch.equal(out.point_to_voxel, p2v)
    assert out.num_points.tolist() == [len(x) for x in members]
    expected = torch.zeros_like(out.voxels)
    for r, idx in enumerate(members):
        expected[r, : len(idx)] = points[idx]
    assert torch.equal(out.voxels, expected)
    assert out.num_voxels.tolist() == nvox
    assert out.num_dropped_points.tolist() == ndp
    assert out.num_dropped_voxels.tolist() == ndv
    for t in (out.num_voxels, out.num_dropped_points, out.num_dropped_voxels, out.point_to_voxel):
        assert t.dtype == torch.int64
    assert out.coords.dtype == torch.int32 and out.num_points.dtype == torch.int32


def random_cloud(n, seed, channels=4, special=True, dtype=torch.float32):
    g = generator(seed)
    pts = torch.rand(n, channels, generator=g) * torch.tensor([5.0, 5.0, 2.0] + [1.0] * (channels - 3))
    pts[:, :3] -= torch.tensor([0.5, 0.5, 0.2])
    if special and n > 12:  # NaN / inf rows: out of range
        pts[3, 0] = float("nan")
        pts[5, 1] = float("inf")
        pts[7, 2] = float("-inf")
        pts[11] = float("nan")
    return pts.to(dtype)


def kitti_scan(kitti_dir, frame="000001"):
    return torch.from_numpy(np.fromfile(kitti_dir / "velodyne" / f"{frame}.bin", dtype=np.float32).reshape(-1, 4))


def assert_same(a, b):
    for x, y, name in zip(a, b, a._fields):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x.cpu(), y.cpu()), name


# --- reference vs the sequential oracle ------------------------------------------------------


@pytest.mark.parametrize(
    "n,p,v", [(0, 3, 5), (1, 2, 3), (13, 1, 2), (97, 3, 7), (509, 1, 1000), (1009, 32, 40000), (1009, 4, 11)]
)
def test_reference_matches_oracle(n, p, v):
    pts = random_cloud(n, seed=n)
    out = pcops.voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], p, v)
    assert_matches_oracle(out, pts, SMALL["voxel_size"], SMALL["point_cloud_range"], p, v)


@pytest.mark.parametrize("lengths", [[300, 0, 697], [0, 31], [31, 0], [1, 1, 1], [500, 497]])
def test_reference_batched_matches_oracle(lengths):
    n = sum(lengths)
    pts = random_cloud(n, seed=n + len(lengths))
    lt = torch.tensor(lengths)
    out = pcops.voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 3, 20, lengths=lt)
    assert_matches_oracle(out, pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 3, 20, lt)
    assert out.coords[:, 0].diff().ge(0).all()


def test_batched_equals_per_sample():
    lengths = [400, 0, 123, 350]
    pts = random_cloud(sum(lengths), seed=5)
    out = pcops.voxelize(
        pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 2, 9, lengths=torch.tensor(lengths, dtype=torch.int32)
    )
    row = start = 0
    for b, length in enumerate(lengths):
        one = pcops.voxelize(pts[start : start + length], SMALL["voxel_size"], SMALL["point_cloud_range"], 2, 9)
        m = one.voxels.shape[0]
        assert torch.equal(out.voxels[row : row + m], one.voxels)
        assert torch.equal(out.coords[row : row + m, 1:], one.coords[:, 1:])
        assert (out.coords[row : row + m, 0] == b).all()
        assert torch.equal(out.num_points[row : row + m], one.num_points)
        p2v = out.point_to_voxel[start : start + length]
        assert torch.equal(p2v, torch.where(one.point_to_voxel >= 0, one.point_to_voxel + row, -1))
        assert out.num_voxels[b] == one.num_voxels[0] and out.num_dropped_points[b] == one.num_dropped_points[0]
        assert out.num_dropped_voxels[b] == one.num_dropped_voxels[0]
        row += m
        start += length
    dyn = pcops.dynamic_voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], torch.tensor(lengths))
    members, coords, p2v, nvox, _, _ = oracle(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], lengths=lengths)
    assert torch.equal(dyn.point_to_voxel, p2v) and torch.equal(dyn.coords, coords) and dyn.num_voxels.tolist() == nvox


def test_caps_and_pad_to_max():
    pts = random_cloud(600, seed=9)
    args = (SMALL["voxel_size"], SMALL["point_cloud_range"])
    one = pcops.voxelize(pts, *args, 1, 5)  # tiny caps: most points dropped
    assert_matches_oracle(one, pts, *args, 1, 5)
    assert one.num_dropped_voxels.item() > 0 and one.num_dropped_points.item() > 0
    pad = pcops.voxelize(pts, *args, 1, 5, lengths=torch.tensor([600]), pad_to_max=True)
    assert pad.voxels.shape == (5, 1, 4)
    lt = torch.tensor([250, 0, 350])
    var = pcops.voxelize(pts, *args, 3, 40, lengths=lt)
    pad = pcops.voxelize(pts, *args, 3, 40, lengths=lt, pad_to_max=True)
    m = var.voxels.shape[0]
    assert pad.voxels.shape == (120, 3, 4) and m < 120
    assert torch.equal(pad.voxels[:m], var.voxels) and (pad.voxels[m:] == 0).all()
    assert torch.equal(pad.coords[:m], var.coords) and (pad.coords[m:] == -1).all()
    assert torch.equal(pad.num_points[:m], var.num_points) and (pad.num_points[m:] == 0).all()
    for a, b in zip(pad[3:], var[3:]):
        assert torch.equal(a, b)
    d = pcops.dynamic_voxelize(pts, *args, lengths=lt, pad_to_max=True)
    dv = pcops.dynamic_voxelize(pts, *args, lengths=lt)
    assert d.coords.shape == (600, 4) and torch.equal(d.coords[: dv.coords.shape[0]], dv.coords)
    assert (d.coords[dv.coords.shape[0] :] == -1).all() and torch.equal(d.point_to_voxel, dv.point_to_voxel)


def test_empty_and_all_out_of_range():
    args = (SMALL["voxel_size"], SMALL["point_cloud_range"], 4, 10)
    for pts in (torch.zeros(0, 4), torch.full((50, 4), 100.0), torch.full((7, 3), float("nan"))):
        out = pcops.voxelize(pts, *args)
        assert out.voxels.shape == (0, 4, pts.shape[1]) and out.coords.shape == (0, 4)
        assert (out.point_to_voxel == -1).all() and out.point_to_voxel.shape == (pts.shape[0],)
        assert out.num_voxels.tolist() == [0] and out.num_dropped_points.tolist() == [0]
        d = pcops.dynamic_voxelize(pts, *args[:2])
        assert d.coords.shape == (0, 4) and (d.point_to_voxel == -1).all()


def test_boundaries_nan_inf():
    # exactly on range_min is in, exactly on range_max is out; NaN/inf out
    pts = torch.tensor(
        [
            [0.0, 0.0, 0.0],
            [4.0, 1.0, 1.0],
            [3.99, 4.49, 1.79],
            [float("nan"), 1, 1],
            [1, float("inf"), 1],
            [1, 1, float("-inf")],
            [-1e-7, 1, 1],
        ]
    )
    out = pcops.voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 2, 10)
    assert out.point_to_voxel.tolist() == [0, -1, 1, -1, -1, -1, -1]
    assert out.coords.tolist() == [[0, 0, 0, 0], [0, 2, 4, 5]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_precision_points(dtype):
    pts = random_cloud(400, seed=3, dtype=dtype)
    out = pcops.voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 3, 30)
    assert_matches_oracle(out, pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 3, 30)


def test_dynamic_matches_oracle():
    pts = random_cloud(700, seed=4)
    d = pcops.dynamic_voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"])
    members, coords, p2v, nvox, _, _ = oracle(pts, SMALL["voxel_size"], SMALL["point_cloud_range"])
    assert torch.equal(d.point_to_voxel, p2v) and torch.equal(d.coords, coords) and d.num_voxels.tolist() == nvox


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_dynamic_cells_only(dtype):
    """cells_only: each point's (b, z, y, x) is its voxel's row of the numbered form, −1 rows
    where the point is out of range."""
    pts = random_cloud(500, seed=21, dtype=dtype)
    vs, pcr = SMALL["voxel_size"], SMALL["point_cloud_range"]
    for lengths in (None, torch.tensor([200, 300]), torch.tensor([0, 500])):
        cells = pcops.dynamic_voxelize(pts, vs, pcr, lengths, cells_only=True)
        d = pcops.dynamic_voxelize(pts, vs, pcr, lengths)
        assert cells.dtype == torch.int32 and cells.shape == (500, 4)
        inside = d.point_to_voxel >= 0
        assert torch.equal(cells[inside], d.coords[d.point_to_voxel[inside]])
        assert (cells[~inside] == -1).all() and (~inside).sum() >= 4  # the NaN/inf rows at least
        ref_cells = pcops.dynamic_voxelize(pts, vs, pcr, lengths, cells_only=True, backend="reference")
        assert torch.equal(cells, ref_cells)
    torch.library.opcheck(torch.ops.pcops.point_cells, (pts, torch.tensor([200, 300]), list(vs), list(pcr), "auto"))
    with pytest.raises(TypeError, match="cells_only"):
        pcops.dynamic_voxelize(pts, vs, pcr, cells_only=1)

    def f(p):
        return pcops.dynamic_voxelize(p, vs, pcr, cells_only=True)

    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(pts), f(pts))


@pytest.mark.parametrize("frame,cfg", [("000000", V1), ("000001", V3)])
def test_kitti_reference_matches_oracle(kitti_dir, frame, cfg):
    pts = kitti_scan(kitti_dir, frame)
    out = pcops.voxelize(pts, **cfg)
    assert_matches_oracle(
        out, pts, cfg["voxel_size"], cfg["point_cloud_range"], cfg["max_points_per_voxel"], cfg["max_voxels"]
    )
    two = pcops.voxelize(
        torch.cat([pts, kitti_scan(kitti_dir, "000000")]),
        **{**cfg, "max_voxels": 3000},
        lengths=torch.tensor([pts.shape[0], kitti_scan(kitti_dir, "000000").shape[0]]),
    )
    assert two.num_voxels.tolist() == [3000, 3000] and two.num_dropped_voxels.min() > 0


# --- voxel_reduce -----------------------------------------------------------------------------


def reduce_oracle(features, p2v, m, reduce):
    out = torch.zeros(m, features.shape[1], dtype=torch.float64)
    for r in range(m):
        rows = features[p2v == r].double()
        if len(rows):
            out[r] = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.max(0).values}[reduce]
    return out


@pytest.mark.parametrize("reduce", ["mean", "max", "sum"])
def test_voxel_reduce(reduce):
    pts = random_cloud(300, seed=6, special=False)
    out = pcops.voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 4, 30)
    feats = torch.randn(300, 5, generator=generator(1), dtype=torch.float64)
    m = out.voxels.shape[0] + 2  # two empty voxels at the end
    r = pcops.voxel_reduce(feats, out.point_to_voxel, m, reduce)
    torch.testing.assert_close(r, reduce_oracle(feats, out.point_to_voxel, m, reduce))
    f = feats.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: pcops.voxel_reduce(x, out.point_to_voxel, m, reduce), (f,))
    r32 = pcops.voxel_reduce(feats.float().half(), out.point_to_voxel, m, reduce)
    assert r32.dtype == torch.float16


def test_points_requiring_grad_are_detached():
    pts = random_cloud(50, seed=2).requires_grad_(True)
    out = pcops.voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"], 3, 10)
    assert not out.voxels.requires_grad
    d = pcops.dynamic_voxelize(pts, SMALL["voxel_size"], SMALL["point_cloud_range"])
    feat = pcops.voxel_reduce(pts, d.point_to_voxel, d.coords.shape[0], "mean")
    feat.sum().backward()
    assert pts.grad is not None and torch.isfinite(pts.grad).all()


def test_voxel_reduce_max_ties_go_to_lowest_index():
    f = torch.tensor([[1.0, 2.0], [1.0, 5.0], [0.0, 5.0], [3.0, 3.0]], requires_grad=True)
    p2v = torch.tensor([0, 0, 0, -1])
    out = pcops.voxel_reduce(f, p2v, 2, "max")
    assert out.tolist() == [[1.0, 5.0], [0.0, 0.0]]
    out.sum().backward()
    assert f.grad.tolist() == [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


# --- registration -----------------------------------------------------------------------------


def test_opcheck():
    pts = random_cloud(200, seed=7)
    vs, pcr = list(SMALL["voxel_size"]), list(SMALL["point_cloud_range"])
    for lengths in (None, torch.tensor([120, 80])):
        for pad in (False, True):
            for backend in ("auto", "reference"):
                torch.library.opcheck(torch.ops.pcops.voxelize, (pts, lengths, vs, pcr, 3, 20, pad, backend))
                torch.library.opcheck(torch.ops.pcops.voxelize, (pts, lengths, vs, pcr, 3, 20, pad, backend, "lists"))
                torch.library.opcheck(torch.ops.pcops.dynamic_voxelize, (pts, lengths, vs, pcr, pad, backend))
    p2v = pcops.dynamic_voxelize(pts, vs, pcr).point_to_voxel
    feats = torch.randn(200, 3, dtype=torch.float64, requires_grad=True)
    for reduce in ("mean", "max", "sum"):
        torch.library.opcheck(torch.ops.pcops.voxel_reduce, (feats, p2v, int(p2v.max()) + 1, reduce))


def test_torch_compile_fullgraph_dynamic_m():
    pts = random_cloud(300, seed=8)
    args = (SMALL["voxel_size"], SMALL["point_cloud_range"])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def net(points):
        out = pcops.voxelize(points, *args, 4, 50)
        mean = out.voxels.sum(1) / out.num_points.clamp_min(1)[:, None]
        d = pcops.dynamic_voxelize(points, *args)
        feat = pcops.voxel_reduce(points, d.point_to_voxel, d.coords.shape[0], "max")
        return mean, out.coords, feat

    mean, coords, feat = net(pts)
    out = pcops.voxelize(pts, *args, 4, 50)
    torch.testing.assert_close(mean, out.voxels.sum(1) / out.num_points.clamp_min(1)[:, None])
    assert torch.equal(coords, out.coords)
    d = pcops.dynamic_voxelize(pts, *args)
    torch.testing.assert_close(feat, pcops.voxel_reduce(pts, d.point_to_voxel, d.coords.shape[0], "max"))
    net(random_cloud(123, seed=9))  # another M, same graph (dynamic)


def _bad(**kw):
    args = dict(
        points=torch.zeros(5, 4),
        voxel_size=(0.1, 0.1, 0.1),
        point_cloud_range=(0, 0, 0, 1, 1, 1),
        max_points_per_voxel=4,
        max_voxels=10,
    )
    args.update(kw)
    return args


@pytest.mark.parametrize(
    "bad,exc,name",
    [
        (_bad(points=torch.zeros(5, 2)), ValueError, "points"),
        (_bad(points=torch.zeros(5, 4, dtype=torch.int32)), TypeError, "points"),
        (_bad(points=[[0.0, 0.0, 0.0]]), TypeError, "points"),
        (_bad(voxel_size=(0.1, 0.0, 0.1)), ValueError, "voxel_size"),
        (_bad(voxel_size=(0.1, -1, 0.1)), ValueError, "voxel_size"),
        (_bad(voxel_size=(0.1, 0.1)), ValueError, "voxel_size"),
        (_bad(point_cloud_range=(0, 0, 1, 1, 1, 1)), ValueError, "point_cloud_range"),
        (_bad(point_cloud_range=(0, 2, 0, 1, 1, 1)), ValueError, "point_cloud_range"),
        (_bad(point_cloud_range=(0, 0, 0, 1, 1)), ValueError, "point_cloud_range"),
        (_bad(max_points_per_voxel=0), ValueError, "max_points_per_voxel"),
        (_bad(max_voxels=0), ValueError, "max_voxels"),
        (_bad(max_voxels=2.0), TypeError, "max_voxels"),
        (_bad(lengths=torch.tensor([2, 2])), ValueError, "lengths"),
        (_bad(lengths=torch.tensor([2.0, 3.0])), TypeError, "lengths"),
        (_bad(lengths=torch.tensor([6, -1])), ValueError, "lengths"),
        (_bad(lengths=torch.tensor([[5]])), ValueError, "lengths"),
        (_bad(lengths=torch.zeros(0, dtype=torch.int64)), ValueError, "lengths"),
        (_bad(pad_to_max=1), TypeError, "pad_to_max"),
        (_bad(backend="cuda"), ValueError, "backend.*no 'cuda'"),  # no CUDA C++ voxelizer
        (_bad(backend="triton"), ValueError, "backend.*CUDA"),  # CPU points: no silent fallback
        (_bad(backend="fast"), ValueError, "backend"),
        (_bad(mode="list"), ValueError, "mode"),
    ],
)
def test_bad_input(bad, exc, name):
    with pytest.raises(exc, match=name):
        pcops.voxelize(**bad)


def test_backends_and_modes_cpu():
    """On the CPU every backend that can run gives the reference (``"torch"``: its former name); the
    mode does not change the output."""
    pts = random_cloud(300, seed=10)
    args = (SMALL["voxel_size"], SMALL["point_cloud_range"], 4, 50)
    out = pcops.voxelize(pts, *args)
    for kw in (dict(backend="reference"), dict(backend="torch"), dict(mode="csr"), dict(mode="lists")):
        assert_same(pcops.voxelize(pts, *args, **kw), out)
    d = pcops.dynamic_voxelize(pts, *args[:2])
    assert_same(pcops.dynamic_voxelize(pts, *args[:2], backend="reference"), d)
    feats = torch.randn(300, 3, generator=generator(1))
    torch.testing.assert_close(
        pcops.voxel_reduce(feats, d.point_to_voxel, d.coords.shape[0], backend="reference"),
        pcops.voxel_reduce(feats, d.point_to_voxel, d.coords.shape[0]),
    )
    for backend in ("triton", "cuda"):
        with pytest.raises(ValueError, match="backend"):
            pcops.voxel_reduce(feats, d.point_to_voxel, d.coords.shape[0], backend=backend)
        with pytest.raises(ValueError, match="backend"):
            pcops.dynamic_voxelize(pts, *args[:2], backend=backend)


def test_bad_input_dynamic_and_reduce():
    with pytest.raises(ValueError, match="voxel_size"):
        pcops.dynamic_voxelize(torch.zeros(3, 3), (0, 1, 1), (0, 0, 0, 1, 1, 1))
    with pytest.raises(ValueError, match="lengths"):
        pcops.dynamic_voxelize(torch.zeros(3, 3), (1, 1, 1), (0, 0, 0, 1, 1, 1), lengths=torch.tensor([1]))
    f, p2v = torch.zeros(4, 2), torch.tensor([0, 1, -1, 0])
    with pytest.raises(ValueError, match="reduce"):
        pcops.voxel_reduce(f, p2v, 2, "min")
    with pytest.raises(ValueError, match="point_to_voxel"):
        pcops.voxel_reduce(f, p2v[:3], 2)
    with pytest.raises(ValueError, match="point_to_voxel"):
        pcops.voxel_reduce(f, p2v, 1)
    with pytest.raises(ValueError, match="point_to_voxel"):
        pcops.voxel_reduce(f, torch.tensor([0, -5, 1, 0]), 2)
    with pytest.raises(TypeError, match="point_to_voxel"):
        pcops.voxel_reduce(f, p2v.float(), 2)
    with pytest.raises(ValueError, match="num_voxels"):
        pcops.voxel_reduce(f, p2v, -1)


def test_grid_checks_are_memoized_only_for_valid_grids():
    """The wrappers remember validated (voxel_size, point_cloud_range) tuples: a valid grid gives
    the same result from a tuple, a list or the memo; invalid grids raise on every call, and a
    grid too large for the int64 voxel key is refused."""
    pts = torch.tensor([[0.5, 0.5, 0.5], [1.5, 0.5, 0.5], [9.0, 9.0, 9.0]])
    grid = ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0, 2.0, 2.0, 2.0))
    want = pcops.dynamic_voxelize(pts, *grid, cells_only=True)
    for _ in range(2):  # first call validates, second hits the memo
        assert torch.equal(pcops.dynamic_voxelize(pts, *grid, cells_only=True), want)
    assert torch.equal(pcops.dynamic_voxelize(pts, [1.0, 1.0, 1.0], list(grid[1]), cells_only=True), want)
    for _ in range(2):
        with pytest.raises(ValueError, match="finite"):
            pcops.dynamic_voxelize(pts, grid[0], (0.0, 0.0, 0.0, 2.0, float("inf"), 2.0))
        with pytest.raises(ValueError, match="min < max"):
            pcops.voxelize(pts, grid[0], (0.0, 0.0, 0.0, 2.0, -2.0, 2.0), 4, 4)
        with pytest.raises(ValueError, match="too large"):
            pcops.voxelize(pts, (1e-6, 1e-6, 1e-6), (0.0, 0.0, 0.0, 1e3, 1e3, 1e3), 4, 4)


# --- Triton kernels under the CPU interpreter --------------------------------------------------


class Launchers:
    """The Triton launchers with one mode and one ``Tuning`` (launch parameters and test hooks)."""

    def __init__(self, tuning, mode="auto"):
        self.tuning, self.mode = tuning, mode

    def replace(self, mode=None, **fields):
        return Launchers(dataclasses.replace(self.tuning, **fields), mode or self.mode)

    def voxelize(self, *args):
        from pcops.triton import voxelize as tri

        return tri.voxelize(*args, mode=self.mode, tuning=self.tuning)

    def dynamic_voxelize(self, *args):
        from pcops.triton import voxelize as tri

        return tri.dynamic_voxelize(*args, tuning=self.tuning)


@pytest.fixture
def small_blocks():
    """Tiny scan blocks so a few hundred points span many blocks (look-back, waits, sample starts)."""
    from pcops.triton import voxelize as tri

    return Launchers(tri.Tuning(hard_main=((32, 4), (32, 4)), dynamic_main=((32, 4), (32, 4)), lookback=2))


@pytest.mark.parametrize(
    "n,p,v,lengths",
    [
        (1, 2, 3, None),
        (37, 1, 4, None),
        (211, 3, 9, None),
        (223, 2, 40, [100, 0, 23, 100]),
        (64, 5, 2, [0, 64]),
        (200, 2, 3, [10, 0] * 10),  # more than 16 samples: the per-sample loop instead of one vector
    ],
)
@pytest.mark.parametrize("pad,inclusive", [(False, True), (True, True), (False, False)])
@interpret
def test_triton_interpreter(small_blocks, n, p, v, lengths, pad, inclusive):
    # the interpreter runs blocks in order, so every look-back would stop at its neighbour's
    # inclusive prefix; without inclusive prefixes it must add aggregates back to a sample start
    tri = small_blocks.replace(publish_inclusive=inclusive)
    pts = random_cloud(n, seed=n + p)
    lt = None if lengths is None else torch.tensor(lengths)
    vs, pcr = SMALL["voxel_size"], SMALL["point_cloud_range"]
    got = pcops.Voxels(*tri.voxelize(pts, lt, vs, pcr, p, v, pad))
    assert_same(got, pcops.Voxels(*ref.voxelize(pts, lt, vs, pcr, p, v, pad)))
    got = pcops.DynamicVoxels(*tri.dynamic_voxelize(pts, lt, vs, pcr, pad))
    assert_same(got, pcops.DynamicVoxels(*ref.dynamic_voxelize(pts, lt, vs, pcr, pad)))


@interpret
def test_triton_interpreter_empty_and_out_of_range(small_blocks):
    tri = small_blocks
    vs, pcr = SMALL["voxel_size"], SMALL["point_cloud_range"]
    far = torch.full((70, 4), 100.0)
    far[5] = float("nan")
    for pts in (torch.zeros(0, 4), far):
        for lengths in (None, torch.tensor([pts.shape[0], 0])):
            for pad in (False, True):
                assert_same(
                    pcops.Voxels(*tri.voxelize(pts, lengths, vs, pcr, 3, 5, pad)),
                    pcops.Voxels(*ref.voxelize(pts, lengths, vs, pcr, 3, 5, pad)),
                )
                assert_same(
                    pcops.DynamicVoxels(*tri.dynamic_voxelize(pts, lengths, vs, pcr, pad)),
                    pcops.DynamicVoxels(*ref.dynamic_voxelize(pts, lengths, vs, pcr, pad)),
                )


@pytest.mark.parametrize(
    "n,lengths", [(300, None), (300, [300]), (300, [100, 0, 150]), (200, [10, 0] * 10), (70, [70, 5])]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@interpret
def test_triton_interpreter_point_cells(n, lengths, dtype):
    """One elementwise pass: the reference's cells bit for bit (samples as one vector up to 16,
    a loop beyond; points past the samples' lengths and non-finite points give −1 rows)."""
    from pcops.triton import voxelize as tri

    pts = random_cloud(n, seed=n + 31, dtype=dtype)
    lt = None if lengths is None else torch.tensor(lengths)
    vs, pcr = SMALL["voxel_size"], SMALL["point_cloud_range"]
    got = tri.point_cells(pts, lt, vs, pcr, block=64)
    exp = ref.point_cells(pts, lt, vs, pcr)
    assert got.dtype == exp.dtype == torch.int32 and torch.equal(got, exp)
    assert (got[:, 0] >= 0).any() and (got == -1).all(1).any()
    assert tri.point_cells(pts[:0], None, vs, pcr).shape == (0, 4)


RANK_MODES = {  # mode and Tuning test hooks
    "csr": ("csr", {}),  # the default below 2,000,000 points per sample
    "csr-reversed": ("csr", dict(reverse_segments=True)),  # segments reversed: the rows kernel merges
    "lists": ("lists", {}),  # sorted in-block ranks into per-voxel lists
    "lists-no-seen": ("lists", dict(seen=False)),  # start at the in-block rank: earlier blocks' values cascade ours
    "lists-key64": ("lists", dict(key64=True)),
}


@pytest.mark.parametrize("mode", list(RANK_MODES))
@pytest.mark.parametrize("p", [1, 5, 16, 32])
@interpret
def test_triton_interpreter_dense_voxels(small_blocks, p, mode):
    """~20 points per voxel: deep cascades, snapshot start positions over several chunks, drops;
    each way of ranking the points in their voxels."""
    name, hooks = RANK_MODES[mode]
    tri = small_blocks.replace(mode=name, **hooks)
    pts = random_cloud(250, seed=p)
    vs, pcr = (2.0, 2.0, 1.0), SMALL["point_cloud_range"]
    for lengths in (None, torch.tensor([120, 130])):
        got = pcops.Voxels(*tri.voxelize(pts, lengths, vs, pcr, p, 7, False))
        assert_same(got, pcops.Voxels(*ref.voxelize(pts, lengths, vs, pcr, p, 7, False)))
        assert got.num_dropped_points.sum() > 0


@pytest.mark.slow  # one of the longest interpreter cases
@pytest.mark.parametrize("reverse", [False, True])
@interpret
def test_triton_interpreter_one_huge_voxel(small_blocks, reverse):
    """CSR mode with one voxel holding most points (as zero padding or a sentinel value gives): the rows
    kernel's chunk loop over a long segment, in arrival order and in the reversed layout (every chunk
    merges), with a partial last chunk; the other voxels share its program."""
    tri = small_blocks.replace(mode="csr", reverse_segments=reverse)
    pts = random_cloud(120, seed=7)
    g = generator(8)
    dense = torch.rand(230, pts.shape[1], generator=g) * 0.01 + 0.3  # one voxel of (2, 2, 1) m
    order = torch.randperm(350, generator=g)
    pts = torch.cat([pts, dense])[order]
    vs, pcr = (2.0, 2.0, 1.0), SMALL["point_cloud_range"]
    for p in (5, 32):
        for lengths in (None, torch.tensor([150, 200])):
            got = pcops.Voxels(*tri.voxelize(pts, lengths, vs, pcr, p, 7, False))
            assert_same(got, pcops.Voxels(*ref.voxelize(pts, lengths, vs, pcr, p, 7, False)))
            assert got.num_points.max() == p


@interpret
def test_triton_interpreter_big_cloud_config(small_blocks):
    """Clouds from ``big_n`` points switch to the second launch configuration (another block size)."""
    tri = small_blocks.replace(big_n=100, hard_main=((32, 4), (64, 4)), dynamic_main=((32, 4), (16, 4)))
    pts = random_cloud(230, seed=5, channels=3)
    vs, pcr = (1.0, 1.0, 1.0), SMALL["point_cloud_range"]
    for lengths in (None, torch.tensor([100, 130])):
        for pad in (False, True):
            assert_same(
                pcops.Voxels(*tri.voxelize(pts, lengths, vs, pcr, 4, 6, pad)),
                pcops.Voxels(*ref.voxelize(pts, lengths, vs, pcr, 4, 6, pad)),
            )
            assert_same(
                pcops.DynamicVoxels(*tri.dynamic_voxelize(pts, lengths, vs, pcr, pad)),
                pcops.DynamicVoxels(*ref.dynamic_voxelize(pts, lengths, vs, pcr, pad)),
            )


def test_mode_auto_threshold():
    """``mode="auto"``: the CSR layout below 2,000,000 points per sample on average (the old default)."""
    from pcops.triton import voxelize as tri

    assert tri.CSR_MAX_POINTS_PER_SAMPLE == 2_000_000
    assert tri._use_csr("auto", 1_999_999, 1) and not tri._use_csr("auto", 2_000_000, 1)
    assert tri._use_csr("auto", 3_999_999, 2) and not tri._use_csr("auto", 4_000_000, 2)
    assert tri._use_csr("csr", 10**8, 1) and not tri._use_csr("lists", 10, 1)
    with pytest.raises(ValueError, match="mode"):
        tri._use_csr("fast", 10, 1)
    assert tri.DEFAULT == tri.Tuning() and dataclasses.is_dataclass(tri.DEFAULT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tri.DEFAULT.big_n = 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@interpret
def test_triton_interpreter_low_precision_and_default_blocks(dtype):
    from pcops.triton import voxelize as tri

    pts = random_cloud(300, seed=11, channels=5, dtype=dtype)
    vs, pcr = SMALL["voxel_size"], SMALL["point_cloud_range"]
    assert_same(
        pcops.Voxels(*tri.voxelize(pts, None, vs, pcr, 4, 25, False)),
        pcops.Voxels(*ref.voxelize(pts, None, vs, pcr, 4, 25, False)),
    )
    assert_same(
        pcops.Voxels(*tri.voxelize(pts, None, vs, pcr, 4, 25, False, "lists")),
        pcops.Voxels(*ref.voxelize(pts, None, vs, pcr, 4, 25, False)),
    )


@interpret
def test_triton_interpreter_kitti_subset(kitti_dir, small_blocks):
    tri = small_blocks
    pts = kitti_scan(kitti_dir)[::400].contiguous()  # ~300 points spread over the scan
    vs, pcr = (1.6, 1.6, 4.0), V1["point_cloud_range"]
    assert_same(
        pcops.Voxels(*tri.voxelize(pts, None, vs, pcr, 2, 50, False)),
        pcops.Voxels(*ref.voxelize(pts, None, vs, pcr, 2, 50, False)),
    )


# --- the GPU path -------------------------------------------------------------------------------


def _gpu_case(pts, cfg, lengths=None, pad=False, reference_backend=False, mode="auto", tuning=None):
    """The GPU result (the public op with ``mode``, or the launcher with ``tuning``) against the CPU
    reference, run to run, and the dynamic form."""
    lc = None if lengths is None else lengths.cuda()
    if tuning is None:
        run = lambda: pcops.voxelize(pts.cuda(), **cfg, lengths=lc, pad_to_max=pad, mode=mode)  # noqa: E731
    else:
        from pcops.triton import voxelize as tri

        args = (cfg["voxel_size"], cfg["point_cloud_range"], cfg["max_points_per_voxel"], cfg["max_voxels"])
        run = lambda: pcops.Voxels(*tri.voxelize(pts.cuda(), lc, *args, pad, mode, tuning))  # noqa: E731
    out = run()
    expected = pcops.voxelize(pts, **cfg, lengths=lengths, pad_to_max=pad)
    assert_same(out, expected)
    if reference_backend:
        assert_same(pcops.voxelize(pts.cuda(), **cfg, lengths=lc, pad_to_max=pad, backend="reference"), expected)
    assert_same(run(), out)  # run to run
    d = pcops.dynamic_voxelize(
        pts.cuda(),
        cfg["voxel_size"],
        cfg["point_cloud_range"],
        None if lengths is None else lengths.cuda(),
        pad_to_max=pad,
    )
    assert_same(d, pcops.dynamic_voxelize(pts, cfg["voxel_size"], cfg["point_cloud_range"], lengths, pad_to_max=pad))


@pytest.mark.parametrize(
    "n,dtype",
    [
        (0, torch.float32),
        (1, torch.float32),
        (7, torch.float32),
        (1009, torch.float32),
        (65537, torch.float32),
        (1009, torch.float16),
        (65537, torch.bfloat16),
    ],
)
@pytest.mark.gpu
@requires_cuda
def test_gpu_random(n, dtype):
    # (fp16/bf16 only at two sizes: every dtype, cap and size class is another compilation)
    pts = random_cloud(n, seed=n, dtype=dtype)
    for p, v in ((1, 3), (3, 20), (32, 40000)):
        cfg = dict(
            voxel_size=(0.11, 0.13, 0.3),
            point_cloud_range=SMALL["point_cloud_range"],
            max_points_per_voxel=p,
            max_voxels=v,
        )
        _gpu_case(pts, cfg)
        _gpu_case(pts, cfg, pad=True)
    if n > 10:
        lengths = torch.tensor([n // 3, 0, n - n // 3])
        _gpu_case(pts, cfg, lengths)
        _gpu_case(pts, dict(cfg, max_voxels=17), lengths, pad=True)


@pytest.mark.gpu
@requires_cuda
def test_gpu_kitti(kitti_dir):
    scan = kitti_scan(kitti_dir)
    for cfg in (V1, V3, dict(V1, max_voxels=5000, max_points_per_voxel=4)):
        _gpu_case(scan, cfg, reference_backend=True)
        _gpu_case(scan, cfg, pad=True)
    g = torch.Generator().manual_seed(0)
    big = torch.cat(
        [
            scan + torch.cat([torch.randn(scan.shape[0], 3, generator=g) * 0.05, torch.zeros(scan.shape[0], 1)], 1)
            for _ in range(10)
        ]
    )
    _gpu_case(big, V1)
    two = torch.cat([scan, kitti_scan(kitti_dir, "000000")])
    lengths = torch.tensor([scan.shape[0], two.shape[0] - scan.shape[0]])
    _gpu_case(two, V1, lengths, reference_backend=True)
    _gpu_case(two, dict(V3, max_voxels=20000), lengths, pad=True)


def _race_cases(**kw):
    dense = random_cloud(200003, seed=3, special=False)
    grid = dict(point_cloud_range=SMALL["point_cloud_range"], max_voxels=100)
    _gpu_case(dense, dict(grid, voxel_size=(0.5, 0.5, 0.6), max_points_per_voxel=32), **kw)
    sparse = random_cloud(50021, seed=4)
    _gpu_case(
        sparse,
        dict(grid, voxel_size=(0.05, 0.05, 0.3), max_points_per_voxel=5, max_voxels=40000),
        torch.tensor([20000, 30021]),
        pad=True,
        **kw,
    )
    _gpu_case(
        torch.cat([sparse, dense]),
        dict(grid, voxel_size=(0.5, 0.5, 0.6), max_points_per_voxel=5),
        torch.tensor([50021, 200003]),
        **kw,
    )


@pytest.mark.gpu
@requires_cuda
def test_gpu_block_races():
    """The default ranking under maximal races: a dense cloud where every block holds points of
    every voxel (~900 points in each of 216 voxels), a sparse batched one, and both as a batch."""
    _race_cases()


@pytest.mark.gpu
@requires_cuda
def test_gpu_csr_reversed():
    """The CSR rows kernel's merges: segments laid out in reverse arrival order, the race cases."""
    from pcops.triton import voxelize as tri

    _race_cases(mode="csr", tuning=tri.Tuning(reverse_segments=True))


@pytest.mark.gpu
@requires_cuda
def test_gpu_lists_mode():
    """The ranked lists (``mode="lists"``, the default from 2,000,000 points per sample) under the same races."""
    _race_cases(mode="lists")


@pytest.mark.slow
@requires_cuda
def test_gpu_main_config_1024_8():
    """Another main-kernel launch configuration (the benchmark sweeps these) gives the reference's
    output on the race cases (marked slow: it compiles its own kernels)."""
    from pcops.triton import voxelize as tri

    _race_cases(tuning=tri.Tuning(hard_main=((1024, 8),) * 2, dynamic_main=((1024, 8),) * 2))


@pytest.mark.gpu
@requires_cuda
def test_gpu_backends_logged(caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="pcops")
    pts = random_cloud(500, seed=12).cuda()
    args = (SMALL["voxel_size"], SMALL["point_cloud_range"], 3, 20)
    pcops.voxelize(pts, *args)
    pcops.voxelize(pts, *args, mode="lists")
    pcops.voxelize(pts, *args, backend="reference")
    pcops.voxelize(pts.double(), *args)  # float64: still the Triton kernels (coordinates compared in float32)
    ran = [r.getMessage() for r in caplog.records if r.name == "pcops" and r.getMessage().startswith("voxelize: ")]
    assert ran == [
        "voxelize: _voxelize_kernel + scatter + rows (csr)",
        "voxelize: _voxelize_kernel + rows (lists)",
        "voxelize: reference",
        "voxelize: _voxelize_kernel + scatter + rows (csr)",
    ], ran
    with pytest.raises(ValueError, match="backend"):
        pcops.voxelize(pts, *args, backend="cuda")


@pytest.mark.gpu
@requires_cuda
def test_gpu_cuda_graph_capture_fixed_capacity(kitti_dir):
    scan = kitti_scan(kitti_dir).cuda()
    static = scan.clone()
    expected = pcops.voxelize(static, **V1, pad_to_max=True)  # warm-up / compile outside capture
    pcops.dynamic_voxelize(static, V1["voxel_size"], V1["point_cloud_range"], pad_to_max=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pcops.voxelize(static, **V1, pad_to_max=True)
        dyn = pcops.dynamic_voxelize(static, V1["voxel_size"], V1["point_cloud_range"], pad_to_max=True)
    graph.replay()
    assert_same(out, expected)
    static.copy_(scan.flip(0))  # another point order: another FCFS result
    graph.replay()
    assert_same(out, pcops.voxelize(static.cpu(), **V1, pad_to_max=True))
    assert_same(dyn, pcops.dynamic_voxelize(static.cpu(), V1["voxel_size"], V1["point_cloud_range"], pad_to_max=True))


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck_and_reduce():
    pts = random_cloud(500, seed=12).cuda()
    vs, pcr = list(SMALL["voxel_size"]), list(SMALL["point_cloud_range"])
    for pad in (False, True):
        for backend in ("auto", "triton", "reference"):
            torch.library.opcheck(torch.ops.pcops.voxelize, (pts, None, vs, pcr, 3, 20, pad, backend))
            torch.library.opcheck(
                torch.ops.pcops.dynamic_voxelize, (pts, torch.tensor([200, 300], device="cuda"), vs, pcr, pad, backend)
            )
    d = pcops.dynamic_voxelize(pts, vs, pcr)
    m = d.coords.shape[0]
    feats = torch.randn(500, 6, device="cuda", requires_grad=True)
    for reduce in ("mean", "max", "sum"):
        out = pcops.voxel_reduce(feats, d.point_to_voxel, m, reduce)
        fc = feats.detach().cpu().requires_grad_(True)
        exp = pcops.voxel_reduce(fc, d.point_to_voxel.cpu(), m, reduce)
        torch.testing.assert_close(out.cpu(), exp)
        g = torch.randn_like(exp)
        (gpu_grad,) = torch.autograd.grad(out, feats, g.cuda())
        (cpu_grad,) = torch.autograd.grad(exp, fc, g)
        torch.testing.assert_close(gpu_grad.cpu(), cpu_grad)


_AOT_SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import voxelize as tri
from pcops.triton import voxelize_rows as rows

target = GPUTarget("cuda", 90, 32)


def compile_(fn, types, constexprs, num_warps, ones=()):
    # Triton's JIT turns int arguments equal to 1 into constexprs: compile such variants too
    sig = dict(zip(fn.arg_names, types + ["constexpr"] * (len(fn.arg_names) - len(types))))
    for name in ones:
        sig[name] = "constexpr"
        constexprs = {**constexprs, name: 1}
    triton.compile(ASTSource(fn, sig, constexprs), target=target, options={"num_warps": num_warps})


main_types = ["*fp32", "*i32", "*i64"] + ["*i32"] * 8 + ["*i64"] + ["*i32"] * 4 + ["i32"] * 4 + ["fp32"] * 9 + ["i32"] * 6
ones1 = ("gz", "batch_size", "max_points", "list_stride")
for hl, hard, seg, pb, bmax, ones, key64, csr in [
        (True, True, True, 32, 4, (), False, False), (False, True, False, 8, 0, (), True, False),
        (False, False, False, 1, 0, (), False, False), (True, True, True, 1, 1, ones1, False, False),
        (True, False, False, 1, 0, (), False, False), (False, True, False, 32, 0, (), False, True),
        (True, True, True, 8, 4, (), False, True), (True, True, True, 1, 1, ones1, False, True)]:
    compile_(tri._voxelize_kernel, main_types, dict(HAS_LENGTHS=hl, HARD=hard, SEGMENTED=seg, PB=pb, BLOCK=1024,
             LOOKBACK=128, PUBLISH_INCLUSIVE=True, SNAP=min(pb, 8), BMAX=bmax, KEY64=key64, SEEN=True, CSR=csr), 16, ones)
rows_types = (["*fp32"] + ["*i32"] * 6 + ["*fp32", "*i32", "*i32"] + ["*i64"] * 4 + ["i32"] * 4 + ["fp32"] * 6
              + ["i32"] * 3)
for csr in (False, True):
    compile_(rows._voxel_rows_kernel, rows_types, dict(PB=32, CB=4, ROWS=16, SB=128, BMAX=8, C_EXACT=True, CSR=csr), 4)
    compile_(rows._voxel_rows_kernel, rows_types, dict(PB=8, CB=8, ROWS=16, SB=128, BMAX=0, C_EXACT=False, CSR=csr), 4)
    compile_(rows._voxel_rows_kernel, rows_types, dict(PB=1, CB=4, ROWS=16, SB=128, BMAX=1, C_EXACT=False, CSR=csr), 4,
             ("batch_size", "num_rows", "max_points", "max_voxels", "list_stride"))
compile_(rows._voxel_rows_kernel, rows_types, dict(PB=32, CB=4, ROWS=64, SB=128, BMAX=1, C_EXACT=True, CSR=False), 8)
compile_(rows._voxel_scatter_kernel, ["*i32"] * 5 + ["i32"], dict(BLOCK=1024, REVERSE=False), 4)
cells_types = ["*fp32", "*i64", "*i32"] + ["i32"] * 3 + ["fp32"] * 9 + ["i32"] * 3
for hl, bmax, ones in [(False, 1, ("batch_size", "gz")), (True, 4, ()), (True, 0, ()), (True, 1, ("batch_size",))]:
    compile_(tri._point_cells_kernel, cells_types, dict(HAS_LENGTHS=hl, BMAX=bmax, BLOCK=512), 4, ones)
print("compiled")
"""


def test_triton_kernels_compile_for_sm90():
    """The interpreter does not type-check like the compiler: compile the real kernels for sm_90
    ahead of time (no GPU needed; Triton ships ptxas)."""
    run_compiler_script(_AOT_SCRIPT, timeout=300)


@pytest.mark.gpu
@requires_cuda
def test_gpu_bad_lengths_device():
    pts = torch.zeros(5, 4, device="cuda")
    with pytest.raises(ValueError, match="lengths"):
        pcops.voxelize(pts, (0.1, 0.1, 0.1), (0, 0, 0, 1, 1, 1), 4, 10, lengths=torch.tensor([5]))
    with pytest.raises(ValueError, match="lengths"):
        pcops.dynamic_voxelize(pts, (0.1, 0.1, 0.1), (0, 0, 0, 1, 1, 1), lengths=torch.tensor([5]))


@pytest.mark.gpu
@requires_cuda
def test_gpu_cells_only_one_launch():
    """cells_only on CUDA: the reference's cells, in one kernel launch and no host sync."""
    from torch.profiler import ProfilerActivity, profile

    pts = random_cloud(120_000, seed=41)
    vs, pcr = SMALL["voxel_size"], SMALL["point_cloud_range"]
    lengths = torch.tensor([50_000, 70_000])
    exp = pcops.dynamic_voxelize(pts, vs, pcr, lengths, cells_only=True)
    gp, gl = pts.cuda(), lengths.cuda()
    assert torch.equal(pcops.dynamic_voxelize(gp, vs, pcr, gl, cells_only=True).cpu(), exp)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pcops.dynamic_voxelize(gp, vs, pcr, gl, cells_only=True)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels == ["_point_cells_kernel"], kernels
