"""PointPillars training: box coder, target assignment, losses, data, evaluator, training steps, weights."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _util import requires_cuda

from pcops.models import box_coder
from pcops.models.config import PointPillarsConfig
from pcops.models.evaluate import SceneResult, average_precision_r40, evaluate
from pcops.models.loss import pointpillars_loss, sigmoid_focal_loss, smooth_l1
from pcops.models.outputs import DenseOutputs
from pcops.models.pointpillars import PointPillars
from pcops.models.targets import DEFAULT_THRESHOLDS, assign_targets, nearest_bev_iou

CFG = PointPillarsConfig()
REPO = Path(__file__).resolve().parents[1]


def _random_boxes(gen, n, cls_sizes=((3.9, 1.6, 1.56), (0.8, 0.6, 1.73), (1.76, 0.6, 1.73))):
    labels = torch.randint(1, 4, (n,), generator=gen)
    size = torch.tensor(cls_sizes)[labels - 1] * (0.8 + 0.4 * torch.rand(n, 3, generator=gen))
    xy = torch.rand(n, 2, generator=gen) * torch.tensor([69.12, 79.36]) + torch.tensor([0.0, -39.68])
    z = -1.0 + 0.3 * torch.randn(n, 1, generator=gen)
    heading = (torch.rand(n, 1, generator=gen) * 2 - 1) * math.pi
    return torch.cat([xy, z, size, heading], dim=1), labels


def _inside_each(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``(N, 3+)`` points, ``(S, 7)`` boxes → ``(N, S)`` bool: point inside box (faces included)."""
    d = points[:, None, :3] - boxes[None, :, :3]
    c, s = torch.cos(boxes[:, 6]), torch.sin(boxes[:, 6])
    lx = c * d[..., 0] + s * d[..., 1]
    ly = -s * d[..., 0] + c * d[..., 1]
    return (lx.abs() <= boxes[:, 3] / 2) & (ly.abs() <= boxes[:, 4] / 2) & (d[..., 2].abs() <= boxes[:, 5] / 2)


