"""PointPillars (Lang et al., CVPR 2019) built from pcops ops, faithful to OpenPCDet's KITTI model.

``PointPillars()`` re-creates OpenPCDet's ``tools/cfgs/kitti_models/pointpillar.yaml``: the module
tree and parameter names equal OpenPCDet's (``vfe.pfn_layers.0.linear.weight``,
``backbone_2d.blocks.0.1.weight``, ``dense_head.conv_cls.bias``, ``global_step``, ...), so an
OpenPCDet checkpoint loads with :meth:`PointPillars.load_openpcdet` (or even
``load_state_dict``) and ``state_dict()`` round-trips.

Two implementations of one model, chosen by ``impl``:

``"reference"``
    OpenPCDet's inference path written out in plain torch with pcops' *reference* ops
    (``pcops.reference``): voxelize → PillarVFE (decorate, mask, Linear, BatchNorm1d, ReLU, max) →
    pillar scatter → BaseBEVBackbone (ZeroPad2d + strided conv, conv/BN/ReLU, deconvs, concat) →
    AnchorHeadSingle (three 1×1 convs, NHWC permute) → decode every anchor (ResidualCoder,
    direction bins) → sigmoid, max over classes, score threshold, top-k 4,096, rotated NMS 0.01,
    keep 500. It makes host synchronisations (boolean masks, ``nonzero``), as OpenPCDet does.
    This is the test oracle for the fast path.
``"fast"`` (default)
    The same function re-arranged for speed, with pcops' public ops: ``pcops.voxelize``; on CUDA
    the fused pillar feature net (``pcops.triton.pfn``: decoration, Linear+BN folded, ReLU, max, and
    the store into the BEV canvas in one kernel); the 2-D backbone with every BatchNorm folded into
    its convolution (and ZeroPad2d folded into the convolution's padding), optionally fp16 and
    channels-last; the three head convolutions as one 1×1 convolution of 18+42+12 channels; the
    score max and top-k on the raw logits, decoding only the 4,096 top anchors; and
    ``pcops.nms_bev(..., padded=True)`` with fixed-size outputs, the top anchors under the score
    threshold given a NaN score (never kept, never suppressing: the kept set equals OpenPCDet's
    threshold-then-top-k). On CUDA the post-processing has no host synchronisation, which is what
    :class:`GraphedPointPillars` captures in one CUDA graph (on the CPU the invalid tail is cut
    before the NMS, a free sync there). On the CPU the fused PFN is the same folded arithmetic in
    torch followed by ``pcops.pillar_scatter``.

Deliberate matches with OpenPCDet (checked against its source; see also ``box_coder.py``):

* PillarVFE: features ``x, y, z, r, x-x̄, y-ȳ, z-z̄, x-x_c, y-y_c, z-z_c`` in that order; the
  mean sums all ``T`` slots (padding is zero) and divides by the valid count; the pillar centre is
  ``coord * voxel + (voxel / 2 + range_min)`` computed in float32; padding slots are zeroed *after*
  decoration (``get_paddings_indicator``) and still enter the max, contributing ``relu(BN(0))``.
* PFNLayer: ``Linear(bias=False)``, ``BatchNorm1d(eps=1e-3, momentum=0.01)`` over the channel
  axis, ReLU, max over points; non-last layers concatenate the per-point and max features.
* BaseBEVBackbone: ``ZeroPad2d(1)`` then a stride-2 conv with padding 0 at the start of every
  block, so the Sequential indices (and state-dict names) are ``blocks.i.1`` (conv), ``blocks.i.2``
  (BN), ``blocks.i.4`` ...; deblocks ``ConvTranspose2d(k = s, stride = s, bias=False)`` + BN + ReLU,
  concatenated on channels in level order.
* AnchorHeadSingle: outputs permuted to NHWC; channel ``a * 3 + class`` / ``a * 7 + k`` /
  ``a * 2 + bin`` for the ``a``-th anchor of a cell (class-major, then rotation), initial
  ``conv_cls`` bias ``-log((1 - 0.01) / 0.01)`` and ``conv_box`` weights ``N(0, 0.001)``.
* Post-processing (``post_processing`` with ``MULTI_CLASSES_NMS=False`` and
  ``class_agnostic_nms``): scores ``sigmoid`` then max over classes, labels 1-based
  (``argmax + 1``: 1 = Car, 2 = Pedestrian, 3 = Cyclist), score threshold ``>=``, top-k
  ``min(4096, n)``, rotated BEV NMS suppressing ``IoU > 0.01``, at most 500 boxes kept, in
  descending score order. Returned headings are not wrapped (they lie in ``[0.785, 7.07)``), as
  OpenPCDet returns them.
* Points: the first ``num_point_features`` (4) columns are used. Range filtering is the
  voxelizer's (a point is kept when ``floor((p - min) / voxel)`` lies in the grid), which equals
  OpenPCDet's ``mask_points_and_boxes_outside_range`` followed by its voxelizer. OpenPCDet's KITTI
  dataset additionally keeps only points inside the camera's field of view (``FOV_POINTS_ONLY``);
  that is data preparation, not part of the model (the demo does not apply it).

Outputs: padded detections ``boxes (B, K, 7)`` float32, ``scores (B, K)`` float32, ``labels (B, K)``
int64 (1-based, 0 for padding), ``count (B,)`` int64, with ``K = nms_post_max_size`` (500); rows
``>= count[b]`` are zero. The fast path and the reference differ only in float rounding (the BN
folding) and, for exactly tied scores, in the order of ties.
"""
from __future__ import annotations

import contextlib

import math
import os
import warnings
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import pcops

from . import box_coder
from .config import PointPillarsConfig
from .timing import null_timer

__all__ = ["PointPillars", "Detections", "DenseOutputs", "GraphedPointPillars"]

_IMPLS = ("fast", "reference")


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


# --- OpenPCDet's modules (names and structure as in its source) -------------------------------


