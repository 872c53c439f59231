"""Reproducible random PointPillars weights that produce a spread of scores: a stand-in for trained
weights in tests and benchmarks (``--random-weights`` in the demo)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .pointpillars import PointPillars

__all__ = ["randomize_"]


@torch.no_grad()
def randomize_(
    model,
    seed: int = 0,
    points: torch.Tensor | None = None,
    score_fraction: float = 0.0005,
    lengths: torch.Tensor | None = None,
) -> PointPillars:
    """Reproducible random weights that produce a spread of scores (a stand-in for trained ones).

    Re-initialises every layer from ``torch.Generator().manual_seed(seed)`` (PyTorch's default
    init ranges, BatchNorm affine ``γ ~ U(0.5, 1.5)``, ``β ~ N(0, 0.1)``, then OpenPCDet's head
    init). When ``points (N, 4)`` are given, every BatchNorm's running statistics are set to the
    statistics of its input on that scan (one reference-path pass), so activations keep unit
    scale through the network, and the classifier bias is set so that a ``score_fraction`` of
    the anchors of that scan clears the score threshold (about 160 of the 321,408 KITTI anchors
    by default; for a batch the per-scan quantiles are averaged). ``points`` may be a packed batch
    with ``lengths`` (BatchNorm statistics over all scans). The weights are identical on every device for a given seed
    and scan.
    """
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            w = m.weight
            fan_in = w.shape[0] * w[0, 0].numel() if isinstance(m, nn.ConvTranspose2d) else w[0].numel()
            bound = 1.0 / math.sqrt(fan_in)  # the bound of PyTorch's default kaiming_uniform(a=sqrt(5))
            w.copy_(torch.empty(w.shape).uniform_(-bound, bound, generator=gen))
            if m.bias is not None:
                m.bias.copy_(torch.empty(m.bias.shape).uniform_(-bound, bound, generator=gen))
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.weight.copy_(torch.empty(m.weight.shape).uniform_(0.5, 1.5, generator=gen))
            m.bias.copy_(torch.empty(m.bias.shape).normal_(0.0, 0.1, generator=gen))
            m.running_mean.zero_()
            m.running_var.fill_(1.0)
    head = model.dense_head
    head.conv_box.weight.copy_(torch.empty(head.conv_box.weight.shape).normal_(0, 0.001, generator=gen))
    head.conv_cls.bias.fill_(-math.log((1 - 0.01) / 0.01))
    if points is not None:
        if not 0.0 < score_fraction < 1.0:
            raise ValueError(f"score_fraction: expected a value in (0, 1), got {score_fraction}")
        head.conv_cls.bias.zero_()
        cls_logits = _calibrate_batchnorm(model, points.detach().cpu().float(), lengths)
        max_logit = cls_logits.reshape(cls_logits.shape[0], -1, model.config.num_classes).amax(dim=-1).double()
        # per-scan quantile, averaged over the scans of a batch (score tails differ from scan to scan)
        q = torch.quantile(max_logit, 1.0 - score_fraction, dim=1).mean()
        t = model.config.score_thresh
        head.conv_cls.bias.fill_(float(math.log(t / (1 - t)) - q))
    model._fast = None
    model.weights_source = "random"
    return model


def _calibrate_batchnorm(model, points: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Set each BatchNorm's running statistics to those of its input on ``points``; returns the
    classifier logits of that pass."""
    bns = [m for m in model.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))]
    impl, dtype = model.impl, model.dtype
    device = next(model.parameters()).device
    try:
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: one batch gives exactly its statistics
            nn.Module.train(bn, True)
        model.impl, model.dtype = "reference", torch.float32
        lengths = None if lengths is None else lengths.to(device)
        return model._dense(points.to(device), lengths)[0]
    finally:
        model.impl, model.dtype = impl, dtype
        for bn in bns:
            nn.Module.train(bn, False)
            bn.momentum = model.config.bn_momentum
