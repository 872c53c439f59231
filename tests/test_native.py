"""The native host path (``pcops._native``, ``csrc/host``): it builds and loads, takes only the calls
it can (everything else returns None and runs the Python path, with its errors), and on the GPU
launches the kernel the Python path registered with bit-identical results."""

import shutil

import pytest
import torch

import pcops
from pcops import _native

from _util import gpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) on PATH")


@pytest.fixture(scope="module")
def host():
    if not _native.enabled():
        pytest.skip("PCOPS_NATIVE_HOST=0")
    _native.request(wait=True)
    assert _native.status() == "loaded", _native.status()
    return _native.MODULE


def test_build_is_cached_and_keyed_by_sources(host, tmp_path, monkeypatch):
    path = _native.build()
    assert path.exists() and path.name.startswith("_pcops_host")
    assert _native.build() == path  # cached: no rebuild
    monkeypatch.setenv("PCOPS_CACHE_DIR", str(tmp_path))
    assert _native._target().parent.parent == tmp_path / "host"


def test_declines_what_it_does_not_take(host):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(8, 16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g)
    f = host.lng_forward
    assert f(x, w, b, 1e-5, "tanh", 0.0, False, "auto") is None  # CPU tensors
    assert f(x.numpy(), w, b, 1e-5, "tanh", 0.0, False, "auto") is None  # not a tensor
    assert f(x, w, b, -1.0, "tanh", 0.0, False, "auto") is None  # bad eps: the Python path raises
    assert f(x, w, b, 1e-5, "erf", 0.0, False, "auto") is None
    assert f(x, w, b, 1e-5, "tanh", 0.1, True, "auto") is None  # dropout
    assert f(x, w, b, 1e-5, "tanh", 0.0, 1, "auto") is None  # training not a bool
    assert f(x, w, b, 1e-5, "tanh", 0.0, False, "reference") is None
    assert host.lng_plans() == (0, 0) or torch.cuda.is_available()


def test_python_path_keeps_its_results_and_errors_with_the_module_loaded(host):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(6, 32, generator=g), torch.randn(32, generator=g), torch.randn(32, generator=g)
    ref = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (32,), w, b), approximate="tanh")
    torch.testing.assert_close(pcops.fused_layer_norm_gelu(x, w, b), ref)
    with pytest.raises(ValueError, match="eps"):
        pcops.fused_layer_norm_gelu(x, w, b, eps=-1.0)
    with pytest.raises(ValueError, match="approximate"):
        pcops.fused_layer_norm_gelu(x, w, b, approximate="erf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 768), (2, 48, 96), (4099, 256)])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@gpu[0]
@gpu[1]
def test_native_forward_is_bit_identical_to_the_python_path(host, dtype, shape, approximate):
    from pcops.triton import layer_norm_gelu as impl

    g = torch.Generator(device="cuda").manual_seed(2)
    n = shape[-1]
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, device="cuda", generator=g)
    b = torch.randn(n, device="cuda", generator=g)
    first = pcops.fused_layer_norm_gelu(x, w, b, approximate=approximate)  # the Python path registers the class
    got = host.lng_forward(x, w, b, 1e-5, approximate, 0.0, False, "auto")
    assert got is not None, "the registered shape class did not take the native path"
    ref = impl.layer_norm_gelu(x.reshape(-1, n), w, b, 1e-5, approximate)[0].view(shape)
    assert torch.equal(got, ref) and torch.equal(first, ref)
    assert torch.equal(pcops.fused_layer_norm_gelu(x, w, b, approximate=approximate), ref)


@gpu[0]
@gpu[1]
def test_native_declines_views_other_classes_and_the_profiler(host):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(128, 64, device="cuda", generator=g)
    w, b = torch.randn(64, device="cuda", generator=g), torch.randn(64, device="cuda", generator=g)
    pcops.fused_layer_norm_gelu(x, w, b)
    f = host.lng_forward
    assert f(x, w, b, 1e-5, "tanh", 0.0, False, "auto") is not None
    assert f(x.t().contiguous().t(), w, b, 1e-5, "tanh", 0.0, False, "auto") is None  # not contiguous
    assert f(x[:, :63].contiguous(), w[:63], b[:63], 1e-5, "tanh", 0.0, False, "auto") is None  # another class
    xs = torch.randn(128 * 64 + 1, device="cuda", generator=g)[1:].view(128, 64)  # a misaligned data pointer
    assert f(xs, w, b, 1e-5, "tanh", 0.0, False, "auto") is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert f(x, w, b, 1e-5, "tanh", 0.0, False, "auto") is None  # the profiler keeps the op records
    assert torch.equal(pcops.fused_layer_norm_gelu(xs, w, b), pcops.fused_layer_norm_gelu(xs.clone(), w, b))


