"""Triton launches without the per-call JIT dispatch: ``launch(kernel, grid, *args, **kwargs)``.

``kernel[grid](*args)`` runs Triton's ``JITFunction.run`` on every call: it binds and specializes
every argument, hashes a cache key, checks the kernel's globals, builds launch metadata for the
profiler hooks and calls them (about 12-28 µs of host time per launch on the GPU machine). Here
the first call of each *specialization* goes through that path (compiling if needed); the
compiled kernel's C launcher is then kept and later calls with the same specialization call it
directly (a few µs).

The specialization key is at least as fine as Triton's: for tensors the dtype and whether the
data pointer is 16-byte aligned, for ints whether they equal 1, are multiples of 16 and fit in
int32 (or need uint64), for floats only the type, the type and value of every ``constexpr``
parameter and launch option (``num_warps`` ...), and Triton's debug and instrumentation
settings. So a bound call launches the very binary ``kernel[grid]`` would, with the same arguments.
``_key`` builds it in one pass with the common cases inlined (plain tensors, int32 ints, keywords
that are all constexprs or launch options: one tuple of their values and one of their types; the
cost per launch is in ``benchmarks/NOTES.md``). Triton's path is kept for the interpreter
(``TRITON_INTERPRET=1``), autotuned kernels, callable grids, registered launch or pre-run hooks
(profilers such as proton) and kernels whose launcher needs scratch memory or tensor descriptors.
"""

from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

__all__ = ["launch", "cdiv", "next_power_of_2"]

_I32 = 2**31
_U64 = 2**63


_EXACT_TYPES = (bool, type(None), str, torch.dtype)


def _spec_runtime(a):
    """The part of a runtime argument's value that Triton specializes on. Other argument types
    (tuples, descriptors, huge ints) raise ``TypeError``: Triton's path then runs every call."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, not (a.data_ptr() & 15))
    t = type(a)
    if t is int:
        if not -_U64 <= a < 2 * _U64:
            raise TypeError("int outside Triton's range")
        return (a == 1, not (a & 15), -_I32 <= a < _I32, a >= _U64)
    if t is float:
        return float
    if t in _EXACT_TYPES:
        return (t, a)
    raise TypeError(f"{t.__name__}: not keyed")


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host ints: a plain function (Triton's is a ``ConstexprFunction`` whose
    every call unwraps its arguments; launchers call it per launch)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host ints ≥ 0 (0 for 0), a plain function like :func:`cdiv`."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _spec_exact(a):
    """A constexpr: its type and value (1, 1.0 and True compile differently)."""
    return (type(a), a)


class _Kernel:
    """Per-kernel parameter table and the bound launches of its specializations."""

    __slots__ = ("fn", "names", "specs", "flags", "leading", "constexpr", "defaults", "kw_kinds", "bound")

    def __init__(self, fn: JITFunction):
        params = fn.params
        self.fn = fn
        self.names = [p.name for p in params]
        self.constexpr = {p.name: p.is_constexpr for p in params}
        self.specs = [_spec_exact if p.is_constexpr else _spec_runtime for p in params]
        self.flags = tuple(bool(p.is_constexpr) for p in params)  # per position: keyed by type and value
        self.defaults = {p.name: p.default for p in params if p.has_default}
        self.leading = next((i for i, c in enumerate(self.flags) if c), len(self.flags))  # runtime params first
        self.kw_kinds: dict = {}  # keyword names in call order -> (token, no runtime parameter among them)
        self.bound: dict = {}


_KERNELS: dict = {}  # kernel -> _Kernel (keeps the kernel alive, so its id is never reused)
_BY_ID: dict = {}  # id(kernel) -> _Kernel: ``JITFunction.__hash__`` is Python code


def _hooked() -> bool:
    """Launch hooks are registered (Triton 3.6: hook chains with ``calls``; older: a callable or None)."""
    rt = knobs.runtime
    return any(getattr(h, "calls", h) for h in (rt.launch_enter_hook, rt.launch_exit_hook))


def _bind(info: _Kernel, compiled, nargs: int, kwargs: dict):
    """The direct launch of ``compiled`` for calls with ``nargs`` positional arguments and these
    keyword names, or ``None`` where Triton's path must stay (scratch memory, descriptors)."""
    launcher = compiled.run
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return None
    if getattr(compiled.metadata, "tensordesc_meta", None):
        return None
    tail, dynamic = [], []
    for i, name in enumerate(info.names[nargs:], nargs):
        if name in kwargs:
            if not info.constexpr[name]:
                dynamic.append(name)  # a runtime argument passed by keyword: read per call
            tail.append(kwargs[name])
        elif name in info.defaults:
            tail.append(info.defaults[name])
        else:
            return None  # a missing argument: let Triton raise its error
    if dynamic:
        return None
    return (
        launcher.launch,
        compiled.function,
        launcher.launch_cooperative_grid,
        launcher.launch_pdl,
        compiled.packed_metadata,
        tuple(tail),
    )


