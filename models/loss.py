"""PointPillars training losses: OpenPCDet's ``AnchorHeadTemplate.get_loss`` for ``pointpillar.yaml``.

* classification: sigmoid focal loss (α 0.25, γ 2) on one-hot targets without the background
  column, positives and negatives weighted 1, ignored anchors (label −1) weighted 0;
* localisation: smooth-L1 (β 1/9) on the ResidualCoder targets, headings compared through
  ``sin(a − b) = sin a cos b − cos a sin b`` (``add_sin_difference``), positives only;
* direction: cross-entropy over 2 bins (offset 0.78539) on the positives;
* every weight divided by the scan's positive count (at least 1), each sum divided by the batch
  size, and the three combined with weights cls 1.0, loc 2.0, dir 0.2.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import box_coder
from .config import PointPillarsConfig
from .outputs import DenseOutputs
from .targets import Targets

__all__ = ["Losses", "sigmoid_focal_loss", "smooth_l1", "pointpillars_loss"]

LOSS_WEIGHTS = {"cls": 1.0, "loc": 2.0, "dir": 0.2}


class Losses(NamedTuple):
    total: torch.Tensor
    cls: torch.Tensor
    loc: torch.Tensor
    dir: torch.Tensor
    num_positives: torch.Tensor  # (B,) positives per scan


def sigmoid_focal_loss(
    logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> torch.Tensor:
    """Element-wise ``−α_t (1 − p_t)^γ log p_t`` (OpenPCDet's ``SigmoidFocalClassificationLoss``)."""
    p = torch.sigmoid(logits)
    alpha_w = targets * alpha + (1 - targets) * (1 - alpha)
    pt = targets * (1.0 - p) + (1.0 - targets) * p  # 1 - p_t
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return alpha_w * pt.pow(gamma) * bce


def smooth_l1(diff: torch.Tensor, beta: float = 1.0 / 9.0) -> torch.Tensor:
    """Element-wise smooth L1 of a difference (OpenPCDet's ``WeightedSmoothL1Loss.smooth_l1_loss``)."""
    n = diff.abs()
    return torch.where(n < beta, 0.5 * n**2 / beta, n - 0.5 * beta)


def pointpillars_loss(
    config: PointPillarsConfig, preds: DenseOutputs, targets: Targets, anchors: torch.Tensor
) -> Losses:
    """The combined loss of a batch (see the module docstring).

    Args:
        preds: the head's NHWC outputs (float32), ``(B, H, W, A_loc * C / 7 / bins)``.
        targets: from :func:`pcops.models.targets.assign_targets`.
        anchors: ``(A, 7)`` anchors in the head's order.
    """
    bsz = targets.labels.shape[0]
    n_cls, nb = config.num_classes, config.num_dir_bins
    cls_preds = preds.cls_preds.reshape(bsz, -1, n_cls)
    box_preds = preds.box_preds.reshape(bsz, -1, 7)
    dir_preds = preds.dir_cls_preds.reshape(bsz, -1, nb)
    labels = targets.labels
    positives = labels > 0
    cared = (labels >= 0).float()
    num_pos = positives.sum(dim=1, keepdim=True).float()
    norm = num_pos.clamp(min=1.0)
    cls_weights = cared / norm
    reg_weights = positives.float() / norm
    one_hot = F.one_hot(labels.clamp(min=0), n_cls + 1)[..., 1:].float()
    cls_loss = (sigmoid_focal_loss(cls_preds, one_hot) * cls_weights.unsqueeze(-1)).sum() / bsz
    # add_sin_difference on the heading channel
    reg_t = targets.reg_targets
    p6, t6 = box_preds[..., 6:7], reg_t[..., 6:7]
    box_sin = torch.cat([box_preds[..., :6], torch.sin(p6) * torch.cos(t6)], dim=-1)
    tgt_sin = torch.cat([reg_t[..., :6], torch.cos(p6) * torch.sin(t6)], dim=-1)
    loc_loss = (smooth_l1(box_sin - tgt_sin).sum(dim=-1) * reg_weights).sum() / bsz
    dir_t = box_coder.direction_target(anchors.unsqueeze(0), reg_t, config.dir_offset, nb)
    dir_ce = F.cross_entropy(dir_preds.reshape(-1, nb), dir_t.reshape(-1), reduction="none").view(bsz, -1)
    dir_loss = (dir_ce * reg_weights).sum() / bsz
    total = LOSS_WEIGHTS["cls"] * cls_loss + LOSS_WEIGHTS["loc"] * loc_loss + LOSS_WEIGHTS["dir"] * dir_loss
    return Losses(total, cls_loss, loc_loss, dir_loss, num_pos.squeeze(1))
