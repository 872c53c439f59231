"""pcops.fused: LayerNorm+GELU(+dropout), Swish+dropout+residual and CSR softmax.

Oracles: plain-torch compositions (``F.gelu(F.layer_norm(...))``, a per-row dense softmax)
and autograd through them; the hand-written backwards of the reference are checked with
float64 ``gradcheck``. Tolerances: float32 1e-5 (forward) / 1e-4 (gradients; weight and bias
gradients are sums over rows, so their absolute tolerance grows with the row count);
float16 and bfloat16 one rounding of the output (atol/rtol 2e-3 and 1.6e-2).
Dropout: the kernels' Philox mask is regenerated with ``pcops.triton.fused.dropout_keep_mask``
and given to the reference; statistics are checked within 3σ.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import pcops
import pcops.nn
from pcops.reference import fused as ref
from _util import generator, interpret, requires_cuda

WIDTHS = (1, 3, 127, 768, 1025, 4097)
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    torch.float64: dict(atol=1e-12, rtol=1e-12),
}
GRAD_TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
}


def make_ln(rows, width, seed, dtype=torch.float32, device="cpu", lead=()):
    g = generator(seed)
    x = (torch.randn(*lead, rows, width, generator=g) * 2 + 0.5).to(dtype)
    w = (1 + 0.5 * torch.randn(width, generator=g)).to(dtype)
    b = (0.5 * torch.randn(width, generator=g)).to(dtype)
    return x.to(device), w.to(device), b.to(device)


def torch_ln_gelu(x, w, b, eps=1e-5, approximate="tanh"):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = F.gelu(F.layer_norm(x.to(acc), (x.shape[-1],), w.to(acc), b.to(acc), eps), approximate=approximate)
    return y.to(x.dtype)


def make_csr(lengths, seed, dtype=torch.float32, index_dtype=torch.int64, neg_inf_rows=(), device="cpu"):
    """CSR rows of the given lengths, N(0, 3²) values, a few stored −inf, whole −inf rows on request."""
    g = generator(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    crow = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    crow[1:] = lengths.cumsum(0)
    nnz = int(crow[-1])
    values = torch.randn(nnz, generator=g) * 3
    values[torch.rand(nnz, generator=g) < 0.05] = -math.inf
    for r in neg_inf_rows:
        values[crow[r]:crow[r + 1]] = -math.inf
    return values.to(dtype).to(device), crow.to(index_dtype).to(device)


def dense_softmax_oracle(values, crow):
    """Row by row: torch.softmax in float64, all −inf rows → 0."""
    out = torch.zeros(values.shape, dtype=torch.float64)
    v = values.double().cpu()
    crow = crow.cpu()
    for r in range(crow.numel() - 1):
        s, e = int(crow[r]), int(crow[r + 1])
        if e > s and not bool(torch.isneginf(v[s:e]).all()):
            out[s:e] = torch.softmax(v[s:e], 0)
    return out


pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta", "ignore:Sparse invariant checks")


@pytest.fixture(autouse=True)
def _fixed_triton_configs(request, monkeypatch):
    """The launchers' fixed default configs instead of autotuning (which compiles and times up
    to 10 configs per new row length: the GPU tests see dozens), except in the tests named
    ``test_gpu_autotuned_*``. (The interpreter never autotunes.)"""
    from pcops.triton import fused as tri

    if not request.node.name.startswith("test_gpu_autotuned"):
        monkeypatch.setattr(tri, "AUTOTUNE", False)

AWKWARD_LENGTHS = [0, 1, 5, 0, 0, 17, 1, 64, 3, 130, 2, 0, 33, 1]


# --- reference (CPU) ------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_layer_norm_gelu_matches_torch(width, dtype, approximate):
    x, w, b = make_ln(5, width, seed=width, dtype=dtype, lead=(2,))
    out = pcops.fused_layer_norm_gelu(x, w, b, approximate=approximate)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, torch_ln_gelu(x, w, b, approximate=approximate), **TOL[dtype])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_layer_norm_gelu_gradients_match_autograd(width, approximate):
    x, w, b = make_ln(6, width, seed=width + 1)
    g = torch.randn(6, width, generator=generator(2))
    ins = [t.clone().requires_grad_(True) for t in (x, w, b)]
    pcops.fused_layer_norm_gelu(*ins, approximate=approximate).backward(g)
    exp = [t.clone().requires_grad_(True) for t in (x, w, b)]
    torch_ln_gelu(*exp, approximate=approximate).backward(g)
    for a, e in zip(ins, exp):
        torch.testing.assert_close(a.grad, e.grad, **GRAD_TOL[torch.float32])


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.4])
def test_layer_norm_gelu_gradcheck(approximate, dropout_p):
    x, w, b = make_ln(4, 7, seed=3, dtype=torch.float64, lead=(2,))
    ins = [t.requires_grad_(True) for t in (x, w, b)]

    def fn(x, w, b):  # the same seed each call: the same mask
        return pcops.fused_layer_norm_gelu(x, w, b, 1e-5, approximate, dropout_p, True, generator(11))

    assert torch.autograd.gradcheck(fn, ins)


def test_layer_norm_gelu_float64_exact_and_leading_shapes():
    x, w, b = make_ln(3, 9, seed=4, dtype=torch.float64, lead=(2, 5))
    torch.testing.assert_close(pcops.fused_layer_norm_gelu(x, w, b), torch_ln_gelu(x, w, b), **TOL[torch.float64])
    y = pcops.fused_layer_norm_gelu(x[0, 0, 0], w, b)  # 1-D input: one row
    torch.testing.assert_close(y, torch_ln_gelu(x[0, 0, 0], w, b), **TOL[torch.float64])


def test_layer_norm_gelu_empty_rows():
    x, w, b = make_ln(0, 8, seed=5)
    x.requires_grad_(True)
    w.requires_grad_(True)
    y = pcops.fused_layer_norm_gelu(x, w, b)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(8))


def _check_dropout_stats(kept: torch.Tensor, p: float):
    n = kept.numel()
    frac = kept.float().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(frac - (1 - p)) <= 3 * sigma, (frac, 1 - p, sigma)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_statistics_scale_and_mask_reuse_cpu(p):
    x, w, b = make_ln(64, 96, seed=6)
    y0 = pcops.fused_layer_norm_gelu(x, w, b)
    xr = x.clone().requires_grad_(True)
    y = pcops.fused_layer_norm_gelu(xr, w, b, dropout_p=p, training=True, generator=generator(7))
    keep = y != 0
    _check_dropout_stats(keep, p)
    torch.testing.assert_close(y[keep], y0[keep] / (1 - p))
    # same seed → same mask; another seed → another mask
    y_again = pcops.fused_layer_norm_gelu(x, w, b, dropout_p=p, training=True, generator=generator(7))
    assert torch.equal(y_again, y.detach())
    y_other = pcops.fused_layer_norm_gelu(x, w, b, dropout_p=p, training=True, generator=generator(8))
    assert not torch.equal(y_other != 0, keep)
    # the backward uses the forward's mask
    g = torch.randn(64, 96, generator=generator(9))
    y.backward(g)
    _, mean, rstd = ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    dx, _, _ = ref.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, keep)
    torch.testing.assert_close(xr.grad, dx)
    # eval mode and p = 0: no dropout
    assert torch.equal(pcops.fused_layer_norm_gelu(x, w, b, dropout_p=p, training=False), y0)
    assert torch.equal(pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.0, training=True), y0)


def test_default_generator_follows_manual_seed():
    x, w, b = make_ln(8, 32, seed=10)
    torch.manual_seed(123)
    a = pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.5, training=True)
    torch.manual_seed(123)
    assert torch.equal(a, pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.5, training=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swish_dropout_residual_cpu(dtype):
    g = generator(12)
    x = torch.randn(3, 50, generator=g).to(dtype)
    r = torch.randn(3, 50, generator=g).to(dtype)
    expected = (F.silu(x.float()) + r.float()).to(dtype)
    torch.testing.assert_close(pcops.fused_swish_dropout_residual(x, r, 0.3, training=False), expected, **TOL[dtype])
    torch.testing.assert_close(pcops.fused_swish_dropout_residual(x, r, 0.0), expected, **TOL[dtype])
    xr, rr = x.float().requires_grad_(True), r.float().requires_grad_(True)
    y = pcops.fused_swish_dropout_residual(xr, rr, 0.3, generator=generator(13))
    keep = (y - rr) != 0
    torch.testing.assert_close(y, F.silu(xr) * keep / 0.7 + rr)
    gy = torch.randn(3, 50, generator=g)
    y.backward(gy)
    xe = x.float().requires_grad_(True)
    (F.silu(xe) * keep / 0.7).backward(gy)
    torch.testing.assert_close(xr.grad, xe.grad)
    assert torch.equal(rr.grad, gy)


def test_swish_gradcheck_and_statistics():
    g = generator(14)
    x = torch.randn(2, 9, dtype=torch.float64, generator=g).requires_grad_(True)
    r = torch.randn(2, 9, dtype=torch.float64, generator=g).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, r: pcops.fused_swish_dropout_residual(x, r, 0.25, generator=generator(1)), (x, r))
    big = torch.rand(20000, generator=g) + 0.5  # swish(x) > 0: dropped ⇔ output == residual (0)
    y = pcops.fused_swish_dropout_residual(big, torch.zeros_like(big), 0.3, generator=generator(2))
    _check_dropout_stats(y != 0, 0.3)
    torch.testing.assert_close(y[y != 0], F.silu(big)[y != 0] / 0.7)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_softmax_reference(index_dtype, dtype):
    values, crow = make_csr(AWKWARD_LENGTHS, seed=15, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12))
    out = pcops.sparse_softmax(values, crow)
    assert out.dtype == dtype and out.shape == values.shape
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), dense_softmax_oracle(values, crow), **TOL[dtype])
    assert out[int(crow[12]):int(crow[13])].abs().sum() == 0  # an all −inf row → zeros


def test_sparse_softmax_edge_cases():
    assert pcops.sparse_softmax(torch.zeros(0), torch.zeros(1, dtype=torch.int64)).shape == (0,)
    assert pcops.sparse_softmax(torch.zeros(0), torch.zeros(4, dtype=torch.int64)).shape == (0,)
    one = pcops.sparse_softmax(torch.tensor([-5.0, 7.0, -math.inf]), torch.tensor([0, 1, 2, 3]))
    assert one.tolist() == [1.0, 1.0, 0.0]
    big = pcops.sparse_softmax(torch.tensor([1000.0, 1000.0, -1000.0]), torch.tensor([0, 3]))
    torch.testing.assert_close(big, torch.tensor([0.5, 0.5, 0.0]))


def test_sparse_softmax_matches_torch_sparse_softmax():
    values, crow = make_csr([4, 1, 9, 2], seed=16)
    values = values.clamp_min(-50)  # torch.sparse.softmax over stored −inf is not our concern here
    lengths = crow[1:] - crow[:-1]
    cols = torch.cat([torch.arange(int(n)) for n in lengths])
    csr = torch.sparse_csr_tensor(crow, cols, values, (4, 9))
    expected = torch.sparse.softmax(csr.to_sparse_coo(), dim=1).coalesce().values()
    torch.testing.assert_close(pcops.sparse_softmax(values, crow), expected)
    out = pcops.sparse_softmax(csr)
    assert out.layout == torch.sparse_csr and out.shape == csr.shape
    assert torch.equal(out.crow_indices(), crow) and torch.equal(out.col_indices(), cols)
    torch.testing.assert_close(out.values(), expected)


def test_sparse_softmax_gradients():
    values, crow = make_csr(AWKWARD_LENGTHS, seed=17, dtype=torch.float64, neg_inf_rows=(6,))
    finite = values.clamp_min(-30).requires_grad_(True)  # gradcheck needs finite perturbations
    assert torch.autograd.gradcheck(lambda v: pcops.sparse_softmax(v, crow), (finite,))
    v = values.clone().requires_grad_(True)
    y = pcops.sparse_softmax(v, crow)
    g = torch.randn(y.shape, dtype=torch.float64, generator=generator(3))
    y.backward(g)
    row = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow[1:] - crow[:-1])
    dot = torch.zeros(crow.numel() - 1, dtype=torch.float64).index_add_(0, row, g * y.detach())
    torch.testing.assert_close(v.grad, y.detach() * (g - dot[row]))


def test_layer_norm_gelu_module():
    m = pcops.nn.LayerNormGELU(16, dropout_p=0.5, dtype=torch.float64)
    x = torch.randn(4, 16, dtype=torch.float64, generator=generator(18))
    torch.testing.assert_close(m.eval()(x), torch_ln_gelu(x, m.weight.detach(), m.bias.detach()), **TOL[torch.float64])
    m.train()
    y = m(x)
    assert 0 < (y == 0).sum() < y.numel()
    y.sum().backward()
    assert m.weight.grad.shape == (16,) and m.bias.grad.shape == (16,)
    assert "dropout_p=0.5" in repr(m)
    with pytest.raises(ValueError, match="normalized_shape"):
        pcops.nn.LayerNormGELU(0)
    with pytest.raises(TypeError, match="normalized_shape"):
        pcops.nn.LayerNormGELU(16.0)


def test_opcheck():
    x, w, b = make_ln(5, 13, seed=19)
    seed = torch.tensor([42])
    for s, p in ((None, 0.0), (seed, 0.3)):
        torch.library.opcheck(torch.ops.pcops.layer_norm_gelu, (x, w, b, 1e-5, "tanh", p, s))
        torch.library.opcheck(
            torch.ops.pcops.layer_norm_gelu, (x.double().requires_grad_(), w.double().requires_grad_(), b.double(), 1e-5, "none", p, s)
        )
        _, mean, rstd = ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")
        torch.library.opcheck(torch.ops.pcops.layer_norm_gelu_backward, (torch.randn_like(x), x, w, b, mean, rstd, "tanh", p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x, torch.randn_like(x), p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x.double().requires_grad_(), x.double(), p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_backward, (torch.randn_like(x), x, p, s))
    values, crow = make_csr(AWKWARD_LENGTHS, seed=20)
    torch.library.opcheck(torch.ops.pcops.sparse_softmax, (values, crow, "triton"))
    torch.library.opcheck(torch.ops.pcops.sparse_softmax, (values.clamp_min(-30).double().requires_grad_(), crow, "cuda"))
    torch.library.opcheck(torch.ops.pcops.sparse_softmax_backward, (torch.randn_like(values), values.softmax(0), crow, "triton"))


def test_torch_compile_fullgraph():
    x, w, b = make_ln(6, 24, seed=21)
    values, crow = make_csr([3, 0, 5, 1], seed=22)

    def net(x, w, b, values, crow):
        h = pcops.fused_layer_norm_gelu(x * 2, w, b)
        h = pcops.fused_swish_dropout_residual(h, x, 0.5, training=False)
        return h.sum(1), pcops.sparse_softmax(values * 0.5, crow, validate=False)

    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    for a, e in zip(compiled(x, w, b, values, crow), net(x, w, b, values, crow)):
        torch.testing.assert_close(a, e)
    # gradients through the compiled graph (the backward custom ops have fake functions too)
    ins = [t.clone().requires_grad_(True) for t in (x, w, b, values)]
    out, soft = compiled(*ins[:3], ins[3], crow)
    (out.sum() + (soft * torch.arange(soft.numel())).sum()).backward()
    exp = [t.clone().requires_grad_(True) for t in (x, w, b, values)]
    out, soft = net(*exp[:3], exp[3], crow)
    (out.sum() + (soft * torch.arange(soft.numel())).sum()).backward()
    for a, e in zip(ins, exp):
        torch.testing.assert_close(a.grad, e.grad)


def test_torch_compile_training_dropout():
    x, w, b = make_ln(64, 32, seed=36)
    compiled = torch.compile(
        lambda x: pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.5, training=True), fullgraph=True, backend="aot_eager"
    )
    first, second = compiled(x), compiled(x)
    _check_dropout_stats(first != 0, 0.5)
    assert not torch.equal(first != 0, second != 0)  # a fresh seed per call, not one baked into the graph


@pytest.mark.parametrize("call,exc,name", [
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x.int(), w, b), TypeError, "x"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x[:, :0], w, b), ValueError, "x"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w[:-1], b), ValueError, "weight"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b[None]), ValueError, "bias"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w.int(), b), TypeError, "weight"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b, eps=0.0), ValueError, "eps"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b, approximate="erf"), ValueError, "approximate"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b, dropout_p=1.0), ValueError, "dropout_p"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b, dropout_p=-0.1), ValueError, "dropout_p"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b, training=1), TypeError, "training"),
    (lambda x, w, b: pcops.fused_layer_norm_gelu(x, w, b, 1e-5, "tanh", 0.1, True, 3), TypeError, "generator"),
    (lambda x, w, b: pcops.fused_swish_dropout_residual(x, x.double(), 0.1), TypeError, "residual"),
    (lambda x, w, b: pcops.fused_swish_dropout_residual(x, x[:1], 0.1), ValueError, "residual"),
    (lambda x, w, b: pcops.fused_swish_dropout_residual(x, x, 1.5), ValueError, "dropout_p"),
    (lambda x, w, b: pcops.fused_swish_dropout_residual(x.long(), x.long(), 0.1), TypeError, "x"),
])
def test_bad_input_dense(call, exc, name):
    x, w, b = make_ln(3, 8, seed=23)
    with pytest.raises(exc, match=name):
        call(x, w, b)


@pytest.mark.parametrize("values,crow,exc,name", [
    (torch.zeros(4, dtype=torch.int32), torch.tensor([0, 4]), TypeError, "values"),
    (torch.zeros(2, 2), torch.tensor([0, 4]), ValueError, "values"),
    (torch.zeros(4), torch.tensor([0.0, 4.0]), TypeError, "crow_indices"),
    (torch.zeros(4), torch.tensor([0, 3]), ValueError, "crow_indices"),  # does not end at nnz
    (torch.zeros(4), torch.tensor([0, 3, 2, 4]), ValueError, "crow_indices"),  # not monotone
    (torch.zeros(4), torch.tensor([1, 4]), ValueError, "crow_indices"),  # does not start at 0
    (torch.zeros(4), torch.zeros(0, dtype=torch.int64), ValueError, "crow_indices"),
    (torch.zeros(4), None, TypeError, "crow_indices"),
])
def test_bad_input_sparse(values, crow, exc, name):
    with pytest.raises(exc, match=name):
        pcops.sparse_softmax(values, crow)


def test_bad_input_sparse_backend_and_csr():
    with pytest.raises(ValueError, match="backend"):
        pcops.sparse_softmax(torch.zeros(4), torch.tensor([0, 4]), backend="cpp")
    csr = torch.eye(3).to_sparse_csr()
    with pytest.raises(ValueError, match="crow_indices"):
        pcops.sparse_softmax(csr, csr.crow_indices())


# --- Triton kernels under the CPU interpreter (tiny shapes) ---------------------------------


@pytest.mark.parametrize("rows,width,max_block_n", [(3, 1, None), (8, 3, None), (5, 127, None), (4, 130, 32), (2, 127, 64)])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@interpret
def test_triton_layer_norm_gelu_interpreter(rows, width, max_block_n, approximate, dtype):
    from pcops.triton import fused as tri

    x, w, b = make_ln(rows, width, seed=rows * width, dtype=dtype)
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, approximate, max_block_n=max_block_n)
    yr, mr, rr = ref.layer_norm_gelu(x, w, b, 1e-5, approximate)
    torch.testing.assert_close(y, yr, **TOL[dtype])
    torch.testing.assert_close(mean, mr, **TOL[torch.float32])
    torch.testing.assert_close(rstd, rr, **TOL[torch.float32])
    g = torch.randn(rows, width, generator=generator(1)).to(dtype)
    got = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, approximate, max_block_n=max_block_n, num_programs=3)
    exp = ref.layer_norm_gelu_backward(g, x, w, b, mr, rr, approximate)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[dtype])


@pytest.mark.parametrize("rows,width,block_m,tiles", [(13, 16, 2, 4), (9, 5, 4, 2), (3, 8, 1, 4), (17, 64, 4, 4)])
@interpret
def test_triton_layer_norm_gelu_tiles_interpreter(rows, width, block_m, tiles):
    """Several prefetched tiles per program: ragged last program, rows past M, even and odd widths."""
    from pcops.triton import fused as tri

    x, w, b = make_ln(rows, width, seed=rows + 7 * width, dtype=torch.bfloat16)
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", block_m=block_m, num_warps=1, tiles=tiles)
    yr, mr, rr = ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    torch.testing.assert_close(y, yr, **TOL[torch.bfloat16])
    torch.testing.assert_close(mean, mr, **TOL[torch.float32])
    torch.testing.assert_close(rstd, rr, **TOL[torch.float32])
    seed, p = torch.tensor([77]), 0.25
    keep = tri.dropout_keep_mask(seed, (rows, width), p)
    y, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, seed, block_m=block_m, num_warps=1, tiles=tiles)
    torch.testing.assert_close(y, ref.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, keep)[0], **TOL[torch.bfloat16])


def test_forward_search_space():
    """The documented forward configs for the benchmark widths (block_n 1024, 256, 64)."""
    from pcops.triton import fused as tri

    def space(block_n, one_tile=True, m_rows=131072):
        return {(c.kwargs["BLOCK_M"], c.num_warps, c.kwargs["TILES"])
                for c in tri._prune_fwd(tri._FWD_CONFIGS, {"M": m_rows}, BLOCK_N=block_n, ONE_TILE=one_tile,
                                        M_CLASS=tri._m_class(m_rows))}

    # L1 (4,096 rows): one tile per program only (4 tiles left too few programs on the H200)
    assert all(t == 1 for _, _, t in space(1024, m_rows=4096)) and space(1024, m_rows=4096)
    # L3 (131,072 × 64): multi-tile configs only while they keep ≥ 2,048 programs
    assert {(m, w, t) for m, w, t in space(64) if t > 1} == {(16, 2, 4), (16, 4, 4)}
    l2 = space(256)
    assert {(8, 4, 1), (8, 8, 1), (8, 16, 1), (16, 8, 1), (16, 16, 1), (32, 16, 1)} <= l2  # measured before
    assert {(4, 2, 4), (4, 4, 4), (8, 4, 4), (8, 8, 4)} <= l2 and len(l2) == 10
    for block_n in (1, 64, 1024, 8192):
        got = space(block_n)
        assert 1 <= len(got) <= 10
        for m, w, t in got:
            assert t in (1, tri._FWD_MULTI_TILES) and m * block_n / (32 * w) <= 16
    assert all(t == 1 for _, _, t in space(8192, one_tile=False))


@pytest.mark.parametrize("g,n", [(0, 5), (1, 3), (3, 17), (700, 9), (5000, 2)])
@interpret
def test_triton_column_sum_interpreter(g, n):
    from pcops.triton import fused as tri

    gen = generator(g + n)
    dw_part, db_part = torch.randn(g, n, generator=gen), torch.randn(g, n, generator=gen)
    dw, db = torch.empty(n, dtype=torch.bfloat16), torch.empty(n)
    tri._column_sum(dw_part, db_part, dw, db, g, n)
    torch.testing.assert_close(dw, dw_part.sum(0).to(torch.bfloat16), **TOL[torch.bfloat16])
    torch.testing.assert_close(db, db_part.sum(0), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("max_block_n", [None, 16])
@interpret
def test_triton_dropout_interpreter(max_block_n):
    from pcops.triton import fused as tri

    p, rows, width = 0.3, 8, 40
    x, w, b = make_ln(rows, width, seed=24)
    seed = torch.tensor([1234])
    keep = tri.dropout_keep_mask(seed, (rows, width), p)
    assert torch.equal(keep, tri.dropout_keep_mask(seed, (rows, width), p))  # same seed → same mask
    assert not torch.equal(keep, tri.dropout_keep_mask(torch.tensor([1235]), (rows, width), p))
    _check_dropout_stats(tri.dropout_keep_mask(seed, (4000,), p), p)
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, seed, max_block_n=max_block_n)
    torch.testing.assert_close(y, ref.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, keep)[0])
    g = torch.randn(rows, width, generator=generator(2))
    got = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, seed, max_block_n=max_block_n)
    exp = ref.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, keep)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[torch.float32])
    # Swish: the same Philox stream over the flat index
    r = torch.randn(rows, width, generator=generator(3))
    torch.testing.assert_close(tri.swish_dropout_residual(x, r, p, seed), ref.swish_dropout_residual(x, r, p, keep))
    torch.testing.assert_close(tri.swish_dropout_backward(g, x, p, seed), ref.swish_dropout_backward(g, x, p, keep))
    torch.testing.assert_close(tri.swish_dropout_residual(x, r, p, None), ref.swish_dropout_residual(x, r, p, None))


# (layout, launcher config): the tile kernel at the default and a narrow step; the grouped
# kernel at the mean-length default, with a tiny capacity (sub 4 × vpt 2 = 8: most rows loop
# over chunks), a warp per row, and 2 rows per thread (block_r 8 with 1 warp of 4 groups)
CSR_CASES = [("tile", {}), ("tile", dict(block_l=16)), ("grouped", {}), ("grouped", dict(sub=4, vpt=2)),
             ("grouped", dict(sub=32, vpt=4, num_warps=2)), ("grouped", dict(sub=8, vpt=8, block_r=8, num_warps=1))]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout,config", CSR_CASES)
@interpret
def test_triton_sparse_softmax_interpreter(index_dtype, dtype, layout, config):
    from pcops.triton import fused as tri

    values, crow = make_csr(AWKWARD_LENGTHS, seed=25, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12))
    y = tri.sparse_softmax(values, crow, layout=layout, **config)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y, ref.sparse_softmax(values, crow), **TOL[dtype])
    g = torch.randn(values.shape, generator=generator(4)).to(dtype)
    torch.testing.assert_close(
        tri.sparse_softmax_backward(g, y, crow, layout=layout, **config), ref.sparse_softmax_backward(g, y, crow),
        **GRAD_TOL[dtype]
    )


@pytest.mark.parametrize("layout,config", [("grouped", dict(sub=4, vpt=2)), ("tile", dict(block_l=16))])
@interpret
def test_triton_sparse_softmax_interpreter_chunks(layout, config):
    """Rows longer than a chunk whose first chunk is all −inf, or whose max comes late (the grouped
    kernel rescales its first chunk's exponentials to the final max)."""
    from pcops.triton import fused as tri

    rows = [torch.cat([torch.full((8,), -math.inf), torch.randn(5, generator=generator(5))]),  # first chunk −inf
            torch.cat([torch.full((16,), -math.inf), torch.randn(3, generator=generator(6))]),
            torch.cat([torch.randn(9, generator=generator(7)), torch.tensor([80.0, -3.0])]),  # late max
            torch.cat([torch.tensor([60.0]), torch.randn(20, generator=generator(8)) - 100]),  # early max
            torch.full((12,), -math.inf)]
    values = torch.cat(rows)
    crow = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    y = tri.sparse_softmax(values, crow, layout=layout, **config)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.double(), dense_softmax_oracle(values, crow), atol=1e-6, rtol=1e-5)


