"""pcops.sampling: FPS, KNN, ball query, gather — reference vs Triton/CUDA, gradients, registration, bad input."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import pcops
from pcops.reference import sampling as ref
from _util import generator, interpret, requires_cuda, run_compiler_script


def make_clouds(batch, n, seed, dtype=torch.float32, device="cpu", scale=1.0, full_first=True, duplicates=False):
    """Padded random clouds ``(B, N, 3)`` with uneven lengths (the first cloud full)."""
    g = generator(seed)
    pts = torch.randn(batch, n, 3, generator=g) * scale
    if duplicates and n > 1:  # every point repeated: all distances tie pairwise
        pts[:, 1::2] = pts[:, 0:n - 1:2]
    lengths = torch.randint(0, n + 1, (batch,), generator=g)
    if full_first and batch:
        lengths[0] = n
    return pts.to(dtype).to(device), lengths.to(device)


def knn_oracle_f64(query, reference, k, ql, rl):
    """Brute force in float64 numpy: distances sorted, ties by index."""
    q, r = query.double().numpy(), reference.double().numpy()
    batch, nq, _ = q.shape
    dists = np.full((batch, nq, k), np.inf)
    idx = np.full((batch, nq, k), -1, dtype=np.int64)
    for b in range(batch):
        for i in range(int(ql[b])):
            d = ((r[b, : int(rl[b])] - q[b, i]) ** 2).sum(1)
            order = np.lexsort((np.arange(d.shape[0]), d))[:k]
            dists[b, i, : order.shape[0]] = d[order]
            idx[b, i, : order.shape[0]] = order
    return torch.from_numpy(dists), torch.from_numpy(idx)


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


# --- farthest point sampling ------------------------------------------------------------------


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


# --- KNN --------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch,nq,nr,k", [(1, 1, 1, 1), (2, 13, 17, 4), (3, 31, 7, 10), (2, 23, 41, 16), (1, 5, 0, 3)])
def test_knn_matches_float64_brute_force(batch, nq, nr, k):
    q, ql = make_clouds(batch, nq, seed=nq)
    r, rl = make_clouds(batch, nr, seed=nr + 100)
    dists, idx = pcops.knn(q, r, k, ql, rl)
    d64, i64 = knn_oracle_f64(q, r, k, ql, rl)
    assert torch.equal(idx, i64)
    torch.testing.assert_close(dists.double(), d64, rtol=1e-5, atol=1e-6)


def test_knn_far_from_origin_is_accurate():
    # the |a|²+|b|²-2ab expansion would lose all precision here
    g = generator(4)
    base = torch.tensor([1.0e3, -2.0e3, 5.0e2])
    r = base + torch.rand(1, 50, 3, generator=g) * 0.01
    dists, idx = pcops.knn(r, r, 4)
    d64, i64 = knn_oracle_f64(r, r, 4, torch.tensor([50]), torch.tensor([50]))
    assert torch.equal(idx, i64)
    torch.testing.assert_close(dists.double(), d64, rtol=2e-3, atol=1e-9)


def test_knn_ties_lowest_index_and_k_greater_than_n():
    r = torch.tensor([[1.0, 0, 0], [-1, 0, 0], [0, 1, 0], [1, 0, 0]])
    q = torch.zeros(1, 3)
    dists, idx = pcops.knn(q, r, 6)
    assert idx.tolist() == [[0, 1, 2, 3, -1, -1]]
    assert dists.tolist() == [[1.0, 1.0, 1.0, 1.0, float("inf"), float("inf")]]


def test_knn_padded_queries_and_float16():
    q, ql = make_clouds(2, 19, seed=5)
    ql[1] = 7
    d, i = pcops.knn(q, q, 5, ql, ql)
    assert (i[1, 7:] == -1).all() and torch.isinf(d[1, 7:]).all()
    dh, ih = pcops.knn(q.half(), q.half(), 5, ql, ql)
    assert dh.dtype == torch.float32
    d2, i2 = pcops.knn(q.half().float(), q.half().float(), 5, ql, ql)
    assert torch.equal(ih, i2) and torch.equal(dh, d2)


def test_knn_gradcheck_and_backward_matches_autograd():
    q, ql = make_clouds(2, 9, seed=6, dtype=torch.float64)
    r, rl = make_clouds(2, 11, seed=7, dtype=torch.float64)
    q.requires_grad_(True)
    r.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: pcops.knn(a, b, 4, ql, rl)[0].nan_to_num(posinf=0.0), (q, r))
    # the registered backward vs autograd through the plain-torch reference
    grad = torch.randn(2, 9, 4, dtype=torch.float64, generator=generator(8))
    d, _ = pcops.knn(q, r, 4, ql, rl)
    gq, gr = torch.autograd.grad(d, (q, r), grad.where(torch.isfinite(d), 0))
    d_ref, _ = ref.knn(q, r, ql, rl, 4)
    gq_ref, gr_ref = torch.autograd.grad(d_ref, (q, r), grad.where(torch.isfinite(d_ref), 0))
    torch.testing.assert_close(gq, gq_ref)
    torch.testing.assert_close(gr, gr_ref)


# --- ball query -------------------------------------------------------------------------------


def ball_oracle(q, r, radius, k, ql, rl):
    batch, nq, _ = q.shape
    idx = torch.full((batch, nq, k), -1, dtype=torch.int64)
    counts = torch.zeros((batch, nq), dtype=torch.int64)
    r2 = torch.tensor(radius * radius, dtype=q.dtype)
    for b in range(batch):
        for i in range(int(ql[b])):
            hits = [j for j in range(int(rl[b])) if ref.sq_dist(q[b, i], r[b, j]) < r2][:k]
            idx[b, i, : len(hits)] = torch.tensor(hits, dtype=torch.int64)
            counts[b, i] = len(hits)
    return idx, counts


@pytest.mark.parametrize("batch,nq,nr,k,radius", [(1, 1, 1, 1, 0.5), (2, 13, 29, 5, 0.9), (3, 7, 31, 40, 1.5), (1, 4, 0, 3, 1.0)])
def test_ball_query_matches_oracle(batch, nq, nr, k, radius):
    q, ql = make_clouds(batch, nq, seed=nq + 1)
    r, rl = make_clouds(batch, nr, seed=nr + 2)
    idx, counts = pcops.ball_query(q, r, radius, k, ql, rl)
    idx_o, counts_o = ball_oracle(q, r, radius, k, ql, rl)
    assert torch.equal(idx, idx_o) and torch.equal(counts, counts_o)


def test_ball_query_strict_radius_and_padding():
    r = torch.tensor([[1.0, 0, 0], [0.5, 0, 0], [2, 0, 0], [0, 0, 0]])
    idx, counts = pcops.ball_query(torch.zeros(1, 3), r, 1.0, 3)
    assert idx.tolist() == [[1, 3, -1]] and counts.tolist() == [2]  # |d|² = 1 is outside


# --- gather -----------------------------------------------------------------------------------


def test_gather_points_values_and_gradient():
    pts = torch.randn(2, 7, 5, dtype=torch.float64, generator=generator(9), requires_grad=True)
    idx = torch.tensor([[[0, 6], [-1, 3]], [[2, 2], [5, -1]]])
    out = pcops.gather_points(pts, idx)
    assert out.shape == (2, 2, 2, 5)
    assert torch.equal(out[0, 1, 0], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(out[1, 0, 1], pts[1, 2].detach())
    assert torch.autograd.gradcheck(lambda p: pcops.gather_points(p, idx), (pts,))
    assert torch.autograd.gradgradcheck(lambda p: pcops.gather_points(p, idx), (pts,))
    assert pcops.gather_points(pts[0], torch.tensor([1, -1])).shape == (2, 5)


# --- registration -----------------------------------------------------------------------------


def sample_inputs(device="cpu"):
    q, ql = make_clouds(2, 11, seed=10, device=device)
    r, rl = make_clouds(2, 13, seed=11, device=device)
    return q, r, ql, rl


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])])
def test_opcheck(device):
    q, r, ql, rl = sample_inputs(device)
    start = torch.zeros(2, dtype=torch.int64, device=device)
    torch.library.opcheck(torch.ops.pcops.farthest_point_sample, (q, ql, start, 5, "auto"))
    torch.library.opcheck(torch.ops.pcops.farthest_point_sample, (q, ql, start, 5, "triton"))
    torch.library.opcheck(torch.ops.pcops.knn, (q, r, ql, rl, 3))
    torch.library.opcheck(torch.ops.pcops.knn, (q.double().requires_grad_(), r.double().requires_grad_(), ql, rl, 3))
    torch.library.opcheck(torch.ops.pcops.ball_query, (q, r, ql, rl, 0.7, 4))
    idx = torch.tensor([[0, -1, 3], [2, 2, 1]], device=device)
    torch.library.opcheck(torch.ops.pcops.gather_points, (q.double().requires_grad_(), idx))
    torch.library.opcheck(torch.ops.pcops.gather_points_backward, (torch.randn(2, 3, 3, device=device), idx, 11))


def test_torch_compile_fullgraph():
    q, r, ql, rl = sample_inputs()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def group(points, lengths):
        centres = pcops.farthest_point_sample(points, 4, lengths)
        new_xyz = pcops.gather_points(points, centres)
        d, nbr = pcops.knn(new_xyz, points, 3, ref_lengths=lengths)
        ball, _ = pcops.ball_query(new_xyz, points, 1.0, 3, ref_lengths=lengths)
        return pcops.gather_points(points, nbr) - new_xyz[:, :, None], d, ball

    got = group(q, ql)
    centres = pcops.farthest_point_sample(q, 4, ql)
    new_xyz = pcops.gather_points(q, centres)
    d, nbr = pcops.knn(new_xyz, q, 3, ref_lengths=ql)
    ball, _ = pcops.ball_query(new_xyz, q, 1.0, 3, ref_lengths=ql)
    torch.testing.assert_close(got[0], pcops.gather_points(q, nbr) - new_xyz[:, :, None])
    torch.testing.assert_close(got[1], d)
    assert torch.equal(got[2], ball)


# --- bad input --------------------------------------------------------------------------------


P3 = torch.zeros(2, 5, 3)


@pytest.mark.parametrize("call,exc,name", [
    (lambda: pcops.farthest_point_sample(torch.zeros(2, 5, 2), 3), ValueError, "points"),
    (lambda: pcops.farthest_point_sample(torch.zeros(2, 5, 3, dtype=torch.int32), 3), TypeError, "points"),
    (lambda: pcops.farthest_point_sample(P3, 0), ValueError, "num_samples"),
    (lambda: pcops.farthest_point_sample(P3, 2.0), TypeError, "num_samples"),
    (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([6, 1])), ValueError, "lengths"),
    (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5, -1])), ValueError, "lengths"),
    (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5])), ValueError, "lengths"),
    (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5.0, 1.0])), TypeError, "lengths"),
    (lambda: pcops.farthest_point_sample(P3, 3, start_idx=5), ValueError, "start_idx"),
    (lambda: pcops.farthest_point_sample(P3, 3, torch.tensor([5, 2]), start_idx=torch.tensor([0, 2])), ValueError, "start_idx"),
    (lambda: pcops.farthest_point_sample(P3, 3, backend="cpp"), ValueError, "backend"),
    (lambda: pcops.knn(P3, P3, 0), ValueError, "k"),
    (lambda: pcops.knn(P3, torch.zeros(3, 5, 3), 2), ValueError, "ref"),
    (lambda: pcops.knn(P3, torch.zeros(5, 3), 2), ValueError, "ref"),
    (lambda: pcops.knn(P3, torch.zeros(2, 5, 4), 2), ValueError, "ref"),
    (lambda: pcops.knn(P3, P3, 2, query_lengths=torch.tensor([1, 9])), ValueError, "query_lengths"),
    (lambda: pcops.knn(P3, P3, 2, ref_lengths=torch.tensor([1, 2, 3])), ValueError, "ref_lengths"),
    (lambda: pcops.ball_query(P3, P3, 0.0, 2), ValueError, "radius"),
    (lambda: pcops.ball_query(P3, P3, -1.0, 2), ValueError, "radius"),
    (lambda: pcops.ball_query(P3, P3, 1.0, 0), ValueError, "k"),
    (lambda: pcops.gather_points(P3, torch.tensor([[0, 5], [0, 0]])), ValueError, "idx"),
    (lambda: pcops.gather_points(P3, torch.tensor([[0, 1]])), ValueError, "idx"),
    (lambda: pcops.gather_points(P3, torch.tensor([[0.0, 1.0]])), TypeError, "idx"),
])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


@pytest.mark.gpu
@requires_cuda
def test_wrong_devices():
    with pytest.raises(ValueError, match="ref"):
        pcops.knn(P3, P3.cuda(), 2)
    with pytest.raises(ValueError, match="lengths"):
        pcops.farthest_point_sample(P3.cuda(), 2, torch.tensor([5, 5]))


# --- Triton kernels under the CPU interpreter (tiny inputs) -----------------------------------


@pytest.mark.parametrize("batch,n,m", [(1, 1, 2), (2, 13, 6), (2, 64, 64)])
@pytest.mark.parametrize("stream", [False, True])
@interpret
def test_triton_fps_interpreter(batch, n, m, stream, monkeypatch):
    from pcops.triton import sampling as tri

    if stream:  # the large-cloud kernel, with chunks smaller than the cloud
        monkeypatch.setattr(tri, "_FPS_REG_MAX", 0)
        monkeypatch.setattr(tri, "_FPS_CHUNK", 16)
    pts, lengths = make_clouds(batch, n, seed=n, duplicates=n > 20)
    start = (torch.arange(batch) * 5) % lengths.clamp_min(1)
    start[-1] = 7 if n > 7 else start[-1]
    expected = ref.farthest_point_sample(pts, lengths, start, m)
    assert torch.equal(tri.farthest_point_sample(pts, lengths, start, m), expected)
    bad = torch.full((batch,), n + 3, dtype=torch.int64)  # invalid start: rows of -1 on both paths
    assert torch.equal(tri.farthest_point_sample(pts, lengths, bad, m), ref.farthest_point_sample(pts, lengths, bad, m))


@pytest.mark.parametrize("batch,nq,nr,k", [(1, 1, 1, 1), (2, 13, 41, 5), (1, 50, 64, 16), (2, 7, 3, 4)])
@interpret
def test_triton_knn_interpreter(batch, nq, nr, k):
    from pcops.triton import sampling as tri

    q, ql = make_clouds(batch, nq, seed=nq + 3)
    r, rl = make_clouds(batch, nr, seed=nr + 4, duplicates=True)
    d, i = tri.knn(q, r, ql, rl, k)
    d_ref, i_ref = ref.knn(q, r, ql, rl, k)
    assert torch.equal(i, i_ref) and torch.equal(d, d_ref)
    # self-KNN (one shared sort) with tiles smaller than a cloud, so pruning is exercised
    d, i = tri.knn(r, r, rl, rl, k)
    d_ref, i_ref = ref.knn(r, r, rl, rl, k)
    assert torch.equal(i, i_ref) and torch.equal(d, d_ref)


@interpret
def test_triton_knn_pruning_interpreter(monkeypatch):
    from pcops.triton import sampling as tri

    monkeypatch.setattr(tri, "_KNN_BQ", 8)
    monkeypatch.setattr(tri, "_KNN_BR", 8)
    monkeypatch.setattr(tri, "_KNN_SB", 2)
    r, rl = make_clouds(2, 60, seed=12, scale=5.0)
    d, i = tri.knn(r, r, rl, rl, 3)
    d_ref, i_ref = ref.knn(r, r, rl, rl, 3)
    assert torch.equal(i, i_ref) and torch.equal(d, d_ref)


@pytest.mark.parametrize("batch,nq,nr,k,radius", [(1, 1, 1, 1, 0.3), (2, 11, 53, 4, 1.0), (1, 33, 70, 64, 2.0)])
@interpret
def test_triton_ball_query_interpreter(batch, nq, nr, k, radius):
    from pcops.triton import sampling as tri

    q, ql = make_clouds(batch, nq, seed=nq + 5)
    r, rl = make_clouds(batch, nr, seed=nr + 6)
    idx, counts = tri.ball_query(q, r, ql, rl, radius, k)
    idx_ref, counts_ref = ref.ball_query(q, r, ql, rl, radius, k)
    assert torch.equal(idx, idx_ref) and torch.equal(counts, counts_ref)


# --- the GPU paths --------------------------------------------------------------------------
#
# Oracles are the plain-torch reference run ON THE GPU, once per input (``cached_reference``),
# and shared by every backend/variant/launch path tested on that input. The reference does the
# same IEEE float32 operations on either device (separate mul/add kernels, no FMA contraction;
# argmax and stable sort keep the first index on ties), so its GPU result is the CPU result —
# ``test_gpu_reference_matches_cpu_reference`` checks that. On the GPU a reference FPS step costs
# ~10 launches (~0.1 ms), so the whole file's FPS oracles (~7,000 steps) take about a second;
# the CPU reference (a few ms per step on 100k-point clouds, slower on a busy host) timed out.

_REFERENCES: dict = {}


def cached_reference(key, build):
    """``build()`` once per ``key`` for the whole test session (inputs and reference outputs)."""
    if key not in _REFERENCES:
        _REFERENCES[key] = build()
    return _REFERENCES[key]


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
    q, ql = make_clouds(2, 300, seed=20, scale=10.0, duplicates=True)
    r, rl = make_clouds(2, 777, seed=21, scale=10.0)
    for args in ((q, r, ql, rl, 16), (q, q, ql, ql, 64)):
        d, i = ref.knn(*(a.cuda() for a in args[:4]), args[4])
        d_c, i_c = ref.knn(*args)
        assert torch.equal(i.cpu(), i_c) and torch.equal(d.cpu(), d_c)
    idx, c = ref.ball_query(q.cuda(), r.cuda(), ql.cuda(), rl.cuda(), 3.0, 32)
    idx_c, c_c = ref.ball_query(q, r, ql, rl, 3.0, 32)
    assert torch.equal(idx.cpu(), idx_c) and torch.equal(c.cpu(), c_c)


@pytest.mark.parametrize("backend", ["triton", "cuda", "auto"])
@pytest.mark.parametrize("batch,n,m", [(1, 1, 3), (3, 1000, 200), (2, 4099, 512), (8, 16384, 64), (1, 40000, 64), (1, 120268, 32)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_matches_reference(backend, batch, n, m):
    pts, lengths, start, expected = fps_case(batch, n, m)
    got = pcops.farthest_point_sample(pts, m, lengths, start, backend=backend)
    assert torch.equal(got, expected)


def load_scan_xyz():
    """SCAN xyz from ``../shared/data``, ``$PCOPS_DATA`` or the GPU machine's ``.gpu/data`` copy (as the
    benchmarks), else skip."""
    root = Path(__file__).resolve().parents[1]
    for base in (root / ".." / "shared" / "data", os.environ.get("PCOPS_DATA"), root / ".gpu" / "data"):
        if base is None:
            continue
        path = Path(base) / "kitti" / "training" / "velodyne" / "000001.bin"
        if path.exists():
            raw = np.fromfile(path, dtype=np.float32).reshape(-1, 4)
            return torch.from_numpy(raw[:, :3].copy())
    pytest.skip("real KITTI samples not found (../shared/data or .gpu/data)")


@pytest.mark.parametrize("variant", ["keys", "lazy", "flat", "pruned", "tile", "tile_async"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_variants_through_the_op(variant, monkeypatch):
    """Every csrc/fps.cu variant behind ``backend="cuda"``: uneven batches, F1/F2-like sizes (references shared)."""
    from pcops.cuda import sampling as cu

    monkeypatch.setattr(cu, "_VARIANT", variant)
    # small clouds with duplicates run past the first ties; large ones ≤ 256 steps (the launch path is the point)
    for batch, n, m in [(3, 1000, 1000), (8, 16384, 256), (1, 120268, 128), (2, 40000, 256)]:
        pts, lengths, start, expected = fps_case(batch, n, m, duplicates=n == 1000)
        got = pcops.farthest_point_sample(pts, m, lengths, start, backend="cuda")
        assert torch.equal(got, expected), (n, cu.last_launch)


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
        return (scan, ref.farthest_point_sample(scan[None], full(scan[None]), zero(scan[None]), 256)[0],
                clouds, ref.farthest_point_sample(clouds, full(clouds), zero(clouds), 512))

    scan, expected, clouds, expected_f1 = cached_reference("kitti", build)
    out = pcops.farthest_point_sample(scan, 1024, backend=backend)
    assert len(set(out.tolist())) == 1024
    assert torch.equal(out[:256], expected)
    check_fps_invariant(scan, out)  # float64, on the GPU: all 1,024 steps
    got = pcops.farthest_point_sample(clouds, 512, backend=backend)  # F1 shape, fewer samples
    assert torch.equal(got, expected_f1)


def knn_case(batch, nq, nr, k):
    def build():
        q, ql = make_clouds(batch, nq, seed=nq, scale=10.0, device="cuda")
        r, rl = make_clouds(batch, nr, seed=nr + 1, scale=10.0, device="cuda")
        return q, r, ql, rl, ref.knn(q, r, ql, rl, k), ref.knn(r, r, rl, rl, k)

    return cached_reference(("knn", batch, nq, nr, k), build)


@pytest.mark.parametrize("batch,nq,nr,k", [(1, 1, 1, 1), (2, 1000, 777, 16), (3, 513, 2049, 32), (4, 2048, 4096, 16), (1, 100, 5, 8), (2, 300, 300, 64)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_matches_reference(batch, nq, nr, k):
    q, r, ql, rl, (d_ref, i_ref), (ds_ref, is_ref) = knn_case(batch, nq, nr, k)
    d, i = pcops.knn(q, r, k, ql, rl)
    assert torch.equal(i, i_ref)
    assert torch.equal(d, d_ref)
    d, i = pcops.knn(r, r, k, rl, rl)  # self-KNN
    assert torch.equal(i, is_ref) and torch.equal(d, ds_ref)


def test_cuda_knn_supported_without_a_gpu():
    """The launcher's eligibility test runs its cheap checks before touching CUDA (K above the
    compiled maximum or a batch over the grid limit go to Triton)."""
    from pcops.cuda import knn as cuda_knn

    assert cuda_knn.MAX_K == 32
    assert not cuda_knn.supported(torch.zeros(1, 4, 3), cuda_knn.MAX_K + 1)
    assert not cuda_knn.supported(torch.zeros(65536, 1, 3), 4)
    assert cuda_knn._group(16384) == 4 and cuda_knn._group(120268) == 8


@pytest.mark.parametrize("k,tile,group", [(1, 32, 8), (3, 64, 4), (17, 32, 16), (32, 64, 16), (16, 32, None),
                                         (8, 32, 1), (5, 64, 3)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_cuda_kernel_ties_and_k(k, tile, group):
    """The CUDA C++ kernel (K <= 32, KP = next power of two slots) on clouds with duplicate points
    (ties resolve to the lowest index), padded lengths, several superblocks, against the reference."""
    from pcops.cuda import knn as cuda_knn

    q, ql = make_clouds(3, 2500, seed=40 + k, scale=6.0, duplicates=True, device="cuda")
    r, rl = make_clouds(3, 1800, seed=50 + k, scale=6.0, duplicates=True, device="cuda")
    assert cuda_knn.supported(q, k)
    for a, b, la, lb in ((q, r, ql, rl), (q, q, ql, ql)):
        d, i = cuda_knn.knn(a, b, la, lb, k, tile=tile, group=group)
        d_ref, i_ref = ref.knn(a, b, la, lb, k)
        assert torch.equal(i, i_ref)
        assert torch.equal(d, d_ref)


def _nvrtc_ptx(source, name):
    """PTX of ``source`` for compute_90 (NVRTC, no GPU)."""
    import ctypes

    from pcops import _nvrtc

    lib = _nvrtc.nvrtc()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None) == 0
    try:
        opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"-default-device"]
        assert lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)) == 0
        size = ctypes.c_size_t()
        assert lib.nvrtcGetPTXSize(prog, ctypes.byref(size)) == 0
        buf = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetPTX(prog, buf) == 0
        return buf.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def test_cuda_knn_variants_compile_without_local_memory():
    """Every variant's kernels exist for every tile and KP, and the 64-bit-key variants keep their
    top K in registers (no ``.local`` array in their PTX: a run-time index into the list would put
    it in local memory, as it does for the "sorted" kernels with KP < 32). Bad variant -> ValueError."""
    try:
        from pcops import _nvrtc

        _nvrtc.nvrtc()
    except RuntimeError as e:
        pytest.skip(f"NVRTC not installed: {e}")
    from pcops.cuda import knn as cuda_knn

    ptx = _nvrtc_ptx((_nvrtc.CSRC_DIR / "knn.cu").read_text(), "knn.cu")
    bodies = {}
    for chunk in ptx.split(".entry ")[1:]:
        bodies[chunk.split("(", 1)[0].strip()] = chunk.split("\n}", 1)[0]
    for variant in cuda_knn.VARIANTS:
        for tile in cuda_knn.TILES if variant in cuda_knn.ALL_TILES else cuda_knn.TILES[:1]:
            for kp in (1, 2, 4, 8, 16, 32):
                name = f"knn_{variant}_q{tile}_k{kp}"
                assert name in bodies, name
                if variant != "sorted":
                    assert ".local" not in bodies[name], name
    with pytest.raises(ValueError, match="variant"):
        cuda_knn._options(100, None, None, "bogus")
    with pytest.raises(ValueError, match="tile"):
        cuda_knn._options(100, 48, None, None)
    with pytest.raises(ValueError, match="prep"):
        cuda_knn.prepare(torch.zeros(1, 4, 3), torch.zeros(1, 4, 3), torch.tensor([4]), torch.tensor([4]), 32, 4, "bogus")
    for name in ("knn_prep_codes", "knn_prep_gather"):
        assert name in bodies and ".local" not in bodies[name], name
    assert cuda_knn._options(100, None, None, None) == (cuda_knn._QB, 4, cuda_knn._VARIANT)


def tie_grid_clouds(batch, n, seed, device):
    """Points on a coarse integer grid (many exactly equal distances), uneven lengths."""
    g = generator(seed)
    pts = torch.randint(-3, 4, (batch, n, 3), generator=g).float()
    lengths = torch.randint(1, n + 1, (batch,), generator=g)
    lengths[0] = n
    return pts.to(device), lengths.to(device)


@pytest.mark.parametrize("variant", ["sorted", "net", "netfu"])
@pytest.mark.parametrize("k,tile,group", [(1, 32, 4), (16, 32, 4), (32, 32, 4), (5, 32, 2), (5, 64, 8), (16, 64, 3), (17, 32, 1), (32, 64, 16)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_cuda_variants_match_reference(variant, k, tile, group):
    """Each top-K variant of csrc/knn.cu against the reference, bit for bit: several clouds with
    uneven lengths, duplicate points and grid points (ties: lowest index first), cross and self."""
    from pcops.cuda import knn as cuda_knn

    if tile not in cuda_knn.TILES[:1] and variant not in cuda_knn.ALL_TILES:
        pytest.skip(f"{variant} is compiled for tiles of {cuda_knn.TILES[0]} only")
    q, ql = make_clouds(3, 2500, seed=60 + k, scale=6.0, duplicates=True, device="cuda")
    r, rl = make_clouds(3, 1800, seed=70 + k, scale=6.0, duplicates=True, device="cuda")
    g, gl = tie_grid_clouds(2, 1500, seed=80 + k, device="cuda")
    # the last case passes a strided query view (the launcher makes it contiguous)
    for a, b, la, lb in ((q, r, ql, rl), (q, q, ql, ql), (g, g, gl, gl), (r[:, :7], r, rl.clamp(max=7), rl)):
        d, i = cuda_knn.knn(a, b, la, lb, k, tile=tile, group=group, variant=variant)
        d_ref, i_ref = ref.knn(a, b, la, lb, k)
        assert torch.equal(i, i_ref), (variant, k, tile, group)
        assert torch.equal(d, d_ref), (variant, k, tile, group)


@pytest.mark.parametrize("tile,group", [(32, 4), (32, 8), (64, 3), (32, 1)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_cuda_prep_matches_triton(tile, group):
    """csrc/knn.cu's prep kernels (prep="cuda") give _morton_sort's outputs exactly (sorted points,
    permutation, tile and superblock boxes), and the op with them the reference's results."""
    from pcops.cuda import knn as cuda_knn
    from pcops.triton.sampling import _morton_sort

    q, ql = make_clouds(3, 3001, seed=90 + tile + group, scale=6.0, duplicates=True, device="cuda")
    g, gl = tie_grid_clouds(2, 1500, seed=91, device="cuda")
    ql[1] = 0  # an empty cloud
    for pts, lengths in ((q, ql), (g, gl)):
        want = _morton_sort(pts, lengths, tile, group)
        got = cuda_knn._morton_sort_cuda(pts, lengths, tile, group)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(got[2][..., :6], want[2][..., :6]) and torch.equal(got[3], want[3])
        for k in (1, 16, 32):
            d, i = cuda_knn.knn(pts, pts, lengths, lengths, k, tile=tile, group=group, prep="cuda")
            d_ref, i_ref = ref.knn(pts, pts, lengths, lengths, k)
            assert torch.equal(i, i_ref) and torch.equal(d, d_ref), (tile, group, k)
    r, rl = make_clouds(3, 1800, seed=92, scale=6.0, device="cuda")
    d, i = cuda_knn.knn(q, r, ql, rl, 16, tile=tile, group=group, prep="cuda")
    d_ref, i_ref = ref.knn(q, r, ql, rl, 16)
    assert torch.equal(i, i_ref) and torch.equal(d, d_ref)


