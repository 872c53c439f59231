"""pcops.fps: farthest point sampling — reference vs Triton/CUDA, registration, backends, bad input."""

import logging

import numpy as np
import pytest
import torch

import pcops
from pcops.reference import fps as ref

from _clouds import cached_reference, load_scan_xyz, make_clouds, tie_grid_clouds
from _util import generator, interpret, requires_cuda, run_compiler_script


def fps_oracle(points, m, start):
    """Sequential numpy FPS for one cloud (float32 arithmetic as the op)."""
    p = points.numpy().astype(np.float32)
    n = p.shape[0]
    out = [start]
    min_d = np.full(n, np.inf, dtype=np.float32)
    for _ in range(min(m, n) - 1):
        d = p - p[out[-1]]
        min_d = np.minimum(min_d, d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2])
        min_d[out] = -1
        out.append(int(np.argmax(min_d)))
    return out + [-1] * (m - len(out))


# --- the op on the CPU (reference) ---------------------------------------------------------


@pytest.mark.parametrize("batch,n,m", [(1, 1, 1), (1, 1, 4), (2, 13, 5), (3, 31, 31), (2, 97, 40), (1, 0, 3)])
def test_fps_matches_sequential_oracle(batch, n, m):
    pts, lengths = make_clouds(batch, n, seed=n + m)
    start = torch.randint(0, max(1, n), (batch,), generator=generator(1)) % lengths.clamp_min(1)
    out = pcops.farthest_point_sample(pts, m, lengths=lengths, start_idx=start)
    assert out.shape == (batch, m) and out.dtype == torch.int64
    for b in range(batch):
        length = int(lengths[b])
        expected = fps_oracle(pts[b, :length], m, int(start[b])) if length else [-1] * m
        assert out[b].tolist() == expected


def test_fps_unbatched_and_fewer_points_than_samples():
    pts, _ = make_clouds(1, 6, seed=2)
    out = pcops.farthest_point_sample(pts[0], 9)
    assert out.shape == (9,)
    assert sorted(out[:6].tolist()) == list(range(6)) and out[6:].tolist() == [-1] * 3


def test_fps_duplicates_distinct_and_lowest_index():
    # four copies of two points: after 0, the farthest is the lowest-index copy of the other point
    pts = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 0, 0]])
    out = pcops.farthest_point_sample(pts, 6)
    assert out.tolist() == [0, 1, 2, 3, 4, 5]
    out = pcops.farthest_point_sample(pts, 3, start_idx=3)
    assert out.tolist() == [3, 0, 1]


def test_fps_float16_and_float64_inputs():
    pts, lengths = make_clouds(2, 40, seed=3)
    expected = pcops.farthest_point_sample(pts.half().float(), 12, lengths)
    assert torch.equal(pcops.farthest_point_sample(pts.half(), 12, lengths), expected)
    assert torch.equal(
        pcops.farthest_point_sample(pts.double(), 12, lengths), pcops.farthest_point_sample(pts, 12, lengths)
    )


def test_fps_invariant_on_kitti(kitti_dir):
    raw = np.fromfile(kitti_dir / "velodyne" / "000001.bin", dtype=np.float32).reshape(-1, 4)
    pts = torch.from_numpy(raw[:, :3].copy())
    m = 48
    out = pcops.farthest_point_sample(pts, m)
    assert len(set(out.tolist())) == m
    check_fps_invariant(pts, out)


def check_fps_invariant(pts, out, tol=1e-5):
    """Each chosen point is (within float32 rounding) the farthest from the ones chosen before."""
    p = pts.double()
    min_d = torch.full((p.shape[0],), float("inf"), dtype=torch.float64, device=p.device)
    for s, i in enumerate(out.tolist()):
        if s:
            best = float(min_d.max())
            assert float(min_d[i]) >= best * (1 - tol) - 1e-9, f"step {s}: {float(min_d[i])} < max {best}"
        min_d = torch.minimum(min_d, ((p - p[i]) ** 2).sum(1))


