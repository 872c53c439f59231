"""Operator registration with a thin eager call path: ``custom_op`` with the interface of
``torch.library.custom_op`` (``register_kernel``, ``register_fake``, ``register_autograd``),
registered through the low-level ``torch.library.Library`` API.

Why not ``torch.library.custom_op`` itself: every eager call of an op it registers runs two Python
layers on top of the kernel, an autograd wrapper (a dataclass, a context manager and a boxed
redispatch even when no gradient is needed) and a backend wrapper that checks on every call that
no output aliases an input. This registration costs about half as much host time per call
(``benchmarks/dispatch_overhead.py``; the figures are in ``benchmarks/NOTES.md``).

What stays the same: the schema (inferred from the type annotations, as ``custom_op`` does), fake
implementations (``torch.library.register_fake``: ``torch.compile(fullgraph=True)``, ``opcheck``,
FakeTensor), autograd through a ``torch.autograd.Function`` (so AOTAutograd traces the backward),
version-counter bumps of mutated arguments, and ``torch.compile``'s automatic functionalisation
of mutating ops (it keys on the schema). What is dropped: the per-call aliasing check (pcops'
kernels return fresh tensors; tests run ``opcheck``, which checks aliasing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import _C

__all__ = ["custom_op", "call", "OPS"]

# one fragment for the namespace (kept alive here: a Library deregisters its kernels when collected)
_LIB = torch.library.Library("pcops", "FRAGMENT")
_DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
OPS: dict[str, Op] = {}  # name -> Op, every op registered here


def custom_op(
    qualname: str, *, mutates_args: Iterable[str] = (), device_types: str | Iterable[str] | None = None
) -> Callable[[Callable], Op]:
    """Decorator: define ``qualname`` (``"pcops::name"``) with the decorated function's signature
    and register the function as its kernel for ``device_types`` (``"cpu"``, ``"cuda"``, a tuple
    of them, or None: every device). Returns an :class:`Op`."""

    def wrap(fn: Callable) -> Op:
        return Op(qualname, fn, tuple(mutates_args), device_types)

    return wrap


def call(op, *args):
    """Call a pcops op (an ``OpOverload``) from a public wrapper: where no input requires grad
    (and torch.compile is not tracing), below autograd, so the dispatcher skips the Python
    autograd kernel (a second dispatcher crossing, which converts the arguments again) and every
    torch op inside the kernel skips the autograd layer too. The same result as ``op(*args)``."""
    # is_compiling first: under torch.compile it is constant True and the rest is not traced
    if torch.compiler.is_compiling() or (_C.is_grad_enabled() and _C._any_requires_grad(*args)):
        return op(*args)
    with _C._AutoDispatchBelowAutograd():
        return op(*args)


class Op:
    """A registered operator: call it like the function, or as ``torch.ops.pcops.<name>``.
    ``kernels`` maps ``"cpu"`` / ``"cuda"`` / ``"any"`` to the registered Python function (what
    ``benchmarks/host_overhead.py`` calls to time a kernel without the dispatcher)."""

    def __init__(self, qualname: str, fn: Callable, mutates_args: tuple[str, ...], device_types) -> None:
        ns, _, name = qualname.partition("::")
        if ns != "pcops" or not name:
            raise ValueError(f"qualname: expected 'pcops::<name>', got {qualname!r}")
        self._name = name
        self._qualname = qualname
        self.kernels: dict[str, Callable] = {}
        schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
        if any(a.kwarg_only for a in _C.parse_schema(name + schema).arguments):
            raise ValueError(f"{qualname}: keyword-only arguments are not supported, got {schema}")
        _LIB.define(name + schema)
        self._opoverload = getattr(torch.ops.pcops, name).default
        if device_types is None:
            _LIB.impl(name, fn, "CompositeExplicitAutograd")
            self.kernels["any"] = fn
        else:
            for dev in (device_types,) if isinstance(device_types, str) else device_types:
                self.register_kernel(dev)(fn)
        self._backward: Callable | None = None
        self._setup_context: Callable | None = None
        self._function = self._make_function()
        _LIB.impl(name, self._autograd_kernel(), "Autograd", with_keyset=True)
        args = self._opoverload._schema.arguments
        mutated = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        if mutated:
            _LIB.impl(name, self._inplace_or_view_kernel(mutated), "ADInplaceOrView", with_keyset=True)
        OPS[name] = self

    def __call__(self, *args, **kwargs):
        return self._opoverload(*args, **kwargs)

    def register_kernel(self, device_type: str) -> Callable[[Callable], Callable]:
        if device_type not in _DEVICE_KEYS:
            raise ValueError(f"device_type: expected one of {sorted(_DEVICE_KEYS)}, got {device_type!r}")

        def wrap(fn: Callable) -> Callable:
            _LIB.impl(self._name, fn, _DEVICE_KEYS[device_type])
            self.kernels[device_type] = fn
            return fn

        return wrap

    def register_fake(self, fn: Callable) -> Callable:
        torch.library.register_fake(self._qualname, fn, lib=_LIB)
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        """``backward(ctx, *grads)`` returns one gradient (or None) per input, as for
        ``torch.library.custom_op``; ``setup_context(ctx, inputs, output)`` saves what it needs."""
        self._backward, self._setup_context = backward, setup_context

    # --- dispatcher kernels ------------------------------------------------------------------

    def _make_function(self) -> type[torch.autograd.Function]:
        op, info = self._opoverload, self
        below = _C._after_autograd_keyset
        # the dispatcher drops trailing arguments equal to their defaults; setup_context sees them all
        defaults = tuple(a.default_value for a in op._schema.arguments)

        def forward(ctx, keyset, *args):
            with _C._AutoDispatchBelowAutograd():
                out = op.redispatch(keyset & below, *args)
            if info._setup_context is not None:
                info._setup_context(ctx, args + defaults[len(args) :], out)
            return out

        def backward(ctx, *grads):
            if info._backward is None:
                raise RuntimeError(f"{op}: no autograd formula is registered; its inputs cannot get gradients")
            saved = ctx.needs_input_grad
            # as the user's inputs: without the keyset, with the dropped defaults (no gradient)
            ctx.needs_input_grad = saved[1:] + (False,) * (len(defaults) + 1 - len(saved))
            try:
                res = info._backward(ctx, *grads)
            finally:
                ctx.needs_input_grad = saved
            return (None, *res) if isinstance(res, tuple) else (None, res)

        name = f"Backward_pcops_{self._name}"
        return type(
            name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)}
        )

    def _autograd_kernel(self) -> Callable:
        op, fn = self._opoverload, self._function
        below = _C._after_autograd_keyset
        grad_enabled, any_requires_grad = _C.is_grad_enabled, _C._any_requires_grad

        below_autograd = _C._AutoDispatchBelowAutograd

        def autograd(keyset, *args):
            if grad_enabled() and any_requires_grad(*args):
                return fn.apply(keyset, *args)
            # no input needs a gradient: straight to the device kernel, with the torch ops inside
            # it below autograd too (nothing to record)
            with below_autograd():
                return op.redispatch(keyset & below, *args)

        return autograd

    def _inplace_or_view_kernel(self, mutated: list[int]) -> Callable:
        op = self._opoverload
        below = _C._after_ADInplaceOrView_keyset
        bump = torch.autograd.graph.increment_version

        def inplace_or_view(keyset, *args):
            for i in mutated:  # the autograd engine checks saved tensors against these counters
                if i < len(args) and isinstance(args[i], torch.Tensor):
                    bump(args[i])
            with _C._AutoDispatchBelowADInplaceOrView():
                return op.redispatch(keyset & below, *args)

        return inplace_or_view
