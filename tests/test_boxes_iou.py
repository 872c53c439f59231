"""pcops.boxes_iou_bev / boxes_iou_3d: the reference vs an independent oracle, exact values, hard
cases, layouts and dtypes, the backend contract, Triton (interpreter) and CUDA paths, and csrc/nms.cu's
geometry compiled for the host."""

import functools
import logging
import math

import pytest
import torch

import pcops
from pcops.reference import nms as ref
from _boxes import build_host_cpp, hard_cases, make_boxes, one_cpu_thread, pair_iou, sh_iou  # noqa: F401 (fixture)
from _util import generator, interpret, requires_cuda


# --- the reference ----------------------------------------------------------------------------


def test_reference_matches_textbook_clipping_on_hard_cases_and_random_pairs():
    a, b = hard_cases()
    ra, rb = make_boxes(300, seed=1, span=(8, 8))[0], make_boxes(300, seed=2, span=(8, 8))[0]
    a, b = torch.cat([a, ra]).double(), torch.cat([b, rb]).double()
    got = torch.stack([ref.boxes_iou_bev(a[i : i + 1], b[i : i + 1])[0, 0] for i in range(a.shape[0])])
    assert (ref.boxes_iou_bev_aligned(a, b) - got).abs().max() < 1e-12
    bev = lambda t: t[[0, 1, 3, 4, 6]].tolist()
    want = torch.tensor([sh_iou(bev(a[i]), bev(b[i])) for i in range(a.shape[0])], dtype=torch.float64)
    assert (got - want).abs().max() < 1e-9


def test_reference_exact_values():
    sq = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0]], dtype=torch.float64)
    rot = torch.tensor([[0.0, 0.0, 2.0, 2.0, math.pi / 4]], dtype=torch.float64)
    octagon = 8 * (math.sqrt(2) - 1)  # square ∩ the same square turned by 45 degrees
    assert abs(ref.boxes_iou_bev(sq, rot).item() - octagon / (8 - octagon)) < 1e-14
    for x0 in (0.0, 70.0):
        a = torch.tensor([[x0, -39.0, 4.0, 1.0, 0.0]], dtype=torch.float64)
        for s, want in [(1.0, 3 / 5), (2.0, 2 / 6), (4.0, 0.0), (4.5, 0.0)]:
            b = a.clone()
            b[0, 0] += s
            assert ref.boxes_iou_bev(a, b).item() == want
    # identical boxes: exactly 1 (float32 and float64, any heading), nested: the area ratio
    boxes, _ = make_boxes(50, seed=3)
    for dt in (torch.float32, torch.float64):
        assert torch.equal(pcops.boxes_iou_bev(boxes.to(dt), boxes.to(dt)).diagonal(), torch.ones(50, dtype=dt))
    inner = boxes.clone()
    inner[:, 3:5] *= 0.5
    ratio = pcops.boxes_iou_bev(boxes.double(), inner.double()).diagonal()
    assert torch.equal(ratio, (inner[:, 3] * inner[:, 4]).double() / (boxes[:, 3] * boxes[:, 4]).double())


def test_reference_3d():
    a = torch.tensor([[0.0, 0.0, 0.0, 4.0, 2.0, 2.0, 0.3]], dtype=torch.float64)
    b = a.clone()
    b[0, 2] = 1.0  # half the height overlaps
    assert abs(pcops.boxes_iou_3d(a, b).item() - 1 / 3) < 1e-15
    b[0, 2] = 2.0  # touching in z
    assert pcops.boxes_iou_3d(a, b).item() == 0.0
    boxes, _ = make_boxes(40, seed=4, span=(10, 10))
    want = ref.boxes_iou_bev(boxes, boxes) * 0  # noqa: F841 (shape)
    got = pcops.boxes_iou_3d(boxes, boxes)
    assert torch.equal(got.diagonal(), torch.ones(40))
    assert (
        got.shape == (40, 40) and got.dtype == torch.float32 and (got <= pcops.boxes_iou_bev(boxes, boxes) + 1e-7).all()
    )


