"""pcops.fused_swish_dropout_residual: ``dropout(x · sigmoid(x)) + residual``.

Oracles: ``F.silu`` plus the residual, autograd through it and float64 ``gradcheck``; dropout
masks regenerated with ``pcops.triton._fused_common.dropout_keep_mask`` (the kernels' Philox
stream) and given to the reference; keep statistics within 3σ.
"""

import pytest
import torch
import torch.nn.functional as F

import pcops
from pcops.reference import swish_dropout_residual as ref
from _fused_util import GRAD_TOL, TOL, _fixed_triton_configs, check_dropout_stats, watch_kernels, kernels_run  # noqa: F401
from _util import generator, interpret, requires_cuda, run_compiler_script


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
    assert torch.autograd.gradcheck(
        lambda x, r: pcops.fused_swish_dropout_residual(x, r, 0.25, generator=generator(1)), (x, r)
    )
    big = torch.rand(20000, generator=g) + 0.5  # swish(x) > 0: dropped ⇔ output == residual (0)
    y = pcops.fused_swish_dropout_residual(big, torch.zeros_like(big), 0.3, generator=generator(2))
    check_dropout_stats(y != 0, 0.3)
    torch.testing.assert_close(y[y != 0], F.silu(big)[y != 0] / 0.7)


def test_opcheck():
    x = torch.randn(5, 13, generator=generator(19))
    for s, p in ((None, 0.0), (torch.tensor([42]), 0.3)):
        torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x, torch.randn_like(x), p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x.double().requires_grad_(), x.double(), p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_backward, (torch.randn_like(x), x, p, s))
        torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x, x, p, s, "reference"))


def test_torch_compile_fullgraph():
    g = generator(21)
    x, r = torch.randn(6, 24, generator=g), torch.randn(6, 24, generator=g)
    net = lambda x, r: pcops.fused_swish_dropout_residual(x * 2, r, 0.5, training=False).sum(1)  # noqa: E731
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, r), net(x, r))
    a, e = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled(a, r).sum().backward()
    net(e, r).sum().backward()
    torch.testing.assert_close(a.grad, e.grad)


@pytest.mark.parametrize(
    "call,exc,name",
    [
        (lambda x: pcops.fused_swish_dropout_residual(x, x.double(), 0.1), TypeError, "residual"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x[:1], 0.1), ValueError, "residual"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x, 1.5), ValueError, "dropout_p"),
        (lambda x: pcops.fused_swish_dropout_residual(x.long(), x.long(), 0.1), TypeError, "x"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x, 0.1, training=1), TypeError, "training"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x, 0.1, True, 3), TypeError, "generator"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x, 0.1, backend="cuda"), ValueError, "backend.*no 'cuda'"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x, 0.1, backend="triton"), ValueError, "backend.*CUDA"),
        (lambda x: pcops.fused_swish_dropout_residual(x, x, 0.1, backend="torch"), ValueError, "backend"),
    ],
)
def test_bad_input(call, exc, name):
    x = torch.randn(3, 8, generator=generator(23))
    with pytest.raises(exc, match=name):
        call(x)


def test_reference_logged(caplog):
    watch_kernels(caplog)
    x = torch.randn(3, 8, generator=generator(24))
    pcops.fused_swish_dropout_residual(x, x, 0.0, backend="reference")
    assert kernels_run(caplog, "swish_dropout_residual") == ["reference"]


@interpret
def test_triton_interpreter():
    from pcops.triton import _fused_common as common
    from pcops.triton import swish_dropout_residual as tri

    p, rows, width = 0.3, 8, 40
    g = generator(24)
    x, r, gy = (torch.randn(rows, width, generator=g) for _ in range(3))
    seed = torch.tensor([1234])
    keep = common.dropout_keep_mask(seed, (rows, width), p)
    torch.testing.assert_close(tri.swish_dropout_residual(x, r, p, seed), ref.swish_dropout_residual(x, r, p, keep))
    torch.testing.assert_close(tri.swish_dropout_backward(gy, x, p, seed), ref.swish_dropout_backward(gy, x, p, keep))
    torch.testing.assert_close(tri.swish_dropout_residual(x, r, p, None), ref.swish_dropout_residual(x, r, p, None))
    assert tri.swish_dropout_residual(x[:0], r[:0], p, seed).shape == (0, width)


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


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.gpu
@requires_cuda
def test_gpu_dropout(p, caplog):
    """The mask is the kernels' Philox stream over the flat index, for the seed drawn from the generator."""
    watch_kernels(caplog)
    from pcops.triton import _fused_common as common

    x = torch.randn(512, 768, generator=generator(27)).cuda()
    g = torch.randn(512, 768, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    seed = torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device="cuda", generator=gen)
    keep = common.dropout_keep_mask(seed, x.shape, p)
    check_dropout_stats(keep, p)
    xs = x.clone().requires_grad_(True)
    gen.manual_seed(5)
    ys = pcops.fused_swish_dropout_residual(xs, torch.zeros_like(x), p, generator=gen)
    torch.testing.assert_close(ys, F.silu(x) * keep / (1 - p))
    ys.backward(g)
    torch.testing.assert_close(xs.grad, ref.swish_dropout_backward(g, x, p, keep), atol=1e-5, rtol=1e-5)
    assert kernels_run(caplog, "swish_dropout_residual") == ["_swish_dropout_residual_kernel"]
    with pytest.raises(TypeError, match="float64"):
        pcops.fused_swish_dropout_residual(x.double(), x.double(), p, backend="triton")


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck():
    x = torch.randn(9, 100, device="cuda")
    for s, p in ((None, 0.0), (torch.tensor([7], device="cuda"), 0.3)):
        for backend in ("auto", "triton", "reference"):
            torch.library.opcheck(torch.ops.pcops.swish_dropout_residual, (x, torch.randn_like(x), p, s, backend))


_AOT_SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import _fused_common as c
from pcops.triton import swish_dropout_residual as f

def comp(fn, sig, consts, num_warps=4):
    full = {n: "constexpr" if n in consts else sig[n] for n in fn.arg_names}
    triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": num_warps})

dt = sys.argv[1]
ew = dict(x_ptr=f"*{dt}", res_ptr=f"*{dt}", y_ptr=f"*{dt}", dy_ptr=f"*{dt}", dx_ptr=f"*{dt}", seed_ptr="*i64",
          keep_ptr="*i8", numel="i64", dropout_p="fp32")
for drop in (False, True):
    comp(f._swish_dropout_residual_kernel, ew, dict(HAS_DROPOUT=drop, BLOCK=1024))
    comp(f._swish_dropout_bwd_kernel, ew, dict(HAS_DROPOUT=drop, BLOCK=1024))
comp(c._dropout_keep_kernel, ew, dict(BLOCK=1024))
print("compiled")
"""


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_kernels_compile_for_sm90(dtype):
    """Lowering to a CUBIN catches what the interpreter accepts but the compiler does not."""
    run_compiler_script(_AOT_SCRIPT, dtype)
