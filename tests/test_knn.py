"""pcops.knn: KNN, ball query, gather — reference vs Triton/CUDA, gradients, registration, backends, bad input."""

import logging

import numpy as np
import pytest
import torch

import pcops
from pcops.reference import knn as ref

from _clouds import cached_reference, load_scan_xyz, make_clouds, tie_grid_clouds
from _util import generator, interpret, requires_cuda, run_compiler_script


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


@pytest.mark.parametrize(
    "batch,nq,nr,k,radius", [(1, 1, 1, 1, 0.5), (2, 13, 29, 5, 0.9), (3, 7, 31, 40, 1.5), (1, 4, 0, 3, 1.0)]
)
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


def test_backends_on_the_cpu(caplog):
    q, ql = make_clouds(2, 19, seed=15)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        d, i = pcops.knn(q, q, 4, ql, ql)
    assert ("knn: cpu" if pcops.cpu.numba_available() else "knn: reference") in caplog.text
    d2, i2 = pcops.knn(q, q, 4, ql, ql, backend="reference")
    assert torch.equal(i, i2) and torch.equal(d, d2)
    i3, c3 = pcops.ball_query(q, q, 0.8, 4, ql, ql, backend="reference")
    assert torch.equal(i3, pcops.ball_query(q, q, 0.8, 4, ql, ql)[0])
    assert torch.equal(pcops.gather_points(q, i, backend="reference"), pcops.gather_points(q, i))
    for backend in ("triton", "cuda"):  # no silent fallback to the CPU path
        with pytest.raises(ValueError, match="CUDA tensors only"):
            pcops.knn(q, q, 4, backend=backend)
        with pytest.raises(ValueError, match="CUDA tensors only"):
            torch.ops.pcops.knn(q, q, ql, ql, 4, backend)
    with pytest.raises(ValueError, match="CUDA tensors only"):
        pcops.ball_query(q, q, 0.8, 4, backend="triton")


# --- the fast CPU path (pcops.cpu.knn) --------------------------------------------------------

requires_numba = pytest.mark.skipif(not pcops.cpu.numba_available(), reason="numba not installed")


def cpu_cases():
    """(query, ref, ql, rl, k, radius): uneven batches, duplicates, integer-grid ties, K > N,
    empty clouds, zero lengths, a non-finite cloud (its padding non-finite too)."""
    for seed, (batch, nq, nr, k) in enumerate(
        [
            (3, 37, 53, 5),
            (2, 100, 300, 16),
            (4, 60, 17, 32),
            (1, 5, 0, 3),
            (2, 200, 200, 40),
            (3, 1, 1, 1),
            (2, 0, 9, 4),
        ]
    ):
        q, ql = make_clouds(batch, nq, seed=seed)
        r, rl = make_clouds(batch, nr, seed=seed + 50, duplicates=True)
        yield q, r, ql, rl, k, 1.0
        g, gl = tie_grid_clouds(batch, max(nr, 1), seed=seed, device="cpu")
        yield g, g, gl, gl, k, 1.5  # self query on a grid: exact distance ties everywhere
    q, ql = make_clouds(2, 30, seed=90)
    r, rl = make_clouds(2, 40, seed=91)
    rl[0] = 35
    q[0, 2, 2], r[0, 3, 1], r[0, 5, 0], r[0, 38, 0] = float("inf"), float("nan"), float("inf"), float("nan")
    r[1, 7] = 1e30  # finite, but its distances overflow to inf
    yield q, r, ql, rl, 40, 1.0
    yield q, r, ql, rl, 7, 1e20  # radius² overflows float32


@requires_numba
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_path_matches_reference(threads):
    from pcops.cpu import knn as cpu_knn

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for q, r, ql, rl, k, radius in cpu_cases():
            d, i = cpu_knn.knn(q, r, ql, rl, k)
            d_ref, i_ref = ref.knn(q, r, ql, rl, k)
            assert torch.equal(i, i_ref)
            torch.testing.assert_close(d, d_ref, rtol=0, atol=0, equal_nan=True)
            bi, bc = cpu_knn.ball_query(q, r, ql, rl, radius, k)
            bi_ref, bc_ref = ref.ball_query(q, r, ql, rl, radius, k)
            assert torch.equal(bi, bi_ref) and torch.equal(bc, bc_ref)
    finally:
        torch.set_num_threads(before)