def test_layouts_dtypes_and_invalid_boxes():
    boxes, _ = make_boxes(30, seed=5, span=(10, 10))
    bev = boxes[:, [0, 1, 3, 4, 6]]
    full = pcops.boxes_iou_bev(boxes, boxes)
    assert torch.equal(pcops.boxes_iou_bev(bev, bev), full)
    assert torch.equal(pcops.boxes_iou_bev(bev, boxes), full)
    wide = torch.cat([boxes, torch.randn(30, 2, generator=generator(0))], 1)  # (N, 9): velocities ignored
    assert torch.equal(pcops.boxes_iou_bev(wide, wide), full)
    for dt in (torch.float16, torch.bfloat16):
        out = pcops.boxes_iou_bev(boxes.to(dt), boxes.to(dt))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, ref.boxes_iou_bev(boxes.to(dt), boxes.to(dt)).float(), rtol=0, atol=1e-6)
    assert pcops.boxes_iou_bev(boxes.double(), boxes.double()).dtype == torch.float64
    bad = boxes.clone()
    bad[0, 0] = float("nan")
    bad[1, 6] = float("inf")
    bad[2, 3] = float("inf")
    out = pcops.boxes_iou_bev(bad, bad)
    assert (out[:3] == 0).all() and (out[:, :3] == 0).all() and torch.equal(out[3:, 3:], full[3:, 3:])
    assert pcops.boxes_iou_bev(boxes[:0], boxes).shape == (0, 30)


def test_iou_bad_input():
    with pytest.raises(ValueError, match="boxes_b"):
        pcops.boxes_iou_bev(torch.ones(2, 7), torch.ones(2, 4))
    with pytest.raises(ValueError, match="boxes_a"):
        pcops.boxes_iou_3d(torch.ones(2, 5), torch.ones(2, 7))
    with pytest.raises(ValueError, match="boxes_a"):
        pcops.boxes_iou_bev(torch.tensor([[0.0, 0, -1, 1, 0]]), torch.ones(2, 5))


@pytest.mark.parametrize("fn", [pcops.boxes_iou_bev, pcops.boxes_iou_3d])
def test_iou_backend_contract_cpu(fn, caplog):
    """ "reference" and "auto" run the reference on CPU tensors; a GPU backend on CPU tensors and
    unknown names raise, naming the argument; the debug log says which implementation ran."""
    boxes, _ = make_boxes(20, seed=6, span=(10, 10))
    want = fn(boxes, boxes[:7])
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        assert torch.equal(fn(boxes, boxes[:7], backend="reference"), want)
    assert "reference" in caplog.text
    for backend in ("triton", "cuda"):
        with pytest.raises(ValueError, match="backend.*CUDA tensors"):
            fn(boxes, boxes, backend=backend)
    with pytest.raises(ValueError, match="backend"):
        fn(boxes, boxes, backend="cpp")
    with pytest.raises(TypeError, match="backend"):
        fn(boxes, boxes, backend=None)


def test_iou_opcheck():
    boxes, _ = make_boxes(37, seed=8, span=(10, 10))
    torch.library.opcheck(torch.ops.pcops.boxes_iou_bev, (boxes, boxes[:11], "auto"))
    torch.library.opcheck(torch.ops.pcops.boxes_iou_3d, (boxes.double(), boxes[:5].double(), "reference"))


# --- Triton kernels under the CPU interpreter ----------------------------------------------