def test_triton_grouped_shape_choice():
    from pcops.cuda import sparse_softmax as cu
    from pcops.triton import fused as tri

    assert tri.CSR_LAYOUT in ("grouped", "tile")
    for rows, nnz in ((120000, 120000 * 65 // 2), (100, 800), (100, 6000), (100, 100000), (0, 0)):
        # the same group shape as the CUDA C++ launcher picks
        assert "g%dx%d" % tri._group_shape(rows, nnz) == cu.choose_variant(rows, nnz)
    keep = tri._prune_grouped(tri._GROUPED_CONFIGS, {}, SUB=8)
    assert {(c.kwargs["BLOCK_R"], c.num_warps) for c in keep} == {(16, 4), (32, 4), (32, 8), (64, 8)}
    with pytest.raises(ValueError, match="layout"):
        tri.sparse_softmax(torch.zeros(2), torch.tensor([0, 2]), layout="rows")


@interpret
def test_triton_sparse_softmax_interpreter_clamps_bad_crow():
    from pcops.triton import fused as tri

    values = torch.randn(6)
    # decreasing and past nnz: row 1 is empty, row 2 is clamped to [2, 6); nothing out of bounds
    y = tri.sparse_softmax(values, torch.tensor([0, 4, 2, 100]))
    assert bool(((y >= 0) & (y <= 1)).all())
    torch.testing.assert_close(y[4:], torch.softmax(values[2:6], 0)[2:])


# --- the GPU paths --------------------------------------------------------------------------


# every awkward width in float32 (both GELU forms), half of them in each 16-bit dtype: each new
# (width, dtype) pair autotunes (~11 kernel compilations), so the GPU run stays short
GPU_LN_CASES = (
    [(w, torch.float32, a) for w in WIDTHS for a in ("tanh", "none")]
    + [(w, torch.bfloat16, "tanh") for w in (1, 127, 1025)]
    + [(w, torch.float16, "none") for w in (3, 768, 4097)]
)


@pytest.mark.parametrize("width,dtype,approximate", GPU_LN_CASES)
@pytest.mark.gpu
@requires_cuda
def test_gpu_layer_norm_gelu(width, dtype, approximate):
    x, w, b = make_ln(37, width, seed=width, dtype=dtype)
    g = torch.randn(37, width, generator=generator(5)).to(dtype)
    exp = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y_ref = pcops.fused_layer_norm_gelu(*exp, approximate=approximate)
    y_ref.backward(g)
    got = [t.cuda().requires_grad_(True) for t in (x, w, b)]
    y = pcops.fused_layer_norm_gelu(*got, approximate=approximate)
    torch.testing.assert_close(y.cpu(), y_ref.detach(), **TOL[dtype])
    y.backward(g.cuda())
    rows_tol = dict(GRAD_TOL[dtype])
    for i, (a, e) in enumerate(zip(got, exp)):
        if i:  # weight/bias gradients are sums over 37 rows
            rows_tol = {k: v * 8 for k, v in GRAD_TOL[dtype].items()}
        torch.testing.assert_close(a.grad.cpu(), e.grad, **rows_tol)


@pytest.mark.parametrize("rows,width", [(4096, 256), (1000, 64), (300, 8192 + 5)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_layer_norm_gelu_many_rows_deterministic(rows, width):
    from pcops.triton import fused as tri

    x, w, b = make_ln(rows, width, seed=26, device="cuda")
    g = torch.randn(rows, width, generator=generator(6)).cuda()
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    yr, mr, rr = ref.layer_norm_gelu(x.double(), w.double(), b.double(), 1e-5, "tanh")
    torch.testing.assert_close(y, yr.float(), atol=1e-4, rtol=1e-4)
    first = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh")
    second = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh")
    for a, c in zip(first, second):
        assert torch.equal(a, c)  # no atomics: bit-for-bit reproducible
    exp = ref.layer_norm_gelu_backward(g.double(), x.double(), w.double(), b.double(), mr, rr, "tanh")
    torch.testing.assert_close(first[0], exp[0].float(), atol=1e-4, rtol=1e-4)
    for a, e in zip(first[1:], exp[1:]):
        torch.testing.assert_close(a, e.float(), atol=1e-4 * math.sqrt(rows), rtol=1e-4)
    # the chunked path for wide rows gives the same answer
    chunked = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", max_block_n=64)
    torch.testing.assert_close(chunked[0], y, atol=1e-5, rtol=1e-5)
    chunked_bwd = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", max_block_n=64)
    for a, c in zip(chunked_bwd, first):
        torch.testing.assert_close(a, c, atol=1e-4 * math.sqrt(rows), rtol=1e-4)


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.gpu
@requires_cuda
def test_gpu_dropout(p):
    from pcops.triton import fused as tri

    x, w, b = make_ln(512, 768, seed=27, device="cuda")
    xr = x.clone().requires_grad_(True)
    gen = torch.Generator(device="cuda").manual_seed(5)
    y = pcops.fused_layer_norm_gelu(xr, w, b, dropout_p=p, training=True, generator=gen)
    # the mask is the kernels' Philox stream for the seed drawn from the generator
    gen.manual_seed(5)
    seed = torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device="cuda", generator=gen)
    keep = tri.dropout_keep_mask(seed, y.shape, p)
    _check_dropout_stats(keep, p)
    y0 = pcops.fused_layer_norm_gelu(x, w, b)
    assert bool((y[~keep] == 0).all())
    torch.testing.assert_close(y[keep], y0[keep] / (1 - p))
    gen.manual_seed(5)  # same seed → same mask
    assert torch.equal(pcops.fused_layer_norm_gelu(x, w, b, dropout_p=p, training=True, generator=gen), y)
    # a CPU generator: the seed is drawn on the host and copied to the device
    host = [pcops.fused_layer_norm_gelu(x, w, b, dropout_p=p, training=True, generator=generator(3)) for _ in range(2)]
    assert torch.equal(host[0], host[1])
    _check_dropout_stats(host[0] != 0, p)
    g = torch.randn(512, 768, device="cuda")
    y.backward(g)  # the backward regenerates the same mask
    _, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    torch.testing.assert_close(xr.grad, ref.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, keep)[0],
                               atol=1e-4, rtol=1e-4)
    # Swish + dropout + residual: the same stream over the flat index
    xs = x.clone().requires_grad_(True)
    gen.manual_seed(5)
    ys = pcops.fused_swish_dropout_residual(xs, torch.zeros_like(x), p, generator=gen)
    torch.testing.assert_close(ys, F.silu(x) * keep / (1 - p))
    ys.backward(g)
    torch.testing.assert_close(xs.grad, ref.swish_dropout_backward(g, x, p, keep), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@requires_cuda
def test_gpu_dropout_cuda_graph_replays_draw_fresh_masks():
    x, w, b = make_ln(256, 128, seed=28, device="cuda")
    pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.5, training=True)  # compile/autotune outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = pcops.fused_layer_norm_gelu(x, w, b, dropout_p=0.5, training=True)
    graph.replay()
    first = (y != 0).clone()
    graph.replay()
    second = y != 0
    assert not torch.equal(first, second)
    _check_dropout_stats(second, 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.gpu
@requires_cuda
def test_gpu_swish(dtype):
    g = generator(29)
    x = torch.randn(1000, 257, generator=g).to(dtype)
    r = torch.randn(1000, 257, generator=g).to(dtype)
    gy = torch.randn(1000, 257, generator=g).to(dtype)
    xc, rc = x.cuda().requires_grad_(True), r.cuda().requires_grad_(True)
    y = pcops.fused_swish_dropout_residual(xc, rc, 0.2, training=False)
    torch.testing.assert_close(y.cpu(), ref.swish_dropout_residual(x, r, 0.2), **TOL[dtype])
    y.backward(gy.cuda())
    torch.testing.assert_close(xc.grad.cpu(), ref.swish_dropout_backward(gy, x, 0.2), **GRAD_TOL[dtype])
    assert torch.equal(rc.grad.cpu(), gy)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.gpu
@requires_cuda
def test_gpu_sparse_softmax(backend, dtype, index_dtype):
    g = generator(30)
    lengths = AWKWARD_LENGTHS + [1000, 0, 129, 128, 127, 5000] + torch.randint(0, 70, (3000,), generator=g).tolist()
    values, crow = make_csr(lengths, seed=31, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12, 15))
    expected = ref.sparse_softmax(values, crow)
    vc = values.cuda().requires_grad_(True)
    y = pcops.sparse_softmax(vc, crow.cuda(), backend=backend)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.cpu(), expected, **TOL[dtype])
    gy = torch.randn(values.shape, generator=g).to(dtype)
    y.backward(gy.cuda())
    torch.testing.assert_close(vc.grad.cpu(), ref.sparse_softmax_backward(gy, y.detach().cpu(), crow), **GRAD_TOL[dtype])


def test_cuda_softmax_group_choice():
    from pcops.cuda import sparse_softmax as cu

    assert cu.choose_variant(120000, 120000 * 65 // 2) == "g8x8"  # Q1: lengths 1..64, 4 rows per warp
    assert cu.choose_variant(100, 800) == "g4x8"  # mean 8: lengths ≤ 32, 8 rows per warp
    assert cu.choose_variant(100, 6000) == "g16x8"  # mean 60: ≤ 128, 2 rows per warp
    assert cu.choose_variant(100, 100000) == "g32x4"  # long rows: a warp per row, the block beyond 128
    assert cu.choose_variant(0, 0) == "g4x8"
    for name, (sub, vpt) in cu.VARIANTS.items():
        assert name == f"g{sub}x{vpt}" and 32 % sub == 0
    with pytest.raises(ValueError, match="variant"):
        cu._plan(10, 10, "g2x2")


# every CUDA C++ group shape (one NVRTC module), every Triton group shape and the Triton tile
# layout (fixed configs) in float32 / int64; the Q1 shapes also in bfloat16 / int32
F32, BF16 = (torch.float32, torch.int64), (torch.bfloat16, torch.int32)
SOFTMAX_GPU_CASES = ([("cuda", dict(variant=v), F32) for v in ("g32x4", "g4x8", "g8x8", "g16x8")]
                     + [("cuda", dict(variant="g8x8"), BF16)]
                     + [("triton", dict(layout="grouped", sub=s, vpt=v, num_warps=4), F32)
                        for s, v in ((4, 8), (8, 8), (16, 8), (32, 4))]
                     + [("triton", dict(layout="grouped", sub=8, vpt=8, num_warps=4), BF16),
                        ("triton", dict(layout="tile"), F32)])


@pytest.mark.parametrize("backend,config,types", SOFTMAX_GPU_CASES)
@pytest.mark.gpu
@requires_cuda
def test_gpu_softmax_groups(backend, config, types):
    """Every group shape against the reference: rows at and around each capacity (32, 64, 128),
    long rows, empty and all −inf rows, groups of a warp with mixed lengths."""
    if backend == "cuda":
        from pcops.cuda import sparse_softmax as impl
    else:
        from pcops.triton import fused as impl

    dtype, index_dtype = types
    g = generator(36)
    lengths = (AWKWARD_LENGTHS + [31, 32, 33, 63, 64, 65, 127, 128, 129, 257, 1000, 0, 5000]
               + torch.randint(0, 70, (2000,), generator=g).tolist())
    values, crow = make_csr(lengths, seed=37, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12))
    vc, cc = values.cuda(), crow.cuda()
    y = impl.sparse_softmax(vc, cc, **config)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.cpu(), ref.sparse_softmax(values, crow), **TOL[dtype])
    gy = torch.randn(values.shape, generator=g).to(dtype)
    dx = impl.sparse_softmax_backward(gy.cuda(), y, cc, **config)
    torch.testing.assert_close(dx.cpu(), ref.sparse_softmax_backward(gy, y.cpu(), crow), **GRAD_TOL[dtype])


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_sparse_softmax_q1_graph_and_csr_tensor(backend):
    torch.manual_seed(0)
    lengths = torch.randint(1, 65, (120000,))
    crow = torch.zeros(120001, dtype=torch.int64)
    crow[1:] = lengths.cumsum(0)
    values = torch.randn(int(crow[-1]))
    crow_c, values_c = crow.cuda(), values.cuda()
    y = pcops.sparse_softmax(values_c, crow_c, backend=backend, validate=True)
    torch.testing.assert_close(y.cpu(), ref.sparse_softmax(values, crow), atol=1e-6, rtol=1e-5)
    static = values_c.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pcops.sparse_softmax(static, crow_c, backend=backend)
    static.mul_(2)
    graph.replay()
    torch.testing.assert_close(out, pcops.sparse_softmax(values_c * 2, crow_c, backend=backend))
    cols = torch.cat([torch.arange(int(n)) for n in lengths[:50]])
    csr = torch.sparse_csr_tensor(crow[:51], cols, values[: int(crow[50])], (50, 64)).cuda()
    out_csr = pcops.sparse_softmax(csr, backend=backend)
    assert out_csr.layout == torch.sparse_csr
    torch.testing.assert_close(out_csr.values().cpu(), ref.sparse_softmax(values[: int(crow[50])], crow[:51]))
    with pytest.raises(ValueError, match="crow_indices"):
        pcops.sparse_softmax(values_c, crow_c[:-1], backend=backend, validate=True)


