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

import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import pcops

from . import box_coder
from .config import PointPillarsConfig
from .fast import EPILOGUES, FastParams, FastPathMixin
from .graph import GraphedPointPillars, fixed_voxelize
from .modules import AnchorHeadSingle, BaseBEVBackbone, PillarVFE, PointPillarScatter
from .outputs import DenseOutputs, Detections
from .postprocess import PostProcessMixin
from .timing import null_timer

__all__ = ["PointPillars", "Detections", "DenseOutputs", "GraphedPointPillars"]

_IMPLS = ("fast", "reference")
PRETRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights", "pointpillars_sim.pt")


# --- the detector -----------------------------------------------------------------------------


def read_openpcdet_state(path_or_state_dict) -> dict:
    """The model state of an OpenPCDet checkpoint: a ``.pth`` path (loaded with
    ``weights_only=True``) or its dict, the checkpoint (``{'model_state': ...}``) or the bare state
    dict, ``module.`` prefixes of a ``DistributedDataParallel`` wrapper removed."""
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
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


class PointPillars(FastPathMixin, PostProcessMixin, nn.Module):
    """PointPillars with OpenPCDet's module names; KITTI ``pointpillar.yaml`` by default.

    Args:
        config: a :class:`PointPillarsConfig` (default: OpenPCDet's KITTI model).
        impl: ``"fast"`` (default) or ``"reference"`` (see the module docstring).
        dtype: compute dtype of the fast path's 2-D backbone and head, ``torch.float32`` (default;
            TF32 convolutions when ``torch.backends.cudnn.allow_tf32``, PyTorch's default) or
            ``torch.float16`` / ``torch.bfloat16`` (half copies of the folded weights; the parameters
            stay float32). The reference path runs float32, or under autocast for a half dtype.
        channels_last: memory format of the fast path's backbone; default: on for CUDA, off on CPU.
        epilogue: how the fast backbone runs bias + ReLU (+ the concat of the upsampled maps) on
            CUDA: ``"auto"`` (default: ``"cudnn"`` where cuDNN is available, else ``"triton"``),
            ``"cudnn"`` (cuDNN's fused convolution + bias + ReLU, the Triton pass for the
            upsampling), ``"triton"`` (convolutions without bias, then one Triton pass each that
            adds the bias, applies ReLU and writes into the concatenated map) or ``"torch"``.
            An explicit ``"cudnn"`` without cuDNN raises ``RuntimeError``. The CPU always uses torch.
        eager_graph: on CUDA, a call of the fast path (without :meth:`capture`) replays its
            kernels from CUDA graphs captured at the first call instead of launching them one by
            one from Python, with identical outputs. One scan (``lengths=None``): the whole call,
            fixed-capacity voxelization through the post-processing, as :meth:`capture` records
            it (no host sync but the dropped-pillar warning's; a capacity of the next power of
            two of points, at least 131,072, captured again for a larger scan). A batch: the
            folded backbone, the head and the sync-free post-processing (top-k decoding, padded
            NMS: about 75 kernels) per batch size, after the op-by-op voxelization.
            ``dense_outputs`` replays a graph of the backbone and head. The detections are copied
            out of the graph (a later call does not overwrite them); figures in
            ``benchmarks/RESULTS.md``. The graphs keep their activations allocated while the
            model lives (at most four graphs per model, the oldest goes first) and are captured
            again after the weights or the config change. ``False``: launch op by op. Inside a
            graph capture or ``torch.compile`` the ops always run op by op.

    Modes: ``eval()`` (the default) detects with the BatchNorm running statistics (the fast path
    folds them into the convolutions and refolds after the weights change). ``train()`` makes
    :meth:`forward_train` compute the head outputs with gradients (``pcops.models.train`` runs
    the whole recipe); calling the model for detections in training mode raises.

    Weights: :meth:`pretrained` loads the weights shipped with pcops (trained on pcops' simulated
    scans); :meth:`load_openpcdet` loads an OpenPCDet checkpoint. A model built without weights
    starts as OpenPCDet initialises it (random) and warns once when asked for detections.
    """

    def __init__(
        self,
        config: PointPillarsConfig | None = None,
        impl: str = "fast",
        dtype: torch.dtype = torch.float32,
        channels_last: bool | None = None,
        epilogue: str = "auto",
        eager_graph: bool = True,
    ):
        super().__init__()
        if epilogue not in EPILOGUES:
            raise ValueError(f"epilogue: expected one of {EPILOGUES}, got {epilogue!r}")
        self.epilogue = epilogue
        self.config = config if config is not None else PointPillarsConfig()
        if not isinstance(self.config, PointPillarsConfig):
            raise TypeError(f"config: expected a PointPillarsConfig, got {type(self.config).__name__}")
        self.impl = impl
        self.dtype = dtype
        self.channels_last = channels_last
        self.eager_graph = bool(eager_graph)
        self._graphs: dict = {}  # eager_graph: (device, batch, dtype, layout, epilogue, post, ...) -> graph
        self.vfe = PillarVFE(self.config)
        self.map_to_bev_module = PointPillarScatter(self.config)
        self.backbone_2d = BaseBEVBackbone(self.config, self.config.vfe_filters[-1])
        self.dense_head = AnchorHeadSingle(self.config, self.backbone_2d.num_bev_features)
        self.register_buffer("global_step", torch.zeros(1, dtype=torch.int64))  # OpenPCDet's step counter
        self._anchors_cpu = box_coder.generate_anchors(self.config).view(-1, 7)
        self._anchors: dict[torch.device, torch.Tensor] = {}
        self._fast: tuple[tuple, FastParams] | None = None
        self.stage_timer = null_timer
        self.last_dropped_voxels: torch.Tensor | None = None  # (B,) pillars dropped by max_voxels, last call
        self.warn_on_dropped_voxels = True  # eager calls warn when pillars were dropped (one small sync)
        self.weights_source: str | None = None  # where the weights came from (None: untrained)
        self._warned_untrained = False
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

    @classmethod
    def pretrained(cls, path: str | os.PathLike | None = None, **kwargs) -> "PointPillars":
        """The PointPillars weights shipped with pcops: trained on pcops' simulated KITTI-like scans
        (``python -m pcops.models train``; the recipe and its evaluation are recorded in
        ``benchmarks/results/train_pointpillars.json``). ``path`` loads another checkpoint saved by
        the trainer or OpenPCDet instead; ``kwargs`` go to the constructor (``impl``, ``dtype``, ...).
        """
        path = PRETRAINED if path is None else os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"path: no PointPillars weights at {path}")
        model = cls(**kwargs)
        model.load_openpcdet(path)  # fp16 weights are cast to the float32 parameters
        model.weights_source = path
        return model

    def train(self, mode: bool = True):
        """Training mode: BatchNorm uses batch statistics (padding rows excluded) and
        :meth:`forward_train` gives differentiable head outputs. Detections need ``eval()``."""
        return super().train(mode)

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
        state = read_openpcdet_state(path_or_state_dict)
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
                msg.append(
                    f"unexpected keys ({len(unexpected)}): {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''}"
                )
            raise KeyError("path_or_state_dict: not a PointPillars checkpoint for this config: " + "; ".join(msg))
        with torch.no_grad():
            for k, v in state.items():
                if k in own:
                    if k == "global_step":
                        own[k].copy_(torch.as_tensor(v).reshape(own[k].shape).to(own[k].dtype))
                    else:
                        own[k].copy_(v)
        self._fast = None
        self.weights_source = "checkpoint"
        return self

    @torch.no_grad()
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

    def _warn_dropped(self, dropped: torch.Tensor) -> None:
        if self.warn_on_dropped_voxels and bool((dropped > 0).any()):
            warnings.warn(
                f"voxelize: {dropped.tolist()} occupied pillars per scan beyond max_voxels="
                f"{self.config.max_voxels_test} were dropped (OpenPCDet drops them too)",
                RuntimeWarning,
                stacklevel=4,
            )

    def _dense(self, points: torch.Tensor, lengths: torch.Tensor | None, timer=null_timer, post: bool = False):
        """points → head outputs. Reference: the three NHWC tensors; fast: one (B, H, W, 72) tensor,
        or with ``post`` where ``eager_graph`` applies, the :class:`Detections` (the graph replays
        the post-processing too)."""
        batch_size = self._check_points(points, lengths)
        reference = self.impl == "reference"
        if post and lengths is None and not reference and self._eager_graph_applies(points.device):
            with timer("scan (graph)"):
                det, self.last_dropped_voxels = self._graphed_scan(points, self._fast_params(points.device))
            self._warn_dropped(self.last_dropped_voxels)
            return det
        with timer("voxelize"):
            vox = self._voxelize(points, lengths, reference)
        self.last_dropped_voxels = vox.num_dropped_voxels
        self._warn_dropped(vox.num_dropped_voxels)
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
        graphed = self._graphed_backbone(batch_size, points.device, fp, post)
        with timer("pfn+scatter"):
            out = graphed[0] if graphed is not None else None
            canvas = self._pfn_scatter(vox.voxels, vox.num_points, vox.coords, batch_size, fp, out=out)
        if graphed is not None:
            with timer("backbone+head+post (graph)" if post else "backbone+head (graph)"):
                return graphed[1]()
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
        if self.training:
            raise RuntimeError(
                "forward: detections need eval mode (call model.eval()); in training mode use "
                "forward_train (pcops.models.train runs the training recipe)"
            )
        if self.weights_source is None and not self._warned_untrained:
            self._warned_untrained = True
            warnings.warn(
                "PointPillars: the weights are untrained (random): detections are meaningless; use "
                "PointPillars.pretrained() or load_openpcdet(path)",
                UserWarning,
                stacklevel=2,
            )
        timer = self.stage_timer
        with torch.no_grad():
            dense = self._dense(points, lengths, timer, post=True)
            if isinstance(dense, Detections):  # eager_graph: the graph ran the post-processing too
                return dense
            with timer("post"):
                if self.impl == "reference":
                    return self._post_reference(*dense)
                return self._post_fast(dense)

    def forward_train(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> DenseOutputs:
        """Differentiable head outputs for training, OpenPCDet's NHWC layout, float32.

        Fixed-capacity voxelization (``config.max_voxels_train`` pillars per scan, no host sync on
        CUDA), the PFN with BatchNorm over the real pillars only (:meth:`PillarVFE.forward_train`),
        ``pcops.pillar_scatter`` (its registered backward carries the gradient; padding rows with
        coords −1 are skipped on CUDA and cut on the CPU), then the backbone and head modules; run
        it under ``torch.autocast`` for bf16/fp16 (the PFN stays float32). Needs ``train()`` mode
        for batch statistics; in ``eval()`` mode the PFN uses its module forward.
        """
        cfg = self.config
        batch_size = self._check_points(points, lengths)
        if lengths is None:
            lengths = torch.full((1,), points.shape[0], dtype=torch.int64, device=points.device)
        vox = fixed_voxelize(points[:, : cfg.num_point_features], cfg, lengths, cfg.max_voxels_train)
        self.last_dropped_voxels = vox.dropped_voxels
        valid = vox.num_points > 0
        coords = vox.coords
        if self.training:
            pillars = self.vfe.forward_train(vox.voxels, vox.num_points, coords, valid)
        else:
            pillars = self.vfe(vox.voxels, vox.num_points, coords)
        if not points.is_cuda:  # the CPU scatter rejects the padding rows' coords -1 (a sync is free here)
            pillars, coords = pillars[valid], coords[valid]
        dtype = torch.get_autocast_dtype(points.device.type) if torch.is_autocast_enabled(points.device.type) else None
        canvas = pcops.pillar_scatter(pillars if dtype is None else pillars.to(dtype), coords, batch_size, cfg.bev_hw)
        if points.is_cuda:
            canvas = canvas.contiguous(memory_format=torch.channels_last)
        cls, box, dirc = self.dense_head(self.backbone_2d(canvas))
        return DenseOutputs(cls.float(), box.float(), dirc.float())

    def _forward_static(self, points: torch.Tensor, lengths: torch.Tensor, fp: FastParams):
        """The fast path with static shapes only (what :class:`GraphedPointPillars` captures):
        fixed-capacity voxelization, fused PFN over all capacity rows, backbone, head, padded
        post-processing. Returns ``(Detections, num_dropped_voxels (B,))``; no host sync on CUDA."""
        vox = fixed_voxelize(points[:, : self.config.num_point_features], self.config, lengths)
        canvas = self._pfn_scatter(vox.voxels, vox.num_points, vox.coords, lengths.numel(), fp, count=vox.count)
        x = self._backbone_fast(canvas, fp)
        out = F.conv2d(x, fp.head_weight, fp.head_bias).permute(0, 2, 3, 1)
        return self._post_fast(out), vox.dropped_voxels

    # ----- fast path pieces
    # ----- CUDA graph
    def capture(
        self,
        example_points: torch.Tensor,
        example_lengths=None,
        max_points: int | None = None,
        cudnn_benchmark: bool = False,
    ) -> "GraphedPointPillars":
        """Capture the fast path in one CUDA graph; see :class:`GraphedPointPillars`."""
        return GraphedPointPillars(
            self, example_points, example_lengths, max_points=max_points, cudnn_benchmark=cudnn_benchmark
        )


# how the fast backbone runs bias + ReLU + concat on CUDA ("torch", "triton", "cudnn"); see
# PointPillars._backbone_fast. Measured on the H200 (E1 fp16 graph, PFN "dot"): torch 1.21 ms,
# triton 1.04, cudnn 0.96; E2 (batch 8): triton 4.80, cudnn 4.43 ms. "cudnn" falls back to
