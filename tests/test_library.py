"""pcops._library: the registration every op goes through (issue 19's lighter dispatch path).

Test ops are defined once per session under ``pcops::_test_*`` names: the schema inferred from
the annotations, kernels per device, fake impls (opcheck, torch.compile), autograd through the
registered formula with the dispatcher's dropped defaults restored, version bumps of mutated
arguments, and ``call``'s below-autograd path giving the same results.
"""

import pytest
import torch
from _util import generator

from pcops import _library


def _scale(x: torch.Tensor, factor: float = 2.0, mode: str = "plain") -> torch.Tensor:
    return x * factor if mode == "plain" else (x * factor).relu()


SCALE = _library.custom_op("pcops::_test_scale", mutates_args=(), device_types="cpu")(_scale)
SEEN = {}


@SCALE.register_fake
def _scale_fake(x, factor=2.0, mode="plain"):
    return torch.empty_like(x)


def _scale_setup(ctx, inputs, output):
    x, factor, mode = inputs  # all three, although the dispatcher drops defaults
    SEEN["inputs"] = (factor, mode)
    ctx.factor, ctx.mode = factor, mode
    ctx.save_for_backward(output)


def _scale_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    SEEN["needs_input_grad"] = ctx.needs_input_grad
    g = grad * ctx.factor
    return (g * (out > 0) if ctx.mode == "relu" else g), None, None


SCALE.register_autograd(_scale_backward, setup_context=_scale_setup)


def _add_into(out: torch.Tensor, x: torch.Tensor) -> None:
    out.add_(x)


ADD_INTO = _library.custom_op("pcops::_test_add_into", mutates_args=("out",), device_types=("cpu",))(_add_into)
ADD_INTO.register_fake(lambda out, x: None)


def test_forward_schema_and_kernels():
    x = torch.randn(5, generator=generator(1))
    assert torch.equal(SCALE(x), x * 2) and torch.equal(torch.ops.pcops._test_scale(x, 3.0, "relu"), (x * 3).relu())
    assert str(torch.ops.pcops._test_scale.default._schema).startswith("pcops::_test_scale(Tensor x, float factor=2.")
    assert _library.OPS["_test_scale"] is SCALE and SCALE.kernels["cpu"] is _scale
    assert torch.ops.pcops._test_scale(torch.empty(2, device="meta")).device.type == "meta"  # the fake impl


def test_autograd_defaults_and_needs_input_grad():
    x = torch.randn(6, dtype=torch.float64, generator=generator(2), requires_grad=True)
    y = torch.ops.pcops._test_scale(x)  # factor and mode left at their defaults
    assert y.requires_grad and SEEN["inputs"] == (2.0, "plain")
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, torch.full_like(x, 2.0)) and SEEN["needs_input_grad"] == (True, False, False)
    torch.autograd.gradcheck(lambda t: torch.ops.pcops._test_scale(t, 1.5, "relu"), (x,))
    with torch.no_grad():
        assert not torch.ops.pcops._test_scale(x).requires_grad


def test_call_below_autograd_is_the_same_op():
    x = torch.randn(7, generator=generator(3))
    op = torch.ops.pcops._test_scale.default
    assert torch.equal(_library.call(op, x, 4.0, "relu"), op(x, 4.0, "relu"))
    xg = x.clone().requires_grad_(True)
    y = _library.call(op, xg, 4.0, "plain")  # an input requires grad: the autograd path
    assert y.grad_fn is not None
    (g,) = torch.autograd.grad(y.sum(), xg)
    assert torch.equal(g, torch.full_like(x, 4.0))
    with torch.no_grad():
        assert _library.call(op, xg, 4.0, "plain").grad_fn is None


def test_opcheck_and_compile():
    x = torch.randn(3, 4, dtype=torch.float64, generator=generator(4), requires_grad=True)
    torch.library.opcheck(torch.ops.pcops._test_scale.default, (x, 0.5, "relu"))
    out, other = torch.zeros(4), torch.randn(4, generator=generator(5))
    torch.library.opcheck(torch.ops.pcops._test_add_into.default, (out, other))

    def f(t):
        return _library.call(torch.ops.pcops._test_scale.default, t, 3.0, "relu") + 1

    t = torch.randn(8, generator=generator(6))
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(t), f(t))


def test_mutated_argument_bumps_its_version():
    out, x = torch.zeros(3), torch.ones(3)
    v0 = out._version
    ADD_INTO(out, x)
    _library.call(torch.ops.pcops._test_add_into.default, out, x)  # below autograd: still bumped
    assert torch.equal(out, torch.full((3,), 2.0)) and out._version == v0 + 2
    # autograd sees the mutation of a tensor it saved
    w = torch.ones(3, requires_grad=True)
    saved = torch.zeros(3)
    y = (w * saved).sum()
    ADD_INTO(saved, x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_bad_definitions():
    with pytest.raises(ValueError, match="qualname"):
        _library.custom_op("other::f")(_scale)

    def kw_only(x: torch.Tensor, *, k: int = 1) -> torch.Tensor:
        return x.clone()

    with pytest.raises(ValueError, match="keyword-only"):
        _library.custom_op("pcops::_test_kw_only")(kw_only)
    with pytest.raises(ValueError, match="device_type"):
        SCALE.register_kernel("tpu")
