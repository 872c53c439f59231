"""pcops.nms: rotated BEV/3D IoU and rotated NMS: reference vs an independent oracle, hard cases,
threshold-edge cases, Triton (interpreter) and CUDA paths, registration, bad input."""
import functools
import math

import pytest
import torch

import pcops
from pcops.reference import nms as ref
from _util import generator, interpret, requires_cuda, run_compiler_script



@pytest.fixture(scope="module", autouse=True)
def _one_cpu_thread():
    """The float64 reference runs many small elementwise ops: with several intra-op threads on a
    busy or over-subscribed host they run 10-50x slower than on one thread (measured: 0.07 s on one
    thread vs 2.3 s on two for a 700 x 333 IoU matrix on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- inputs ---------------------------------------------------------------------------------


def make_boxes(n, seed, span=(69.12, 79.36), dtype=torch.float32, device="cpu"):
    """OpenPCDet-like car boxes (WORKLOADS.md ranges) in an area ``span`` metres wide, and scores."""
    g = generator(seed)
    u = lambda lo, hi: lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)
    boxes = torch.stack([
        u(0, span[0]), u(-span[1] / 2, span[1] / 2), u(-2, 0),
        u(3.2, 4.7), u(1.4, 2.0), u(1.4, 1.7), u(-math.pi, math.pi),
    ], 1)
    scores = torch.rand(n, generator=g, dtype=torch.float64)
    return boxes.to(dtype).to(device), scores.float().to(device)


def hard_cases():
    """Row-aligned ``(a, b)`` float32 ``(P, 7)`` pairs: the hard cases of issue 5."""
    rows = []
    for cx, cy in [(0.0, 0.0), (70.0, -39.5), (69.12, 39.68)]:
        for h in [0.0, 0.3, -1.2, math.pi / 2, math.pi, 2.9]:
            for dx, dy in [(3.9, 1.6), (4.0, 0.05), (0.6, 0.6), (4.0, 0.01)]:
                base = [cx, cy, -1.0, dx, dy, 1.5, h]
                c, s = math.cos(h), math.sin(h)
                rows.append((base, base))  # identical
                for d in (1e-4, -1e-4):  # shifted by 0.1 mm
                    rows.append((base, [cx + d, cy, -1.0, dx, dy, 1.5, h]))
                    rows.append((base, [cx + d * c, cy + d * s, -1.0, dx, dy, 1.5, h]))
                    rows.append((base, [cx - d * s, cy + d * c, -1.0, dx, dy, 1.5, h]))
                for k in (1, 2, 3, -1):  # the same rectangle, heading + k * 90 degrees
                    ddx, ddy = (dy, dx) if k % 2 else (dx, dy)
                    rows.append((base, [cx, cy, -1.0, ddx, ddy, 1.5, h + k * math.pi / 2]))
                rows.append((base, [cx, cy, -1.0, dx * 0.5, dy * 0.5, 1.5, h]))  # nested, same centre
                rows.append((base, [cx + 0.2 * dx * c, cy + 0.2 * dx * s, -1.0, dx * 0.5, dy * 0.5, 1.5, h + 0.01]))
                rows.append((base, [cx, cy, -1.0, dx, dy, 1.5, h + 0.3]))  # same centre, rotated
                for f in (1.0, 0.5, 0.25):  # shared edge (f = 1: touching), collinear overlaps
                    rows.append((base, [cx + f * dx * c, cy + f * dx * s, -1.0, dx, dy, 1.5, h]))
                    rows.append((base, [cx - f * dy * s, cy + f * dy * c, -1.0, dx, dy, 1.5, h]))
                rows.append((base, [cx + dx * c - dy * s, cy + dx * s + dy * c, -1.0, dx, dy, 1.5, h]))  # corner
                rows.append((base, [cx, cy, -1.0, dx, dy, 1.5, h + 1.0]))  # crossing
                rows.append((base, [cx + 0.1, cy - 0.05, -1.0, dx, dy, 1.5, h + 0.001]))
    a = torch.tensor([r[0] for r in rows], dtype=torch.float64).float()
    b = torch.tensor([r[1] for r in rows], dtype=torch.float64).float()
    return a, b


def pair_iou(fn, a, b, chunk=64):
    """Row-aligned IoU through a matrix function (diagonals of chunk × chunk blocks)."""
    return torch.cat([fn(a[i:i + chunk], b[i:i + chunk]).diagonal() for i in range(0, a.shape[0], chunk)]).double()


# --- an independent oracle: textbook Sutherland–Hodgman with Python floats ------------------


def _sh_iou(a, b):
    """IoU of two (x, y, dx, dy, heading) rectangles: clip a by b (variable-length polygons)."""
    ox, oy = a[0], a[1]

    def corners(x, y, dx, dy, h):
        c, s = math.cos(h), math.sin(h)
        return [(x - ox + c * u - s * v, y - oy + s * u + c * v)
                for u, v in ((dx / 2, dy / 2), (-dx / 2, dy / 2), (-dx / 2, -dy / 2), (dx / 2, -dy / 2))]

    poly, clip = corners(*a), corners(*b)
    for k in range(4):
        (x1, y1), (x2, y2) = clip[k], clip[(k + 1) % 4]
        side = lambda p: (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1)
        out = []
        for i in range(len(poly)):
            cur, prev = poly[i], poly[i - 1]
            sc, sp = side(cur), side(prev)
            if (sc >= 0) != (sp >= 0):
                t = sp / (sp - sc)
                out.append((prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])))
            if sc >= 0:
                out.append(cur)
        poly = out
        if not poly:
            return 0.0
    inter = abs(math.fsum(poly[i - 1][0] * poly[i][1] - poly[i][0] * poly[i - 1][1] for i in range(len(poly)))) / 2
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def _greedy_oracle(iou, order, valid, thr):
    """Textbook greedy NMS on a precomputed IoU matrix (sorted positions) → kept sorted positions."""
    keep = []
    iou = iou.numpy()
    for i in range(len(order)):
        if valid[i] and all(iou[k, i] <= thr for k in keep):
            keep.append(i)
    return keep


# --- the reference ----------------------------------------------------------------------------


def test_reference_matches_textbook_clipping_on_hard_cases_and_random_pairs():
    a, b = hard_cases()
    ra, rb = make_boxes(300, seed=1, span=(8, 8))[0], make_boxes(300, seed=2, span=(8, 8))[0]
    a, b = torch.cat([a, ra]).double(), torch.cat([b, rb]).double()
    got = torch.stack([ref.boxes_iou_bev(a[i:i + 1], b[i:i + 1])[0, 0] for i in range(a.shape[0])])
    assert (ref.boxes_iou_bev_aligned(a, b) - got).abs().max() < 1e-12
    bev = lambda t: t[[0, 1, 3, 4, 6]].tolist()
    want = torch.tensor([_sh_iou(bev(a[i]), bev(b[i])) for i in range(a.shape[0])], dtype=torch.float64)
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
    assert got.shape == (40, 40) and got.dtype == torch.float32 and (got <= pcops.boxes_iou_bev(boxes, boxes) + 1e-7).all()


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
    assert int(count) == full.numel() and idx[:int(count)].tolist() == full.tolist() and (idx[int(count):] == -1).all()
    order = torch.sort(scores, descending=True, stable=True).indices[:40]
    pre = pcops.nms_bev(boxes, scores, 0.2, pre_max_size=40)
    assert pre.tolist() == order[pcops.nms_bev(boxes[order], scores[order], 0.2)].tolist()
    # groups never suppress each other: equal to per-group NMS, merged by score
    groups = torch.randint(0, 3, (150,), generator=generator(1))
    got = pcops.batched_nms_bev(boxes, scores, groups, 0.2)
    per = torch.cat([torch.nonzero(groups == g).view(-1)[pcops.nms_bev(boxes[groups == g], scores[groups == g], 0.2)]
                     for g in range(3)])
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


@pytest.mark.parametrize("bad,exc,name", [
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
])
def test_nms_bad_input(bad, exc, name):
    args = dict(boxes=torch.ones(4, 7), scores=torch.zeros(4), iou_threshold=0.5)
    args.update(bad)
    with pytest.raises(exc, match=name):
        pcops.nms_bev(**args)


def test_iou_and_batched_bad_input():
    with pytest.raises(ValueError, match="boxes_b"):
        pcops.boxes_iou_bev(torch.ones(2, 7), torch.ones(2, 4))
    with pytest.raises(ValueError, match="boxes_a"):
        pcops.boxes_iou_3d(torch.ones(2, 5), torch.ones(2, 7))
    with pytest.raises(ValueError, match="boxes_a"):
        pcops.boxes_iou_bev(torch.tensor([[0.0, 0, -1, 1, 0]]), torch.ones(2, 5))
    with pytest.raises(ValueError, match="idxs"):
        pcops.batched_nms_bev(torch.ones(4, 7), torch.zeros(4), torch.zeros(3, dtype=torch.int64), 0.5)
    with pytest.raises(TypeError, match="idxs"):
        pcops.batched_nms_bev(torch.ones(4, 7), torch.zeros(4), torch.zeros(4), 0.5)


def test_opcheck():
    boxes, scores = make_boxes(37, seed=8, span=(10, 10))
    torch.library.opcheck(torch.ops.pcops.boxes_iou_bev, (boxes, boxes[:11], "auto"))
    torch.library.opcheck(torch.ops.pcops.boxes_iou_3d, (boxes.double(), boxes[:5].double(), "auto"))
    groups = torch.arange(37) % 2
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, 20, True, "auto"))
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, groups, 0.3, 30, 10, True, "auto"))
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, None, False, "auto"),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


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
    assert idx[:int(count)].tolist() == want[:8].tolist() and (idx[int(count):] == -1).all() and idx.shape == (8,)


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


# GPU tests stay fast (the whole file's ``-m gpu`` run well under a minute on the H200): the CUDA
# C++ backend (one NVRTC compile, cached) gets every case; the Triton backend, whose kernels
# compile per specialisation (dtype, layout, groups) and whose mask kernel clips whole tiles, gets
# float32 (N, 7) boxes at small sizes only (its logic is covered by the interpreter tests).
_IOU_CASES = [("cuda", dt) for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
_IOU_CASES.append(("triton", torch.float32))
# The Triton NMS kernels take ~50 s to compile on the H200 host: their GPU cases are marked
# ``slow`` instead of ``gpu`` (run them with ``-m slow`` on a GPU machine).
_GPU, _SLOW_GPU = [pytest.mark.gpu], [pytest.mark.slow]


def _backend_params(cuda_cases, triton_cases):
    return ([pytest.param(*c, marks=_GPU) for c in cuda_cases]
            + [pytest.param(*c, marks=_SLOW_GPU) for c in triton_cases])


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


def _check_keep(got, want, boxes, scores, thr):
    """Equal keep lists, unless an IoU lies within 1e-6 of the threshold (then no assertion)."""
    if got.tolist() != want.tolist():
        order = torch.sort(scores, descending=True, stable=True).indices
        dev = "cuda" if torch.cuda.is_available() else "cpu"  # the float64 reference, on the GPU for speed
        iou = ref.boxes_iou_bev(boxes[order].to(dev), boxes[order].to(dev)).cpu()
        assert ((iou - thr).abs() < 1e-6).any(), "keep lists differ away from the threshold"


def _ref_nms(boxes, scores, thr, **kw):
    """The float64 reference, run on the GPU (plain torch on any device) for speed."""
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return ref.nms_bev(boxes.cuda(), scores.cuda(), thr, **kw).cpu()


@functools.lru_cache(maxsize=None)
def _nms_case(n, span, thr):
    """Inputs and reference keep lists of one ``test_gpu_nms_matches_reference`` case (shared by
    both backends): boxes, scores, groups, plain / pre-post / grouped keep lists."""
    boxes, scores = make_boxes(n, seed=n, span=span)
    scores[::3] = scores[:1].clone()
    pre = max(1, n - n // 4)
    groups = torch.randint(0, 4, (n,), generator=generator(n))
    return (boxes, scores, groups, pre, _ref_nms(boxes, scores, thr),
            _ref_nms(boxes, scores, thr, pre_max_size=pre, post_max_size=100),
            _ref_nms(boxes, scores, thr, idxs=groups))


@pytest.mark.parametrize("backend,n", _backend_params([("cuda", n) for n in (1, 63, 64, 65, 1000, 4096)],
                                                      [("triton", 65), ("triton", 300)]))
@requires_cuda
def test_gpu_nms_matches_reference(backend, n):
    configs = [((69.12, 79.36), 0.01), ((69.12, 79.36), 0.5)]
    if n <= 1000:  # dense scenes: many suppressions
        configs += [((20, 20), 0.1), ((20, 20), 0.7)]
    for span, thr in configs:
        boxes, scores, groups, pre, want, want_pre, want_groups = _nms_case(n, span, thr)
        got = pcops.nms_bev(boxes.cuda(), scores.cuda(), thr, backend=backend).cpu()
        _check_keep(got, want, boxes, scores, thr)
        idx, count = pcops.nms_bev(boxes.cuda(), scores.cuda(), thr, pre_max_size=pre,
                                   post_max_size=100, padded=True, backend=backend)
        _check_keep(idx[:int(count)].cpu(), want_pre, boxes, scores, thr)
        assert (idx[int(count):] == -1).all()
        if backend == "cuda":  # Triton: one more compilation (HAS_GROUPS); the interpreter tests cover it
            got = pcops.batched_nms_bev(boxes.cuda(), scores.cuda(), groups.cuda(), thr, backend=backend).cpu()
            _check_keep(got, want_groups, boxes, scores, thr)


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
    for e in ([edge, edge[:, [0, 1, 3, 4, 6]]] if backend == "cuda" else [edge]):
        assert pcops.nms_bev(e, s, 0.6, backend=backend).tolist() == [1, 0]
        assert pcops.nms_bev(e, s, 0.5999, backend=backend).tolist() == [1]
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if backend == "cuda" else (torch.float32,)
    for dtype in dtypes:
        b, sc, want = _invalid_nms_oracle(dtype)
        _check_keep(pcops.nms_bev(b.cuda(), sc.cuda(), 0.1, backend=backend).cpu(), want, b, sc, 0.1)
    empty = torch.zeros(0, 7, device="cuda")
    empty, count = pcops.nms_bev(empty, torch.zeros(0, device="cuda"), 0.5, post_max_size=3, padded=True, backend=backend)
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
    _check_keep(idx[:int(count)].cpu(), _graph_oracle(n), b2, s2, 0.01)


@functools.lru_cache(maxsize=None)
def _graph_oracle(n=4096):
    b2, s2 = make_boxes(n, seed=17)
    return _ref_nms(b2, s2, 0.01, post_max_size=500)


@pytest.mark.gpu
@requires_cuda
def test_gpu_opcheck():
    boxes, scores = make_boxes(200, seed=18, span=(15, 15), device="cuda")
    torch.library.opcheck(torch.ops.pcops.boxes_iou_bev, (boxes, boxes[:50], "triton"))
    torch.library.opcheck(torch.ops.pcops.boxes_iou_3d, (boxes, boxes[:50], "cuda"))
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, 60, True, "cuda"))


@pytest.mark.slow
@requires_cuda
def test_gpu_triton_nms_opcheck():
    """opcheck of both NMS ops with the Triton backend on CUDA (slow: Triton compilations)."""
    boxes, scores = make_boxes(200, seed=18, span=(15, 15), device="cuda")
    torch.library.opcheck(torch.ops.pcops.nms_bev, (boxes, scores, None, 0.3, None, 60, True, "triton"))
    small, small_s, _ = _batched_case(2, 100, (12, 12), seed=36)
    small[:, 3, 3] = 1.0
    torch.library.opcheck(torch.ops.pcops.nms_bev_batched, (small.cuda(), small_s.cuda(), None, 0.3, None, 30, "triton"))


@interpret
def test_triton_interpreter_cuda_registration_with_triton_backend():
    """The CUDA kernel registration's orchestration (sort, pre/post, padding, sync) on CPU tensors."""
    from pcops import nms as op

    boxes, scores = make_boxes(70, seed=19, span=(10, 10))
    groups = torch.arange(70) % 2
    idx, count = op._nms_bev_cuda(boxes, scores, groups, 0.2, 50, 12, True, "triton")
    want = ref.nms_bev(boxes, scores, 0.2, pre_max_size=50, post_max_size=12, idxs=groups)
    assert idx[:int(count)].tolist() == want.tolist() and idx.shape == (12,)
    keep, count = op._nms_bev_cuda(boxes, scores, None, 0.2, None, None, False, "triton")
    assert keep.tolist() == ref.nms_bev(boxes, scores, 0.2).tolist() and int(count) == keep.numel()


