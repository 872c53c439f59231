"""pcops._library: the registration every op goes through (issue 19's lighter dispatch path).

Test ops are defined once per session under ``pcops::_test_*`` names: the schema inferred from
the annotations, kernels per device, fake impls (opcheck, torch.compile), autograd through the
registered formula with the dispatcher's dropped defaults restored, version bumps of mutated
arguments, and ``call``'s below-autograd path giving the same results.
"""

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from _util import generator

from pcops import _library


def _scale(x: torch.Tensor, factor: float = 2.0, mode: str = "plain") -> torch.Tensor:
    # what reached the kernel: the type of factor and the calling frame (``call``: the direct path)
    SEEN["factor_type"], SEEN["caller"] = type(factor), sys._getframe(1).f_code.co_name
    return x * factor if mode == "plain" else (x * factor).relu()


SEEN = {}
SCALE = _library.custom_op("pcops::_test_scale", mutates_args=(), device_types="cpu")(_scale)


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


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        SEEN.setdefault("mode_saw", []).append(str(func))
        return func(*args, **(kwargs or {}))


def test_call_direct_path_matches_the_dispatcher():
    """Plain eager calls run the kernel without the dispatcher, with the dispatcher's argument
    conversions (an int for a float argument arrives as a float) and the same results, with or
    without autograd; a dispatch mode or a tensor subclass keeps the dispatcher path."""
    op = torch.ops.pcops._test_scale.default
    x = torch.randn(9, dtype=torch.float64, generator=generator(7))
    via_dispatcher = op(x, 3, "relu")
    assert SEEN["factor_type"] is float and SEEN["caller"] != "call"
    direct = _library.call(op, x, 3, "relu")
    assert SEEN["factor_type"] is float and SEEN["caller"] == "call"
    assert torch.equal(direct, via_dispatcher)
    # autograd: the op's Function with the direct forward, the same gradient as the dispatcher's
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = _library.call(op, xa, 2, "relu"), op(xb, 2, "relu")
    assert SEEN["caller"] != "call" and ya.grad_fn is not None
    dy = torch.randn(9, dtype=torch.float64, generator=generator(8))
    (ga,), (gb,) = torch.autograd.grad(ya, xa, dy), torch.autograd.grad(yb, xb, dy)
    assert torch.equal(ya, yb) and torch.equal(ga, gb) and SEEN["needs_input_grad"] == (True, False, False)
    # a dispatch mode sees the op: the dispatcher path
    SEEN.pop("mode_saw", None)
    with _Passthrough():
        assert torch.equal(_library.call(op, x, 3.0, "relu"), via_dispatcher)
    assert "pcops._test_scale.default" in SEEN["mode_saw"] and SEEN["caller"] != "call"
    # meta tensors (no kernel of that device) take the fake implementation
    assert _library.call(op, torch.empty(4, device="meta")).device.type == "meta"
    # the profiler keeps its op records
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _library.call(op, x, 3.0, "relu")
    assert any(e.name == "pcops::_test_scale" for e in prof.events())


def test_direct_path_leaves_functorch_wrappers_to_the_dispatcher():
    """A functorch wrapper that outlived its transform (``Function.apply``'s Python layer unwraps
    those, the direct path's C++ apply does not) takes the dispatcher path, with the result and
    gradient of the plain tensor."""
    op = torch.ops.pcops._test_scale.default
    x = torch.randn(6, dtype=torch.float64, generator=generator(9))
    leaked = []

    def f(t):
        leaked.append(t)
        return (t * t).sum()

    torch.func.grad(f)(x)
    g = 3.0 * (x > 0).double()
    dead = leaked[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(dead)
    assert _library._direct_device((dead,)) is None and _library._direct_device((x,)) == "cpu"
    xa = x.clone().requires_grad_(True)
    assert torch.equal(_library.call(op, dead, 3.0, "relu"), _library.call(op, x, 3.0, "relu"))
    (ga,) = torch.autograd.grad(_library.call(op, xa, 3.0, "relu").sum(), xa)
    assert torch.equal(ga, g)


def test_coercions_follow_the_schema():
    """The direct path converts exactly where the dispatcher would: ints for floats, bools for
    ints, sequences for lists, not None."""
    conv = _library._coerced
    spec = ((0, float), (1, int), (2, _library._float_list), (3, _library._int_list))
    out = conv((1, True, (1, 2.5), (3, 4)), spec)
    assert out == (1.0, 1, [1.0, 2.5], [3, 4]) and [type(v) for v in out[:2]] == [float, int]
    args = (1.5, 2, [1.0], None)
    assert conv(args, spec) is args  # nothing to change: the same tuple