@requires_numba
def test_cpu_path_on_a_scan_is_thread_independent():
    # larger clouds: a deep tree, many pruned nodes; LiDAR-like density (ground plane, clusters)
    g = generator(31)
    pts = torch.cat(
        [
            torch.randn(1, 3000, 3, generator=g) * torch.tensor([20.0, 20.0, 0.3]),
            torch.randn(1, 1096, 3, generator=g) * 0.5 + 3.0,
        ],
        1,
    )
    pts = torch.cat([pts, pts[:, torch.randperm(4096, generator=g)]])
    lengths = torch.tensor([4096, 3001])
    centres = pts[:, ::7].contiguous()
    d_ref, i_ref = ref.knn(centres, pts, torch.tensor([586, 300]), lengths, 16)
    b_ref = ref.ball_query(centres, pts, torch.tensor([586, 300]), lengths, 0.8, 32)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            d, i = pcops.knn(centres, pts, 16, torch.tensor([586, 300]), lengths)
            assert torch.equal(i, i_ref) and torch.equal(d, d_ref)
            b = pcops.ball_query(centres, pts, 0.8, 32, torch.tensor([586, 300]), lengths)
            assert torch.equal(b[0], b_ref[0]) and torch.equal(b[1], b_ref[1])
    finally:
        torch.set_num_threads(before)


@requires_numba
def test_cpu_reference_backend_runs_the_reference(caplog):
    q, ql = make_clouds(2, 19, seed=16)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.knn(q, q, 4, ql, ql, backend="reference")
        pcops.ball_query(q, q, 0.8, 4, ql, ql, backend="reference")
    assert "knn: reference" in caplog.text and "ball_query: reference" in caplog.text
    assert "cpu" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.knn(q, q, 4, ql, ql)
        pcops.ball_query(q, q, 0.8, 4, ql, ql)
        pcops.knn(q.double(), q.double(), 4, ql, ql)  # float64: the reference
    assert "knn: cpu" in caplog.text and "ball_query: cpu" in caplog.text and "knn: reference" in caplog.text


# --- registration -----------------------------------------------------------------------------


def sample_inputs(device="cpu"):
    q, ql = make_clouds(2, 11, seed=10, device=device)
    r, rl = make_clouds(2, 13, seed=11, device=device)
    return q, r, ql, rl


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])])
def test_opcheck(device):
    q, r, ql, rl = sample_inputs(device)
    gpu = ("triton", "cuda") if device == "cuda" else ()
    for backend in ("auto", "reference") + gpu:
        torch.library.opcheck(torch.ops.pcops.knn, (q, r, ql, rl, 3, backend))
    for backend in ("auto", "reference"):
        torch.library.opcheck(
            torch.ops.pcops.knn, (q.double().requires_grad_(), r.double().requires_grad_(), ql, rl, 3, backend)
        )
    for backend in ("auto", "reference") + gpu[:1]:
        torch.library.opcheck(torch.ops.pcops.ball_query, (q, r, ql, rl, 0.7, 4, backend))
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


@pytest.mark.parametrize(
    "call,exc,name",
    [
        (lambda: pcops.knn(P3, P3, 0), ValueError, "k"),
        (lambda: pcops.knn(P3, torch.zeros(3, 5, 3), 2), ValueError, "ref"),
        (lambda: pcops.knn(P3, torch.zeros(5, 3), 2), ValueError, "ref"),
        (lambda: pcops.knn(P3, torch.zeros(2, 5, 4), 2), ValueError, "ref"),
        (lambda: pcops.knn(P3, P3, 2, query_lengths=torch.tensor([1, 9])), ValueError, "query_lengths"),
        (lambda: pcops.knn(P3, P3, 2, ref_lengths=torch.tensor([1, 2, 3])), ValueError, "ref_lengths"),
        (lambda: pcops.knn(P3, P3, 2, backend="torch"), ValueError, "backend"),
        (lambda: pcops.ball_query(P3, P3, 0.0, 2), ValueError, "radius"),
        (lambda: pcops.ball_query(P3, P3, -1.0, 2), ValueError, "radius"),
        (lambda: pcops.ball_query(P3, P3, 1.0, 0), ValueError, "k"),
        (lambda: pcops.ball_query(P3, P3, 1.0, 2, backend="cuda"), ValueError, "backend"),
        (lambda: pcops.gather_points(P3, torch.tensor([[0, 5], [0, 0]])), ValueError, "idx"),
        (lambda: pcops.gather_points(P3, torch.tensor([[0, 1]])), ValueError, "idx"),
        (lambda: pcops.gather_points(P3, torch.tensor([[0.0, 1.0]])), TypeError, "idx"),
        (lambda: pcops.gather_points(P3, torch.tensor([[0], [1]]), backend="triton"), ValueError, "backend"),
    ],
)
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


