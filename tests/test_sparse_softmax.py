"""pcops.sparse_softmax: softmax over the stored values of CSR rows.

Oracles: a per-row dense softmax in float64 and ``torch.sparse.softmax``; the hand-written
backward of the reference is checked with float64 ``gradcheck``; the Triton kernels under the
interpreter and every kernel on the GPU against the reference.
"""

import math

import pytest
import torch

import pcops
from pcops.reference import sparse_softmax as ref
from _fused_util import (
    AWKWARD_LENGTHS,
    GRAD_TOL,
    TOL,
    _fixed_triton_configs,  # noqa: F401  (a fixture)
    dense_softmax_oracle,  # noqa: F401
    watch_kernels,
    kernels_run,
    make_csr,
)
from _util import generator, interpret, requires_cuda, run_compiler_script

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta", "ignore:Sparse invariant checks")


# --- reference (CPU) ------------------------------------------------------------------------


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_softmax_reference(index_dtype, dtype):
    values, crow = make_csr(AWKWARD_LENGTHS, seed=15, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12))
    out = pcops.sparse_softmax(values, crow)
    assert out.dtype == dtype and out.shape == values.shape
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), dense_softmax_oracle(values, crow), **TOL[dtype])
    assert out[int(crow[12]) : int(crow[13])].abs().sum() == 0  # an all −inf row → zeros
    assert torch.equal(pcops.sparse_softmax(values, crow, backend="reference"), out)


def test_sparse_softmax_edge_cases():
    assert pcops.sparse_softmax(torch.zeros(0), torch.zeros(1, dtype=torch.int64)).shape == (0,)
    assert pcops.sparse_softmax(torch.zeros(0), torch.zeros(4, dtype=torch.int64)).shape == (0,)
    one = pcops.sparse_softmax(torch.tensor([-5.0, 7.0, -math.inf]), torch.tensor([0, 1, 2, 3]))
    assert one.tolist() == [1.0, 1.0, 0.0]
    big = pcops.sparse_softmax(torch.tensor([1000.0, 1000.0, -1000.0]), torch.tensor([0, 3]))
    torch.testing.assert_close(big, torch.tensor([0.5, 0.5, 0.0]))


def test_sparse_softmax_matches_torch_sparse_softmax():
    values, crow = make_csr([4, 1, 9, 2], seed=16)
    values = values.clamp_min(-50)  # torch.sparse.softmax over stored −inf is not our concern here
    lengths = crow[1:] - crow[:-1]
    cols = torch.cat([torch.arange(int(n)) for n in lengths])
    csr = torch.sparse_csr_tensor(crow, cols, values, (4, 9))
    expected = torch.sparse.softmax(csr.to_sparse_coo(), dim=1).coalesce().values()
    torch.testing.assert_close(pcops.sparse_softmax(values, crow), expected)
    out = pcops.sparse_softmax(csr)
    assert out.layout == torch.sparse_csr and out.shape == csr.shape
    assert torch.equal(out.crow_indices(), crow) and torch.equal(out.col_indices(), cols)
    torch.testing.assert_close(out.values(), expected)


def test_sparse_softmax_gradients():
    values, crow = make_csr(AWKWARD_LENGTHS, seed=17, dtype=torch.float64, neg_inf_rows=(6,))
    finite = values.clamp_min(-30).requires_grad_(True)  # gradcheck needs finite perturbations
    assert torch.autograd.gradcheck(lambda v: pcops.sparse_softmax(v, crow), (finite,))
    v = values.clone().requires_grad_(True)
    y = pcops.sparse_softmax(v, crow)
    g = torch.randn(y.shape, dtype=torch.float64, generator=generator(3))
    y.backward(g)
    row = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow[1:] - crow[:-1])
    dot = torch.zeros(crow.numel() - 1, dtype=torch.float64).index_add_(0, row, g * y.detach())
    torch.testing.assert_close(v.grad, y.detach() * (g - dot[row]))


