"""pcops.viz: bird's-eye-view pictures (legend, metre axes, both halves, labels without overlaps)."""

import itertools

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from pcops import viz  # noqa: E402


def _scene(seed=0, n_points=20_000, n_boxes=12):
    g = torch.Generator().manual_seed(seed)
    pts = torch.empty(n_points, 4)
    pts[:, 0] = torch.rand(n_points, generator=g) * 140 - 70  # both halves of the scan
    pts[:, 1] = torch.rand(n_points, generator=g) * 100 - 50
    pts[:, 2] = torch.rand(n_points, generator=g) * 3 - 2
    pts[:, 3] = torch.rand(n_points, generator=g)
    boxes = torch.zeros(n_boxes, 7)
    boxes[:, 0] = torch.rand(n_boxes, generator=g) * 120 - 60
    boxes[:, 1] = torch.rand(n_boxes, generator=g) * 80 - 40
    boxes[:, 3:6] = torch.tensor([3.9, 1.6, 1.5])
    boxes[:, 6] = torch.rand(n_boxes, generator=g) * 6.28
    names = [("Car", "Pedestrian", "Cyclist")[i % 3] for i in range(n_boxes)]
    scores = torch.rand(n_boxes, generator=g)
    return pts, boxes, names, scores


def _legend_texts(ax):
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg is not None else []


def _text_overlaps(fig, ax):
    fig.draw_without_rendering()
    r = fig.canvas.get_renderer()
    bbs = [t.get_window_extent(r) for t in ax.texts]
    return [
        (ax.texts[i].get_text(), ax.texts[j].get_text())
        for i, j in itertools.combinations(range(len(bbs)), 2)
        if bbs[i].overlaps(bbs[j])
    ]


def test_draw_bev_writes_png_with_legend_axes_and_full_range(tmp_path):
    import matplotlib.image

    pts, gt, names, scores = _scene()
    dets = gt.clone()
    dets[:, 0] += 0.5
    path = tmp_path / "bev.png"
    assert (
        viz.draw_bev(
            pts,
            dets,
            gt,
            path,
            classes=names,
            scores=scores,
            gt_labels=names,
            detector_range=(0.0, -39.68, -3.0, 69.12, 39.68, 1.0),
            title="scan.bin · PointPillars · random weights · 12.3 ms",
            inches=6,
            dpi=80,
        )
        is None
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.shape[1] == 6 * 80 and img.shape[0] > 100

    fig = viz.draw_bev(pts, dets, gt, classes=names, scores=scores, detector_range=(0.0, -39.68, 69.12, 39.68))
    ax = fig.axes[0]
    legend = _legend_texts(ax)
    assert "ground truth (12)" in legend and "detector range" in legend
    assert {"Car detection (4)", "Pedestrian detection (4)", "Cyclist detection (4)"} <= set(legend)
    # both halves of the scan (x < 0 behind the sensor), metre axes
    x0, x1 = ax.get_xlim()
    assert x0 <= -60 and x1 >= 69.12
    assert ax.get_xlabel().startswith("x (m") and ax.get_ylabel().startswith("y (m")
    # scores next to the boxes
    assert any(t.get_text().endswith(f"{float(scores[0]):.2f}") for t in ax.texts)
    # class colours: a detection of each class in its palette colour
    assert viz.class_color("Car") != viz.class_color("Pedestrian") != viz.GT_COLOR


def test_dense_labels_do_not_overlap_and_the_dropped_are_counted():
    pts, _, _, _ = _scene(1, n_points=2_000)
    # 15 x 15 cars 4.5 m apart: far too many labels for the picture
    xs, ys = torch.meshgrid(torch.arange(15) * 4.5 - 30, torch.arange(15) * 4.5 - 30, indexing="ij")
    boxes = torch.zeros(225, 7)
    boxes[:, 0], boxes[:, 1] = xs.reshape(-1), ys.reshape(-1)
    boxes[:, 3:6] = torch.tensor([3.9, 1.6, 1.5])
    scores = torch.linspace(1.0, 0.0, 225)
    fig = viz.draw_bev(pts, boxes, classes=["Car"] * 225, scores=scores, inches=6)
    ax = fig.axes[0]
    assert _text_overlaps(fig, ax) == []
    assert 0 < len(ax.texts) < 225
    dropped = [t for t in _legend_texts(ax) if "labels not drawn" in t]
    assert dropped == [f"{225 - len(ax.texts)} overlapping labels not drawn"]
    # the best-scoring box keeps its label
    assert any(t.get_text() == "Car 1.00" for t in ax.texts)


def test_side_by_side_panels(tmp_path):
    pts, gt, names, scores = _scene(2)
    path = tmp_path / "compare.png"
    viz.draw_bev(
        pts,
        [gt, gt[:5]],
        gt,
        path,
        classes=[names, names[:5]],
        scores=[scores, scores[:5]],
        panel_titles=["fast path", "reference"],
        title="two backends",
        inches=4,
        dpi=60,
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = viz.draw_bev(pts, [gt, gt[:5]], panel_titles=["a", "b"], inches=4)
    assert len(fig.axes) == 2 and [ax.get_title() for ax in fig.axes] == ["a", "b"]
    assert "detection (5)" in _legend_texts(fig.axes[1])
    with pytest.raises(ValueError, match="panel_titles"):
        viz.draw_bev(pts, [gt, gt], panel_titles=["only one"])
    with pytest.raises(ValueError, match="scores"):
        viz.draw_bev(pts, [gt, gt], scores=scores)
    with pytest.raises(ValueError, match="boxes"):
        viz.draw_bev(pts, [])


def test_place_labels_unit():
    square = np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])

    def size_of(text):
        return 0.5 * len(text), 1.0

    items = [("aa", square, 2.0), ("bb", square + 0.1, 1.0), ("out", square + 100.0, 3.0)]
    placed, dropped = viz._place_labels(items, size_of, (-10.0, 10.0, -10.0, 10.0))
    assert dropped == 1 and sorted(p[0] for p in placed) == [0, 1]  # a box outside the view: no label
    rects = [p[5] for p in placed]
    assert not viz._overlaps(rects[0], rects[1])
    assert placed[0][0] == 0  # higher priority first


def test_bad_input():
    pts, gt, names, scores = _scene(3, n_points=100)
    with pytest.raises(ValueError, match="detector_range"):
        viz.draw_bev(pts, gt, detector_range=(1.0, 2.0, 0.0))
    with pytest.raises(ValueError, match="scores"):
        viz.draw_bev(pts, gt, scores=scores[:3])
    with pytest.raises(ValueError, match="classes"):
        viz.draw_bev(pts, gt, classes=names[:2])
    with pytest.raises(ValueError, match="x_range"):
        viz.draw_bev(pts, gt, x_range=(5.0, 1.0), y_range=(0.0, 1.0))
    with pytest.raises(TypeError, match="path"):
        viz.draw_bev(pts, gt, path=3)