@pytest.mark.gpu
@requires_cuda
def test_wrong_devices():
    with pytest.raises(ValueError, match="ref"):
        pcops.knn(P3, P3.cuda(), 2)


# --- Triton kernels under the CPU interpreter (tiny inputs) -----------------------------------


@pytest.mark.parametrize("batch,nq,nr,k", [(1, 1, 1, 1), (2, 13, 41, 5), (1, 50, 64, 16), (2, 7, 3, 4)])
@interpret
def test_triton_knn_interpreter(batch, nq, nr, k):
    from pcops.triton import knn as tri

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
def test_triton_knn_pruning_interpreter():
    from pcops.triton import knn as tri

    r, rl = make_clouds(2, 60, seed=12, scale=5.0)
    d, i = tri.knn(r, r, rl, rl, 3, bq=8, br=8, sb=2)
    d_ref, i_ref = ref.knn(r, r, rl, rl, 3)
    assert torch.equal(i, i_ref) and torch.equal(d, d_ref)


@pytest.mark.parametrize("batch,nq,nr,k,radius", [(1, 1, 1, 1, 0.3), (2, 11, 53, 4, 1.0), (1, 33, 70, 64, 2.0)])
@interpret
def test_triton_ball_query_interpreter(batch, nq, nr, k, radius):
    from pcops.triton import knn as tri

    q, ql = make_clouds(batch, nq, seed=nq + 5)
    r, rl = make_clouds(batch, nr, seed=nr + 6)
    idx, counts = tri.ball_query(q, r, ql, rl, radius, k)
    idx_ref, counts_ref = ref.ball_query(q, r, ql, rl, radius, k)
    assert torch.equal(idx, idx_ref) and torch.equal(counts, counts_ref)


# --- the CUDA C++ kernel: its source, no GPU needed -------------------------------------------


def test_cuda_knn_supported_without_a_gpu():
    """The launcher's eligibility test runs its cheap checks before touching CUDA (K above the
    compiled maximum or a batch over the grid limit: Triton under "auto", an error under "cuda")."""
    from pcops.cuda import knn as cuda_knn

    assert cuda_knn.MAX_K == 32
    assert not cuda_knn.supported(torch.zeros(1, 4, 3), cuda_knn.MAX_K + 1)
    assert "K <= 32" in cuda_knn.unsupported_reason(torch.zeros(1, 4, 3), 33)
    assert not cuda_knn.supported(torch.zeros(65536, 1, 3), 4)
    assert cuda_knn.default_group(16384) == 4 and cuda_knn.default_group(120268) == 8


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


def test_knn_cu_kernels_keep_the_top_k_in_registers():
    """csrc/knn.cu holds exactly the kernels the launcher names, and the search kernels keep their
    top K in registers (no ``.local`` array in their PTX: a run-time index into the list would put
    it in local memory)."""
    try:
        from pcops import _nvrtc

        _nvrtc.nvrtc()
    except RuntimeError as e:
        pytest.skip(f"NVRTC not installed: {e}")
    ptx = _nvrtc_ptx((_nvrtc.CSRC_DIR / "knn.cu").read_text(), "knn.cu")
    bodies = {}
    for chunk in ptx.split(".entry ")[1:]:
        bodies[chunk.split("(", 1)[0].strip()] = chunk.split("\n}", 1)[0]
    search = {f"knn_netfu_q32_k{kp}" for kp in (1, 2, 4, 8, 16, 32)}
    assert set(bodies) == search | {"knn_prep_bounds", "knn_prep_codes", "knn_prep_gather"}
    for name in search | {"knn_prep_codes", "knn_prep_gather"}:
        assert ".local" not in bodies[name], name


# --- the GPU paths --------------------------------------------------------------------------