def test_opcheck():
    values, crow = make_csr(AWKWARD_LENGTHS, seed=20)
    for backend in ("auto", "reference"):
        torch.library.opcheck(torch.ops.pcops.sparse_softmax, (values, crow, backend))
        torch.library.opcheck(
            torch.ops.pcops.sparse_softmax, (values.clamp_min(-30).double().requires_grad_(), crow, backend)
        )
        torch.library.opcheck(
            torch.ops.pcops.sparse_softmax_backward, (torch.randn_like(values), values.softmax(0), crow, backend)
        )


def test_torch_compile_fullgraph():
    values, crow = make_csr([3, 0, 5, 1], seed=22)
    net = lambda v, crow: pcops.sparse_softmax(v * 0.5, crow, validate=False)  # noqa: E731
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(values, crow), net(values, crow))
    a, e = values.clone().requires_grad_(True), values.clone().requires_grad_(True)
    (compiled(a, crow) * torch.arange(values.numel())).sum().backward()
    (net(e, crow) * torch.arange(values.numel())).sum().backward()
    torch.testing.assert_close(a.grad, e.grad)


@pytest.mark.parametrize(
    "values,crow,exc,name",
    [
        (torch.zeros(4, dtype=torch.int32), torch.tensor([0, 4]), TypeError, "values"),
        (torch.zeros(2, 2), torch.tensor([0, 4]), ValueError, "values"),
        (torch.zeros(4), torch.tensor([0.0, 4.0]), TypeError, "crow_indices"),
        (torch.zeros(4), torch.tensor([0, 3]), ValueError, "crow_indices"),  # does not end at nnz
        (torch.zeros(4), torch.tensor([0, 3, 2, 4]), ValueError, "crow_indices"),  # not monotone
        (torch.zeros(4), torch.tensor([1, 4]), ValueError, "crow_indices"),  # does not start at 0
        (torch.zeros(4), torch.zeros(0, dtype=torch.int64), ValueError, "crow_indices"),
        (torch.zeros(4), None, TypeError, "crow_indices"),
    ],
)
def test_bad_input_sparse(values, crow, exc, name):
    with pytest.raises(exc, match=name):
        pcops.sparse_softmax(values, crow)


def test_bad_input_backend_and_csr():
    with pytest.raises(ValueError, match="backend"):
        pcops.sparse_softmax(torch.zeros(4), torch.tensor([0, 4]), backend="cpp")
    with pytest.raises(TypeError, match="backend"):
        pcops.sparse_softmax(torch.zeros(4), torch.tensor([0, 4]), backend=None)
    for gpu_backend in ("triton", "cuda"):  # an explicit GPU backend on CPU tensors: no silent fallback
        with pytest.raises(ValueError, match="backend.*CUDA"):
            pcops.sparse_softmax(torch.zeros(4), torch.tensor([0, 4]), backend=gpu_backend)
    csr = torch.eye(3).to_sparse_csr()
    with pytest.raises(ValueError, match="crow_indices"):
        pcops.sparse_softmax(csr, csr.crow_indices())


def test_reference_logged(caplog):
    watch_kernels(caplog)
    pcops.sparse_softmax(torch.zeros(4), torch.tensor([0, 4]))
    assert kernels_run(caplog, "sparse_softmax") == ["reference"]


# --- Triton kernels under the CPU interpreter (tiny shapes) ---------------------------------

# launcher configs: the mean-length default, a tiny capacity (sub 4 × vpt 2 = 8: most rows loop
# over chunks), a warp per row, and 2 rows per thread (block_r 8 with 1 warp of 4 groups)
CSR_CASES = [{}, dict(sub=4, vpt=2), dict(sub=32, vpt=4, num_warps=2), dict(sub=8, vpt=8, block_r=8, num_warps=1)]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("config", CSR_CASES)
@interpret
def test_triton_sparse_softmax_interpreter(index_dtype, dtype, config):
    from pcops.triton import sparse_softmax as tri

    values, crow = make_csr(AWKWARD_LENGTHS, seed=25, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12))
    y = tri.sparse_softmax(values, crow, **config)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y, ref.sparse_softmax(values, crow), **TOL[dtype])
    g = torch.randn(values.shape, generator=generator(4)).to(dtype)
    torch.testing.assert_close(
        tri.sparse_softmax_backward(g, y, crow, **config), ref.sparse_softmax_backward(g, y, crow), **GRAD_TOL[dtype]
    )


