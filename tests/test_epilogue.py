"""pcops.bias_relu: the reference vs plain torch, the Triton kernel (interpreter) vs the reference
(channels-last, channel slices, half types), the backend contract, registration, bad input."""

import logging

import pytest
import torch

import pcops
from pcops.reference import epilogue as ref
from _util import generator, interpret, requires_cuda


def make(shape, dtype=torch.float32, channels_last=False, seed=0, device="cpu"):
    g = generator(seed)
    y = torch.randn(shape, generator=g).to(dtype)
    if channels_last:
        y = y.contiguous(memory_format=torch.channels_last)
    return y.to(device), torch.randn(shape[1], generator=g).to(device)


def test_reference_in_place_and_into_a_slice():
    y, bias = make((2, 5, 3, 7))
    want = torch.relu(y + bias[:, None, None])
    got = y.clone()
    assert pcops.bias_relu(got, bias) is got and torch.equal(got, want)
    out = torch.full((2, 12, 3, 7), -1.0)
    assert pcops.bias_relu(y, bias, out, channel_offset=4) is out
    assert torch.equal(out[:, 4:9], want)
    assert (out[:, :4] == -1).all() and (out[:, 9:] == -1).all()
    half = pcops.bias_relu(y, bias, torch.zeros(2, 5, 3, 7, dtype=torch.bfloat16))
    assert torch.equal(half, want.to(torch.bfloat16))


def test_backend_contract_and_bad_input(caplog):
    y, bias = make((1, 3, 2, 2))
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        got = pcops.bias_relu(y.clone(), bias, backend="reference")
    assert caplog.records[-1].getMessage() == "bias_relu: reference"
    assert torch.equal(got, torch.relu(y + bias[:, None, None]))
    with pytest.raises(ValueError, match="backend.*CUDA tensors"):
        pcops.bias_relu(y, bias, backend="triton")
    with pytest.raises(ValueError, match="backend: bias_relu has no 'cuda'"):
        pcops.bias_relu(y, bias, backend="cuda")
    for kw, exc, name in [
        (dict(y=y[0]), ValueError, "y"),
        (dict(y=y.int()), TypeError, "y"),
        (dict(bias=bias[:2]), ValueError, "bias"),
        (dict(out=torch.zeros(1, 2, 2, 2)), ValueError, "out"),
        (dict(out=torch.zeros(1, 4, 2, 2), channel_offset=2), ValueError, "out"),
        (dict(out=torch.zeros(1, 3, 2, 3)), ValueError, "out"),
        (dict(channel_offset=-1), ValueError, "channel_offset"),
        (dict(channel_offset=1.0), TypeError, "channel_offset"),
        (dict(backend="cpp"), ValueError, "backend"),
    ]:
        args = {**dict(y=y, bias=bias), **kw}
        with pytest.raises(exc, match=name):
            pcops.bias_relu(**args)


def test_opcheck_and_compile():
    y, bias = make((2, 4, 3, 5), seed=1)
    torch.library.opcheck(torch.ops.pcops.bias_relu, (y, bias, torch.zeros(2, 9, 3, 5), 3, "auto"))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def head(y, b):
        out = torch.zeros(2, 8, 3, 5)
        pcops.bias_relu(y * 2.0, b, out, channel_offset=4)
        return pcops.bias_relu(y * 1.0, b), out

    z, out = head(y, bias)
    assert torch.equal(z, torch.relu(y + bias[:, None, None]))
    assert torch.equal(out[:, 4:], torch.relu(2 * y + bias[:, None, None])) and not out[:, :4].any()


def test_old_import_path():
    from pcops.triton.epilogue import bias_relu  # the model's import before the op existed

    assert callable(bias_relu)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 5, 3, 7), (1, 70, 4, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
@interpret
def test_triton_interpreter_matches_reference(shape, dtype, channels_last):
    from pcops.triton import epilogue as tri

    y, bias = make(shape, dtype, channels_last, seed=shape[1])
    want = y.clone()
    ref.bias_relu(y, bias, want, 0)
    got = y.clone()
    assert torch.equal(tri.bias_relu(got, bias), want)
    out = torch.zeros(shape[0], shape[1] + 3, *shape[2:], dtype=dtype)
    if channels_last:
        out = out.contiguous(memory_format=torch.channels_last)
    want_out = out.clone()
    ref.bias_relu(y, bias, want_out, 2)
    assert torch.equal(tri.bias_relu(y, bias, out, channel_offset=2), want_out)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_matches_reference(dtype, caplog):
    y, bias = make((2, 64, 62, 54), dtype, channels_last=True, seed=7, device="cuda")
    out = torch.zeros(2, 384, 62, 54, dtype=dtype, device="cuda").contiguous(memory_format=torch.channels_last)
    want = out.clone()
    pcops.bias_relu(y, bias, want, 128, backend="reference")
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.bias_relu(y, bias, out, 128)
    assert caplog.records[-1].getMessage() == "bias_relu: triton"
    assert torch.equal(out, want)
    torch.library.opcheck(torch.ops.pcops.bias_relu, (y, bias, out, 128, "triton"))