@pytest.mark.gpu
@requires_cuda
def test_gpu_float64_falls_back_to_plain_torch():
    x, w, b = make_ln(5, 33, seed=32, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(pcops.fused_layer_norm_gelu(x, w, b), torch_ln_gelu(x, w, b))
    values, crow = make_csr([3, 0, 7], seed=33, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(pcops.sparse_softmax(values, crow).cpu(), dense_softmax_oracle(values, crow))


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck():
    x, w, b = make_ln(9, 100, seed=34, device="cuda")
    seed = torch.tensor([7], device="cuda")
    for s, p in ((None, 0.0), (seed, 0.3)):
        torch.library.opcheck(torch.ops.pcops.layer_norm_gelu, (x, w, b, 1e-5, "tanh", p, s))
        _, mean, rstd = torch.ops.pcops.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, s)
        torch.library.opcheck(torch.ops.pcops.layer_norm_gelu_backward, (torch.randn_like(x), x, w, b, mean, rstd, "tanh", p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x, torch.randn_like(x), p, s))
    values, crow = make_csr(AWKWARD_LENGTHS, seed=35, device="cuda")
    for backend in ("triton", "cuda"):
        torch.library.opcheck(torch.ops.pcops.sparse_softmax, (values, crow, backend))


@pytest.mark.gpu
@requires_cuda
def test_gpu_autotuned_paths():
    """The autotuned launchers (the other GPU tests run fixed configs): an L2-like LayerNorm+GELU
    forward and backward through the public op, and a Q1-like CSR softmax on both backends."""
    x, w, b = make_ln(8192, 256, seed=40, dtype=torch.bfloat16)
    g = torch.randn(8192, 256, generator=generator(41)).to(torch.bfloat16)
    leaves = [t.cuda().requires_grad_(True) for t in (x, w, b)]
    y = pcops.fused_layer_norm_gelu(*leaves)
    y.backward(g.cuda())
    yr, mr, rr = ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    torch.testing.assert_close(y.detach().cpu(), yr, **TOL[torch.bfloat16])
    # later calls launch the autotuner's choice directly (the launcher's memo): same config, same bits
    from pcops.triton import fused as tri

    tuned = dict(tri._FWD_TUNED)
    assert any(k[0] == 256 for k in tuned), tuned
    y2 = pcops.fused_layer_norm_gelu(*(t.detach() for t in leaves))
    assert torch.equal(y2, y.detach())
    assert tri._FWD_TUNED == tuned
    exp = ref.layer_norm_gelu_backward(g, x, w, b, mr, rr, "tanh")
    for i, (leaf, e) in enumerate(zip(leaves, exp)):
        tol = {k: v * (math.sqrt(8192) if i else 1) for k, v in GRAD_TOL[torch.bfloat16].items()}
        torch.testing.assert_close(leaf.grad.cpu().float(), e.float(), **tol)
    lengths = torch.randint(1, 65, (3000,), generator=generator(42)).tolist()
    values, crow = make_csr(lengths, seed=43)
    gy = torch.randn(values.shape, generator=generator(44))
    for backend in ("triton", "cuda"):
        vc = values.cuda().requires_grad_(True)
        out = pcops.sparse_softmax(vc, crow.cuda(), backend=backend)
        out.backward(gy.cuda())
        torch.testing.assert_close(out.detach().cpu(), ref.sparse_softmax(values, crow), **TOL[torch.float32])
        torch.testing.assert_close(vc.grad.cpu(), ref.sparse_softmax_backward(gy, out.detach().cpu(), crow),
                                   **GRAD_TOL[torch.float32])


# --- the Triton kernels compile for sm_90 (no GPU needed) -----------------------------------

_AOT_SCRIPT = r'''
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import fused as f

def comp(fn, sig, consts, num_warps=4):
    full = {n: "constexpr" if n in consts else sig[n] for n in fn.arg_names}
    triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": num_warps})

dt, approx, drop, one = sys.argv[1], sys.argv[2] == "tanh", sys.argv[3] == "1", sys.argv[4] == "1"
ln = dict(x_ptr=f"*{dt}", w_ptr=f"*{dt}", b_ptr=f"*{dt}", y_ptr=f"*{dt}", mean_ptr="*fp32", rstd_ptr="*fp32",
          seed_ptr="*i64", M="i32", N="i32", eps="fp32", dropout_p="fp32", dy_ptr=f"*{dt}", dx_ptr=f"*{dt}",
          dw_part_ptr="*fp32", db_part_ptr="*fp32", rows_per_program="i32")
flags = dict(APPROX_TANH=approx, HAS_DROPOUT=drop, ONE_TILE=one, BLOCK_N=256)
fast = approx and dt != "fp32"  # the hardware tanh (inline PTX) where the launcher would select it
comp(f._layer_norm_gelu_fwd_kernel, ln, dict(flags, EVEN_N=one, BLOCK_M=16, TILES=1, M_CLASS=0, FAST_TANH=fast,
                                             WB_TILE=False), 8)
if one:
    comp(f._layer_norm_gelu_fwd_kernel, ln, dict(flags, EVEN_N=False, BLOCK_M=4, TILES=4, M_CLASS=1, FAST_TANH=fast,
                                                 WB_TILE=True), 4)
comp(f._layer_norm_gelu_bwd_kernel, ln, dict(flags, BLOCK_M=8), 4)
if one:  # the persistent forward (FWD_VARIANTS), pipelined
    comp(f._layer_norm_gelu_fwd_persistent_kernel, dict(ln, num_programs="i32"),
         dict(APPROX_TANH=approx, HAS_DROPOUT=drop, EVEN_N=False, BLOCK_N=256, BLOCK_M=8, FAST_TANH=fast, STAGES=3), 4)
# width 1 and one row: Triton passes an int argument equal to 1 as a constexpr (every kernel with N/M)
one_row = dict(N=1, M=1)
comp(f._layer_norm_gelu_fwd_kernel, ln, dict(flags, EVEN_N=True, BLOCK_N=1, ONE_TILE=True, BLOCK_M=1, TILES=1,
                                             M_CLASS=0, FAST_TANH=fast, WB_TILE=False, **one_row), 1)
comp(f._layer_norm_gelu_fwd_persistent_kernel, dict(ln, num_programs="i32"),
     dict(APPROX_TANH=approx, HAS_DROPOUT=drop, EVEN_N=True, BLOCK_N=1, BLOCK_M=1, FAST_TANH=fast, STAGES=3,
          **one_row), 1)
comp(f._layer_norm_gelu_bwd_kernel, ln, dict(flags, ONE_TILE=True, BLOCK_N=1, BLOCK_M=1, **one_row), 1)
tiled = dict(ln, num_programs="i32")
for stages, prefetch in ((1, 1), (1, 2), (3, 0)):
    comp(f._layer_norm_gelu_bwd_tiled_kernel, tiled,
         dict(APPROX_TANH=approx, HAS_DROPOUT=drop, PREFETCH=prefetch, LEAN=True, BLOCK_N=1, BLOCK_M=1,
              FAST_TANH=fast, STAGES=stages, **one_row), 1)
comp(f._column_sum_kernel, dict(dw_part_ptr="*fp32", db_part_ptr="*fp32", dw_ptr=f"*{dt}", db_ptr=f"*{dt}", G="i32", N="i32"),
     dict(BLOCK_G=1024, BLOCK_N=4), 16)
ew = dict(x_ptr=f"*{dt}", res_ptr=f"*{dt}", y_ptr=f"*{dt}", dy_ptr=f"*{dt}", dx_ptr=f"*{dt}", seed_ptr="*i64",
          keep_ptr="*i8", numel="i64", dropout_p="fp32")
comp(f._swish_dropout_residual_kernel, ew, dict(HAS_DROPOUT=drop, BLOCK=1024))
comp(f._swish_dropout_bwd_kernel, ew, dict(HAS_DROPOUT=drop, BLOCK=1024))
comp(f._dropout_keep_kernel, ew, dict(BLOCK=1024))
idx = "i32" if one else "i64"
sm = dict(values_ptr=f"*{dt}", crow_ptr=f"*{idx}", out_ptr=f"*{dt}", grad_ptr=f"*{dt}", y_ptr=f"*{dt}",
          dx_ptr=f"*{dt}", rows="i32", nnz="i32", AVG_LEN="i32")
comp(f._sparse_softmax_kernel, sm, dict(BLOCK_R=32, BLOCK_L=32))
comp(f._sparse_softmax_bwd_kernel, sm, dict(BLOCK_R=32, BLOCK_L=32))
print("compiled")
'''


@pytest.mark.parametrize("dtype,approximate,dropout,one_tile", [
    ("fp32", "tanh", "0", "1"), ("bf16", "none", "1", "0"), ("fp16", "tanh", "1", "1"),
])
def test_triton_kernels_compile_for_sm90(dtype, approximate, dropout, one_tile):
    """Lowering to a CUBIN catches what the interpreter accepts but the compiler does not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas not found")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, dtype, approximate, dropout, one_tile],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-4000:]


_AOT_GROUPED_SCRIPT = r'''
import os, re, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import fused as f

sig = dict(values_ptr="*fp32", crow_ptr="*i64", out_ptr="*fp32", grad_ptr="*bf16", y_ptr="*bf16", dx_ptr="*bf16",
           rows="i32", nnz="i32", AVG_LEN="i32")
for fn in (f._sparse_softmax_grouped_kernel, f._sparse_softmax_grouped_bwd_kernel):
    for sub, vpt in f._GROUP_SHAPES:
        for warps in (2, 8):
            consts = dict(SUB=sub, VPT=vpt, BLOCK_R=32 // sub * warps)
            full = {a: "constexpr" if a in consts else sig[a] for a in fn.arg_names}
            k = triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": warps})
            ttgir = k.asm["ttgir"]
            tpw = [m.group(1) for m in re.finditer(r"#blocked\d* = #ttg.blocked<\{sizePerThread = \[1, 1, 1\], "
                                                   r"threadsPerWarp = \[([0-9, ]+)\]", ttgir)]
            print(fn.__name__, sub, warps, "tpw=" + "|".join(t.replace(" ", "") for t in tpw),
                  "convert=%d" % ttgir.count("ttg.convert_layout"))
print("compiled")
'''


def test_grouped_softmax_layout_for_sm90():
    """The grouped CSR kernels lower with SUB lanes per row and 32/SUB rows per warp (the layout
    the design relies on) and no layout conversions."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas not found")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _AOT_GROUPED_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-4000:]
    lines = done.stdout.splitlines()[:-1]
    assert len(lines) == 16
    for line in lines:
        _, sub, _, tpw, convert = line.split()
        assert f"{32 // int(sub)},1,{sub}" in tpw.split("=")[1].split("|"), line
        assert convert == "convert=0", line


