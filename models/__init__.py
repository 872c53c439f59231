"""Detectors built from pcops' public ops (installed as ``pcops.models``).

``pcops.models.pointpillars.PointPillars``: OpenPCDet's KITTI PointPillars, loadable from its
checkpoints, with a plain-torch reference path, a fused fast path and a CUDA-graph mode.
``python -m pcops.models.demo`` runs it on the sample scans and draws the detections.
"""

from .config import AnchorConfig, PointPillarsConfig
from .pointpillars import DenseOutputs, Detections, GraphedPointPillars, PointPillars

__all__ = ["AnchorConfig", "PointPillarsConfig", "PointPillars", "GraphedPointPillars", "Detections", "DenseOutputs"]
