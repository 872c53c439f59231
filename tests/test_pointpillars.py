"""PointPillars (models/pointpillars.py): config, anchors, checkpoints, fast path vs reference,
the fused PFN Triton kernel, CUDA graph vs eager, and the demo.

The CPU tests run one full-size forward per implementation (a few seconds each) through
module-scoped fixtures; everything else uses tiny inputs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from _util import gpu, interpret
from conftest import KITTI

from pcops.models import box_coder
from pcops.models.config import PointPillarsConfig
from pcops.models.pointpillars import PointPillars
from pcops.models.random_init import randomize_

CFG = PointPillarsConfig()


def _scan(frame: str = "000001") -> torch.Tensor:
    path = KITTI / "velodyne" / f"{frame}.bin"
    if path.exists():
        return torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(-1, 4))
    from pcops.sim import simulate_scan

    return simulate_scan(seed=int(frame)).points[:, :4].contiguous()


# --- config and anchors ------------------------------------------------------------------------


def test_config_matches_openpcdet_kitti():
    assert CFG.grid_size == (432, 496, 1)
    assert CFG.bev_hw == (496, 432)
    assert CFG.feature_map_hw == (248, 216)
    assert CFG.num_pfn_inputs == 10
    assert CFG.num_anchors_per_location == 6
    assert CFG.class_names == ("Car", "Pedestrian", "Cyclist")
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.score_thresh = 0.5  # type: ignore[misc]


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="voxel_size"):
        PointPillarsConfig(voxel_size=(0.16, 0.16))
    with pytest.raises(ValueError, match="point_cloud_range"):
        PointPillarsConfig(point_cloud_range=(0, -39.68, -3, 69.0, 39.68, 1))
    with pytest.raises(ValueError, match="upsample_strides"):
        PointPillarsConfig(upsample_strides=(1, 2))


def test_anchors_count_and_first():
    anchors = box_coder.generate_anchors(CFG)
    assert anchors.shape == (248, 216, 6, 7)
    flat = anchors.view(-1, 7)
    assert flat.shape[0] == 321_408 == CFG.num_anchors
    torch.testing.assert_close(flat[0], torch.tensor([0.0, -39.68, -1.0, 3.9, 1.6, 1.56, 0.0]))
    torch.testing.assert_close(flat[1], torch.tensor([0.0, -39.68, -1.0, 3.9, 1.6, 1.56, 1.57]))
    # class-major then rotation within a cell; pedestrian bottom -0.6 + 1.73 / 2
    torch.testing.assert_close(flat[2], torch.tensor([0.0, -39.68, 0.265, 0.8, 0.6, 1.73, 0.0]))
    torch.testing.assert_close(flat[5], torch.tensor([0.0, -39.68, 0.265, 1.76, 0.6, 1.73, 1.57]))
    # next cell along x: step 69.12 / 215 (align_center=False spans the range inclusively)
    torch.testing.assert_close(flat[6, 0], torch.tensor(69.12 / 215))
    torch.testing.assert_close(flat[-1, :2], torch.tensor([69.12, 39.68]))
    torch.testing.assert_close(anchors[1, 0, 0, 1], torch.tensor(-39.68 + 79.36 / 247))


def test_limit_period_and_direction():
    v = torch.tensor([-4.0, -0.1, 0.0, 1.0, 3.2, 7.0])
    got = box_coder.limit_period(v, 0.0, math.pi)
    assert bool(((got >= 0) & (got < math.pi)).all())
    torch.testing.assert_close(torch.remainder(got - v, math.pi), torch.zeros(6), atol=1e-5, rtol=0)
    # direction bin 1 adds π; heading - offset wrapped to [0, π)
    h = torch.tensor([0.0, 0.0, 2.0])
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    out = box_coder.apply_direction(h, logits, 0.78539, 0.0, 2)
    expect = torch.tensor([math.pi, 2 * math.pi, 2.0 + math.pi])
    torch.testing.assert_close(out, expect)


def test_decode_residual_coder():
    anchors = torch.tensor([[1.0, 2.0, -1.0, 3.9, 1.6, 1.56, 1.57]])
    deltas = torch.tensor([[0.1, -0.2, 0.3, 0.05, -0.1, 0.2, 0.4]])
    d = math.hypot(3.9, 1.6)
    expect = torch.tensor(
        [
            [
                1 + 0.1 * d,
                2 - 0.2 * d,
                -1 + 0.3 * 1.56,
                3.9 * math.exp(0.05),
                1.6 * math.exp(-0.1),
                1.56 * math.exp(0.2),
                1.97,
            ]
        ]
    )
    torch.testing.assert_close(box_coder.decode_boxes(deltas, anchors), expect)


# --- checkpoints -------------------------------------------------------------------------------

_OPENPCDET_KEYS = [
    "global_step",
    "vfe.pfn_layers.0.linear.weight",
    "vfe.pfn_layers.0.norm.weight",
    "vfe.pfn_layers.0.norm.running_var",
    "backbone_2d.blocks.0.1.weight",
    "backbone_2d.blocks.0.2.running_mean",
    "backbone_2d.blocks.0.4.weight",
    "backbone_2d.blocks.2.16.weight",
    "backbone_2d.blocks.2.17.num_batches_tracked",
    "backbone_2d.deblocks.0.0.weight",
    "backbone_2d.deblocks.2.1.bias",
    "dense_head.conv_cls.weight",
    "dense_head.conv_box.bias",
    "dense_head.conv_dir_cls.weight",
]


@pytest.fixture(scope="module")
def tiny_state():
    return randomize_(PointPillars(), seed=3).state_dict()


def test_state_dict_names_and_shapes(tiny_state):
    for k in _OPENPCDET_KEYS:
        assert k in tiny_state, k
    assert tiny_state["vfe.pfn_layers.0.linear.weight"].shape == (64, 10)
    assert tiny_state["backbone_2d.blocks.1.1.weight"].shape == (128, 64, 3, 3)
    assert tiny_state["backbone_2d.deblocks.2.0.weight"].shape == (256, 128, 4, 4)
    assert tiny_state["dense_head.conv_cls.weight"].shape == (18, 384, 1, 1)
    assert tiny_state["dense_head.conv_box.weight"].shape == (42, 384, 1, 1)
    assert tiny_state["dense_head.conv_dir_cls.weight"].shape == (12, 384, 1, 1)
    # 1 + VFE (1 linear + 5 BN) + 16 conv/BN + 3 deconv/BN (6 tensors per conv+BN) + 6 head
    assert len(tiny_state) == 1 + 6 + (16 + 3) * 6 + 6


def test_checkpoint_round_trip(tiny_state, tmp_path):
    ckpt = {"epoch": 80, "it": 1, "model_state": tiny_state, "optimizer_state": None, "version": "pcdet+0.6.0"}
    path = tmp_path / "pointpillar.pth"
    torch.save(ckpt, path)
    for source in (path, str(path), ckpt, tiny_state, {f"module.{k}": v for k, v in tiny_state.items()}):
        m = PointPillars().load_openpcdet(source)
        for k, v in m.state_dict().items():
            torch.testing.assert_close(v, tiny_state[k], rtol=0, atol=0, msg=k)
    no_step = {k: v for k, v in tiny_state.items() if k != "global_step"}
    PointPillars().load_openpcdet(no_step)  # global_step is optional
    # state_dict() also loads as is (same names)
    PointPillars().load_state_dict(tiny_state)


def test_checkpoint_wrong_keys(tiny_state):
    m = PointPillars()
    before = m.vfe.pfn_layers[0].linear.weight.clone()
    missing = {k: v for k, v in tiny_state.items() if k != "dense_head.conv_box.weight"}
    with pytest.raises(KeyError, match="missing keys.*conv_box.weight"):
        m.load_openpcdet(missing)
    with pytest.raises(KeyError, match="missing keys.*conv_box.weight"):
        m.load_openpcdet(missing, strict=False)  # never silently random
    extra = {**tiny_state, "dense_head.conv_extra.weight": torch.zeros(1)}
    with pytest.raises(KeyError, match="unexpected keys.*conv_extra"):
        m.load_openpcdet(extra)
    shaped = {**tiny_state, "dense_head.conv_cls.weight": torch.zeros(9, 384, 1, 1)}
    with pytest.raises(ValueError, match="(?s)mis-shaped.*conv_cls.weight"):
        m.load_openpcdet(shaped)
    with pytest.raises(TypeError, match="path_or_state_dict"):
        m.load_openpcdet(42)
    # nothing was loaded by the failed calls
    torch.testing.assert_close(m.vfe.pfn_layers[0].linear.weight, before, rtol=0, atol=0)


def test_bad_points():
    m = PointPillars()
    with pytest.raises(ValueError, match="points"):
        m(torch.zeros(10, 3))
    with pytest.raises(TypeError, match="points"):
        m(torch.zeros(10, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="lengths"):
        m(torch.zeros(10, 4), lengths=torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="lengths"):
        m(torch.zeros(10, 4), lengths=torch.zeros(2))
    with pytest.raises(ValueError, match="impl"):
        PointPillars(impl="fastest")


# --- fused pillar feature net (Triton) ---------------------------------------------------------


def _pillars(num: int, seed: int, device="cpu"):
    """A few random pillars inside the KITTI grid: voxels (P, 32, 4), num_points, coords."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(1, 33, (num,), generator=g).to(torch.int32)
    n[0] = 1
    if num > 1:
        n[1] = 32
    cells = torch.randperm(2 * 496 * 432, generator=g)[:num]
    b, yx = cells // (496 * 432), cells % (496 * 432)
    y, x = yx // 432, yx % 432
    coords = torch.stack([b, torch.zeros_like(b), y, x], 1).to(torch.int32)
    vox = torch.zeros(num, 32, 4)
    for i in range(num):
        k = int(n[i])
        vox[i, :k, 0] = x[i] * 0.16 + torch.rand(k, generator=g) * 0.16
        vox[i, :k, 1] = y[i] * 0.16 - 39.68 + torch.rand(k, generator=g) * 0.16
        vox[i, :k, 2] = torch.rand(k, generator=g) * 4 - 3
        vox[i, :k, 3] = torch.rand(k, generator=g)
    return vox.to(device), n.to(device), coords.to(device)