# --- the LayerNorm+GELU backward variants (BWD_VARIANTS, default "tiled"; "rowrange": the row-range kernel) ---

_VARIANTS = ("tiled", "tiled-plain", "tiled-noprefetch", "tiled-pf2", "tiled-exact", "tiled-fast", "tiled-async3",
             "tiled-async4", "tiled-async6", "tiled-async4-fast", "tiled-async4-16")


def _lng_backward_case(rows, width, dtype, approximate="tanh", p=0.0, seed_value=None):
    from pcops.triton import fused as tri

    x, w, b = make_ln(rows, width, seed=rows + width, dtype=dtype)
    seed = None if seed_value is None else torch.tensor([seed_value], device=x.device)
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, approximate, p, seed)
    g = torch.randn(rows, width, generator=generator(rows)).to(dtype).to(x.device)
    keep = None if seed is None else tri.dropout_keep_mask(seed, (rows, width), p)
    exp = ref.layer_norm_gelu_backward(g, x, w, b, mean, rstd, approximate, p, keep)
    return (g, x, w, b, mean, rstd, approximate, p, seed), exp


def test_bwd_variants_table():
    from pcops.triton import fused as tri

    assert tri.BWD_VARIANT == "tiled"  # the H200's fastest on L1-L3
    assert set(_VARIANTS) == set(tri.BWD_VARIANTS)
    for cfg in tri.BWD_VARIANTS.values():
        assert cfg["prefetch"] in (0, 1, 2)
        for block_n in (1, 64, 256, 1024):
            bm, warps = tri._tiled_shape(block_n, cfg)
            assert bm >= 1 and warps <= 16 and bm * block_n >= cfg["per_thread"] * 32 * warps
    assert tri._tiled_shape(256, tri.BWD_VARIANTS["tiled"]) == (4, 4)  # L2: a warp per row, 8 values per thread
    assert tri._tiled_shape(64, tri.BWD_VARIANTS["tiled"]) == (8, 4)  # L3
    assert tri._tiled_shape(1024, tri.BWD_VARIANTS["tiled"]) == (1, 4)  # L1: one row, 8 values per thread
    assert tri._tiled_shape(256, tri.BWD_VARIANTS["tiled-async4-16"], 2) == (8, 4)  # 16-bit rows: 16 per thread
    assert tri._tiled_shape(256, tri.BWD_VARIANTS["tiled-async4-16"], 4) == (4, 4)


