"""Bird's-eye-view pictures of point clouds and 3-D boxes (matplotlib, Agg backend).

Not an op module; import it as ``pcops.viz`` (needs the ``pcops[viz]`` extra, matplotlib).
Used by ``data/README.md``'s preview image and by the PointPillars demo (detections in one
colour, ground truth in another).
"""
from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["draw_bev", "box_corners_bev"]

GT_COLOR = "#00c853"  # ground truth: green
DET_COLOR = "#ff1744"  # detections: red


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


def _draw_boxes(ax, boxes, color, labels, lw):
    from matplotlib.patches import Polygon

    corners = box_corners_bev(boxes)
    for i, (b, cs) in enumerate(zip(boxes, corners)):
        ax.add_patch(Polygon(cs, closed=True, fill=False, edgecolor=color, linewidth=lw))
        # heading tick: from the centre to the middle of the front face
        front = (cs[0] + cs[3]) / 2
        ax.plot([b[0], front[0]], [b[1], front[1]], color=color, linewidth=lw)
        if labels is not None and i < len(labels) and labels[i]:
            ax.text(cs[:, 0].max(), cs[:, 1].max(), str(labels[i]), color=color, fontsize=5)


def draw_bev(
    points,
    boxes=None,
    gt_boxes=None,
    path=None,
    *,
    color_by: str = "height",
    x_range=(-40.0, 70.4),
    y_range=(-40.0, 40.0),
    labels=None,
    gt_labels=None,
    point_size: float = 0.3,
    dpi: int = 100,
    inches: float = 8.0,
    title: str | None = None,
):
    """Draw points from above with rotated boxes.

    Args:
        points: ``(N, >=3)`` tensor/array, LiDAR frame; the picture's horizontal axis is
            LiDAR x (forward to the right) and its vertical axis LiDAR y (left is up).
        boxes: optional ``(M, >=7)`` detections ``(x, y, z, dx, dy, dz, heading)``, drawn red.
        gt_boxes: optional ``(K, >=7)`` ground-truth boxes, drawn green.
        path: write a PNG there (folders must exist); ``None`` returns the figure instead.
        color_by: ``"height"`` (z, colour scale -2.2 m blue to 1 m red) or ``"reflectance"``
            (column 3, 0 to 0.7).
        x_range, y_range: the drawn area, metres.
        labels, gt_labels: optional text per box (e.g. class and score).
        point_size: marker size in points^2.
        dpi, inches: figure resolution and width (height follows the aspect ratio).
        title: optional title.

    Returns:
        The matplotlib Figure when ``path`` is None, else None (the figure is closed).
    """
    # a bare Figure renders with the Agg canvas and never touches pyplot's global state
    from matplotlib.figure import Figure

    p = _np(points, "points", 3)
    if color_by == "height":
        c = p[:, 2]
        cmap, vmin, vmax = "turbo", -2.2, 1.0
    elif color_by == "reflectance":
        if p.shape[1] < 4:
            raise ValueError("color_by: 'reflectance' needs points with a 4th column")
        c = p[:, 3]
        cmap, vmin, vmax = "plasma", 0.0, 0.7
    else:
        raise ValueError(f"color_by: expected 'height' or 'reflectance', got {color_by!r}")
    x0, x1 = (float(v) for v in x_range)
    y0, y1 = (float(v) for v in y_range)
    if not (x1 > x0 and y1 > y0):
        raise ValueError(f"x_range/y_range: expected (low, high) with high > low, got {x_range}, {y_range}")
    m = (p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)

    fig = Figure(figsize=(inches, inches * (y1 - y0) / (x1 - x0)), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_facecolor("black")
    ax.scatter(p[m, 0], p[m, 1], c=c[m], s=point_size, cmap=cmap, vmin=vmin, vmax=vmax, linewidths=0, marker=".")
    g = _np(gt_boxes, "gt_boxes", 7)
    if g is not None and len(g):
        _draw_boxes(ax, g, GT_COLOR, gt_labels, 0.8)
    d = _np(boxes, "boxes", 7)
    if d is not None and len(d):
        _draw_boxes(ax, d, DET_COLOR, labels, 0.8)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.text(x0 + 1, y1 - 1, title, color="white", fontsize=7, va="top")
    if path is None:
        return fig
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a path (str or os.PathLike), got {type(path).__name__}")
    fig.savefig(path, dpi=dpi, facecolor="black", metadata={"Software": None})
    return None