def _vfe_with_stats(seed: int = 0) -> PointPillars:
    m = PointPillars()
    g = torch.Generator().manual_seed(seed)
    norm = m.vfe.pfn_layers[0].norm
    with torch.no_grad():
        norm.running_mean.copy_(torch.randn(64, generator=g))
        norm.running_var.copy_(torch.rand(64, generator=g) + 0.5)
        norm.weight.copy_(torch.rand(64, generator=g) + 0.5)
        norm.bias.copy_(torch.randn(64, generator=g))  # negative shifts: padding slots matter
    return m


def _check_pfn_kernel(device, num, canvas_dtype=torch.float32, channels_last=False, atol=1e-4, variant=None):
    from pcops.triton.pfn import fold_batchnorm, pfn_scatter

    m = _vfe_with_stats().to(device)
    vox, n, coords = _pillars(num, seed=num, device=device)
    with torch.no_grad():
        ref = m.vfe(vox, n, coords)
    layer = m.vfe.pfn_layers[0]
    w, b = fold_batchnorm(
        layer.linear.weight,
        layer.norm.weight,
        layer.norm.bias,
        layer.norm.running_mean,
        layer.norm.running_var,
        layer.norm.eps,
    )
    if channels_last:
        canvas = torch.zeros(2, 496, 432, 64, device=device, dtype=canvas_dtype).permute(0, 3, 1, 2)
    else:
        canvas = torch.zeros(2, 64, 496, 432, device=device, dtype=canvas_dtype)
    pfn_scatter(vox, n, coords, w, b, canvas, CFG.voxel_size, CFG.point_cloud_range[:3], variant=variant)
    bl, yl, xl = coords[:, 0].long(), coords[:, 2].long(), coords[:, 3].long()
    got = canvas[bl, :, yl, xl].float()
    torch.testing.assert_close(got, ref, atol=atol, rtol=1e-3 if canvas_dtype != torch.float32 else 1e-5)
    # nothing else written
    assert float(canvas.float().abs().sum() - got.abs().sum()) == pytest.approx(0.0, abs=1e-2 * num)
    # count: only the first rows are read
    canvas.zero_()
    k = max(1, num // 2)
    pfn_scatter(
        vox,
        n,
        coords,
        w,
        b,
        canvas,
        CFG.voxel_size,
        CFG.point_cloud_range[:3],
        count=torch.tensor([k], dtype=torch.int32, device=device),
        variant=variant,
    )
    got = canvas[bl, :, yl, xl].float()
    torch.testing.assert_close(got[:k], ref[:k], atol=atol, rtol=1e-3 if canvas_dtype != torch.float32 else 1e-5)
    assert float(got[k:].abs().sum()) == 0.0


@interpret
@pytest.mark.parametrize("variant", ["dot"])  # the rank-1 kernel was removed (issue 16)
@pytest.mark.parametrize("num", [1, 7])
def test_pfn_kernel_interpreter(num, variant):
    _check_pfn_kernel("cpu", num, variant=variant)


@interpret
@pytest.mark.parametrize("variant", ["dot"])  # the rank-1 kernel was removed (issue 16)
def test_pfn_kernel_interpreter_channels_last_fp16(variant):
    _check_pfn_kernel("cpu", 5, canvas_dtype=torch.float16, channels_last=True, atol=2e-2, variant=variant)


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("num", [1, 13, 4099])
@pytest.mark.parametrize("fmt", ["nchw", "nhwc-fp16"])
@pytest.mark.parametrize("variant", ["dot"])  # the rank-1 kernel was removed (issue 16)
def test_pfn_kernel_gpu(num, fmt, variant):
    if fmt == "nchw":
        _check_pfn_kernel("cuda", num, variant=variant)
    else:
        _check_pfn_kernel("cuda", num, canvas_dtype=torch.float16, channels_last=True, atol=2e-2, variant=variant)


# --- full model on a real scan (CPU) -----------------------------------------------------------


@pytest.fixture(scope="module")
def scan():
    return _scan("000001")


def _calibrated_model() -> PointPillars:
    """Random weights with BatchNorm statistics and score bias from both sample scans."""
    a, b = _scan("000000"), _scan("000001")
    lengths = torch.tensor([a.shape[0], b.shape[0]])
    return randomize_(PointPillars(impl="reference"), seed=0, points=torch.cat([a, b]), lengths=lengths)


@pytest.fixture(scope="module")
def model(scan):
    return _calibrated_model()


@pytest.fixture(scope="module")
def cpu_results(model, scan):
    """One dense pass and one detection pass per implementation on the CPU."""
    out = {}
    with torch.no_grad():
        model.impl = "reference"
        dense = model.dense_outputs(scan)
        out["reference"] = (dense, model._post_reference(*dense))  # = model(scan), one pass fewer
        model.impl = "fast"
        dense = model.dense_outputs(scan)
        out["fast"] = (dense, model._post_fast(torch.cat(dense, dim=-1)))  # the fused head's layout
    model.impl = "reference"
    return out


def test_dense_output_shapes(cpu_results):
    cls, box, dirc = cpu_results["fast"][0]
    assert cls.shape == (1, 248, 216, 18) and box.shape == (1, 248, 216, 42) and dirc.shape == (1, 248, 216, 12)
    assert cls.dtype == box.dtype == dirc.dtype == torch.float32
    for a in cpu_results["reference"][0]:
        assert a.shape[:3] == (1, 248, 216)


def test_fast_dense_equals_reference(cpu_results):
    for ref, fast in zip(cpu_results["reference"][0], cpu_results["fast"][0]):
        torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)


