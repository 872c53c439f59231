"""pcops.nms_bev / batched_nms_bev: the reference vs a textbook greedy loop, threshold-edge cases,
ties, pre/post/padded/batched forms, the backend contract, Triton (interpreter) and CUDA paths
(also csrc/nms.cu emulated on the host: tests/cpp), registration, bad input."""

import functools
import logging

import pytest
import torch

import pcops
from pcops.reference import nms as ref
from _boxes import build_host_cpp, check_keep, make_boxes, one_cpu_thread, ref_nms  # noqa: F401 (fixture)
from _util import generator, interpret, requires_cuda, run_compiler_script


def _greedy_oracle(iou, order, valid, thr):
    """Textbook greedy NMS on a precomputed IoU matrix (sorted positions) → kept sorted positions."""
    keep = []
    iou = iou.numpy()
    for i in range(len(order)):
        if valid[i] and all(iou[k, i] <= thr for k in keep):
            keep.append(i)
    return keep


# --- NMS (CPU path = reference) ---------------------------------------------------------------


@pytest.mark.parametrize("n,thr", [(0, 0.5), (1, 0.5), (2, 0.0), (67, 0.01), (131, 0.1), (131, 0.5), (257, 0.7)])
def test_nms_reference_matches_textbook_greedy(n, thr):
    boxes, scores = make_boxes(n, seed=n, span=(12, 12))
    scores[::5] = scores[:1].clone()  # ties: the lower index first
    keep = pcops.nms_bev(boxes, scores, thr)
    order = torch.sort(scores, descending=True, stable=True).indices
    iou = ref.boxes_iou_bev(boxes[order], boxes[order])
    want = order[_greedy_oracle(iou, order, [True] * n, thr)]
    assert keep.dtype == torch.int64 and keep.tolist() == want.tolist()


def test_nms_threshold_edge_and_ties():
    for x0 in (0.0, 70.0):
        # IoU exactly 3/5 (exact in float32 and float64): suppressed only when IoU > threshold
        boxes = torch.tensor([[x0, -39.0, 4.0, 1.0, 0.0], [x0 + 1.0, -39.0, 4.0, 1.0, 0.0]])
        scores = torch.tensor([0.5, 0.9])
        assert pcops.nms_bev(boxes, scores, 0.6).tolist() == [1, 0]
        assert pcops.nms_bev(boxes, scores, 0.5999).tolist() == [1]
        # touching boxes (IoU 0) survive threshold 0; identical boxes survive threshold 1
        touch = torch.tensor([[x0, 0.0, 4.0, 1.0, 0.0], [x0 + 4.0, 0.0, 4.0, 1.0, 0.0]])
        assert pcops.nms_bev(touch, scores, 0.0).tolist() == [1, 0]
        same = torch.tensor([[x0, 0.0, 4.0, 1.0, 0.3]] * 3)
        assert pcops.nms_bev(same, torch.tensor([0.2, 0.7, 0.7]), 1.0).tolist() == [1, 2, 0]
        # equal scores: the lower index is kept
        assert pcops.nms_bev(same, torch.tensor([0.2, 0.7, 0.7]), 0.5).tolist() == [1]


def test_nms_pre_post_padded_batched_invalid():
    boxes, scores = make_boxes(150, seed=7, span=(12, 12))
    full = pcops.nms_bev(boxes, scores, 0.2)
    assert pcops.nms_bev(boxes, scores, 0.2, post_max_size=5).tolist() == full[:5].tolist()
    idx, count = pcops.nms_bev(boxes, scores, 0.2, post_max_size=500, padded=True)
    assert idx.shape == (500,) and count.shape == () and count.dtype == torch.int64
    assert (
        int(count) == full.numel() and idx[: int(count)].tolist() == full.tolist() and (idx[int(count) :] == -1).all()
    )
    order = torch.sort(scores, descending=True, stable=True).indices[:40]
    pre = pcops.nms_bev(boxes, scores, 0.2, pre_max_size=40)
    assert pre.tolist() == order[pcops.nms_bev(boxes[order], scores[order], 0.2)].tolist()
    # groups never suppress each other: equal to per-group NMS, merged by score
    groups = torch.randint(0, 3, (150,), generator=generator(1))
    got = pcops.batched_nms_bev(boxes, scores, groups, 0.2)
    per = torch.cat(
        [
            torch.nonzero(groups == g).view(-1)[pcops.nms_bev(boxes[groups == g], scores[groups == g], 0.2)]
            for g in range(3)
        ]
    )
    per = per[torch.sort(scores[per], descending=True, stable=True).indices]
    assert got.tolist() == per.tolist()
    idx, count = pcops.batched_nms_bev(boxes, scores, groups, 0.2, post_max_size=7, padded=True)
    assert idx.tolist() == got[:7].tolist() and int(count) == 7
    # invalid boxes and NaN scores are never kept and never suppress
    bad, s = boxes.clone(), scores.clone()
    top = torch.argmax(scores)
    bad[top, 0] = float("nan")
    s[full[1]] = float("nan")
    keep = pcops.nms_bev(bad, s, 0.2)
    assert int(top) not in keep.tolist() and int(full[1]) not in keep.tolist()
    valid = torch.ones(150, dtype=torch.bool)
    valid[[int(top), int(full[1])]] = False
    sub = torch.nonzero(valid).view(-1)
    assert keep.tolist() == sub[pcops.nms_bev(boxes[sub], scores[sub], 0.2)].tolist()


