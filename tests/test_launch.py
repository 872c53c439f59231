"""pcops.triton._launch: bound launches run the binary ``kernel[grid]`` would, for every
specialization Triton distinguishes (pointer alignment, ints equal to 1 / multiples of 16 /
beyond int32, constexpr values passed by position or keyword, launch options)."""

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs

from pcops.triton import _launch

from _util import interpret, requires_cuda


@triton.jit
def _axpy_kernel(
    x_ptr, y_ptr, out_ptr, n, alpha, OFFSET: tl.constexpr, BLOCK: tl.constexpr, SQUARE: tl.constexpr = False
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0)
    y = tl.load(y_ptr + i, mask=m, other=0)
    r = alpha * x + y + OFFSET
    if SQUARE:
        r = r * r
    tl.store(out_ptr + i, r, mask=m)


def test_specialization_keys():
    s = _launch._spec_runtime
    assert s(1) != s(2) and s(16) != s(17) and s(2**31) != s(2**31 - 16) and s(2**63) != s(2**62)
    assert s(32) == s(48) and s(3) == s(5)  # Triton compiles these alike
    assert s(0.5) == s(2.0) and s(True) != s(False) and s(None) == s(None)
    e = _launch._spec_exact
    assert e(1) != e(1.0) and e(1) != e(True) and e(64) == e(64)  # constexprs: type and value
    for unkeyed in ((1, 2), 2**64, object()):  # these always take Triton's path
        with pytest.raises(TypeError):
            s(unkeyed)
    x = torch.zeros(8)
    assert s(x) != s(x[1:]) and s(x) != s(x.double()) and s(x) == s(torch.ones(8))
    from triton.runtime.jit import JITFunction

    jit = _axpy_kernel if isinstance(_axpy_kernel, JITFunction) else JITFunction(_axpy_kernel.fn)
    k = _launch._Kernel(jit)
    assert [f is _launch._spec_exact for f in k.specs] == [False] * 5 + [True] * 3
    assert k.defaults == {"SQUARE": False}


def _axpy_info():
    from triton.runtime.jit import JITFunction

    jit = _axpy_kernel if isinstance(_axpy_kernel, JITFunction) else JITFunction(_axpy_kernel.fn)
    return _launch._Kernel(jit)


def _reference_key(info, device, args, kwargs):
    """The key as ``launch`` built it before ``_key``: one spec function call per argument."""
    s, e = _launch._spec_runtime, _launch._spec_exact
    return (
        device,
        len(args),
        info.fn.debug or knobs.runtime.debug,
        knobs.compilation.instrumentation_mode,
        *[f(a) for f, a in zip(info.specs, args)],
        *[(k, e(v) if info.constexpr.get(k, True) else s(v)) for k, v in kwargs.items()],
    )


def _hashed(key_fn, info, args, kwargs):
    """The key as ``launch`` uses it (hashed by the lookup), or ``TypeError`` (Triton's path)."""
    try:
        key = key_fn(info, 0, args, kwargs)
        hash(key)
        return key
    except TypeError:
        return TypeError


