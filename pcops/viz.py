"""Bird's-eye-view pictures of point clouds and 3-D boxes (matplotlib, Agg backend).

Not an op module; import it as ``pcops.viz`` (needs the ``pcops[viz]`` extra, matplotlib).
Used by ``data/README.md``'s preview image, the PointPillars demo and the reports that compare
two models or two backends side by side.

Example:
    >>> from pcops import io, viz
    >>> pts = io.read_points("data/sample_000.bin")
    >>> gt = io.read_labels("data/sample_000.txt")
    >>> viz.draw_bev(pts, gt_boxes=gt.boxes, gt_labels=list(gt.names), path="bev.png",
    ...              detector_range=(0.0, -39.68, 69.12, 39.68), title="sample_000")
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["draw_bev", "box_corners_bev", "class_color", "CLASS_COLORS"]

GT_COLOR = "#00e676"  # ground truth: green, dashed
DET_COLOR = "#ff1744"  # detections without a class: red
# detections are coloured by class; none of these is close to the ground truth's green
CLASS_COLORS = {
    "Car": "#ff1744",
    "Pedestrian": "#2979ff",
    "Cyclist": "#ffc400",
    "Van": "#ff6d00",
    "Truck": "#d500f9",
}
_OTHER_COLORS = ("#f50057", "#00b8d4", "#ffab00", "#aa00ff", "#c51162", "#6200ea")
_BG = "#101014"
_FG = "#e0e0e0"
_LABEL_PT = 5.5  # font size of box labels, points


def _np(x, name: str, cols: int | None = None) -> np.ndarray | None:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    elif not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array, got {type(x).__name__}")
    x = np.asarray(x, dtype=np.float64)
    if cols is not None and (x.ndim != 2 or x.shape[1] < cols):
        raise ValueError(f"{name}: expected shape (M, >={cols}), got {tuple(x.shape)}")
    return x


def box_corners_bev(boxes) -> np.ndarray:
    """BEV corners of ``(M, >=7)`` boxes ``(x, y, z, dx, dy, dz, heading)``: ``(M, 4, 2)``,
    counter-clockwise from the front-left corner."""
    b = _np(boxes, "boxes", 7)
    local = np.array([[0.5, 0.5], [-0.5, 0.5], [-0.5, -0.5], [0.5, -0.5]])
    xy = local[None] * b[:, None, 3:5]
    c, s = np.cos(b[:, 6])[:, None], np.sin(b[:, 6])[:, None]
    x = c * xy[..., 0] - s * xy[..., 1] + b[:, None, 0]
    y = s * xy[..., 0] + c * xy[..., 1] + b[:, None, 1]
    return np.stack([x, y], axis=-1)


def class_color(name) -> str:
    """The colour of a detection of class ``name`` (a fixed palette; unknown names hash into it)."""
    if name is None:
        return DET_COLOR
    name = str(name)
    if name in CLASS_COLORS:
        return CLASS_COLORS[name]
    return _OTHER_COLORS[sum(map(ord, name)) % len(_OTHER_COLORS)]


def _texts(values, n: int, name: str) -> list | None:
    if values is None:
        return None
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{name}: expected {n} entries (one per box), got {len(values)}")
    return values


def _auto_range(p: np.ndarray, detector_range) -> tuple[tuple[float, float], tuple[float, float]]:
    """The whole scan (both halves), rounded out to 10 m, ignoring the farthest 0.1 % of points."""
    if len(p):
        lo = np.percentile(p[:, :2], 0.05, axis=0)
        hi = np.percentile(p[:, :2], 99.95, axis=0)
    else:
        lo, hi = np.array([-10.0, -10.0]), np.array([10.0, 10.0])
    if detector_range is not None:
        lo = np.minimum(lo, detector_range[:2])
        hi = np.maximum(hi, detector_range[2:])
    lo, hi = np.floor(lo / 10.0) * 10.0, np.ceil(hi / 10.0) * 10.0
    hi = np.maximum(hi, lo + 10.0)
    return (float(lo[0]), float(hi[0])), (float(lo[1]), float(hi[1]))


def _detector_rect(r) -> np.ndarray | None:
    """``(xmin, ymin, xmax, ymax)`` from a 4-tuple or a 6-tuple point_cloud_range."""
    if r is None:
        return None
    r = [float(v) for v in r]
    if len(r) == 6:
        r = [r[0], r[1], r[3], r[4]]
    if len(r) != 4 or not (r[2] > r[0] and r[3] > r[1]):
        raise ValueError(f"detector_range: expected (xmin, ymin, xmax, ymax) or a 6-value point_cloud_range, got {r}")
    return np.array(r)


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _place_labels(items, size_of, bounds):
    """Greedy label placement without collisions.

    ``items``: ``(text, corners (4, 2), priority)``; higher priority is placed first.
    ``size_of(text)`` gives a label's ``(width, height)`` in metres. Each label tries six places
    around its box's bounding square; a label that fits nowhere (inside ``bounds``, clear of
    every box and of the labels placed so far) is dropped, as is the label of a box whose centre
    lies outside ``bounds``. Returns ``(placed, dropped)`` with ``placed`` a list of
    ``(index, x, y, ha, va, rect)``.
    """
    placed, dropped = [], 0
    # every box's bounding square is an obstacle too, so a label never covers another box
    rects = [(*cs.min(0), *cs.max(0)) for _, cs, _ in items]
    x0, x1, y0, y1 = bounds
    order = sorted(range(len(items)), key=lambda i: -items[i][2])
    for i in order:
        text, cs, _ = items[i]
        cx, cy = cs.mean(0)
        if not (x0 <= cx <= x1 and y0 <= cy <= y1):
            dropped += 1
            continue
        w, h = size_of(text)
        bx0, by0 = cs.min(0)
        bx1, by1 = cs.max(0)
        gap = 0.3 * h
        candidates = (  # (anchor x, anchor y, ha, va, rect)
            (bx1 + gap, by1, "left", "top", (bx1 + gap, by1 - h, bx1 + gap + w, by1)),
            (bx1 + gap, by0, "left", "bottom", (bx1 + gap, by0, bx1 + gap + w, by0 + h)),
            (bx0 - gap, by1, "right", "top", (bx0 - gap - w, by1 - h, bx0 - gap, by1)),
            (bx0 - gap, by0, "right", "bottom", (bx0 - gap - w, by0, bx0 - gap, by0 + h)),
            (bx0, by1 + gap, "left", "bottom", (bx0, by1 + gap, bx0 + w, by1 + gap + h)),
            (bx0, by0 - gap, "left", "top", (bx0, by0 - gap - h, bx0 + w, by0 - gap)),
        )
        for ax_, ay_, ha, va, r in candidates:
            inside = r[0] >= x0 and r[2] <= x1 and r[1] >= y0 and r[3] <= y1
            if inside and not any(_overlaps(r, q) for q in rects):
                rects.append(r)
                placed.append((i, ax_, ay_, ha, va, r))
                break
        else:
            dropped += 1
    return placed, dropped


def _draw_boxes(ax, corners, centres, colors, lw, linestyle):
    from matplotlib.collections import LineCollection, PolyCollection

    ax.add_collection(
        PolyCollection(
            corners, closed=True, facecolors="none", edgecolors=colors, linewidths=lw, linestyles=linestyle, zorder=3
        )
    )
    # heading tick: from the centre to the middle of the front face
    front = (corners[:, 0] + corners[:, 3]) / 2
    ax.add_collection(LineCollection(np.stack([centres, front], 1), colors=colors, linewidths=lw, zorder=3))


def _panel(ax, p, c, cmap, vmin, vmax, xr, yr, point_size, det, gt, det_range):
    """One BEV panel; returns the scatter (for the colour bar) and the legend handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    x0, x1 = xr
    y0, y1 = yr
    ax.set_facecolor(_BG)
    m = (p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)
    sc = ax.scatter(
        p[m, 0],
        p[m, 1],
        c=c[m],
        s=point_size,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        linewidths=0,
        marker=".",
        rasterized=True,
        zorder=1,
    )
    handles = []
    if det_range is not None:
        ax.add_patch(
            Rectangle(
                det_range[:2],
                det_range[2] - det_range[0],
                det_range[3] - det_range[1],
                fill=False,
                edgecolor="#9e9e9e",
                linestyle=(0, (4, 3)),
                linewidth=0.8,
                zorder=2,
            )
        )
        handles.append(Line2D([], [], color="#9e9e9e", linestyle=(0, (4, 3)), lw=0.8, label="detector range"))
    ax.plot([0], [0], marker=">", color="white", markersize=4, zorder=4)  # the sensor, facing +x

    items, styles = [], []
    if gt is not None:
        boxes, texts = gt
        cs = box_corners_bev(boxes)
        _draw_boxes(ax, cs, boxes[:, :2], GT_COLOR, 0.8, (0, (3, 2)))
        handles.append(
            Line2D([], [], color=GT_COLOR, linestyle=(0, (3, 2)), lw=1.0, label=f"ground truth ({len(boxes)})")
        )
        for k, t in enumerate(texts or ()):
            if t:
                items.append((str(t), cs[k], -1.0))
                styles.append(GT_COLOR)
    if det is not None:
        boxes, classes, scores, texts = det
        cs = box_corners_bev(boxes)
        colors = [class_color(k) for k in classes] if classes is not None else [DET_COLOR] * len(boxes)
        _draw_boxes(ax, cs, boxes[:, :2], colors, 1.1, "solid")
        if classes is not None:
            for name in dict.fromkeys(str(k) for k in classes):
                n = sum(str(k) == name for k in classes)
                handles.append(Line2D([], [], color=class_color(name), lw=1.4, label=f"{name} detection ({n})"))
        else:
            handles.append(Line2D([], [], color=DET_COLOR, lw=1.4, label=f"detection ({len(boxes)})"))
        for k in range(len(boxes)):
            t = texts[k] if texts is not None else (classes[k] if classes is not None else "")
            if scores is not None:
                t = f"{t} {scores[k]:.2f}" if t else f"{scores[k]:.2f}"
            if t:
                items.append((str(t), cs[k], 1.0 + (float(scores[k]) if scores is not None else 0.0)))
                styles.append(colors[k])

    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m, forward)", color=_FG, fontsize=7)
    ax.set_ylabel("y (m, left)", color=_FG, fontsize=7)
    ax.tick_params(colors=_FG, labelsize=6, direction="out", length=2)
    for s in ax.spines.values():
        s.set_color("#616161")
    ax.grid(True, color="#ffffff", alpha=0.08, linewidth=0.5)
    _scale_bar(ax, x1 - x0)
    return sc, handles, (items, styles)