@interpret
def test_triton_sparse_softmax_interpreter_chunks():
    """Rows longer than a chunk whose first chunk is all −inf, or whose max comes late (the kernel
    rescales its first chunk's exponentials to the final max)."""
    from pcops.triton import sparse_softmax as tri

    rows = [
        torch.cat([torch.full((8,), -math.inf), torch.randn(5, generator=generator(5))]),  # first chunk −inf
        torch.cat([torch.full((16,), -math.inf), torch.randn(3, generator=generator(6))]),
        torch.cat([torch.randn(9, generator=generator(7)), torch.tensor([80.0, -3.0])]),  # late max
        torch.cat([torch.tensor([60.0]), torch.randn(20, generator=generator(8)) - 100]),  # early max
        torch.full((12,), -math.inf),
    ]
    values = torch.cat(rows)
    crow = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    y = tri.sparse_softmax(values, crow, sub=4, vpt=2)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.double(), dense_softmax_oracle(values, crow), atol=1e-6, rtol=1e-5)


def test_triton_group_shape_choice():
    from pcops.cuda import sparse_softmax as cu
    from pcops.triton import sparse_softmax as tri

    for rows, nnz in ((120000, 120000 * 65 // 2), (100, 800), (100, 6000), (100, 100000), (0, 0)):
        # the same group shape as the CUDA C++ launcher picks
        assert "g%dx%d" % tri._group_shape(rows, nnz) == cu.choose_variant(rows, nnz)
    keep = tri._prune_grouped(tri._GROUPED_CONFIGS, {}, SUB=8)
    assert {(c.kwargs["BLOCK_R"], c.num_warps) for c in keep} == {(16, 4), (32, 4), (32, 8), (64, 8)}


@interpret
def test_triton_sparse_softmax_interpreter_clamps_bad_crow():
    from pcops.triton import sparse_softmax as tri

    values = torch.randn(6)
    # decreasing and past nnz: row 1 is empty, row 2 is clamped to [2, 6); nothing out of bounds
    y = tri.sparse_softmax(values, torch.tensor([0, 4, 2, 100]))
    assert bool(((y >= 0) & (y <= 1)).all())
    torch.testing.assert_close(y[4:], torch.softmax(values[2:6], 0)[2:])


def test_cuda_softmax_group_choice():
    from pcops.cuda import sparse_softmax as cu

    assert cu.choose_variant(120000, 120000 * 65 // 2) == "g8x8"  # Q1: lengths 1..64, 4 rows per warp
    assert cu.choose_variant(100, 800) == "g4x8"  # mean 8: lengths ≤ 32, 8 rows per warp
    assert cu.choose_variant(100, 6000) == "g16x8"  # mean 60: ≤ 128, 2 rows per warp
    assert cu.choose_variant(100, 100000) == "g32x4"  # long rows: a warp per row, the block beyond 128
    assert cu.choose_variant(0, 0) == "g4x8"
    for name, (sub, vpt) in cu.VARIANTS.items():
        assert name == f"g{sub}x{vpt}" and 32 % sub == 0
    with pytest.raises(ValueError, match="variant"):
        cu._plan(10, 10, "g2x2")


def test_cuda_source_entry_points():
    """The launcher's kernel names are the .cu file's entry points: one per direction and value type."""
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "csrc" / "sparse_softmax.cu").read_text()
    suffixes = re.findall(r"^PCOPS_SOFTMAX_ENTRY\((\w+), \d\)", src, flags=re.M)
    assert sorted(suffixes) == ["bf16", "f16", "f32"]


# --- the GPU paths --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.gpu
@requires_cuda
def test_gpu_sparse_softmax(backend, dtype, index_dtype):
    g = generator(30)
    lengths = AWKWARD_LENGTHS + [1000, 0, 129, 128, 127, 5000] + torch.randint(0, 70, (3000,), generator=g).tolist()
    values, crow = make_csr(lengths, seed=31, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12, 15))
    expected = ref.sparse_softmax(values, crow)
    vc = values.cuda().requires_grad_(True)
    y = pcops.sparse_softmax(vc, crow.cuda(), backend=backend)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.cpu(), expected, **TOL[dtype])
    gy = torch.randn(values.shape, generator=g).to(dtype)
    y.backward(gy.cuda())
    torch.testing.assert_close(
        vc.grad.cpu(), ref.sparse_softmax_backward(gy, y.detach().cpu(), crow), **GRAD_TOL[dtype]
    )