# (rows, width, dtype, block_m): block_m 2 with 3 programs makes every program walk several
# tiles (the prefetch crosses tiles, the last one runs past the rows)
# (8, 256, bf16): L2's tile shape, where the launch passes the variant's register cap
VARIANT_CASES = [(1, 1, torch.float32, None), (13, 3, torch.float32, 2), (11, 127, torch.bfloat16, 2),
                 (9, 64, torch.float16, 4), (5, 300, torch.float32, 1), (0, 8, torch.float32, None),
                 (8, 256, torch.bfloat16, None)]


@pytest.mark.parametrize("variant", _VARIANTS)
@pytest.mark.parametrize("rows,width,dtype,block_m", VARIANT_CASES)
@interpret
def test_triton_bwd_variant_interpreter(variant, rows, width, dtype, block_m):
    from pcops.triton import fused as tri

    args, exp = _lng_backward_case(rows, width, dtype, approximate="none" if rows % 2 else "tanh")
    got = tri.layer_norm_gelu_backward(*args, variant=variant, block_m=block_m, num_programs=3)
    default = tri.layer_norm_gelu_backward(*args, variant="rowrange", num_programs=3)
    for a, d, e in zip(got, default, exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[dtype])
        torch.testing.assert_close(a, d, **GRAD_TOL[dtype])


