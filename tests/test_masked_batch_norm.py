"""pcops.masked_batch_norm: batch statistics of the valid rows only; reference against torch's
batch norm on those rows, gradients against autograd of the formula (float64 gradcheck), Triton
(CPU interpreter here, CUDA with the ``gpu`` marker) against the reference."""

import pytest
import torch
import torch.nn.functional as F
from _util import generator, gpu, interpret

import pcops
from pcops.reference import masked_batch_norm as ref


def case(n, c, seed, frac=0.7, dtype=torch.float32, device="cpu", affine=True):
    g = generator(seed)
    x = (torch.randn(n, c, generator=g) * 3 + 2).to(dtype)
    valid = torch.rand(n, generator=g) < frac
    w = torch.randn(c, generator=g).to(dtype) if affine else None
    b = torch.randn(c, generator=g).to(dtype) if affine else None
    return [t.to(device) if t is not None else None for t in (x, valid, w, b)]


def formula(x, valid, w, b, eps):
    """The statistics and normalisation written out (autograd differentiates it)."""
    v = valid.to(x.dtype)[:, None]
    n = valid.sum().clamp(min=1)
    mean = (x * v).sum(0) / n
    var = ((x - mean).square() * v).sum(0) / n
    y = (x - mean) / torch.sqrt(var + eps)
    return y * w + b if w is not None else y


@pytest.mark.parametrize("n,c", [(100, 3), (2, 5), (700, 16)])
def test_reference_equals_batch_norm_on_the_valid_rows(n, c):
    x, valid, w, b = case(n, c, seed=n + c)
    valid[:2] = True
    y, mean, var = pcops.masked_batch_norm(x, valid, w, b, 1e-3)
    exp = F.batch_norm(x[valid], None, None, w, b, training=True, eps=1e-3)
    torch.testing.assert_close(y[valid], exp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mean, x[valid].mean(0))
    torch.testing.assert_close(var, x[valid].var(0, unbiased=False))
    # padding rows are normalised with the same statistics
    torch.testing.assert_close(y[~valid], (x[~valid] - mean) / torch.sqrt(var + 1e-3) * w + b)


@pytest.mark.parametrize("affine", [True, False])
def test_gradients_float64(affine):
    x, valid, w, b = case(40, 4, seed=3, dtype=torch.float64, affine=affine)
    params = [x.requires_grad_()] + ([w.requires_grad_(), b.requires_grad_()] if affine else [])
    torch.autograd.gradcheck(lambda *a: pcops.masked_batch_norm(x, valid, w, b, 1e-3)[0], params)
    y = pcops.masked_batch_norm(x, valid, w, b, 1e-3)[0]
    gy = torch.randn(y.shape, generator=generator(4), dtype=torch.float64)
    got = torch.autograd.grad(y, params, gy)
    exp = torch.autograd.grad(formula(x, valid, w, b, 1e-3), params, gy)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)


def test_opcheck_and_errors():
    x, valid, w, b = case(30, 3, seed=5)
    torch.library.opcheck(
        torch.ops.pcops.masked_batch_norm, (x.double().requires_grad_(), valid, w.double(), None, 1e-5)
    )
    with pytest.raises(TypeError, match="valid"):
        pcops.masked_batch_norm(x, valid.int())
    with pytest.raises(ValueError, match="valid"):
        pcops.masked_batch_norm(x, valid[1:])
    with pytest.raises(ValueError, match="weight"):
        pcops.masked_batch_norm(x, valid, w[1:])
    with pytest.raises(ValueError, match="eps"):
        pcops.masked_batch_norm(x, valid, eps=-1.0)
    with pytest.raises(ValueError, match="CUDA tensors"):
        pcops.masked_batch_norm(x, valid, backend="triton")
    y, mean, var = pcops.masked_batch_norm(x, torch.zeros_like(valid))  # no valid row: statistics 0
    assert not mean.any() and not var.any() and torch.isfinite(y).all()


def check_triton(tri, x, valid, w, b, tol):
    y, mean, var, count = tri.masked_batch_norm(x, valid, w, b, 1e-5)
    ey, emean, evar, ecount = ref.masked_batch_norm(x.cpu(), valid.cpu(), _cpu(w), _cpu(b), 1e-5)
    assert count.item() == ecount.item() == valid.sum().item()
    torch.testing.assert_close(mean.cpu(), emean, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(var.cpu(), evar, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(y.cpu().float(), ey.float(), **tol)
    gy = torch.randn(x.shape, generator=generator(7)).to(x.dtype).to(x.device)
    got = tri.masked_batch_norm_backward(gy, x, valid, w, mean, var, count, 1e-5)
    exp = ref.masked_batch_norm_backward(gy.cpu(), x.cpu(), valid.cpu(), _cpu(w), emean, evar, ecount, 1e-5)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a.cpu().float(), e.float(), **tol)
    again = tri.masked_batch_norm(x, valid, w, b, 1e-5)[0], tri.masked_batch_norm_backward(
        gy, x, valid, w, mean, var, count, 1e-5)  # fmt: skip
    assert torch.equal(again[0], y) and all(torch.equal(a, e) for a, e in zip(again[1], got))  # run to run


def _cpu(t):
    return t.cpu() if t is not None else None


@pytest.mark.parametrize("n,c,affine", [(600, 5, True), (70, 16, False), (1, 3, True), (0, 4, True)])
@interpret
def test_triton_interpreter(n, c, affine):
    from pcops.triton import masked_batch_norm as tri

    check_triton(tri, *case(n, c, seed=n + c, affine=affine), dict(atol=1e-4, rtol=1e-4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@gpu[0]
@gpu[1]
def test_gpu_triton(dtype):
    from pcops.triton import masked_batch_norm as tri

    tol = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=1e-2, rtol=1e-2),
           torch.bfloat16: dict(atol=6e-2, rtol=2e-2)}[dtype]  # fmt: skip
    for n, c in ((40000, 16), (5000, 128), (333, 33)):
        x, valid, w, b = case(n, c, seed=n, dtype=dtype, device="cuda")
        check_triton(tri, x, valid, w, b, tol)
