"""pcops.pillar_scatter: reference vs Triton/CUDA, gradients, the backend contract, registration,
bad input."""

import logging

import pytest
import torch

import pcops
from pcops.reference import pillar_scatter as ref
from _util import generator, interpret, requires_cuda, run_compiler_script


def make_pillars(
    num_pillars, channels, batch_size, grid_h, grid_w, seed, dtype=torch.float32, unique=True, device="cpu"
):
    g = generator(seed)
    cells = batch_size * grid_h * grid_w
    if unique:
        lin = torch.randperm(cells, generator=g)[:num_pillars]
    else:
        lin = torch.randint(0, cells, (num_pillars,), generator=g)
    b, rest = lin // (grid_h * grid_w), lin % (grid_h * grid_w)
    coords = torch.stack([b, torch.zeros_like(b), rest // grid_w, rest % grid_w], 1).to(torch.int32)
    features = torch.randn(num_pillars, channels, generator=g).to(dtype)
    return features.to(device), coords.to(device)


def dense_oracle(features, coords, batch_size, grid_h, grid_w):
    """Sequential assignment in pillar order: the last pillar written to a cell wins."""
    canvas = features.new_zeros(batch_size, features.shape[1], grid_h, grid_w)
    for p in range(features.shape[0]):
        b, _, y, x = coords[p].tolist()
        canvas[b, :, y, x] = features[p]
    return canvas


@pytest.mark.parametrize(
    "num_pillars,channels,batch_size,hw",
    [
        (0, 4, 1, (3, 5)),
        (1, 1, 1, (1, 1)),
        (7, 3, 2, (5, 3)),
        (31, 64, 3, (13, 17)),
    ],
)
def test_reference_matches_sequential_assignment(num_pillars, channels, batch_size, hw):
    for unique in (True, False):
        f, c = make_pillars(num_pillars, channels, batch_size, *hw, seed=num_pillars, unique=unique)
        out = pcops.pillar_scatter(f, c, batch_size, hw)
        torch.testing.assert_close(out, dense_oracle(f, c, batch_size, *hw), rtol=0, atol=0)


def test_numpy_scalars_accepted():
    np = pytest.importorskip("numpy")
    f, c = make_pillars(5, 3, 2, 4, 6, seed=11)
    out = pcops.pillar_scatter(f, c, np.int64(2), (np.int32(4), np.int64(6)))
    assert torch.equal(out, pcops.pillar_scatter(f, c, 2, (4, 6)))


def test_duplicates_highest_index_wins_and_gets_gradient():
    f = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    c = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.int32)
    out = pcops.pillar_scatter(f, c, 1, (2, 2))
    assert torch.equal(out[0, :, 1, 1], f[1].detach())
    out.sum().backward()
    assert torch.equal(f.grad, torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]], dtype=torch.float64))


def test_gradcheck_reference():
    f, c = make_pillars(9, 3, 2, 4, 5, seed=3, dtype=torch.float64, unique=False)
    f.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: pcops.pillar_scatter(x, c, 2, (4, 5)), (f,))
    assert torch.autograd.gradgradcheck(lambda x: pcops.pillar_scatter(x, c, 2, (4, 5)), (f,))


def test_opcheck():
    f, c = make_pillars(11, 5, 2, 6, 7, seed=4, unique=False)
    torch.library.opcheck(torch.ops.pcops.pillar_scatter, (f, c, 2, 6, 7, "auto"))
    torch.library.opcheck(torch.ops.pcops.pillar_scatter, (f.double().requires_grad_(), c, 2, 6, 7, "reference"))
    canvas = torch.randn(2, 5, 6, 7)
    winner = ref.pillar_winner_map(c, 2, 6, 7)
    torch.library.opcheck(torch.ops.pcops.pillar_gather, (canvas, c, winner, "auto"))