@pytest.mark.parametrize(
    "bad,exc,name",
    [
        (dict(boxes=torch.zeros(4, 6)), ValueError, "boxes"),
        (dict(boxes=torch.zeros(4)), ValueError, "boxes"),
        (dict(boxes=torch.zeros(4, 7, dtype=torch.int32)), TypeError, "boxes"),
        (dict(boxes="boxes"), TypeError, "boxes"),
        (dict(boxes=torch.tensor([[0.0, 0, 0, 1, -1, 1, 0]] * 4)), ValueError, "boxes"),
        (dict(scores=torch.zeros(3)), ValueError, "scores"),
        (dict(scores=torch.zeros(4, 1)), ValueError, "scores"),
        (dict(iou_threshold=1.5), ValueError, "iou_threshold"),
        (dict(iou_threshold=-0.1), ValueError, "iou_threshold"),
        (dict(iou_threshold=float("nan")), ValueError, "iou_threshold"),
        (dict(iou_threshold="0.5"), TypeError, "iou_threshold"),
        (dict(pre_max_size=0), ValueError, "pre_max_size"),
        (dict(post_max_size=0), ValueError, "post_max_size"),
        (dict(padded=True), ValueError, "post_max_size"),
        (dict(padded=1), TypeError, "padded"),
        (dict(backend="cpp"), ValueError, "backend"),
    ],
)
def test_nms_bad_input(bad, exc, name):
    args = dict(boxes=torch.ones(4, 7), scores=torch.zeros(4), iou_threshold=0.5)
    args.update(bad)
    with pytest.raises(exc, match=name):
        pcops.nms_bev(**args)


def test_batched_nms_bad_input():
    with pytest.raises(ValueError, match="idxs"):
        pcops.batched_nms_bev(torch.ones(4, 7), torch.zeros(4), torch.zeros(3, dtype=torch.int64), 0.5)
    with pytest.raises(TypeError, match="idxs"):
        pcops.batched_nms_bev(torch.ones(4, 7), torch.zeros(4), torch.zeros(4), 0.5)


def test_nms_backend_contract_cpu(caplog):
    """ "reference" and "auto" are the reference on CPU tensors (both forms); a GPU backend on CPU
    tensors and unknown names raise, naming the argument; the debug log says what ran."""
    boxes, scores = make_boxes(80, seed=9, span=(12, 12))
    want = pcops.nms_bev(boxes, scores, 0.2)
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        assert pcops.nms_bev(boxes, scores, 0.2, backend="reference").tolist() == want.tolist()
    assert caplog.records[-1].getMessage() == "nms_bev: reference"
    b3, s3 = boxes.view(2, 40, 7), scores.view(2, 40)
    assert torch.equal(
        pcops.nms_bev(b3, s3, 0.2, post_max_size=9, padded=True, backend="reference")[0],
        pcops.nms_bev(b3, s3, 0.2, post_max_size=9, padded=True)[0],
    )
    for backend in ("triton", "cuda"):
        with pytest.raises(ValueError, match="backend.*CUDA tensors"):
            pcops.nms_bev(boxes, scores, 0.2, backend=backend)
        with pytest.raises(ValueError, match="backend.*CUDA tensors"):
            pcops.batched_nms_bev(
                b3, s3, torch.zeros(2, 40, dtype=torch.int64), 0.2, post_max_size=4, padded=True, backend=backend
            )
    with pytest.raises(TypeError, match="backend"):
        pcops.nms_bev(boxes, scores, 0.2, backend=1)