def _key(info: _Kernel, device: int, args: tuple, kwargs: dict) -> tuple:
    """The specialization key of a call: two calls get equal keys exactly where Triton's debug and
    instrumentation settings and the per-argument ``_spec_runtime`` / ``_spec_exact`` agree (a
    runtime parameter passed by keyword: ``_spec_runtime``; a constexpr or a launch option:
    ``_spec_exact``). The common cases are inlined, no function call per argument: tensors of type
    ``torch.Tensor`` (a subclass such as ``Parameter``: ``_spec_runtime``), int32 ints (``None`` for
    1, else whether a multiple of 16), and keywords that are all constexprs or launch options (a
    token for their names, then their values and their types as tuples). ``TypeError`` where an
    argument is not keyed; an unhashable constexpr raises it when the key is hashed."""
    Tensor = torch.Tensor
    if len(args) <= info.leading:  # no constexpr among the positional arguments
        pos = tuple(
            [
                (a & 15 == 0 if a != 1 else None)
                if type(a) is int and -(2**31) <= a < 2**31
                else (a.dtype, a.data_ptr() & 15 == 0)
                if type(a) is Tensor
                else _spec_runtime(a)
                for a in args
            ]
        )
    else:
        pos = tuple(
            [
                (type(a), a)
                if c
                else (a & 15 == 0 if a != 1 else None)
                if type(a) is int and -(2**31) <= a < 2**31
                else (a.dtype, a.data_ptr() & 15 == 0)
                if type(a) is Tensor
                else _spec_runtime(a)
                for c, a in zip(info.flags, args)
            ]
        )
    names = tuple(kwargs)
    kind = info.kw_kinds.get(names)
    if kind is None:  # a token for these names in this order (equal only to itself: cheap to hash and
        # compare, and never shared by two sequences, threads or not) and whether none is a runtime parameter
        kind = info.kw_kinds[names] = (object(), all(info.constexpr.get(k, True) for k in names))
    token, exact = kind
    if exact:  # every value keyed by type and value (1, 1.0 and True compile differently)
        vals = tuple(kwargs.values())
        kw = (vals, tuple(map(type, vals)))
    else:  # a runtime parameter passed by keyword
        cx = info.constexpr
        kw = tuple([_spec_exact(v) if cx.get(k, True) else _spec_runtime(v) for k, v in kwargs.items()])
    return (
        device,
        len(args),
        info.fn.debug or knobs.runtime.debug,
        knobs.compilation.instrumentation_mode,
        pos,
        token,
        kw,
    )


def launch(kernel, grid, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, launched directly once this specialization has run.

    ``grid`` is a tuple of 1-3 ints (a callable grid takes Triton's path). Arguments as for
    ``kernel[grid]``: parameters by position or keyword (a runtime one by keyword takes Triton's
    path), launch options (``num_warps``, ``num_stages``, ...) by keyword. Unlike Triton's path, a
    bound call does not re-check the globals a kernel reads (pcops kernels read constants only).
    """
    info = _BY_ID.get(id(kernel))
    if info is None or info.fn is not kernel:
        if not isinstance(kernel, JITFunction):  # the interpreter, an Autotuner, a heuristics wrapper
            kernel[grid](*args, **kwargs)
            return
        info = _KERNELS.get(kernel) or _Kernel(kernel)
        _KERNELS[kernel] = _BY_ID[id(kernel)] = info
    if callable(grid) or getattr(kernel, "pre_run_hooks", None) or _hooked():
        kernel[grid](*args, **kwargs)
        return
    device = torch._C._cuda_getDevice()  # (torch.cuda.current_device's lazy-init check: the tensors exist)
    try:
        key = _key(info, device, args, kwargs)
        hit = info.bound.get(key, False)
    except TypeError:  # an unhashable argument: Triton's path
        kernel[grid](*args, **kwargs)
        return
    if hit is False:
        compiled = kernel[grid](*args, **kwargs)
        info.bound[key] = _bind(info, compiled, len(args), kwargs) if compiled is not None else None
        return
    if hit is None:
        kernel[grid](*args, **kwargs)
        return
    run, function, coop, pdl, meta, tail = hit
    n = len(grid)
    run(
        grid[0],
        grid[1] if n > 1 else 1,
        grid[2] if n > 2 else 1,
        torch._C._cuda_getCurrentRawStream(device),
        function,
        coop,
        pdl,
        None,
        None,
        meta,
        None,
        None,
        None,
        *args,
        *tail,
    )