@pytest.mark.parametrize("variant", _VARIANTS)
@interpret
def test_triton_bwd_variant_dropout_interpreter(variant):
    from pcops.triton import fused as tri

    args, exp = _lng_backward_case(10, 40, torch.float32, p=0.3, seed_value=99)
    got = tri.layer_norm_gelu_backward(*args, variant=variant, block_m=2, num_programs=2)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[torch.float32])


@interpret
def test_triton_bwd_variant_selection_interpreter(monkeypatch):
    from pcops.triton import fused as tri

    calls = []
    tiled = tri._layer_norm_gelu_backward_tiled
    monkeypatch.setattr(tri, "_layer_norm_gelu_backward_tiled", lambda *a: calls.append(1) or tiled(*a))
    args, exp = _lng_backward_case(6, 20, torch.float32)
    got = tri.layer_norm_gelu_backward(*args)
    assert calls == [1]  # BWD_VARIANT "tiled": the tiled kernel
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[torch.float32])
    monkeypatch.setattr(tri, "BWD_VARIANT", "rowrange")
    for a, e in zip(tri.layer_norm_gelu_backward(*args), exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[torch.float32])
    assert calls == [1]
    monkeypatch.setattr(tri, "BWD_VARIANT", "tiled")
    tri.layer_norm_gelu_backward(*args, variant="rowrange")
    assert calls == [1]
    # rows wider than 1024 (or the chunked path) keep the default kernel
    wide_args, wide_exp = _lng_backward_case(2, 1025, torch.float32)
    for a, e in zip(tri.layer_norm_gelu_backward(*wide_args), wide_exp):
        torch.testing.assert_close(a, e, **GRAD_TOL[torch.float32])
    tri.layer_norm_gelu_backward(*args, max_block_n=8)
    assert calls == [1]
    with pytest.raises(ValueError, match="variant"):
        tri.layer_norm_gelu_backward(*args, variant="nope")


_AOT_VARIANT_SCRIPT = r'''
import os, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import fused as f

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
fn = f._layer_norm_gelu_bwd_tiled_kernel
# the benchmark's shapes: L1 fp32 N=768, L2 bf16 N=256, L3 fp32 N=64
for dt, n in (("fp32", 768), ("bf16", 256), ("fp32", 64)):
    sig = dict(dy_ptr=f"*{dt}", x_ptr=f"*{dt}", w_ptr=f"*{dt}", b_ptr=f"*{dt}", mean_ptr="*fp32", rstd_ptr="*fp32",
               seed_ptr="*i64", dx_ptr=f"*{dt}", dw_part_ptr="*fp32", db_part_ptr="*fp32", M="i32", N="i32",
               num_programs="i32", dropout_p="fp32")
    block_n = triton.next_power_of_2(n)
    for name, cfg in f.BWD_VARIANTS.items():
        for drop in (False, True):
            bm, warps = f._tiled_shape(block_n, cfg, 2 if dt == "bf16" and not drop else 4)  # as the launcher
            torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dt]
            # the launcher's FAST_TANH (_fast_tanh on a CUDA device): tanh GELU, 16-bit rows
            fast = cfg["fast_tanh"] if cfg["fast_tanh"] is not None else torch_dtype in f.FAST_TANH_BWD_DTYPES
            consts = dict(APPROX_TANH=not drop, HAS_DROPOUT=drop, PREFETCH=cfg["prefetch"], LEAN=cfg["lean"],
                          BLOCK_N=block_n, BLOCK_M=bm, STAGES=cfg["stages"],
                          FAST_TANH=bool(fast) and not drop and dt != "fp32")
            cap = f._tiled_maxnreg(cfg, torch_dtype, drop, block_n, bm, warps)
            options = {"num_warps": warps, "num_stages": 1, **({"maxnreg": cap} if cap else {})}
            full = {a: "constexpr" if a in consts else sig[a] for a in fn.arg_names}
            # the launch-time specialisation: 16-byte aligned pointers, M and N multiples of 16
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                     if a not in consts and (sig[a].startswith("*") or a in ("M", "N"))}
            k = triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=options)
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as t:
                t.write(k.asm["cubin"])
            usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", t.name],
                                   capture_output=True, text=True).stdout
            os.unlink(t.name)
            line = next((l for l in usage.splitlines() if "REG:" in l), "")
            regs = int(line.split("REG:")[1].split()[0]) if line else -1
            stack = int(line.split("STACK:")[1].split()[0]) if line else -1
            ptx = k.asm["ptx"]  # 8/16-byte vector loads, or 16-byte cp.async (the pipelined variants)
            vec = ("ld.global.v4" in ptx or "ld.global.v2" in ptx
                   or ("cp.async.cg.shared.global" in ptx and "0x10" in ptx))
            print(f"{dt} {n} {name} dropout={drop} BLOCK_M={bm} warps={warps} regs={regs} stack={stack} vec={int(vec)} "
                  f"cap={cap or 0}")
print("compiled")
'''