class PFNLayer(nn.Module):
    """One pillar-feature-net layer: Linear (no bias) → BatchNorm1d → ReLU → max over points."""

    def __init__(self, in_channels: int, out_channels: int, last_layer: bool, eps: float, momentum: float):
        super().__init__()
        self.last_vfe = last_layer
        if not last_layer:
            out_channels //= 2
        self.linear = nn.Linear(in_channels, out_channels, bias=False)
        self.norm = nn.BatchNorm1d(out_channels, eps=eps, momentum=momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (P, T, C_in) -> (P, 1, C) or (P, T, 2C)
        x = self.linear(x)
        x = self.norm(x.permute(0, 2, 1)).permute(0, 2, 1)
        x = F.relu(x)
        x_max = torch.max(x, dim=1, keepdim=True)[0]
        if self.last_vfe:
            return x_max
        return torch.cat([x, x_max.expand(-1, x.shape[1], -1)], dim=2)


class PillarVFE(nn.Module):
    """OpenPCDet's ``PillarVFE``: point decoration and the PFN layers, ``(P, T, F)`` → ``(P, C)``."""

    def __init__(self, config: PointPillarsConfig):
        super().__init__()
        self.config = config
        filters = [config.num_pfn_inputs, *config.vfe_filters]
        self.pfn_layers = nn.ModuleList(
            PFNLayer(filters[i], filters[i + 1], i >= len(filters) - 2, config.bn_eps, config.bn_momentum)
            for i in range(len(filters) - 1)
        )

    def decorate(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """``(P, T, F)`` point slots → ``(P, T, num_pfn_inputs)`` decorated and masked features."""
        cfg = self.config
        vx, vy, vz = cfg.voxel_size
        x_off, y_off, z_off = (v / 2 + lo for v, lo in zip(cfg.voxel_size, cfg.point_cloud_range[:3]))
        voxels = voxels[..., : cfg.num_point_features]
        xyz = voxels[:, :, :3]
        points_mean = xyz.sum(dim=1, keepdim=True) / num_points.type_as(voxels).view(-1, 1, 1)
        f_cluster = xyz - points_mean
        f_center = torch.zeros_like(xyz)
        f_center[:, :, 0] = voxels[:, :, 0] - (coords[:, 3].to(voxels.dtype).unsqueeze(1) * vx + x_off)
        f_center[:, :, 1] = voxels[:, :, 1] - (coords[:, 2].to(voxels.dtype).unsqueeze(1) * vy + y_off)
        f_center[:, :, 2] = voxels[:, :, 2] - (coords[:, 1].to(voxels.dtype).unsqueeze(1) * vz + z_off)
        feats = [voxels if cfg.use_absolute_xyz else voxels[..., 3:], f_cluster, f_center]
        if cfg.with_distance:
            feats.append(torch.norm(xyz, 2, dim=2, keepdim=True))
        features = torch.cat(feats, dim=-1)
        # get_paddings_indicator: slot t of a pillar is real when t < num_points
        mask = torch.arange(features.shape[1], device=features.device).view(1, -1) < num_points.view(-1, 1)
        return features * mask.unsqueeze(-1).type_as(features)

    def forward(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        features = self.decorate(voxels, num_points, coords)
        for pfn in self.pfn_layers:
            features = pfn(features)
        return features.squeeze(1)  # OpenPCDet's .squeeze() without the P == 1 pitfall


class BaseBEVBackbone(nn.Module):
    """OpenPCDet's ``BaseBEVBackbone`` (integer upsample strides)."""

    def __init__(self, config: PointPillarsConfig, input_channels: int):
        super().__init__()
        eps, mom = config.bn_eps, config.bn_momentum
        c_in = [input_channels, *config.num_filters[:-1]]
        self.blocks = nn.ModuleList()
        self.deblocks = nn.ModuleList()
        for i, (n_layers, stride, c_out) in enumerate(zip(config.layer_nums, config.layer_strides, config.num_filters)):
            layers: list[nn.Module] = [
                nn.ZeroPad2d(1),
                nn.Conv2d(c_in[i], c_out, kernel_size=3, stride=stride, padding=0, bias=False),
                nn.BatchNorm2d(c_out, eps=eps, momentum=mom),
                nn.ReLU(),
            ]
            for _ in range(n_layers):
                layers += [
                    nn.Conv2d(c_out, c_out, kernel_size=3, padding=1, bias=False),
                    nn.BatchNorm2d(c_out, eps=eps, momentum=mom),
                    nn.ReLU(),
                ]
            self.blocks.append(nn.Sequential(*layers))
            up, c_up = int(config.upsample_strides[i]), config.num_upsample_filters[i]
            self.deblocks.append(
                nn.Sequential(
                    nn.ConvTranspose2d(c_out, c_up, up, stride=up, bias=False),
                    nn.BatchNorm2d(c_up, eps=eps, momentum=mom),
                    nn.ReLU(),
                )
            )
        self.num_bev_features = sum(config.num_upsample_filters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ups = []
        for block, deblock in zip(self.blocks, self.deblocks):
            x = block(x)
            ups.append(deblock(x))
        return torch.cat(ups, dim=1) if len(ups) > 1 else ups[0]


class AnchorHeadSingle(nn.Module):
    """OpenPCDet's ``AnchorHeadSingle`` convolutions (the anchors live on :class:`PointPillars`)."""

    def __init__(self, config: PointPillarsConfig, input_channels: int):
        super().__init__()
        a = config.num_anchors_per_location
        self.conv_cls = nn.Conv2d(input_channels, a * config.num_classes, kernel_size=1)
        self.conv_box = nn.Conv2d(input_channels, a * 7, kernel_size=1)
        self.conv_dir_cls = nn.Conv2d(input_channels, a * config.num_dir_bins, kernel_size=1)
        pi = 0.01
        nn.init.constant_(self.conv_cls.bias, -math.log((1 - pi) / pi))
        nn.init.normal_(self.conv_box.weight, mean=0, std=0.001)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cls = self.conv_cls(x).permute(0, 2, 3, 1).contiguous()
        box = self.conv_box(x).permute(0, 2, 3, 1).contiguous()
        dirc = self.conv_dir_cls(x).permute(0, 2, 3, 1).contiguous()
        return cls, box, dirc


class PointPillarScatter(nn.Module):
    """OpenPCDet's ``PointPillarScatter`` (no parameters): ``(P, C)`` pillars → ``(B, C, H, W)``."""

    def __init__(self, config: PointPillarsConfig):
        super().__init__()
        self.grid_hw = config.bev_hw

    def forward(self, features: torch.Tensor, coords: torch.Tensor, batch_size: int, reference: bool) -> torch.Tensor:
        if reference:
            from pcops.reference import pillar_scatter as ref

            return ref.pillar_scatter(features, coords.to(torch.int32), batch_size, *self.grid_hw)[0]
        return pcops.pillar_scatter(features, coords, batch_size, self.grid_hw)


# --- folded (fast-path) parameters ------------------------------------------------------------


class _FoldedConv(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor
    stride: int
    padding: int
    transposed: bool


def _fold_bn(weight: torch.Tensor, bn: nn.BatchNorm2d, out_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.detach().double() + bn.eps)
    shape = [1] * weight.dim()
    shape[out_dim] = -1
    w = weight.detach().double() * scale.view(shape)
    b = bn.bias.detach().double() - bn.running_mean.detach().double() * scale
    return w, b


def _fold_sequential(seq: nn.Sequential) -> list[_FoldedConv]:
    """Conv/ConvTranspose (+ preceding ZeroPad2d) + BatchNorm2d + ReLU triples → folded convs."""
    out: list[_FoldedConv] = []
    pad = 0
    mods = list(seq)
    i = 0
    while i < len(mods):
        m = mods[i]
        if isinstance(m, nn.ZeroPad2d):
            p = m.padding
            if len(set(p)) != 1:
                raise ValueError("backbone: only symmetric ZeroPad2d folds into a convolution")
            pad += p[0]
            i += 1
            continue
        if not isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)) or not isinstance(mods[i + 1], nn.BatchNorm2d):
            raise ValueError(f"backbone: unexpected layer {m!r} while folding BatchNorm")
        transposed = isinstance(m, nn.ConvTranspose2d)
        w, b = _fold_bn(m.weight, mods[i + 1], 1 if transposed else 0)
        out.append(_FoldedConv(w, b, m.stride[0], pad + m.padding[0], transposed))
        pad = 0
        i += 3  # conv, bn, relu
    return out


class _FastParams(NamedTuple):
    pfn_weight: torch.Tensor  # (10, C) float32
    pfn_bias: torch.Tensor  # (C,) float32
    blocks: list[list[_FoldedConv]]
    deblocks: list[_FoldedConv]
    head_weight: torch.Tensor  # (18 + 42 + 12, C, 1, 1)
    head_bias: torch.Tensor
    dtype: torch.dtype
    channels_last: bool


# --- the detector -----------------------------------------------------------------------------


class PointPillars(nn.Module):
    """PointPillars with OpenPCDet's module names; KITTI ``pointpillar.yaml`` by default.

    Args:
        config: a :class:`PointPillarsConfig` (default: OpenPCDet's KITTI model).
        impl: ``"fast"`` (default) or ``"reference"`` (see the module docstring).
        dtype: compute dtype of the fast path's 2-D backbone and head, ``torch.float32`` (default;
            TF32 convolutions when ``torch.backends.cudnn.allow_tf32``, PyTorch's default) or
            ``torch.float16`` / ``torch.bfloat16`` (half copies of the folded weights; the parameters
            stay float32). The reference path runs float32, or under autocast for a half dtype.
        channels_last: memory format of the fast path's backbone; default: on for CUDA, off on CPU.

    The module is for inference: it always uses the BatchNorm running statistics (call ``eval()``
    semantics are implied; training is out of scope). Weights start as OpenPCDet initialises them
    (PyTorch defaults plus the head's bias/normal init): *random*; see :meth:`load_openpcdet` and
    :meth:`randomize_`.
    """

    def __init__(
        self,
        config: PointPillarsConfig | None = None,
        impl: str = "fast",
        dtype: torch.dtype = torch.float32,
        channels_last: bool | None = None,
    ):
        super().__init__()
        self.config = config if config is not None else PointPillarsConfig()
        if not isinstance(self.config, PointPillarsConfig):
            raise TypeError(f"config: expected a PointPillarsConfig, got {type(self.config).__name__}")
        self.impl = impl
        self.dtype = dtype
        self.channels_last = channels_last
        self.vfe = PillarVFE(self.config)
        self.map_to_bev_module = PointPillarScatter(self.config)
        self.backbone_2d = BaseBEVBackbone(self.config, self.config.vfe_filters[-1])
        self.dense_head = AnchorHeadSingle(self.config, self.backbone_2d.num_bev_features)
        self.register_buffer("global_step", torch.zeros(1, dtype=torch.int64))  # OpenPCDet's step counter
        self._anchors_cpu = box_coder.generate_anchors(self.config).view(-1, 7)
        self._anchors: dict[torch.device, torch.Tensor] = {}
        self._fast: tuple[tuple, _FastParams] | None = None
        self.stage_timer = null_timer
        self.last_dropped_voxels: torch.Tensor | None = None  # (B,) pillars dropped by max_voxels, last call
        self.warn_on_dropped_voxels = True  # eager calls warn when pillars were dropped (one small sync)
        self.eval()

    # ----- properties and settings
    @property
    def impl(self) -> str:
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        if value not in _IMPLS:
            raise ValueError(f"impl: expected one of {_IMPLS}, got {value!r}")
        self._impl = value

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @dtype.setter
    def dtype(self, value: torch.dtype) -> None:
        if value not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype: expected torch.float32, torch.float16 or torch.bfloat16, got {value!r}")
        self._dtype = value

    def train(self, mode: bool = True):
        if mode:
            raise NotImplementedError("PointPillars here is an inference model: training mode is not supported")
        return super().train(False)

    def anchors(self, device: torch.device | str) -> torch.Tensor:
        """``(num_anchors, 7)`` float32 anchors on ``device`` (cached; never cast to half)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._anchors:
            self._anchors[device] = self._anchors_cpu.to(device)
        return self._anchors[device]

    @property
    def num_anchors(self) -> int:
        return self._anchors_cpu.shape[0]

    # ----- weights
    def load_openpcdet(self, path_or_state_dict, strict: bool = True) -> "PointPillars":
        """Load an OpenPCDet PointPillars checkpoint (a ``.pth`` path, or its dict).

        Accepts the checkpoint file (``{'model_state': ..., 'epoch': ..., ...}``), the bare state
        dict, or one saved from a ``DistributedDataParallel`` wrapper (``module.`` prefixes).
        ``global_step`` is optional. A missing or mis-shaped key always raises
        (``KeyError``/``ValueError``, listing them: weights are never left silently random);
        ``strict`` (default) also refuses unexpected keys, ``strict=False`` ignores them.
        Nothing is loaded when it raises.
        Returns ``self``.
        """
        state = path_or_state_dict
        if isinstance(state, (str, os.PathLike)):
            try:
                state = torch.load(os.fspath(state), map_location="cpu", weights_only=True)
            except Exception as e:  # pickle.UnpicklingError and friends: objects beyond tensors and containers
                if isinstance(e, (FileNotFoundError, IsADirectoryError)):
                    raise
                raise ValueError(
                    f"path_or_state_dict: {state} did not load with torch.load(weights_only=True) ({e}); if you "
                    "trust the file, load it yourself with torch.load(path, weights_only=False) and pass the dict"
                ) from e
        if not isinstance(state, dict):
            raise TypeError(f"path_or_state_dict: expected a path or a dict, got {type(state).__name__}")
        if "model_state" in state:
            state = state["model_state"]
        if state and all(k.startswith("module.") for k in state):
            state = {k[len("module."):]: v for k, v in state.items()}
        own = self.state_dict()
        optional = {"global_step"}
        missing = sorted(set(own) - set(state) - optional)
        unexpected = sorted(set(state) - set(own))
        bad_shape = sorted(
            f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
            for k in set(own) & set(state)
            if k != "global_step" and (not isinstance(state[k], torch.Tensor) or state[k].shape != own[k].shape)
        )
        if bad_shape:
            raise ValueError("path_or_state_dict: mis-shaped weights:\n  " + "\n  ".join(bad_shape))
        if missing or (strict and unexpected):
            msg = []
            if missing:
                msg.append(f"missing keys ({len(missing)}): {missing[:20]}{' ...' if len(missing) > 20 else ''}")
            if unexpected:
                msg.append(f"unexpected keys ({len(unexpected)}): {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''}")
            raise KeyError("path_or_state_dict: not a PointPillars checkpoint for this config: " + "; ".join(msg))
        with torch.no_grad():
            for k, v in state.items():
                if k in own:
                    if k == "global_step":
                        own[k].copy_(torch.as_tensor(v).reshape(own[k].shape).to(own[k].dtype))
                    else:
                        own[k].copy_(v)
        self._fast = None
        return self

    @torch.no_grad()
    def randomize_(self, seed: int = 0, points: torch.Tensor | None = None, score_fraction: float = 0.0005,
                   lengths: torch.Tensor | None = None) -> "PointPillars":
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
        for m in self.modules():
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
        head = self.dense_head
        head.conv_box.weight.copy_(torch.empty(head.conv_box.weight.shape).normal_(0, 0.001, generator=gen))
        head.conv_cls.bias.fill_(-math.log((1 - 0.01) / 0.01))
        if points is not None:
            if not 0.0 < score_fraction < 1.0:
                raise ValueError(f"score_fraction: expected a value in (0, 1), got {score_fraction}")
            head.conv_cls.bias.zero_()
            cls_logits = self._calibrate_batchnorm(points.detach().cpu().float(), lengths)
            max_logit = cls_logits.reshape(cls_logits.shape[0], -1, self.config.num_classes).amax(dim=-1).double()
            # per-scan quantile, averaged over the scans of a batch (score tails differ from scan to scan)
            q = torch.quantile(max_logit, 1.0 - score_fraction, dim=1).mean()
            t = self.config.score_thresh
            head.conv_cls.bias.fill_(float(math.log(t / (1 - t)) - q))
        self._fast = None
        return self

    def _calibrate_batchnorm(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Set each BatchNorm's running statistics to those of its input on ``points``; returns the
        classifier logits of that pass."""
        bns = [m for m in self.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))]
        impl, dtype = self.impl, self.dtype
        device = next(self.parameters()).device
        try:
            for bn in bns:
                bn.reset_running_stats()
                bn.momentum = None  # cumulative average: one batch gives exactly its statistics
                nn.Module.train(bn, True)
            self.impl, self.dtype = "reference", torch.float32
            lengths = None if lengths is None else lengths.to(device)
            return self._dense(points.to(device), lengths)[0]
        finally:
            self.impl, self.dtype = impl, dtype
            for bn in bns:
                nn.Module.train(bn, False)
                bn.momentum = self.config.bn_momentum

    # ----- pipeline
    def _check_points(self, points, lengths):
        if not isinstance(points, torch.Tensor):
            raise TypeError(f"points: expected a torch.Tensor, got {type(points).__name__}")
        if points.dim() != 2 or points.shape[1] < self.config.num_point_features:
            raise ValueError(
                f"points: expected shape (N, C) with C >= {self.config.num_point_features} "
                f"(x, y, z, intensity, ...), got {tuple(points.shape)}"
            )
        if points.dtype != torch.float32:
            raise TypeError(f"points: expected dtype float32, got {points.dtype}")
        if lengths is None:
            return 1
        if not isinstance(lengths, torch.Tensor) or lengths.dtype not in (torch.int32, torch.int64):
            raise TypeError("lengths: expected a 1-D int32/int64 tensor of points per scan")
        if lengths.dim() != 1:
            raise ValueError(f"lengths: expected a 1-D tensor of points per scan, got shape {tuple(lengths.shape)}")
        if lengths.numel() < 1:
            raise ValueError("lengths: expected at least one scan")
        return lengths.numel()

    def _voxelize(self, points, lengths, reference: bool):
        cfg = self.config
        pts = points[:, : cfg.num_point_features]
        args = (pts, cfg.voxel_size, cfg.point_cloud_range, cfg.max_points_per_voxel, cfg.max_voxels_test)
        if reference:
            from . import _reference_ops

            return _reference_ops.voxelize(*args, lengths=lengths)
        return pcops.voxelize(*args, lengths=lengths)

    def _dense(self, points: torch.Tensor, lengths: torch.Tensor | None, timer=null_timer):
        """points → head outputs. Reference: the three NHWC tensors; fast: one (B, H, W, 72) tensor."""
        batch_size = self._check_points(points, lengths)
        reference = self.impl == "reference"
        with timer("voxelize"):
            vox = self._voxelize(points, lengths, reference)
        self.last_dropped_voxels = vox.num_dropped_voxels
        if self.warn_on_dropped_voxels and bool((vox.num_dropped_voxels > 0).any()):
            warnings.warn(
                f"voxelize: {vox.num_dropped_voxels.tolist()} occupied pillars per scan beyond max_voxels="
                f"{self.config.max_voxels_test} were dropped (OpenPCDet drops them too)", RuntimeWarning, stacklevel=3)
        if reference:
            with timer("pfn"):
                pillars = self.vfe(vox.voxels, vox.num_points, vox.coords)
            with timer("scatter"):
                canvas = self.map_to_bev_module(pillars, vox.coords, batch_size, reference=True)
            half = self.dtype != torch.float32
            with torch.autocast(points.device.type, dtype=self.dtype, enabled=half):
                with timer("backbone"):
                    x = self.backbone_2d(canvas)
                with timer("head"):
                    cls, box, dirc = self.dense_head(x)
            return cls.float(), box.float(), dirc.float()
        fp = self._fast_params(points.device)
        with timer("pfn+scatter"):
            canvas = self._pfn_scatter(vox.voxels, vox.num_points, vox.coords, batch_size, fp)
        with timer("backbone"):
            x = self._backbone_fast(canvas, fp)
        with timer("head"):
            out = F.conv2d(x, fp.head_weight, fp.head_bias)
        return out.permute(0, 2, 3, 1)  # (B, H, W, 72), a free view when channels-last

    def dense_outputs(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> DenseOutputs:
        """The head's outputs before decoding, float32, OpenPCDet's NHWC layout:
        ``(B, 248, 216, 18)``, ``(B, 248, 216, 42)``, ``(B, 248, 216, 12)`` for KITTI."""
        with torch.no_grad():
            out = self._dense(points, lengths)
            if self.impl == "reference":
                return DenseOutputs(*out)
            n_cls, n_box = self._head_splits()
            out = out.float()
            return DenseOutputs(
                out[..., :n_cls].contiguous(),
                out[..., n_cls : n_cls + n_box].contiguous(),
                out[..., n_cls + n_box :].contiguous(),
            )

    def forward(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> Detections:
        """Detect objects in ``points (N, C)`` float32 (``x, y, z, intensity, ...``, metres, LiDAR frame).

        Args:
            points: one scan, or several packed back to back with ``lengths``.
            lengths: optional ``(B,)`` int32/int64 points per scan (on the points' device).
        Returns:
            :class:`Detections` with ``K = config.nms_post_max_size`` rows per scan.
        """
        timer = self.stage_timer
        with torch.no_grad():
            dense = self._dense(points, lengths, timer)
            with timer("post"):
                if self.impl == "reference":
                    return self._post_reference(*dense)
                return self._post_fast(dense)

    def _forward_static(self, points: torch.Tensor, lengths: torch.Tensor, fp: _FastParams):
        """The fast path with static shapes only (what :class:`GraphedPointPillars` captures):
        fixed-capacity voxelization, fused PFN over all capacity rows, backbone, head, padded
        post-processing. Returns ``(Detections, num_dropped_voxels (B,))``; no host sync on CUDA."""
        vox = _fixed_voxelize(points[:, : self.config.num_point_features], self.config, lengths)
        canvas = self._pfn_scatter(vox.voxels, vox.num_points, vox.coords, lengths.numel(), fp, count=vox.count)
        x = self._backbone_fast(canvas, fp)
        out = F.conv2d(x, fp.head_weight, fp.head_bias).permute(0, 2, 3, 1)
        return self._post_fast(out), vox.dropped_voxels

    # ----- fast path pieces
    def _head_splits(self) -> tuple[int, int]:
        a = self.config.num_anchors_per_location
        return a * self.config.num_classes, a * 7

    def _fast_params(self, device: torch.device) -> _FastParams:
        channels_last = self.channels_last if self.channels_last is not None else device.type == "cuda"
        tensors = [*self.parameters(), *self.buffers()]
        key = (device, self.dtype, channels_last, tuple(t._version for t in tensors), tuple(t.data_ptr() for t in tensors))
        if self._fast is not None and self._fast[0] == key:
            return self._fast[1]
        dt = self.dtype

        def conv(fc: _FoldedConv) -> _FoldedConv:
            w = fc.weight.to(device=device, dtype=dt)
            if channels_last:
                w = w.contiguous(memory_format=torch.channels_last)
            return fc._replace(weight=w, bias=fc.bias.to(device=device, dtype=dt))

        from pcops.triton.pfn import fold_batchnorm

        single = len(self.vfe.pfn_layers) == 1 and self.config.use_absolute_xyz and not self.config.with_distance
        layer = self.vfe.pfn_layers[0]
        if single and self.config.num_pfn_inputs == 10:
            w, b = fold_batchnorm(layer.linear.weight.detach(), layer.norm.weight.detach(), layer.norm.bias.detach(),
                                  layer.norm.running_mean, layer.norm.running_var, layer.norm.eps)
        else:
            w = b = None
        head = self.dense_head
        hw = torch.cat([head.conv_cls.weight, head.conv_box.weight, head.conv_dir_cls.weight]).detach()
        hb = torch.cat([head.conv_cls.bias, head.conv_box.bias, head.conv_dir_cls.bias]).detach()
        hw = hw.to(device=device, dtype=dt)
        if channels_last:
            hw = hw.contiguous(memory_format=torch.channels_last)
        fp = _FastParams(
            pfn_weight=None if w is None else w.to(device),
            pfn_bias=None if b is None else b.to(device),
            blocks=[[conv(c) for c in _fold_sequential(blk)] for blk in self.backbone_2d.blocks],
            deblocks=[conv(_fold_sequential(d)[0]) for d in self.backbone_2d.deblocks],
            head_weight=hw,
            head_bias=hb.to(device=device, dtype=dt),
            dtype=dt,
            channels_last=channels_last,
        )
        self._fast = (key, fp)
        return fp

    def _new_canvas(self, batch_size: int, device, fp: _FastParams) -> torch.Tensor:
        h, w = self.config.bev_hw
        c = self.config.vfe_filters[-1]
        if fp.channels_last:
            return torch.zeros(batch_size, h, w, c, device=device, dtype=fp.dtype).permute(0, 3, 1, 2)
        return torch.zeros(batch_size, c, h, w, device=device, dtype=fp.dtype)

    def _pfn_scatter(self, voxels, num_points, coords, batch_size, fp: _FastParams, count=None):
        if fp.pfn_weight is None:  # a VFE the fused kernel does not cover: unfused, then scatter
            pillars = self.vfe(voxels, num_points, coords).to(fp.dtype)
            canvas = self.map_to_bev_module(pillars, coords, batch_size, reference=False)
            return canvas.contiguous(memory_format=torch.channels_last) if fp.channels_last else canvas
        canvas = self._new_canvas(batch_size, voxels.device, fp)
        if voxels.device.type == "cuda":
            from pcops.triton.pfn import pfn_scatter

            cfg = self.config
            return pfn_scatter(voxels, num_points, coords, fp.pfn_weight, fp.pfn_bias, canvas,
                               cfg.voxel_size, cfg.point_cloud_range[:3], count=count)
        # CPU: the same folded arithmetic in torch (decorate, x @ W' + b', ReLU, max), then scatter
        feats = self.vfe.decorate(voxels, num_points, coords)
        pillars = torch.relu(feats @ fp.pfn_weight + fp.pfn_bias).amax(dim=1)
        if count is not None:  # fixed-capacity padding rows (num_points 0, coords -1): drop them
            live = num_points > 0
            pillars, coords = pillars[live], coords[live]
        canvas_nchw = pcops.pillar_scatter(pillars.to(fp.dtype), coords, batch_size, self.config.bev_hw)
        return canvas_nchw.contiguous(memory_format=torch.channels_last) if fp.channels_last else canvas_nchw

    def _backbone_fast(self, x: torch.Tensor, fp: _FastParams) -> torch.Tensor:
        """The folded 2-D backbone. ``BACKBONE_EPILOGUE`` picks how bias + ReLU (+ concat) run on
        CUDA: ``"torch"`` (``F.conv2d`` with bias, ``relu_``, ``torch.cat``), ``"triton"``
        (convolutions without bias, then one Triton pass each that adds the bias, applies ReLU and
        writes the upsampled maps straight into the concatenated output) or ``"cudnn"`` (cuDNN's
        fused convolution + bias + ReLU for the 3×3 convolutions, the Triton pass for the upsampling)."""
        mode = BACKBONE_EPILOGUE if x.is_cuda else "torch"
        if mode == "cudnn" and not (torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled):
            mode = "triton"
        if mode == "torch":
            ups = []
            for blk, de in zip(fp.blocks, fp.deblocks):
                for c in blk:
                    x = torch.relu_(F.conv2d(x, c.weight, c.bias, stride=c.stride, padding=c.padding))
                ups.append(torch.relu_(F.conv_transpose2d(x, de.weight, de.bias, stride=de.stride)))
            return torch.cat(ups, dim=1) if len(ups) > 1 else ups[0]
        from pcops.triton.epilogue import bias_relu

        out = None
        offset = 0
        for blk, de in zip(fp.blocks, fp.deblocks):
            for c in blk:
                if mode == "cudnn":
                    x = torch.ops.aten.cudnn_convolution_relu(x, c.weight, c.bias, [c.stride] * 2, [c.padding] * 2, [1, 1], 1)
                else:
                    x = bias_relu(F.conv2d(x, c.weight, None, stride=c.stride, padding=c.padding), c.bias)
            up = F.conv_transpose2d(x, de.weight, None, stride=de.stride)
            if out is None:  # the concatenated map, in the layout of the first upsampled one
                total = sum(d.bias.shape[0] for d in fp.deblocks)
                shape = (up.shape[0], total, up.shape[2], up.shape[3])
                if fp.channels_last:
                    out = torch.empty((shape[0], shape[2], shape[3], shape[1]), device=up.device, dtype=up.dtype).permute(0, 3, 1, 2)
                else:
                    out = torch.empty(shape, device=up.device, dtype=up.dtype)
            bias_relu(up, de.bias, out, channel_offset=offset)
            offset += de.bias.shape[0]
        return out

    def _post_fast(self, dense: torch.Tensor) -> Detections:
        """Sync-free post-processing on the fused head output ``(B, H, W, 72)``.

        Top-k over ``max_class(logit)`` (sigmoid is monotonic, so this is the order of the scores),
        decode only those anchors, padded NMS. Boxes below the score threshold are in the top-k only
        when fewer than ``pre_max_size`` clear it; they sort after every box above it, so they cannot
        suppress one, and they are dropped after the NMS: the kept set equals OpenPCDet's.
        """
        cfg = self.config
        bsz, h, w, ch = dense.shape
        a_loc, n_cls = cfg.num_anchors_per_location, cfg.num_classes
        n_cls_ch, n_box_ch = self._head_splits()
        flat = dense.reshape(bsz, h * w, ch)
        logits = flat[:, :, :n_cls_ch].reshape(bsz, h * w, a_loc, n_cls)
        max_logit, label = logits.max(dim=-1)  # (B, HW, A)
        max_logit = max_logit.reshape(bsz, -1).float()
        k = min(cfg.nms_pre_max_size, max_logit.shape[1])
        top_logit, top = torch.topk(max_logit, k, dim=1)  # sorted, descending
        top_scores = torch.sigmoid(top_logit)
        top_labels = torch.gather(label.reshape(bsz, -1), 1, top) + 1
        cell, loc = top // a_loc, top % a_loc
        box_idx = (cell * ch + n_cls_ch + loc * 7).unsqueeze(-1) + torch.arange(7, device=dense.device)
        nb = cfg.num_dir_bins
        dir_idx = (cell * ch + n_cls_ch + n_box_ch + loc * nb).unsqueeze(-1) + torch.arange(nb, device=dense.device)
        flat1 = flat.reshape(bsz, -1)
        deltas = torch.gather(flat1, 1, box_idx.view(bsz, -1)).view(bsz, k, 7).float()
        dir_logits = torch.gather(flat1, 1, dir_idx.view(bsz, -1)).view(bsz, k, nb).float()
        anchors = self.anchors(dense.device)[top]  # (B, k, 7)
        boxes = box_coder.decode_boxes(deltas, anchors)
        heading = box_coder.apply_direction(boxes[..., 6], dir_logits, cfg.dir_offset, cfg.dir_limit_offset, nb)
        boxes = torch.cat([boxes[..., :6], heading.unsqueeze(-1)], dim=-1)
        # below-threshold boxes get a NaN score: pcops.nms_bev never keeps them, and they never suppress
        above = top_scores >= cfg.score_thresh
        nms_scores = top_scores.where(above, float("nan"))
        idx = self._nms_padded(boxes, nms_scores, above)  # (B, kmax), -1 padded
        kept = idx >= 0
        safe = idx.clamp(min=0)
        sc = torch.gather(top_scores, 1, safe)
        valid = kept & (sc >= cfg.score_thresh)
        vf = valid.to(torch.float32)
        out_boxes = torch.gather(boxes, 1, safe.unsqueeze(-1).expand(-1, -1, boxes.shape[-1])) * vf.unsqueeze(-1)
        return Detections(out_boxes, sc * vf, torch.gather(top_labels, 1, safe) * valid, valid.sum(dim=1))

    def _nms_padded(self, boxes: torch.Tensor, nms_scores: torch.Tensor, above: torch.Tensor) -> torch.Tensor:
        """Class-agnostic rotated NMS of every scan: ``(B, nms_post_max_size)`` kept indices into
        ``boxes (B, k, 7)``, −1 padded. CUDA: one batched ``pcops.nms_bev`` call (one set of
        launches for all scans, no host sync). CPU: per scan, the invalid tail (NaN scores) cut
        first, since the CPU NMS is quadratic (a sync is free there)."""
        cfg = self.config
        kmax = cfg.nms_post_max_size
        if boxes.is_cuda:
            return pcops.nms_bev(boxes, nms_scores, cfg.nms_thresh, post_max_size=kmax, padded=True)[0]
        out = []
        for b in range(boxes.shape[0]):
            n_valid = int(above[b].sum())
            idx, _ = pcops.nms_bev(boxes[b, :n_valid], nms_scores[b, :n_valid], cfg.nms_thresh, post_max_size=kmax,
                                   padded=True)
            out.append(idx)
        return torch.stack(out)

    # ----- reference post-processing (OpenPCDet's code path, with host syncs)
    def _post_reference(self, cls_preds, box_preds, dir_preds) -> Detections:
        from . import _reference_ops

        cfg = self.config
        bsz = cls_preds.shape[0]
        n = self.num_anchors
        anchors = self.anchors(cls_preds.device).unsqueeze(0)
        batch_cls = cls_preds.reshape(bsz, n, -1).float()
        batch_box = box_coder.decode_boxes(box_preds.reshape(bsz, n, -1), anchors)
        dir_logits = dir_preds.reshape(bsz, n, -1)
        heading = box_coder.apply_direction(batch_box[..., 6], dir_logits, cfg.dir_offset, cfg.dir_limit_offset,
                                            cfg.num_dir_bins)
        batch_box = torch.cat([batch_box[..., :6], heading.unsqueeze(-1)], dim=-1)
        kmax = cfg.nms_post_max_size
        boxes = torch.zeros(bsz, kmax, 7, device=cls_preds.device)
        scores = torch.zeros(bsz, kmax, device=cls_preds.device)
        labels = torch.zeros(bsz, kmax, dtype=torch.int64, device=cls_preds.device)
        count = torch.zeros(bsz, dtype=torch.int64, device=cls_preds.device)
        for b in range(bsz):
            cls_scores, label = torch.max(torch.sigmoid(batch_cls[b]), dim=-1)
            label = label + 1
            mask = cls_scores >= cfg.score_thresh
            s, bx = cls_scores[mask], batch_box[b][mask]
            if s.shape[0] == 0:
                continue
            s_top, order = torch.topk(s, k=min(cfg.nms_pre_max_size, s.shape[0]))
            keep = _reference_ops.nms(bx[order], s_top, cfg.nms_thresh)
            selected = mask.nonzero().view(-1)[order[keep[:kmax]]]
            m = selected.numel()
            boxes[b, :m] = batch_box[b][selected]
            scores[b, :m] = cls_scores[selected]
            labels[b, :m] = label[selected]
            count[b] = m
        return Detections(boxes, scores, labels, count)

    # ----- CUDA graph
    def capture(self, example_points: torch.Tensor, example_lengths=None, max_points: int | None = None,
                cudnn_benchmark: bool = False) -> "GraphedPointPillars":
        """Capture the fast path in one CUDA graph; see :class:`GraphedPointPillars`."""
        return GraphedPointPillars(self, example_points, example_lengths, max_points=max_points,
                                   cudnn_benchmark=cudnn_benchmark)


# how the fast backbone runs bias + ReLU + concat on CUDA ("torch", "triton", "cudnn"); see
# PointPillars._backbone_fast. Measured on the H200 (E1 fp16 graph, PFN "dot"): torch 1.21 ms,
# triton 1.04, cudnn 0.96; E2 (batch 8): triton 4.80, cudnn 4.43 ms. "cudnn" falls back to
# "triton" where cuDNN is unavailable.
BACKBONE_EPILOGUE = "cudnn"
BACKBONE_EPILOGUES = ("torch", "triton", "cudnn")


@contextlib.contextmanager
def _cudnn_benchmark(on: bool):
    """``torch.backends.cudnn.benchmark`` switched on inside the block (if ``on``), then restored."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = previous or on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


class GraphedPointPillars:
    """The fast path captured in one CUDA graph: points on the GPU → fixed-size padded detections.

    Captures fixed-capacity voxelization (``config.max_voxels_test`` pillars per scan), the fused
    pillar feature net, the folded backbone, the fused head, top-k decoding and padded NMS; a call
    copies the points into a static buffer and replays the graph, with no host synchronisation.

    Args:
        model: a :class:`PointPillars` on a CUDA device (any ``impl``: the fast path is captured).
        example_points: ``(N, C)`` float32 CUDA points used for the warm-up runs before capture.
        example_lengths: for a batch, the per-scan point counts of ``example_points`` on the host
            (list or CPU tensor); their number fixes the captured batch size (default: one scan).
        max_points: capacity in points per scan (default: the largest example scan, at least
            131,072, rounded up to 1,024; a KITTI HDL-64E scan has about 120,000); a call with a larger
            scan raises ``ValueError``. Every replay voxelizes the whole capacity (the padding is
            dropped as out of range), so a tight capacity is a faster one.

    Unused capacity is filled with points far outside the range (``PAD_VALUE`` metres), which the
    voxelizer drops. The outputs are static tensors overwritten by the next call (``clone()`` to keep them).
    The weights are folded at capture time: after changing them, capture again.
    ``cudnn_benchmark=True`` lets cuDNN time its convolution algorithms during the warm-up
    (``torch.backends.cudnn.benchmark`` is set for the warm-up and the capture only, then restored):
    the captured backbone uses the fastest measured algorithms, whose float rounding may differ
    slightly from the heuristic choice of the eager path.
    ``dropped_voxels`` holds the device-side count of pillars that did not fit (``max_voxels_test``
    per scan), as OpenPCDet's voxelizer drops them; read it to check (it costs a sync).
    """

    PAD_VALUE = -1.0e4

    def __init__(self, model: PointPillars, example_points: torch.Tensor, example_lengths=None,
                 max_points: int | None = None, cudnn_benchmark: bool = False):
        if not isinstance(model, PointPillars):
            raise TypeError(f"model: expected a PointPillars, got {type(model).__name__}")
        model._check_points(example_points, None)
        if example_points.device.type != "cuda":
            raise ValueError(f"example_points: CUDA graphs need a CUDA tensor, got {example_points.device}")
        self.model = model
        self.device = example_points.device
        self.batch_size = 1 if example_lengths is None else len(example_lengths)
        if self.batch_size < 1:
            raise ValueError("example_lengths: expected at least one scan")
        cfg = model.config
        c = cfg.num_point_features
        if max_points is None:
            largest = example_points.shape[0] if example_lengths is None else max(int(v) for v in example_lengths)
            max_points = -(-max(largest, 131_072) // 1024) * 1024
        self.max_points = int(max_points)
        self.static_points = torch.full((self.batch_size * self.max_points, c), self.PAD_VALUE, device=self.device)
        self.static_lengths = torch.full((self.batch_size,), self.max_points, dtype=torch.int32, device=self.device)
        self._fp = model._fast_params(self.device)
        self._copy_in(example_points, example_lengths)
        if not isinstance(cudnn_benchmark, bool):
            raise TypeError(f"cudnn_benchmark: expected a bool, got {type(cudnn_benchmark).__name__}")
        with _cudnn_benchmark(cudnn_benchmark):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(3):
                    self._run()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.outputs = self._run()

    def _run(self) -> Detections:
        det, self.dropped_voxels = self.model._forward_static(self.static_points, self.static_lengths, self._fp)
        return det

    def _copy_in(self, points: torch.Tensor, lengths) -> None:
        c = self.model.config.num_point_features
        if lengths is None:
            segments = [points.shape[0]]
        else:
            if isinstance(lengths, torch.Tensor):
                if lengths.device.type != "cpu":
                    raise ValueError("lengths: give the per-scan counts on the CPU (a list or CPU tensor): "
                                     "copying into the graph's buffer needs them on the host")
                lengths = lengths.tolist()
            segments = [int(v) for v in lengths]
        if len(segments) != self.batch_size:
            raise ValueError(f"lengths: expected {self.batch_size} scans (the captured batch size), got {len(segments)}")
        if sum(segments) != points.shape[0]:
            raise ValueError(f"lengths: expected counts summing to {points.shape[0]}, got {sum(segments)}")
        start = 0
        for b, n in enumerate(segments):
            if n > self.max_points:
                raise ValueError(f"points: scan {b} has {n} points, more than the captured capacity "
                                 f"max_points={self.max_points}; capture again with a larger max_points")
            dst = self.static_points[b * self.max_points : (b + 1) * self.max_points]
            dst[:n].copy_(points[start : start + n, :c])
            dst[n:].fill_(self.PAD_VALUE)
            start += n

    def __call__(self, points: torch.Tensor, lengths=None) -> Detections:
        """Replay on ``points (N, C)`` (CUDA float32); ``lengths``: per-scan counts on the host when
        ``batch_size > 1``. Returns the static :class:`Detections` (overwritten by the next call)."""
        self.model._check_points(points, None)
        if points.device != self.device:
            raise ValueError(f"points: expected a tensor on {self.device}, got {points.device}")
        if self.batch_size > 1 and lengths is None:
            raise ValueError(f"lengths: required for a captured batch of {self.batch_size} scans")
        self._copy_in(points, lengths)
        self.graph.replay()
        return self.outputs


class _FixedVoxels(NamedTuple):
    voxels: torch.Tensor
    coords: torch.Tensor
    num_points: torch.Tensor
    count: torch.Tensor
    dropped_voxels: torch.Tensor | None


def _fixed_voxelize(points: torch.Tensor, cfg: PointPillarsConfig, lengths: torch.Tensor) -> _FixedVoxels:
    """Fixed-capacity voxelization (``B * max_voxels_test`` rows, padding rows last; no host sync)."""
    out = pcops.voxelize(points, cfg.voxel_size, cfg.point_cloud_range, cfg.max_points_per_voxel,
                         cfg.max_voxels_test, lengths=lengths, pad_to_max=True)
    count = out.num_voxels.sum().to(torch.int32).reshape(1)
    return _FixedVoxels(out.voxels, out.coords, out.num_points, count, out.num_dropped_voxels)