def test_opcheck():
    boxes, scores = make_boxes(37, seed=8, span=(10, 10))
    groups = torch.arange(37) % 2
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, 20, True, "auto"))
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, groups, 0.3, 30, 10, True, "reference"))
    torch.library.opcheck(
        torch.ops.pcops.nms_bev,
        (boxes, scores, None, 0.3, None, None, False, "auto"),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_torch_compile_fullgraph_padded():
    boxes, scores = make_boxes(60, seed=9, span=(10, 10))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def post(b, s):
        idx, count = pcops.nms_bev(b * 1.0, s.sigmoid(), 0.1, pre_max_size=50, post_max_size=16, padded=True)
        kept = idx >= 0
        return b[idx.clamp(min=0)] * kept[:, None], count

    got_boxes, got_count = post(boxes, scores)
    idx, count = pcops.nms_bev(boxes, scores.sigmoid(), 0.1, pre_max_size=50, post_max_size=16, padded=True)
    assert int(got_count) == int(count)
    torch.testing.assert_close(got_boxes, boxes[idx.clamp(min=0)] * (idx >= 0)[:, None])


# --- Triton kernels under the CPU interpreter ----------------------------------------------


@pytest.mark.parametrize("n,thr", [(1, 0.5), (63, 0.01), (65, 0.5), (131, 0.1), (131, 0.01)])
@interpret
def test_triton_interpreter_nms(n, thr):
    from pcops.triton import nms as tri

    boxes, scores = make_boxes(n, seed=n + 100, span=(14, 14))
    scores[::4] = scores[:1].clone()
    want = ref.nms_bev(boxes, scores, thr)
    got, count = tri.nms_bev(boxes, scores, None, thr, None, None, False)
    assert got.tolist() == want.tolist() and int(count) == want.numel()
    idx, count = tri.nms_bev(boxes, scores, None, thr, None, 8, True)
    assert idx[: int(count)].tolist() == want[:8].tolist() and (idx[int(count) :] == -1).all() and idx.shape == (8,)


@interpret
def test_triton_interpreter_nms_groups_pre_invalid_edges():
    from pcops.triton import nms as tri

    boxes, scores = make_boxes(100, seed=12, span=(12, 12))
    groups = torch.randint(0, 3, (100,), generator=generator(2))
    boxes[5, 3] = -1.0  # negative size: invalid on the GPU path (the CPU path raises)
    boxes[6, 1] = float("inf")
    scores[7] = float("nan")
    want = ref.nms_bev(boxes, scores, 0.1, pre_max_size=90, idxs=groups)
    got, _ = tri.nms_bev(boxes, scores, groups, 0.1, 90, None, False)
    assert got.tolist() == want.tolist()
    assert not {5, 6, 7} & set(got.tolist())
    # threshold edges: IoU exactly 3/5
    edge = torch.tensor([[70.0, -39.0, 4.0, 1.0, 0.0], [71.0, -39.0, 4.0, 1.0, 0.0]])
    s = torch.tensor([0.5, 0.9])
    assert tri.nms_bev(edge, s, None, 0.6, None, None, False)[0].tolist() == [1, 0]
    assert tri.nms_bev(edge, s, None, 0.5999, None, None, False)[0].tolist() == [1]
    empty, count = tri.nms_bev(boxes[:0], scores[:0], None, 0.5, None, 4, True)
    assert empty.tolist() == [-1] * 4 and int(count) == 0


@interpret
def test_triton_interpreter_nms_run_orchestration():
    """The Triton implementation's orchestration (sort, pre/post, padding, sync) on CPU tensors."""
    from pcops import nms as op

    boxes, scores = make_boxes(70, seed=19, span=(10, 10))
    groups = torch.arange(70) % 2
    idx, count = op._nms_run("triton", boxes, scores, groups, 0.2, 50, 12, True)
    want = ref.nms_bev(boxes, scores, 0.2, pre_max_size=50, post_max_size=12, idxs=groups)
    assert idx[: int(count)].tolist() == want.tolist() and idx.shape == (12,)
    keep, count = op._nms_run("triton", boxes, scores, None, 0.2, None, None, False)
    assert keep.tolist() == ref.nms_bev(boxes, scores, 0.2).tolist() and int(count) == keep.numel()


_AOT = r"""
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from pcops.triton import nms as tri
def comp(fn, sig, consts, **kw):
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=kw)
comp(tri._boxes_iou_kernel, {"a_ptr": "*fp16", "b_ptr": "*fp16", "out_ptr": "*fp32", "n": "i32", "m": "i32",
     "stride_a": "i32", "stride_b": "i32", "BEV5": "constexpr", "THREE_D": "constexpr", "BLOCK": "constexpr"},
     {"BEV5": False, "THREE_D": True, "BLOCK": 32})
comp(tri._nms_mask_kernel, {"boxes_ptr": "*fp32", "order_ptr": "*i64", "groups_ptr": "*i64", "mask_ptr": "*i64",
     "m": "i32", "words": "i32", "stride": "i32", "thr": "fp32", "BEV5": "constexpr", "HAS_GROUPS": "constexpr"},
     {"BEV5": False, "HAS_GROUPS": True})
k = comp(tri._nms_pass_kernel, {"mask_ptr": "*i64", "removed_ptr": "*i64", "boxes_ptr": "*fp32", "scores_ptr": "*fp32",
     "order_ptr": "*i64", "out_ptr": "*i64", "count_ptr": "*i64", "m": "i32", "words": "i32", "post": "i32",
     "stride": "i32", "BEV5": "constexpr", "BLOCK_W": "constexpr"}, {"BEV5": False, "BLOCK_W": 32}, num_warps=2)
print("compiled")
"""


@pytest.mark.slow
def test_triton_kernels_compile_for_sm90(tmp_path):
    """The interpreter is lenient about types: compile the real kernels for sm_90 (no GPU needed;
    a fresh Triton cache so every kernel really goes through the compiler)."""
    run_compiler_script(_AOT, extra_env={"TRITON_CACHE_DIR": str(tmp_path)})


@interpret
def test_triton_interpreter_threshold_edges_rotated():
    """Rotated pairs: thresholds 2e-6 below / above the float64 IoU decide as the reference does."""
    from pcops.triton import nms as tri

    g = generator(20)
    for k in range(6):
        a = torch.tensor([[70.0 - k, -39.0 + k, 3.9, 1.6, -2.0 + k]])
        shift = torch.tensor([[0.3 + 0.2 * torch.rand(1, generator=g).item(), 0.4, 0.0, 0.0, 0.5 * k]])
        boxes = torch.cat([a, a + shift])
        v = ref.boxes_iou_bev(boxes[:1], boxes[1:]).item()
        scores = torch.tensor([0.9, 0.4])
        for thr, want in [(v - 2e-6, [0]), (v + 2e-6, [0, 1])]:
            assert ref.nms_bev(boxes, scores, thr).tolist() == want
            assert tri.nms_bev(boxes, scores, None, thr, None, None, False)[0].tolist() == want


# --- the GPU paths --------------------------------------------------------------------------

# GPU tests stay fast (the whole file's ``-m gpu`` run well under a minute on the H200): the CUDA
# C++ backend (one NVRTC compile, cached) gets every case; the Triton backend, whose kernels
# compile per specialisation (dtype, layout, groups) and whose mask kernel clips whole tiles, gets
# float32 (N, 7) boxes at small sizes only (its logic is covered by the interpreter tests).
# The Triton NMS kernels take ~50 s to compile on the H200 host: their GPU cases are marked
# ``slow`` instead of ``gpu`` (run them with ``-m slow`` on a GPU machine).
_GPU, _SLOW_GPU = [pytest.mark.gpu], [pytest.mark.slow]


def _backend_params(cuda_cases, triton_cases):
    return [pytest.param(*c, marks=_GPU) for c in cuda_cases] + [
        pytest.param(*c, marks=_SLOW_GPU) for c in triton_cases
    ]


@functools.lru_cache(maxsize=None)
def _nms_case(n, span, thr):
    """Inputs and reference keep lists of one ``test_gpu_nms_matches_reference`` case (shared by
    both backends): boxes, scores, groups, plain / pre-post / grouped keep lists."""
    boxes, scores = make_boxes(n, seed=n, span=span)
    scores[::3] = scores[:1].clone()
    pre = max(1, n - n // 4)
    groups = torch.randint(0, 4, (n,), generator=generator(n))
    return (
        boxes,
        scores,
        groups,
        pre,
        ref_nms(boxes, scores, thr),
        ref_nms(boxes, scores, thr, pre_max_size=pre, post_max_size=100),
        ref_nms(boxes, scores, thr, idxs=groups),
    )


@pytest.mark.parametrize(
    "backend,n", _backend_params([("cuda", n) for n in (1, 63, 64, 65, 1000, 4096)], [("triton", 65), ("triton", 300)])
)
@requires_cuda
def test_gpu_nms_matches_reference(backend, n):
    configs = [((69.12, 79.36), 0.01), ((69.12, 79.36), 0.5)]
    if n <= 1000:  # dense scenes: many suppressions
        configs += [((20, 20), 0.1), ((20, 20), 0.7)]
    for span, thr in configs:
        boxes, scores, groups, pre, want, want_pre, want_groups = _nms_case(n, span, thr)
        got = pcops.nms_bev(boxes.cuda(), scores.cuda(), thr, backend=backend).cpu()
        check_keep(got, want, boxes, scores, thr)
        idx, count = pcops.nms_bev(
            boxes.cuda(), scores.cuda(), thr, pre_max_size=pre, post_max_size=100, padded=True, backend=backend
        )
        check_keep(idx[: int(count)].cpu(), want_pre, boxes, scores, thr)
        assert (idx[int(count) :] == -1).all()
        if backend == "cuda":  # Triton: one more compilation (HAS_GROUPS); the interpreter tests cover it
            got = pcops.batched_nms_bev(boxes.cuda(), scores.cuda(), groups.cuda(), thr, backend=backend).cpu()
            check_keep(got, want_groups, boxes, scores, thr)


@functools.lru_cache(maxsize=None)
def _invalid_nms_oracle(dtype):
    """300 boxes with a negative size, an infinite centre and a NaN score; CPU reference keep list."""
    boxes, scores = make_boxes(300, seed=15, span=(15, 15))
    boxes[5, 3] = -1.0
    boxes[6, 1] = float("inf")
    scores[7] = float("nan")
    b, sc = boxes.to(dtype), scores.to(dtype)
    return b, sc, ref.nms_bev(b, sc, 0.1)


@pytest.mark.parametrize("backend", _backend_params([("cuda",)], [("triton",)]))
@requires_cuda
def test_gpu_nms_edges_invalid_dtypes(backend):
    edge = torch.tensor([[70.0, -39.0, 0, 4.0, 1.0, 1, 0.0], [71.0, -39.0, 0, 4.0, 1.0, 1, 0.0]], device="cuda")
    s = torch.tensor([0.5, 0.9], device="cuda")
    for e in [edge, edge[:, [0, 1, 3, 4, 6]]] if backend == "cuda" else [edge]:
        assert pcops.nms_bev(e, s, 0.6, backend=backend).tolist() == [1, 0]
        assert pcops.nms_bev(e, s, 0.5999, backend=backend).tolist() == [1]
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if backend == "cuda" else (torch.float32,)
    for dtype in dtypes:
        b, sc, want = _invalid_nms_oracle(dtype)
        check_keep(pcops.nms_bev(b.cuda(), sc.cuda(), 0.1, backend=backend).cpu(), want, b, sc, 0.1)
    empty = torch.zeros(0, 7, device="cuda")
    empty, count = pcops.nms_bev(
        empty, torch.zeros(0, device="cuda"), 0.5, post_max_size=3, padded=True, backend=backend
    )
    assert empty.tolist() == [-1, -1, -1] and int(count) == 0


@pytest.mark.parametrize("backend", _backend_params([("cuda",)], [("triton",)]))
@requires_cuda
def test_gpu_nms_cuda_graph_capture(backend):
    n = 4096 if backend == "cuda" else 300  # Triton: sizes of one specialisation class (not 1, not 16k)
    boxes, scores = make_boxes(n, seed=16)
    static_b, static_s = boxes.cuda(), scores.cuda()
    fn = lambda: pcops.nms_bev(static_b, static_s, 0.01, post_max_size=500, padded=True, backend=backend)
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, count = fn()
    b2, s2 = make_boxes(n, seed=17)
    static_b.copy_(b2)
    static_s.copy_(s2)
    graph.replay()
    check_keep(idx[: int(count)].cpu(), _graph_oracle(n), b2, s2, 0.01)


@functools.lru_cache(maxsize=None)
def _graph_oracle(n=4096):
    b2, s2 = make_boxes(n, seed=17)
    return ref_nms(b2, s2, 0.01, post_max_size=500)


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck_and_backends(caplog, monkeypatch):
    """opcheck on CUDA; "auto" runs CUDA C++ on float32 and the reference on float64 scores;
    "reference" on CUDA tensors equals the CPU reference; "cuda" refuses more boxes per sample
    than its shared-memory pass holds (before any launch)."""
    from pcops.cuda import nms as cuda_impl

    boxes, scores = make_boxes(200, seed=18, span=(15, 15), device="cuda")
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, 60, True, "cuda"))
    want = ref.nms_bev(boxes.cpu(), scores.cpu(), 0.3)
    monkeypatch.setattr(pcops._native, "serves", lambda op: None)  # the Python path logs its kernel
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        got = pcops.nms_bev(boxes, scores, 0.3)
        assert caplog.records[-1].getMessage() == "nms_bev: cuda"
        check_keep(got.cpu(), want, boxes.cpu(), scores.cpu(), 0.3)
        got = pcops.nms_bev(boxes, scores.double(), 0.3)
        assert caplog.records[-1].getMessage() == "nms_bev: reference"
        assert got.tolist() == want.tolist()
    assert pcops.nms_bev(boxes, scores, 0.3, backend="reference").tolist() == want.tolist()
    big = 64 * cuda_impl.MAX_WORDS + 1
    many, many_s = torch.zeros(big, 7, device="cuda"), torch.zeros(big, device="cuda")
    with pytest.raises(ValueError, match="backend: 'cuda' handles at most"):
        pcops.nms_bev(many, many_s, 0.5, backend="cuda")
    with pytest.raises(ValueError, match="backend: 'cuda' handles at most"):
        pcops.nms_bev(many[None], many_s[None], 0.5, post_max_size=4, padded=True, backend="cuda")