def test_backend_contract_cpu(caplog):
    """ "reference" equals "auto" on CPU tensors (forward and backward); a GPU backend on CPU
    tensors raises, naming the argument; the debug log says what ran."""
    f, c = make_pillars(9, 4, 2, 5, 6, seed=6, unique=False)
    fa, fr = f.clone().requires_grad_(True), f.clone().requires_grad_(True)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        out = pcops.pillar_scatter(fr, c, 2, (5, 6), backend="reference")
        out.sum().backward()
    assert [r.getMessage() for r in caplog.records] == ["pillar_scatter: reference", "pillar_gather: reference"]
    pcops.pillar_scatter(fa, c, 2, (5, 6)).sum().backward()
    assert torch.equal(out, pcops.pillar_scatter(f, c, 2, (5, 6))) and torch.equal(fa.grad, fr.grad)
    for backend in ("triton", "cuda"):
        with pytest.raises(ValueError, match="backend.*CUDA tensors"):
            pcops.pillar_scatter(f, c, 2, (5, 6), backend=backend)
    with pytest.raises(TypeError, match="backend"):
        pcops.pillar_scatter(f, c, 2, (5, 6), backend=None)


def test_torch_compile_fullgraph():
    f, c = make_pillars(13, 4, 2, 6, 5, seed=5)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def net(features, coords):
        return pcops.pillar_scatter(features * 2, coords, 2, (6, 5)).relu().sum(1)

    torch.testing.assert_close(net(f, c), pcops.pillar_scatter(f * 2, c, 2, (6, 5)).relu().sum(1))


@pytest.mark.parametrize(
    "bad,exc,name",
    [
        (dict(features=torch.zeros(3, 2, dtype=torch.int32)), TypeError, "features"),
        (dict(features=torch.zeros(3)), ValueError, "features"),
        (dict(coords=torch.zeros(3, 4)), TypeError, "coords"),
        (dict(coords=torch.zeros(3, 3, dtype=torch.int32)), ValueError, "coords"),
        (dict(coords=torch.zeros(2, 4, dtype=torch.int32)), ValueError, "coords"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(batch_size=1.0), TypeError, "batch_size"),
        (dict(grid_hw=(0, 4)), ValueError, "grid_hw"),
        (dict(grid_hw=(-2, 4)), ValueError, "grid_hw"),
        (dict(grid_hw=4), TypeError, "grid_hw"),
        (
            dict(coords=torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.int32)),
            ValueError,
            "coords",
        ),
        (
            dict(coords=torch.tensor([[0, 0, 4, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.int32)),
            ValueError,
            "coords",
        ),
        (dict(backend="cpp"), ValueError, "backend"),
        (dict(coords=torch.zeros(3, 4, dtype=torch.int32, device="meta")), ValueError, "coords"),
    ],
)
def test_bad_input(bad, exc, name):
    args = dict(features=torch.zeros(3, 2), coords=torch.zeros(3, 4, dtype=torch.int32), batch_size=1, grid_hw=(4, 4))
    args.update(bad)
    with pytest.raises(exc, match=name):
        pcops.pillar_scatter(**args)


# --- Triton kernels under the CPU interpreter ----------------------------------------------


@pytest.mark.parametrize(
    "num_pillars,channels,batch_size,hw",
    [(0, 3, 1, (2, 3)), (1, 1, 1, (1, 1)), (23, 5, 2, (7, 11)), (40, 17, 1, (9, 8))],
)
@pytest.mark.parametrize("unique", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@interpret
def test_triton_interpreter(num_pillars, channels, batch_size, hw, unique, dtype):
    from pcops.triton import pillar_scatter as tri

    f, c = make_pillars(num_pillars, channels, batch_size, *hw, seed=num_pillars + channels, dtype=dtype, unique=unique)
    canvas, winner = tri.pillar_scatter(f, c, batch_size, *hw)
    ref_canvas, ref_winner = ref.pillar_scatter(f, c, batch_size, *hw)
    assert torch.equal(winner, ref_winner)
    assert torch.equal(canvas, ref_canvas)
    # channel slices (grid axis 2) with a partial last slice
    sliced, _ = tri.pillar_scatter(f, c, batch_size, *hw, block_hw=16, block_c=2, c_per_program=4)
    assert torch.equal(sliced, ref_canvas)
    grad = torch.randn(canvas.shape, generator=generator(1)).to(dtype)
    expected = ref.pillar_gather(grad, c, winner)
    assert torch.equal(tri.pillar_gather(grad, c, winner), expected)
    assert torch.equal(tri.pillar_gather(grad, c, winner, block_hw=16, block_c=4), expected)


@interpret
def test_triton_interpreter_skips_out_of_grid():
    from pcops.triton import pillar_scatter as tri

    f = torch.arange(8.0).view(4, 2)
    c = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 2, 0], [0, 0, 1, -1]], dtype=torch.int32)
    canvas, winner = tri.pillar_scatter(f, c, 1, 2, 2)
    assert winner.tolist() == [0, -1, -1, -1]
    assert canvas.abs().sum() == f[0].sum()
    assert tri.pillar_gather(canvas, c, winner)[1:].abs().sum() == 0
    assert torch.equal(tri.pillar_gather(canvas, c, winner), ref.pillar_gather(canvas, c, winner))