_AOT = r'''
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
'''


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


_HOST_SHIM = r"""
#include <cmath>
#define __device__
#define __forceinline__ inline
"""
_HOST_MAIN = r"""
extern "C" void iou_pairs(const float* a, const float* b, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    Box A = load_box(a, i, 7, 0, true), B = load_box(b, i, 7, 0, true);
    float inter = (A.ok && B.ok && circles_touch(A, B)) ? pair_inter(A, B) : 0.f;
    float sa = A.ok ? A.dx * A.dy : 0.f, sb = B.ok ? B.dx * B.dy : 0.f;
    float u = sa + sb - inter;
    out[i] = u > 0.f ? inter / u : 0.f;
  }
}
"""


def test_cuda_geometry_compiled_for_the_host(tmp_path):
    """csrc/nms.cu's device geometry (everything before the kernels), compiled as host C++ with FMA
    contraction like nvcc's default, matches the reference on the hard cases and random pairs."""
    import ctypes
    import shutil
    import subprocess

    from pcops import _nvrtc

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = (_nvrtc.CSRC_DIR / "nms.cu").read_text()
    helpers = src[: src.index("// IoU matrix: one thread per pair.")]
    for f in ("fabsf", "fminf", "fmaxf", "floorf", "sqrtf"):
        helpers = helpers.replace(f, "std::" + f[:-1])
    (tmp_path / "geo.cpp").write_text(_HOST_SHIM + helpers + _HOST_MAIN)
    lib_path = tmp_path / "libgeo.so"
    flags = ["-O2", "-ffp-contract=fast", "-shared", "-fPIC"]
    res = subprocess.run([cxx, *flags, "-o", str(lib_path), str(tmp_path / "geo.cpp")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    lib = ctypes.CDLL(str(lib_path))

    def host_iou(a, b):
        a, b = a.float().contiguous(), b.float().contiguous()
        out = torch.empty(a.shape[0])
        lib.iou_pairs(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), a.shape[0], ctypes.c_void_p(out.data_ptr()))
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


# --- the CUDA kernels, emulated on the host ---------------------------------------------------
# csrc/nms.cu compiled as host C++ with a SIMT shim: one std::thread per CUDA thread, blocks run one
# after another, std::barrier for __syncthreads and for the warp intrinsics (ballot, shuffles,
# OR-reduction; every lane must reach them, as on the GPU: a missed one deadlocks, caught by the
# subprocess timeout). Checks the kernels' logic (tiles, pipelining, rounds, early exit, padding,
# the batched rank sort, mask and pass) against plain greedy loops and the reference; the GPU
# tests check them on the device.

_SIMT_SHIM = r"""
#include <math.h>
#include <string.h>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* g_block;
struct Warp { std::barrier<> bar{32}; unsigned long long slot[32]; };
static Warp* g_warps;
static unsigned long long* g_dyn_smem;
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline void __syncthreads() { g_block->arrive_and_wait(); }
static int g_sync_or;
static inline int __syncthreads_or(int p) {
  if (p) __atomic_fetch_or(&g_sync_or, 1, __ATOMIC_RELAXED);
  g_block->arrive_and_wait();
  const int r = __atomic_load_n(&g_sync_or, __ATOMIC_RELAXED);
  g_block->arrive_and_wait();
  if (threadIdx.x == 0) g_sync_or = 0;
  g_block->arrive_and_wait();
  return r;
}
template <class F> static unsigned long long warp_op(unsigned long long v, F f) {
  Warp& w = g_warps[threadIdx.x / 32];
  w.slot[threadIdx.x % 32] = v;
  w.bar.arrive_and_wait();
  unsigned long long r = f(w.slot);
  w.bar.arrive_and_wait();
  return r;
}
static inline unsigned __ballot_sync(unsigned, bool p) {
  return (unsigned)warp_op(p, [](unsigned long long* s) {
    unsigned long long r = 0; for (int i = 0; i < 32; ++i) r |= (unsigned long long)(s[i] != 0) << i; return r; });
}
static inline unsigned __reduce_or_sync(unsigned, unsigned v) {
  return (unsigned)warp_op(v, [](unsigned long long* s) {
    unsigned long long r = 0; for (int i = 0; i < 32; ++i) r |= s[i]; return r; });
}
static inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
  return (unsigned)warp_op(v, [src](unsigned long long* s) { return s[src & 31]; });
}
static inline int __shfl_sync(unsigned, int v, int src) {
  return (int)(unsigned)warp_op((unsigned)v, [src](unsigned long long* s) { return s[src & 31]; });
}
static inline int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x % 32;
  return (int)(unsigned)warp_op((unsigned)v, [lane, d](unsigned long long* s) { return s[lane >= d ? lane - d : lane]; });
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return old;
}
// one block of `threads` CUDA threads (a multiple of 32)
static void run_block(unsigned bx, unsigned by, int threads, const std::function<void()>& k) {
  blockIdx.x = bx;
  blockIdx.y = by;
  blockDim.x = threads;
  g_block = new std::barrier<>(threads);
  g_warps = new Warp[threads / 32];
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back([&, i] { threadIdx.x = i; k(); });
  for (auto& th : pool) th.join();
  delete g_block;
  delete[] g_warps;
}
"""

_SIMT_MAIN = r"""
template <class T> static bool get(std::vector<T>& v) { return fread(v.data(), sizeof(T), v.size(), stdin) == v.size(); }
template <class T> static void put(const std::vector<T>& v) { fwrite(v.data(), sizeof(T), v.size(), stdout); }
// stdin: records, each an int32 mode then its header and arrays; stdout: the outputs per record.
//  mode 1, 2 (nms_pass, nms_pass_v2): threads, m, words, post, stride, bev5, n; mask, boxes, scores,
//    order -> post int64 indices, the count.
//  mode 3 (the batched pipeline: nms_rank or nms_gather, nms_mask_b, nms_pass_b): B, N, M, stride,
//    bev5, has_groups, use_rank, post, pass threads, thr (float32); boxes, scores, groups (B N int64),
//    order (B M int64, for nms_gather) -> order, sbox, mask, invalid, out, count.
int main() {
  int mode;
  while (fread(&mode, 4, 1, stdin) == 1) {
    if (mode == 1 || mode == 2) {
      int h[7];
      if (fread(h, 4, 7, stdin) != 7) return 2;
      const int threads = h[0], m = h[1], words = h[2], post = h[3], stride = h[4], bev5 = h[5], n = h[6];
      std::vector<unsigned long long> mask((size_t)m * words);
      std::vector<float> boxes((size_t)n * stride), scores(n);
      std::vector<long long> order(m), out(post), count(1);
      if (!get(mask) || !get(boxes) || !get(scores) || !get(order)) return 2;
      std::vector<unsigned long long> smem(words + 1, 0x5a5a5a5a5a5a5a5aull);  // garbage, as on the GPU
      g_dyn_smem = smem.data();
      run_block(0, 0, threads, [&] {
        (mode == 2 ? nms_pass_v2 : nms_pass)(mask.data(), boxes.data(), scores.data(), order.data(), m, words, post,
                                             stride, bev5, out.data(), count.data());
      });
      put(out);
      put(count);
    } else if (mode == 3) {
      int h[9];
      float thr;
      if (fread(h, 4, 9, stdin) != 9 || fread(&thr, 4, 1, stdin) != 1) return 2;
      const int B = h[0], n = h[1], m = h[2], stride = h[3], bev5 = h[4], has_groups = h[5], use_rank = h[6];
      const int post = h[7], threads = h[8], words = (m + 63) / 64;
      std::vector<float> boxes((size_t)B * n * stride), scores((size_t)B * n);
      std::vector<long long> groups((size_t)B * n), order((size_t)B * m, -7), sgroups((size_t)B * m, -7);
      if (!get(boxes) || !get(scores) || !get(groups) || !get(order)) return 2;
      std::vector<float> sbox((size_t)B * m * 8, -7.f);
      std::vector<unsigned long long> mask((size_t)B * m * words, 0x5a5a5a5a5a5a5a5aull), invalid((size_t)B * words, 7);
      std::vector<long long> out((size_t)B * post, -7), count(B, -7);
      for (int b = 0; b < B; ++b) {
        if (use_rank) {
          for (int x = 0; x < (n + 31) / 32; ++x)
            run_block(x, b, 256, [&] {
              nms_rank(boxes.data(), scores.data(), groups.data(), has_groups, n, m, stride, bev5, order.data(),
                       sbox.data(), sgroups.data());
            });
        } else {
          for (int x = 0; x < (m + 63) / 64; ++x)
            run_block(x, b, 64, [&] {
              nms_gather(boxes.data(), scores.data(), groups.data(), has_groups, n, m, stride, bev5, order.data(),
                         sbox.data(), sgroups.data());
            });
        }
        for (int L = 0; L < words * (words + 1) / 2; ++L)
          run_block(L, b, 64, [&] {
            nms_mask_b(sbox.data(), sgroups.data(), has_groups, m, words, thr, mask.data(), invalid.data());
          });
      }
      std::vector<unsigned long long> smem(words + 1, 0x5a5a5a5a5a5a5a5aull);
      g_dyn_smem = smem.data();
      for (int b = 0; b < B; ++b)
        run_block(b, 0, threads, [&] {
          nms_pass_b(mask.data(), invalid.data(), order.data(), m, words, post, out.data(), count.data());
        });
      put(order);
      put(sbox);
      put(mask);
      put(invalid);
      put(out);
      put(count);
    } else {
      return 3;
    }
  }
  return 0;
}
"""


@functools.lru_cache(maxsize=None)
def _simt_binary(tmp_dir):
    """csrc/nms.cu (every kernel) with the SIMT shim, compiled for the host."""
    import shutil
    import subprocess
    from pathlib import Path

    from pcops import _nvrtc

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = (_nvrtc.CSRC_DIR / "nms.cu").read_text()
    src = src.replace("extern __shared__ unsigned long long removed[];", "unsigned long long* removed = g_dyn_smem;")
    src = src.replace("__shared__", "static").replace('extern "C" ', "")
    cpp = Path(tmp_dir) / "nms_host.cpp"
    cpp.write_text(_SIMT_SHIM + src + _SIMT_MAIN)
    exe = Path(tmp_dir) / "nms_emu"
    res = subprocess.run([cxx, "-std=c++20", "-O1", "-fno-strict-aliasing", "-pthread", "-o", str(exe), str(cpp)],
                         capture_output=True, text=True)
    if res.returncode != 0 and "barrier" in res.stderr and "No such file" in res.stderr:
        pytest.skip("the host C++ library has no <barrier>")
    assert res.returncode == 0, res.stderr[-3000:]
    return str(exe)


def _pass_case(m, n, density, seed, chain=False):
    """A random strictly upper-triangular ``(m, ceil(m/64))`` bitmask, boxes with a few invalid ones
    (negative size, infinite centre, NaN score) and a random order of m of the n boxes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = -(-m // 64)
    bits = np.triu(rng.random((m, words * 64)) < density, 1)
    if chain:  # each box suppresses the next: the in-tile greedy is one long dependency chain
        bits[np.arange(m - 1), np.arange(1, m)] = True
    bits[:, m:] = False
    mask = np.packbits(bits, axis=1, bitorder="little").view("<u8").reshape(m, words)
    boxes = np.stack([rng.uniform(0, 60, n), rng.uniform(-30, 30, n), rng.uniform(-2, 0, n),
                      rng.uniform(3, 5, n), rng.uniform(1, 2, n), rng.uniform(1, 2, n), rng.uniform(-3, 3, n)], 1)
    boxes = boxes.astype(np.float32)
    scores = rng.random(n).astype(np.float32)
    bad = rng.choice(n, size=max(1, n // 20), replace=False)
    boxes[bad[0::3], 3] = -1.0
    boxes[bad[1::3], 0] = np.inf
    scores[bad[2::3]] = np.nan
    order = rng.permutation(n)[:m].astype(np.int64)
    return mask, bits, boxes, scores, order


def _greedy_on_mask(bits, boxes, scores, order, post):
    import numpy as np

    valid = np.isfinite(boxes).all(1) & (boxes[:, 3:6] >= 0).all(1) & ~np.isnan(scores)
    removed = ~valid[order]
    keep = []
    for i in range(len(order)):
        if not removed[i]:
            keep.append(int(order[i]))
            removed |= bits[i, :len(order)]
    count = min(len(keep), post)
    return keep[:post] + [-1] * (post - count), count


@pytest.mark.parametrize("threads", [96, 1024])
def test_cuda_pass_kernels_emulated_on_the_host(tmp_path_factory, threads):
    """nms_pass and nms_pass_v2 give the plain greedy result of random bitmasks (sparse, dense and
    chained), with early exit at post and -1 padding; 96 threads make nms_pass_v2's workers loop
    over more words than threads."""
    import struct
    import subprocess

    import numpy as np

    exe = _simt_binary(str(tmp_path_factory.mktemp("simt")))
    cases = [(1, 1, 0.0, 5), (63, 80, 0.05, 70), (64, 64, 0.3, 64), (65, 100, 0.02, 3), (300, 320, 0.01, 300),
             (300, 320, 0.2, 400), (700, 700, 0.003, 50), (200, 210, 0.0, 200, True), (250, 250, 0.01, 0)]
    if threads == 96:
        cases += [(4300, 4400, 0.0004, 4300)]
    payload, expected = b"", []
    for k, (m, n, density, post, *chain) in enumerate(cases):
        mask, bits, boxes, scores, order = _pass_case(m, n, density, seed=k, chain=bool(chain))
        expected.append(_greedy_on_mask(bits, boxes, scores, order, post))
        for variant in (1, 2):
            payload += struct.pack("8i", variant, threads, m, mask.shape[1], post, 7, 0, n)
            payload += mask.tobytes() + boxes.tobytes() + scores.tobytes() + order.tobytes()
    res = subprocess.run([exe], input=payload, capture_output=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = np.frombuffer(res.stdout, dtype=np.int64)
    at = 0
    for (m, n, density, post, *chain), (want, want_count) in zip(cases, expected):
        for variant in (1, 2):
            out, count = got[at:at + post].tolist(), int(got[at + post])
            at += post + 1
            assert (out, count) == (want, want_count), f"nms_pass v{variant}, m={m}, density={density}, post={post}"
    assert at == got.size


def _cuda_pass(variant):
    """``pcops.cuda.nms`` with the greedy pass kernel ``variant`` (private: ``"v1"`` = ``nms_pass``,
    ``"v2"`` = ``nms_pass_v2``), for ``tri.nms_bev``."""
    import types

    from pcops.cuda import nms as cuda_impl

    return types.SimpleNamespace(nms_sorted=functools.partial(cuda_impl.nms_sorted, pass_variant=variant))


def test_cuda_pass_variant_is_checked():
    from pcops.cuda import nms as cuda_impl

    z = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="pass_variant"):
        cuda_impl.nms_pass(z, torch.zeros(1, 7), torch.zeros(1), torch.zeros(1, dtype=torch.int64), 1, pass_variant="v3")


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4096])
@pytest.mark.gpu
@requires_cuda
def test_gpu_nms_pass_v2_matches_v1_and_reference(n):
    """nms_pass_v2 gives exactly nms_pass's outputs (indices, padding, count) on the cases of
    test_gpu_nms_matches_reference: plain, pre/post padded and grouped."""
    from pcops.triton import nms as tri

    cuda_impl, v2 = _cuda_pass("v1"), _cuda_pass("v2")
    configs = [((69.12, 79.36), 0.01), ((69.12, 79.36), 0.5)]
    if n <= 1000:
        configs += [((20, 20), 0.1), ((20, 20), 0.7)]
    for span, thr in configs:
        boxes, scores, groups, pre, want, want_pre, want_groups = _nms_case(n, span, thr)
        b, s, g = boxes.cuda(), scores.cuda(), groups.cuda()
        for idxs, pre_max, post, padded, want_keep in [(None, None, None, False, want), (None, pre, 100, True, want_pre),
                                                       (g, None, None, False, want_groups), (None, None, 7, True, want)]:
            idx1, count1 = tri.nms_bev(b, s, idxs, thr, pre_max, post, padded, cuda_impl)
            idx2, count2 = tri.nms_bev(b, s, idxs, thr, pre_max, post, padded, v2)
            assert idx2.tolist() == idx1.tolist() and int(count2) == int(count1), (n, span, thr, pre_max, post)
            k = int(count2)
            _check_keep(idx2[:k].cpu(), want_keep[:k] if post == 7 else want_keep, boxes, scores, thr)
            if padded:
                assert (idx2[k:] == -1).all()


@pytest.mark.gpu
@requires_cuda
def test_gpu_nms_pass_v2_invalid_boxes_and_graph():
    """nms_pass_v2 on boxes with a negative size, an infinite centre and a NaN score, and inside a
    CUDA graph (replayed on new boxes): the same outputs as nms_pass."""
    from pcops.triton import nms as tri

    cuda_impl, v2 = _cuda_pass("v1"), _cuda_pass("v2")
    b, sc, want = _invalid_nms_oracle(torch.float32)
    b, sc = b.cuda().contiguous(), sc.cuda()
    got1 = tri.nms_bev(b, sc, None, 0.1, None, None, False, cuda_impl)
    got2 = tri.nms_bev(b, sc, None, 0.1, None, None, False, v2)
    assert got2[0].tolist() == got1[0].tolist() and int(got2[1]) == int(got1[1])
    _check_keep(got2[0].cpu(), want, b.cpu(), sc.cpu(), 0.1)
    boxes, scores = make_boxes(4096, seed=16)
    static_b, static_s = boxes.cuda(), scores.cuda()
    fn = lambda impl: tri.nms_bev(static_b, static_s, None, 0.01, None, 500, True, impl)
    fn(v2)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, count = fn(v2)
    b2, s2 = make_boxes(4096, seed=17)
    static_b.copy_(b2)
    static_s.copy_(s2)
    graph.replay()
    idx1, count1 = fn(cuda_impl)
    assert idx.tolist() == idx1.tolist() and int(count) == int(count1)
    _check_keep(idx[:int(count)].cpu(), _graph_oracle(), b2, s2, 0.01)


def test_cuda_pass_kernels_compile_without_spills():
    """nms_pass, nms_pass_v2, nms_pass_b (1024 threads: at most 64 registers), nms_mask_b and
    nms_rank compile for sm_90 with no local-memory spills (ptxas' verbose log through NVRTC)."""
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
    for kernel in ("nms_pass", "nms_pass_v2", "nms_pass_b", "nms_pass_b2", "nms_mask_b", "nms_rank"):
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


@pytest.mark.parametrize("bsz,n,pre,post,span,thr,groups,use_rank,bev5,presorted", [
    (2, 150, None, 200, (14, 14), 0.1, False, True, False, False),
    (3, 70, 64, 10, (10, 10), 0.3, True, True, False, False),
    (1, 1, None, 3, (10, 10), 0.5, False, True, False, False),
    (2, 130, 129, 130, (12, 12), 0.01, True, False, True, False),
    (1, 64, None, 64, (6, 6), 0.0, False, False, False, False),
    (2, 100, 90, 50, (10, 10), 0.2, False, True, False, True),
    (1, 300, None, 300, (12, 12), 0.1, True, True, False, True),
    (2, 250, None, 100, (10, 10), 0.05, False, True, False, False),
])
def test_cuda_batched_pipeline_emulated_on_the_host(tmp_path_factory, bsz, n, pre, post, span, thr, groups,
                                                    use_rank, bev5, presorted):
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
        scores[:, n // 2:] = float("nan")
        scores = torch.stack([s[ref.sort_order(s)] for s in scores])
    elif n >= 200:  # a whole tile of invalid boxes between valid ones (its mask words stay unwritten)
        for b in range(bsz):
            boxes[b, ref.sort_order(scores[b])[64:128], 0] = float("inf")
    m = n if pre is None else min(n, pre)
    words = -(-m // 64)
    order_in = torch.stack([ref.sort_order(scores[b], pre) for b in range(bsz)])
    stride = boxes.shape[2]
    payload = struct.pack("10i", 3, bsz, n, m, stride, int(bev5), int(groups), int(use_rank), post, 96)
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
    outs = [pcops.nms_bev(boxes[b], scores[b], thr, pre, post, padded=True, backend=backend) if idxs is None else
            pcops.batched_nms_bev(boxes[b], scores[b], idxs[b], thr, pre, post, padded=True, backend=backend)
            for b in range(boxes.shape[0])]
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
    assert torch.equal(pcops.nms_bev(bev, scores, 0.2, post_max_size=9, padded=True)[0],
                       pcops.nms_bev(boxes, scores, 0.2, post_max_size=9, padded=True)[0])
    idx, count = pcops.nms_bev(boxes[:0], scores[:0], 0.2, post_max_size=4, padded=True)
    assert idx.shape == (0, 4) and count.shape == (0,)
    idx, count = pcops.nms_bev(boxes[:, :0], scores[:, :0], 0.2, post_max_size=4, padded=True)
    assert idx.tolist() == [[-1] * 4] * 3 and count.tolist() == [0] * 3


@pytest.mark.parametrize("bad,exc,name", [
    (dict(padded=False), ValueError, "padded"),
    (dict(post_max_size=None), ValueError, "post_max_size"),
    (dict(scores=torch.zeros(2, 4)), ValueError, "scores"),
    (dict(scores=torch.zeros(10)), ValueError, "scores"),
    (dict(boxes=torch.ones(3, 5, 6)), ValueError, "boxes"),
    (dict(boxes=torch.tensor([[[0.0, 0, 0, 1, -1, 1, 0]] * 5] * 3)), ValueError, "boxes"),
    (dict(iou_threshold=2.0), ValueError, "iou_threshold"),
])
def test_batched_form_bad_input(bad, exc, name):
    args = dict(boxes=torch.ones(3, 5, 7), scores=torch.zeros(3, 5), iou_threshold=0.5, post_max_size=4, padded=True)
    args.update(bad)
    with pytest.raises(exc, match=name):
        pcops.nms_bev(**args)
    with pytest.raises(ValueError, match="idxs"):
        pcops.batched_nms_bev(torch.ones(3, 5, 7), torch.zeros(3, 5), torch.zeros(3, 4, dtype=torch.int64), 0.5,
                              post_max_size=4, padded=True)


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
            want = _ref_nms(boxes[k], scores[k], thr, **kw)
            c = int(count[k])
            _check_keep(idx[k, :c], want, boxes[k], scores[k], thr)
            assert (idx[k, c:] == -1).all()
    # other layouts and dtypes: the same as per-sample calls
    for bb in (b[..., [0, 1, 3, 4, 6]], b.half()):
        idx, count = pcops.nms_bev(bb, s, 0.2, post_max_size=64, padded=True)
        want_idx, want_count = _loop_padded(bb, s, 0.2, None, 64)
        assert torch.equal(idx, want_idx) and torch.equal(count, want_count)


@pytest.mark.gpu
@requires_cuda
def test_gpu_sort_fallbacks_and_old_pipeline():
    """float64 scores and N > RANK_MAX take torch.sort + nms_gather; both equal the previous
    pipeline (torch.sort, nms_mask, nms_pass_v2) on the same boxes."""
    from pcops.cuda import nms as cuda_impl
    from pcops.triton import nms as tri

    old = _cuda_pass("v2")
    for n, dtype in [(300, torch.float64), (cuda_impl.RANK_MAX + 300, torch.float32)]:
        boxes, scores = make_boxes(n, seed=33, span=(69.12, 79.36) if n > 1000 else (15, 15))
        scores[::7] = scores[:1].clone()
        b, s = boxes.cuda(), scores.to(dtype).cuda()
        for thr, post in [(0.01, 500), (0.5, n)]:
            idx, count = pcops.nms_bev(b, s, thr, post_max_size=post, padded=True, backend="cuda")
            idx0, count0 = tri.nms_bev(b, s, None, thr, None, post, True, old)
            if not (torch.equal(idx, idx0) and int(count) == int(count0)):
                c = int(count)
                _check_keep(idx[:c].cpu(), _ref_nms(boxes, scores.to(dtype), thr, post_max_size=post), boxes,
                            scores.float(), thr)


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
    torch.library.opcheck(torch.ops.pcops.nms_bev_batched, (small.cuda(), small_s.cuda(), g.cuda(), 0.3, 64, 32, "cuda"))


# --- the Python launchers of pcops.cuda.nms, with the kernels emulated on the host ----------------

_EMU_LAUNCH = r"""
// cuLaunchKernel's calling convention (params[i] points at argument i), blocks run one by one
template <class F> static void grid_run(unsigned gx, unsigned gy, unsigned bx, F f) {
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) run_block(x, y, (int)bx, f);
}
#define P(T, i) (*(T*)p[i])
extern "C" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned bx, unsigned smem, void** p) {
  std::vector<unsigned long long> dyn(smem / 8 + 1, 0x5a5a5a5a5a5a5a5aull);
  g_dyn_smem = dyn.data();
  const std::string k(name);
  if (k == "nms_rank" || k == "nms_gather") {
    const bool rank = k == "nms_rank";
    grid_run(gx, gy, bx, [&] {
      if (rank)
        nms_rank(P(const float*, 0), P(const float*, 1), P(const long long*, 2), P(int, 3), P(int, 4), P(int, 5),
                 P(int, 6), P(int, 7), P(long long*, 8), P(float*, 9), P(long long*, 10));
      else
        nms_gather(P(const float*, 0), P(const float*, 1), P(const long long*, 2), P(int, 3), P(int, 4), P(int, 5),
                   P(int, 6), P(int, 7), P(const long long*, 8), P(float*, 9), P(long long*, 10));
    });
  } else if (k == "nms_mask_b") {
    grid_run(gx, gy, bx, [&] {
      nms_mask_b(P(const float*, 0), P(const long long*, 1), P(int, 2), P(int, 3), P(int, 4), P(float, 5),
                 P(unsigned long long*, 6), P(unsigned long long*, 7));
    });
  } else if (k == "nms_pass_b" || k == "nms_pass_b2") {
    const bool b2 = k == "nms_pass_b2";
    grid_run(gx, gy, bx, [&] {
      (b2 ? nms_pass_b2 : nms_pass_b)(P(const unsigned long long*, 0), P(const unsigned long long*, 1),
                                      P(const long long*, 2), P(int, 3), P(int, 4), P(int, 5), P(long long*, 6),
                                      P(long long*, 7));
    });
  } else if (k == "nms_mask") {
    grid_run(gx, gy, bx, [&] {
      nms_mask(P(const float*, 0), P(const long long*, 1), P(const long long*, 2), P(int, 3), P(int, 4), P(int, 5),
               P(int, 6), P(int, 7), P(float, 8), P(unsigned long long*, 9));
    });
  } else if (k == "nms_pass" || k == "nms_pass_v2") {
    const bool v2 = k == "nms_pass_v2";
    grid_run(gx, gy, bx, [&] {
      (v2 ? nms_pass_v2 : nms_pass)(P(const unsigned long long*, 0), P(const float*, 1), P(const float*, 2),
                                    P(const long long*, 3), P(int, 4), P(int, 5), P(int, 6), P(int, 7), P(int, 8),
                                    P(long long*, 9), P(long long*, 10));
    });
  } else {
    return 1;
  }
  return 0;
}
"""


@functools.lru_cache(maxsize=None)
def _emu_library(tmp_dir):
    """csrc/nms.cu with the SIMT shim as a host shared library exposing ``emu_launch``."""
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    from pcops import _nvrtc

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = (_nvrtc.CSRC_DIR / "nms.cu").read_text()
    src = src.replace("extern __shared__ unsigned long long removed[];", "unsigned long long* removed = g_dyn_smem;")
    src = src.replace("__shared__", "static").replace('extern "C" ', "")
    cpp = Path(tmp_dir) / "nms_lib.cpp"
    cpp.write_text(_SIMT_SHIM + "#include <string>\n" + src + _EMU_LAUNCH)
    lib = Path(tmp_dir) / "libnms_emu.so"
    res = subprocess.run([cxx, "-std=c++20", "-O1", "-fno-strict-aliasing", "-pthread", "-shared", "-fPIC", "-o",
                          str(lib), str(cpp)], capture_output=True, text=True)
    if res.returncode != 0 and "barrier" in res.stderr and "No such file" in res.stderr:
        pytest.skip("the host C++ library has no <barrier>")
    assert res.returncode == 0, res.stderr[-3000:]
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


def test_cuda_launchers_emulated_on_the_host(emulated_cuda):
    """The CUDA registrations of pcops::nms_bev / nms_bev_batched (argument order, shapes, padding,
    the rank and the torch.sort paths, groups, pre/post, the variable-length form, the old
    pipeline) on CPU tensors, every kernel emulated on the host, vs the reference."""
    from pcops import nms as op
    from pcops.triton import nms as tri

    boxes, scores, g = _batched_case(2, 140, (12, 12), seed=40, groups=True)
    boxes[:, 3, 3] = 1.0
    for b in range(2):
        for pre, post, padded, idxs in [(None, 200, True, None), (100, 9, True, g[b]), (None, None, False, None)]:
            got = op._nms_bev_cuda(boxes[b], scores[b], idxs, 0.1, pre, post, padded, "cuda")
            want = ref.nms_bev(boxes[b], scores[b], 0.1, pre, post, idxs)
            if padded:
                assert got[0].shape == (post,) and got[1].shape == () and int(got[1]) == want.numel()
                assert got[0][:want.numel()].tolist() == want.tolist() and (got[0][want.numel():] == -1).all()
            else:
                assert got[0].tolist() == want.tolist() and int(got[1]) == want.numel()
    for idxs, pre, post, sc in [(None, None, 150, scores), (g, 90, 20, scores), (None, 120, 30, scores.double())]:
        idx, count = op._nms_bev_batched_cuda(boxes, sc, idxs, 0.2, pre, post, "cuda")
        want_idx, want_count = _loop_padded(boxes, sc, 0.2, pre, post, idxs)
        assert torch.equal(idx, want_idx) and torch.equal(count, want_count)
    bev16 = boxes[..., [0, 1, 3, 4, 6]].half()  # 5 columns, cast to float32 by the launcher
    idx, count = op._nms_bev_batched_cuda(bev16, scores, None, 0.2, None, 40, "cuda")
    want_idx, want_count = _loop_padded(bev16, scores, 0.2, None, 40)
    assert torch.equal(idx, want_idx) and torch.equal(count, want_count)
    # the previous pipeline (torch.sort, nms_mask, nms_pass_v2 / nms_pass) through its launchers
    for variant in ("v1", "v2"):
        got, count = tri.nms_bev(boxes[0], scores[0], g[0], 0.1, None, 50, True, _cuda_pass(variant))
        want = ref.nms_bev(boxes[0], scores[0], 0.1, None, 50, g[0])
        assert got[:int(count)].tolist() == want.tolist()


@pytest.mark.parametrize("n,span,thr,post,threads", [
    (300, (15, 15), 0.1, 300, 96), (300, (15, 15), 0.1, 20, 512), (700, (30, 30), 0.01, 700, 512),
    (2600, (40, 40), 0.01, 2600, 64), (130, (6, 6), 0.3, 130, 64),
])
def test_cuda_pass_b2_emulated_on_the_host(emulated_cuda, n, span, thr, post, threads):
    """The experimental nms_pass_b2 (loads in flight across the barrier) gives nms_pass_b's outputs
    on the same masks; 64 threads with 41 words exercise its several-words-per-thread path."""
    cuda_impl = emulated_cuda
    boxes, scores = make_boxes(n, seed=n + 50, span=span)
    boxes[3, 0] = float("inf")
    scores[5] = float("nan")
    order, sbox, _ = cuda_impl.rank_prepare(boxes[None], scores[None], None, n)
    mask, invalid = cuda_impl.mask_b(sbox, None, thr)
    want = cuda_impl.pass_b(mask, invalid, order, post)
    got = cuda_impl.pass_b(mask, invalid, order, post, threads=threads, variant="b2")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ref_idx, ref_count = ref.nms_bev_padded(boxes, scores, thr, None, post)
    if not torch.equal(want[0][0], ref_idx):
        _check_keep(want[0][0][:int(want[1][0])], ref_idx[:int(ref_count)], boxes, scores, thr)
    with pytest.raises(ValueError, match="variant"):
        cuda_impl.pass_b(mask, invalid, order, post, variant="b3")


@pytest.mark.gpu
@requires_cuda
def test_gpu_pass_b2_equals_pass_b():
    """The experimental nms_pass_b2 gives nms_pass_b's outputs on the device (N1/N2-like masks,
    full and capped outputs, both block sizes)."""
    from pcops.cuda import nms as cuda_impl

    for n, thr in [(4096, 0.01), (4096, 0.5), (16384, 0.5)]:
        boxes, scores = make_boxes(n, seed=60)
        b, s = boxes.cuda(), scores.cuda()
        order, sbox, _ = cuda_impl.rank_prepare(b[None], s[None], None, n)
        mask, invalid = cuda_impl.mask_b(sbox, None, thr)
        for post in (n, 500):
            want = cuda_impl.pass_b(mask, invalid, order, post)
            for threads in (256, 512):
                got = cuda_impl.pass_b(mask, invalid, order, post, threads=threads, variant="b2")
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (n, thr, post, threads)
