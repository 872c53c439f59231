"""Output types of the detectors."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Detections", "DenseOutputs"]


class Detections(NamedTuple):
    """Padded detections of a batch: rows ``>= count[b]`` are zero."""

    boxes: torch.Tensor  # (B, K, 7) float32 (x, y, z, dx, dy, dz, heading), z at the box centre
    scores: torch.Tensor  # (B, K) float32 sigmoid scores
    labels: torch.Tensor  # (B, K) int64, 1-based class ids (config.class_names[label - 1]), 0 = padding
    count: torch.Tensor  # (B,) int64 detections per scan


class DenseOutputs(NamedTuple):
    """The head's raw outputs in OpenPCDet's NHWC layout (float32)."""

    cls_preds: torch.Tensor  # (B, 248, 216, 18)
    box_preds: torch.Tensor  # (B, 248, 216, 42)
    dir_cls_preds: torch.Tensor  # (B, 248, 216, 12)