def _draw_labels(ax, items, styles) -> int:
    """Place the panel's labels once the layout is final (it fixes the metres per pixel), sized
    by the renderer's own text metrics; returns how many were dropped."""
    from matplotlib.font_manager import FontProperties

    fig = ax.figure
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    m_per_px = (x1 - x0) / max(ax.get_window_extent().width, 1.0)
    font = FontProperties(size=_LABEL_PT)
    pad = 1.5 * fig.dpi / 72.0  # 1.5 pt of air around a label

    def size_of(text):
        w, h, d = renderer.get_text_width_height_descent(text, font, ismath=False)
        return (w + pad) * m_per_px, (h + d + pad) * m_per_px

    placed, dropped = _place_labels(items, size_of, (x0, x1, y0, y1))
    for i, tx, ty, ha, va, _ in placed:
        ax.text(tx, ty, items[i][0], color=styles[i], fontsize=_LABEL_PT, ha=ha, va=va, zorder=5, clip_on=True)
    return dropped


def _scale_bar(ax, width_m: float) -> None:
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    # a round length near an eighth of the panel
    raw = width_m / 8.0
    length = min((v for v in (1, 2, 5, 10, 20, 50, 100, 200) if v >= raw), default=200)
    bar = AnchoredSizeBar(
        ax.transData,
        length,
        f"{length} m",
        "lower right",
        pad=0.4,
        color="white",
        frameon=False,
        size_vertical=width_m / 700.0,
        fontproperties={"size": 6},
    )
    ax.add_artist(bar)