def _assert_same_detections(a, b, box_atol=1e-4):
    assert a.boxes.shape == b.boxes.shape
    assert a.count.tolist() == b.count.tolist()
    torch.testing.assert_close(a.labels, b.labels, rtol=0, atol=0)
    torch.testing.assert_close(a.scores, b.scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.boxes, b.boxes, atol=box_atol, rtol=1e-5)


def test_fast_detections_equal_reference(cpu_results):
    ref, fast = cpu_results["reference"][1], cpu_results["fast"][1]
    assert ref.boxes.shape == (1, 500, 7) and ref.labels.dtype == torch.int64
    n = int(ref.count[0])
    assert n > 0, "random weights should give detections (randomize_ sets the classifier bias)"
    assert bool((ref.scores[0, :n] >= CFG.score_thresh).all())
    assert bool((ref.scores[0, :n][:-1] >= ref.scores[0, :n][1:]).all()), "scores in descending order"
    assert set(ref.labels[0, :n].tolist()) <= {1, 2, 3}
    assert float(ref.boxes[0, n:].abs().sum()) == 0.0 and int(ref.labels[0, n:].abs().sum()) == 0
    _assert_same_detections(fast, ref)


def test_batch_equals_single_scans(model, scan, cpu_results):
    """Two scans packed with lengths give each scan's own detections (fast path)."""
    other = _scan("000000")
    model.impl = "fast"
    try:
        both = model(torch.cat([other, scan]), lengths=torch.tensor([other.shape[0], scan.shape[0]]))
        first = model(other)
    finally:
        model.impl = "reference"
    single = cpu_results["fast"][1]
    assert both.count.shape == (2,) and int(both.count[0]) > 0
    _assert_same_detections(type(single)(*(t[1:] for t in both)), single)
    _assert_same_detections(type(single)(*(t[:1] for t in both)), first)


