"""pcops.sparse_conv3d's Triton implicit GEMM (forward, dgrad, wgrad) against the reference.

Under the CPU interpreter here, on CUDA with the ``gpu`` marker: the same outputs up to float32
rounding (the sums run in another order), bit-identical from run to run, every dtype, empty
offsets and rows, channels that are not multiples of the tile.
"""

import pytest
import torch
from _util import generator, gpu, interpret

import pcops
from pcops.reference import kernel_map as ref

TOL = {torch.float32: dict(atol=1e-3, rtol=1e-3), torch.float16: dict(atol=2e-2, rtol=2e-2),
       torch.bfloat16: dict(atol=8e-2, rtol=5e-2)}  # fmt: skip


def conv_case(n, c_in, c_out, seed, subm=True, device="cpu", dtype=torch.float32, shape=(8, 9, 10)):
    g = generator(seed)
    d, h, w = shape
    lin = torch.randperm(d * h * w, generator=g)[:n]
    coords = torch.stack([torch.zeros_like(lin), lin // (h * w), (lin // w) % h, lin % w], 1).int()
    km = pcops.sparse_conv_kernel_map(coords, shape, 3, stride=1 if subm else 2, padding=1, subm=subm)
    feats = torch.randn(n, c_in, generator=g).to(dtype)
    weight = (torch.randn(27, c_in, c_out, generator=g) / (27 * c_in) ** 0.5).to(dtype)
    bias = torch.randn(c_out, generator=g).to(dtype)
    out_in = km.out_in
    return [t.to(device) for t in (feats, weight, bias, out_in)]


def check_against_reference(tri, feats, weight, bias, out_in, tol, subm=False):
    out = tri.sparse_conv3d(feats, weight, bias, out_in)
    exp = ref.sparse_conv3d(feats.cpu().float(), weight.cpu().float(), bias.cpu().float(), out_in.cpu())
    torch.testing.assert_close(out.cpu().float(), exp, **tol)
    assert torch.equal(out, tri.sparse_conv3d(feats, weight, bias, out_in))  # run to run
    g = torch.randn(out.shape, generator=generator(99)).to(feats.dtype).to(feats.device)
    ef, ew = ref.sparse_conv3d_backward(g.cpu().float(), feats.cpu().float(), weight.cpu().float(), out_in.cpu(),
                                        True, True)  # fmt: skip
    # the inverse table, and for a submanifold map (3³: its own inverse) the mirrored offsets
    for symmetric in (False, True) if subm else (False,):
        gf, gw = tri.sparse_conv3d_backward(g, feats, weight, out_in, symmetric)
        torch.testing.assert_close(gf.cpu().float(), ef, **tol)
        torch.testing.assert_close(gw.cpu().float(), ew, **tol)
        again = tri.sparse_conv3d_backward(g, feats, weight, out_in, symmetric)
        assert torch.equal(gf, again[0]) and torch.equal(gw, again[1])


@pytest.mark.parametrize("n,c_in,c_out,subm", [(60, 4, 16, True), (90, 19, 5, False), (1, 3, 3, True)])
@interpret
def test_triton_sparse_conv3d_interpreter(n, c_in, c_out, subm):
    from pcops.triton import sparse_conv3d as tri

    check_against_reference(tri, *conv_case(n, c_in, c_out, seed=n + c_in, subm=subm), TOL[torch.float32], subm)


@pytest.mark.parametrize("c_in,c_out,k", [(16, 32, 27), (80, 24, 27), (8, 16, 10), (8, 16, 40)])
@interpret
def test_triton_gemm_configs_interpreter(c_in, c_out, k):
    """Every tile configuration the tuner may pick (U = 1-4 offsets per step, K not a multiple of
    U, offsets no row uses, more channels than one BLOCK_C chunk, the one-stage loop and the
    pipelined one, K > 32 without the offset skip) against the reference."""
    from pcops.triton import sparse_conv3d as tri

    g = generator(c_in + k)
    n, m = 40, 70
    table = torch.randint(-n // 2, n, (m, k), generator=g, dtype=torch.int32).clamp_(min=-1)
    table[:, 2] = -1  # an offset that no row uses
    x = torch.randn(n, c_in, generator=g)
    w = torch.randn(k, c_in, c_out, generator=g)
    b = torch.randn(c_out, generator=g)
    exp = ref.sparse_conv3d(x, w, b, table)
    for cfg in tri.GEMM_CONFIGS + tri.TF32_CONFIGS:
        out = tri.gather_gemm(x, w, b, table, c_out, strides=w.stride(), relu=True, config=cfg)
        torch.testing.assert_close(out, exp.clamp(min=0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "dtype,precision,c_in",
    [(torch.float16, "auto", 32), (torch.float16, "auto", 80), (torch.float32, "ieee", 32),
     (torch.float32, "tf32", 32), (torch.float32, "tf32", 80), (torch.float32, "tf32x3", 80)],
)  # fmt: skip
@gpu[0]
@gpu[1]
def test_gpu_gemm_tuner_bit_identical(dtype, precision, c_in):
    """The tuner times its configurations on the first call of a shape class, keeps one, and every
    configuration of its candidate set, plus chunked, unrolled and pipelined ones from outside it
    (channel chunks of 16-64, U = 1-3, 1-3 stages), gives the same bits, forward and the mirrored
    dgrad; 80 channels take several chunks. (Each configuration compiles: the other dtype's set is
    left out to keep the file within the GPU runner's time limit.)"""
    from pcops.triton import sparse_conv3d as tri

    feats, weight, bias, out_in = conv_case(4000, c_in, 48, seed=5, device="cuda", dtype=dtype, shape=(20, 30, 40))
    tri._TUNED.clear()
    out = tri.gather_gemm(feats, weight, bias, out_in, 48, strides=weight.stride(), precision=precision)
    prec = tri._precision(dtype, precision)
    assert len(tri._TUNED) == 1 and next(iter(tri._TUNED.values())) in tri._configs(prec, dtype)
    s = weight.stride()
    view, strides = weight[26], (-s[0], s[2], s[1])
    grad = tri.gather_gemm(out, view, None, out_in, c_in, strides=strides, precision=precision)
    for cfg in tri._configs(prec, dtype) + ((32, 4, 2, 16), (64, 8, 3, 32), (32, 4, 2, 16, 3), (128, 4, 1, 0, 2)):
        again = tri.gather_gemm(
            feats, weight, bias, out_in, 48, strides=weight.stride(), precision=precision, config=cfg
        )
        assert torch.equal(out, again), cfg
        again = tri.gather_gemm(out, view, None, out_in, c_in, strides=strides, precision=precision, config=cfg)
        assert torch.equal(grad, again), cfg


@interpret
def test_triton_sparse_conv3d_empty_interpreter():
    from pcops.triton import sparse_conv3d as tri

    feats, weight, bias, out_in = conv_case(20, 3, 4, seed=1)
    empty = out_in[:0]
    assert tri.sparse_conv3d(feats, weight, bias, empty).shape == (0, 4)
    none = torch.full_like(out_in, -1)  # no pairs at all: bias only, zero gradients
    assert torch.equal(tri.sparse_conv3d(feats, weight, bias, none), bias.expand(20, 4))
    for symmetric in (False, True):
        gf, gw = tri.sparse_conv3d_backward(torch.ones(20, 4), feats, weight, none, symmetric)
        assert not gf.any() and not gw.any()
    # padding rows (as the static form has) between real ones: whole tiles and parts of tiles
    # skip the offsets none of their rows uses
    padded = torch.cat([out_in[:7], torch.full((150, 27), -1, dtype=torch.int32), out_in[7:]])
    exp = ref.sparse_conv3d(feats, weight, bias, padded)
    torch.testing.assert_close(tri.sparse_conv3d(feats, weight, bias, padded), exp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("subm,n_in", [(True, 50), (False, 70), (False, 1)])
@interpret
def test_triton_inverse_table_interpreter(subm, n_in):
    from pcops.triton import sparse_conv3d as tri

    out_in = conv_case(n_in, 2, 2, seed=n_in, subm=subm)[3]
    exp = ref.inverse_table(out_in, n_in)
    got = tri.inverse_table(out_in, n_in)
    assert got.dtype == torch.int32 and torch.equal(got, exp)
    if subm:  # a 3³ submanifold map is its own inverse with the offsets mirrored
        assert torch.equal(got, out_in.flip(1))
    assert tri.inverse_table(out_in[:0], n_in).eq(-1).all()


def test_backend_choice_and_refusals():
    feats, weight, bias, out_in = conv_case(30, 2, 3, seed=2)
    km = pcops.sparse_conv_kernel_map(torch.zeros(1, 4, dtype=torch.int32), (1, 1, 1), 3, subm=True)
    with pytest.raises(ValueError, match="CUDA tensors"):
        pcops.sparse_conv3d(torch.zeros(1, 2), km, torch.zeros(27, 2, 3), backend="triton")
    with pytest.raises(ValueError, match="has no 'cuda'"):
        pcops.sparse_conv3d(torch.zeros(1, 2), km, torch.zeros(27, 2, 3), backend="cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("subm", [True, False])
@gpu[0]
@gpu[1]
def test_gpu_triton_sparse_conv3d(dtype, subm):
    from pcops.triton import sparse_conv3d as tri

    for n, c_in, c_out in ((3000, 16, 16), (2000, 4, 33), (5000, 64, 64)):
        case = conv_case(n, c_in, c_out, seed=n, subm=subm, device="cuda", dtype=dtype, shape=(20, 30, 40))
        check_against_reference(tri, *case, TOL[dtype], subm)


@gpu[0]
@gpu[1]
def test_gpu_layers_run_triton_and_match_reference(caplog):
    import logging

    from pcops import nn as pnn

    feats, _, _, _ = conv_case(4000, 4, 4, seed=3, shape=(20, 30, 40))
    g = generator(4)
    lin = torch.randperm(20 * 30 * 40, generator=g)[:4000]
    coords = torch.stack([torch.zeros_like(lin), lin // 1200, (lin // 40) % 30, lin % 40], 1).int()
    torch.manual_seed(0)
    net = pnn.SparseSequential(pnn.SubMConv3d(4, 16, 3, indice_key="a"), torch.nn.ReLU(),
                               pnn.SparseConv3d(16, 32, 3, 2, 1, indice_key="b"),
                               pnn.SparseInverseConv3d(32, 8, 3, indice_key="b"))  # fmt: skip
    gy = torch.randn(4000, 8, generator=g)
    x = feats.clone().requires_grad_(True)
    cpu = net(pnn.SparseConvTensor(x, coords, (20, 30, 40), 1)).features
    cpu_grads = torch.autograd.grad(cpu, [x, *net.parameters()], gy)
    net.cuda()
    xc = feats.cuda().requires_grad_(True)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        out = net(pnn.SparseConvTensor(xc, coords.cuda(), (20, 30, 40), 1)).features
        # backward: the subm conv's feature gradient on its own (mirrored) map, the strided and
        # inverse convs' through the Triton inverse table
        grads = torch.autograd.grad(out, [xc, *net.parameters()], gy.cuda())
    messages = [r.getMessage() for r in caplog.records]
    assert "sparse_conv3d: triton" in messages and "sparse_conv3d_backward: triton" in messages
    torch.testing.assert_close(out.cpu(), cpu, atol=1e-4, rtol=1e-4)
    for got, exp in zip(grads, cpu_grads):
        torch.testing.assert_close(got.cpu(), exp, atol=1e-3, rtol=1e-4)


# --- the ReLU epilogue ---------------------------------------------------------------------------


@interpret
def test_triton_relu_epilogue_interpreter():
    from pcops.triton import sparse_conv3d as tri

    feats, weight, bias, out_in = conv_case(70, 5, 12, seed=21)
    out = tri.sparse_conv3d(feats, weight, bias, out_in, relu=True)
    plain = tri.sparse_conv3d(feats, weight, bias, out_in)
    assert (plain < 0).any() and (plain > 0).any()  # the case exercises both sides
    assert torch.equal(out, plain.clamp(min=0))  # the same sums, then max(., 0)
    exp = ref.sparse_conv3d(feats, weight, bias, out_in, relu=True)
    torch.testing.assert_close(out, exp, **TOL[torch.float32])
    none = torch.full_like(out_in, -1)  # no pairs: relu(bias)
    assert torch.equal(tri.sparse_conv3d(feats, weight, bias, none, relu=True), bias.clamp(min=0).expand(70, 12))


def test_activation_relu_forward_and_gradients():
    feats, weight, bias, out_in = conv_case(80, 4, 6, seed=22)
    feats, weight, bias = (t.double().requires_grad_(True) for t in (feats, weight, bias))
    g = generator(23)
    km = pcops.KernelMap(**{**dict.fromkeys(pcops.KernelMap._fields), "out_in": out_in})  # the op reads out_in
    out = pcops.sparse_conv3d(feats, km, weight, bias, activation="relu")
    plain = pcops.sparse_conv3d(feats, km, weight, bias)
    assert torch.equal(out, plain.clamp(min=0)) and (plain < 0).any()
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (feats, weight, bias), grad)
    exp = torch.autograd.grad(torch.relu(plain), (feats, weight, bias), grad)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    torch.autograd.gradcheck(
        lambda f, w, b: pcops.sparse_conv3d(f, km, w, b, activation="relu"),
        (feats[:, :2].detach().clone().requires_grad_(True), weight[:, :2].detach().clone().requires_grad_(True),
         bias.detach().clone().requires_grad_(True)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="activation"):
        pcops.sparse_conv3d(feats, km, weight, bias, activation="gelu")
    with pytest.raises(TypeError, match="activation"):
        pcops.sparse_conv3d(feats, km, weight, bias, activation=torch.relu)


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
@interpret
def test_triton_precision_interpreter(precision):
    """Every float32 precision runs the same kernels (forward, dgrad, wgrad) to the reference's
    result; the interpreter multiplies in float32 whatever the precision (the GPU test checks the
    tensor-core rounding)."""
    from pcops.triton import sparse_conv3d as tri

    feats, weight, bias, out_in = conv_case(40, 5, 7, seed=61)
    out = tri.sparse_conv3d(feats, weight, bias, out_in, precision=precision)
    torch.testing.assert_close(out, ref.sparse_conv3d(feats, weight, bias, out_in), **TOL[torch.float32])
    g = torch.randn(out.shape, generator=generator(62))
    ef, ew = ref.sparse_conv3d_backward(g, feats, weight, out_in, True, True)
    gf, gw = tri.sparse_conv3d_backward(g, feats, weight, out_in, True, precision)
    torch.testing.assert_close(gf, ef, **TOL[torch.float32])
    torch.testing.assert_close(gw, ew, **TOL[torch.float32])


def test_precision_argument():
    feats, weight, bias, out_in = conv_case(30, 3, 4, seed=63)
    km = pcops.sparse_conv_kernel_map(torch.zeros(0, 4, dtype=torch.int32), (8, 9, 10), 3, subm=True)
    coords_km = km._replace(out_in=out_in)
    base = pcops.sparse_conv3d(feats, coords_km, weight, bias)
    for precision in ("ieee", "tf32", "tf32x3"):  # the reference (CPU) ignores it
        assert torch.equal(pcops.sparse_conv3d(feats, coords_km, weight, bias, precision=precision), base)
    with pytest.raises(ValueError, match="precision"):
        pcops.sparse_conv3d(feats, coords_km, weight, bias, precision="bf16")
    with pytest.raises(TypeError, match="precision"):
        pcops.sparse_conv3d(feats, coords_km, weight, bias, precision=None)
    conv = pcops.nn.SubMConv3d(3, 4, 3, precision="tf32x3")
    assert conv.precision == "tf32x3" and "precision='tf32x3'" in repr(conv)
    with pytest.raises(ValueError, match="precision"):
        pcops.nn.SparseConv3d(3, 4, 3, precision="fp32")
    f = feats.double().requires_grad_(True)
    torch.library.opcheck(
        torch.ops.pcops.sparse_conv3d, (f, weight.double(), bias.double(), out_in, "auto", "none", False, "tf32x3")
    )


@pytest.mark.parametrize("subm", [True, False])
@gpu[0]
@gpu[1]
def test_gpu_fp32_precisions(subm):
    """float32 on tensor cores: 3×TF32 within float32 rounding of the float64 reference (like
    IEEE), TF32 within its 10-bit mantissa; every precision bit-identical run to run."""
    from pcops.triton import sparse_conv3d as tri

    feats, weight, bias, out_in = conv_case(5000, 64, 64, seed=64, subm=subm, device="cuda", shape=(20, 30, 40))
    exp = ref.sparse_conv3d(feats.double(), weight.double(), bias.double(), out_in)
    g = torch.randn(exp.shape, generator=generator(65)).cuda()
    ef, ew = ref.sparse_conv3d_backward(g.double(), feats.double(), weight.double(), out_in, True, True)
    scale = exp.abs().max()
    errors = {}
    for precision in ("ieee", "tf32x3", "tf32"):
        out = tri.sparse_conv3d(feats, weight, bias, out_in, precision=precision)
        gf, gw = tri.sparse_conv3d_backward(g, feats, weight, out_in, subm, precision)
        again = tri.sparse_conv3d(feats, weight, bias, out_in, precision=precision)
        assert torch.equal(out, again)
        errors[precision] = max(
            float((out.double() - exp).abs().max() / scale),
            float((gf.double() - ef).abs().max() / ef.abs().max()),
            float((gw.double() - ew).abs().max() / ew.abs().max()),
        )
    assert errors["ieee"] < 1e-5 and errors["tf32x3"] < 1e-5, errors
    assert 1e-5 < errors["tf32"] < 1e-2, errors


_AOT_SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import sparse_conv3d as tri

target = GPUTarget("cuda", 90, 32)


def compile_(fn, types, constexprs, num_warps=4):
    sig = dict(zip(fn.arg_names, types + ["constexpr"] * (len(fn.arg_names) - len(types))))
    triton.compile(ASTSource(fn, sig, constexprs), target=target, options={"num_warps": num_warps})


for ptr, prec in (("*fp16", "tf32"), ("*bf16", "tf32"), ("*fp32", "ieee"), ("*fp32", "tf32"), ("*fp32", "tf32x3")):
    for relu in (False, True):
        for bias in (False, True):
            types = [ptr, ptr, ptr, "*i32", ptr] + ["i32"] * 7
            for u in (1, 3, 4):
                compile_(tri._gather_gemm_kernel, types, dict(HAS_BIAS=bias, RELU=relu, PRECISION=prec, BLOCK_M=64,
                         BLOCK_N=64, BLOCK_C=32, SKIP=True, KPAD=32, U=u))
    compile_(tri._wgrad_kernel, [ptr, ptr, "*i32", "*fp32"] + ["i32"] * 4,
             dict(ROWS=4096, PRECISION=prec, BLOCK_M=64, BLOCK_I=32, BLOCK_O=64))
print("compiled")
"""


def test_triton_kernels_compile_for_sm90():
    """The interpreter does not type-check like the compiler: compile the implicit-GEMM kernels
    (every dtype, bias, the ReLU epilogue) for sm_90 ahead of time (Triton's ptxas, no GPU)."""
    from _util import run_compiler_script

    run_compiler_script(_AOT_SCRIPT, timeout=600)
