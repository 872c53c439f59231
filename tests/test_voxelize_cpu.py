"""The CPU reference of pcops.voxelize / dynamic_voxelize against a frozen copy of the previous
reference (commit 9c83535, before the one-thread speed-up of issue #4): every output must stay
bit-identical (voxels compared as bits, so NaN features count too), on random clouds (caps hit,
batches, NaN/inf, fp16/bf16/fp64, C = 3..5, pad_to_max) and on the real KITTI scans."""

from typing import Sequence

import numpy as np
import pytest
import torch

from pcops.reference import voxelize as ref
from _util import generator

V1 = dict(
    voxel_size=(0.16, 0.16, 4.0),
    point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1),
    max_points_per_voxel=32,
    max_voxels=40000,
)
V3 = dict(
    voxel_size=(0.05, 0.05, 0.1), point_cloud_range=(0, -40, -3, 70.4, 40, 1), max_points_per_voxel=5, max_voxels=40000
)


# --- the previous reference, verbatim (sort + prefix count; gather through a slot table) ------


def grid_size(voxel_size: Sequence[float], point_cloud_range: Sequence[float]) -> tuple[int, int, int]:
    """``(gx, gy, gz)`` = ``round((range_max - range_min) / voxel_size)`` (as spconv and mmcv)."""
    return tuple(
        max(int(round((point_cloud_range[i + 3] - point_cloud_range[i]) / voxel_size[i])), 1) for i in range(3)
    )


def sample_ids(lengths: torch.Tensor | None, num_points: int, device) -> torch.Tensor:
    """``(N,)`` int64 sample of each point; points past ``lengths.sum()`` get ``B`` (out of range)."""
    if lengths is None:
        return torch.zeros(num_points, dtype=torch.int64, device=device)
    lengths = lengths.long()
    batch = lengths.numel()
    b = torch.repeat_interleave(torch.arange(batch, device=device), lengths.clamp_min(0))[:num_points]
    if b.numel() < num_points:
        b = torch.cat([b, b.new_full((num_points - b.numel(),), batch)])
    return b


def voxel_coords(
    points: torch.Tensor, voxel_size: Sequence[float], point_cloud_range: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cells (3, N) float32 (x, y, z), in_range (N,) bool)``; cells are only meaningful in range.

    ``cell >= 0`` needs no test: ``p >= range_min`` makes ``p - range_min >= 0`` exactly.
    """
    # (3, N) contiguous: the per-axis arithmetic then runs on contiguous rows (several times
    # faster on the CPU than broadcasting over (N, 3) with a stride of C)
    xyz = points[:, :3].t().float().contiguous()
    col = dict(dtype=torch.float32, device=points.device)
    lo = torch.tensor(point_cloud_range[:3], **col)[:, None]
    hi = torch.tensor(point_cloud_range[3:], **col)[:, None]
    vs = torch.tensor(voxel_size, **col)[:, None]
    grid = torch.tensor(grid_size(voxel_size, point_cloud_range), **col)[:, None]
    cell = torch.floor((xyz - lo) / vs)
    ok = (xyz >= lo) & (xyz < hi) & (cell < grid)
    return cell, ok[0] & ok[1] & ok[2]


def _take(t: torch.Tensor, index: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``t[index]`` along ``dim`` (``index_select``: several times faster than advanced indexing on the CPU)."""
    return t.index_select(dim, index)


_ROW_DTYPES = {4: torch.int32, 8: torch.int64, 16: torch.complex128}  # one element per row of that many bytes