# --- GPU: fast vs reference, graph vs eager, fp16 ---------------------------------------------


@pytest.fixture(scope="module")
def gpu_model(scan):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return _calibrated_model().cuda()


@pytest.fixture
def no_tf32():
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("frame", ["000000", "000001"])
def test_gpu_fast_equals_reference(gpu_model, frame, no_tf32):
    pts = _scan(frame).cuda()
    gpu_model.impl = "reference"
    ref_dense, ref_det = gpu_model.dense_outputs(pts), gpu_model(pts)
    gpu_model.impl = "fast"
    fast_dense, fast_det = gpu_model.dense_outputs(pts), gpu_model(pts)
    gpu_model.impl = "reference"
    for r, f in zip(ref_dense, fast_dense):
        torch.testing.assert_close(f, r, atol=1e-4, rtol=1e-4)
    _assert_same_detections(fast_det, ref_det)


@pytest.mark.gpu
@gpu[1]
def test_gpu_matches_cpu_reference(gpu_model, cpu_results, scan, no_tf32):
    gpu_model.impl = "reference"
    det = gpu_model(scan.cuda())
    _assert_same_detections(type(det)(*(t.cpu() for t in det)), cpu_results["reference"][1], box_atol=1e-3)


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_graph_equals_eager(gpu_model, scan, dtype):
    pts = scan.cuda()
    gpu_model.impl, gpu_model.dtype = "fast", dtype
    try:
        eager = gpu_model(pts)
        graphed = gpu_model.capture(pts)
        out = graphed(pts)
        _assert_same_detections(out, eager, box_atol=1e-5)
        # a second, different scan through the same graph
        other = _scan("000000").cuda()
        _assert_same_detections(graphed(other), gpu_model(other), box_atol=1e-5)
    finally:
        gpu_model.impl, gpu_model.dtype = "reference", torch.float32


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_eager_graph_equals_op_by_op(gpu_model, scan, dtype):
    """``eager_graph`` (eager calls replay the backbone + head, and for detections the
    post-processing, from a CUDA graph) gives the op-by-op outputs bit for bit, for one scan and
    for a batch; detections stay the caller's (a later call does not overwrite them); captures
    again after the weights or the config change, and stays out of copies of the model."""
    import copy
    import dataclasses

    a, b = _scan("000000").cuda(), scan.cuda()
    gpu_model.impl, gpu_model.dtype = "fast", dtype
    bias = gpu_model.dense_head.conv_cls.bias
    saved = bias.detach().clone()
    tf32_before = torch.backends.cudnn.allow_tf32
    gpu_model._graphs.clear()  # (earlier tests leave graphs of other dtypes and flags)
    try:
        for pts, lengths in ((b, None), (torch.cat([a, b]), torch.tensor([len(a), len(b)], device="cuda"))):
            gpu_model.eager_graph = False
            want_dense, want = gpu_model.dense_outputs(pts, lengths), gpu_model(pts, lengths)
            gpu_model.eager_graph = True
            for _ in range(2):  # capture, then replay
                got_dense, got = gpu_model.dense_outputs(pts, lengths), gpu_model(pts, lengths)
                assert all(torch.equal(g, w) for g, w in zip(got_dense, want_dense))
                assert all(torch.equal(g, w) for g, w in zip(got, want))
        # per batch size one graph for the head outputs and one for the detections; one scan's
        # detections come from the graph of the whole call ("scan")
        assert {(k[1], k[5]) for k in gpu_model._graphs} == {(1, False), (1, "scan"), (2, False), (2, True)}
        first = gpu_model(b)
        gpu_model(a)  # replays the same graph
        assert all(torch.equal(g, w) for g, w in zip(first, gpu_model(b)))
        config = gpu_model.config
        try:  # a new config (other thresholds) is captured again, not replayed with the old constants
            gpu_model.config = dataclasses.replace(config, score_thresh=0.5, nms_thresh=0.2)
            gpu_model.eager_graph = False
            want = gpu_model(b)
            gpu_model.eager_graph = True
            got = gpu_model(b)
            assert all(torch.equal(g, w) for g, w in zip(got, want))
            assert not torch.equal(got.count, first.count) or not torch.equal(got.boxes, first.boxes)
        finally:
            gpu_model.config = config
        with torch.no_grad():
            bias.add_(0.5)
        got = gpu_model.dense_outputs(b)
        gpu_model.eager_graph = False
        want = gpu_model.dense_outputs(b)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        gpu_model.eager_graph = True
        for tf32 in (not tf32_before, tf32_before):  # a graph captured under other TF32 flags is not replayed
            torch.backends.cudnn.allow_tf32 = tf32
            gpu_model.eager_graph = False
            want = gpu_model.dense_outputs(b)
            gpu_model.eager_graph = True
            assert all(torch.equal(g, w) for g, w in zip(gpu_model.dense_outputs(b), want))
        assert copy.deepcopy(gpu_model)._graphs == {}
        for n in (3, 4, 5):  # more batch sizes than MAX_EAGER_GRAPHS: the oldest graphs go
            got = gpu_model(torch.cat([b] * n), torch.full((n,), len(b), device="cuda"))
            assert got.boxes.shape[0] == n and int(got.count.min()) > 0
        assert len(gpu_model._graphs) == 4
    finally:
        torch.backends.cudnn.allow_tf32 = tf32_before
        with torch.no_grad():
            bias.copy_(saved)
        gpu_model.impl, gpu_model.dtype, gpu_model.eager_graph = "reference", torch.float32, True