@interpret
def test_triton_interpreter_iou_hard_cases():
    from pcops.triton import nms as tri

    a, b = hard_cases()
    want = ref.boxes_iou_bev_aligned(a, b)
    got = pair_iou(lambda x, y: tri.boxes_iou(x, y, False), a, b, chunk=32)
    assert (got - want).abs().max() <= 1e-5
    same = (a == b).all(1)
    assert (got[same] == 1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@interpret
def test_triton_interpreter_iou_random(dtype):
    from pcops.triton import nms as tri

    a, _ = make_boxes(70, seed=10, span=(12, 12), dtype=dtype)
    b, _ = make_boxes(45, seed=11, span=(12, 12), dtype=dtype)
    b[::7] = a[:7]  # some identical pairs
    b[1, 0] = float("nan")
    got = tri.boxes_iou(a, b, False)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert (got.double() - ref.boxes_iou_bev(a, b)).abs().max() <= 1e-5
    got3 = tri.boxes_iou(a, b, True)
    assert (got3.double() - ref.boxes_iou_3d(a, b)).abs().max() <= 1e-5
    assert (got[:, 1] == 0).all()


# --- the GPU paths --------------------------------------------------------------------------

# The CPU oracles below are cached: both backends compare with the same float64 values.


@functools.lru_cache(maxsize=None)
def _hard_iou_oracle():
    a, b = hard_cases()
    return a, b, ref.boxes_iou_bev_aligned(a, b)


@functools.lru_cache(maxsize=None)
def _random_iou_oracle(dtype):
    x, _ = make_boxes(700, seed=13, span=(30, 30), dtype=dtype)
    y, _ = make_boxes(333, seed=14, span=(30, 30), dtype=dtype)
    return x, y, ref.boxes_iou_bev(x, y), ref.boxes_iou_3d(x, y)


# The CUDA C++ backend (one NVRTC compile, cached) gets every dtype; the Triton backend, whose
# kernels compile per specialisation, float32 only (the interpreter tests cover the rest).
_IOU_CASES = [("cuda", dt) for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
_IOU_CASES.append(("triton", torch.float32))


@pytest.mark.parametrize("backend,dtype", _IOU_CASES)
@pytest.mark.gpu
@requires_cuda
def test_gpu_iou_matches_reference(backend, dtype):
    """One test per dtype: each compiles its own kernel specialisations."""
    if dtype == torch.float32:
        a, b, want = _hard_iou_oracle()
        got = pair_iou(lambda x, y: pcops.boxes_iou_bev(x.cuda(), y.cuda(), backend=backend).cpu(), a, b)
        assert (got - want).abs().max() <= 1e-5
        assert (got[(a == b).all(1)] == 1).all()
    x, y, want, want3 = _random_iou_oracle(dtype)
    got = pcops.boxes_iou_bev(x.cuda(), y.cuda(), backend=backend).cpu().double()
    assert (got - want).abs().max() <= 1e-5
    if backend == "cuda":  # Triton: one more compilation (THREE_D); the interpreter tests cover it
        got3 = pcops.boxes_iou_3d(x.cuda(), y.cuda(), backend=backend).cpu().double()
        assert (got3 - want3).abs().max() <= 1e-5


@pytest.mark.gpu
@requires_cuda
def test_gpu_iou_backends_and_opcheck(caplog):
    """ "auto" runs Triton on float32 and the reference on float64 CUDA boxes; "reference" on CUDA
    tensors equals the CPU reference; opcheck of both ops on CUDA."""
    x, y, want, want3 = _random_iou_oracle(torch.float32)
    xc, yc = x.cuda(), y.cuda()
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        pcops.boxes_iou_bev(xc, yc)
        assert caplog.records[-1].getMessage() == "boxes_iou_bev: triton"
        got = pcops.boxes_iou_bev(xc.double(), yc.double())
        assert caplog.records[-1].getMessage() == "boxes_iou_bev: reference"
    assert got.dtype == torch.float64 and (got.cpu() - want).abs().max() <= 1e-12
    got3 = pcops.boxes_iou_3d(xc, yc, backend="reference")
    assert got3.dtype == torch.float32 and (got3.cpu().double() - want3).abs().max() <= 1e-6
    boxes, _ = make_boxes(200, seed=18, span=(15, 15), device="cuda")
    torch.library.opcheck(torch.ops.pcops.boxes_iou_bev, (boxes, boxes[:50], "triton"))
    torch.library.opcheck(torch.ops.pcops.boxes_iou_3d, (boxes, boxes[:50], "cuda"))


# --- csrc/nms.cu's geometry on the host ---------------------------------------------------------


def test_cuda_geometry_compiled_for_the_host(tmp_path):
    """csrc/nms.cu's device geometry (everything before the kernels), compiled as host C++ with FMA
    contraction like nvcc's default, matches the reference on the hard cases and random pairs."""
    import ctypes

    from pcops import _nvrtc

    src = (_nvrtc.CSRC_DIR / "nms.cu").read_text()
    helpers = src[: src.index("// IoU matrix: one thread per pair.")]
    for f in ("fabsf", "fminf", "fmaxf", "floorf", "sqrtf"):
        helpers = helpers.replace(f, "std::" + f[:-1])
    lib_path = build_host_cpp(
        tmp_path,
        "nms_geometry.cpp",
        {"nms_geometry.inc": helpers},
        "libgeo.so",
        flags=["-O2", "-ffp-contract=fast", "-shared", "-fPIC"],
    )
    lib = ctypes.CDLL(str(lib_path))

    def host_iou(a, b):
        a, b = a.float().contiguous(), b.float().contiguous()
        out = torch.empty(a.shape[0])
        lib.iou_pairs(
            ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), a.shape[0], ctypes.c_void_p(out.data_ptr())
        )
        return out.double()

    a, b = hard_cases()
    got = host_iou(a, b)
    assert (got - ref.boxes_iou_bev_aligned(a, b)).abs().max() <= 1e-5
    assert (got[(a == b).all(1)] == 1).all()
    ra, _ = make_boxes(1000, seed=21, span=(30, 30))
    rb, _ = make_boxes(1000, seed=22, span=(30, 30))
    rb[:, :2] = ra[:, :2] + (rb[:, :2] - 15) * 0.2  # mostly overlapping pairs
    assert (host_iou(ra, rb) - ref.boxes_iou_bev_aligned(ra, rb)).abs().max() <= 1e-5
    edge = torch.tensor([[70.0, -39.0, 0, 4.0, 1.0, 1, 0.0], [71.0, -39.0, 0, 4.0, 1.0, 1, 0.0]])
    assert host_iou(edge[:1], edge[1:]).item() == torch.tensor(0.6).item()