_AOT_SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import pillar_scatter as ps

I32 = "i32"
kernels = [
    # batch_size = 1 is specialised to a constant by a real launch: compile that case too
    (ps._pillar_winner_kernel, dict(coords_ptr="*i32", winner_ptr="*i32", num_pillars=I32, batch_size="constexpr",
                                   grid_h=I32, grid_w=I32, BLOCK="constexpr"), dict(batch_size=1, BLOCK=256)),
    (ps._pillar_canvas_kernel, dict(features_ptr="*fp16", winner_ptr="*i32", canvas_ptr="*fp16", num_channels=I32,
                                   hw=I32, BLOCK_C="constexpr", BLOCK_HW="constexpr", C_PER_PROGRAM="constexpr"),
     dict(BLOCK_C=16, BLOCK_HW=512, C_PER_PROGRAM=32)),
    (ps._pillar_gather_cells_kernel, dict(canvas_ptr="*fp32", winner_ptr="*i32", out_ptr="*fp32", num_channels=I32,
                                         hw=I32, BLOCK_C="constexpr", BLOCK_HW="constexpr"),
     dict(BLOCK_C=16, BLOCK_HW=256)),
]
for fn, sig, consts in kernels:
    triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print("compiled")
"""


def test_triton_kernels_compile_for_sm90():
    """The real Triton compiler accepts every kernel (sm_90, no GPU needed)."""
    run_compiler_script(_AOT_SCRIPT, timeout=300)


# --- the GPU paths --------------------------------------------------------------------------


def _cuda_backward_applies(t):
    """The CUDA C++ backward takes this canvas (else ``backend="cuda"`` raises in the backward)."""
    from pcops.cuda import pillar_scatter as cu

    return cu.gather_supported(t)


@pytest.mark.parametrize("backend", ["auto", "triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "num_pillars,channels,batch_size,hw",
    [
        (0, 64, 1, (496, 432)),
        (1, 3, 1, (5, 7)),
        (16000, 64, 1, (496, 432)),
        (997, 13, 3, (37, 41)),
        (997, 20, 3, (37, 40)),
    ],
)
@pytest.mark.gpu
@requires_cuda
def test_gpu_matches_reference(backend, dtype, num_pillars, channels, batch_size, hw):
    for unique in (True, False):
        f, c = make_pillars(num_pillars, channels, batch_size, *hw, seed=7, dtype=dtype, unique=unique)
        expected = pcops.pillar_scatter(f, c, batch_size, hw)
        fg = f.cuda().requires_grad_(True)
        out = pcops.pillar_scatter(fg, c.cuda(), batch_size, hw, backend=backend)
        assert torch.equal(out.cpu(), expected)
        grad = torch.randn(out.shape, generator=generator(2)).to(dtype)
        if backend == "cuda" and not _cuda_backward_applies(out):
            with pytest.raises(ValueError, match="backend: the 'cuda' backward"):
                out.backward(grad.cuda())
            continue
        out.backward(grad.cuda())
        fr = f.clone().requires_grad_(True)
        pcops.pillar_scatter(fr, c, batch_size, hw).backward(grad)
        assert torch.equal(fg.grad.cpu(), fr.grad)


@pytest.mark.parametrize("backend", ["auto", "cuda", "triton"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_backward_kernels(backend):
    """Each backward (auto: the CUDA quads where they apply, else Triton; the CUDA quads; the
    Triton stream) equals the reference gather: duplicates (losers get 0), out-of-grid pillars,
    channel slices with a partial last one (C = 20), shapes the quad kernels do not take (C = 13,
    H*W odd, float16: "cuda" raises) and misaligned views (offset by one element)."""
    from pcops.triton import pillar_scatter as tri

    cases = [
        (16000, 64, 1, (496, 432), torch.float32),
        (997, 20, 3, (37, 40), torch.float32),
        (997, 13, 3, (37, 41), torch.float32),
        (500, 64, 2, (20, 30), torch.float16),
    ]
    for num_pillars, channels, batch_size, hw, dtype in cases:
        for misaligned in (False, True):
            f, c = make_pillars(num_pillars, channels, batch_size, *hw, seed=11, dtype=dtype, unique=False)
            c = c.clone()
            c[::13, 3] = -1  # out of the grid: no cell, zero gradient
            winner = tri.pillar_winner_map(c.cuda(), batch_size, *hw).cpu()  # the reference refuses out-of-grid rows
            grad = torch.randn((batch_size, channels, *hw), generator=generator(3)).to(dtype)
            expected = ref.pillar_gather(grad, c, winner)
            g = grad.cuda()
            if misaligned:
                g = torch.cat([torch.zeros(1, dtype=dtype, device="cuda"), g.flatten()])[1:].view(g.shape)
            if backend == "cuda" and not _cuda_backward_applies(g):
                with pytest.raises(ValueError, match="backend: the 'cuda' backward"):
                    torch.ops.pcops.pillar_gather(g, c.cuda(), winner.cuda(), backend)
                continue
            got = torch.ops.pcops.pillar_gather(g, c.cuda(), winner.cuda(), backend)
            assert torch.equal(got.cpu(), expected), (num_pillars, channels, hw, dtype, misaligned)
    # the forward's quad kernel on a misaligned feature view (falls back to the one-cell kernel)
    f, c = make_pillars(300, 64, 1, 20, 30, seed=12, unique=False)
    fm = torch.cat([torch.zeros(1), f.flatten()])[1:].view(f.shape)
    got = pcops.pillar_scatter(fm.cuda(), c.cuda(), 1, (20, 30), backend="cuda")
    assert torch.equal(got.cpu(), pcops.pillar_scatter(f, c, 1, (20, 30)))


@pytest.mark.gpu
@requires_cuda
def test_gpu_out_of_grid_is_skipped_and_cuda_graph_capture():
    f, c = make_pillars(500, 8, 2, 20, 30, seed=8, device="cuda")
    c_bad = c.clone()
    c_bad[::7, 2] += 100  # out of the grid: skipped, never written
    for backend in ("triton", "cuda"):
        out = pcops.pillar_scatter(f, c_bad, 2, (20, 30), backend=backend)
        keep = torch.ones(500, dtype=torch.bool, device="cuda")
        keep[::7] = False
        torch.testing.assert_close(
            out, pcops.pillar_scatter(f[keep], c[keep], 2, (20, 30), backend=backend), rtol=0, atol=0
        )
        static_f = f.clone()
        pcops.pillar_scatter(static_f, c, 2, (20, 30), backend=backend)  # warm-up / compile outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = pcops.pillar_scatter(static_f, c, 2, (20, 30), backend=backend)
        static_f.copy_(torch.randn_like(f))
        graph.replay()
        torch.testing.assert_close(static_out, pcops.pillar_scatter(static_f, c, 2, (20, 30)), rtol=0, atol=0)


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck():
    f, c = make_pillars(50, 6, 2, 8, 9, seed=9, device="cuda", unique=False)
    torch.library.opcheck(torch.ops.pcops.pillar_scatter, (f, c, 2, 8, 9, "triton"))
    torch.library.opcheck(torch.ops.pcops.pillar_scatter, (f, c, 2, 8, 9, "cuda"))
    torch.library.opcheck(torch.ops.pcops.pillar_scatter, (f.double(), c, 2, 8, 9, "auto"))  # the reference


@pytest.mark.gpu
@requires_cuda
def test_gpu_auto_backward_takes_the_cuda_quads(caplog, monkeypatch):
    """backend="auto" runs the CUDA C++ backward where it applies (a resolve that answered
    "triton" for "auto" once sent every auto backward to the slower Triton stream)."""
    from pcops import _backend

    f, c = make_pillars(2000, 64, 1, 64, 64, seed=12)
    f = f.cuda().requires_grad_(True)
    monkeypatch.setattr(pcops._native, "MODULE", None)  # the Python path logs its kernels (not the native one)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.pillar_scatter(f, c.cuda(), 1, (64, 64)).sum().backward()
    expected = "cuda" if _backend.nvrtc_available() else "triton"
    assert f"pillar_gather: {expected}" in [r.getMessage() for r in caplog.records]
