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
    """Call a pcops op (an ``OpOverload``) from a public wrapper: the same result as ``op(*args)``,
    by the shortest path that gives it.

    - **Direct** (plain eager calls): where every tensor argument is a plain ``torch.Tensor`` (or
      ``Parameter``) on the CPU or CUDA and nothing could intercept the dispatcher (no
      ``torch.compile`` tracing, dispatch mode, functorch transform, JIT tracer or profiler:
      :func:`_direct_device`), the registered Python kernel of that device is called as a plain
      function, below autograd, with no dispatcher crossing (which boxes and converts every
      argument twice); an input that needs a gradient goes through the op's
      ``torch.autograd.Function`` with the same direct forward. Mutated arguments get their
      version bumps as the dispatcher gives them.
    - **Below autograd** otherwise, where no input requires grad: the dispatcher skips the Python
      autograd kernel (a second crossing).
    - Else the op's full dispatcher path."""
    # is_compiling first: under torch.compile it is constant True and the rest is not traced
    if torch.compiler.is_compiling():
        return op(*args)
    info = _BY_OVERLOAD.get(op)
    dev = _direct_device(args) if info is not None else None
    grad = _C.is_grad_enabled() and _C._any_requires_grad(*args)
    if dev is not None:
        kernel = info.kernels.get(dev) or info.kernels.get("any")
        if kernel is not None:
            if info._coerce:
                args = _coerced(args, info._coerce)
            if grad:
                if not info._mutated:  # the C++ apply: no functorch transform, no wrapped tensor to unwrap
                    return info._apply(kernel, *args)
            elif not info._mutated:
                with _C._AutoDispatchBelowAutograd():
                    return kernel(*args)
            else:  # as the ADInplaceOrView kernel: bump the mutated arguments, run below that key
                for i in info._mutated:
                    if i < len(args) and isinstance(args[i], torch.Tensor):
                        _bump(args[i])
                with _C._AutoDispatchBelowADInplaceOrView():
                    return kernel(*args)
    if grad:
        return op(*args)
    with _C._AutoDispatchBelowAutograd():
        return op(*args)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALARS = frozenset((float, int, bool, str, type(None)))  # arguments the direct path passes as they are
_bump = torch.autograd.graph.increment_version


def _direct_device(args) -> str | None:
    """``"cuda"`` (a CUDA tensor among ``args``, the dispatcher's choice over CPU tensors) or
    ``"cpu"`` where calling the kernel directly is what the dispatcher would do; None where
    something could intercept or reroute the call: a tensor subclass (FakeTensor, functional
    tensors), a device other than CPU/CUDA (meta), an active ``TorchDispatchMode`` (opcheck,
    ``make_fx``, FakeTensorMode), a functorch transform (``vmap``, ``grad``), the JIT tracer,
    the autograd profiler (whose traces should keep the ``pcops::`` op records), or a functorch
    wrapper tensor (``Function.apply``'s Python layer unwraps those; the direct path skips it)."""
    if (
        _C._len_torch_dispatch_stack()
        or _peek_interpreter() is not None
        or _C._get_tracing_state() is not None
        or _C._autograd._profiler_enabled()
    ):
        return None
    dev = "cpu"
    for a in args:
        t = type(a)
        if t in _SCALARS:
            continue
        if t in _PLAIN:
            if _wrapped(a):  # a functorch wrapper (e.g. one that outlived its transform)
                return None
            if a.is_cuda:
                dev = "cuda"
            elif not a.is_cpu:
                return None
        elif isinstance(a, torch.Tensor):
            return None  # a subclass
        elif t is list or t is tuple:
            for e in a:
                if isinstance(e, torch.Tensor):
                    if type(e) not in _PLAIN or _wrapped(e) or not (e.is_cuda or e.is_cpu):
                        return None
                    if e.is_cuda:
                        dev = "cuda"
    return dev


def _coercions(arguments) -> tuple[tuple[int, type], ...]:
    """(position, float or int) of each ``float``/``int`` schema argument (optional or not): the
    dispatcher hands a Python kernel ``float(1)`` for an int passed as a ``float`` and ``int(True)``
    for a bool passed as an ``int``; the direct path converts the same way, since Triton
    specialises on the Python type."""
    out = []
    for i, a in enumerate(arguments):
        t = a.type
        if isinstance(t, _C.OptionalType):
            t = t.getElementType()
        if isinstance(t, _C.ListType):
            e = t.getElementType()
            if isinstance(e, _C.FloatType):
                out.append((i, _float_list))
            elif isinstance(e, _C.IntType):
                out.append((i, _int_list))
        elif isinstance(t, _C.FloatType):
            out.append((i, float))
        elif isinstance(t, _C.IntType):
            out.append((i, int))
    return tuple(out)


def _float_list(a) -> list:
    return [float(v) for v in a]


def _int_list(a) -> list:
    return [int(v) for v in a]


def _needs(kind, a) -> bool:
    """Whether the dispatcher would hand the kernel something else than ``a``."""
    if kind is float:
        return type(a) is int
    if kind is int:
        return type(a) is bool
    if a is None:
        return False
    if type(a) is not list:
        return True  # a tuple (or other sequence): the dispatcher hands a list
    want = float if kind is _float_list else int
    return any(type(v) is not want for v in a)


def _coerced(args: tuple, coerce) -> tuple:
    """``args`` with the conversions of :func:`_coercions` applied where they change a type."""
    fix = None
    n = len(args)
    for i, kind in coerce:
        if i < n:
            a = args[i]
            if _needs(kind, a):
                if fix is None:
                    fix = list(args)
                fix[i] = kind(a)
    return args if fix is None else tuple(fix)


_peek_interpreter = _C._functorch.peek_interpreter_stack
_wrapped = _C._functorch.is_functorch_wrapped_tensor
_BY_OVERLOAD: dict = {}  # OpOverload -> Op


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
        # ``Function.apply`` without its Python layer (functorch's dispatch and the unwrapping of
        # dead wrappers): what ``call``'s direct path uses, where neither can apply
        self._apply = _C._FunctionBase.__dict__["apply"].__get__(None, self._function)
        _LIB.impl(name, self._autograd_kernel(), "Autograd", with_keyset=True)
        args = self._opoverload._schema.arguments
        mutated = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        if mutated:
            _LIB.impl(name, self._inplace_or_view_kernel(mutated), "ADInplaceOrView", with_keyset=True)
        self._mutated = tuple(mutated)
        self._coerce = _coercions(args)
        OPS[name] = self
        _BY_OVERLOAD[self._opoverload] = self

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

        keyset_type = _C.DispatchKeySet

        def forward(ctx, target, *args):
            # target: the dispatcher's keyset (the Autograd kernel) or the device's Python kernel
            # (``call``'s direct path)
            with _C._AutoDispatchBelowAutograd():
                if type(target) is keyset_type:
                    out = op.redispatch(target & below, *args)
                else:
                    out = target(*args)
            if info._setup_context is not None:
                info._setup_context(ctx, args + defaults[len(args) :], out)
            return out

        def backward(ctx, *grads):
            if info._backward is None:
                raise RuntimeError(f"{op}: no autograd formula is registered; its inputs cannot get gradients")
            saved = ctx.needs_input_grad
            # as the user's inputs: without the keyset or kernel, with the dropped defaults (no gradient)
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