def test_key_as_fine_as_the_per_argument_specs():
    """Random calls of the axpy kernel, each with a twin (every runtime argument swapped for one
    with the same reference spec) and a mutant (one argument redrawn or a launch option renamed):
    two calls get equal ``_key`` keys exactly when the reference keys are equal, and the same calls
    raise ``TypeError``."""
    import random

    rng = random.Random(0)
    base = torch.zeros(64)
    tensors = [base, base[1:], base[4:], base.double(), torch.zeros(8, dtype=torch.int32), torch.nn.Parameter(base)]
    tensors += [torch.nn.Parameter(base[1:]), torch.ones(64), base[16:], base[5:]]
    ints = [0, 1, 2, 3, 5, 16, 17, 32, 48, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1]
    ints += [-(2**31) - 16, 2**62, 2**63 - 1, 2**63, 2**63 + 16, 2**64 - 1, 2**64 - 16, -(2**63), -(2**63) + 1]
    runtime = tensors + ints + [0.5, 2.0, True, False, None, "s", torch.float16]
    unkeyed = [(1, 2), [1], object(), 2**64, -(2**63) - 1]
    consts = [1, 1.0, True, False, 0, 0.0, 64, 128, None, "a", torch.float32, (1, 2)]
    options = [1, 2, 4, True, 4.0]
    spec = _launch._spec_runtime
    same = {id(v): [w for w in runtime if spec(w) == spec(v)] for v in runtime}

    def pick(pool):
        return rng.choice(unkeyed if rng.random() < 0.02 else pool)

    def draw():
        npos = rng.choice([3, 5, 5, 6, 6, 7, 8])
        args = [pick(runtime if i < 5 else consts) for i in range(npos)]
        kwargs = {}
        if npos < 6:
            kwargs["OFFSET"] = pick(consts)
        if npos < 7 and rng.random() < 0.8:
            kwargs["BLOCK"] = pick(consts)
        if npos < 8 and rng.random() < 0.5:
            kwargs["SQUARE"] = pick(consts)
        if npos == 3 and rng.random() < 0.5:
            kwargs["n"] = pick(runtime)  # a runtime parameter by keyword: its runtime spec
        for opt in ("num_warps", "num_stages", "enable_fp_fusion"):
            if rng.random() < 0.3:
                kwargs[opt] = rng.choice(options)
        items = list(kwargs.items())
        rng.shuffle(items)  # the keyword order is part of both keys
        return args, dict(items)

    calls = []
    for _ in range(250):
        args, kwargs = draw()
        twin = [rng.choice(same[id(a)]) if i < 5 and id(a) in same else a for i, a in enumerate(args)]
        twin_kw = {k: rng.choice(same[id(v)]) if k == "n" and id(v) in same else v for k, v in kwargs.items()}
        mutant, mutant_kw = list(args), dict(kwargs)
        i = rng.randrange(len(args) + len(kwargs))
        opts = [k for k in kwargs if k.islower() and k != "n"]
        if opts and rng.random() < 0.3:  # another launch option with the same value
            other = rng.choice(["num_warps", "num_stages", "enable_fp_fusion", "num_ctas"])
            mutant_kw = {other if k == opts[0] else k: v for k, v in kwargs.items()}
        elif i < len(args):
            mutant[i] = rng.choice(runtime if i < 5 else consts)
        else:
            k = list(kwargs)[i - len(args)]
            mutant_kw[k] = rng.choice(runtime if k == "n" else options if k.islower() else consts)
        calls += [(tuple(args), kwargs), (tuple(twin), twin_kw), (tuple(mutant), mutant_kw)]
    info = _axpy_info()
    ref = [_hashed(_reference_key, info, a, kw) for a, kw in calls]
    new = [_hashed(_launch._key, info, a, kw) for a, kw in calls]
    assert [r is TypeError for r in ref] == [n is TypeError for n in new]
    ok = [i for i, r in enumerate(ref) if r is not TypeError]
    assert len(ok) > len(calls) // 2
    pairs = [(i, j) for i in ok for j in ok if i < j]
    equal = sum(ref[i] == ref[j] for i, j in pairs)
    assert 200 < equal < len(pairs) // 2  # both outcomes are well covered
    for i, j in pairs:
        assert (ref[i] == ref[j]) == (new[i] == new[j]), (calls[i], calls[j])


def test_key_distinguishes_what_triton_specializes():
    info = _axpy_info()

    def key(*args, **kwargs):
        return _launch._key(info, 0, args, kwargs)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=gen)
    y = torch.randn(64, generator=gen)
    k = lambda a, **kw: key(a, y, y, 100, 0.5, **(kw or dict(OFFSET=1, BLOCK=64)))  # noqa: E731
    assert k(x) == k(y) and k(x) != k(x[1:]) and k(x) != k(x.double()) and k(x[4:]) == k(x)
    assert k(torch.nn.Parameter(x)) == k(x) and k(torch.nn.Parameter(x[1:])) == k(x[1:])
    n = lambda v, **kw: key(x, y, y, v, 0.5, OFFSET=1, BLOCK=64, **kw)  # noqa: E731
    assert n(1) != n(2) and n(16) != n(17) and n(2**31) != n(2**31 - 16) and n(2**63) != n(2**62)
    assert n(32) == n(48) and n(3) == n(5) and n(2**31 + 16) == n(2**32) and n(1) != n(True)
    assert n(-(2**31)) != n(-(2**31) - 16) and n(0) == n(-16)
    assert n(4, num_warps=4) != n(4, num_warps=4.0) and n(4, num_warps=4) != n(4, num_warps=2)
    c = lambda v: key(x, y, y, 100, 0.5, OFFSET=v, BLOCK=64)  # noqa: E731
    assert c(1) != c(1.0) and c(1) != c(True) and c(1.0) != c(True) and c(64) == c(64) and c(32) != c(48)
    assert c(64) != key(x, y, y, 100, 0.5, BLOCK=64, OFFSET=64)  # keyword order: a different key
    assert n(4, num_warps=4) != n(4, num_stages=4) and n(4, num_warps=4) == n(4, num_warps=4)
    assert key(x, y, y, 100, 0.5, 1, BLOCK=64) != key(x, y, y, 100, 0.5, 3, BLOCK=64)  # constexpr by position
    assert key(x, y, y, 100, 0.5, 1, BLOCK=64) == key(y, y, x, 116, 2.0, 1, BLOCK=64)
    # a runtime parameter by keyword is keyed by its runtime spec, not its value
    r = lambda v: key(x, y, y, n=v, alpha=0.5, OFFSET=1, BLOCK=64)  # noqa: E731
    assert r(32) == r(48) and r(3) == r(5) and r(1) != r(2) and r(16) != r(17)
    for bad in ([1], (1, 2), 2**64, -(2**63) - 1, object()):  # Triton's path
        with pytest.raises(TypeError):
            hash(n(bad))
        with pytest.raises(TypeError):
            hash(r(bad))
    with pytest.raises(TypeError):
        hash(c([1]))  # an unhashable constexpr: the lookup raises