def _grads(call, x, w, b, dy):
    xs, ws, bs = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = call(xs, ws, bs)
    assert y is not None and y.grad_fn is not None
    y.backward(dy)
    return y.detach(), xs.grad, ws.grad, bs.grad


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4096, 768), (3, 5, 64), (1000, 256)])
def test_native_gradient_is_bit_identical_to_the_python_path(host, dtype, shape):
    from pcops.triton import layer_norm_gelu as fwd
    from pcops.triton import layer_norm_gelu_backward as bwd

    g = torch.Generator(device="cuda").manual_seed(4)
    n = shape[-1]
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, device="cuda", generator=g)
    b = torch.randn(n, device="cuda", generator=g)
    dy = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    y2, m, r = fwd.layer_norm_gelu(x.reshape(-1, n), w, b, 1e-5, "tanh")  # registers the forward
    dx, dw, db = bwd.layer_norm_gelu_backward(dy.reshape(-1, n), x.reshape(-1, n), w, b, m, r, "tanh")
    ref = (y2.view(shape), dx.view(shape), dw, db)
    native = lambda xs, ws, bs: _native.MODULE.lng_forward(xs, ws, bs, 1e-5, "tanh", 0.0, False, "auto")  # noqa: E731
    before = host.lng_plans()[1]
    runs = [_grads(native, x, w, b, dy), _grads(pcops.fused_layer_norm_gelu, x, w, b, dy)]
    assert host.lng_plans()[1] >= before and host.lng_plans()[1] > 0  # the backward above registered its kernels
    for run in runs:
        for got, want in zip(run, ref):
            assert torch.equal(got, want)
    # create_graph: the C++ node runs the Python backward (no double backward, as the Python path)
    xs = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(native(xs, w, b), xs, dy, create_graph=True)
    assert torch.equal(gx, ref[1])


@gpu[0]
@gpu[1]
def test_native_backward_falls_back_until_registered(host):
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(333, 96, device="cuda", generator=g)
    w, b = torch.randn(96, device="cuda", generator=g), torch.randn(96, device="cuda", generator=g)
    dy = torch.randn(333, 96, device="cuda", generator=g)
    with torch.no_grad():
        pcops.fused_layer_norm_gelu(x, w, b)  # the forward only: its kernel registered, the backward's not
    native = lambda xs, ws, bs: _native.MODULE.lng_forward(xs, ws, bs, 1e-5, "tanh", 0.0, False, "auto")  # noqa: E731
    before = host.lng_plans()[1]
    first = _grads(native, x, w, b, dy)  # the Python backward, which registers the kernels
    assert host.lng_plans()[1] == before + 1
    second = _grads(native, x, w, b, dy)  # the C++ backward
    assert host.lng_plans()[1] == before + 1
    for a, c in zip(first, second):
        assert torch.equal(a, c)


def test_pillar_scatter_declines_on_the_cpu(host):
    f, c = torch.randn(4, 8), torch.zeros(4, 4, dtype=torch.int32)
    assert host.ps_forward(f, c, 1, (4, 4), "auto") is None
    assert host.ps_forward(f, c, True, (4, 4), "auto") is None  # a bool batch size: the Python path raises
    with pytest.raises(TypeError, match="batch_size"):
        pcops.pillar_scatter(f, c, True, (4, 4))