def test_reference_backend_and_direct_op_backends():
    pts, lengths = make_clouds(2, 40, seed=13)
    auto = pcops.farthest_point_sample(pts, 9, lengths)
    assert torch.equal(pcops.farthest_point_sample(pts, 9, lengths, backend="reference"), auto)
    start = torch.zeros(2, dtype=torch.int64)
    for backend in ("triton", "cuda"):  # no silent fallback to the CPU path
        with pytest.raises(ValueError, match="CUDA tensors only"):
            pcops.farthest_point_sample(pts, 9, lengths, backend=backend)
        with pytest.raises(ValueError, match="CUDA tensors only"):
            torch.ops.pcops.farthest_point_sample(pts, lengths, start, 9, backend)


def test_fps_logs_the_kernel(caplog):
    from pcops.cpu import numba_available

    pts, lengths = make_clouds(1, 20, seed=14)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.farthest_point_sample(pts, 4, lengths)
    expected = "cpu bucket FPS (numba)" if numba_available() else "reference"
    assert f"farthest_point_sample: {expected}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.farthest_point_sample(pts, 4, lengths, backend="reference")
    assert "farthest_point_sample: reference" in caplog.text


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])])
def test_opcheck(device):
    pts, lengths = make_clouds(2, 11, seed=10, device=device)
    start = torch.zeros(2, dtype=torch.int64, device=device)
    backends = ("auto", "reference") + (("triton", "cuda") if device == "cuda" else ())
    for backend in backends:
        torch.library.opcheck(torch.ops.pcops.farthest_point_sample, (pts, lengths, start, 5, backend))


P3 = torch.zeros(2, 5, 3)


@pytest.mark.parametrize(
    "call,exc,name",
    [
        (lambda: pcops.farthest_point_sample(torch.zeros(2, 5, 2), 3), ValueError, "points"),
        (lambda: pcops.farthest_point_sample(torch.zeros(2, 5, 3, dtype=torch.int32), 3), TypeError, "points"),
        (lambda: pcops.farthest_point_sample(P3, 0), ValueError, "num_samples"),
        (lambda: pcops.farthest_point_sample(P3, 2.0), TypeError, "num_samples"),
        (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([6, 1])), ValueError, "lengths"),
        (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5, -1])), ValueError, "lengths"),
        (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5])), ValueError, "lengths"),
        (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5.0, 1.0])), TypeError, "lengths"),
        (lambda: pcops.farthest_point_sample(P3, 3, start_idx=5), ValueError, "start_idx"),
        (
            lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5, 2]), start_idx=torch.tensor([0, 2])),
            ValueError,
            "start_idx",
        ),
        (lambda: pcops.farthest_point_sample(P3, 3, backend="cpp"), ValueError, "backend"),
        (lambda: pcops.farthest_point_sample(P3, 3, backend=None), TypeError, "backend"),
    ],
)
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


@pytest.mark.gpu
@requires_cuda
def test_wrong_devices():
    with pytest.raises(ValueError, match="lengths"):
        pcops.farthest_point_sample(P3.cuda(), 2, torch.tensor([5, 5]))


# --- the CPU bucket FPS (pcops.cpu.fps, numba) against the reference ------------------------


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def cpu_threads(request):
    """Run the test at one and at two threads (the results must not depend on the count)."""
    pytest.importorskip("numba")
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def cpu_fps_cases():
    """(points, lengths, start, M): uneven batches, ties (duplicates, lattices, a coarse grid),
    M > N, empty clouds, N = 0, starts anywhere in each cloud; big enough for several tree levels."""
    g = generator(20)
    cases = []
    for batch, n, m, kw in [
        (1, 1, 3, {}),
        (3, 31, 40, dict(duplicates=True)),
        (4, 700, 300, {}),
        (3, 2049, 2049, dict(duplicates=True)),
        (5, 1500, 900, dict(scale=50.0)),
        (2, 0, 4, {}),
    ]:
        pts, lengths = make_clouds(batch, n, seed=n + m, **kw)
        if batch > 2:
            lengths[1] = 0  # an empty cloud inside a batch
        start = torch.randint(0, max(n, 1), (batch,), generator=g) % lengths.clamp_min(1)
        cases.append((pts, lengths, start, m))
    pts, lengths = tie_grid_clouds(3, 1200, seed=4, device="cpu")  # 343 distinct points, many ties
    cases.append((pts, lengths, torch.tensor([0, 5, 17]) % lengths, 500))
    pts = lattice_clouds(2, (12, 10, 9), seed=5)  # equal distances at every level of the tree
    cases.append((pts, torch.tensor([1080, 777]), torch.tensor([3, 700]), 1080))
    return cases