@pytest.mark.gpu
@requires_cuda
def test_bound_launch_matches_triton_for_every_specialization():
    gen = torch.Generator(device="cuda").manual_seed(0)
    info_before = _launch._KERNELS.get(_axpy_kernel)
    cases = []
    for n in (1, 16, 17, 1000, 4096):
        for offset_x in (0, 1):  # a pointer 4 bytes past 16-byte alignment
            for block, square, warps in ((64, False, 4), (128, True, 2)):
                cases.append((n, offset_x, block, square, warps))
    for n, off, block, square, warps in cases * 2:  # the second round takes the bound path
        x = torch.randn(n + off, device="cuda", generator=gen)[off:]
        y = torch.randn(n, device="cuda", generator=gen)
        alpha = float(torch.rand((), device="cuda", generator=gen))
        grid = (triton.cdiv(n, block),)
        want = torch.empty(n, device="cuda")
        got = torch.empty(n, device="cuda")
        _axpy_kernel[grid](x, y, want, n, alpha, 3, BLOCK=block, SQUARE=square, num_warps=warps)
        # OFFSET (a constexpr) by position, as launch sites may pass it
        _launch.launch(_axpy_kernel, grid, x, y, got, n, alpha, 3, BLOCK=block, SQUARE=square, num_warps=warps)
        ref = alpha * x + y + 3
        torch.testing.assert_close(want, ref * ref if square else ref)
        assert torch.equal(got, want), (n, off, block, square, warps)
    info = _launch._KERNELS[_axpy_kernel]
    assert info_before is None or info_before is info
    bound = [v for v in info.bound.values() if v is not None]
    assert len(bound) == len(info.bound) >= len(cases) // 2  # every specialization bound directly
    # a constexpr's value is part of the key: OFFSET 3 and 4 must not share a binary
    x = torch.randn(64, device="cuda", generator=gen)
    out3, out4 = torch.empty_like(x), torch.empty_like(x)
    _launch.launch(_axpy_kernel, (1,), x, x, out3, 64, 1.0, 3, BLOCK=64)
    _launch.launch(_axpy_kernel, (1,), x, x, out4, 64, 1.0, 4, BLOCK=64)
    _launch.launch(_axpy_kernel, (1,), x, x, out3, 64, 1.0, 3, BLOCK=64)
    _launch.launch(_axpy_kernel, (1,), x, x, out4, 64, 1.0, 4, BLOCK=64)
    torch.testing.assert_close(out4 - out3, torch.ones_like(x))


@pytest.mark.gpu
@requires_cuda
def test_bound_launch_records_in_a_cuda_graph():
    x = torch.randn(300, device="cuda")
    out = torch.empty_like(x)
    for _ in range(2):  # bind before the capture
        _launch.launch(_axpy_kernel, (3,), x, x, out, 300, 2.0, 0, BLOCK=128)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _launch.launch(_axpy_kernel, (3,), x, x, out, 300, 2.0, 0, BLOCK=128)
    out.zero_()
    x.copy_(torch.arange(300.0, device="cuda"))
    g.replay()
    torch.testing.assert_close(out, 3 * torch.arange(300.0, device="cuda"))


@pytest.mark.gpu
@requires_cuda
def test_profiler_hooks_take_tritons_path():
    from triton import knobs

    seen = []
    hook = lambda meta: seen.append(meta)  # noqa: E731
    x = torch.randn(64, device="cuda")
    out = torch.empty_like(x)
    _launch.launch(_axpy_kernel, (1,), x, x, out, 64, 1.0, 0, BLOCK=64)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _launch.launch(_axpy_kernel, (1,), x, x, out, 64, 1.0, 0, BLOCK=64)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 1


@interpret
@pytest.mark.parametrize("n", [5, 130])
def test_interpreter_path(n):
    """Under TRITON_INTERPRET=1 ``launch`` is ``kernel[grid]`` (the kernels run on the CPU)."""
    x = torch.randn(n)
    out = torch.empty_like(x)
    _launch.launch(_axpy_kernel, (triton.cdiv(n, 64),), x, x, out, n, 0.5, 1, BLOCK=64)
    torch.testing.assert_close(out, 1.5 * x + 1)