@pytest.mark.gpu
@gpu[1]
def test_eager_scan_graph_capacity_and_drops(gpu_model, scan):
    """One scan's eager call runs voxelization through post-processing from one graph: the
    detections and ``last_dropped_voxels`` equal the op-by-op path's, a scan larger than the
    graph's capacity is captured again with a larger one (not cut), and dropped pillars warn."""
    import dataclasses
    import weakref

    a, b = _scan("000000").cuda(), scan.cuda()
    big = torch.cat([a, b, a])  # more points than the first capacity (131,072)
    gpu_model.impl = "fast"
    gpu_model._graphs.clear()
    config = gpu_model.config
    try:
        for pts in (b, big, a):
            gpu_model.eager_graph = False
            want, want_dropped = gpu_model(pts), gpu_model.last_dropped_voxels
            gpu_model.eager_graph = True
            got = gpu_model(pts)
            assert all(torch.equal(g, w) for g, w in zip(got, want))
            assert torch.equal(gpu_model.last_dropped_voxels, want_dropped)
        (entry,) = [e for k, e in gpu_model._graphs.items() if k[5] == "scan"]
        assert entry[3].max_points == 1 << (big.shape[0] - 1).bit_length()
        assert isinstance(entry[3].model, weakref.ProxyTypes)  # no model -> graph -> model cycle
        gpu_model.config = dataclasses.replace(config, max_voxels_test=500)
        with pytest.warns(RuntimeWarning, match="max_voxels=500"):
            got = gpu_model(b)
        assert int(gpu_model.last_dropped_voxels[0]) > 0
        gpu_model.eager_graph = False
        with pytest.warns(RuntimeWarning, match="max_voxels=500"):
            want = gpu_model(b)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    finally:
        gpu_model.config = config
        gpu_model.impl, gpu_model.eager_graph = "reference", True