def test_cpu_fps_matches_reference(cpu_threads):
    from pcops.cpu import fps as cpu_fps

    for pts, lengths, start, m in cpu_fps_cases():
        expected = ref.farthest_point_sample(pts, lengths, start, m)
        assert torch.equal(cpu_fps.farthest_point_sample(pts, lengths, start, m), expected), (pts.shape, m)
        assert torch.equal(pcops.farthest_point_sample(pts, m, lengths, start), expected)


def test_cpu_fps_invalid_start_and_non_finite(cpu_threads):
    """Through the op itself (the public function refuses these): a start outside the cloud gives a
    row of −1; NaN/inf coordinates follow the policy (absent, ``pcops._finite``) and the CPU kernel
    called directly on them gives what the reference gives."""
    from pcops import _finite
    from pcops.cpu import fps as cpu_fps

    pts, lengths = make_clouds(5, 300, seed=21)
    lengths[:] = torch.tensor([300, 148, 200, 187, 300])
    start = torch.tensor([0, 5, 0, 250, -1])  # clouds 3 and 4: outside [0, length)
    pts[0, 17, 1] = float("nan")  # once chosen, every distance is NaN: repeats and padding follow
    pts[1, 5, 0] = float("inf")
    pts[1, 9, 0] = float("inf")  # inf - inf: NaN distances from the start on
    pts[2, 250, 2] = float("nan")  # in the padding: the reference still reaches it
    for p, l_, s in [(pts, lengths, start), (pts[1:2], lengths[1:2], torch.tensor([9]))]:
        expected = ref.farthest_point_sample(p, l_, s, 220)
        assert torch.equal(cpu_fps.farthest_point_sample(p, l_, s, 220), expected)
        policy = _finite.fps(ref.farthest_point_sample, p, l_, s, 220)
        assert torch.equal(torch.ops.pcops.farthest_point_sample(p, l_, s, 220, "auto"), policy)
    pts[:, :, :] = torch.nan_to_num(pts)
    pts[3, 40] = float("-inf")  # a finite-only tree elsewhere, brute force here
    start[3:] = 40
    expected = ref.farthest_point_sample(pts, lengths, start, 300)
    assert torch.equal(cpu_fps.farthest_point_sample(pts, lengths, start, 300), expected)
    policy = _finite.fps(ref.farthest_point_sample, pts, lengths, start, 300)
    assert torch.equal(torch.ops.pcops.farthest_point_sample(pts, lengths, start, 300, "auto"), policy)


def test_cpu_fps_kitti_subset(cpu_threads):
    """One F1-like cloud (16,384 points of the KITTI scan), 1,024 samples: identical to the reference."""
    start = torch.tensor([0, 8191])

    def build():
        clouds = f1_like_clouds(load_scan_xyz(), batch=2)
        return clouds, ref.farthest_point_sample(clouds, torch.full((2,), clouds.shape[1]), start, 1024)

    clouds, expected = cached_reference(("cpu kitti", 1024), build)
    assert torch.equal(pcops.farthest_point_sample(clouds, 1024, start_idx=start), expected)


# --- Triton kernels under the CPU interpreter (tiny inputs) -----------------------------------


@pytest.mark.parametrize("batch,n,m", [(1, 1, 2), (2, 13, 6), (2, 64, 64)])
@pytest.mark.parametrize("stream", [False, True])
@interpret
def test_triton_fps_interpreter(batch, n, m, stream):
    from pcops.triton import fps as tri

    # stream: the large-cloud kernel, with chunks smaller than the cloud
    opts = dict(reg_max=0, chunk=16) if stream else {}
    pts, lengths = make_clouds(batch, n, seed=n, duplicates=n > 20)
    start = (torch.arange(batch) * 5) % lengths.clamp_min(1)
    start[-1] = 7 if n > 7 else start[-1]
    expected = ref.farthest_point_sample(pts, lengths, start, m)
    assert torch.equal(tri.farthest_point_sample(pts, lengths, start, m, **opts), expected)
    bad = torch.full((batch,), n + 3, dtype=torch.int64)  # invalid start: rows of -1 on both paths
    assert torch.equal(
        tri.farthest_point_sample(pts, lengths, bad, m, **opts), ref.farthest_point_sample(pts, lengths, bad, m)
    )