@pytest.mark.slow
@requires_cuda
def test_gpu_triton_nms_opcheck():
    """opcheck of both NMS ops with the Triton backend on CUDA (slow: Triton compilations)."""
    boxes, scores = make_boxes(200, seed=18, span=(15, 15), device="cuda")
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, 60, True, "triton"))
    small, small_s, _ = _batched_case(2, 100, (12, 12), seed=36)
    small[:, 3, 3] = 1.0
    torch.library.opcheck(
        torch.ops.pcops.nms_bev_batched, (small.cuda(), small_s.cuda(), None, 0.3, None, 30, "triton")
    )


# --- the CUDA kernels, emulated on the host ---------------------------------------------------
# csrc/nms.cu compiled as host C++ with the SIMT shim of tests/cpp/simt.h: checks the kernels'
# logic (tiles, pipelining, rounds, early exit, padding, the batched rank sort, mask and pass)
# against the reference; the GPU tests check them on the device.


def _nms_host_source() -> str:
    """csrc/nms.cu for the SIMT shim: shared memory as statics, dynamic shared memory g_dyn_smem."""
    from pcops import _nvrtc

    src = (_nvrtc.CSRC_DIR / "nms.cu").read_text()
    src = src.replace("extern __shared__ unsigned long long removed[];", "unsigned long long* removed = g_dyn_smem;")
    return src.replace("__shared__", "static").replace('extern "C" ', "")