@pytest.mark.gpu
@gpu[1]
def test_graph_batch_equals_eager(gpu_model, scan):
    a, b = _scan("000000").cuda(), scan.cuda()
    pts, lengths = torch.cat([a, b]), [a.shape[0], b.shape[0]]
    gpu_model.impl = "fast"
    try:
        eager = gpu_model(pts, lengths=torch.tensor(lengths, device="cuda"))
        graphed = gpu_model.capture(pts, lengths)
        _assert_same_detections(graphed(pts, lengths), eager, box_atol=1e-5)
    finally:
        gpu_model.impl = "reference"


@pytest.mark.gpu
@gpu[1]
def test_fp16_close_to_fp32(gpu_model, scan):
    pts = scan.cuda()
    gpu_model.impl = "fast"
    try:
        d32 = gpu_model.dense_outputs(pts)
        gpu_model.dtype = torch.float16
        d16 = gpu_model.dense_outputs(pts)
    finally:
        gpu_model.impl, gpu_model.dtype = "reference", torch.float32
    for a, b in zip(d32, d16):
        err = (a - b).abs().max() / a.abs().max()
        assert float(err) < 2e-2


# --- demo --------------------------------------------------------------------------------------


def test_demo_cpu_one_scan(tmp_path, capsys):
    from pcops.models import demo

    scans = demo.default_scans()
    if not scans:
        pytest.skip("no sample scans in data/ or ../shared/data")
    rc = demo.main(["--device", "cpu", "--max-scans", "1", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "shipped PointPillars weights" in text and "voxelize" in text and "total" in text
    import re

    found = re.search(r"points, (\d+) detections", text)
    assert found and int(found.group(1)) > 0, text  # the shipped weights find objects in the sample scan
    pngs = list(tmp_path.glob("*_bev.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 1000
    rc = demo.main(
        ["--device", "cpu", "--max-scans", "1", "--repeats", "1", "--warmup", "0", "--no-draw", "--random-weights"]
    )
    assert rc == 0 and "RANDOM" in capsys.readouterr().out


def test_static_pipeline_equals_eager(model, scan, cpu_results):
    """The fixed-capacity pipeline GraphedPointPillars captures (pad_to_max voxelization, padding
    points far outside the range, padded NMS), run eagerly on the CPU, equals the eager fast path."""
    from pcops.models.pointpillars import GraphedPointPillars

    cap = scan.shape[0] + 1000
    static = torch.full((cap, 4), GraphedPointPillars.PAD_VALUE)
    static[: scan.shape[0]] = scan
    model.impl = "fast"
    try:
        det, dropped = model._forward_static(
            static, torch.tensor([cap], dtype=torch.int32), model._fast_params(scan.device)
        )
    finally:
        model.impl = "reference"
    assert dropped.tolist() == [0]
    _assert_same_detections(det, cpu_results["fast"][1])


# --- the PFN kernel compiles for sm_90 (no GPU needed) -----------------------------------------

_AOT_PFN = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.triton import pfn

fn = pfn._pfn_scatter_dot_kernel if sys.argv[2] == "dot" else pfn._pfn_scatter_kernel
sig = dict(voxels_ptr="*fp32", num_points_ptr="*i32", coords_ptr="*i32", count_ptr="*i32", weight_ptr="*fp32",
           bias_ptr="*fp32", canvas_ptr="*" + sys.argv[1])
for n in ("num_rows", "num_slots", "num_feats", "num_channels", "batch_size", "grid_h", "grid_w",
          "stride_b", "stride_c", "stride_y", "stride_x"):
    sig[n] = "i32"
for n in ("voxel_x", "voxel_y", "voxel_z", "x_offset", "y_offset", "z_offset"):
    sig[n] = "fp32"
consts = dict(BLOCK_T=32, BLOCK_C=64)
if sys.argv[2] == "dot":
    consts["BLOCK_P"] = pfn._DOT_PILLARS
full = {n: "constexpr" if n in consts else sig[n] for n in fn.arg_names}
triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=GPUTarget("cuda", 90, 32),
               options={"num_warps": 4 if sys.argv[2] == "dot" else 2})
print("compiled")
"""


@pytest.mark.parametrize("variant", ["dot"])  # the rank-1 kernel was removed (issue 16)
@pytest.mark.parametrize("canvas_dtype", ["fp32", "fp16"])
def test_pfn_kernel_compiles_for_sm90(canvas_dtype, variant):
    """Lowering to a CUBIN catches what the interpreter accepts but the compiler does not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas not found")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _AOT_PFN, canvas_dtype, variant], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-4000:]


# --- backbone epilogue (bias + ReLU + concat in one pass) ----------------------------------------


def _check_bias_relu(device, dtype, channels_last):
    from pcops.triton.epilogue import bias_relu

    g = torch.Generator().manual_seed(11)
    y = torch.randn(2, 5, 3, 7, generator=g).to(device=device, dtype=dtype)
    if channels_last:
        y = y.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(5, generator=g).to(device=device, dtype=dtype)
    expected = torch.relu(y.float() + bias.float()[:, None, None]).to(dtype)
    out = torch.full((2, 12, 3, 7), -9.0, device=device, dtype=dtype)
    if channels_last:
        out = out.contiguous(memory_format=torch.channels_last)
    bias_relu(y, bias, out, channel_offset=4)
    assert torch.equal(out[:, 4:9], expected)
    assert bool((out[:, :4] == -9).all()) and bool((out[:, 9:] == -9).all())  # nothing else written
    bias_relu(y, bias)  # in place
    assert torch.equal(y, expected)
    with pytest.raises(ValueError, match="out"):
        bias_relu(y, bias, out, channel_offset=8)


@interpret
@pytest.mark.parametrize("channels_last", [False, True])
def test_bias_relu_interpreter(channels_last):
    _check_bias_relu("cpu", torch.float32, channels_last)


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bias_relu_gpu(dtype):
    _check_bias_relu("cuda", dtype, channels_last=True)
    _check_bias_relu("cuda", dtype, channels_last=False)


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("mode", ["triton", "cudnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backbone_epilogues_match_torch(gpu_model, mode, dtype, no_tf32):
    """The fused epilogues give the unfused backbone's output (float rounding of the bias add apart)."""
    fp_dtype, epilogue = gpu_model.dtype, gpu_model.epilogue
    gpu_model.dtype = dtype
    try:
        fp = gpu_model._fast_params(torch.device("cuda"))
        g = torch.Generator().manual_seed(5)
        x = torch.relu(torch.randn(1, 64, 496, 432, generator=g)).to("cuda", dtype)
        if fp.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            gpu_model.epilogue = "torch"
            ref = gpu_model._backbone_fast(x, fp).float()
            gpu_model.epilogue = mode
            got = gpu_model._backbone_fast(x, fp).float()
    finally:
        gpu_model.epilogue = epilogue
        gpu_model.dtype = fp_dtype
    scale = float(ref.abs().max())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, ref, atol=tol * scale, rtol=tol)


# --- the post-processing kernels (models/post_kernels.py) against their torch form ---------------


@interpret
@pytest.mark.parametrize("kmax", [60, 1300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_post_kernels_match_the_torch_post_processing(dtype, kmax):
    """Triton's interpreter on the CPU: decoding the top-k and gathering the kept rows give the
    torch path's outputs up to the last bit of ``exp`` and ``sqrt`` (numpy's, against torch's CPU
    ones, which are not correctly rounded); on the GPU, ``test_gpu_post_kernels_bit_identical``
    requires bit equality."""
    from pcops.models import post_kernels, postprocess

    got, want = _post_kernel_case(dtype, "cpu", post_kernels, postprocess, kmax=kmax)
    for name, g, w in zip(("boxes", "scores", "labels", "nms_scores"), got[0], want[0]):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-5, equal_nan=True, msg=lambda m: f"{name}: {m}")
    for name, g, w in zip(("boxes", "scores", "labels", "count"), got[1], want[1]):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-5, msg=lambda m: f"{name}: {m}")


def _post_kernel_case(dtype, device, post_kernels, postprocess, seed=0, kmax=60):
    """A random head output with a few NaN logits and tied direction bins, decoded and gathered
    by the kernels and by the torch functions: ``((decoded, kept) kernels, (decoded, kept) torch)``."""
    g = torch.Generator().manual_seed(seed)
    cfg = PointPillarsConfig()
    bsz, hw, a, n_cls, nb = 2, 37, cfg.num_anchors_per_location, cfg.num_classes, cfg.num_dir_bins
    n_cls_ch, n_box_ch = a * n_cls, a * 7
    flat = (torch.randn(bsz, hw, n_cls_ch + n_box_ch + a * nb, generator=g) * 2).to(dtype)
    flat[0, 3, n_cls_ch + n_box_ch : n_cls_ch + n_box_ch + 2] = 0.5  # tied bins: the first wins
    flat[1, 5, n_cls_ch + n_box_ch + 1] = float("nan")  # a NaN bin wins
    anchors = torch.rand(hw * a, 7, generator=g) * torch.tensor([60.0, 80, 2, 4, 2, 2, 3]) + 0.1
    logits = flat[:, :, :n_cls_ch].reshape(bsz, hw, a, n_cls)
    max_logit, label = logits.max(dim=-1)
    top_logit, top = torch.topk(max_logit.reshape(bsz, -1).float(), 150, dim=1)
    flat, top, top_logit, label, anchors = (t.to(device) for t in (flat, top, top_logit, label, anchors))
    args = (top, top_logit, label, anchors, n_cls_ch, n_box_ch, nb, cfg)
    idx = torch.randint(-1, 150, (bsz, kmax), generator=g).to(device)
    out = []
    for mod in (post_kernels, postprocess):
        dec = mod.decode_top(flat, *args)
        out.append((dec, mod.gather_kept(idx, dec[0], dec[1], dec[2], cfg.score_thresh)))
    return out[0], out[1]


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_post_kernels_bit_identical(dtype):
    from pcops.models import post_kernels, postprocess

    for seed, kmax in ((0, 60), (1, 500), (2, 1300)):  # the gather loops over 512-row blocks
        got, want = _post_kernel_case(dtype, "cuda", post_kernels, postprocess, seed, kmax)
        for g, w in zip(got[0] + got[1], want[0] + want[1]):
            assert torch.equal(g.isnan(), w.isnan()) if g.is_floating_point() else True
            assert torch.equal(g.nan_to_num(), w.nan_to_num()) if g.is_floating_point() else torch.equal(g, w)


_AOT_POST = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pcops.models import post_kernels as pk

dense_t = sys.argv[1]
dec = dict(dense_ptr="*" + dense_t, top_ptr="*i64", top_logit_ptr="*fp32", label_ptr="*i64", anchors_ptr="*fp32",
           boxes_ptr="*fp32", scores_ptr="*fp32", labels_ptr="*i64", nms_scores_ptr="*fp32", k="i32",
           row_stride="i32", label_stride="i32", score_thresh="fp32", dir_offset="fp32", dir_limit_offset="fp32",
           period="fp32", inv_period="fp32")
fin = dict(idx_ptr="*i64", boxes_ptr="*fp32", scores_ptr="*fp32", labels_ptr="*i64", out_boxes_ptr="*fp32",
           out_scores_ptr="*fp32", out_labels_ptr="*i64", count_ptr="*i64", k="i32", kmax="i32", score_thresh="fp32")
for fn, sig, consts in (
    (pk._decode_kernel, dec, dict(A=6, CH=72, N_CLS_CH=18, N_BOX_CH=42, NB=2, BLOCK=pk._BLOCK)),
    (pk._final_kernel, fin, dict(BLOCK=pk._FINAL_BLOCK)),
):
    full = {n: "constexpr" if n in consts else sig[n] for n in fn.arg_names}
    triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                   options={"enable_fp_fusion": False})
print("compiled")
"""


@pytest.mark.parametrize("dense_dtype", ["fp32", "fp16"])
def test_post_kernels_compile_for_sm90(dense_dtype):
    """The post-processing kernels lower to a CUBIN for sm_90 (libdevice's expf included)."""
    from _util import run_compiler_script

    run_compiler_script(_AOT_POST, dense_dtype)


def test_eager_graph_entries_are_kept_and_recaptured():
    """The bookkeeping both eager graphs share (no GPU: ``build`` stands in for a capture): one
    entry per key, kept while the weights, config and anchors are the same objects and ``fits``
    holds, captured again otherwise; the oldest entries make room past ``MAX_EAGER_GRAPHS``."""
    import dataclasses

    from models.fast import MAX_EAGER_GRAPHS

    model = PointPillars()
    dev = torch.device("cpu")
    fp = model._fast_params(dev)
    anchors = model.anchors(dev)
    builds = []

    def build():
        builds.append(1)
        return (len(builds),)

    def entry(batch=1, kind="scan", fits=None):
        return model._eager_graph_entry(dev, batch, fp, kind, anchors, build, fits=fits)

    first = entry()
    assert entry() is first and entry(fits=lambda e: True) is first and len(builds) == 1
    second = entry(fits=lambda e: False)  # e.g. a scan larger than the capacity
    assert second is not first and second[3] == 2 and entry() is second
    config = model.config
    model.config = dataclasses.replace(config, score_thresh=0.5)
    assert entry()[3] == 3 and entry()[1] is model.config
    assert entry(kind=True) is not entry() and len(model._graphs) == 2
    for b in range(2, 2 + MAX_EAGER_GRAPHS):  # other batch sizes push the oldest entries out
        entry(batch=b, kind=True)
    assert len(model._graphs) == MAX_EAGER_GRAPHS and all(k[1] != 1 for k in model._graphs)