def _inside(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``(N, 3+)`` points, ``(S, 7)`` boxes → ``(N,)`` bool: inside any box (faces included)."""
    return _inside_each(points, boxes).any(dim=1)


# --- box coder ---------------------------------------------------------------------------------


def test_encode_decode_round_trip():
    gen = torch.Generator().manual_seed(0)
    boxes, _ = _random_boxes(gen, 500)
    boxes[:, 6] = boxes[:, 6] * 3  # headings beyond ±π: the coder does not wrap them
    anchors = box_coder.generate_anchors(CFG).view(-1, 7)[torch.randint(0, 321408, (500,), generator=gen)]
    back = box_coder.decode_boxes(box_coder.encode_boxes(boxes, anchors), anchors)
    torch.testing.assert_close(back, boxes, atol=2e-5, rtol=1e-5)


def test_direction_target_bins():
    anchors = torch.zeros(4, 7)
    reg = torch.zeros(4, 7)
    reg[:, 6] = torch.tensor([0.0, 1.0, 4.0, -1.0])
    # bins of limit_period(r - 0.78539, 0, 2π) / π: 0 -> bin 1, 1.0 -> 0, 4.0 -> 1, -1.0 -> 1
    assert box_coder.direction_target(anchors, reg, CFG.dir_offset, 2).tolist() == [1, 0, 1, 1]


# --- target assignment -------------------------------------------------------------------------


def _reference_targets(anchors, gt_boxes, gt_labels):
    """OpenPCDet's AxisAlignedTargetAssigner.assign_targets_single, one scan and one class at a time,
    with its boolean-mask / nonzero code path (the oracle)."""
    a_loc = CFG.num_anchors_per_location
    grid = anchors.view(-1, a_loc, 7)
    labels_out, gt_out = [], []
    for b in range(gt_boxes.shape[0]):
        lab_all = torch.full((grid.shape[0], a_loc), -1, dtype=torch.int64)
        gid_all = torch.full((grid.shape[0], a_loc), -1, dtype=torch.int64)
        off = 0
        for c, acfg in enumerate(CFG.anchors, start=1):
            r = len(acfg.rotations)
            anc = grid[:, off : off + r].reshape(-1, 7)
            sel = (gt_labels[b] == c).nonzero().view(-1)
            gts = gt_boxes[b, sel]
            matched, unmatched = DEFAULT_THRESHOLDS[acfg.class_name]
            labels = torch.full((anc.shape[0],), -1, dtype=torch.int64)
            gt_ids = torch.full((anc.shape[0],), -1, dtype=torch.int64)
            if len(gts):
                ov = nearest_bev_iou(anc, gts)
                a2g_arg = ov.argmax(dim=1)
                a2g_max = ov[torch.arange(len(anc)), a2g_arg]
                g2a_max = ov.max(dim=0).values
                g2a_max[g2a_max == 0] = -1
                forced = (ov == g2a_max).nonzero()[:, 0]
                labels[forced] = c
                gt_ids[forced] = sel[a2g_arg[forced]]
                pos = a2g_max >= matched
                labels[pos] = c
                gt_ids[pos] = sel[a2g_arg[pos]]
                bg = (a2g_max < unmatched).nonzero()[:, 0]
            else:
                bg = torch.arange(len(anc))
            labels[bg] = 0
            if len(gts):
                labels[forced] = c
            gid = torch.where(labels > 0, gt_ids, torch.full_like(gt_ids, -1))
            lab_all[:, off : off + r] = labels.view(-1, r)
            gid_all[:, off : off + r] = gid.view(-1, r)
            off += r
        labels_out.append(lab_all.view(-1))
        gt_out.append(gid_all.view(-1))
    return torch.stack(labels_out), torch.stack(gt_out)


@pytest.mark.parametrize("seed", [0, 1])
def test_targets_equal_openpcdet_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    anchors = box_coder.generate_anchors(CFG).view(-1, 7)
    bsz, g = 2, 12
    gt_boxes = torch.zeros(bsz, g, 7)
    gt_labels = torch.zeros(bsz, g, dtype=torch.int64)
    for b, n in enumerate((12, 5)):  # uneven counts: the second scan has padding
        boxes, labels = _random_boxes(gen, n)
        gt_boxes[b, :n], gt_labels[b, :n] = boxes, labels
    # one box exactly on an anchor (a sure positive) and one tiny box (only its forced best anchor)
    gt_boxes[1, 5] = anchors[996]  # anchor 996 = cell 166, class 0 (Car), rotation 0
    gt_labels[1, 5] = 1
    gt_boxes[1, 6] = torch.tensor([30.0, 0.05, -1.0, 0.3, 0.3, 1.5, 0.0])
    gt_labels[1, 6] = 2
    got = assign_targets(CFG, anchors, gt_boxes, gt_labels)
    ref_labels, ref_gt = _reference_targets(anchors, gt_boxes, gt_labels)
    assert torch.equal(got.labels, ref_labels)
    assert torch.equal(got.gt_index, ref_gt)
    assert got.labels[1, 996] == 1 and got.gt_index[1, 996] == 5
    assert int((got.gt_index[1] == 6).sum()) >= 1, "every ground truth keeps its best anchor"
    pos = got.labels > 0
    matched = torch.gather(gt_boxes, 1, got.gt_index.clamp(min=0).unsqueeze(-1).expand(-1, -1, 7))
    torch.testing.assert_close(got.reg_targets[pos], box_coder.encode_boxes(matched, anchors.unsqueeze(0))[pos])
    assert torch.all(got.reg_targets[~pos] == 0)


def test_targets_class_slices_equal_full():
    gen = torch.Generator().manual_seed(3)
    anchors = box_coder.generate_anchors(CFG).view(-1, 7)
    boxes, labels = _random_boxes(gen, 9)
    order = torch.argsort(labels, stable=True)
    boxes, labels = boxes[order].unsqueeze(0), labels[order].unsqueeze(0)
    counts = [int((labels == c).sum()) for c in (1, 2, 3)]
    starts = np.concatenate([[0], np.cumsum(counts)])
    slices = tuple((int(starts[i]), int(starts[i + 1])) for i in range(3))
    a = assign_targets(CFG, anchors, boxes, labels)
    b = assign_targets(CFG, anchors, boxes, labels, class_slices=slices)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.gt_index, b.gt_index)


def test_targets_empty_ground_truth():
    anchors = box_coder.generate_anchors(CFG).view(-1, 7)
    t = assign_targets(CFG, anchors, torch.zeros(1, 1, 7), torch.zeros(1, 1, dtype=torch.int64))
    assert torch.all(t.labels == 0) and torch.all(t.gt_index == -1)


# --- losses ------------------------------------------------------------------------------------


def test_focal_and_smooth_l1_formulas():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, generator=gen) * 3
    t = (torch.rand(200, generator=gen) < 0.3).float()
    p = torch.sigmoid(x)
    pt = torch.where(t > 0, p, 1 - p)
    alpha = torch.where(t > 0, torch.tensor(0.25), torch.tensor(0.75))
    torch.testing.assert_close(sigmoid_focal_loss(x, t), -alpha * (1 - pt) ** 2 * torch.log(pt), atol=1e-5, rtol=1e-4)
    d = torch.tensor([0.0, 0.05, 1 / 9, 0.5, -2.0])
    beta = 1 / 9
    want = torch.tensor([0.0, 0.5 * 0.05**2 / beta, 0.5 * beta, 0.5 - 0.5 * beta, 2.0 - 0.5 * beta])
    torch.testing.assert_close(smooth_l1(d), want)


def test_pointpillars_loss_direct_formula():
    gen = torch.Generator().manual_seed(1)
    h, w = CFG.feature_map_hw
    anchors = box_coder.generate_anchors(CFG).view(-1, 7)
    n = anchors.shape[0]
    preds = DenseOutputs(
        torch.randn(1, h, w, 18, generator=gen),
        0.1 * torch.randn(1, h, w, 42, generator=gen),
        torch.randn(1, h, w, 12, generator=gen),
    )
    boxes, labels = _random_boxes(gen, 6)
    t = assign_targets(CFG, anchors, boxes.unsqueeze(0), labels.unsqueeze(0))
    got = pointpillars_loss(CFG, preds, t, anchors)
    lab = t.labels[0]
    pos = lab > 0
    npos = max(int(pos.sum()), 1)
    cls = preds.cls_preds.reshape(n, 3)
    onehot = F.one_hot(lab.clamp(min=0), 4)[:, 1:].float()
    cls_loss = (sigmoid_focal_loss(cls, onehot).sum(1) * (lab >= 0).float()).sum() / npos
    bp = preds.box_preds.reshape(n, 7)[pos]
    bt = t.reg_targets[0][pos]
    diff = torch.cat([bp[:, :6] - bt[:, :6], torch.sin(bp[:, 6:] - bt[:, 6:])], dim=1)
    loc_loss = smooth_l1(diff).sum() / npos
    dirt = box_coder.direction_target(anchors[pos], bt, CFG.dir_offset, 2)
    dir_loss = F.cross_entropy(preds.dir_cls_preds.reshape(n, 2)[pos], dirt, reduction="sum") / npos
    torch.testing.assert_close(got.cls, cls_loss, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.loc, loc_loss, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.dir, dir_loss, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.total, cls_loss + 2 * loc_loss + 0.2 * dir_loss, rtol=1e-4, atol=1e-6)


# --- evaluator ---------------------------------------------------------------------------------

GT = torch.tensor(
    [[10.0, 2, -1, 3.9, 1.6, 1.5, 0.3], [20, -5, -1, 0.8, 0.6, 1.7, 1.0], [35, 5, -1, 1.7, 0.6, 1.7, -2.0]]
)
NAMES = ["Car", "Pedestrian", "Cyclist"]


def _scene(det, scores, det_names, gt=GT, gt_names=NAMES, pts=None):
    pts = torch.full((len(gt_names),), 100) if pts is None else torch.tensor(pts)
    return SceneResult(det, torch.tensor(scores, dtype=torch.float32), det_names, gt, gt_names, pts)


def test_evaluator_perfect_and_empty():
    r = evaluate([_scene(GT.clone(), [0.9, 0.8, 0.7], NAMES)])
    assert all(r[c]["3d"] == 100.0 and r[c]["bev"] == 100.0 for c in NAMES)
    r = evaluate([_scene(torch.zeros(0, 7), [], [])])
    assert all(r[c]["3d"] == 0.0 for c in NAMES)
    r = evaluate([_scene(GT[:1].clone(), [0.9], ["Car"], gt=torch.zeros(0, 7), gt_names=[], pts=[])])
    assert r["Car"]["3d"] is None and r["Car"]["num_gt"] == 0  # no ground truth: AP undefined


def test_evaluator_false_positive_above_and_duplicates():
    fp = GT[:1] + torch.tensor([8.0, 0, 0, 0, 0, 0, 0])
    r = evaluate([_scene(torch.cat([fp, GT[:1]]), [0.9, 0.8], ["Car", "Car"], GT[:1], ["Car"])])
    assert r["Car"]["3d"] == 50.0  # recall 1 reached at precision 1/2
    r = evaluate([_scene(torch.cat([GT[:1], GT[:1]]), [0.9, 0.8], ["Car", "Car"], GT[:1], ["Car"])])
    assert r["Car"]["3d"] == 100.0  # the duplicate is a false positive below the true positive
    r = evaluate([_scene(torch.cat([GT[:1], GT[:1]]), [0.8, 0.9], ["Car", "Car"], GT[:1], ["Car"])])
    assert r["Car"]["3d"] == 100.0  # ties of boxes: the higher score matches first


def test_evaluator_iou_threshold_edges():
    # a car shifted along x: BEV IoU = (3.9 - s) / (3.9 + s) (same height, so 3-D IoU too)
    for s, want in ((0.0, 100.0), (0.68, 100.0), (0.72, 0.0)):  # 0.7 at s = 0.6882
        det = GT[:1].clone()
        det[0, 0] += s * math.cos(0.3)
        det[0, 1] += s * math.sin(0.3)
        r = evaluate([_scene(det, [0.9], ["Car"], GT[:1], ["Car"])])
        assert r["Car"]["3d"] == want and r["Car"]["bev"] == want, s


def test_evaluator_ignores_few_points_neighbours_and_out_of_range():
    # a car with 3 points and a van: detections on them are neither TP nor FP
    gt = torch.cat(
        [GT[:1], GT[:1] + torch.tensor([0.0, 10, 0, 0, 0, 0, 0]), GT[:1] + torch.tensor([0.0, -10, 0, 0, 0, 0, 0])]
    )
    r = evaluate([_scene(gt.clone(), [0.9, 0.8, 0.7], ["Car"] * 3, gt, ["Car", "Car", "Van"], pts=[100, 3, 50])])
    assert r["Car"]["3d"] == 100.0 and r["Car"]["num_gt"] == 1
    behind = GT[:1] * torch.tensor([-1.0, 1, 1, 1, 1, 1, 1])
    r = evaluate([_scene(behind, [0.9], ["Car"], behind, ["Car"])], point_cloud_range=CFG.point_cloud_range)
    assert r["Car"]["num_gt"] == 0


def test_average_precision_r40_steps():
    assert average_precision_r40(np.array([1, 1]), 4) == 50.0  # recall 0.5 at precision 1
    assert math.isnan(average_precision_r40(np.array([]), 0))


# --- data --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory):
    from pcops.models.data import generate_split

    root = tmp_path_factory.mktemp("sim")
    generate_split(root, n_train=3, n_val=2, workers=2, progress=False)
    return root


def test_generated_split_layout_and_labels(tiny_split):
    from pcops.io import read_kitti_label
    from pcops.models.data import TRAIN_SEED_BASE
    from pcops.sim import simulate_scan

    meta = json.loads((tiny_split / "pcops_sim.json").read_text())
    assert meta["n_train"] == 3 and meta["n_val"] == 2
    assert (tiny_split / "ImageSets" / "val.txt").read_text().split() == ["000003", "000004"]
    boxes, names = read_kitti_label(
        tiny_split / "training/label_2/000000.txt", tiny_split / "training/calib/000000.txt"
    )
    scan = simulate_scan(TRAIN_SEED_BASE)
    assert names == scan.names
    d = boxes - scan.boxes
    d[:, 6] = torch.remainder(d[:, 6] + math.pi, 2 * math.pi) - math.pi
    assert float(d.abs().max()) < 1e-3
    db = np.load(tiny_split / "gt_database.npz")
    sizes = np.diff(db["offsets"])
    assert len(db["names"]) > 0 and sizes.min() >= 5


def test_generated_split_scene_version_2_keeps_vans_as_ignore_boxes(tmp_path):
    from pcops.models.data import KittiDataset, generate_split

    summary = generate_split(tmp_path, n_train=2, n_val=1, workers=1, progress=False, scene_version=2)
    assert json.loads((tmp_path / "pcops_sim.json").read_text())["scene_version"] == 2
    assert summary["objects"].get("Van", 0) + summary["objects"].get("Truck", 0) > 0, summary["objects"]
    ds = KittiDataset(tmp_path, "train", CFG, augment=False)
    items = [ds[i] for i in range(len(ds))]
    ignored = [n for it in items for n in it["ignore_names"]]
    assert {"Van", "Truck"} & set(ignored), ignored  # not trained on; the evaluation ignores Car hits on them
    assert all(0 < int(lab) <= len(CFG.class_names) for it in items for lab in it["labels"])


def test_dataset_augmentation_and_batch(tiny_split):
    from pcops.models.augment import augment_batch
    from pcops.models.data import KittiDataset, collate

    ds = KittiDataset(tiny_split, "train", CFG, augment=True, seed=0)
    a, b = ds[(0, 0)], ds[(0, 0)]
    assert torch.equal(a["points"], b["points"]) and torch.equal(a["aug"], b["aug"]), (
        "deterministic per (seed, epoch, index)"
    )
    assert not torch.equal(ds[(0, 1)]["aug"], a["aug"]), "a new epoch draws new augmentations"
    assert len(a["sampled"]) > 0, "ground-truth sampling pastes objects"
    batch = collate([ds[(0, 0)], ds[(1, 0)]])
    for c, (lo, hi) in enumerate(batch.class_slices, start=1):
        assert torch.all((batch.gt_labels[:, lo:hi] == c) | (batch.gt_labels[:, lo:hi] == 0))
    out = augment_batch(batch, CFG, generator=torch.Generator().manual_seed(0))
    assert out.points.shape == batch.points.shape
    # the loader removed the scan's points inside the pasted boxes (and kept the pasted objects' points)
    it = ds[(0, 0)]
    scene, pasted = it["points"][: it["n_scene"]], it["points"][it["n_scene"] :]
    shrink = torch.tensor([1, 1, 1, 0.999, 0.999, 0.999, 1])
    assert not bool(_inside(scene, it["sampled"] * shrink).any())
    assert len(pasted) > 0 and bool(_inside(pasted, it["sampled"] * (2 - shrink)).all())
    # the shuffle keeps each scan's points in its run
    n0 = batch.host_lengths[0]
    assert torch.equal(torch.sort(out.points[:n0, 3]).values, torch.sort(batch.points[:n0, 3]).values)
    # each point's owner is the first column of gt_boxes whose box holds it
    start = 0
    for b, n in enumerate(batch.host_lengths):
        live = batch.gt_labels[b] > 0
        inside = _inside_each(batch.points[start : start + n], batch.gt_boxes[b]) & live[None, :]
        want = torch.where(inside.any(1), inside.to(torch.int8).argmax(1), -1)
        pts = batch.points[start : start + n]
        sure = _inside(pts, batch.gt_boxes[b][live] * shrink) == _inside(pts, batch.gt_boxes[b][live] * (2 - shrink))
        got = batch.owner[start : start + n].long()
        # the loader tests in float64: points on a face (within rounding) may differ
        assert int(inside.any(1).sum()) > 0 and torch.equal(got[sure], want[sure]), b
        start += n
    r = CFG.point_cloud_range
    live = out.gt_labels > 0
    assert torch.all((out.gt_boxes[..., 0][live] >= r[0]) & (out.gt_boxes[..., 0][live] < r[3]))


@pytest.mark.parametrize("stretch", [1.0, 1000.0])  # 1000: an extent too large for 16-bit square numbers
def test_points_in_boxes_equals_brute_force(stretch):
    from pcops.models.data import points_in_boxes, points_in_boxes_mask

    rng = np.random.default_rng(int(stretch))
    pts = rng.uniform(-50, 50, size=(20_000, 4)).astype(np.float32)
    pts[:, 2] *= 0.05
    pts[:, 0] *= stretch
    boxes = np.concatenate(
        [
            rng.uniform(-60, 60, (40, 2)),
            rng.uniform(-1, 1, (40, 1)),
            rng.uniform(0.5, 6, (40, 3)),
            rng.uniform(-4, 4, (40, 1)),
        ],
        axis=1,
    )
    boxes[:, 0] *= stretch
    boxes[:3, :3] = pts[:3, :3]  # boxes around points: hits in both cases
    want = _inside_each(torch.from_numpy(pts).double(), torch.from_numpy(boxes)).T.numpy()
    assert want.sum() >= 3 and np.array_equal(points_in_boxes_mask(pts, boxes), want)
    pi, bi = points_in_boxes(pts, boxes)
    assert np.all(np.diff(bi) >= 0)  # sorted by box
    assert len(points_in_boxes(pts, boxes[:0])[0]) == 0 and len(points_in_boxes(pts[:0], boxes)[0]) == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_loader_keeps_every_point_an_augmentation_can_bring_into_range(seed):
    """The loader drops points no flip / rotation / scaling can bring into the range's x-y
    rectangle: every point that lands inside under some drawn augmentation was kept, and the
    bound is not vacuous (most points behind the sensor are dropped)."""
    from pcops.models.data import ROT_RANGE, SCALE_RANGE, _points_can_enter_range

    rng = np.random.default_rng(seed)
    pts = rng.uniform(-120, 120, size=(200_000, 4)).astype(np.float32)
    keep = _points_can_enter_range(pts, CFG.point_cloud_range, margin=0.0)
    r = CFG.point_cloud_range
    reached = np.zeros(len(pts), bool)
    for flip in (1.0, -1.0):
        for rot in np.linspace(*ROT_RANGE, 31):
            for sc in (SCALE_RANGE[0], 1.0, SCALE_RANGE[1]):
                y = pts[:, 1] * flip
                x2 = sc * (np.cos(rot) * pts[:, 0] - np.sin(rot) * y)
                y2 = sc * (np.sin(rot) * pts[:, 0] + np.cos(rot) * y)
                reached |= (x2 >= r[0]) & (x2 < r[3]) & (y2 >= r[1]) & (y2 < r[4])
    assert reached.sum() > 10_000 and not np.any(reached & ~keep)
    behind = pts[:, 0] < -60
    assert keep[behind].mean() < 0.05 and keep.mean() < 0.5
    assert 1.2 * reached.mean() > keep.mean(), "the bound is close to the reachable set"


def test_sensor_augmentations_keep_objects_consistent(tiny_split):
    """SensorAug (issue 22): every point inside a labelled box before is inside the transformed box
    after (objects scaled about their bottom faces, then the same height shift and global flip /
    rotation / scaling as their boxes); reflectance stays in [0, 1]; dropped beams remove points;
    the draws follow the generator."""
    from pcops.models.augment import SensorAug, _beam_of, augment_batch
    from pcops.models.data import FAR, KittiDataset, collate

    ds = KittiDataset(tiny_split, "train", CFG, augment=True, seed=0)
    batch = collate([ds[(0, 0)], ds[(1, 0)]])
    # no shuffle confusion: compare scan by scan, point sets matched through the "scene" order
    aug = SensorAug(object_scale=(0.8, 1.25), beam_drop=0.2, height=0.3)
    a = augment_batch(batch, CFG, generator=torch.Generator().manual_seed(5), sensor=aug)
    b = augment_batch(batch, CFG, generator=torch.Generator().manual_seed(5), sensor=aug)
    assert torch.equal(a.points, b.points) and torch.equal(a.gt_boxes, b.gt_boxes)
    c = augment_batch(batch, CFG, generator=torch.Generator().manual_seed(6), sensor=aug)
    assert not torch.equal(a.gt_boxes, c.gt_boxes)
    live = a.points[:, 0] < FAR
    assert (a.points[live, 3] >= 0).all() and (a.points[live, 3] <= 1).all()
    plain = augment_batch(batch, CFG, generator=torch.Generator().manual_seed(5))
    assert int(live.sum()) < int((plain.points[:, 0] < FAR).sum())  # 20 % of the beams dropped
    start = 0
    for i, n in enumerate(batch.host_lengths):
        boxes = a.gt_boxes[i][a.gt_labels[i] > 0]
        before = batch.gt_boxes[i][a.gt_labels[i] > 0]
        pts_a = a.points[start : start + n]
        inside_after = _inside(pts_a[pts_a[:, 0] < FAR], boxes * torch.tensor([1, 1, 1, 1.02, 1.02, 1.02, 1]))
        src = batch.points[start : start + n]
        inside_before = _inside(src, before * torch.tensor([1, 1, 1, 0.98, 0.98, 0.98, 1]))
        # the dropped beams and pasted-box removals only take points away
        assert int(inside_after.sum()) >= 0.5 * int(inside_before.sum()) > 0
        start += n
    # exactly, before the global transform and the shuffle: no beam dropped, every point of a
    # labelled box stays in its (scaled, lifted) box, the others only move along z
    from pcops.models.augment import _sensor_augment

    exact = SensorAug(object_scale=(0.7, 1.3), beam_drop=0.0, height=0.3)
    pts, boxes = _sensor_augment(batch, batch.points, batch.gt_boxes, exact, torch.Generator().manual_seed(7))
    n0, lab = batch.host_lengths[0], batch.gt_labels[0] > 0
    grow = torch.tensor([1, 1, 1, 1 + 1e-4, 1 + 1e-4, 1 + 1e-4, 1])
    shrink = torch.tensor([1, 1, 1, 1 - 1e-4, 1 - 1e-4, 1 - 1e-4, 1])  # away from the faces: no rounding ties
    before = _inside(batch.points[:n0], batch.gt_boxes[0][lab] * shrink)
    assert int(before.sum()) > 0 and bool(_inside(pts[:n0][before], boxes[0][lab] * grow).all())
    outside = ~_inside(batch.points[:n0], batch.gt_boxes[0][lab] * grow)
    assert torch.equal(pts[:n0][outside, :2], batch.points[:n0][outside, :2])
    dz = pts[:n0][outside, 2] - batch.points[:n0][outside, 2]
    assert float(dz.max() - dz.min()) < 1e-5 and abs(float(dz[0])) <= 0.3  # one height shift per scan
    # beams: the 64 bins cover the sensor's field of view
    beams = _beam_of(batch.points[: batch.host_lengths[0]])  # the simulator writes beam by beam, top first
    assert beams.min() >= 0 and beams.max() <= 63 and len(torch.unique(beams)) > 48
    assert beams[0] <= 1 and (beams[:-1] <= beams[1:] + 1).float().mean() > 0.99


@pytest.mark.slow  # one of the longest: the README's test command stays within 5 minutes
def test_second_trains_with_the_same_trainer(tiny_split, tmp_path):
    """SECOND (issue 21's detector) trains with pcops' trainer: targets, loss, optimiser and
    checkpoints as for PointPillars; gradients reach the sparse encoder."""
    from pcops.models.second import SECOND, second_config
    from pcops.models.train import TrainConfig, train

    torch.manual_seed(0)
    model = SECOND(second_config(point_cloud_range=(0.0, -12.8, -3.0, 25.6, 12.8, 1.0)))
    before = model.backbone_3d.conv_input[0].weight.detach().clone()
    cfg = TrainConfig(data=str(tiny_split), out=str(tmp_path), epochs=1, batch_size=1, device="cpu", workers=0,
                      max_steps=2, eval_split=None, progress=False, log_every=1, precise_bn_batches=0)  # fmt: skip
    rec = train(cfg, model)
    assert rec["steps"] == 2 and all(math.isfinite(h["total"]) for h in rec["history"])
    assert not torch.equal(model.backbone_3d.conv_input[0].weight, before)
    assert (tmp_path / "checkpoint.pt").is_file()
    assert int(model(torch.zeros(0, 4)).count[0]) == 0  # an empty scan detects nothing


def test_dataset_bad_folders(tiny_split, tmp_path):
    from pcops.models.data import KittiDataset

    with pytest.raises(FileNotFoundError, match="split file"):
        KittiDataset(tmp_path, "train")
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_split, bad)
    (bad / "training/label_2/000001.txt").unlink()
    with pytest.raises(FileNotFoundError, match="label_2/000001.txt"):
        KittiDataset(bad, "train")
    # unknown classes are kept as ignore boxes, NaN points are dropped and counted
    before = KittiDataset(tiny_split, "train", CFG)[0]["ignore_names"]  # scene version 2 has vans and trucks
    lab = bad / "training/label_2/000000.txt"
    lab.write_text(
        lab.read_text() + "Van 0.00 0 0.0 0 0 0 0 2.0 1.9 5.0 1.0 1.7 20.0 0.0\n"
        "DontCare -1 -1 -10 0 0 0 0 -1 -1 -1 -1000 -1000 -1000 -10\n"
    )
    pts = np.fromfile(bad / "training/velodyne/000000.bin", dtype=np.float32).reshape(-1, 4)
    pts[:7, 0] = np.nan
    pts.tofile(bad / "training/velodyne/000000.bin")
    (bad / "training/label_2/000001.txt").write_text("")
    ds = KittiDataset(bad, "train", CFG)
    item = ds[0]
    assert item["skipped_points"] == 7 and torch.isfinite(item["points"]).all()
    assert item["ignore_names"] == before + ["Van"]
    assert len(ds[1]["boxes"]) == 0  # an empty scan's labels


# --- training ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_cpu_training_steps_decrease_loss_and_resume_exactly(tiny_split, tmp_path):
    from pcops.models.data import KittiDataset, collate
    from pcops.models.train import TrainConfig, train, train_step

    torch.manual_seed(0)
    model = PointPillars()
    model.train()
    cfg = TrainConfig(data=str(tiny_split), device="cpu", batch_size=1, lr=1e-3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batch = collate([KittiDataset(tiny_split, "train", CFG, augment=False)[0]])
    losses = [float(train_step(model, batch, opt, sched, cfg, step=0).total) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    # resume: train 1 epoch and save, then the next step's loss from the checkpoint equals the straight run's
    base = dict(
        data=str(tiny_split),
        device="cpu",
        batch_size=1,
        workers=0,
        epochs=2,
        eval_split=None,
        progress=False,
        log_every=1,
        precise_bn_batches=0,
    )
    torch.manual_seed(0)
    straight = train(TrainConfig(out=str(tmp_path / "a"), **base), PointPillars())
    ck = tmp_path / "b"
    torch.manual_seed(0)
    train(TrainConfig(out=str(ck), max_steps=3, **base), PointPillars())  # stops after epoch 1 (3 scans)
    resumed = train(TrainConfig(out=str(tmp_path / "c"), resume=str(ck / "checkpoint.pt"), **base), PointPillars())
    assert resumed["history"][0]["step"] == 4
    # bit-identical on the CPU: same weights, optimizer state, schedule position, batch and augmentation draws
    assert resumed["history"][0]["total"] == straight["history"][3]["total"]


def test_pretrained_weights_load_and_detect():
    model = PointPillars.pretrained()
    assert model.weights_source.endswith("pointpillars_sim.pt")
    size = (REPO / "models" / "weights" / "pointpillars_sim.pt").stat().st_size
    assert size <= 10_000_000
    from pcops.sim import simulate_scan

    scan = simulate_scan(2_000_000)
    det = model(scan.points)
    n = int(det.count[0])
    assert n > 0
    # the detections overlap the labelled cars in the range
    r = CFG.point_cloud_range
    cars = [
        i
        for i, nm in enumerate(scan.names)
        if nm == "Car"
        and scan.num_points_in_box[i] >= 50
        and r[0] <= scan.boxes[i, 0] < r[3]
        and r[1] <= scan.boxes[i, 1] < r[4]
    ]
    import pcops

    iou = pcops.boxes_iou_bev(scan.boxes[cars], det.boxes[0, :n])
    assert float((iou.max(dim=1).values >= 0.5).float().mean()) >= 0.8


def test_untrained_model_warns_once():
    model = PointPillars()
    pts = torch.rand(1000, 4) * torch.tensor([60.0, 60, 2, 1]) - torch.tensor([0.0, 30, 2, 0])
    with pytest.warns(UserWarning, match="untrained"):
        model(pts)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(pts)
    model.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        model(pts)


SMALL = PointPillarsConfig(point_cloud_range=(0.0, -10.24, -3.0, 20.48, 10.24, 1.0))  # a 128 x 128 grid


def _two_scan_split(tiny_split, tmp_path) -> Path:
    """A copy of ``tiny_split`` whose train and val splits are its scans 000000 and 000001."""
    import shutil

    root = tmp_path / "two"
    shutil.copytree(tiny_split, root)
    (root / "ImageSets" / "train.txt").write_text("000000\n000001\n")
    (root / "ImageSets" / "val.txt").write_text("000000\n000001\n")
    return root


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 150 CPU steps: about 3 minutes on 2 idle cores, over 10 on a loaded machine
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])])
def test_overfit_two_scans(tiny_split, tmp_path, device):
    """Two scans, no augmentation, a small range (fast on the CPU): the loss falls near zero and the
    model finds every car on them."""

    from pcops.models.train import TrainConfig, evaluate_dataset, train

    root = _two_scan_split(tiny_split, tmp_path)
    cfg = TrainConfig(
        data=str(root),
        out=str(tmp_path / "run"),
        epochs=OVERFIT_STEPS,
        batch_size=2,
        workers=0,
        lr=0.003,
        eval_split=None,
        progress=False,
        log_every=10,
        augment=False,
        device=device,
    )
    model = PointPillars(config=SMALL)
    rec = train(cfg, model)
    assert rec["history"][-1]["total"] < 0.25 * rec["history"][0]["total"], rec["history"]
    res = evaluate_dataset(model, str(root), "val", batch_size=2, workers=0, progress=False)
    assert res["Car"]["num_gt"] > 0
    assert res["Car"]["bev"] >= 95.0, res["Car"]


OVERFIT_STEPS = 150


@pytest.mark.gpu
@requires_cuda
def test_gpu_shipped_weights_reproduce_recorded_ap(tmp_path):
    from pcops.models.data import generate_split
    from pcops.models.train import evaluate_dataset

    rec = json.loads((REPO / "benchmarks" / "results" / "train_pointpillars.json").read_text())
    want = rec["eval_val_first50"]
    version = rec.get("scene_version", 1)  # the scenes the shipped weights were trained and evaluated on
    generate_split(tmp_path, n_train=0, n_val=50, progress=False, scene_version=version)  # seeds 2,000,000..049
    model = PointPillars.pretrained().cuda()
    got = evaluate_dataset(model, str(tmp_path), "val", batch_size=16, workers=4, progress=False)
    for c in ("Car", "Pedestrian", "Cyclist"):
        assert abs(got[c]["3d"] - want[c]["3d"]) <= 1.0, (c, got[c]["3d"], want[c]["3d"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_time_budget_fits_the_schedule_after_the_measuring_window(tiny_split, tmp_path):
    """A tiny ``time_budget`` fits the one-cycle schedule at the end of ``FIT_WINDOW`` (after the
    warm-up and the synchronising profiled steps): training stops one step later, with the
    schedule's last learning rate."""

    from pcops.models.train import FIT_WINDOW, TrainConfig, train

    root = _two_scan_split(tiny_split, tmp_path)
    cfg = TrainConfig(
        data=str(root),
        out=str(tmp_path / "run"),
        epochs=200,
        batch_size=2,
        workers=0,
        eval_split=None,
        progress=False,
        log_every=1,
        augment=False,
        device="cpu",
        time_budget=1e-3,
        precise_bn_batches=0,
    )
    rec = train(cfg, PointPillars(config=SMALL))
    assert rec["steps"] == FIT_WINDOW[1] + 1, rec["steps"]
    assert rec["history"][-1]["lr"] < 1e-5, rec["history"][-1]
    # a resumed run keeps the fitted length (it used to train on past it, and the scheduler raised)
    ck = tmp_path / "run" / "checkpoint.pt"
    assert torch.load(ck, weights_only=True)["total_steps"] == FIT_WINDOW[1] + 1
    again = train(dataclasses.replace(cfg, resume=str(ck), out=str(tmp_path / "again")), PointPillars(config=SMALL))
    assert again["steps"] == FIT_WINDOW[1] + 1, again["steps"]


@pytest.mark.slow  # 30 s of data loading: the README's test command stays within 5 minutes
def test_time_budget_refits_when_the_pace_changes(tiny_split, tmp_path, monkeypatch):
    """A run that slows down after the first fit (a loader that falls behind once its prefetched
    batches are used up) re-measures its pace at ``REFIT_AT`` and ends near its budget; one that
    keeps its pace keeps its schedule. A fake clock: every step costs 0.1 s, then 0.2 s."""
    import types

    import pcops.models.train as tr
    from pcops.models.loss import Losses

    root = _two_scan_split(tiny_split, tmp_path)
    clock = {"t": 0.0}
    monkeypatch.setattr(tr, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))

    def run(slow_from: int):
        def fake_step(model, batch, opt, sched, cfg, scaler=None, step=0, times=None, forward=None, rank=0):
            clock["t"] += 0.1 if step < slow_from else 0.2
            opt.step()  # the scheduler expects an optimizer step first
            sched.step()
            z = torch.zeros(())
            return Losses(z, z, z, z, z)

        monkeypatch.setattr(tr, "train_step", fake_step)
        cfg = tr.TrainConfig(
            data=str(root),
            out=str(tmp_path / f"run{slow_from}"),
            epochs=5000,
            batch_size=2,
            workers=0,
            eval_split=None,
            progress=False,
            log_every=10_000,
            checkpoint_every=10_000,
            augment=False,
            device="cpu",
            time_budget=60.0,
            precise_bn_batches=0,
        )
        clock["t"] = 0.0
        rec = tr.train(cfg, PointPillars(config=SMALL))
        return rec["steps"], clock["t"]

    steady_steps, steady_t = run(slow_from=10**9)
    assert steady_steps == 600 and abs(steady_t - 60.0) < 0.5, (steady_steps, steady_t)
    slow_steps, slow_t = run(slow_from=150)
    # without re-fits: 600 steps, 105 s; with them the run ends within 10 % of its budget
    assert slow_steps < 420 and abs(slow_t - 60.0) < 6.0, (slow_steps, slow_t)