# --- the CUDA C++ kernel: its plan and its source, no GPU needed ----------------------------


def test_cluster_size_and_kernel_names():
    from pcops.cuda import fps as cu

    assert cu.cluster_size(1) == 1 and cu.cluster_size(16384) == 1  # F1: one CTA per cloud
    assert cu.cluster_size(16385) == 2 and cu.cluster_size(40000) == 4
    assert cu.cluster_size(120268) == 8  # F2: 8 CTAs of 15,034 points
    assert cu.cluster_size(131072) == 8 and cu.cluster_size(131073) is None
    assert [cu.kernel_name(c) for c in cu.CLUSTERS] == [
        "fps_tile_md_sk_u1_c1",
        "fps_tile_md_esk_u2_c2",
        "fps_tile_md_esk_u2_c4",
        "fps_tile_md_esk_u2_c8",
    ]
    # clouds the kernel cannot hold are refused before touching the device
    assert "131072" in cu.unsupported_reason(torch.zeros(1, 131073, 3))
    assert "65535" in cu.unsupported_reason(torch.zeros(65536, 1, 3))


def test_fps_cu_compiles_with_its_entry_points():
    """csrc/fps.cu compiles for sm_90 with NVRTC and holds exactly the kernels the launcher names."""
    from pcops import _nvrtc
    from pcops.cuda import fps as cu

    try:
        cubin = _nvrtc.compile_source((_nvrtc.CSRC_DIR / "fps.cu").read_text(), "fps.cu", "sm_90")
    except RuntimeError as e:
        if "NVRTC not found" in str(e):
            pytest.skip(str(e))
        raise
    names = {cu.kernel_name(c) for c in cu.CLUSTERS} | {"fps_morton_keys", "fps_morton_keys32"}
    assert cubin_kernels(cubin) == names


def cubin_kernels(cubin: bytes) -> set:
    """Kernel names of an ELF CUBIN: its ``.text.<name>`` sections (one per entry point)."""
    import struct

    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    names = [cubin[strtab + h[0] : cubin.index(b"\0", strtab + h[0])].decode() for h in headers]
    return {n[len(".text.") :] for n in names if n.startswith(".text.")}


def morton_permutation(p):
    """numpy: indices of ``p (N, 3)`` in Morton order of 10-bit cells of its box (any order is exact)."""
    cells = np.clip(((p - p.min(0)) / np.maximum(p.max(0) - p.min(0), 1e-6) * 1023).astype(np.int64), 0, 1023)
    code = np.zeros(p.shape[0], dtype=np.int64)
    for bit in range(10):
        for axis in range(3):
            code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
    return np.argsort(code, kind="stable")