def _take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` for a contiguous ``(R, C)`` ``t``; rows of 4, 8 or 16 bytes are copied as one
    element each (a plain bit copy: ~3x faster than ``index_select`` of short rows on the CPU)."""
    row_dtype = _ROW_DTYPES.get(t.shape[1] * t.element_size())
    if row_dtype is None or not t.is_contiguous():
        return _take(t, index)
    return _take(t.view(row_dtype).view(-1), index).view(t.dtype).view(-1, t.shape[1])


def _put(n: int, index: torch.Tensor, values: torch.Tensor, fill) -> torch.Tensor:
    """A ``(n,)`` tensor of ``fill`` with ``out[index] = values`` (distinct indices)."""
    return torch.full((n,), fill, dtype=values.dtype, device=values.device).scatter_(0, index, values)


def _fcfs(points, voxel_size, point_cloud_range, lengths):
    """Voxel numbering in first-point order.

    Returns ``(idx (K,) in-range point indices ascending, vid (K,) voxel of each in first-point
    order, rank (K,) rank in its voxel in point order, count (V,) points per voxel,
    vb (V,) sample of each voxel, vcell (3, V) int (x, y, z) of each voxel, b (K,) sample of
    each in-range point)``.
    """
    gx, gy, gz = grid_size(voxel_size, point_cloud_range)
    batch = 1 if lengths is None else lengths.numel()
    device = points.device
    cell, ok = voxel_coords(points, voxel_size, point_cloud_range)
    if lengths is not None:
        b_all = sample_ids(lengths, points.shape[0], device)
        ok = ok & (b_all < batch)
    idx = ok.nonzero().squeeze(1)
    c = _take(cell, idx, 1).to(torch.int32)  # (3, K) x, y, z
    # packed key ((b * gz + z) * gy + y) * gx + x; int32 (a faster sort) when it fits
    if batch * gx * gy * gz >= 2**31:
        c = c.long()
    key = (c[2] * gy + c[1]) * gx + c[0]
    if lengths is not None:
        b = _take(b_all, idx)
        key = key + b.to(key.dtype) * (gx * gy * gz)
    else:
        b = None  # one sample
    sk, perm = torch.sort(key, stable=True)  # runs of equal keys, each run in point order
    num = sk.numel()
    head = torch.ones(num, dtype=torch.bool, device=device)
    head[1:] = sk[1:] != sk[:-1]
    run = torch.cumsum(head, 0) - 1  # run (voxel in key order) of each sorted position
    heads = head.nonzero().squeeze(1)
    first_pos = _take(perm, heads)  # position (in idx) of each voxel's first point, key order
    count = torch.diff(heads, append=heads.new_tensor([num]))
    # number the voxels by first point: a prefix count of the "first point" flags (no sort)
    nv = first_pos.numel()
    is_first = torch.zeros(num, dtype=torch.bool, device=device).index_fill_(0, first_pos, True)
    vid_of_run = (torch.cumsum(is_first, 0) - 1).index_select(0, first_pos)
    order = _put(nv, vid_of_run, torch.arange(nv, device=device), 0)  # voxel (key order) of each vid
    rank_sorted = torch.arange(num, device=device) - _take(heads, run)
    vid = _put(num, perm, _take(vid_of_run, run), 0)
    rank = _put(num, perm, rank_sorted, 0)
    fpos = _take(first_pos, order)
    vb = torch.zeros(nv, dtype=torch.int64, device=device) if b is None else _take(b, fpos)
    return idx, vid, rank, _take(count, order), vb, _take(c, fpos, 1), b


def _per_sample(b: torch.Tensor | None, batch: int, total: int, device) -> torch.Tensor:
    """``(B,)`` int64 count of entries per sample (``b is None``: one sample of ``total``)."""
    if b is None:
        return torch.full((1,), total, dtype=torch.int64, device=device)
    return torch.bincount(b, minlength=batch)[:batch]


def _coords(vb: torch.Tensor, vcell: torch.Tensor, rows: int) -> torch.Tensor:
    """``(rows, 4)`` int32 ``(b, z, y, x)``: the voxels first, then −1 rows."""
    coords = torch.full((rows, 4), -1, dtype=torch.int32, device=vb.device)
    m = vb.numel()
    coords[:m, 0] = vb
    coords[:m, 1:] = vcell.flip(0).t()
    return coords


def voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    max_points_per_voxel: int,
    max_voxels: int,
    pad_to_max: bool,
):
    """Hard voxelization; see ``pcops.voxelize`` for the contract.

    Returns ``(voxels, coords, num_points, point_to_voxel, num_voxels, num_dropped_points,
    num_dropped_voxels)``; the last three are ``(B,)`` int64.
    """
    n, num_channels = points.shape
    device = points.device
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, rank, count, vb, vcell, b = _fcfs(points, voxel_size, point_cloud_range, lengths)
    nvox = _per_sample(vb, batch, vb.numel(), device)  # voxels are sample-major
    start = torch.cumsum(nvox, 0) - nvox
    local = torch.arange(vb.numel(), device=device) - _take(start, vb)
    keep_v = local < max_voxels
    kv = keep_v.nonzero().squeeze(1)
    m = kv.numel()
    row_of_vid = (torch.cumsum(keep_v, 0) - 1).where(keep_v, -1)
    keep_p = (_take(row_of_vid, vid) >= 0) & (rank < max_points_per_voxel)
    kp = keep_p.nonzero().squeeze(1)
    kidx, krow, krank = _take(idx, kp), _take(row_of_vid, _take(vid, kp)), _take(rank, kp)

    point_to_voxel = _put(n, kidx, krow, -1)
    total = batch * max_voxels if pad_to_max else m
    # gather through a slot table (N = a zero row): cheaper than zero-fill + scatter
    slot = _put(total * max_points_per_voxel, krow * max_points_per_voxel + krank, kidx, n)
    padded = torch.cat([points, points.new_zeros((1, num_channels))])
    voxels = _take_rows(padded, slot).view(total, max_points_per_voxel, num_channels)
    coords = _coords(_take(vb, kv), _take(vcell, kv, 1), total)
    num_points = torch.zeros(total, dtype=torch.int32, device=device)
    num_points[:m] = _take(count, kv).clamp(max=max_points_per_voxel)

    num_voxels = nvox.clamp(max=max_voxels)
    num_dropped_voxels = nvox - num_voxels
    in_range = _per_sample(b, batch, idx.numel(), device)
    kept = _per_sample(None if b is None else _take(b, kp), batch, kp.numel(), device)
    return voxels, coords, num_points, point_to_voxel, num_voxels, in_range - kept, num_dropped_voxels


def dynamic_voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    pad_to_max: bool,
):
    """Dynamic voxelization (no caps); see ``pcops.dynamic_voxelize``.

    Returns ``(point_to_voxel (N,) int64, coords (M or N, 4) int32, num_voxels (B,) int64)``.
    """
    n = points.shape[0]
    batch = 1 if lengths is None else lengths.numel()
    idx, vid, rank, count, vb, vcell, b = _fcfs(points, voxel_size, point_cloud_range, lengths)
    point_to_voxel = _put(n, idx, vid, -1)
    coords = _coords(vb, vcell, n if pad_to_max else vb.numel())
    num_voxels = _per_sample(vb, batch, vb.numel(), points.device)
    return point_to_voxel, coords, num_voxels


# --- comparisons ------------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return (
        t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
        if t.is_floating_point()
        else t
    )


def assert_bit_identical(new, old):
    assert len(new) == len(old)
    for i, (a, b) in enumerate(zip(new, old)):
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(_bits(a), _bits(b)), f"output {i} differs"


def check(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, path="default"):
    """``path``: a key of ``PATHS`` (the reference's way of finding first points) or "default"."""
    kw = {} if path == "default" else dict(table_cells_per_point=PATHS[path])
    before = points.clone()
    for pad in (False, True):
        assert_bit_identical(
            ref.voxelize(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad, **kw),
            voxelize(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad),
        )
        assert_bit_identical(
            ref.dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad, **kw),
            dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad),
        )
    assert torch.equal(_bits(points), _bits(before)), "points were modified"


def random_case(seed):
    g = generator(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    n = r(0, 3000) if seed % 5 else r(0, 20)
    channels = 3 + seed % 3
    dtype = (torch.float32, torch.float16, torch.bfloat16, torch.float64)[seed % 7 % 4]
    pts = torch.rand(n, channels, generator=g) * 6 - 0.5
    if n > 10:  # NaN / inf coordinates (out of range) and a NaN feature (copied)
        k = torch.randint(0, n, (5,), generator=g).tolist()
        pts[k[0], 0], pts[k[1], 1], pts[k[2], 2] = float("nan"), float("inf"), float("-inf")
        pts[k[3]] = float("nan")
        pts[k[4], channels - 1] = float("nan")
    voxel_size = tuple((torch.rand(3, generator=g) * 1.2 + 0.05).tolist())
    lengths = None
    if seed % 3 == 0:
        cuts = sorted(torch.randint(0, n + 1, (r(0, 4),), generator=g).tolist())
        lengths = torch.tensor([b - a for a, b in zip([0] + cuts, cuts + [n])])
    return pts.to(dtype), lengths, voxel_size, (0, 0.1, -0.2, 4.0, 4.5, 3.0), r(1, 6), r(1, 60)


PATHS = {"table": 10**9, "sort": 0}  # table_cells_per_point forcing each way of finding first points


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", range(120))
def test_random_clouds_bit_identical(seed, path):
    check(*random_case(seed), path=path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [0, 1, 2, 3])
@pytest.mark.parametrize("channels", [3, 4])
def test_tiny_clouds_bit_identical(n, channels, path):
    pts = torch.rand(n, channels, generator=generator(n)) * 4  # (1, C): points[:, :3].t() is contiguous
    check(pts, None, (0.7, 0.9, 0.6), (0, 0, 0, 4, 4.5, 1.8), 2, 3, path)
    check(pts, torch.tensor([n]), (0.7, 0.9, 0.6), (0, 0, 0, 4, 4.5, 1.8), 1, 1, path)


@pytest.mark.parametrize("path", PATHS)
def test_boundary_values_bit_identical(path):
    # on range_min / range_max, -0.0, negative denormals at range_min = 0 with voxels > 1 m (the
    # quotient underflows to -0.0), cell edges and the last cell, NaN / inf
    tiny = torch.finfo(torch.float32).smallest_normal
    vals = [
        0.0,
        -0.0,
        -1e-45,
        -tiny,
        1e-45,
        tiny,
        2.0,
        2.5,
        3.0,
        4.0 - 1e-6,
        4.0,
        4.5,
        6.0 - 2e-6,
        6.0,
        1.0,
        float("nan"),
        float("inf"),
        -float("inf"),
    ]
    v = torch.tensor(vals)
    pts = torch.stack(torch.meshgrid(v, v, v, indexing="ij"), -1).reshape(-1, 3)
    pts = torch.cat([pts, torch.arange(len(pts), dtype=torch.float32)[:, None]], 1)
    check(pts, None, (2.0, 1.5, 0.5), (0, 0, 0, 4, 4.5, 6), 3, 1000, path)
    check(pts, None, (0.5, 1.5, 2.5), (0, 0, 0, 4, 4.5, 6), 2, 50, path)


def test_int64_keys_bit_identical():
    # grid 2000^3 x batch 2 >= 2^31: the packed key is int64
    pts = torch.rand(5000, 4, generator=generator(7)) * 2.2
    check(pts, torch.tensor([2000, 3000]), (0.001, 0.001, 0.001), (0, 0, 0, 2, 2, 2), 2, 100)


@pytest.mark.parametrize("path", PATHS)
def test_many_voxels_bit_identical(path):
    # more than 2^15 voxels: the voxel numbers are sorted as int32, not int16
    pts = torch.rand(40000, 4, generator=generator(11)) * 4
    assert ref.dynamic_voxelize(pts, None, (0.02, 0.02, 0.5), (0, 0, 0, 4, 4, 4), False)[1].shape[0] > 2**15
    check(pts, None, (0.02, 0.02, 0.5), (0, 0, 0, 4, 4, 4), 2, 30000, path)


def _scan(kitti_dir, frame):
    return torch.from_numpy(np.fromfile(kitti_dir / "velodyne" / f"{frame}.bin", dtype=np.float32).reshape(-1, 4))


@pytest.mark.parametrize("cfg,path", [(V1, "default"), (V1, "sort"), (V3, "default")], ids=["V1", "V1-sort", "V3"])
def test_kitti_bit_identical(kitti_dir, cfg, path):
    # by default V1 (214k cells) takes the table, V3 (90M cells) the sort
    one, zero = _scan(kitti_dir, "000001"), _scan(kitti_dir, "000000")
    args = (cfg["voxel_size"], cfg["point_cloud_range"], cfg["max_points_per_voxel"])
    for pts, lengths in (
        (one, None),
        (one.half(), None),
        (torch.cat([one, zero]), torch.tensor([len(one), len(zero)])),
    ):
        for max_voxels in (cfg["max_voxels"], 3000):
            check(pts, lengths, *args, max_voxels, path)


# --- the numba CPU path (pcops.cpu.voxelize) against the reference -----------------------------


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def cpu_threads(request, monkeypatch):
    """Run the test at one and at two threads (the results must not depend on the count); at two,
    clouds of any size take the parallel phases."""
    pytest.importorskip("numba")
    from pcops.cpu import voxelize as cpu

    monkeypatch.setattr(cpu, "PARALLEL_MIN_POINTS", 4096)
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def check_cpu(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels):
    """``pcops.cpu.voxelize`` (hard, both forms; dynamic, both forms) equals the reference bit for bit."""
    from pcops.cpu import voxelize as cpu

    before = points.clone()
    for pad in (False, True):
        args = (points, lengths, voxel_size, point_cloud_range)
        assert_bit_identical(
            cpu.voxelize(*args, max_points_per_voxel, max_voxels, pad),
            ref.voxelize(*args, max_points_per_voxel, max_voxels, pad),
        )
        assert_bit_identical(cpu.dynamic_voxelize(*args, pad), ref.dynamic_voxelize(*args, pad))
    assert torch.equal(_bits(points), _bits(before)), "points were modified"


@pytest.mark.parametrize("seed", range(60))
def test_cpu_random_clouds(cpu_threads, seed):
    # uneven batches (empty samples too), caps hit, NaN/inf, all float dtypes, C = 3..5
    check_cpu(*random_case(seed))


def test_cpu_duplicates_and_caps(cpu_threads):
    g = generator(3)
    pts = (torch.rand(4000, 4, generator=g) * 3).round()  # few distinct points, many duplicates
    pts = torch.cat([pts, pts.flip(0)])
    for maxp, maxv in ((1, 1), (2, 5), (32, 10), (200, 1000)):
        check_cpu(pts, torch.tensor([0, 3000, 5000, 0]), (1.0, 1.0, 1.0), (0, 0, 0, 3, 3, 3), maxp, maxv)


@pytest.mark.parametrize("n", [0, 1, 2, 5000])
def test_cpu_sizes_and_empty_samples(cpu_threads, n):
    # 5,000 points: above the threshold where the cells and the copy run in parallel
    pts = torch.rand(n, 4, generator=generator(n)) * 4
    check_cpu(pts, None, (0.7, 0.9, 0.6), (0, 0, 0, 4, 4.5, 1.8), 2, 3)
    check_cpu(pts, torch.tensor([n]), (0.7, 0.9, 0.6), (0, 0, 0, 4, 4.5, 1.8), 1, 1)
    check_cpu(pts, torch.tensor([0, n, 0]), (0.1, 0.1, 0.1), (0, 0, 0, 4, 4.5, 1.8), 3, 400)


def test_cpu_boundary_values(cpu_threads):
    tiny = torch.finfo(torch.float32).smallest_normal
    vals = [0.0, -0.0, -1e-45, -tiny, 1e-45, tiny, 2.0, 2.5, 3.0, 4.0 - 1e-6, 4.0, 4.5, 6.0 - 2e-6, 6.0, 1.0]
    vals += [float("nan"), float("inf"), -float("inf")]
    v = torch.tensor(vals)
    pts = torch.stack(torch.meshgrid(v, v, v, indexing="ij"), -1).reshape(-1, 3)
    pts = torch.cat([pts, torch.arange(len(pts), dtype=torch.float32)[:, None]], 1)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        check_cpu(pts.to(dtype), None, (2.0, 1.5, 0.5), (0, 0, 0, 4, 4.5, 6), 3, 1000)
        check_cpu(pts.to(dtype), None, (0.5, 1.5, 2.5), (0, 0, 0, 4, 4.5, 6), 2, 50)
    # float64 coordinates that round to the range's float32 bounds, and a range that is not a
    # float32 value (rounded the same way on both paths)
    d = torch.tensor([[0.1, 0.2, 0.3], [0.09999999999, 0.2, 0.3], [3.3, 4.4999999999, 1.1]], dtype=torch.float64)
    check_cpu(d, None, (0.1, 0.3, 0.7), (0.1, 0.2, 0.3, 3.3, 4.5, 1.7), 2, 10)


def test_cpu_int64_keys_and_many_voxels(cpu_threads):
    pts = torch.rand(5000, 4, generator=generator(7)) * 2.2
    check_cpu(pts, torch.tensor([2000, 3000]), (0.001, 0.001, 0.001), (0, 0, 0, 2, 2, 2), 2, 100)
    # more voxels than the hash table's first size: it grows several times
    pts = torch.rand(40000, 4, generator=generator(11)) * 4
    check_cpu(pts, None, (0.02, 0.02, 0.5), (0, 0, 0, 4, 4, 4), 2, 30000)


def test_cpu_routing(caplog):
    """``backend="auto"`` on CPU tensors runs the numba path where numba imports, ``"reference"`` the
    reference; both return the same."""
    import logging

    import pcops
    from pcops.cpu import numba_available

    pts = torch.rand(300, 4, generator=generator(5)) * 4
    args = ((0.5, 0.5, 0.5), (0, 0, 0, 4, 4, 4))
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        a = pcops.voxelize(pts, *args, 3, 20)
        d = pcops.dynamic_voxelize(pts, *args)
    expected = "cpu hash map (numba)" if numba_available() else "reference"
    assert f"voxelize: {expected}" in caplog.text and f"dynamic_voxelize: {expected}" in caplog.text
    assert_bit_identical(a, pcops.voxelize(pts, *args, 3, 20, backend="reference"))
    assert_bit_identical(d, pcops.dynamic_voxelize(pts, *args, backend="reference"))
    with pytest.raises(ValueError, match="backend"):
        pcops.voxelize(pts, *args, 3, 20, backend="triton")


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [V1, V3], ids=["V1", "V3"])
def test_cpu_kitti(kitti_dir, cpu_threads, cfg):
    one, zero = _scan(kitti_dir, "000001"), _scan(kitti_dir, "000000")
    args = (cfg["voxel_size"], cfg["point_cloud_range"], cfg["max_points_per_voxel"])
    for pts, lengths in (
        (one, None),
        (one.half(), None),
        (torch.cat([one, zero]), torch.tensor([len(one), len(zero)])),
    ):
        for max_voxels in (cfg["max_voxels"], 3000):
            check_cpu(pts, lengths, *args, max_voxels)