# every CUDA C++ group shape and every Triton group shape (fixed configs) in float32 / int64;
# the Q1 shape also in bfloat16 / int32
F32, BF16 = (torch.float32, torch.int64), (torch.bfloat16, torch.int32)
SOFTMAX_GPU_CASES = (
    [("cuda", dict(variant=v), F32) for v in ("g32x4", "g4x8", "g8x8", "g16x8")]
    + [("cuda", dict(variant="g8x8"), BF16)]
    + [("triton", dict(sub=s, vpt=v, num_warps=4), F32) for s, v in ((4, 8), (8, 8), (16, 8), (32, 4))]
    + [("triton", dict(sub=8, vpt=8, num_warps=4), BF16)]
)


@pytest.mark.parametrize("backend,config,types", SOFTMAX_GPU_CASES)
@pytest.mark.gpu
@requires_cuda
def test_gpu_softmax_groups(backend, config, types):
    """Every group shape against the reference: rows at and around each capacity (32, 64, 128),
    long rows, empty and all −inf rows, groups of a warp with mixed lengths."""
    if backend == "cuda":
        from pcops.cuda import sparse_softmax as impl
    else:
        from pcops.triton import sparse_softmax as impl

    dtype, index_dtype = types
    g = generator(36)
    lengths = (
        AWKWARD_LENGTHS
        + [31, 32, 33, 63, 64, 65, 127, 128, 129, 257, 1000, 0, 5000]
        + torch.randint(0, 70, (2000,), generator=g).tolist()
    )
    values, crow = make_csr(lengths, seed=37, dtype=dtype, index_dtype=index_dtype, neg_inf_rows=(6, 12))
    vc, cc = values.cuda(), crow.cuda()
    y = impl.sparse_softmax(vc, cc, **config)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.cpu(), ref.sparse_softmax(values, crow), **TOL[dtype])
    gy = torch.randn(values.shape, generator=g).to(dtype)
    dx = impl.sparse_softmax_backward(gy.cuda(), y, cc, **config)
    torch.testing.assert_close(dx.cpu(), ref.sparse_softmax_backward(gy, y.cpu(), crow), **GRAD_TOL[dtype])


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.gpu
@requires_cuda
def test_gpu_sparse_softmax_q1_graph_and_csr_tensor(backend):
    torch.manual_seed(0)
    lengths = torch.randint(1, 65, (120000,))
    crow = torch.zeros(120001, dtype=torch.int64)
    crow[1:] = lengths.cumsum(0)
    values = torch.randn(int(crow[-1]))
    crow_c, values_c = crow.cuda(), values.cuda()
    y = pcops.sparse_softmax(values_c, crow_c, backend=backend, validate=True)
    torch.testing.assert_close(y.cpu(), ref.sparse_softmax(values, crow), atol=1e-6, rtol=1e-5)
    static = values_c.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pcops.sparse_softmax(static, crow_c, backend=backend)
    static.mul_(2)
    graph.replay()
    torch.testing.assert_close(out, pcops.sparse_softmax(values_c * 2, crow_c, backend=backend))
    cols = torch.cat([torch.arange(int(n)) for n in lengths[:50]])
    csr = torch.sparse_csr_tensor(crow[:51], cols, values[: int(crow[50])], (50, 64)).cuda()
    out_csr = pcops.sparse_softmax(csr, backend=backend)
    assert out_csr.layout == torch.sparse_csr
    torch.testing.assert_close(out_csr.values().cpu(), ref.sparse_softmax(values[: int(crow[50])], crow[:51]))
    with pytest.raises(ValueError, match="crow_indices"):
        pcops.sparse_softmax(values_c, crow_c[:-1], backend=backend, validate=True)