def test_bwd_variants_compile_for_sm90_without_spills():
    """The variant kernels lower to sm_90 CUBINs for the benchmark shapes; registers stay low, no spills."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas not found")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _AOT_VARIANT_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-4000:]
    for line in done.stdout.splitlines()[:-1]:
        fields = dict(kv.split("=") for kv in line.split()[3:])
        if int(fields["regs"]) < 0:
            continue  # cuobjdump gave no resource line: nothing to check
        assert int(fields["stack"]) == 0, line  # no local-memory spills
        assert fields["vec"] == "1", line  # 8- or 16-byte vector loads
        # measured (Triton 3.6): 48-98 registers without dropout, Philox adds a few
        assert int(fields["regs"]) <= 128, line
        if fields["cap"] != "0":  # the capped configs (L2's shape) stay at their cap, without spills
            assert int(fields["regs"]) <= int(fields["cap"]), line


# widths and dtypes the other GPU tests already autotune (the default kernels' configs are
# cached), so each case adds only the variant's compilations; dropout with "tiled" only
@pytest.mark.parametrize("rows,width,dtype", [(4096, 256, torch.float32), (257, 768, torch.float32),
                                              (2000, 127, torch.bfloat16)])
@pytest.mark.parametrize("variant", [v for v in _VARIANTS  # (the GPU run's time: one async variant here)
                                     if v not in ("tiled-exact", "tiled-async3", "tiled-async6",
                                                  "tiled-async4-fast", "tiled-async4-16")])
@pytest.mark.gpu
@requires_cuda
def test_gpu_bwd_variant_matches_default_and_reference(variant, rows, width, dtype):
    from pcops.triton import fused as tri

    for p, seed_value in ((0.0, None), (0.2, 17))[: 2 if variant == "tiled" else 1]:
        x, w, b = make_ln(rows, width, seed=27, dtype=dtype, device="cuda")
        seed = None if seed_value is None else torch.tensor([seed_value], device="cuda")
        _, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, seed)
        g = torch.randn(rows, width, generator=generator(7)).to(dtype).cuda()
        got = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, seed, variant=variant)
        again = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, seed, variant=variant)
        for a, c in zip(got, again):
            assert torch.equal(a, c)  # deterministic: fixed grid, no atomics
        default = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", p, seed, variant="rowrange")
        keep = None if seed is None else tri.dropout_keep_mask(seed, (rows, width), p)
        exp = ref.layer_norm_gelu_backward(g.double(), x.double(), w.double(), b.double(), mean.double(),
                                           rstd.double(), "tanh", p, keep)
        tol = GRAD_TOL[dtype]
        sum_tol = {k: v * math.sqrt(rows) for k, v in tol.items()}
        for i, (a, d, e) in enumerate(zip(got, default, exp)):
            t = sum_tol if i else tol
            torch.testing.assert_close(a, d, **t)
            torch.testing.assert_close(a.double(), e.to(a.dtype).double(), **t)


@pytest.mark.gpu
@requires_cuda
def test_gpu_bwd_variant_through_autograd_and_cuda_graph(monkeypatch):
    from pcops.triton import fused as tri

    x, w, b = make_ln(2048, 127, seed=28, dtype=torch.bfloat16, device="cuda")
    dy = torch.randn(2048, 127, generator=generator(8)).to(torch.bfloat16).cuda()

    def grads():
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        pcops.fused_layer_norm_gelu(*leaves).backward(dy)
        return [t.grad for t in leaves]

    monkeypatch.setattr(tri, "BWD_VARIANT", "rowrange")
    default = grads()
    monkeypatch.setattr(tri, "BWD_VARIANT", "tiled")
    got = grads()
    for i, (a, d) in enumerate(zip(got, default)):
        torch.testing.assert_close(a, d, **{k: v * (45 if i else 1) for k, v in GRAD_TOL[torch.bfloat16].items()})
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    static_dy = dy.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pcops.fused_layer_norm_gelu(*leaves).backward(static_dy)  # warm-up (compiles, sizes the grid)
    torch.cuda.current_stream().wait_stream(s)
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pcops.fused_layer_norm_gelu(*leaves).backward(static_dy)
    captured = [t.grad for t in leaves]
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(captured, got):
        assert torch.equal(a, c)


# --- the hardware tanh (FAST_TANH) and the forward variants (FWD_VARIANTS) ------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pcops.triton import fused as _tri  # noqa: E402


def test_fast_tanh_selection_rules():
    """Who gets ``tanh.approx``: the tanh GELU on an sm_75+ CUDA device, never the interpreter or
    float32; by default 16-bit forwards and the backward dtypes of ``FAST_TANH_BWD_DTYPES``."""
    from pcops.triton import fused as tri

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    sel = dict(interpreting=False, capability=(9, 0))
    fwd = tri.FAST_TANH_FWD_DTYPES
    assert set(fwd) == {torch.bfloat16, torch.float16}
    assert set(tri.FAST_TANH_BWD_DTYPES) == {torch.bfloat16}  # float16 gradients: exact form
    assert tri._fast_tanh(None, torch.bfloat16, cuda, "tanh", fwd, **sel)
    assert tri._fast_tanh(None, torch.float16, cuda, "tanh", fwd, **sel)
    assert not tri._fast_tanh(None, torch.float16, cuda, "tanh", tri.FAST_TANH_BWD_DTYPES, **sel)
    assert tri._fast_tanh(True, torch.float16, cuda, "tanh", (), **sel)
    assert not tri._fast_tanh(None, torch.float32, cuda, "tanh", fwd, **sel)
    assert not tri._fast_tanh(True, torch.float32, cuda, "tanh", fwd, **sel)  # float32 keeps the exact form
    assert not tri._fast_tanh(None, torch.bfloat16, cuda, "none", fwd, **sel)  # erf GELU: no tanh at all
    assert not tri._fast_tanh(False, torch.bfloat16, cuda, "tanh", fwd, **sel)
    assert tri._fast_tanh(True, torch.bfloat16, cuda, "tanh", (), **sel)  # a variant that asks for it
    assert not tri._fast_tanh(None, torch.bfloat16, cuda, "tanh", (), **sel)
    assert not tri._fast_tanh(None, torch.bfloat16, cuda, "tanh", fwd, interpreting=True, capability=(9, 0))
    assert not tri._fast_tanh(None, torch.bfloat16, cuda, "tanh", fwd, interpreting=False, capability=(7, 0))
    assert tri._fast_tanh(None, torch.bfloat16, cuda, "tanh", fwd, interpreting=False, capability=(7, 5))
    assert not tri._fast_tanh(True, torch.bfloat16, cpu, "tanh", fwd, interpreting=False, capability=(9, 0))
    for name, cfg in tri.BWD_VARIANTS.items():
        assert cfg["fast_tanh"] in (None, True, False), name
        assert cfg["stages"] >= 1, name


def test_forward_pinned_config(monkeypatch):
    """``FWD_PINNED`` narrows one (BLOCK_N, dtype, M_CLASS) to its config; other shapes keep the space."""
    from pcops.triton import fused as tri

    x = torch.empty(4096, 768)
    named = {"M": 4096, "x_ptr": x}

    def space(**kw):
        return {(c.kwargs["BLOCK_M"], c.kwargs["TILES"], c.num_warps)
                for c in tri._prune_fwd(tri._FWD_CONFIGS, named, BLOCK_N=1024, ONE_TILE=True, **kw)}

    assert space(M_CLASS=0) == {(2, 1, 4)}  # L1's class, pinned from the H200's graph-timed tuning
    l2 = tri._prune_fwd(tri._FWD_CONFIGS, {"M": 131072, "x_ptr": torch.empty(1, 256, dtype=torch.bfloat16)},
                        BLOCK_N=256, ONE_TILE=True, M_CLASS=1)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["TILES"], c.num_warps) for c in l2] == [(8, 4, 4)]  # L2's
    monkeypatch.setattr(tri, "FWD_PINNED", {})
    full = space(M_CLASS=0)
    assert len(full) > 1 and (2, 1, 4) in full
    monkeypatch.setitem(tri.FWD_PINNED, (1024, torch.float32, 0), (4, 1, 8))
    assert space(M_CLASS=0) == {(4, 1, 8)}
    assert space(M_CLASS=1) != {(4, 1, 8)}  # another row-count class: not pinned
    monkeypatch.setitem(tri.FWD_PINNED, (1024, torch.float32, 0), (3, 1, 8))  # not in the space: ignored
    assert space(M_CLASS=0) == full


@interpret
def test_fast_tanh_off_under_the_interpreter():
    """The launchers never select the inline-PTX tanh under the interpreter, even when asked."""
    from pcops.triton import fused as tri

    x, w, b = make_ln(6, 40, seed=3, dtype=torch.bfloat16)
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", fast_tanh=True)
    assert tri._FWD_LAST["fast_tanh"] is False
    torch.testing.assert_close(y, ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")[0], **TOL[torch.bfloat16])
    g = torch.randn(6, 40, generator=generator(4)).to(torch.bfloat16)
    for variant in ("tiled-fast", "tiled-async4-fast"):
        got = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", variant=variant, num_programs=2)
        assert tri._TILED_LAST["fast_tanh"] is False
        tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", variant=variant, num_programs=2, fast_tanh=True)
        assert tri._TILED_LAST["fast_tanh"] is False
        for a, e in zip(got, ref.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh")):
            torch.testing.assert_close(a, e, **GRAD_TOL[torch.bfloat16])


FWD_VARIANT_CASES = [(13, 16, torch.float32, 2), (9, 5, torch.bfloat16, None), (1, 1, torch.float32, None),
                     (37, 64, torch.float16, 4), (11, 127, torch.float32, 1), (0, 8, torch.float32, None)]


@pytest.mark.parametrize("variant", ["persistent-s3", "persistent-s2", "persistent8-s3"])
@pytest.mark.parametrize("rows,width,dtype,block_m", FWD_VARIANT_CASES)
@interpret
def test_triton_fwd_variant_interpreter(variant, rows, width, dtype, block_m):
    """The persistent forward: several tiles per program (3 programs under the interpreter), a
    ragged last tile, odd widths; same answer as the reference (and as the tile kernel)."""
    from pcops.triton import fused as tri

    x, w, b = make_ln(rows, width, seed=rows * 3 + width, dtype=dtype)
    approximate = "none" if width == 127 else "tanh"
    y, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, approximate, variant=variant, block_m=block_m)
    if rows:
        assert tri._FWD_LAST["variant"] == variant and "programs" in tri._FWD_LAST
    yr, mr, rr = ref.layer_norm_gelu(x, w, b, 1e-5, approximate)
    torch.testing.assert_close(y, yr, **TOL[dtype])
    torch.testing.assert_close(mean, mr, **TOL[torch.float32])
    torch.testing.assert_close(rstd, rr, **TOL[torch.float32])


@interpret
def test_triton_fwd_variant_dropout_and_selection_interpreter(monkeypatch):
    from pcops.triton import fused as tri

    x, w, b = make_ln(10, 24, seed=5)
    seed, p = torch.tensor([123]), 0.3
    keep = tri.dropout_keep_mask(seed, (10, 24), p)
    exp = ref.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, keep)[0]
    y, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", p, seed, variant="persistent-s3", block_m=2)
    torch.testing.assert_close(y, exp, **TOL[torch.float32])
    assert tri.FWD_VARIANT == "tiles"
    tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    assert tri._FWD_LAST["variant"] == "tiles" and "programs" not in tri._FWD_LAST
    monkeypatch.setattr(tri, "FWD_VARIANT", "persistent-s2")
    tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    assert tri._FWD_LAST["variant"] == "persistent-s2" and tri._FWD_LAST["stages"] == 2
    # the chunked path for wide rows (or a fixed tile config) keeps the tile kernel
    y, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", max_block_n=8)
    assert "programs" not in tri._FWD_LAST
    torch.testing.assert_close(y, ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")[0], **TOL[torch.float32])
    with pytest.raises(ValueError, match="variant"):
        tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant="nope")


@pytest.mark.parametrize("wb_tile", [False, True])
@interpret
def test_triton_fwd_wb_tile_interpreter(wb_tile):
    from pcops.triton import fused as tri

    x, w, b = make_ln(9, 20, seed=6, dtype=torch.bfloat16)
    y, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", block_m=4, num_warps=1, tiles=2, wb_tile=wb_tile)
    assert tri._FWD_LAST["wb_tile"] is wb_tile
    torch.testing.assert_close(y, ref.layer_norm_gelu(x, w, b, 1e-5, "tanh")[0], **TOL[torch.bfloat16])


@triton.jit
def _tanh_probe_kernel(u_ptr, t_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(t_ptr + offs, _tri._tanh_approx(tl.load(u_ptr + offs, mask=ok, other=0.0)), mask=ok)


@pytest.mark.gpu
@requires_cuda
def test_gpu_tanh_approx_error():
    """``tanh.approx.f32`` against float64 tanh: the error bound the fast paths rely on (PTX ISA:
    relative error ≈ 2^-11). Prints the measured absolute error near ±1 (where gelu' takes 1 - t²)."""
    import triton

    u = torch.linspace(-12, 12, 1 << 20, device="cuda")
    t = torch.empty_like(u)
    _tanh_probe_kernel[(triton.cdiv(u.numel(), 1024),)](u, t, u.numel(), BLOCK=1024)
    exact = torch.tanh(u.double())
    err = (t.double() - exact).abs()
    big = exact.abs() > 1e-3
    rel = (err[big] / exact[big].abs()).max().item()
    near_one = err[exact.abs() > 0.99].max().item()
    print(f"tanh.approx.f32: max abs error {err.max().item():.3g}, max rel {rel:.3g}, |t| > 0.99: {near_one:.3g}")
    assert rel < 2.0 ** -10


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.gpu
@requires_cuda
def test_gpu_fast_tanh_forward_within_tolerance(dtype):
    """The hardware-tanh forward (the default for 16-bit rows) stays within one rounding of the
    output against the float64 reference, on an L2-like shape (and awkward widths for bfloat16),
    for the tile kernel and the persistent variant (H200: passes for both dtypes)."""
    from pcops.triton import fused as tri

    shapes = ((4096, 256), (33, 127)) if dtype == torch.bfloat16 else ((4096, 256),)  # (GPU run time limit)
    for rows, width in shapes:
        x, w, b = make_ln(rows, width, seed=rows + width, dtype=dtype, device="cuda")
        exp = torch_ln_gelu(x.double(), w.double(), b.double()).to(dtype)
        for variant in ("tiles", "persistent-s3"):
            y, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant=variant, fast_tanh=True)
            assert tri._FWD_LAST["fast_tanh"] is True
            worst = ((y.double() - exp.double()).abs() / (TOL[dtype]["atol"] + TOL[dtype]["rtol"] * exp.double().abs()))
            print(f"{dtype} {rows}x{width} {variant}: worst error / tolerance = {worst.max().item():.3g}")
            torch.testing.assert_close(y, exp, **TOL[dtype])
        default, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
        assert tri._FWD_LAST["fast_tanh"] is (dtype in tri.FAST_TANH_FWD_DTYPES)
        exact, _, _ = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", fast_tanh=False)
        assert tri._FWD_LAST["fast_tanh"] is False
        torch.testing.assert_close(exact, exp, **TOL[dtype])
    x, w, b = make_ln(64, 256, seed=9, device="cuda")  # float32: the exact form whatever is asked
    tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", fast_tanh=True)
    assert tri._FWD_LAST["fast_tanh"] is False


