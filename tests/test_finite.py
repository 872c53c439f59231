"""The non-finite policy (``pcops._finite``, issue 18) on every backend.

Point ops: a point with a NaN or ±inf coordinate is absent. The oracle here does not use
``pcops._finite``: it drops those points by hand, runs the reference on the finite cloud and maps
the indices back. Value ops (sparse softmax, LayerNorm+GELU, swish/dropout/residual, pillar
scatter): NaN propagates as in torch, identically on the reference, the Triton kernels (the CPU
interpreter here, the GPU with the ``gpu`` marker) and the CUDA C++ kernels.
"""

import math

import pytest
import torch
from _util import generator, gpu, interpret

import pcops
from pcops import _finite
from pcops.reference import fps as ref_fps
from pcops.reference import knn as ref_knn

BAD = (float("nan"), float("inf"), float("-inf"))


def clouds_with_bad_points(batch, n, seed, frac=0.25, all_bad_cloud=False):
    """``(B, N, 3)`` float32 clouds with lengths and a random share of non-finite coordinates."""
    g = generator(seed)
    pts = torch.rand(batch, n, 3, generator=g) * 4
    lengths = torch.randint(max(n // 2, 1), n + 1, (batch,), generator=g)
    bad = torch.rand(batch, n, generator=g) < frac
    if all_bad_cloud:
        bad[-1] = True
    axis = torch.randint(0, 3, (batch, n), generator=g)
    kind = torch.randint(0, 3, (batch, n), generator=g)
    for b, i in bad.nonzero().tolist():
        pts[b, i, axis[b, i]] = BAD[kind[b, i]]
    return pts, lengths


def finite_clouds(pts, lengths):
    """The finite points of each cloud, packed first (by hand), their counts and original indices."""
    batch, n, _ = pts.shape
    out = torch.zeros_like(pts)
    counts = torch.zeros(batch, dtype=torch.int64)
    index = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        j = 0
        for i in range(int(lengths[b])):
            if all(math.isfinite(float(v)) for v in pts[b, i]):
                out[b, j], index[b, j] = pts[b, i], i
                j += 1
        counts[b] = j
    return out, counts, index


def to_original(idx, index):
    flat = idx.reshape(idx.shape[0], -1)
    mapped = torch.where(flat >= 0, index.gather(1, flat.clamp(min=0)), flat)
    return mapped.reshape(idx.shape)


def fps_oracle(pts, lengths, start, m):
    fin, counts, index = finite_clouds(pts, lengths)
    # the start point, renumbered among the finite points (the lowest finite one if it is not finite)
    new_start = torch.zeros_like(start)
    for b in range(pts.shape[0]):
        hit = (index[b] == start[b]).nonzero()
        new_start[b] = int(hit[0, 0]) if len(hit) else 0
    return to_original(ref_fps.farthest_point_sample(fin, counts, new_start, m), index)


def knn_oracle(q, r, ql, rl, k):
    fin, counts, index = finite_clouds(r, rl)
    bad_q = ~torch.isfinite(q).all(-1)
    d, i = ref_knn.knn(torch.where(bad_q[..., None], 0.0, q), fin, ql, counts, k)
    i = to_original(i, index)
    return d.masked_fill(bad_q[..., None], math.inf), i.masked_fill(bad_q[..., None], -1)


def ball_oracle(q, r, ql, rl, radius, k):
    fin, counts, index = finite_clouds(r, rl)
    bad_q = ~torch.isfinite(q).all(-1)
    i, c = ref_knn.ball_query(torch.where(bad_q[..., None], 0.0, q), fin, ql, counts, radius, k)
    return to_original(i, index).masked_fill(bad_q[..., None], -1), c.masked_fill(bad_q, 0)


# --- point ops on the CPU: the reference and the numba paths ---------------------------------


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("batch,n,m", [(1, 9, 9), (3, 40, 16), (2, 70, 80)])
def test_fps_non_finite_points_are_absent(backend, batch, n, m):
    pts, lengths = clouds_with_bad_points(batch, n, seed=n + batch, all_bad_cloud=batch > 2)
    start = torch.zeros(batch, dtype=torch.int64)
    got = pcops.farthest_point_sample(pts, m, lengths, start, backend=backend)
    assert torch.equal(got, fps_oracle(pts, lengths, start, m))
    for b in range(batch):  # invariants: finite, distinct, padded once the finite points run out
        chosen = got[b][got[b] >= 0]
        assert torch.isfinite(pts[b, chosen]).all() and len(set(chosen.tolist())) == len(chosen)
        finite = int(torch.isfinite(pts[b, : int(lengths[b])]).all(-1).sum())
        assert len(chosen) == min(m, finite) and bool((got[b][len(chosen) :] == -1).all())


def test_fps_non_finite_start_starts_at_the_first_finite_point():
    pts = torch.rand(1, 6, 3, generator=generator(3))
    pts[0, 0, 1] = float("nan")
    pts[0, 1, 2] = float("inf")
    for backend in ("reference", "auto"):
        got = pcops.farthest_point_sample(pts, 4, backend=backend)
        assert int(got[0, 0]) == 2 and not bool(((got == 0) | (got == 1)).any())


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("batch,nq,nr,k", [(1, 5, 9, 4), (3, 30, 50, 8), (2, 17, 12, 20)])
def test_knn_non_finite_points(backend, batch, nq, nr, k):
    q, ql = clouds_with_bad_points(batch, nq, seed=nq)
    r, rl = clouds_with_bad_points(batch, nr, seed=nr + 1, all_bad_cloud=batch > 2)
    d, i = pcops.knn(q, r, k, ql, rl, backend=backend)
    d_exp, i_exp = knn_oracle(q, r, ql, rl, k)
    assert torch.equal(i, i_exp) and torch.equal(d, d_exp)
    bad_q = ~torch.isfinite(q).all(-1)
    assert bool((i[bad_q] == -1).all()) and bool(torch.isinf(d[bad_q]).all())


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_ball_query_non_finite_points(backend):
    q, ql = clouds_with_bad_points(2, 25, seed=5)
    r, rl = clouds_with_bad_points(2, 60, seed=6)
    idx, cnt = pcops.ball_query(q, r, 1.5, 8, ql, rl, backend=backend)
    i_exp, c_exp = ball_oracle(q, r, ql, rl, 1.5, 8)
    assert torch.equal(idx, i_exp) and torch.equal(cnt, c_exp)


def test_knn_gradient_ignores_non_finite_points():
    q, ql = clouds_with_bad_points(1, 12, seed=8)
    r, rl = clouds_with_bad_points(1, 20, seed=9)
    q.requires_grad_(True)
    r.requires_grad_(True)
    d, _ = pcops.knn(q, r, 3, ql, rl, backend="reference")
    d.masked_fill(torch.isinf(d), 0).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(r.grad).all()
    bad_r = ~torch.isfinite(r.detach()).all(-1)
    assert bool((r.grad[bad_r] == 0).all())


def test_partition_is_stable_and_restores_indices():
    pts, lengths = clouds_with_bad_points(3, 33, seed=10)
    keep = _finite._keep(pts, lengths)
    moved, counts, perm, _ = _finite.partition(pts, keep)
    fin, counts_exp, index = finite_clouds(pts, lengths)
    assert torch.equal(counts, counts_exp)
    for b in range(3):
        c = int(counts[b])
        assert torch.equal(moved[b, :c], fin[b, :c]) and torch.equal(perm[b, :c], index[b, :c])
        assert bool((moved[b, c:] == 0).all())  # no NaN reaches a kernel, even as padding
    idx = torch.tensor([[0, 2, -1], [1, -1, -1], [0, 1, 2]])
    assert torch.equal(_finite.restore(idx, perm), to_original(idx, index))


# --- point ops: the Triton kernels under the interpreter ---------------------------------------


@interpret
def test_triton_point_ops_non_finite_interpreter():
    from pcops.triton import fps as tri_fps
    from pcops.triton import knn as tri_knn

    pts, lengths = clouds_with_bad_points(2, 40, seed=11, all_bad_cloud=True)
    start = torch.tensor([3, 0])
    lengths[0] += 5  # past the cloud: every path clamps (the Triton passes inside their kernels)
    for fps in (_finite.fps, _finite.fps_triton):  # the torch ops (CPU) and the passes of the CUDA path
        got = fps(tri_fps.farthest_point_sample, pts, lengths, start, 24)
        assert torch.equal(got, fps_oracle(pts, lengths.clamp(max=40), start, 24))
    q, ql = clouds_with_bad_points(2, 20, seed=12)
    d_exp, i_exp = knn_oracle(q, pts, ql, lengths.clamp(max=40), 6)
    for knn in (_finite.knn, _finite.knn_triton):
        d, i = knn(tri_knn.knn, q, pts, ql, lengths, 6)
        assert torch.equal(i, i_exp) and torch.equal(d, d_exp)
    # query lengths past the clouds too (the kernels clamp them)
    d, i = _finite.knn_triton(tri_knn.knn, q, pts, ql + 30, lengths, 6)
    d_exp, i_exp = knn_oracle(q, pts, torch.full_like(ql, 20), lengths.clamp(max=40), 6)
    assert torch.equal(i, i_exp) and torch.equal(d, d_exp)
    d_exp, i_exp = knn_oracle(pts, pts, lengths.clamp(max=40), lengths.clamp(max=40), 5)
    for knn in (_finite.knn, _finite.knn_triton):  # self-KNN: one tensor, one lengths tensor
        d, i = knn(tri_knn.knn, pts, pts, lengths, lengths, 5)
        assert torch.equal(i, i_exp) and torch.equal(d, d_exp)
    i_exp, c_exp = ball_oracle(q, pts, ql, lengths.clamp(max=40), 1.2, 5)
    for ball in (_finite.ball_query, _finite.ball_query_triton):
        idx, cnt = ball(tri_knn.ball_query, q, pts, ql, lengths, 1.2, 5)
        assert torch.equal(idx, i_exp) and torch.equal(cnt, c_exp)
    # no reference points at all (and non-finite queries): rows of −1 / inf, counts 0
    empty, none = pts[:, :0], torch.zeros(2, dtype=torch.int64)
    for knn in (_finite.knn, _finite.knn_triton):
        d, i = knn(tri_knn.knn, q, empty, ql, none, 3)
        assert bool((i == -1).all()) and bool(torch.isinf(d).all())
    for ball in (_finite.ball_query, _finite.ball_query_triton):
        idx, cnt = ball(tri_knn.ball_query, q, empty, ql, none, 1.2, 5)
        assert bool((idx == -1).all()) and bool((cnt == 0).all())


# --- sparse softmax: NaN as torch.softmax --------------------------------------------------------


def softmax_rows_with_bad_values(dtype=torch.float32):
    g = generator(13)
    rows = [torch.randn(n, generator=g) for n in (3, 7, 40, 5, 70, 2, 9)]
    rows[0][1] = float("nan")  # short row with a NaN
    rows[2][33] = float("nan")  # a NaN past the first chunk
    rows[3][0] = float("inf")
    rows[4][:40] = -math.inf  # first chunks all -inf, then a NaN
    rows[4][60] = float("nan")
    rows[5][:] = -math.inf  # all -inf: zeros (pcops' documented choice)
    values = torch.cat(rows).to(dtype)
    crow = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    return values, crow, rows


def check_softmax(y, crow, rows):
    for j, r in enumerate(rows):
        got = y[int(crow[j]) : int(crow[j + 1])].float()
        if bool(torch.isneginf(r).all()):
            assert bool((got == 0).all())
        elif bool((torch.isnan(r) | torch.isposinf(r)).any()):
            assert bool(torch.isnan(got).all()), f"row {j}: {got}"
        else:
            torch.testing.assert_close(got, torch.softmax(r.float(), 0), atol=1e-2, rtol=1e-2)


def test_sparse_softmax_nan_reference_and_auto():
    values, crow, rows = softmax_rows_with_bad_values()
    for backend in ("reference", "auto"):
        check_softmax(pcops.sparse_softmax(values, crow, backend=backend), crow, rows)


@interpret
def test_triton_sparse_softmax_nan_interpreter():
    from pcops.triton import sparse_softmax as tri

    values, crow, rows = softmax_rows_with_bad_values()
    for sub, vpt in ((4, 2), (32, 1)):  # rows longer than a chunk take the online loop
        check_softmax(tri.sparse_softmax(values, crow, sub=sub, vpt=vpt), crow, rows)


# --- value ops: NaN propagates like the reference --------------------------------------------


def same_nan(a, b):
    return torch.equal(torch.isnan(a), torch.isnan(b))


@interpret
def test_triton_layer_norm_gelu_nan_interpreter():
    from pcops.reference import layer_norm_gelu as ref
    from pcops.triton import layer_norm_gelu as tri

    x = torch.randn(6, 32, generator=generator(14))
    x[1, 3], x[4, 0] = float("nan"), float("inf")
    w, b = torch.ones(32), torch.zeros(32)
    y, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    yr, _, _ = ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    assert same_nan(y, yr) and bool(torch.isnan(y[1]).all())
    fin = torch.isfinite(yr)
    torch.testing.assert_close(y[fin], yr[fin], atol=1e-4, rtol=1e-4)


# --- GPU: every kernel against the CPU oracle ---------------------------------------------------


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("n", [50, 3000])
@gpu[0]
@gpu[1]
def test_gpu_point_ops_non_finite(backend, n):
    pts, lengths = clouds_with_bad_points(3, n, seed=n, all_bad_cloud=True)
    start = torch.tensor([0, 5, 1])
    got = pcops.farthest_point_sample(pts.cuda(), 64, lengths.cuda(), start.cuda(), backend=backend)
    assert torch.equal(got.cpu(), fps_oracle(pts, lengths, start, 64))
    p, pl = pts.cuda(), lengths.cuda()
    d, i = pcops.knn(p, p, 8, pl, pl, backend=backend)  # self-KNN: one shared sort
    d_exp, i_exp = knn_oracle(pts, pts, lengths, lengths, 8)
    assert torch.equal(i.cpu(), i_exp) and torch.equal(d.cpu(), d_exp)
    q, ql = clouds_with_bad_points(3, n // 2, seed=n + 1)
    d, i = pcops.knn(q.cuda(), pts.cuda(), 8, ql.cuda(), lengths.cuda(), backend=backend)
    d_exp, i_exp = knn_oracle(q, pts, ql, lengths, 8)
    assert torch.equal(i.cpu(), i_exp) and torch.equal(d.cpu(), d_exp)
    if backend == "triton":
        idx, cnt = pcops.ball_query(q.cuda(), pts.cuda(), 0.8, 16, ql.cuda(), lengths.cuda(), backend=backend)
        i_exp, c_exp = ball_oracle(q, pts, ql, lengths, 0.8, 16)
        assert torch.equal(idx.cpu(), i_exp) and torch.equal(cnt.cpu(), c_exp)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@gpu[0]
@gpu[1]
def test_gpu_sparse_softmax_nan(backend):
    values, crow, rows = softmax_rows_with_bad_values()
    check_softmax(pcops.sparse_softmax(values.cuda(), crow.cuda(), backend=backend).cpu(), crow, rows)


@gpu[0]
@gpu[1]
def test_gpu_value_ops_propagate_nan():
    x = torch.randn(64, 256, generator=generator(15))
    x[3, 7], x[9, 1] = float("nan"), float("-inf")
    w, b = torch.rand(256), torch.rand(256)
    y = pcops.fused_layer_norm_gelu(x.cuda(), w.cuda(), b.cuda(), backend="triton").cpu()
    yr = pcops.fused_layer_norm_gelu(x, w, b, backend="reference")
    assert same_nan(y, yr)
    feats = torch.randn(10, 16, generator=generator(16))
    feats[2, 5] = float("nan")
    coords = torch.stack([torch.zeros(10), torch.zeros(10), torch.zeros(10), torch.arange(10.0)], 1).int()
    canvas = pcops.pillar_scatter(feats.cuda(), coords.cuda(), 1, (4, 16)).cpu()
    canvas_ref = pcops.pillar_scatter(feats, coords, 1, (4, 16), backend="reference")
    assert same_nan(canvas, canvas_ref) and int(torch.isnan(canvas).sum()) == 1


@interpret
def test_triton_elementwise_value_ops_nan_interpreter():
    from pcops.reference import pillar_scatter as ref_ps
    from pcops.reference import swish_dropout_residual as ref_sw
    from pcops.triton import pillar_scatter as tri_ps
    from pcops.triton import swish_dropout_residual as tri_sw

    x = torch.randn(4, 33, generator=generator(17))
    res = torch.randn(4, 33, generator=generator(18))
    x[0, 1], x[2, 5], res[3, 3] = float("nan"), float("inf"), float("-inf")
    y, yr = tri_sw.swish_dropout_residual(x, res, 0.0, None), ref_sw.swish_dropout_residual(x, res, 0.0)
    assert same_nan(y, yr) and torch.equal(torch.isinf(y), torch.isinf(yr))
    fin = torch.isfinite(yr)
    torch.testing.assert_close(y[fin], yr[fin])
    feats = torch.randn(6, 8, generator=generator(19))
    feats[1, 2], feats[4, 0] = float("nan"), float("inf")
    coords = torch.tensor([[0, 0, 0, i] for i in range(6)], dtype=torch.int32)
    canvas, _ = tri_ps.pillar_scatter(feats, coords, 1, 2, 8)
    canvas_ref, _ = ref_ps.pillar_scatter(feats, coords, 1, 2, 8)
    assert same_nan(canvas, canvas_ref) and torch.equal(torch.nan_to_num(canvas), torch.nan_to_num(canvas_ref))


def test_cpu_value_ops_propagate_nan():
    feats = torch.randn(12, 5, generator=generator(20))
    feats[3, 1] = float("nan")
    p2v = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3, -1])
    for reduce in ("mean", "max", "sum"):
        out = pcops.voxel_reduce(feats, p2v, 4, reduce=reduce)
        assert bool(torch.isnan(out[1, 1])) and int(torch.isnan(out).sum()) == 1, reduce
    idx = torch.tensor([[3, 0, -1]])
    g = pcops.gather_points(feats[None], idx)
    assert bool(torch.isnan(g[0, 0, 1])) and bool((g[0, 2] == 0).all())


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_self_knn_non_finite_points(backend):
    """query is ref (one lengths tensor): the shared-sort path gives the policy's result too."""
    pts, lengths = clouds_with_bad_points(3, 45, seed=21, all_bad_cloud=True)
    d, i = pcops.knn(pts, pts, 6, lengths, lengths, backend=backend)
    d_exp, i_exp = knn_oracle(pts, pts, lengths, lengths, 6)
    assert torch.equal(i, i_exp) and torch.equal(d, d_exp)


@interpret
def test_triton_partition_and_restore_interpreter():
    """pcops.triton.finite (the CUDA path of the policy) against the torch ops of pcops._finite."""
    from pcops.triton import finite as tri

    pts, lengths = clouds_with_bad_points(3, 1500, seed=22, all_bad_cloud=True)
    lengths[0] = 1500
    start = torch.tensor([4, 1, 1700])  # cloud 2: out of range
    keep = _finite._keep(pts, lengths)
    moved, counts, perm, pos = _finite.partition(pts, keep)
    got = tri.partition(pts, lengths, start)
    for a, b in zip(got[:4], (moved, counts, perm, pos)):
        assert torch.equal(a, b)
    s = start.clamp(0, 1499)
    fin = keep.gather(1, s[:, None])[:, 0]
    exp_start = torch.where(fin, pos.gather(1, s[:, None])[:, 0], 0).where((start >= 0) & (start < lengths), -1)
    assert torch.equal(got[4], exp_start)
    idx = torch.randint(-1, 40, (3, 7, 5), generator=generator(23))
    d = torch.rand(3, 7, 5, generator=generator(24))
    assert torch.equal(tri.restore(idx[:, 0], perm), _finite.restore(idx[:, 0], perm))
    rows = torch.randint(0, 7, (3, 7), generator=generator(25))
    q = torch.rand(3, 7, 3, generator=generator(26))
    q[1, 2, 0] = float("nan")
    q[0, 4, 2] = -float("inf")
    bad_rows = ~torch.isfinite(q).all(-1, keepdim=True)
    assert torch.equal(tri.zero_non_finite(q), q.masked_fill(bad_rows, 0))
    zeroed, mask = tri.zero_non_finite(q, with_mask=True)
    assert torch.equal(zeroed, q.masked_fill(bad_rows, 0)) and torch.equal(mask, bad_rows[..., 0])
    assert torch.equal(tri.zero_non_finite(q.double()), q.double().masked_fill(bad_rows, 0))
    d_got, i_got = tri.restore(idx, perm, d, rows=rows, query=q)
    r = rows[..., None].expand(-1, -1, 5)
    bad = ~torch.isfinite(q).all(-1)[..., None]
    assert torch.equal(i_got, _finite.restore(idx.gather(1, r), perm).masked_fill(bad, -1))
    assert torch.equal(d_got, d.gather(1, r).masked_fill(bad, float("inf")))