def knn_case(batch, nq, nr, k):
    def build():
        q, ql = make_clouds(batch, nq, seed=nq, scale=10.0, device="cuda")
        r, rl = make_clouds(batch, nr, seed=nr + 1, scale=10.0, device="cuda")
        return q, r, ql, rl, ref.knn(q, r, ql, rl, k), ref.knn(r, r, rl, rl, k)

    return cached_reference(("knn", batch, nq, nr, k), build)


@pytest.mark.parametrize(
    "batch,nq,nr,k",
    [(1, 1, 1, 1), (2, 1000, 777, 16), (3, 513, 2049, 32), (4, 2048, 4096, 16), (1, 100, 5, 8), (2, 300, 300, 64)],
)
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_matches_reference(batch, nq, nr, k):
    q, r, ql, rl, (d_ref, i_ref), (ds_ref, is_ref) = knn_case(batch, nq, nr, k)
    d, i = pcops.knn(q, r, k, ql, rl)
    assert torch.equal(i, i_ref)
    assert torch.equal(d, d_ref)
    d, i = pcops.knn(r, r, k, rl, rl)  # self-KNN
    assert torch.equal(i, is_ref) and torch.equal(d, ds_ref)


@pytest.mark.gpu
@requires_cuda
def test_gpu_reference_matches_cpu_reference():
    """The oracle is device independent: the reference gives identical results on CPU and GPU."""
    q, ql = make_clouds(2, 300, seed=20, scale=10.0, duplicates=True)
    r, rl = make_clouds(2, 777, seed=21, scale=10.0)
    for args in ((q, r, ql, rl, 16), (q, q, ql, ql, 64)):
        d, i = ref.knn(*(a.cuda() for a in args[:4]), args[4])
        d_c, i_c = ref.knn(*args)
        assert torch.equal(i.cpu(), i_c) and torch.equal(d.cpu(), d_c)
    idx, c = ref.ball_query(q.cuda(), r.cuda(), ql.cuda(), rl.cuda(), 3.0, 32)
    idx_c, c_c = ref.ball_query(q, r, ql, rl, 3.0, 32)
    assert torch.equal(idx.cpu(), idx_c) and torch.equal(c.cpu(), c_c)