@pytest.mark.gpu
@requires_cuda
def test_gpu_fwd_variants_match_tiles_and_graph():
    """The persistent forward variants give the tile kernel's answer (float32 bit-close) on the
    benchmark widths and replay in a CUDA graph."""
    from pcops.triton import fused as tri

    for rows, width, dtype in ((4096, 768, torch.float32), (8192, 256, torch.bfloat16), (5000, 64, torch.float32)):
        x, w, b = make_ln(rows, width, seed=11, dtype=dtype, device="cuda")
        base = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant="tiles")
        for variant in ("persistent-s3", "persistent-s4") if width == 256 else ("persistent-s3",):
            got = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant=variant)
            for a, e in zip(got, base):
                torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5) if dtype == torch.float32 else \
                    torch.testing.assert_close(a, e, **TOL[dtype])
    x, w, b = make_ln(1000, 256, seed=12, dtype=torch.bfloat16, device="cuda")
    run = lambda: tri.layer_norm_gelu(x, w, b, 1e-5, "tanh", variant="persistent-s3")  # noqa: E731
    expected = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    for a, e in zip(captured, expected):
        assert torch.equal(a, e)


@pytest.mark.gpu
@requires_cuda
def test_gpu_fast_tanh_backward_bf16():
    """The hardware tanh in gelu' (the bfloat16 default: "tiled"; "tiled-async4-fast") against the
    float64 reference: 1 - t² near |t| = 1 carries the absolute error of t amplified by z·u', yet
    the H200 measured it within the bfloat16 gradient tolerance."""
    from pcops.triton import fused as tri

    rows, width = 4096, 256
    x, w, b = make_ln(rows, width, seed=13, dtype=torch.bfloat16, device="cuda")
    g = torch.randn(rows, width, generator=generator(14)).to(torch.bfloat16).cuda()
    _, mean, rstd = tri.layer_norm_gelu(x, w, b, 1e-5, "tanh")
    exp = ref.layer_norm_gelu_backward(g.double(), x.double(), w.double(), b.double(), mean.double(),
                                       rstd.double(), "tanh")
    for variant in ("tiled", "tiled-async4-fast"):
        got = tri.layer_norm_gelu_backward(g, x, w, b, mean, rstd, "tanh", variant=variant)
        assert tri._TILED_LAST["fast_tanh"] is True
        for i, (a, e) in enumerate(zip(got, exp)):
            tol = {k: v * (math.sqrt(rows) if i else 1) for k, v in GRAD_TOL[torch.bfloat16].items()}
            worst = ((a.double() - e.to(a.dtype).double()).abs() / (tol["atol"] + tol["rtol"] * e.abs())).max().item()
            print(f"{variant} grad {i}: worst error / tolerance = {worst:.3g}")
            torch.testing.assert_close(a.double(), e.to(a.dtype).double(), **tol)