@functools.lru_cache(maxsize=None)
def _simt_binary(tmp_dir):
    """The batched pipeline driver (tests/cpp/nms_pipeline_main.cpp), compiled for the host."""
    exe = build_host_cpp(
        tmp_dir,
        "nms_pipeline_main.cpp",
        {"nms_host.inc": _nms_host_source()},
        "nms_emu",
        flags=["-std=c++20", "-O1", "-fno-strict-aliasing", "-pthread"],
    )
    return str(exe)


def test_cuda_pass_kernels_compile_without_spills():
    """nms_pass_b (1024 threads: at most 64 registers), nms_mask_b and nms_rank compile for sm_90
    with no local-memory spills (ptxas' verbose log through NVRTC)."""
    import ctypes
    import re

    from pcops import _nvrtc

    try:
        lib = _nvrtc.nvrtc()
    except (RuntimeError, OSError) as e:
        pytest.skip(f"NVRTC not available: {e}")
    src = (_nvrtc.CSRC_DIR / "nms.cu").read_text()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"nms.cu", 0, None, None) == 0
    try:
        opts = [b"--gpu-architecture=sm_90", b"--std=c++17", b"-default-device", b"--ptxas-options=-v"]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    text = log.value.decode(errors="replace")
    assert status == 0, text
    for kernel in ("nms_pass_b", "nms_mask_b", "nms_rank"):
        part = text.split(f"Function properties for {kernel}\n", 1)
        if len(part) < 2:
            pytest.skip("this NVRTC does not forward ptxas' verbose log")
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", part[1])
        assert spills and spills.groups() == ("0", "0"), part[1][:300]


def _batched_case(bsz, n, span, seed, groups=False, bev5=False):
    """``bsz`` samples of ``n`` boxes (a few invalid: negative size, infinite centre, NaN score; tied
    and signed-zero scores), as float32 tensors, and int64 groups."""
    boxes, scores = make_boxes(bsz * n, seed=seed, span=span)
    boxes, scores = boxes.view(bsz, n, 7).clone(), scores.view(bsz, n).clone()
    if n >= 12:
        boxes[:, 3, 3] = -1.0
        boxes[:, 5, 1] = float("inf")
        scores[:, 7] = float("nan")
        scores[:, 8:11] = scores[:, 11:12]  # ties: the lower index first
        scores[:, 1], scores[:, 2] = 0.0, -0.0  # equal scores
    if bev5:
        boxes = boxes[..., [0, 1, 3, 4, 6]].contiguous()
    g = torch.randint(0, 3, (bsz, n), generator=generator(seed)) if groups else torch.zeros(bsz, n, dtype=torch.int64)
    return boxes, scores, g