@pytest.mark.parametrize("variant", ["sorted", "net", "netfu"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_cuda_variants_kitti_k1_shape(variant):
    """The K1 shape (8 clouds of 16,384 KITTI points, self-KNN, K = 16 and 32): each variant
    gives exactly the output of "net" (pinned to the reference by the other tests)."""
    from pcops.cuda import knn as cuda_knn

    scan = load_scan_xyz().cuda()
    g = generator(0)
    clouds = torch.stack([scan[torch.randperm(scan.shape[0], generator=g)[:16384].cuda()] for _ in range(8)]).contiguous()
    lengths = torch.full((8,), 16384, device="cuda")
    lengths[3] = 9001  # one uneven cloud
    for k in (16, 32):
        d0, i0 = cuda_knn.knn(clouds, clouds, lengths, lengths, k, variant="net")
        d, i = cuda_knn.knn(clouds, clouds, lengths, lengths, k, variant=variant)
        assert torch.equal(i, i0) and torch.equal(d, d0), (variant, k)


@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_kitti_and_backward():
    scan = load_scan_xyz().cuda()
    d, i = pcops.knn(scan, scan, 16)
    sub = torch.randperm(scan.shape[0], generator=generator(3))[:2000].cuda()
    d_ref, i_ref = ref.knn(scan[None, sub], scan[None], torch.tensor([2000], device="cuda"),
                           torch.tensor([scan.shape[0]], device="cuda"), 16, chunk=500)
    assert torch.equal(i[sub], i_ref[0]) and torch.equal(d[sub], d_ref[0])
    q, ql = make_clouds(2, 300, seed=2, device="cuda", dtype=torch.float32)
    q.requires_grad_(True)
    d, _ = pcops.knn(q, q, 8, ql, ql)
    grad = torch.randn(d.shape, device="cuda").where(torch.isfinite(d), 0)
    (g_fast,) = torch.autograd.grad(d, q, grad)
    qc = q.detach().cpu().requires_grad_(True)
    d_c, _ = ref.knn(qc, qc, ql.cpu(), ql.cpu(), 8)
    (g_ref,) = torch.autograd.grad(d_c, qc, grad.cpu())
    torch.testing.assert_close(g_fast.cpu(), g_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,nq,nr,k,radius", [(1, 1, 1, 1, 0.5), (2, 1000, 3001, 32, 2.0), (4, 256, 4096, 16, 5.0)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_ball_query_and_gather(batch, nq, nr, k, radius):
    q, ql = make_clouds(batch, nq, seed=nq, scale=10.0)
    r, rl = make_clouds(batch, nr, seed=nr, scale=10.0)
    idx_ref, c_ref = pcops.ball_query(q, r, radius, k, ql, rl)  # CPU reference (well under a second)
    idx, c = pcops.ball_query(q.cuda(), r.cuda(), radius, k, ql.cuda(), rl.cuda())
    assert torch.equal(idx.cpu(), idx_ref) and torch.equal(c.cpu(), c_ref)
    feats = torch.randn(batch, nr, 5, generator=generator(1))
    fg = feats.cuda().requires_grad_(True)
    out = pcops.gather_points(fg, idx)
    assert torch.equal(out.cpu(), pcops.gather_points(feats, idx_ref))
    out.sum().backward()
    fc = feats.clone().requires_grad_(True)
    pcops.gather_points(fc, idx_ref).sum().backward()
    torch.testing.assert_close(fg.grad.cpu(), fc.grad)


@pytest.mark.gpu
@requires_cuda
def test_gpu_cuda_graph_capture():
    pts, lengths = make_clouds(2, 5000, seed=3, device="cuda")
    for fn in (lambda: pcops.farthest_point_sample(pts, 128, lengths), lambda: pcops.knn(pts, pts, 8, lengths, lengths)[1]):
        fn()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = fn()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, fn())


# --- the CUDA C++ kernel: compiled by NVRTC here, run on the GPU ------------------------------


def test_fps_cu_compiles_with_every_entry_point():
    from pcops import _nvrtc
    from pcops.cuda import sampling as cu

    try:
        cubin = _nvrtc.compile_source((_nvrtc.CSRC_DIR / "fps.cu").read_text(), "fps.cu", "sm_90")
    except RuntimeError as e:
        if "NVRTC not found" in str(e):
            pytest.skip(str(e))
        raise
    for variant in cu._VARIANTS:
        for cluster in (1, 2, 4, 8, 16):
            for ppt in (1, 2, 4, 8, 16):
                assert cu._kernel_name(variant, cluster, ppt, runtime_shape=False).encode() in cubin
        for ppt in (4, 8, 16):  # every points-per-thread a 16-CTA cluster can need
            assert cu._kernel_name(variant, 16, ppt, runtime_shape=True).encode() in cubin
    assert cu._kernel_name("pruned", 8, 32, False).encode() in cubin
    for cluster in cu._TILE_CLUSTERS:
        for exchange in ("bar", "async"):
            for opt in cu._TILE_OPTS_C1 if cluster == 1 else cu._TILE_OPTS if exchange == "async" else ("",):
                assert cu._tile_kernel_name(cluster, exchange, opt).encode() in cubin
    for opt in cu._TILE_G2_OPTS:
        assert f"fps_tile{'_' + opt if opt else ''}_w8g2_c1".encode() in cubin
    for warps, cluster in cu._TILE_FEW_WARPS:
        for exchange in ("bar", "async"):
            assert cu._tile_kernel_name(cluster, exchange, "", warps).encode() in cubin
    for unroll in cu._TILE_MD_UNROLLS:
        for early in (False, True):
            assert cu._tile_md_kernel_name(unroll, early, 1, "").encode() in cubin
        for cluster in cu._TILE_MD_CLUSTER_UNROLLS:
            for opt in cu._TILE_MD_CLUSTER_OPTS:
                assert cu._tile_md_kernel_name(unroll, True, cluster, opt=opt).encode() in cubin
        for shape in cu._TILE_MD_SHAPES:
            assert cu._tile_md_kernel_name(unroll, False, 1, shape).encode() in cubin
    assert b"fps_tile_md_stats_u1_c1" in cubin
    for cluster, unrolls in cu._TILE_MD_ADAPTIVE.items():
        for unroll in unrolls:
            assert cu._tile_md_kernel_name(unroll, cluster=cluster, shape="", adaptive=True).encode() in cubin
    assert cu._kernel_name("tile", 8, 32, False) == "fps_pruned_c8_p32"  # too large for fps_tile
    assert cu._kernel_name("tile_md", 8, 32, False) == "fps_pruned_c8_p32"
    assert cu._kernel_name("pruned", 8, 4, False) == "fps_pruned_c8_p4"
    assert cu._kernel_name("flat", 16, 4, False) == "fps_lazy_c16_p4"


def pruned_fps_model(points, m, start, group):
    """A numpy model of csrc/fps.cu's pruned variant for one cloud: Morton-sorted points in groups
    (a warp's run), a group skips its update when its box is farther from the new sample than its
    largest min-distance, and republishes its last (max, lowest original index) record."""
    p = points.numpy().astype(np.float32)
    n = p.shape[0]
    cells = np.clip(((p - p.min(0)) / np.maximum(p.max(0) - p.min(0), 1e-6) * 1023).astype(np.int64), 0, 1023)
    code = np.zeros(n, dtype=np.int64)
    for bit in range(10):  # interleave the bits: a Morton (Z-order) code
        for axis in range(3):
            code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
    perm = np.argsort(code, kind="stable")
    s = p[perm]
    groups = [slice(g, min(g + group, n)) for g in range(0, n, group)]
    lo = np.stack([s[g].min(0) for g in groups])
    hi = np.stack([s[g].max(0) for g in groups])
    min_d = np.full(n, np.inf, dtype=np.float32)
    group_max = np.full(len(groups), np.inf, dtype=np.float32)
    records = [None] * len(groups)
    out, sel, skipped = [start], start, 0
    for _ in range(min(m, n) - 1):
        c = p[sel]
        gap = np.maximum(np.maximum(lo - c, c - hi), np.float32(0))
        lower = (gap[:, 0] * gap[:, 0] + gap[:, 1] * gap[:, 1]) + gap[:, 2] * gap[:, 2]
        for g, sl in enumerate(groups):
            if lower[g] > group_max[g]:
                skipped += 1
                continue
            d = s[sl] - c
            upd = np.minimum(min_d[sl], (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2])
            upd[perm[sl] == sel] = -1
            min_d[sl] = upd
            best = upd.max()
            records[g] = (best, perm[sl][upd == best].min()) if best >= 0 else None
            group_max[g] = best if best >= 0 else -1
        best = max(r[0] for r in records if r is not None)
        sel = int(min(r[1] for r in records if r is not None and r[0] == best))
        out.append(sel)
    return out + [-1] * (m - len(out)), skipped / max(1, len(groups) * (min(m, n) - 1))


def test_pruned_fps_model_is_exact(kitti_dir):
    """The box skip of the pruned CUDA variant changes no index (rounding is monotone), ties included."""
    raw = np.fromfile(kitti_dir / "velodyne" / "000001.bin", dtype=np.float32).reshape(-1, 4)
    pts = torch.from_numpy(raw[torch.randperm(raw.shape[0], generator=generator(2))[:1200].numpy(), :3].copy())
    pts[1::5] = pts[0:-1:5][: pts[1::5].shape[0]]  # duplicates: exact ties
    got, skipped = pruned_fps_model(pts, 600, 3, group=32)
    assert got == fps_oracle(pts, 600, 3)
    assert skipped > 0.5  # most group updates are skipped


def morton_permutation(p):
    """numpy: indices of ``p (N, 3)`` in Morton order of 10-bit cells of its box (any order is exact)."""
    cells = np.clip(((p - p.min(0)) / np.maximum(p.max(0) - p.min(0), 1e-6) * 1023).astype(np.int64), 0, 1023)
    code = np.zeros(p.shape[0], dtype=np.int64)
    for bit in range(10):
        for axis in range(3):
            code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
    return np.argsort(code, kind="stable")


def tile_fps_model(points, m, start, cluster, warps=16):
    """A numpy model of csrc/fps.cu's fps_tile kernel for one cloud: Morton-sorted points split
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


@pytest.mark.parametrize("cluster,warps", [(1, 16), (2, 16), (4, 16), (2, 8), (4, 4), (1, 8)])
def test_tile_fps_model_is_exact(kitti_dir, cluster, warps):
    """fps_tile's bookkeeping (group boxes, cached warp records, the two-level reduction) changes no
    index, ties included (duplicated points), whatever the number of CTAs and warps."""
    raw = np.fromfile(kitti_dir / "velodyne" / "000001.bin", dtype=np.float32).reshape(-1, 4)
    pts = torch.from_numpy(raw[torch.randperm(raw.shape[0], generator=generator(3))[:2500].numpy(), :3].copy())
    pts[1::4] = pts[0:-1:4][: pts[1::4].shape[0]]  # duplicates: exact ties
    got, updated = tile_fps_model(pts, 1300, 11, cluster, warps)
    assert got == fps_oracle(pts, 1300, 11)
    assert updated < 0.3  # most group updates are skipped


def test_tile_plan():
    from pcops.cuda import sampling as cu

    assert cu._tile_plan(1) == 1 and cu._tile_plan(16384) == 1  # F1: one CTA per cloud
    assert cu._tile_plan(16385) == 2 and cu._tile_plan(16384, min_cluster=4) == 4
    assert cu._tile_plan(120268) == 8  # F2: 8 CTAs of 15,034 points
    assert cu._tile_plan(131072) == 8 and cu._tile_plan(131073) is None
    assert cu._tile_kernel_name(1, "async") == "fps_tile_c1" and cu._tile_kernel_name(8, "async") == "fps_tile_async_c8"
    assert cu._tile_kernel_name(1, "bar", "shfl") == "fps_tile_shfl_c1"
    assert cu._tile_kernel_name(8, "async", "shfl_unroll") == "fps_tile_async_shfl_unroll_c8"
    assert cu._tile_kernel_name(8, "bar", "unroll") == "fps_tile_c8"  # the barrier exchange: default shape only
    assert cu._tile_kernel_name(2, "async", "", 8) == "fps_tile_async_w8_c2"
    cu._tile_groups = 2
    try:
        assert cu._tile_kernel_name(1, "bar", "shfl", 8) == "fps_tile_shfl_w8g2_c1"
        assert cu._tile_plan(16384, warps=8) == 1 and cu._tile_plan(16385, warps=8) == 2
    finally:
        cu._tile_groups = 1
    assert cu._tile_plan(16384, warps=4) == 4 and cu._tile_plan(16385, warps=8) == 4


def test_tile_choice_falls_back_where_a_shape_is_not_compiled(monkeypatch):
    """A code shape chosen for 16k clouds (one CTA) never breaks larger clouds: they get the
    general 16-warp shape (without the one-CTA-only leader reduction)."""
    from pcops.cuda import sampling as cu

    assert cu._tile_choice(16384) == (1, "", 16, 1) and cu._tile_choice(120268) == (8, "", 16, 1)
    assert cu._tile_choice(131073) is None
    monkeypatch.setattr(cu, "_tile_opt", "shfl_leader")
    assert cu._tile_choice(16384) == (1, "shfl_leader", 16, 1) and cu._tile_choice(120268) == (8, "shfl", 16, 1)
    monkeypatch.setattr(cu, "_tile_opt", "leader")
    monkeypatch.setattr(cu, "_tile_warps", 8)
    monkeypatch.setattr(cu, "_tile_groups", 2)
    assert cu._tile_choice(16384) == (1, "leader", 8, 2) and cu._tile_choice(120268) == (8, "", 16, 1)
    monkeypatch.setattr(cu, "_tile_groups", 1)
    assert cu._tile_choice(16384) == (1, "leader", 16, 1)  # 8 warps x 2 CTAs: default shape only
    monkeypatch.setattr(cu, "_tile_opt", "")
    assert cu._tile_choice(16384) == (2, "", 8, 1) and cu._tile_choice(300) == (1, "", 16, 1)
    for n in (1, 300, 16384, 16385, 120268, 131072):
        cluster, opt, warps, groups = cu._tile_choice(n)
        cu._tile_kernel_name(cluster, "async", opt, warps, groups)  # compiled (no ValueError)


def test_fps_cluster_config():
    from pcops.cuda import sampling as cu

    assert cu._config(1, 16) == (1, 1)
    assert cu._config(16384, 16) == (8, 4)  # F1: 8 CTAs of 2,048 points
    assert cu._config(120268, 16) == (16, 16)  # F2: 16 CTAs of 7,517 points
    assert cu._config(120268, 8) is None  # too large for portable clusters: Triton
    assert cu._config(131072, 16) == (16, 16) and cu._config(131073, 16) is None
    assert cu._config(16385, 16) == (16, 4)
    assert cu._config(120268, 8, max_ppt=32) == (8, 32)  # the pruned fallback without 16-CTA clusters


def test_cluster_launch_structs_match_cuda_h():
    import ctypes

    from pcops.cuda import sampling as cu

    assert ctypes.sizeof(cu._LaunchAttribute) == 72  # id, pad to 8, 64-byte value union
    assert cu._LaunchConfig.stream.offset == 32 and cu._LaunchConfig.attrs.offset == 40
    assert ctypes.sizeof(cu._LaunchConfig) == 56


@pytest.mark.parametrize("variant", ["keys", "lazy", "flat", "pruned"])
@pytest.mark.parametrize("launch", ["_launch_ex", "_launch"])
@pytest.mark.parametrize("cluster,ppt,n", [(16, 16, 120268), (16, 4, 20000), (8, 4, 16384), (2, 1, 700), (1, 8, 3001),
                                           (8, 32, 120268)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_cluster_launch_paths(launch, cluster, ppt, n, variant, monkeypatch):
    """Each kernel variant and way of launching it, directly (the dispatcher would hide a failure)."""
    from pcops.cuda import sampling as cu

    if launch == "_launch_ex" and ppt not in (4, 8, 16):
        pytest.skip("no runtime-shaped entry for this points-per-thread")
    if launch == "_launch_ex" and variant == "flat":
        pytest.skip("the flat variant has compile-time cluster shapes only")
    if ppt == 32 and (variant != "pruned" or launch == "_launch_ex"):
        pytest.skip("32 points per thread: the pruned variant's portable fallback only")
    m = 64 if n > 5000 else 600  # small clouds: run until the duplicates tie

    def build():
        pts, _ = make_clouds(2, n, seed=5, scale=10.0, duplicates=n < 5000, device="cuda")
        lengths = torch.tensor([n, n // 3], device="cuda")
        start = torch.tensor([0, 5], device="cuda")
        return pts, lengths, start, ref.farthest_point_sample(pts, lengths, start, m)

    pts, lengths, start, expected = cached_reference(("launch", n, m), build)  # once per cloud for all cases
    out = torch.full((2, m), -1, dtype=torch.int64, device="cuda")
    inputs = cu._Inputs(pts, lengths, start, out, m)
    getattr(cu, launch)(inputs, cluster, ppt, variant)
    assert torch.equal(out, expected), cu.last_launch


@pytest.mark.parametrize("keys32", [True, False])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_order(keys32, monkeypatch):
    """fps_morton_keys[32] + one stable sort: per cloud a permutation of its indices, valid points first,
    Morton codes of the valid points ascending (spatially compact groups); 32-bit keys: 9 bits per
    axis for 3 clouds (2 batch bits + 1 padding bit + 27 <= 31), 64-bit keys: 10."""
    from pcops.cuda import sampling as cu

    monkeypatch.setattr(cu, "_order_keys32", keys32)
    bits = 9 if keys32 else 10
    pts, lengths = make_clouds(3, 1000, seed=9, scale=10.0, device="cuda")
    lengths[1], lengths[2] = 1, 0
    inputs = cu._Inputs(pts, lengths, lengths, torch.empty(0, dtype=torch.int64, device="cuda"), 1)
    order = inputs.order().view(3, 1000).cpu() - torch.arange(3)[:, None] * 1000
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


@pytest.mark.parametrize("opt", ["", "shfl", "unroll", "shfl_unroll", "leader", "shfl_leader"])
@pytest.mark.parametrize("exchange", ["bar", "async"])
@pytest.mark.parametrize("cluster", [1, 2, 4, 8])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_kernels(cluster, exchange, opt):
    """Every fps_tile entry point launched directly: uneven batches with ties, an F1-like batch, and
    (8 CTAs) the whole 120k scan size; indices identical to the reference."""
    from pcops.cuda import sampling as cu

    if cluster == 1 and exchange == "async":
        pytest.skip("one CTA: no exchange variant")
    if opt and cluster > 1 and exchange == "bar":
        pytest.skip("the cluster-barrier exchange is compiled with the default code shape only")
    if "leader" in opt and cluster > 1:
        pytest.skip("the leader reduction is compiled for one CTA only")
    cases = [(3, 1000, 1000, True), (2, 4099, 2600, True), (8, 16384, 256, False), (2, 40000, 256, False)]
    if cluster == 8:
        cases.append((1, 120268, 128, False))
    for batch, n, m, dup in cases:
        if cu._tile_plan(n, min_cluster=cluster) != cluster:
            continue
        # the inputs (and cached references) of the other FPS GPU tests
        pts, lengths, start, expected = fps_case(batch, n, m, duplicates=dup, scale=1.0 if n == 4099 else 10.0,
                                                 seed=1 if n == 4099 else None)
        out = torch.full((batch, m), -1, dtype=torch.int64, device="cuda")
        cu._launch_tile(cu._Inputs(pts, lengths, start, out, m), cluster, exchange, opt)
        assert torch.equal(out, expected), (n, cu.last_launch)


@pytest.mark.parametrize("exchange", ["bar", "async"])
@pytest.mark.parametrize("warps,cluster", [(8, 2), (4, 4)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_few_warps(warps, cluster, exchange, monkeypatch):
    """fps_tile with 8 or 4 warps per CTA (2 or 4 CTAs per 16k cloud), launched directly and through the op."""
    from pcops.cuda import sampling as cu

    monkeypatch.setattr(cu, "_tile_warps", warps)
    for batch, n, m, dup in [(3, 1000, 1000, True), (2, 4099, 2600, True), (8, 16384, 256, False)]:
        pts, lengths, start, expected = fps_case(batch, n, m, duplicates=dup, scale=1.0 if n == 4099 else 10.0,
                                                 seed=1 if n == 4099 else None)
        out = torch.full((batch, m), -1, dtype=torch.int64, device="cuda")
        cu._launch_tile(cu._Inputs(pts, lengths, start, out, m), cluster, exchange)
        assert torch.equal(out, expected), (n, cu.last_launch)
    monkeypatch.setattr(cu, "_VARIANT", "tile_async" if exchange == "async" else "tile")
    monkeypatch.setattr(cu, "_tile_min_cluster", cluster)
    pts, lengths, start, expected = fps_case(8, 16384, 256)
    assert torch.equal(pcops.farthest_point_sample(pts, 256, lengths, start, backend="cuda"), expected)
    assert f"w{warps}_c{cluster}" in cu.last_launch


@pytest.mark.parametrize("opt", ["", "shfl", "leader"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_64_points_per_lane(opt, monkeypatch):
    """fps_tile_*_w8g2_c1 (8 warps, 64 points and two boxes per lane, 16-bit indices), launched
    directly on uneven batches with ties and an F1-like batch, and through the op."""
    from pcops.cuda import sampling as cu

    monkeypatch.setattr(cu, "_tile_warps", 8)
    monkeypatch.setattr(cu, "_tile_groups", 2)
    monkeypatch.setattr(cu, "_tile_opt", opt)
    for batch, n, m, dup in [(3, 1000, 1000, True), (2, 4099, 2600, True), (8, 16384, 256, False)]:
        pts, lengths, start, expected = fps_case(batch, n, m, duplicates=dup, scale=1.0 if n == 4099 else 10.0,
                                                 seed=1 if n == 4099 else None)
        out = torch.full((batch, m), -1, dtype=torch.int64, device="cuda")
        cu._launch_tile(cu._Inputs(pts, lengths, start, out, m), 1)
        assert torch.equal(out, expected), (n, cu.last_launch)
    monkeypatch.setattr(cu, "_VARIANT", "tile")
    pts, lengths, start, expected = fps_case(8, 16384, 256)
    assert torch.equal(pcops.farthest_point_sample(pts, 256, lengths, start, backend="cuda"), expected)
    assert "w8g2_c1" in cu.last_launch


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
    dims, seed, valid, starts, m = (((32, 32, 40), 12, [40960, 30001], [3, 30000], 600) if large
                                    else ((32, 32, 16), 11, [16384, 9001], [0, 4321], 1500))

    def build():
        pts = lattice_clouds(2, dims, seed=seed).cuda()
        lengths = torch.tensor(valid, device="cuda")
        start = torch.tensor(starts, device="cuda")
        return pts, lengths, start, ref.farthest_point_sample(pts, lengths, start, m)

    return cached_reference(("lattice", *dims, m), build)


def tile_md_base_cases():
    """Uneven lengths with duplicated points (ties; M > N: -1 padding)."""
    return [fps_case(3, 1000, 1000, duplicates=True), fps_case(2, 4099, 2600, seed=1, scale=1.0, duplicates=True)]


def check_tile_md_launches(cu, cases, *launch_args):
    """``cu._launch_tile_md(inputs, *launch_args)`` on each case equals its reference indices."""
    for pts, lengths, start, expected in cases:
        m = expected.shape[1]
        out = torch.full((pts.shape[0], m), -1, dtype=torch.int64, device="cuda")
        cu._launch_tile_md(cu._Inputs(pts, lengths, start, out, m), *launch_args)
        assert torch.equal(out, expected), (pts.shape, m, cu.last_launch)


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("unroll", [1, 2, 4])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_md(unroll, early, monkeypatch):
    """fps_tile_md[_e]_u<U>_c1 launched directly: uneven lengths with duplicated points (ties; M > N:
    -1 padding), one point, lattices (ties at every level, 16,384 points: register slots included),
    an F1-like batch; indices identical to the reference. Then through the op, where clouds over
    16,384 points take tile_async."""
    from pcops.cuda import sampling as cu

    cases = tile_md_base_cases() + [fps_case(8, 16384, 256), fps_case(1, 1, 3), fps_case(3, 31, 40, duplicates=True),
                                    tile_md_lattice()]
    check_tile_md_launches(cu, cases, unroll, early, 1, "")
    monkeypatch.setattr(cu, "_VARIANT", "tile_md")
    monkeypatch.setattr(cu, "_tile_md_unroll", unroll)
    monkeypatch.setattr(cu, "_tile_md_early", early)
    monkeypatch.setattr(cu, "_tile_md_shape", "")
    monkeypatch.setattr(cu, "_tile_md_cluster", False)  # the fallback; clusters have their own test
    for batch, n, m in [(8, 16384, 256), (2, 40000, 256)]:
        pts, lengths, start, expected = fps_case(batch, n, m)
        assert torch.equal(pcops.farthest_point_sample(pts, m, lengths, start, backend="cuda"), expected)
        assert ("fps_tile_md" in cu.last_launch) == (n <= 16384), cu.last_launch


@pytest.mark.parametrize("shape,unroll", [("l", 1), ("w8", 1), ("w8", 2), ("w8l", 1), ("w8l", 2), ("w4", 2), ("w4", 4),
                                          ("w4l", 2), ("w4l", 4), ("s", 1), ("k", 1), ("sk", 1), ("sk", 2),
                                          ("esk", 1)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_md_shapes(shape, unroll, monkeypatch):
    """fps_tile_md_<shape>_u<U>_c1 (leader warp, 8 or 4 warps of two or four boxes per lane, hoisted shared
    addresses and kept records: s, k, sk the default, esk): the cases of
    test_gpu_fps_tile_md (ties, lattices, padding, 16,384 points with register slots), then through the op."""
    from pcops.cuda import sampling as cu

    cases = tile_md_base_cases() + [fps_case(8, 16384, 256), fps_case(1, 1, 3), fps_case(3, 31, 40, duplicates=True),
                                    tile_md_lattice()]
    check_tile_md_launches(cu, cases, unroll, False, 1, shape)
    monkeypatch.setattr(cu, "_VARIANT", "tile_md")
    monkeypatch.setattr(cu, "_tile_md_unroll", unroll)
    monkeypatch.setattr(cu, "_tile_md_shape", shape)
    pts, lengths, start, expected = fps_case(8, 16384, 256)
    assert torch.equal(pcops.farthest_point_sample(pts, 256, lengths, start, backend="cuda"), expected)
    assert f"fps_tile_md_{shape}_u{unroll}_c1" in cu.last_launch, cu.last_launch


@pytest.mark.parametrize("cluster,unroll", [(1, 2), (1, 4), (1, 8), (8, 4), (8, 8)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_md_adaptive(cluster, unroll, monkeypatch):
    """fps_tile_md[_e]_a_u<U>_c<C> (adaptive batches) launched directly on uneven batches with ties,
    padding, lattices (and, 8 CTAs, 40k and 120k clouds), then through the op."""
    from pcops.cuda import sampling as cu

    cases = tile_md_base_cases() + [fps_case(3, 31, 40, duplicates=True)]
    if cluster == 1:
        cases += [fps_case(8, 16384, 256), tile_md_lattice()]
    else:
        cases += [fps_case(2, 40000, 256), fps_case(1, 120268, 128), tile_md_lattice(large=True)]
    check_tile_md_launches(cu, cases, unroll, True, cluster, "", True)
    monkeypatch.setattr(cu, "_VARIANT", "tile_md")
    monkeypatch.setattr(cu, "_tile_md_adaptive", True)
    monkeypatch.setattr(cu, "_tile_md_shape", "")  # adaptive batches are compiled without the shapes
    monkeypatch.setattr(cu, "_tile_md_cluster", True)
    monkeypatch.setattr(cu, "_tile_md_unroll", unroll)
    batch, n = (8, 16384) if cluster == 1 else (2, 40000)
    pts, lengths, start, expected = fps_case(batch, n, 256)
    if cluster == 8:
        monkeypatch.setattr(cu, "_tile_min_cluster", 8)
    assert torch.equal(pcops.farthest_point_sample(pts, 256, lengths, start, backend="cuda"), expected)
    assert cu._tile_md_kernel_name(unroll, True, cluster, "", True) in cu.last_launch, cu.last_launch


@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_md_stats():
    """The diagnostic fps_tile_md_stats_u1_c1: the op's indices and counters that add up."""
    from pcops.cuda import sampling as cu

    pts = make_clouds(2, 3001, seed=4, scale=10.0, device="cuda")[0]
    full = torch.full((2,), 3001, device="cuda")
    expected = ref.farthest_point_sample(pts, full, torch.zeros(2, dtype=torch.int64, device="cuda"), 700)
    counts, got = cu.tile_md_stats(pts, 700)
    assert torch.equal(got, expected)
    assert 0 < counts["groups updated per step per CTA (of 512)"] <= 512
    assert 0 <= counts["warp-steps without update"] <= 1
    assert counts["groups updated per warp-step: rms"] >= counts["groups updated per warp-step: mean"]


@pytest.mark.parametrize("opt", ["", "sk"])
@pytest.mark.parametrize("cluster,unroll", [(2, 2), (4, 2), (8, 2), (8, 4)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fps_tile_md_clusters(cluster, unroll, opt, monkeypatch):
    """fps_tile_md_e_u<U>_c<C> (clusters, st.async exchange) launched directly: uneven lengths with
    duplicates (ties across CTAs; M > N), a lattice (ties everywhere), 40k clouds and (8 CTAs) the
    120k scan size, whose CTAs also use the register slots; then through the op (_tile_md_cluster)."""
    from pcops.cuda import sampling as cu

    # 30,000 points in 2 CTAs, 40,000 in 4 or 8, 120,268 in 8: 15,000 and 15,034 per CTA use register slots
    cases = tile_md_base_cases() + [fps_case(2, 30000 if cluster == 2 else 40000, 256)]
    if cluster == 8:
        cases.append(fps_case(1, 120268, 128))
    if cluster >= 4:
        cases.append(tile_md_lattice(large=True))
    check_tile_md_launches(cu, cases, unroll, True, cluster, None, None, opt)
    monkeypatch.setattr(cu, "_VARIANT", "tile_md")
    monkeypatch.setattr(cu, "_tile_md_cluster", True)
    monkeypatch.setattr(cu, "_tile_md_cluster_opt", opt)
    monkeypatch.setattr(cu, "_tile_md_unroll", unroll)
    monkeypatch.setattr(cu, "_tile_min_cluster", cluster)
    pts, lengths, start, expected = fps_case(2, 40000, 256)
    assert torch.equal(pcops.farthest_point_sample(pts, 256, lengths, start, backend="cuda"), expected)
    # the fewest CTAs >= cluster that hold 40,000 points: 4 for cluster 2
    assert cu._tile_md_kernel_name(unroll, True, cu._tile_plan(40000)) in cu.last_launch, cu.last_launch


# --- the Triton kernels compile for sm_90 (the interpreter does not type-check like the compiler) --


_AOT_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import sampling as tri

target = GPUTarget("cuda", 90, 32)


def compile_(fn, types, constexprs, num_warps):
    sig = dict(zip(fn.arg_names, types + ["constexpr"] * len(constexprs)))
    triton.compile(ASTSource(fn, sig, constexprs), target=target,
                   options={"num_warps": num_warps, "enable_fp_fusion": False})


compile_(tri._fps_kernel, ["*fp32", "*i64", "*i64", "*i64", "i32", "i32"], dict(BLOCK=16384), 32)
compile_(tri._fps_stream_kernel, ["*fp32", "*i64", "*i64", "*fp32", "*i64", "i32", "i32"], dict(CHUNK=4096), 16)
compile_(tri._morton_kernel, ["*fp32", "*i64", "*fp32", "*fp32", "*i32", "i32"],
         dict(BLOCK=1024, INVALID=1 << 30, CELLS=1024), 4)
compile_(tri._sort_gather_kernel, ["*fp32", "*i64", "*i64", "*fp32", "*fp32", "i32", "i32"], dict(TILE=32), 4)
knn_types = ["*fp32", "*i64", "*fp32", "*i64", "*fp32", "*fp32", "*i64", "*i64", "*fp32", "*i64"] + ["i32"] * 4
for kp in (2, 16, 32):
    compile_(tri._knn_kernel, knn_types, dict(BQ=tri._KNN_BQ, BR=tri._KNN_BR, SB=tri._KNN_SB, KP=kp), tri._KNN_WARPS)
compile_(tri._ball_query_kernel, ["*fp32", "*fp32", "*i64", "*i64", "*i64", "*i64", "i32", "i32", "fp32", "i32"],
         dict(BQ=tri._BALL_BQ, BR=tri._BALL_BR), 4)
print("compiled")
"""


def test_triton_kernels_compile_for_sm90():
    run_compiler_script(_AOT_SCRIPT)