def tile_fps_model(points, m, start, cluster, warps=16):
    """A numpy model of csrc/fps.cu's fps_tile_md kernel for one cloud: Morton-sorted points split
    over ``cluster`` CTAs; in each, 32-point groups dealt round-robin to ``warps`` warps, each group
    with a box and its maximum min-distance; only groups whose box is not farther than that maximum
    update; a warp recomputes its record (max, lowest original index among its groups holding the
    max) only if one of its groups updated, else republishes it; the records of all warps of all
    CTAs are reduced to (largest distance, lowest index). Returns (indices, fraction of group updates)."""
    p = points.numpy().astype(np.float32)
    n = p.shape[0]
    perm = morton_permutation(p)
    s = p[perm]
    share = -(-n // cluster)
    # groups of every CTA: (rank, first sorted position, end), the warp that owns each
    groups, owner = [], []
    for rank in range(cluster):
        lo, hi = rank * share, min((rank + 1) * share, n)
        for g, g0 in enumerate(range(lo, hi, 32)):
            groups.append(slice(g0, min(g0 + 32, hi)))
            owner.append((rank, g % warps))
    lo_box = np.stack([s[g].min(0) for g in groups])
    hi_box = np.stack([s[g].max(0) for g in groups])
    gmax = np.full(len(groups), np.inf, dtype=np.float32)
    min_d = np.full(n, np.inf, dtype=np.float32)
    warp_groups: dict = {}
    for g, w in enumerate(owner):
        warp_groups.setdefault(w, []).append(g)
    records = {w: (-1.0, -1, None) for w in warp_groups}
    out, sel, updates = [start], start, 0
    for _ in range(min(m, n) - 1):
        c = p[sel]
        gap = np.maximum(np.maximum(lo_box - c, c - hi_box), np.float32(0))
        lower = (gap[:, 0] * gap[:, 0] + gap[:, 1] * gap[:, 1]) + gap[:, 2] * gap[:, 2]
        need = ~(lower > gmax)
        updates += int(need.sum())
        for g in np.flatnonzero(need):
            sl = groups[g]
            d = s[sl] - c
            upd = np.minimum(min_d[sl], (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2])
            upd[perm[sl] == sel] = -1
            min_d[sl] = upd
            gmax[g] = upd.max()
        for w, gs in warp_groups.items():
            if not need[gs].any():
                continue  # republished unchanged
            best = gmax[gs].max()
            if best < 0:
                records[w] = (-1.0, -1, None)
                continue
            cands = [int(perm[groups[g]][min_d[groups[g]] == best].min()) for g in gs if gmax[g] == best]
            records[w] = (best, min(cands), None)
        best = max(r[0] for r in records.values())
        sel = min(r[1] for r in records.values() if r[0] == best)
        out.append(sel)
    return out + [-1] * (m - len(out)), updates / max(1, len(groups) * (min(m, n) - 1))


@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_tile_fps_model_is_exact(kitti_dir, cluster):
    """fps_tile_md's bookkeeping (group boxes, cached warp records, the two-level reduction) changes no
    index, ties included (duplicated points), whatever the number of CTAs."""
    raw = np.fromfile(kitti_dir / "velodyne" / "000001.bin", dtype=np.float32).reshape(-1, 4)
    pts = torch.from_numpy(raw[torch.randperm(raw.shape[0], generator=generator(3))[:2500].numpy(), :3].copy())
    pts[1::4] = pts[0:-1:4][: pts[1::4].shape[0]]  # duplicates: exact ties
    got, updated = tile_fps_model(pts, 1300, 11, cluster)
    assert got == fps_oracle(pts, 1300, 11)
    assert updated < 0.3  # most group updates are skipped


# --- the GPU paths --------------------------------------------------------------------------


def fps_case(batch, n, m, seed=None, scale=10.0, duplicates=False):
    """GPU clouds (seeded as ``make_clouds``), start indices ``7 b mod length`` and the reference FPS."""
    seed = n if seed is None else seed

    def build():
        pts, lengths = make_clouds(batch, n, seed=seed, scale=scale, duplicates=duplicates, device="cuda")
        start = (torch.arange(batch, device="cuda") * 7) % lengths.clamp_min(1)
        return pts, lengths, start, ref.farthest_point_sample(pts, lengths, start, m)

    return cached_reference(("fps", batch, n, m, seed, scale, duplicates), build)


@pytest.mark.gpu
@requires_cuda
def test_gpu_reference_matches_cpu_reference():
    """The oracle is device independent: the reference gives identical results on CPU and GPU."""
    for batch, n, m, dup in [(3, 1000, 1000, True), (2, 4099, 512, False), (1, 40000, 64, False)]:
        pts, lengths, start, expected = fps_case(batch, n, m, duplicates=dup)
        assert torch.equal(expected.cpu(), ref.farthest_point_sample(pts.cpu(), lengths.cpu(), start.cpu(), m))


@pytest.mark.parametrize("backend", ["triton", "cuda", "auto"])
@pytest.mark.parametrize(
    "batch,n,m", [(1, 1, 3), (3, 1000, 200), (2, 4099, 512), (8, 16384, 64), (1, 40000, 64), (1, 120268, 32)]
)
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_matches_reference(backend, batch, n, m):
    pts, lengths, start, expected = fps_case(batch, n, m)
    got = pcops.farthest_point_sample(pts, m, lengths, start, backend=backend)
    assert torch.equal(got, expected)


@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_backends_choose_and_refuse(caplog):
    """ "auto" runs the CUDA kernel up to 131,072 points and Triton beyond; "cuda" beyond raises."""
    from pcops.cuda import fps as cu

    pts, lengths, start, expected = fps_case(2, 4099, 64)
    if not cu.supported(pts):
        pytest.skip(f"the CUDA kernel does not run here: {cu.unsupported_reason(pts)}")
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        assert torch.equal(pcops.farthest_point_sample(pts, 64, lengths, start), expected)
    assert "fps_tile_md_sk_u1_c1" in caplog.text
    big = torch.rand(1, 131073, 3, device="cuda")
    with pytest.raises(RuntimeError, match="131072"):
        pcops.farthest_point_sample(big, 8, backend="cuda")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        got = pcops.farthest_point_sample(big, 8)
    assert "triton _fps_stream_kernel" in caplog.text
    assert torch.equal(got, pcops.farthest_point_sample(big, 8, backend="triton"))
    assert torch.equal(pcops.farthest_point_sample(pts, 64, lengths, start, backend="reference"), expected)


@pytest.mark.parametrize("backend", ["triton", "cuda", "auto"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_duplicates(backend):
    # every point twice: from sample ~N/2 on, each step is a tie won by the lowest index
    pts, lengths, start, expected = fps_case(2, 4099, 2600, seed=1, scale=1.0, duplicates=True)
    assert torch.equal(pcops.farthest_point_sample(pts, 2600, lengths, start, backend=backend), expected)


def f1_like_clouds(scan, batch=8, n=16384, seed=0):
    """8 random 16,384-point subsets of SCAN, one permutation each (8 × 16,384 > 120,268: they overlap)."""
    g = generator(seed)
    return torch.stack([scan[torch.randperm(scan.shape[0], generator=g)[:n]] for _ in range(batch)])


@pytest.mark.parametrize("backend", ["triton", "cuda", "auto"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_kitti_matches_reference_and_invariant(backend):
    def build():
        scan_cpu = load_scan_xyz()
        scan, clouds = scan_cpu.cuda(), f1_like_clouds(scan_cpu).cuda()
        full = lambda p: torch.full((p.shape[0],), p.shape[1], device="cuda")  # noqa: E731
        zero = lambda p: torch.zeros(p.shape[0], dtype=torch.int64, device="cuda")  # noqa: E731
        return (
            scan,
            ref.farthest_point_sample(scan[None], full(scan[None]), zero(scan[None]), 256)[0],
            clouds,
            ref.farthest_point_sample(clouds, full(clouds), zero(clouds), 512),
        )

    scan, expected, clouds, expected_f1 = cached_reference("kitti", build)
    out = pcops.farthest_point_sample(scan, 1024, backend=backend)
    assert len(set(out.tolist())) == 1024
    assert torch.equal(out[:256], expected)
    check_fps_invariant(scan, out)  # float64, on the GPU: all 1,024 steps
    got = pcops.farthest_point_sample(clouds, 512, backend=backend)  # F1 shape, fewer samples
    assert torch.equal(got, expected_f1)


@pytest.mark.parametrize("keys32", [True, False])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_order(keys32):
    """fps_morton_keys[32] + one stable sort: per cloud a permutation of its indices, valid points first,
    Morton codes of the valid points ascending (spatially compact groups); 32-bit keys: 9 bits per
    axis for 3 clouds (2 batch bits + 1 padding bit + 27 <= 31), 64-bit keys: 10."""
    from pcops.cuda import fps as cu

    bits = 9 if keys32 else 10
    pts, lengths = make_clouds(3, 1000, seed=9, scale=10.0, device="cuda")
    lengths[1], lengths[2] = 1, 0
    order = cu.order(pts, lengths, keys32=keys32).view(3, 1000).cpu() - torch.arange(3)[:, None] * 1000
    for b in range(3):
        length = int(lengths[b])
        assert sorted(order[b].tolist()) == list(range(1000))
        assert set(order[b, :length].tolist()) == set(range(length))
    # cloud 0: the kernel's codes, replayed in float32 numpy, ascending along the order (ties by index)
    p = pts[0].cpu().numpy().astype(np.float32)
    lo, hi = p.min(0), p.max(0)
    top = np.float32(2**bits - 1)
    scale = top / np.maximum(hi - lo, np.float32(1e-6))
    cells = np.minimum(np.maximum((p - lo) * scale, np.float32(0)), top).astype(np.int64)
    code = np.zeros(p.shape[0], dtype=np.int64)
    for bit in range(bits):
        for axis in range(3):
            code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
    assert order[0].tolist() == np.lexsort((np.arange(p.shape[0]), code)).tolist()


def lattice_clouds(batch, shape, seed):
    """Shuffled integer lattices ``(B, X*Y*Z, 3)`` (scaled by 0.5: exact in float32): many distinct
    points at exactly equal distances, so ties arise inside groups, across groups and across warps."""
    g = generator(seed)
    axes = torch.meshgrid(*[torch.arange(k, dtype=torch.float32) for k in shape], indexing="ij")
    grid = torch.stack([a.reshape(-1) for a in axes], 1) * 0.5
    return torch.stack([grid[torch.randperm(grid.shape[0], generator=g)] for _ in range(batch)])


def tile_md_lattice(large=False):
    """Two lattice clouds (ties at every level) and their cached reference: 32×32×16 with 16,384 and
    9,001 valid points, 1,500 samples; ``large``: 32×32×40 with 40,960 and 30,001, 600 samples."""
    dims, seed, valid, starts, m = (
        ((32, 32, 40), 12, [40960, 30001], [3, 30000], 600)
        if large
        else ((32, 32, 16), 11, [16384, 9001], [0, 4321], 1500)
    )

    def build():
        pts = lattice_clouds(2, dims, seed=seed).cuda()
        lengths = torch.tensor(valid, device="cuda")
        start = torch.tensor(starts, device="cuda")
        return pts, lengths, start, ref.farthest_point_sample(pts, lengths, start, m)

    return cached_reference(("lattice", *dims, m), build)


@pytest.mark.parametrize("cluster", [1, 2, 4, 8])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_cuda_kernels(cluster, caplog):
    """Each step kernel (one CTA, clusters of 2, 4, 8) through the CUDA launcher: uneven lengths with
    duplicated points (ties; M > N: -1 padding), lattices (ties at every level; 16,384 or more points:
    the register slots), and clouds whose size needs exactly that many CTAs; identical to the reference."""
    from pcops.cuda import fps as cu

    cases = [fps_case(3, 31, 40, duplicates=True), fps_case(1, 1, 3)] if cluster == 1 else []
    cases += {
        1: [
            fps_case(3, 1000, 1000, duplicates=True),
            fps_case(2, 4099, 2600, seed=1, scale=1.0, duplicates=True),
            fps_case(8, 16384, 256),
            tile_md_lattice(),
        ],
        2: [fps_case(2, 30000, 256)],
        4: [fps_case(2, 40000, 256), tile_md_lattice(large=True)],
        8: [fps_case(1, 120268, 128), fps_case(2, 131072, 64)],
    }[cluster]
    for pts, lengths, start, expected in cases:
        assert cu.cluster_size(pts.shape[1]) == cluster
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="pcops"):
            got = cu.farthest_point_sample(pts, lengths, start, expected.shape[1])
        assert torch.equal(got, expected), (pts.shape, caplog.text)
        assert cu.kernel_name(cluster) in caplog.text


@pytest.mark.gpu
@requires_cuda
def test_gpu_cuda_graph_capture():
    pts, lengths = make_clouds(2, 5000, seed=3, device="cuda")
    fn = lambda: pcops.farthest_point_sample(pts, 128, lengths)  # noqa: E731
    fn()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, fn())


# --- the Triton kernels compile for sm_90 (the interpreter does not type-check like the compiler) --


_AOT_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import fps as tri

target = GPUTarget("cuda", 90, 32)


def compile_(fn, types, constexprs, num_warps):
    sig = dict(zip(fn.arg_names, types + ["constexpr"] * len(constexprs)))
    triton.compile(ASTSource(fn, sig, constexprs), target=target,
                   options={"num_warps": num_warps, "enable_fp_fusion": False})


compile_(tri._fps_kernel, ["*fp32", "*i64", "*i64", "*i64", "i32", "i32"], dict(BLOCK=16384), 32)
compile_(tri._fps_stream_kernel, ["*fp32", "*i64", "*i64", "*fp32", "*i64", "i32", "i32"], dict(CHUNK=4096), 16)
print("compiled")
"""


def test_triton_kernels_compile_for_sm90():
    run_compiler_script(_AOT_SCRIPT)
