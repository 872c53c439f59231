"""pcops.triton._launch: bound launches run the binary ``kernel[grid]`` would, for every
specialization Triton distinguishes (pointer alignment, ints equal to 1 / multiples of 16 /
beyond int32, constexpr values passed by position or keyword, launch options)."""

import pytest
import torch
import triton
import triton.language as tl

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