def draw_bev(
    points,
    boxes=None,
    gt_boxes=None,
    path=None,
    *,
    color_by: str = "height",
    x_range=None,
    y_range=None,
    labels=None,
    gt_labels=None,
    point_size: float = 0.5,
    dpi: int = 100,
    inches: float = 8.0,
    title: str | None = None,
    scores=None,
    classes=None,
    detector_range=None,
    panel_titles: Sequence[str] | None = None,
    legend: bool = True,
):
    """Draw points from above with rotated boxes: a legend, metre axes and a scale bar.

    Args:
        points: ``(N, >=3)`` tensor/array, LiDAR frame; the picture's horizontal axis is
            LiDAR x (forward to the right) and its vertical axis LiDAR y (left is up).
        boxes: optional ``(M, >=7)`` detections ``(x, y, z, dx, dy, dz, heading)``, solid
            lines coloured by class (``classes``; red without). A list or tuple of such
            arrays draws one panel per entry side by side (two models, two backends) over
            the same points and ground truth; ``scores``, ``classes`` and ``labels`` are
            then lists of the same length.
        gt_boxes: optional ``(K, >=7)`` ground-truth boxes, dashed green.
        path: write a PNG there (folders must exist); ``None`` returns the figure instead.
        color_by: ``"height"`` (z, colour scale -2.2 m to 1 m) or ``"reflectance"``
            (column 3, 0 to 0.7); a colour bar says which.
        x_range, y_range: the drawn area, metres; ``None`` (default): the whole scan, both
            halves (the farthest 0.1 % of points left out), rounded out to 10 m.
        labels, gt_labels: optional text per box (e.g. class names). Labels are placed
            beside their boxes without overlapping; those that do not fit are dropped and
            the legend says how many.
        point_size: marker size in points^2.
        dpi, inches: figure resolution and width of one panel (height follows the aspect).
        title: optional title above the panels (e.g. scan, detector, weights, timing).
        scores: optional ``(M,)`` detection scores, written after the label (``Car 0.87``);
            labels of higher-scoring boxes are placed first.
        classes: optional ``(M,)`` class names of the detections: box colour and legend.
        detector_range: optional ``(xmin, ymin, xmax, ymax)`` or a 6-value
            ``point_cloud_range``: drawn as a dashed grey rectangle.
        panel_titles: one title per panel when ``boxes`` is a list.
        legend: draw the legend (box kinds and counts).

    Returns:
        The matplotlib Figure when ``path`` is None, else None (the figure is closed).
    """
    # a bare Figure renders with the Agg canvas and never touches pyplot's global state
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    p = _np(points, "points", 3)
    if color_by == "height":
        c = p[:, 2]
        cmap, vmin, vmax, clabel = "turbo", -2.2, 1.0, "height z (m)"
    elif color_by == "reflectance":
        if p.shape[1] < 4:
            raise ValueError("color_by: 'reflectance' needs points with a 4th column")
        c = p[:, 3]
        cmap, vmin, vmax, clabel = "plasma", 0.0, 0.7, "reflectance"
    else:
        raise ValueError(f"color_by: expected 'height' or 'reflectance', got {color_by!r}")
    det_range = _detector_rect(detector_range)

    multi = isinstance(boxes, (list, tuple))
    box_sets = list(boxes) if multi else [boxes]
    if multi and not box_sets:
        raise ValueError("boxes: an empty list (expected one (M, >=7) array per panel)")
    n_panels = len(box_sets)

    def per_panel(v, name):
        if not multi or v is None:
            return [v] * n_panels
        if not isinstance(v, (list, tuple)) or len(v) != n_panels:
            raise ValueError(f"{name}: with a list of {n_panels} box sets, expected a list of {n_panels} entries")
        return list(v)

    scores_l, classes_l, labels_l = (
        per_panel(scores, "scores"),
        per_panel(classes, "classes"),
        per_panel(labels, "labels"),
    )
    if panel_titles is not None and len(panel_titles) != n_panels:
        raise ValueError(f"panel_titles: expected {n_panels} titles, got {len(panel_titles)}")

    g = _np(gt_boxes, "gt_boxes", 7)
    gt = None
    if g is not None and len(g):
        gt = (g, _texts(gt_labels, len(g), "gt_labels"))

    if x_range is None or y_range is None:
        axr, ayr = _auto_range(p, det_range)
        x_range = axr if x_range is None else x_range
        y_range = ayr if y_range is None else y_range
    x0, x1 = (float(v) for v in x_range)
    y0, y1 = (float(v) for v in y_range)
    if not (x1 > x0 and y1 > y0):
        raise ValueError(f"x_range/y_range: expected (low, high) with high > low, got {x_range}, {y_range}")

    fig = Figure(
        figsize=(inches * n_panels, inches * (y1 - y0) / (x1 - x0) + 0.6 + (0.25 if title else 0.0)),
        dpi=dpi,
        facecolor=_BG,
        layout="constrained",
    )
    FigureCanvasAgg(fig)  # the label placement measures text with the Agg renderer
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    sc, panels = None, []
    for k, ax in enumerate(axes):
        det = None
        d = _np(box_sets[k], "boxes", 7)
        if d is not None and len(d):
            sk = scores_l[k]
            sk = (
                None
                if sk is None
                else _np(sk if isinstance(sk, (torch.Tensor, np.ndarray)) else np.asarray(sk), "scores").reshape(-1)
            )
            if sk is not None and len(sk) != len(d):
                raise ValueError(f"scores: expected {len(d)} entries (one per box), got {len(sk)}")
            det = (d, _texts(classes_l[k], len(d), "classes"), sk, _texts(labels_l[k], len(d), "labels"))
        sc, handles, pending = _panel(ax, p, c, cmap, vmin, vmax, (x0, x1), (y0, y1), point_size, det, gt, det_range)
        panels.append((ax, handles, pending))
        if panel_titles is not None:
            ax.set_title(panel_titles[k], color=_FG, fontsize=8)
    # the colour bar is an inset of the last panel, so fig.axes holds the panels only
    cax = axes[-1].inset_axes((0.965, 0.62, 0.012, 0.34))
    cb = fig.colorbar(sc, cax=cax)
    cb.set_label(clabel, color=_FG, fontsize=6)
    cb.ax.tick_params(colors=_FG, labelsize=5, length=2)
    cb.outline.set_edgecolor("#616161")
    cax.yaxis.set_ticks_position("left")
    cax.yaxis.set_label_position("left")
    if title:
        fig.suptitle(title, color=_FG, fontsize=9)
    for ax, handles, (items, styles) in panels:
        dropped = _draw_labels(ax, items, styles) if items else 0
        if dropped:
            handles.append(Line2D([], [], linestyle="none", label=f"{dropped} overlapping labels not drawn"))
        if legend and handles:
            leg = ax.legend(
                handles=handles,
                loc="upper left",
                fontsize=6,
                framealpha=0.75,
                facecolor="#212121",
                edgecolor="#424242",
                labelcolor=_FG,
                handlelength=2.2,
            )
            leg.set_zorder(6)
    if path is None:
        return fig
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a path (str or os.PathLike), got {type(path).__name__}")
    fig.savefig(path, dpi=dpi, facecolor=_BG, metadata={"Software": None})
    return None