@pytest.mark.parametrize(
    "bsz,n,pre,post,span,thr,groups,use_rank,bev5,presorted",
    [
        (2, 150, None, 200, (14, 14), 0.1, False, True, False, False),
        (3, 70, 64, 10, (10, 10), 0.3, True, True, False, False),
        (1, 1, None, 3, (10, 10), 0.5, False, True, False, False),
        (2, 130, 129, 130, (12, 12), 0.01, True, False, True, False),
        (1, 64, None, 64, (6, 6), 0.0, False, False, False, False),
        (2, 100, 90, 50, (10, 10), 0.2, False, True, False, True),
        (1, 300, None, 300, (12, 12), 0.1, True, True, False, True),
        (2, 250, None, 100, (10, 10), 0.05, False, True, False, False),
    ],
)
def test_cuda_batched_pipeline_emulated_on_the_host(
    tmp_path_factory, bsz, n, pre, post, span, thr, groups, use_rank, bev5, presorted
):
    """nms_rank (or nms_gather) + nms_mask_b + nms_pass_b on the host: the stable order, the
    prepared records, the bitmask (vs the float64 reference IoU), the invalid words and the padded
    keep lists of every sample (vs the reference NMS). ``presorted``: scores already in descending
    order (ties, NaN tail), nms_rank's no-counting path."""
    import struct
    import subprocess

    import numpy as np

    exe = _simt_binary(str(tmp_path_factory.mktemp("simt")))
    boxes, scores, g = _batched_case(bsz, n, span, seed=n + bsz, groups=groups, bev5=bev5)
    if presorted:  # and a NaN tail of whole tiles (the pass stops before them)
        scores[:, n // 2 :] = float("nan")
        scores = torch.stack([s[ref.sort_order(s)] for s in scores])
    elif n >= 200:  # a whole tile of invalid boxes between valid ones (its mask words stay unwritten)
        for b in range(bsz):
            boxes[b, ref.sort_order(scores[b])[64:128], 0] = float("inf")
    m = n if pre is None else min(n, pre)
    words = -(-m // 64)
    order_in = torch.stack([ref.sort_order(scores[b], pre) for b in range(bsz)])
    stride = boxes.shape[2]
    payload = struct.pack("9i", bsz, n, m, stride, int(bev5), int(groups), int(use_rank), post, 96)
    payload += struct.pack("f", thr) + boxes.numpy().tobytes() + scores.numpy().tobytes()
    payload += g.numpy().astype(np.int64).tobytes() + order_in.numpy().astype(np.int64).tobytes()
    res = subprocess.run([exe], input=payload, capture_output=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    buf, at = res.stdout, 0

    def take(count, dtype):
        nonlocal at
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=at)
        at += arr.nbytes
        return arr

    order = take(bsz * m, np.int64).reshape(bsz, m)
    sbox = take(bsz * m * 8, np.float32).reshape(bsz, m, 8)
    mask = take(bsz * m * words, np.uint64).reshape(bsz, m, words)
    invalid = take(bsz * words, np.uint64).reshape(bsz, words)
    out = take(bsz * post, np.int64).reshape(bsz, post)
    count = take(bsz, np.int64)
    assert at == len(buf)
    assert order.tolist() == order_in.tolist()
    for b in range(bsz):
        bev = ref.bev_columns(boxes[b])
        valid = ref.box_valid(bev) & ~torch.isnan(scores[b])
        o = torch.from_numpy(order[b].copy())
        ok = valid[o].numpy()
        assert (sbox[b, :, 6] == ok.astype(np.float32)).all()
        want_rec = bev[o][ok].numpy()  # (x, y, dx, dy, heading)
        assert np.array_equal(sbox[b, ok][:, [0, 1, 4, 5, 3]], want_rec)
        assert np.allclose(sbox[b, ok, 2], 0.5 * np.hypot(want_rec[:, 2], want_rec[:, 3]), rtol=1e-6)
        assert np.isnan(sbox[b, ~ok, 2]).all()
        bad = np.zeros(words * 64, dtype=bool)
        bad[:m] = ~ok
        bad[m:] = True
        assert np.packbits(bad, bitorder="little").view("<u8").tolist() == invalid[b].tolist()
        iou = ref.boxes_iou_bev(bev[o], bev[o])
        same = (g[b][o][:, None] == g[b][o][None, :]) if groups else torch.ones(m, m, dtype=torch.bool)
        want = (iou > thr) & same & torch.from_numpy(ok)[:, None] & torch.from_numpy(ok)[None, :]
        want = torch.triu(want, 1).numpy()
        pad = np.zeros((m, words * 64), dtype=bool)
        pad[:, :m] = want
        got_bits = np.unpackbits(mask[b].view(np.uint8), axis=1, bitorder="little").astype(bool)
        # only the words from the diagonal on are written, and only those of tiles with a valid
        # row box and a valid column box
        tile_ok = np.zeros(words * 64, dtype=bool)
        tile_ok[:m] = ok
        tile_ok = tile_ok.reshape(words, 64).any(1)
        for i in range(m):
            if not tile_ok[i // 64]:
                continue
            lo = (i // 64) * 64
            near = ((iou[i, lo:] - thr).abs() < 1e-6).numpy()
            diff = got_bits[i, lo:m] != pad[i, lo:m]
            diff &= np.repeat(tile_ok, 64)[lo:m]
            assert not (diff & ~near[: m - lo]).any(), (b, i)
        want_idx, want_count = ref.nms_bev_padded(boxes[b], scores[b], thr, pre, post, g[b] if groups else None)
        assert out[b].tolist() == want_idx.tolist() and int(count[b]) == int(want_count), b


# --- the batched form (boxes (B, N, C)) -----------------------------------------------------------


def _loop_padded(boxes, scores, thr, pre, post, idxs=None, backend="auto"):
    """The per-sample loop the batched form replaces."""
    outs = [
        pcops.nms_bev(boxes[b], scores[b], thr, pre, post, padded=True, backend=backend)
        if idxs is None
        else pcops.batched_nms_bev(boxes[b], scores[b], idxs[b], thr, pre, post, padded=True, backend=backend)
        for b in range(boxes.shape[0])
    ]
    return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])


def test_batched_form_equals_the_loop_cpu():
    boxes, scores, g = _batched_case(3, 90, (12, 12), seed=30, groups=True)
    boxes[:, 3, 3] = 1.0  # negative sizes raise on the CPU
    for pre, post, idxs in [(None, 100, None), (50, 7, None), (None, 20, g)]:
        fn = pcops.nms_bev if idxs is None else functools.partial(pcops.batched_nms_bev, idxs=idxs)
        idx, count = fn(boxes, scores, iou_threshold=0.2, pre_max_size=pre, post_max_size=post, padded=True)
        want_idx, want_count = _loop_padded(boxes, scores, 0.2, pre, post, idxs)
        assert idx.shape == (3, post) and count.shape == (3,) and idx.dtype == count.dtype == torch.int64
        assert torch.equal(idx, want_idx) and torch.equal(count, want_count)
    bev = boxes[..., [0, 1, 3, 4, 6]]
    assert torch.equal(
        pcops.nms_bev(bev, scores, 0.2, post_max_size=9, padded=True)[0],
        pcops.nms_bev(boxes, scores, 0.2, post_max_size=9, padded=True)[0],
    )
    idx, count = pcops.nms_bev(boxes[:0], scores[:0], 0.2, post_max_size=4, padded=True)
    assert idx.shape == (0, 4) and count.shape == (0,)
    idx, count = pcops.nms_bev(boxes[:, :0], scores[:, :0], 0.2, post_max_size=4, padded=True)
    assert idx.tolist() == [[-1] * 4] * 3 and count.tolist() == [0] * 3


@pytest.mark.parametrize(
    "bad,exc,name",
    [
        (dict(padded=False), ValueError, "padded"),
        (dict(post_max_size=None), ValueError, "post_max_size"),
        (dict(scores=torch.zeros(2, 4)), ValueError, "scores"),
        (dict(scores=torch.zeros(10)), ValueError, "scores"),
        (dict(boxes=torch.ones(3, 5, 6)), ValueError, "boxes"),
        (dict(boxes=torch.tensor([[[0.0, 0, 0, 1, -1, 1, 0]] * 5] * 3)), ValueError, "boxes"),
        (dict(iou_threshold=2.0), ValueError, "iou_threshold"),
    ],
)
def test_batched_form_bad_input(bad, exc, name):
    args = dict(boxes=torch.ones(3, 5, 7), scores=torch.zeros(3, 5), iou_threshold=0.5, post_max_size=4, padded=True)
    args.update(bad)
    with pytest.raises(exc, match=name):
        pcops.nms_bev(**args)
    with pytest.raises(ValueError, match="idxs"):
        pcops.batched_nms_bev(
            torch.ones(3, 5, 7),
            torch.zeros(3, 5),
            torch.zeros(3, 4, dtype=torch.int64),
            0.5,
            post_max_size=4,
            padded=True,
        )


def test_batched_form_opcheck_and_compile():
    boxes, scores, g = _batched_case(2, 40, (10, 10), seed=31, groups=True)
    boxes[:, 3, 3] = 1.0
    torch.library.opcheck(torch.ops.pcops.nms_bev_batched, (boxes, scores, None, 0.3, None, 16, "auto"))
    torch.library.opcheck(torch.ops.pcops.nms_bev_batched, (boxes, scores, g, 0.3, 30, 8, "auto"))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def post(b, s):
        idx, count = pcops.nms_bev(b * 1.0, s.sigmoid(), 0.1, pre_max_size=30, post_max_size=16, padded=True)
        return torch.gather(s, 1, idx.clamp(min=0)) * (idx >= 0), count

    got, count = post(boxes, scores)
    idx, want_count = pcops.nms_bev(boxes, scores.sigmoid(), 0.1, pre_max_size=30, post_max_size=16, padded=True)
    assert torch.equal(count, want_count)
    torch.testing.assert_close(got, torch.gather(scores, 1, idx.clamp(min=0)) * (idx >= 0))


@pytest.mark.parametrize("bsz,n", [(1, 1), (3, 65), (2, 1000), (8, 4096)])
@pytest.mark.gpu
@requires_cuda
def test_gpu_batched_form_matches_reference(bsz, n):
    """The batched CUDA pipeline (rank sort, mask, pass; grid over B) vs the float64 reference of
    every sample: plain, pre/post, grouped, 5-column boxes, fp16 boxes."""
    span = (20, 20) if n <= 1000 else (69.12, 79.36)
    boxes, scores, g = _batched_case(bsz, n, span, seed=32 + n, groups=True)
    b, s, gg = boxes.cuda(), scores.cuda(), g.cuda()
    pre = max(1, n - n // 4)
    cases = [(0.01, None, n, None), (0.5, pre, 100, None), (0.1, None, 50, gg)]
    if n <= 1000:
        cases += [(0.7, None, n, None)]
    for thr, pre_max, post, idxs in cases:
        fn = pcops.nms_bev if idxs is None else functools.partial(pcops.batched_nms_bev, idxs=idxs)
        idx, count = fn(b, s, iou_threshold=thr, pre_max_size=pre_max, post_max_size=post, padded=True)
        assert idx.shape == (bsz, post) and count.shape == (bsz,)
        idx, count = idx.cpu(), count.cpu()
        for k in range(min(bsz, 2)):
            kw = dict(pre_max_size=pre_max, post_max_size=post)
            if idxs is not None:
                kw["idxs"] = g[k]
            want = ref_nms(boxes[k], scores[k], thr, **kw)
            c = int(count[k])
            check_keep(idx[k, :c], want, boxes[k], scores[k], thr)
            assert (idx[k, c:] == -1).all()
    # other layouts and dtypes: the same as per-sample calls
    for bb in (b[..., [0, 1, 3, 4, 6]], b.half()):
        idx, count = pcops.nms_bev(bb, s, 0.2, post_max_size=64, padded=True)
        want_idx, want_count = _loop_padded(bb, s, 0.2, None, 64)
        assert torch.equal(idx, want_idx) and torch.equal(count, want_count)


@pytest.mark.gpu
@requires_cuda
def test_gpu_sort_fallbacks():
    """float64 scores and N > RANK_MAX take torch.sort + nms_gather under backend="cuda": the
    reference's keep lists (up to IoUs at the threshold)."""
    from pcops.cuda import nms as cuda_impl

    for n, dtype in [(300, torch.float64), (cuda_impl.RANK_MAX + 300, torch.float32)]:
        boxes, scores = make_boxes(n, seed=33, span=(69.12, 79.36) if n > 1000 else (15, 15))
        scores[::7] = scores[:1].clone()
        b, s = boxes.cuda(), scores.to(dtype).cuda()
        for thr, post in [(0.01, 500), (0.5, n)]:
            idx, count = pcops.nms_bev(b, s, thr, post_max_size=post, padded=True, backend="cuda")
            c = int(count)
            check_keep(
                idx[:c].cpu(), ref_nms(boxes, scores.to(dtype), thr, post_max_size=post), boxes, scores.float(), thr
            )
            assert (idx[c:] == -1).all()


@pytest.mark.gpu
@requires_cuda
def test_gpu_batched_form_graph_capture_and_opcheck():
    """B = 8 × 4,096 (E2's post-processing) captured in a CUDA graph and replayed on new boxes:
    equal to eager per-sample calls; opcheck of the batched op on CUDA."""
    boxes, scores, _ = _batched_case(8, 4096, (69.12, 79.36), seed=34)
    sb, ss = boxes.cuda(), scores.cuda()
    fn = lambda: pcops.nms_bev(sb, ss, 0.01, pre_max_size=4096, post_max_size=500, padded=True)
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, count = fn()
    b2, s2, _ = _batched_case(8, 4096, (69.12, 79.36), seed=35)
    sb.copy_(b2)
    ss.copy_(s2)
    graph.replay()
    want_idx, want_count = _loop_padded(sb, ss, 0.01, 4096, 500)
    assert torch.equal(idx, want_idx) and torch.equal(count, want_count)
    small, small_s, g = _batched_case(2, 100, (12, 12), seed=36, groups=True)
    small[:, 3, 3] = 1.0
    torch.library.opcheck(torch.ops.pcops.nms_bev_batched, (small.cuda(), small_s.cuda(), None, 0.3, None, 30, "cuda"))
    torch.library.opcheck(
        torch.ops.pcops.nms_bev_batched, (small.cuda(), small_s.cuda(), g.cuda(), 0.3, 64, 32, "cuda")
    )


# --- the Python launchers of pcops.cuda.nms, with the kernels emulated on the host ----------------


@functools.lru_cache(maxsize=None)
def _emu_library(tmp_dir):
    """csrc/nms.cu with the SIMT shim as a host shared library exposing ``emu_launch``
    (tests/cpp/nms_emu_launch.cpp)."""
    import ctypes

    lib = build_host_cpp(
        tmp_dir,
        "nms_emu_launch.cpp",
        {"nms_host.inc": _nms_host_source()},
        "libnms_emu.so",
        flags=["-std=c++20", "-O1", "-fno-strict-aliasing", "-pthread", "-shared", "-fPIC"],
    )
    return ctypes.CDLL(str(lib))


class _EmuKernel:
    """Stands in for ``pcops._nvrtc.CudaKernel``: the same call, run by the host emulation."""

    def __init__(self, lib, name):
        self.lib, self.name = lib, name

    def __call__(self, grid, block, args, shared_mem=0):
        import ctypes

        grid = tuple(grid) + (1,) * (3 - len(grid))
        holders = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
        params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        rc = self.lib.emu_launch(self.name.encode(), grid[0], grid[1], block[0], shared_mem, params)
        assert rc == 0, self.name


@pytest.fixture
def emulated_cuda(tmp_path_factory, monkeypatch):
    """``pcops.cuda.nms`` with its kernels emulated on the host (CPU tensors)."""
    from pcops.cuda import nms as cuda_impl

    lib = _emu_library(str(tmp_path_factory.mktemp("emu")))
    monkeypatch.setattr(cuda_impl, "get_kernel", lambda file, name, device=None: _EmuKernel(lib, name))
    return cuda_impl


@pytest.mark.slow  # one of the longest: the README's test command stays within 5 minutes
def test_cuda_launchers_emulated_on_the_host(emulated_cuda):
    """The CUDA C++ implementation of pcops::nms_bev / nms_bev_batched (argument order, shapes,
    padding, the rank and the torch.sort paths, groups, pre/post, the variable-length form) on CPU
    tensors, every kernel emulated on the host, vs the reference."""
    from pcops import nms as op

    boxes, scores, g = _batched_case(2, 140, (12, 12), seed=40, groups=True)
    boxes[:, 3, 3] = 1.0
    for b in range(2):
        for pre, post, padded, idxs in [(None, 200, True, None), (100, 9, True, g[b]), (None, None, False, None)]:
            got = op._nms_run("cuda", boxes[b], scores[b], idxs, 0.1, pre, post, padded)
            want = ref.nms_bev(boxes[b], scores[b], 0.1, pre, post, idxs)
            if padded:
                assert got[0].shape == (post,) and got[1].shape == () and int(got[1]) == want.numel()
                assert got[0][: want.numel()].tolist() == want.tolist() and (got[0][want.numel() :] == -1).all()
            else:
                assert got[0].tolist() == want.tolist() and int(got[1]) == want.numel()
    for idxs, pre, post, sc in [(None, None, 150, scores), (g, 90, 20, scores), (None, 120, 30, scores.double())]:
        idx, count = op._nms_batched_run("cuda", boxes, sc, idxs, 0.2, pre, post)
        want_idx, want_count = _loop_padded(boxes, sc, 0.2, pre, post, idxs)
        assert torch.equal(idx, want_idx) and torch.equal(count, want_count)
    bev16 = boxes[..., [0, 1, 3, 4, 6]].half()  # 5 columns, cast to float32 by the launcher
    idx, count = op._nms_batched_run("cuda", bev16, scores, None, 0.2, None, 40)
    want_idx, want_count = _loop_padded(bev16, scores, 0.2, None, 40)
    assert torch.equal(idx, want_idx) and torch.equal(count, want_count)
    # a pass with fewer threads than words (several words per worker) gives the default's outputs
    bx, sx = make_boxes(2600, seed=2650, span=(40, 40))
    order, sbox, _ = emulated_cuda.rank_prepare(bx[None], sx[None], None, 2600)
    mask, invalid = emulated_cuda.mask_b(sbox, None, 0.01)
    want = emulated_cuda.pass_b(mask, invalid, order, 2600)
    got = emulated_cuda.pass_b(mask, invalid, order, 2600, threads=64)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="threads"):
        emulated_cuda.pass_b(mask, invalid, order, 2600, threads=100)


# --- the numba CPU path (pcops.cpu.nms) against the reference -------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,thr", [(0, 0.5), (1, 0.5), (67, 0.0), (131, 0.01), (257, 0.5), (400, 0.7)])
def test_nms_cpu_fast_path_equals_reference(n, thr, threads):
    pytest.importorskip("numba")
    torch.set_num_threads(threads)
    boxes, scores = make_boxes(n, seed=n + 11, span=(15, 15))
    if n > 5:
        scores[::4] = scores[:1].clone()  # ties
        scores[3] = float("nan")
        boxes[5, 0] = float("inf")
    for kw in ({}, dict(pre_max_size=50), dict(post_max_size=7)):
        want = ref.nms_bev(boxes, scores, thr, **kw)
        assert pcops.nms_bev(boxes, scores, thr, **kw).tolist() == want.tolist()
    groups = torch.randint(0, 3, (n,), generator=generator(n))
    want = ref.nms_bev(boxes, scores, thr, idxs=groups)
    assert pcops.batched_nms_bev(boxes, scores, groups, thr).tolist() == want.tolist()
    idx, count = pcops.nms_bev(boxes, scores, thr, post_max_size=9, padded=True)
    ridx, rcount = ref.nms_bev_padded(boxes, scores, thr, None, 9)
    assert torch.equal(idx, ridx) and int(count) == int(rcount)