@pytest.mark.gpu
@requires_cuda
def test_gpu_backends_logged_and_float64(caplog):
    """auto → Triton (float64 → the reference), explicit backends run what they name or raise."""
    watch_kernels(caplog)
    values, crow = make_csr([3, 0, 7], seed=33, device="cuda")
    pcops.sparse_softmax(values, crow)
    pcops.sparse_softmax(values, crow, backend="cuda")
    pcops.sparse_softmax(values, crow, backend="reference")
    ran = kernels_run(caplog, "sparse_softmax")
    assert ran[0].startswith("_sparse_softmax_grouped_kernel") and ran[1].startswith("sparse_softmax_fwd_f32")
    assert ran[2] == "reference"
    v64 = values.double()
    torch.testing.assert_close(pcops.sparse_softmax(v64, crow).cpu(), dense_softmax_oracle(v64, crow))
    for backend in ("triton", "cuda"):
        with pytest.raises(TypeError, match="float64"):
            pcops.sparse_softmax(v64, crow, backend=backend)


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck():
    values, crow = make_csr(AWKWARD_LENGTHS, seed=35, device="cuda")
    for backend in ("auto", "triton", "cuda", "reference"):
        torch.library.opcheck(torch.ops.pcops.sparse_softmax, (values, crow, backend))


@pytest.mark.gpu
@requires_cuda
def test_gpu_autotuned_paths():
    """The autotuned Triton launcher (the other GPU tests run fixed configs), a Q1-like softmax on both backends."""
    lengths = torch.randint(1, 65, (3000,), generator=generator(42)).tolist()
    values, crow = make_csr(lengths, seed=43)
    gy = torch.randn(values.shape, generator=generator(44))
    for backend in ("triton", "cuda"):
        vc = values.cuda().requires_grad_(True)
        out = pcops.sparse_softmax(vc, crow.cuda(), backend=backend)
        out.backward(gy.cuda())
        torch.testing.assert_close(out.detach().cpu(), ref.sparse_softmax(values, crow), **TOL[torch.float32])
        torch.testing.assert_close(
            vc.grad.cpu(), ref.sparse_softmax_backward(gy, out.detach().cpu(), crow), **GRAD_TOL[torch.float32]
        )


# --- the kernels compile for sm_90 (no GPU needed) ------------------------------------------

_AOT_SCRIPT = r"""
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import sparse_softmax as f

sig = dict(values_ptr="*fp32", crow_ptr="*i64", out_ptr="*fp32", grad_ptr="*bf16", y_ptr="*bf16", dx_ptr="*bf16",
           rows="i32", nnz="i32", AVG_LEN="i32")
for fn in (f._sparse_softmax_grouped_kernel, f._sparse_softmax_grouped_bwd_kernel):
    for sub, vpt in f._GROUP_SHAPES:
        for warps in (2, 8):
            consts = dict(SUB=sub, VPT=vpt, BLOCK_R=32 // sub * warps)
            full = {a: "constexpr" if a in consts else sig[a] for a in fn.arg_names}
            k = triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": warps})
            ttgir = k.asm["ttgir"]
            tpw = [m.group(1) for m in re.finditer(r"#blocked\d* = #ttg.blocked<\{sizePerThread = \[1, 1, 1\], "
                                                   r"threadsPerWarp = \[([0-9, ]+)\]", ttgir)]
            print(fn.__name__, sub, warps, "tpw=" + "|".join(t.replace(" ", "") for t in tpw),
                  "convert=%d" % ttgir.count("ttg.convert_layout"))
print("compiled")
"""


def test_grouped_softmax_layout_for_sm90():
    """The grouped CSR kernels lower with SUB lanes per row and 32/SUB rows per warp (the layout
    the design relies on) and no layout conversions."""
    done = run_compiler_script(_AOT_SCRIPT)
    lines = done.stdout.splitlines()[:-1]
    assert len(lines) == 16
    for line in lines:
        _, sub, _, tpw, convert = line.split()
        assert f"{32 // int(sub)},1,{sub}" in tpw.split("=")[1].split("|"), line
        assert convert == "convert=0", line