@pytest.mark.parametrize("backend", ["triton", "cuda", "auto", "reference"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_backends(backend, caplog):
    """Each backend on one input: identical results; "cuda" above K = 32 and float64 on an explicit
    GPU backend raise instead of running something else; "auto" picks the CUDA kernel for K <= 32."""
    from pcops.cuda import knn as cuda_knn

    q, r, ql, rl, (d_ref, i_ref), _ = knn_case(2, 1000, 777, 16)
    if backend == "cuda" and not cuda_knn.supported(q, 16):
        pytest.skip(cuda_knn.unsupported_reason(q, 16))
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        d, i = pcops.knn(q, r, 16, ql, rl, backend=backend)
    assert torch.equal(i, i_ref) and torch.equal(d, d_ref)
    if backend == "auto" and cuda_knn.supported(q, 16):
        assert "knn_netfu_q32_k16" in caplog.text
    if backend == "cuda":
        with pytest.raises(RuntimeError, match="K <= 32"):
            pcops.knn(q, r, 33, ql, rl, backend="cuda")
    if backend in ("cuda", "triton"):
        with pytest.raises(ValueError, match="float64"):
            pcops.knn(q.double(), r.double(), 4, ql, rl, backend=backend)


@pytest.mark.parametrize("k,group", [(1, 8), (3, 4), (17, 16), (32, 16), (16, None), (8, 1), (5, 3), (32, 4), (5, 2)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_cuda_kernel_ties_and_k(k, group):
    """The CUDA C++ kernel (K <= 32, KP = next power of two slots) against the reference, bit for bit:
    several clouds with uneven lengths, duplicate points and grid points (ties: lowest index first),
    several superblock sizes, cross and self, and a strided query view (made contiguous)."""
    from pcops.cuda import knn as cuda_knn

    q, ql = make_clouds(3, 2500, seed=40 + k, scale=6.0, duplicates=True, device="cuda")
    r, rl = make_clouds(3, 1800, seed=50 + k, scale=6.0, duplicates=True, device="cuda")
    g, gl = tie_grid_clouds(2, 1500, seed=80 + k, device="cuda")
    assert cuda_knn.supported(q, k)
    for a, b, la, lb in ((q, r, ql, rl), (q, q, ql, ql), (g, g, gl, gl), (r[:, :7], r, rl.clamp(max=7), rl)):
        d, i = cuda_knn.knn(a, b, la, lb, k, group=group)
        d_ref, i_ref = ref.knn(a, b, la, lb, k)
        assert torch.equal(i, i_ref), (k, group)
        assert torch.equal(d, d_ref), (k, group)


@pytest.mark.parametrize("group", [4, 8, 3, 1])
@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_cuda_prep_matches_triton(group):
    """csrc/knn.cu's prep kernels give the Triton _morton_sort's outputs exactly (sorted points,
    permutation, tile and superblock boxes)."""
    from pcops.cuda import knn as cuda_knn
    from pcops.triton.knn import _morton_sort

    q, ql = make_clouds(3, 3001, seed=90 + group, scale=6.0, duplicates=True, device="cuda")
    g, gl = tie_grid_clouds(2, 1500, seed=91, device="cuda")
    ql[1] = 0  # an empty cloud
    for pts, lengths in ((q, ql), (g, gl)):
        want = _morton_sort(pts, lengths, cuda_knn.TILE, group)
        got = cuda_knn.morton_sort(pts, lengths, group)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(got[2][..., :6], want[2][..., :6]) and torch.equal(got[3], want[3])


@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_kitti_k1_shape():
    """The K1 shape (8 clouds of 16,384 KITTI points, self-KNN, K = 16 and 32): CUDA and Triton agree
    bit for bit (the reference itself is pinned by the other tests on smaller clouds)."""
    from pcops.triton import knn as triton_knn

    scan = load_scan_xyz().cuda()
    g = generator(0)
    clouds = torch.stack(
        [scan[torch.randperm(scan.shape[0], generator=g)[:16384].cuda()] for _ in range(8)]
    ).contiguous()
    lengths = torch.full((8,), 16384, device="cuda")
    lengths[3] = 9001  # one uneven cloud
    for k in (16, 32):
        d, i = pcops.knn(clouds, clouds, k, lengths, lengths)
        d_t, i_t = triton_knn.knn(clouds, clouds, lengths, lengths, k)
        assert torch.equal(i, i_t) and torch.equal(d, d_t), k


@pytest.mark.gpu
@requires_cuda
def test_gpu_knn_kitti_and_backward():
    scan = load_scan_xyz().cuda()
    d, i = pcops.knn(scan, scan, 16)
    sub = torch.randperm(scan.shape[0], generator=generator(3))[:2000].cuda()
    d_ref, i_ref = ref.knn(
        scan[None, sub],
        scan[None],
        torch.tensor([2000], device="cuda"),
        torch.tensor([scan.shape[0]], device="cuda"),
        16,
        chunk=500,
    )
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
    for fn in (
        lambda: pcops.knn(pts, pts, 8, lengths, lengths)[1],
        lambda: pcops.ball_query(pts, pts, 0.5, 8, lengths, lengths)[0],
    ):
        fn()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = fn()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, fn())


# --- ball query on sorted cells (pcops.triton.ball_query_grid): the same hits as the scan ------


def _grid_case(case: str, gen: torch.Generator):
    """(query, ref, query_lengths, ref_lengths, radius, k) on small clouds."""
    b, nq, nr = 2, 20, 160
    q = torch.rand(b, nq, 3, generator=gen) * 4 - 2
    r = torch.rand(b, nr, 3, generator=gen) * 4 - 2
    if case == "clustered":  # dense spots around some queries: more hits than K
        r[:, : nr // 2] = q[:, :8].repeat(1, nr // 16, 1) + 0.05 * torch.randn(b, nr // 2, 3, generator=gen)
        return q, r, torch.tensor([nq, 13]), torch.tensor([nr, 97]), 0.3, 6
    if case == "aligned":  # coordinates on multiples of the radius: points on cell boundaries
        q = torch.randint(-3, 3, (b, nq, 3), generator=gen).float() * 0.25
        r = torch.randint(-3, 3, (b, nr, 3), generator=gen).float() * 0.25
        return q, r, torch.tensor([nq, nq]), torch.tensor([nr, nr]), 0.5, 5  # 0.5 away: not inside
    if case == "far":  # one reference beyond the key's range: every query takes the scan
        r[1, 7] = torch.tensor([3.0e5, 0.0, 0.0])
        return q, r, torch.tensor([nq, nq]), torch.tensor([nr, nr]), 1e-3 + 0.6, 7
    if case == "dense":  # many hits per cell and per merge step: K reached after several steps
        r = torch.rand(b, 600, 3, generator=gen) * 1.5 - 0.75
        return q * 0.4, r, torch.tensor([nq, 17]), torch.tensor([600, 451]), 0.45, 40
    if case == "nonfinite":  # NaN / ±inf coordinates: absent references, queries with no hit
        for t, i in ((r, 3), (r, 40), (r, 151), (q, 2), (q, 11)):
            t[i % 2, i % t.shape[1], i % 3] = (float("nan"), float("inf"), -float("inf"))[i % 3]
        r[:, 60:90] = q[:, :1] + 0.01 * torch.randn(b, 30, 3, generator=gen)  # one busy ball
        r[0, 70, 1] = float("nan")
        return q, r, torch.tensor([nq, nq]), torch.tensor([nr, 120]), 0.5, 8
    raise ValueError(case)


@interpret
@pytest.mark.parametrize("case", ["clustered", "aligned", "far", "dense", "nonfinite"])
def test_triton_interpreter_ball_query_grid_equals_scan(case):
    """The grid (which applies the non-finite policy itself) against the reference under the policy."""
    from pcops import _finite
    from pcops.triton import ball_query_grid

    q, r, ql, rl, radius, k = _grid_case(case, generator(40 + len(case)))
    got = ball_query_grid.ball_query(q, r, ql, rl, radius, k)
    want = _finite.ball_query(ref.ball_query, q, r, ql, rl, radius, k)
    assert int(want[1].sum()) > 20  # the case has hits
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("radius,k", [(0.8, 32), (0.2, 16), (2.0, 64)])
def test_gpu_ball_query_grid_equals_scan(radius, k):
    from pcops.triton import ball_query_grid, knn as tri_knn

    pts = load_scan_xyz().cuda()[None].contiguous()
    n = pts.shape[1]
    centres = pts[:, torch.randperm(n, generator=generator(5))[:2048].cuda()].contiguous()
    ql = torch.tensor([centres.shape[1]], device="cuda")
    rl = torch.tensor([n], device="cuda")
    got = ball_query_grid.ball_query(centres, pts, ql, rl, radius, k)
    want = tri_knn.ball_query(centres, pts, ql, rl, radius, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --- the Triton kernels compile for sm_90 (the interpreter does not type-check like the compiler) --


_AOT_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import knn as tri

target = GPUTarget("cuda", 90, 32)


def compile_(fn, types, constexprs, num_warps):
    sig = dict(zip(fn.arg_names, types + ["constexpr"] * len(constexprs)))
    triton.compile(ASTSource(fn, sig, constexprs), target=target,
                   options={"num_warps": num_warps, "enable_fp_fusion": False})


compile_(tri._morton_kernel, ["*fp32", "*i64", "*fp32", "*fp32", "*i32", "i32"],
         dict(BLOCK=1024, INVALID=1 << 30, CELLS=1024), 4)
compile_(tri._sort_gather_kernel, ["*fp32", "*i64", "*i64", "*fp32", "*fp32", "i32", "i32"], dict(TILE=32), 4)
knn_types = ["*fp32", "*i64", "*fp32", "*i64", "*fp32", "*fp32", "*i64", "*i64", "*fp32", "*i64"] + ["i32"] * 4
for kp in (2, 16, 32):
    compile_(tri._knn_kernel, knn_types, dict(BQ=tri._KNN_BQ, BR=tri._KNN_BR, SB=tri._KNN_SB, KP=kp), tri._KNN_WARPS)
compile_(tri._ball_query_kernel, ["*fp32", "*fp32", "*i64", "*i64", "*i64", "*i64", "i32", "i32", "fp32", "i32"],
         dict(BQ=tri._BALL_BQ, BR=tri._BALL_BR), 4)
from pcops.triton import ball_query_grid as g

compile_(g._ball_cells_kernel, ["*fp32", "*i64", "*i64", "*i32", "i32", "fp32", "fp32"],
         dict(BITS=g._CELL_BITS, PAD=g._KEY_PAD, BLOCK=g._BLOCK), 4)
grid_types = ["*fp32", "*fp32", "*i64", "*i64", "*i64", "*i64", "*i32", "*i64", "*i64"]
grid_types += ["i32", "i32", "i32", "fp32", "fp32", "fp32", "fp32", "i32", "i32"]
compile_(g._ball_grid_kernel, grid_types, dict(BITS=g._CELL_BITS, BR=g._BR, W=g._W, KPAD=32), 1)
# one sample of one reference: Triton passes the ints equal to 1 (n_keys, nr, steps) as constexprs
names = g._ball_grid_kernel.arg_names
ones = {n: 1 for n in ("nr", "n_keys", "steps")}
sig = {n: ("constexpr" if n in ones else t) for n, t in zip(names, grid_types)}
sig.update(BITS="constexpr", BR="constexpr", W="constexpr", KPAD="constexpr")
consts = {**ones, "BITS": g._CELL_BITS, "BR": g._BR, "W": g._W, "KPAD": 1}
triton.compile(ASTSource(g._ball_grid_kernel, sig, consts), target=target,
               options={"num_warps": 1, "enable_fp_fusion": False})
from pcops.triton import finite as f  # the non-finite policy's passes around the kernels

for pt in ("*fp32", "*fp64"):
    for mask in (False, True):
        compile_(f._zero_non_finite_kernel, [pt, pt, "*i8", "i32"], dict(MASK=mask, BLOCK=f._BLOCK), 4)
    compile_(f._count_kernel, [pt, "*i64", "*i32", "i32", "i32"], dict(BLOCK=f._BLOCK), 4)
    compile_(f._partition_kernel, [pt, "*i64", "*i64", "*i32", pt, "*i64", "*i64", "*i64", "*i64", "i32", "i32"],
             dict(BLOCK=f._BLOCK, CHUNKS_P2=4), 4)
print("compiled")
"""


def test_triton_kernels_compile_for_sm90():
    run_compiler_script(_AOT_SCRIPT)


def test_default_lengths_are_fresh_on_the_cpu():
    """``lengths=None`` becomes a full ``(B,)`` int64 tensor; on the CPU a new one per call."""
    from pcops import _clouds

    a, b = _clouds.filled(3, 7, torch.device("cpu")), _clouds.filled(3, 7, torch.device("cpu"))
    assert a.tolist() == [7, 7, 7] and a.dtype == torch.int64 and a is not b


def test_default_lengths_not_cached_under_a_dispatch_mode():
    """A fake CUDA tensor (FakeTensorMode, make_fx) never enters the per-stream cache (no GPU needed:
    the mode is checked before any CUDA call)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pcops import _clouds

    before = dict(_clouds._FILLED)
    with FakeTensorMode():
        t = _clouds.filled(2, 5, torch.device("cuda"))
    assert t.device.type == "cuda" and t.shape == (2,) and _clouds._FILLED == before


@pytest.mark.gpu
@requires_cuda
def test_gpu_default_lengths_cached_per_stream():
    """On CUDA the default lengths / start indices are kept per (device, stream, batch, value), so
    an eager call launches no fill; another stream gets its own tensor, a graph capture a fresh
    one (not the cached tensor, and nothing cached from the graph's pool); the results of
    ``knn`` and ``farthest_point_sample`` equal those with explicit lengths."""
    from pcops import _clouds

    dev = torch.device("cuda")
    a = _clouds.filled(2, 100, dev)
    assert _clouds.filled(2, 100, dev) is a and a.tolist() == [100, 100]
    assert _clouds.filled(2, 101, dev) is not a and _clouds.filled(3, 100, dev) is not a
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        c = _clouds.filled(2, 100, dev)
        assert c is not a and _clouds.filled(2, 100, dev) is c
    torch.cuda.current_stream().wait_stream(side)
    cached = dict(_clouds._FILLED)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = _clouds.filled(2, 100, dev)
    graph.replay()
    assert d is not a and d is not c and _clouds._FILLED == cached and d.tolist() == [100, 100]
    g = generator(3)
    pts = torch.rand(2, 500, 3, generator=g).cuda()
    full = torch.full((2,), 500, device=dev)
    for _ in range(2):
        assert all(torch.equal(x, y) for x, y in zip(pcops.knn(pts, pts, 8), pcops.knn(pts, pts, 8, full, full)))
        assert torch.equal(pcops.farthest_point_sample(pts, 32), pcops.farthest_point_sample(pts, 32, full))