def _pillars(p, c, b, h, w, dtype=torch.float32, seed=6):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cells = torch.randint(0, b * h * w, (p,), device="cuda", generator=g)  # duplicates included
    coords = torch.stack([cells // (h * w), torch.zeros_like(cells), cells % (h * w) // w, cells % w], 1).int()
    return torch.randn(p, c, device="cuda", dtype=dtype, generator=g), coords


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("p, c, b, h, w", [(16000, 64, 1, 496, 432), (3000, 32, 3, 40, 52), (1, 4, 1, 2, 2)])
def test_pillar_scatter_native_is_bit_identical_to_the_python_path(host, p, c, b, h, w):
    from pcops.cuda import pillar_scatter as cu

    f, coords = _pillars(p, c, b, h, w)
    first = pcops.pillar_scatter(f, coords, b, (h, w))  # registers the device's kernels
    got = host.ps_forward(f, coords, b, (h, w), "auto")
    assert got is not None, "the native path did not take the call"
    canvas, winner = cu.pillar_scatter(f, coords, b, h, w)
    assert torch.equal(got, canvas) and torch.equal(first, canvas)
    dy = torch.randn_like(canvas)
    grads = []
    for call in (
        lambda t: host.ps_forward(t, coords, b, [h, w], "auto"),
        lambda t: pcops.pillar_scatter(t, coords, b, (h, w)),
    ):
        fr = f.clone().requires_grad_(True)
        out = call(fr)
        assert out.grad_fn is not None
        out.backward(dy)
        grads.append(fr.grad)
    want = cu.pillar_gather(dy, coords, winner)
    assert torch.equal(grads[0], want) and torch.equal(grads[1], want)
    # create_graph: the Python gather op (differentiable: its adjoint is the scatter)
    fr = f.clone().requires_grad_(True)
    (gf,) = torch.autograd.grad(host.ps_forward(fr, coords, b, (h, w), "auto"), fr, dy, create_graph=True)
    assert torch.equal(gf, want)


@gpu[0]
@gpu[1]
def test_pillar_scatter_native_declines_other_cases(host):
    f, coords = _pillars(500, 64, 2, 40, 52)
    pcops.pillar_scatter(f, coords, 2, (40, 52))
    assert host.ps_forward(f, coords, 2, (40, 52), "auto") is not None
    assert host.ps_forward(f.half(), coords, 2, (40, 52), "auto") is None  # fp16: the Python path
    assert host.ps_forward(f[:, :62].contiguous(), coords, 2, (40, 52), "auto") is None  # C % 4
    assert host.ps_forward(f, coords, 2, (41, 51), "auto") is None  # H·W % 4
    assert host.ps_forward(f, coords.long(), 2, (40, 52), "auto") is None  # int64 coords: converted in Python
    assert host.ps_forward(f, coords, 2, (40, 52), "triton") is None
    assert host.ps_forward(f, coords, 2, (40, 52.0), "auto") is None


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("n, channels, batched", [(20000, 4, False), (777, 5, True), (1, 4, False)])
def test_point_cells_native_is_bit_identical_to_the_python_path(host, n, channels, batched):
    from pcops.triton import voxelize_cells as impl

    g = torch.Generator(device="cuda").manual_seed(7)
    points = torch.rand(n, channels, device="cuda", generator=g) * torch.tensor(
        [80.0, 90.0, 6.0] + [1.0] * (channels - 3), device="cuda"
    ) - torch.tensor([5.0, 45.0, 4.0] + [0.0] * (channels - 3), device="cuda")  # some out of range
    lengths = torch.tensor([n // 3, n - n // 3], device="cuda") if batched else None
    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    first = pcops.dynamic_voxelize(points, vs, pcr, lengths, cells_only=True)  # registers the launch
    got = host.pc_forward(points, vs, pcr, lengths, "auto")
    assert got is not None, "the native path did not take the call"
    want = impl.point_cells(points, lengths, vs, pcr)
    assert torch.equal(got, want) and torch.equal(first, want)
    assert torch.equal(pcops.dynamic_voxelize(points, list(vs), list(pcr), lengths, cells_only=True), want)
    assert host.pc_forward(points, (0.2, 0.16, 4.0), pcr, lengths, "auto") is None  # another grid
    assert host.pc_forward(points.double(), vs, pcr, lengths, "auto") is None  # float64: the reference
    with pytest.raises(ValueError, match="voxel_size"):
        pcops.dynamic_voxelize(points, (0.16, -0.16, 4.0), pcr, lengths, cells_only=True)


@gpu[0]
@gpu[1]
def test_native_gradient_over_changing_row_counts_and_under_checkpoint(host):
    """Row counts of one class but different column-sum tilings (G 100 vs 1000) keep their own
    kernels; activation checkpointing (saved-tensor hooks) takes the Python path."""
    from pcops.triton import layer_norm_gelu as fwd
    from pcops.triton import layer_norm_gelu_backward as bwd

    g = torch.Generator(device="cuda").manual_seed(8)
    w, b = torch.randn(256, device="cuda", generator=g), torch.randn(256, device="cuda", generator=g)
    native = lambda xs, ws, bs: _native.MODULE.lng_forward(xs, ws, bs, 1e-5, "tanh", 0.0, False, "auto")  # noqa: E731
    for m in (400, 4000, 400, 4000, 4016):
        x = torch.randn(m, 256, device="cuda", generator=g)
        dy = torch.randn(m, 256, device="cuda", generator=g)
        _, mean, rstd = fwd.layer_norm_gelu(x, w, b, 1e-5, "tanh")
        want = bwd.layer_norm_gelu_backward(dy, x, w, b, mean, rstd, "tanh")
        got = _grads(native, x, w, b, dy)[1:]
        assert all(torch.equal(a, c) for a, c in zip(got, want)), m
    x = torch.randn(512, 256, device="cuda", generator=g, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert native(x, w, b) is None
    from torch.utils.checkpoint import checkpoint

    y = checkpoint(lambda t: pcops.fused_layer_norm_gelu(t, w, b), x, use_reentrant=False)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def _csr(rows, max_len, seed, dtype=torch.float32, crow_dtype=torch.int64, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (rows,), generator=g)  # empty rows included
    crow = torch.zeros(rows + 1, dtype=crow_dtype)
    crow[1:] = lengths.cumsum(0)
    v = torch.randn(int(crow[-1]), generator=g).to(dtype)
    return v.to(device), crow.to(device)


def test_sparse_softmax_declines_on_the_cpu(host):
    v, crow = _csr(10, 6, 9, device="cpu")
    assert host.ss_forward(v, crow, "auto", None) is None
    assert host.ss_forward(v, None, "auto", None) is None  # no crow: the Python path raises
    with pytest.raises(TypeError, match="crow_indices"):
        pcops.sparse_softmax(v, None)
    assert host.ss_plans()[0] == 0 or torch.cuda.is_available()


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows, max_len, crow_dtype", [(120000, 64, torch.int64), (777, 300, torch.int32), (5, 4, torch.int64)]
)
def test_sparse_softmax_native_is_bit_identical_to_the_python_path(host, dtype, rows, max_len, crow_dtype):
    from pcops.triton import sparse_softmax as impl

    v, crow = _csr(rows, max_len, 10, dtype, crow_dtype)
    v[:: max(3, v.numel() // 7)] = float("-inf")  # the -inf policy goes through the same kernel
    first = pcops.sparse_softmax(v, crow)  # the Python path registers the class
    got = host.ss_forward(v, crow, "auto", None)
    assert got is not None, "the registered shape class did not take the native path"
    want = impl.sparse_softmax(v, crow)
    assert torch.equal(got, want) and torch.equal(first, want)
    dy = torch.randn(v.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(11)).to(dtype)
    want_dx = impl.sparse_softmax_backward(dy, want, crow)
    grads = []
    native_before = host.ss_plans()[1]
    for call in (lambda t: host.ss_forward(t, crow, "auto", None), lambda t: pcops.sparse_softmax(t, crow)):
        for _ in range(2):  # the first backward may register the kernel, the second runs it natively
            vr = v.clone().requires_grad_(True)
            y = call(vr)
            assert y is not None and y.grad_fn is not None
            y.backward(dy)
            grads.append(vr.grad)
    assert all(torch.equal(gr, want_dx) for gr in grads)
    assert host.ss_plans()[1] >= native_before + 3, "the C++ node did not launch the registered backward"
    # create_graph: the C++ node runs the Python backward op
    vr = v.clone().requires_grad_(True)
    (gv,) = torch.autograd.grad(host.ss_forward(vr, crow, "triton", None), vr, dy, create_graph=True)
    assert torch.equal(gv, want_dx)


@gpu[0]
@gpu[1]
def test_sparse_softmax_native_declines_other_cases(host):
    v, crow = _csr(500, 20, 12)
    pcops.sparse_softmax(v, crow)
    f = host.ss_forward
    assert f(v, crow, "auto", None) is not None and f(v, crow, "triton", False) is not None
    assert f(v, crow, "cuda", None) is None and f(v, crow, "reference", None) is None
    assert f(v, crow, "auto", True) is None  # validation: the Python path syncs and checks
    assert f(v.double(), crow, "auto", None) is None  # float64: the reference
    assert f(v, crow.float(), "auto", None) is None
    assert f(v, crow[::2], "auto", None) is None  # not contiguous
    assert f(v[1:], crow, "auto", None) is None  # misaligned
    v2, crow2 = _csr(500, 200, 13)  # another group shape: not registered yet
    assert f(v2, crow2, "auto", None) is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert f(v, crow, "auto", None) is None
    vr = v.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert f(vr, crow, "auto", None) is None
    bad = crow.clone()
    bad[3] = bad[2] - 1
    with pytest.raises(ValueError, match="non-decreasing"):
        pcops.sparse_softmax(v, bad, validate=True)


_SUBM = [((41, 160, 140), 3, 1), ((20, 30, 40), (3, 1, 5), 2), ((9, 19, 29), 2, 1)]


_REGULAR = [
    ((41, 160, 140), 3, 2, 1, False),
    ((20, 30, 40), (3, 1, 5), (2, 1, 2), 0, False),
    ((9, 19, 29), 2, 2, 0, True),
]


def _plan_of(shape, kernel, stride, padding, dilation, subm, transposed):
    from pcops.kernel_map import _op_args
    from pcops.triton import kernel_map as km

    args = _op_args(shape, kernel, stride, padding, dilation, subm, transposed)
    return km._plan(*(tuple(a) for a in args), subm, transposed)


@pytest.mark.parametrize(
    "shape, kernel, stride, padding, dilation, subm, transposed",
    [(s, k, 1, 0, d, True, False) for s, k, d in _SUBM] + [(s, k, st, p, 1, False, t) for s, k, st, p, t in _REGULAR],
)
def test_kernel_map_sizes_match_the_python_paths(host, shape, kernel, stride, padding, dilation, subm, transposed):
    """The sizes the C++ side derives from N (workspace layout, hash capacities, count groups) are
    those of pcops/triton/kernel_map.py's launcher for every N class, including group and capacity edges."""
    from pcops.triton import kernel_map as km

    plan = _plan_of(shape, kernel, stride, padding, dilation, subm, transposed)
    _, values = km.native_plan(plan)
    for n in (1, 2, 15, 16, 17, 31, 32, 33, 1000, 8191, 8192, 8193, 40000, 65536, 262145, 1 << 20):
        cap_in, log_in = km._capacity(n, 4)
        bound = n * plan["per_input"]
        if subm:
            cap_out = log_out = 0
            sub, groups = km._groups(km._launch.cdiv(n, plan["block"]))
        else:
            cap_out, log_out = km._capacity(bound + 1, 1)
            sub, groups = 1, km._MAX_GROUPS
        counts_off = 2 * cap_in + cap_out
        counters_off = counts_off + groups * plan["kpad"]
        sink_off = counters_off + km._NUM_COUNTERS
        want = (cap_in, log_in, cap_out, log_out, sub, groups, counts_off, counters_off, sink_off,
                sink_off + plan["sink"] + bound)  # fmt: skip
        assert host.km_sizes(values, n) == want, n


def test_kernel_map_declines_on_the_cpu(host):
    coords = torch.zeros(4, 4, dtype=torch.int32)
    args = ((8, 8, 8), 3, 1, 0, 1)
    assert host.km_forward(coords, *args, True, False, False, False, True, "auto") is None
    assert host.km_forward(coords, *args, False, False, False, False, True, "auto") is None  # regular
    assert host.km_plans() == (0, 0, 0) or torch.cuda.is_available()


def _voxels(n, shape, batch, seed):
    g = torch.Generator().manual_seed(seed)
    cells = torch.randperm(batch * shape[0] * shape[1] * shape[2], generator=g)[:n]
    d, h, w = shape
    b, r = cells // (d * h * w), cells % (d * h * w)
    return torch.stack([b, r // (h * w), r // w % h, r % w], 1).int().cuda()


def _diff(a, b) -> str:
    """Where two tensors differ (for assertion messages)."""
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} / {tuple(b.shape)}"
    bad = (a != b).nonzero()
    return f"{bad.shape[0]} of {a.numel()} differ, first at {bad[:3].tolist()}: {a[tuple(bad[0])]} / {b[tuple(bad[0])]}"


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("shape, kernel, dilation", _SUBM)
@pytest.mark.parametrize("pairs, pad_pairs", [(True, False), (True, True), (False, False)])
def test_kernel_map_native_is_bit_identical_to_the_python_path(host, shape, kernel, dilation, pairs, pad_pairs):
    from pcops.triton import kernel_map as km

    k = (kernel,) * 3 if isinstance(kernel, int) else kernel
    d = (dilation,) * 3
    pad = tuple((a - 1) // 2 * b for a, b in zip(k, d))
    for n in (3000, 3001, 3000, 17):  # the first call of an argument class registers it, the next takes it
        coords = _voxels(n, shape, 2, n)
        first = pcops.sparse_conv_kernel_map(coords, shape, kernel, dilation=dilation, subm=True, pad_pairs=pad_pairs,
                                             pairs=pairs)  # fmt: skip
        got = host.km_forward(coords, shape, kernel, 1, 0, dilation, True, False, pad_pairs, False, pairs, "auto")
        if not pairs:  # the table-only map: the Python path (it differed on the GPU, not diagnosed yet)
            assert got is None
            continue
        assert got is not None, "the registered configuration did not take the native path"
        got, out_shape = got
        assert out_shape == tuple(shape)
        want = km.sparse_conv_kernel_map(coords, shape, shape, k, (1, 1, 1), pad, d, True, False, pad_pairs, False,
                                         0, pairs)  # fmt: skip
        want = want if pairs else (want[0], want[4])
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape and torch.equal(a, b), f"N={n}, output {i}: {_diff(a, b)}"
        again = pcops.sparse_conv_kernel_map(coords, list(shape), kernel, dilation=dilation, subm=True,
                                             pad_pairs=pad_pairs, pairs=pairs)  # fmt: skip
        for i, (a, b) in enumerate(zip(again, first)):
            same = a == b if isinstance(a, tuple) or a is None else torch.equal(a, b)
            assert same, f"N={n}, field {i}: {_diff(a, b) if isinstance(a, torch.Tensor) else (a, b)}"
        assert again.out_spatial_shape == tuple(shape)


@gpu[0]
@gpu[1]
def test_kernel_map_native_declines_other_cases(host):
    shape = (16, 20, 24)
    coords = _voxels(500, shape, 1, 3)
    pcops.sparse_conv_kernel_map(coords, shape, 3, subm=True)
    f = host.km_forward
    assert f(coords, shape, 3, 1, 0, 1, True, False, False, False, True, "auto") is not None
    assert f(coords, shape, 3, 1, 0, 1, True, False, False, False, True, "reference") is None
    assert f(coords.long(), shape, 3, 1, 0, 1, True, False, False, False, True, "auto") is None  # converted in Python
    assert f(coords.t().contiguous().t(), shape, 3, 1, 0, 1, True, False, False, False, True, "auto") is None
    assert f(coords, shape, 3, 2, 0, 1, True, False, False, False, True, "auto") is None  # stride: Python raises
    assert f(coords, shape, 3, 1, -1, 1, True, False, False, False, True, "auto") is None  # padding: Python raises
    assert f(coords, shape, 5, 1, 0, 1, True, False, False, False, True, "auto") is None  # not registered
    assert f(coords, shape, True, 1, 0, 1, True, False, False, False, True, "auto") is None  # a bool kernel size
    assert f(coords, shape, 3, 1, 0, 1, True, False, 1, False, True, "auto") is None  # pad_pairs not a bool
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert f(coords, shape, 3, 1, 0, 1, True, False, False, False, True, "auto") is None
    with pytest.raises(ValueError, match="stride"):
        pcops.sparse_conv_kernel_map(coords, shape, 3, stride=2, subm=True)
    pcops.sparse_conv_kernel_map(coords, shape, 3, 2, 1)
    assert f(coords, shape, 3, 2, 1, 1, False, False, False, False, True, "auto") is not None
    assert f(coords, shape, 3, 2, 1, 1, False, False, False, True, True, "auto") is None  # static regular map
    assert f(coords, shape, 3, 2, 1, 1, True, True, False, False, True, "auto") is None  # subm and transposed


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("shape, kernel, stride, padding, transposed", _REGULAR)
@pytest.mark.parametrize("pairs, pad_pairs", [(True, False), (True, True), (False, False)])
def test_regular_kernel_map_native_is_bit_identical_to_the_python_path(
    host, shape, kernel, stride, padding, transposed, pairs, pad_pairs
):
    from pcops.triton import kernel_map as km

    plan = _plan_of(shape, kernel, stride, padding, 1, False, transposed)
    args = [tuple(a) for a in (plan["in_shape"], plan["out_shape"])]
    k = (kernel,) * 3 if isinstance(kernel, int) else kernel
    st = (stride,) * 3 if isinstance(stride, int) else stride
    for n in (3000, 3001, 17, 3000, 1, 16, 32, 12000):  # N classes; 12000 on the big grid: count groups of 2+ blocks
        if n * 3 > 2 * shape[0] * shape[1] * shape[2]:
            continue
        coords = _voxels(n, shape, 2, n + 1)
        call = dict(transposed=transposed, pad_pairs=pad_pairs, pairs=pairs)
        first = pcops.sparse_conv_kernel_map(coords, shape, kernel, stride, padding, **call)  # registers the classes
        got = host.km_forward(coords, shape, kernel, stride, padding, 1, False, transposed, pad_pairs, False, pairs,
                              "auto")  # fmt: skip
        if not pairs:  # the table-only map: the Python path (it differed on the GPU, not diagnosed yet)
            assert got is None
            continue
        assert got is not None, f"N={n}: the registered classes did not take the native path"
        got, out_shape = got
        assert out_shape == tuple(args[1]) == first.out_spatial_shape
        want = km.sparse_conv_kernel_map(coords, *args, k, st, (padding,) * 3, (1, 1, 1), False, transposed, pad_pairs,
                                         False, 0, pairs)  # fmt: skip
        want = want if pairs else (want[0], want[4])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        again = pcops.sparse_conv_kernel_map(coords, list(shape), kernel, stride, padding, **call)
        for a, b in zip(again, first):
            assert a == b if isinstance(a, tuple) or a is None else torch.equal(a, b)
    assert host.km_plans()[1] > 0 and host.km_plans()[2] > 0


@gpu[0]
@gpu[1]
def test_kernel_map_native_int64_keys_and_same_geometry_subm(host):
    """A regular map whose batch × grid passes 2^31 (int64 sort keys), and a submanifold map and a
    regular map of the same geometry (kernel 3, stride 1, padding 1) in one process."""
    from pcops.triton import kernel_map as km

    g = torch.Generator(device="cuda").manual_seed(17)
    shape = (41, 1600, 1408)
    n = 4000
    coords = torch.stack([torch.randint(0, hi, (n,), device="cuda", generator=g) for hi in (200, *shape)], 1).int()
    for _ in range(2):
        first = pcops.sparse_conv_kernel_map(coords, shape, 3, 2, 1)
        got = host.km_forward(coords, shape, 3, 2, 1, 1, False, False, False, False, True, "auto")
        assert got is not None
        for a, b in zip(got[0], (first.out_coords, first.pair_in, first.pair_out, first.offsets, first.out_in)):
            assert torch.equal(a, b)
    assert int(first.out_coords[:, 0].max()) >= 100
    small = (16, 20, 24)
    coords = _voxels(900, small, 2, 18)
    for subm in (True, False, True, False):
        first = pcops.sparse_conv_kernel_map(coords, small, 3, 1, 1, subm=subm)
        got = host.km_forward(coords, small, 3, 1, 1, 1, subm, False, False, False, True, "auto")
        assert got is not None, subm
        want = km.sparse_conv_kernel_map(coords, small, small, (3,) * 3, (1,) * 3, (1,) * 3, (1,) * 3, subm, False)
        for a, b, c in zip(
            got[0], want, (first.out_coords, first.pair_in, first.pair_out, first.offsets, first.out_in)
        ):
            assert torch.equal(a, b) and torch.equal(c, b)


def test_dynamic_voxelize_declines_on_the_cpu(host):
    points = torch.rand(100, 4) * 10
    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    assert host.dv_forward(points, vs, pcr, None, False, "auto") is None
    assert host.dv_forward(points, vs, pcr, None, 0, "auto") is None  # pad_to_max not a bool: the Python path raises
    with pytest.raises(TypeError, match="pad_to_max"):
        pcops.dynamic_voxelize(points, vs, pcr, pad_to_max=0)
    assert host.vx_plans() == 0 or torch.cuda.is_available()


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("pad_to_max", [False, True])
def test_dynamic_voxelize_native_is_bit_identical_to_the_python_path(host, batched, pad_to_max):
    from pcops.triton import voxelize as impl
    from pcops.voxelize import DynamicVoxels

    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    for n in (20000, 20001, 20000, 20003, 777):  # a class's first call registers it, the next takes it
        g = torch.Generator(device="cuda").manual_seed(n)
        points = torch.rand(n, 4, device="cuda", generator=g) * torch.tensor([80.0, 90.0, 6.0, 1.0], device="cuda")
        points -= torch.tensor([5.0, 45.0, 4.0, 0.0], device="cuda")  # some out of range
        lengths = torch.tensor([n // 3, n - n // 3], device="cuda") if batched else None
        first = pcops.dynamic_voxelize(points, vs, pcr, lengths, pad_to_max=pad_to_max)
        got = host.dv_forward(points, vs, pcr, lengths, pad_to_max, "auto")
        assert got is not None, f"N={n}: the registered class did not take the native path"
        want = impl.dynamic_voxelize(points, lengths, vs, pcr, pad_to_max)
        for a, b, c in zip(got, want, first):
            assert torch.equal(a, b) and torch.equal(c, b)
        again = pcops.dynamic_voxelize(points, list(vs), list(pcr), lengths, pad_to_max=pad_to_max)
        assert isinstance(again, DynamicVoxels) and all(torch.equal(a, b) for a, b in zip(again, want))
    assert host.dv_forward(points.double(), vs, pcr, lengths, pad_to_max, "auto") is None
    assert host.dv_forward(points, (0.2, 0.2, 4.0), pcr, lengths, pad_to_max, "auto") is None  # another grid
    assert host.dv_forward(points, vs, pcr, lengths, pad_to_max, "reference") is None


def test_hard_voxelize_declines_on_the_cpu(host):
    points = torch.rand(100, 4) * 10
    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    assert host.hv_forward(points, vs, pcr, 32, 100, None, False, "auto", "auto") is None
    assert host.hv_forward(points, vs, pcr, True, 100, None, False, "auto", "auto") is None  # a bool cap
    with pytest.raises(TypeError, match="max_points_per_voxel"):
        pcops.voxelize(points, vs, pcr, True, 100)


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("pad_to_max", [False, True])
@pytest.mark.parametrize("max_points, max_voxels", [(32, 16000), (5, 700), (1, 40000)])
def test_hard_voxelize_native_is_bit_identical_to_the_python_path(host, batched, pad_to_max, max_points, max_voxels):
    from pcops.triton import voxelize as impl
    from pcops.voxelize import Voxels

    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    for n in (20000, 20001, 20000, 20003, 777, 777):  # a class's first call registers it, the next takes it
        g = torch.Generator(device="cuda").manual_seed(n)
        points = torch.rand(n, 4, device="cuda", generator=g) * torch.tensor([40.0, 40.0, 6.0, 1.0], device="cuda")
        points -= torch.tensor([5.0, 20.0, 4.0, 0.0], device="cuda")  # some out of range, dense voxels
        lengths = torch.tensor([n // 3, n - n // 3], device="cuda") if batched else None
        first = pcops.voxelize(points, vs, pcr, max_points, max_voxels, lengths, pad_to_max=pad_to_max)
        got = host.hv_forward(points, vs, pcr, max_points, max_voxels, lengths, pad_to_max, "auto", "auto")
        assert got is not None, f"N={n}: the registered class did not take the native path"
        want = impl.voxelize(points, lengths, vs, pcr, max_points, max_voxels, pad_to_max)
        for a, b, c in zip(got, want, first):
            assert torch.equal(a, b) and torch.equal(c, b)
        again = pcops.voxelize(points, list(vs), list(pcr), max_points, max_voxels, lengths, pad_to_max=pad_to_max)
        assert isinstance(again, Voxels) and all(torch.equal(a, b) for a, b in zip(again, want))
    assert host.hv_forward(points, vs, pcr, max_points, max_voxels, lengths, pad_to_max, "lists", "auto") is None
    assert host.hv_forward(points, vs, pcr, max_points + 1, max_voxels, lengths, pad_to_max, "auto", "auto") is None
    assert host.hv_forward(points.half(), vs, pcr, max_points, max_voxels, lengths, pad_to_max, "auto", "auto") is None


@gpu[0]
@gpu[1]
def test_native_calls_capture_in_a_cuda_graph(host):
    """The sync-free forms the native path takes (padded voxelization, padded subm map, LayerNorm +
    GELU, CSR softmax) launch on the capturing stream and allocate from the graph's pool: a captured
    call replays to the eager result."""
    g = torch.Generator(device="cuda").manual_seed(14)
    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    points = torch.rand(5000, 4, device="cuda", generator=g) * torch.tensor([60.0, 70.0, 5.0, 1.0], device="cuda")
    points -= torch.tensor([0.0, 35.0, 3.0, 0.0], device="cuda")
    shape = (16, 20, 24)
    coords = _voxels(900, shape, 1, 15)
    x = torch.randn(256, 64, device="cuda", generator=g)
    w, b = torch.randn(64, device="cuda", generator=g), torch.randn(64, device="cuda", generator=g)
    v, crow = _csr(300, 16, 16)

    def step():
        vox = pcops.voxelize(points, vs, pcr, 8, 3000, pad_to_max=True)
        dyn = pcops.dynamic_voxelize(points, vs, pcr, pad_to_max=True)
        km = pcops.sparse_conv_kernel_map(coords, shape, 3, subm=True, pad_pairs=True)
        return (*vox, *dyn, km.out_in, km.pair_in, km.offsets, pcops.fused_layer_norm_gelu(x, w, b),
                pcops.sparse_softmax(v, crow))  # fmt: skip

    step()  # the Python path registers each class (and checks its native call)
    for op in ("voxelize", "dynamic_voxelize", "sparse_conv_kernel_map subm", "sparse_softmax"):
        assert _native.serves(op) is host, op
    assert host.hv_forward(points, vs, pcr, 8, 3000, None, True, "auto", "auto") is not None
    assert host.km_forward(coords, shape, 3, 1, 0, 1, True, False, True, False, True, "auto") is not None
    want = step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(got, want):
        assert torch.equal(a, c)


def test_first_native_call_is_checked_against_the_python_path(host, caplog):
    """``pcops._native.check``: an op is served only once the native call of each class it registered
    matched the Python path's outputs on the registering call's arguments (bit for bit: NaN payloads
    included); a mismatch or an error turns it off, with a warning."""
    t = torch.arange(6)
    nan = torch.tensor([1.0, float("nan")])
    assert _native.serves("test op a") is None
    _native.check("test op a", lambda: (t,), (t,))  # nothing registered: no check
    assert _native.serves("test op a") is None
    _native.registered("test op a")
    _native.check("test op a", lambda: None, (t,))  # not taken: still on hold
    assert _native.serves("test op a") is None
    _native.check("test op a", lambda: (t.clone(), (2, 3), nan.clone()), (t, (2, 3), nan))
    assert _native.serves("test op a") is host
    _native.registered("test op a")  # another class: on hold until its call is checked
    assert _native.serves("test op a") is None
    _native.check("test op a", lambda: (t.clone(),), (t,))
    assert _native.serves("test op a") is host
    _native.registered("test op b")
    with caplog.at_level("WARNING", logger="pcops"):
        _native.check("test op b", lambda: (t + 1, (2, 3)), (t, (2, 3)))
    assert _native.serves("test op b") is None and "test op b" in caplog.text
    _native.registered("test op b")  # a failed op stays off
    _native.check("test op b", lambda: (t,), (t,))
    assert _native.serves("test op b") is None
    _native.registered("test op c")

    def broken():
        raise RuntimeError("launch failed")

    with caplog.at_level("WARNING", logger="pcops"):
        _native.check("test op c", broken, (t,))  # the Python path's result stands
    assert _native.serves("test op c") is None and "launch failed" in caplog.text
    for name in ("test op a", "test op b", "test op c"):
        for state in (_native._PENDING, _native._CHECKED, _native._FAILED):
            state.discard(name)


@gpu[0]
@gpu[1]
def test_hard_voxelize_native_row_count_classes(host):
    """A variable-size call learns its row count M after the main kernel: the rows kernel bound for
    each class of M (1, a multiple of 16, other) gives the Python path's voxels."""
    from pcops.triton import voxelize as impl

    vs, pcr = (0.16, 0.16, 4.0), (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)
    g = torch.Generator(device="cuda").manual_seed(19)
    n = 3000
    for voxels in (40, 1, 16, 17, 32, 1):  # the first call registers the class (N's, not M's)
        cell = torch.randint(0, voxels, (n,), device="cuda", generator=g)  # every point in one of `voxels` pillars
        xy = torch.stack([cell % 8, cell // 8], 1).float() * 0.16 + 0.08
        points = torch.cat(
            [xy + torch.tensor([1.0, -30.0], device="cuda"), torch.rand(n, 2, device="cuda", generator=g)], 1
        )
        first = pcops.voxelize(points, vs, pcr, 32, 16000)
        assert first.coords.shape[0] == voxels or voxels == 40
        got = host.hv_forward(points, vs, pcr, 32, 16000, None, False, "auto", "auto")
        assert got is not None, f"{voxels} voxels: the native path did not take the call"
        want = impl.voxelize(points, None, vs, pcr, 32, 16000, False)
        for a, b, c in zip(got, want, first):
            assert torch.equal(a, b) and torch.equal(c, b)


def _boxes(b, n, c, seed, device="cuda"):
    """``(B, N, C)`` boxes in a 40 m square (dense enough that many overlap), scores with ties."""
    g = torch.Generator(device=device).manual_seed(seed)
    boxes = torch.rand(b, n, c, device=device, generator=g)
    boxes[..., :2] *= 40.0
    size = (2, 3) if c == 5 else (3, 4, 5)
    boxes[..., list(size)] = boxes[..., list(size)] * 4.0 + 0.5
    boxes[..., c - 1 if c == 5 else 6] *= 6.3
    scores = torch.randint(0, 50, (b, n), device=device, generator=g).float() / 50  # ties: the stable rank
    groups = torch.randint(0, 3, (b, n), device=device, generator=g)
    return boxes, scores, groups


def test_nms_declines_on_the_cpu(host):
    boxes, scores, groups = _boxes(1, 50, 7, 0, device="cpu")
    assert host.nms_forward(boxes[0], scores[0], None, 0.5, None, None, False, "auto") is None
    assert host.nms_forward(boxes, scores, groups, 0.5, None, 8, True, "auto") is None
    with pytest.raises(ValueError, match="iou_threshold"):
        pcops.nms_bev(boxes[0], scores[0], 1.5)
    assert host.nms_plans() == 0 or torch.cuda.is_available()


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("c", [7, 5, 9])
@pytest.mark.parametrize(
    "pre, post, padded", [(None, None, False), (300, 83, False), (None, 100, True), (64, 500, True)]
)
def test_nms_native_is_bit_identical_to_the_python_path(host, c, pre, post, padded):
    from pcops.cuda import nms as impl

    for n in (1000, 4096, 1, 777):
        boxes, scores, groups = _boxes(1, n, c, n + c)
        for idxs in (None, groups[0]):
            call = pcops.nms_bev if idxs is None else pcops.batched_nms_bev
            extra = () if idxs is None else (idxs,)
            first = call(boxes[0], scores[0], *extra, 0.3, pre, post, padded)
            got = host.nms_forward(boxes[0], scores[0], idxs, 0.3, pre, post, padded, "auto")
            assert got is not None, f"N={n}: the native path did not take the call"
            assert _native.serves("nms_bev") is host
            m = n if pre is None else min(n, pre)
            out_len = post if padded else min(m, post or m)
            want, count = impl.nms_padded(
                boxes, scores, None if idxs is None else idxs[None], 0.3, pre, out_len, single=True
            )
            want = (want, count) if padded else want[: int(count)]
            for a, b, f in zip(_native._flat(got), _native._flat(want), _native._flat(first)):
                assert torch.equal(a, b) and torch.equal(f, b)
    assert host.nms_forward(boxes[0].double(), scores[0], None, 0.3, pre, post, padded, "auto") is None
    assert host.nms_forward(boxes[0], scores[0].half(), None, 0.3, pre, post, padded, "auto") is None
    assert host.nms_forward(boxes[0], scores[0], groups[0].int(), 0.3, pre, post, padded, "auto") is None
    assert host.nms_forward(boxes[0], scores[0], None, 0.3, pre, post, padded, "triton") is None
    assert host.nms_forward(boxes[0], scores[0], None, float("nan"), pre, post, padded, "auto") is None


@gpu[0]
@gpu[1]
def test_batched_nms_native_is_bit_identical_to_the_python_path(host):
    from pcops.cuda import nms as impl

    for b, n in ((4, 2000), (1, 300), (16, 8192), (3, 8193)):
        boxes, scores, groups = _boxes(b, n, 7, b * n)
        for idxs in (None, groups):
            call = pcops.nms_bev if idxs is None else pcops.batched_nms_bev
            extra = () if idxs is None else (idxs,)
            first = call(boxes, scores, *extra, 0.5, 1000, 83, True)
            got = host.nms_forward(boxes, scores, idxs, 0.5, 1000, 83, True, "auto")
            want = impl.nms_padded(boxes, scores, idxs, 0.5, 1000, 83)
            if n > 8192 or b * n * n > 8 * 4096 * 4096:  # torch.sort's sizes: the Python path
                assert got is None
                got = want
            for a, w, f in zip(got, want, first):
                assert torch.equal(a, w) and torch.equal(f, w)
    assert host.nms_forward(boxes, scores, None, 0.5, 1000, 83, False, "auto") is None  # batched: padded only
    assert host.nms_forward(boxes, scores[:, :5], None, 0.5, 1000, 83, True, "auto") is None
