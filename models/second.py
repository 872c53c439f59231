"""SECOND (Yan et al., "SECOND", Sensors 2018) on ``pcops.nn``, with OpenPCDet's module names so
its checkpoints load as they are: the voxel feature encoder and sparse middle encoder, and the whole
detector of OpenPCDet's KITTI ``second.yaml`` (:class:`SECOND`: MeanVFE → VoxelBackBone8x →
HeightCompression → BaseBEVBackbone → AnchorHeadSingle, with PointPillars' 2-D modules, anchors
and post-processing).

``MeanVFE`` (the mean of each voxel's points) and ``VoxelBackBone8x`` (OpenPCDet's
``backbones_3d/spconv_backbone.py`` layout: 4 → 16 subm ×2, s2 → 32, subm ×2, s2 → 64, subm ×2,
s2 → 64, subm ×2, (3, 1, 1) s(2, 1, 1) → 128; BatchNorm1d(eps 1e-3, momentum 0.01) + ReLU after
every conv). Weights in spconv 2's ``(C_out, kz, ky, kx, C_in)`` layout or spconv 1.x's
``(kz, ky, kx, C_in, C_out)`` (OpenPCDet's published SECOND checkpoints) both load: the sparse
layers convert the latter on load and raise ``ValueError`` for any other shape.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Sequence

import torch
from torch import nn

import pcops
from pcops import _checks
from pcops import nn as pnn
from pcops.sparse_conv3d import check_precision

from . import box_coder
from .config import KITTI_ANCHORS, PointPillarsConfig
from .modules import AnchorHeadSingle, BaseBEVBackbone
from .outputs import DenseOutputs, Detections
from .pointpillars import PointPillars, read_openpcdet_state
from .postprocess import PostProcessMixin

__all__ = ["mean_vfe", "VoxelBackBone8x", "SECOND", "second_config"]


def mean_vfe(voxels: torch.Tensor, num_points: torch.Tensor) -> torch.Tensor:
    """OpenPCDet's ``MeanVFE``: ``(M, T, C)`` voxels (zero padded) and ``(M,)`` point counts →
    ``(M, C)`` means (empty voxels give zeros)."""
    if voxels.dim() != 3 or num_points.shape != voxels.shape[:1]:
        raise ValueError(f"voxels, num_points: expected (M, T, C) and (M,), got {tuple(voxels.shape)}, "
                         f"{tuple(num_points.shape)}")  # fmt: skip
    return voxels.sum(dim=1) / num_points.clamp(min=1).to(voxels.dtype)[:, None]


_GRAPH_ROWS = 8192  # eager_graph: capacities are multiples of this many rows
_LEVEL_FACTORS = (2.0, 1.5, 1.0, 1.0)  # eager_graph: first strided capacities, × the input rows


def _round_rows(n: float) -> int:
    return max(1, math.ceil(n / _GRAPH_ROWS)) * _GRAPH_ROWS


def _capacities(static_capacity) -> tuple:
    """``static_capacity`` (None, an int or four ints) → four capacities (``None``: exact)."""
    if static_capacity is None:
        return (None,) * 4
    if isinstance(static_capacity, int) and not isinstance(static_capacity, bool):
        static_capacity = (static_capacity,) * 4
    if not isinstance(static_capacity, (tuple, list)) or len(static_capacity) != 4:
        raise TypeError(
            f"static_capacity: expected None, an int or four ints (conv2, conv3, conv4, conv_out), "
            f"got {static_capacity!r}"
        )
    return tuple(_checks.check_int("static_capacity", c, min_value=1) for c in static_capacity)


def _encoder_outputs(out: dict) -> list:
    """``VoxelBackBone8x.forward``'s five tensors: ``x_conv1`` … ``x_conv4``, the encoded one."""
    return [*out["multi_scale_3d_features"].values(), out["encoded_spconv_tensor"]]


class _EncoderGraph(NamedTuple):
    """``VoxelBackBone8x``'s eager graph: the static form on ``rows`` input rows."""

    signature: tuple  # the parameters' and buffers' (data_ptr, version) at capture
    rows: int
    capacities: tuple  # of the four strided convs
    feats: torch.Tensor  # (rows, C) static input
    coords: torch.Tensor  # (rows, 4) int32 static input, −1 padding
    graph: torch.cuda.CUDAGraph
    outputs: dict  # forward's dict of static tensors
    counts: torch.Tensor  # (5,) int64: real rows of conv2, conv3, conv4, conv_out; dropped voxels


def _block(c_in, c_out, kernel, *, stride=1, padding=0, indice_key=None, conv="subm", capacity=None):
    """OpenPCDet's ``post_act_block``: sparse conv (no bias), BatchNorm1d, ReLU."""
    if conv == "subm":
        layer = pnn.SubMConv3d(c_in, c_out, kernel, bias=False, indice_key=indice_key)
    else:
        layer = pnn.SparseConv3d(
            c_in, c_out, kernel, stride, padding, bias=False, indice_key=indice_key, capacity=capacity
        )
    return pnn.SparseSequential(layer, nn.BatchNorm1d(c_out, eps=1e-3, momentum=0.01), nn.ReLU())


class VoxelBackBone8x(nn.Module):
    """SECOND's sparse middle encoder (OpenPCDet ``VoxelBackBone8x``), 8× down in x and y.

    Args:
        input_channels: voxel feature channels (4 for KITTI x, y, z, r means).
        grid_size: ``(nx, ny, nz)`` voxels of the point-cloud range (OpenPCDet's order, e.g.
            ``(1408, 1600, 40)`` for KITTI's SECOND grid); the sparse grid is
            ``(nz + 1, ny, nx)``, as OpenPCDet's.
        static_capacity: in the static form (``SparseConvTensor(static=True)``), the most rows
            each strided conv keeps: one int for all four, or four (``conv2``, ``conv3``,
            ``conv4``, ``conv_out``); voxels past it are dropped and counted in the output's
            ``num_dropped``. A strided conv can have more outputs than inputs: on KITTI scans at
            40,000 voxels ``conv2`` gives up to 1.8× (71,146 on scan 000001), so size them from
            your data, e.g. ``(80_000, 60_000, 40_000, 40_000)`` for ``max_voxels=40_000``.
            ``None``: the exact bound, which grows 8× per strided conv.
        eager_graph: on CUDA, an eval-mode call on the variable form without autograd (e.g. under
            ``torch.no_grad()``) replays the static form from a CUDA graph instead of launching
            about 150 kernels one by one from Python. The graph is captured at the first call per
            (device, dtype, batch size, TF32 / cuDNN flags) and again when the voxels outgrow its
            capacities (input rows rounded up to 8,192; strided outputs starting at 2, 1.5, 1 and
            1 times that) or the parameters or precisions change. The outputs are the op-by-op
            path's, bit for bit, in new tensors (the real rows of copies of the graph's padded
            buffers); reading their sizes is one host sync per call (the op-by-op path syncs for
            the strided maps' sizes too). A call whose voxels overflow a capacity
            reruns op by op and the next call captures larger capacities. The outputs' kernel
            maps (``indice_dict``) are not kept: later layers build their own. The graph keeps
            its buffers while the model lives (at most four graphs per model). ``False``: op by op.
        precision: every conv's ``precision`` for float32 features (``"auto"``, ``"ieee"``,
            ``"tf32"``, ``"tf32x3"``; see ``pcops.sparse_conv3d``). ``"tf32x3"`` keeps float32's
            accuracy (about 1e-6 relative) on tensor cores; its speed against IEEE is in
            ``benchmarks/NOTES.md``.

    ``forward(x)`` takes a ``pcops.nn.SparseConvTensor`` of the voxels (``indices`` ``(b, z, y,
    x)``) and returns ``{"encoded_spconv_tensor": (128 channels, grid / (8, 8, 16)),
    "encoded_spconv_tensor_stride": 8, "multi_scale_3d_features": {"x_conv1": …, "x_conv4": …}}``;
    ``forward_voxels(features, coords, batch_size)`` builds the tensor first. ``to_bev(out)``
    flattens the encoded tensor to the ``(B, 128 · D, H, W)`` map of OpenPCDet's
    ``HeightCompression``; ``num_bev_features`` is its ``128 · D`` (256 for KITTI).
    """

    def __init__(
        self,
        input_channels: int = 4,
        grid_size: Sequence[int] = (1408, 1600, 40),
        *,
        static_capacity=None,
        eager_graph: bool = True,
        precision: str = "auto",
    ):
        super().__init__()
        caps = _capacities(static_capacity)
        if not isinstance(eager_graph, bool):
            raise TypeError(f"eager_graph: expected a bool, got {type(eager_graph).__name__}")
        self.eager_graph = eager_graph
        self._graphs: dict = {}  # eager_graph: key -> _EncoderGraph
        self._graph_caps: dict = {}  # eager_graph: key -> capacities an overflow asked for
        nx, ny, nz = (int(v) for v in grid_size)
        self.sparse_shape = [nz + 1, ny, nx]
        self.conv_input = pnn.SparseSequential(
            pnn.SubMConv3d(input_channels, 16, 3, padding=1, bias=False, indice_key="subm1"),
            nn.BatchNorm1d(16, eps=1e-3, momentum=0.01),
            nn.ReLU(),
        )
        self.conv1 = pnn.SparseSequential(_block(16, 16, 3, padding=1, indice_key="subm1"))
        self.conv2 = pnn.SparseSequential(
            _block(16, 32, 3, stride=2, padding=1, indice_key="spconv2", conv="spconv", capacity=caps[0]),
            _block(32, 32, 3, padding=1, indice_key="subm2"),
            _block(32, 32, 3, padding=1, indice_key="subm2"),
        )
        self.conv3 = pnn.SparseSequential(
            _block(32, 64, 3, stride=2, padding=1, indice_key="spconv3", conv="spconv", capacity=caps[1]),
            _block(64, 64, 3, padding=1, indice_key="subm3"),
            _block(64, 64, 3, padding=1, indice_key="subm3"),
        )
        self.conv4 = pnn.SparseSequential(
            _block(64, 64, 3, stride=2, padding=(0, 1, 1), indice_key="spconv4", conv="spconv", capacity=caps[2]),
            _block(64, 64, 3, padding=1, indice_key="subm4"),
            _block(64, 64, 3, padding=1, indice_key="subm4"),
        )
        self.conv_out = pnn.SparseSequential(
            pnn.SparseConv3d(
                64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2", capacity=caps[3]
            ),
            nn.BatchNorm1d(128, eps=1e-3, momentum=0.01),
            nn.ReLU(),
        )
        self.num_point_features = 128
        for conv in self._convs():
            conv.precision = check_precision(precision)
        # HeightCompression's channels: 128 × the encoded depth (nz + 1 through three (3, s2, p1)
        # convs, one (3, s2, p0) and the (3, 1, 1) s(2, 1, 1) output conv: 2 for KITTI's 40 cells)
        d = nz + 1
        for pad in (1, 1, 0, 0):
            d = (d + 2 * pad - 3) // 2 + 1
        self.num_bev_features = self.num_point_features * d

    def __getstate__(self):  # copies and pickles leave the eager graphs behind (captured again on use)
        state = dict(self.__dict__)
        state["_graphs"], state["_graph_caps"] = {}, {}
        return state

    def _convs(self) -> list:
        return [m for m in self.modules() if isinstance(m, pnn.sparse._SparseConv3d)]

    def _signature(self) -> tuple:
        """What an eager graph bakes in, in one walk over the modules: every parameter's and
        buffer's (data_ptr, version) and every conv's precision."""
        sig = []
        for m in self.modules():
            tensors = (*m._parameters.values(), *m._buffers.values())
            sig.extend((t.data_ptr(), t._version) for t in tensors if t is not None)
            if isinstance(m, pnn.sparse._SparseConv3d):
                sig.append(m.precision)
        return tuple(sig)

    def _strided(self) -> list:
        """The four strided convs (``conv2``, ``conv3``, ``conv4``, ``conv_out``)."""
        return [self.conv2[0][0], self.conv3[0][0], self.conv4[0][0], self.conv_out[0]]

    def forward(self, x: pnn.SparseConvTensor) -> dict:
        if not isinstance(x, pnn.SparseConvTensor):
            raise TypeError(f"x: expected a pcops.nn.SparseConvTensor, got {type(x).__name__}")
        if list(x.spatial_shape) != self.sparse_shape:
            raise ValueError(f"x: expected spatial_shape {self.sparse_shape} (grid_size), got {x.spatial_shape}")
        if self._graph_applies(x):
            out = self._graph_forward(x)
            if out is not None:
                return out
        return self._forward(x)

    def _graph_applies(self, x: pnn.SparseConvTensor) -> bool:
        if not self.eager_graph or self.training or x.static or x.indice_dict or x.num_dropped is not None:
            return False
        if x.indices.shape[0] == 0 or x.features.device.type != "cuda" or torch.compiler.is_compiling():
            return False
        if torch.is_autocast_enabled("cuda"):
            return False
        if torch.cuda.is_current_stream_capturing():
            return False
        if torch.is_grad_enabled() and (x.features.requires_grad or any(p.requires_grad for p in self.parameters())):
            return False  # autograd needs the op-by-op path
        return True

    def _graph_forward(self, x: pnn.SparseConvTensor) -> dict | None:
        """``forward`` replayed from the static form's CUDA graph (``eager_graph``); ``None`` when
        a capacity overflowed (the caller then runs op by op)."""
        from .fast import MAX_EAGER_GRAPHS, _conv_flags

        feats = x.features
        n = x.indices.shape[0]
        key = (
            feats.device,
            feats.dtype,
            feats.shape[1],
            x.batch_size,
            torch.is_inference_mode_enabled(),
            *_conv_flags(),
        )
        signature = self._signature()
        entry = self._graphs.get(key)
        asked = self._graph_caps.get(key)
        grown = asked is not None and entry is not None and any(a > c for a, c in zip(asked, entry.capacities))
        if entry is None or entry.signature != signature or n > entry.rows or grown:
            self._graphs.pop(key, None)  # the old graph's memory goes back to the allocator first
            while len(self._graphs) >= MAX_EAGER_GRAPHS:
                self._graphs.pop(next(iter(self._graphs)))
            rows = _round_rows(max(n, entry.rows if entry is not None else 0))
            caps = tuple(_round_rows(f * rows) for f in _LEVEL_FACTORS)
            if asked:
                caps = tuple(max(a, b) for a, b in zip(caps, asked))
            entry = self._capture(x, rows, caps, signature)
            self._graphs[key] = entry
        entry.feats[:n].copy_(feats)
        entry.coords[:n].copy_(x.indices)
        entry.coords[n:].fill_(-1)
        entry.graph.replay()
        static = entry.outputs
        scales = static["multi_scale_3d_features"]
        tensors = _encoder_outputs(static)
        # the outputs leave the static buffers whole, queued behind the replay (their launches
        # overlap the GPU's work; the results are cut to their real rows after the sync)
        copies = [(t.features.clone(), t.indices.clone()) for t in tensors]
        counts = entry.counts.tolist()  # the host sync: the output sizes
        if counts[-1] > 0:  # a strided conv's capacity overflowed: op by op now, larger next time
            out = self._forward(x)
            sizes = [t.indices.shape[0] for t in _encoder_outputs(out)[1:]]
            self._graph_caps[key] = tuple(max(c, _round_rows(1.25 * m)) for c, m in zip(entry.capacities, sizes))
            return None
        outs = [
            pnn.SparseConvTensor._unchecked(f[:m], i[:m], t.spatial_shape, x.batch_size)
            for (f, i), t, m in zip(copies, tensors, [n, *counts[:4]])
        ]
        return {
            "encoded_spconv_tensor": outs[4],
            "encoded_spconv_tensor_stride": 8,
            "multi_scale_3d_features": dict(zip(scales, outs[:4])),
        }

    def _capture(self, x: pnn.SparseConvTensor, rows: int, caps: tuple, signature: tuple) -> "_EncoderGraph":
        from .graph import capture_graph

        device = x.features.device
        feats = torch.zeros((rows, x.features.shape[1]), dtype=x.features.dtype, device=device)
        coords = torch.full((rows, 4), -1, dtype=torch.int32, device=device)
        n = x.indices.shape[0]
        feats[:n].copy_(x.features)
        coords[:n].copy_(x.indices)
        strided = self._strided()

        def run():  # the strided convs hold the graph's capacities while it runs (host-side only)
            saved = [conv.capacity for conv in strided]
            try:
                for conv, cap in zip(strided, caps):
                    conv.capacity = cap
                out = self._forward(pnn.SparseConvTensor(feats, coords, self.sparse_shape, x.batch_size, static=True))
            finally:
                for conv, cap in zip(strided, saved):
                    conv.capacity = cap
            tensors = _encoder_outputs(out)[1:]
            real = [t.valid.sum() for t in tensors]
            dropped = tensors[-1].num_dropped
            real.append(
                dropped.reshape(()) if dropped is not None else torch.zeros((), dtype=torch.int64, device=device)
            )
            return out, torch.stack([r.to(torch.int64) for r in real])

        with torch.no_grad():
            graph, (out, counts) = capture_graph(run, device)
        return _EncoderGraph(signature, rows, caps, feats, coords, graph, out, counts)

    def _forward(self, x: pnn.SparseConvTensor) -> dict:
        x1 = self.conv1(self.conv_input(x))
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        x4 = self.conv4(x3)
        out = self.conv_out(x4)
        return {
            "encoded_spconv_tensor": out,
            "encoded_spconv_tensor_stride": 8,
            "multi_scale_3d_features": {"x_conv1": x1, "x_conv2": x2, "x_conv3": x3, "x_conv4": x4},
        }

    def forward_voxels(self, features: torch.Tensor, coords: torch.Tensor, batch_size: int) -> dict:
        """``features (M, C)`` (e.g. ``mean_vfe``), ``coords (M, 4)`` ``(b, z, y, x)``."""
        return self(pnn.SparseConvTensor(features, coords, self.sparse_shape, batch_size))

    @staticmethod
    def to_bev(encoded: pnn.SparseConvTensor) -> torch.Tensor:
        """OpenPCDet's ``HeightCompression``: ``(B, C, D, H, W)`` → ``(B, C · D, H, W)``."""
        dense = encoded.dense()
        b, c, d, h, w = dense.shape
        return dense.view(b, c * d, h, w)

    def load_openpcdet(self, state_dict: dict, prefix: str = "backbone_3d.") -> None:
        """Load an OpenPCDet SECOND checkpoint's middle encoder (its ``model_state`` or a whole
        checkpoint dict; keys under ``prefix``), spconv 1.x or 2.x weight layout."""
        state = state_dict.get("model_state", state_dict)
        sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if not sub:
            raise ValueError(f"state_dict: no keys start with {prefix!r} (is it an OpenPCDet SECOND checkpoint?)")
        self.load_state_dict(sub)


def second_config(**overrides) -> PointPillarsConfig:
    """The 2-D half of OpenPCDet's KITTI ``second.yaml`` as the config :class:`SECOND`'s BEV
    backbone, head, anchors and post-processing read: range ``(0, -40, -3, 70.4, 40, 1)``, the BEV
    grid of the 0.05 m voxels (one z cell spanning the range: 1600 × 1408), backbone
    ``LAYER_NUMS (5, 5)``, strides ``(1, 2)``, filters ``(128, 256)``, upsampling ``(1, 2)`` to
    ``(256, 256)``, KITTI's three anchors at feature-map stride 8 (a 200 × 176 head), 5 points
    and 16,000 / 40,000 voxels per scan. ``overrides`` replace fields (e.g. a smaller range)."""
    fields = dict(
        point_cloud_range=(0.0, -40.0, -3.0, 70.4, 40.0, 1.0),
        voxel_size=(0.05, 0.05, 4.0),
        max_points_per_voxel=5,
        layer_nums=(5, 5),
        layer_strides=(1, 2),
        num_filters=(128, 256),
        upsample_strides=(1, 2),
        num_upsample_filters=(256, 256),
        anchors=tuple(dataclasses.replace(a, feature_map_stride=8) for a in KITTI_ANCHORS),
    )
    fields.update(overrides)
    if "voxel_size" not in overrides:  # keep one z cell over the range
        r = fields["point_cloud_range"]
        fields["voxel_size"] = (0.05, 0.05, r[5] - r[2])
    return PointPillarsConfig(**fields)


class SECOND(PostProcessMixin, nn.Module):
    """OpenPCDet's KITTI SECOND detector (``second.yaml``), eval-mode detections.

    Args:
        config: the 2-D half (:func:`second_config`, the default).
        voxel_size: the 3-D voxels, ``(0.05, 0.05, 0.1)`` m (``VOXEL_SIZE``).

    ``forward(points, lengths=None)`` voxelizes (``pcops.voxelize``, at most ``max_points_per_voxel``
    points and ``max_voxels_test`` voxels per scan), averages each voxel's points (MeanVFE), runs
    :class:`VoxelBackBone8x` and OpenPCDet's ``HeightCompression`` (``(B, 256, H / 8, W / 8)``),
    PointPillars' ``BaseBEVBackbone`` and ``AnchorHeadSingle``, and returns :class:`Detections`
    decoded and NMS-ed as PointPillars' reference path does. ``load_openpcdet`` loads an
    OpenPCDet SECOND checkpoint (spconv 1.x or 2.x weight layout). For speed, run
    ``pcops.nn.fuse_for_inference`` on ``backbone_3d`` (BatchNorm and ReLU folded into the sparse
    convolutions). There are no shipped SECOND weights: a model built here starts random.
    """

    def __init__(self, config: PointPillarsConfig | None = None, voxel_size: Sequence[float] = (0.05, 0.05, 0.1)):
        super().__init__()
        self.config = config if config is not None else second_config()
        if not isinstance(self.config, PointPillarsConfig):
            raise TypeError(
                f"config: expected a PointPillarsConfig (second_config()), got {type(self.config).__name__}"
            )
        self.voxel_size = tuple(float(v) for v in voxel_size)
        r = self.config.point_cloud_range
        grid = tuple(int(round((r[i + 3] - r[i]) / self.voxel_size[i])) for i in range(3))
        if grid[:2] != self.config.grid_size[:2]:
            raise ValueError(
                f"voxel_size: x/y must match the config's BEV grid {self.config.grid_size[:2]}, got {grid}"
            )
        self.backbone_3d = VoxelBackBone8x(self.config.num_point_features, grid)
        self.backbone_2d = BaseBEVBackbone(self.config, self.backbone_3d.num_bev_features)
        self.dense_head = AnchorHeadSingle(self.config, self.backbone_2d.num_bev_features)
        self.register_buffer("global_step", torch.zeros(1, dtype=torch.int64))  # OpenPCDet's step counter
        self._anchors_cpu = box_coder.generate_anchors(self.config).view(-1, 7)
        self._anchors: dict[torch.device, torch.Tensor] = {}
        self.last_dropped_voxels: torch.Tensor | None = None  # (B,) voxels dropped by max_voxels, last call
        self.warn_on_dropped_voxels = False  # the trainer's switch (PointPillars warns; SECOND counts only)
        self.weights_source: str | None = None
        self.eval()

    anchors = PointPillars.anchors  # the anchors on a device, cached, as PointPillars keeps them
    num_anchors = PointPillars.num_anchors

    def _head(self, points: torch.Tensor, lengths: torch.Tensor | None, max_voxels: int) -> DenseOutputs:
        cfg = self.config
        if points.dim() != 2 or points.shape[1] < cfg.num_point_features:
            raise ValueError(f"points: expected (N, >= {cfg.num_point_features}), got {tuple(points.shape)}")
        batch = 1 if lengths is None else lengths.numel()
        vox = pcops.voxelize(
            points[:, : cfg.num_point_features],
            self.voxel_size,
            cfg.point_cloud_range,
            cfg.max_points_per_voxel,
            max_voxels,
            lengths=lengths,
        )
        self.last_dropped_voxels = vox.num_dropped_voxels
        enc = self.backbone_3d.forward_voxels(mean_vfe(vox.voxels, vox.num_points), vox.coords, batch)
        x = self.backbone_2d(VoxelBackBone8x.to_bev(enc["encoded_spconv_tensor"]))
        return DenseOutputs(*(t.float() for t in self.dense_head(x)))

    def dense_outputs(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> DenseOutputs:
        """The head's NHWC outputs ``(cls, box, dir)``, float32 (``(B, 200, 176, ·)`` for KITTI)."""
        with torch.no_grad():
            return self._head(points, lengths, self.config.max_voxels_test)

    def forward_train(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> DenseOutputs:
        """Differentiable head outputs (``max_voxels_train`` voxels per scan; BatchNorm with batch
        statistics in ``train()`` mode): what ``pcops.models.train`` trains, as for PointPillars
        (``train(TrainConfig(...), SECOND(...))``)."""
        return self._head(points, lengths, self.config.max_voxels_train)

    def forward(self, points: torch.Tensor, lengths: torch.Tensor | None = None) -> Detections:
        """Detect objects in ``points (N, C)`` float32 (one scan, or several with ``lengths``)."""
        if self.training:
            raise RuntimeError("forward: detections need eval mode (call model.eval())")
        with torch.no_grad():
            return self._post_reference(*self.dense_outputs(points, lengths))

    def load_openpcdet(self, path_or_state_dict, strict: bool = True) -> "SECOND":
        """Load an OpenPCDet SECOND checkpoint (path or dict; see ``PointPillars.load_openpcdet``);
        the sparse convolutions take spconv 1.x or 2.x layouts. ``global_step`` is optional;
        missing or mis-shaped keys raise (``strict``: unexpected ones too). Returns ``self``."""
        state = dict(read_openpcdet_state(path_or_state_dict))
        state.setdefault("global_step", self.global_step.clone())
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or (strict and unexpected):
            raise KeyError(
                f"path_or_state_dict: not a SECOND checkpoint for this config: missing {missing[:20]}, "
                f"unexpected {unexpected[:20]}"
            )
        try:  # the sparse convs convert spconv 1.x weights while loading
            self.load_state_dict({k: state[k] for k in own}, strict=True)
        except RuntimeError as e:
            raise ValueError(f"path_or_state_dict: mis-shaped weights: {e}") from None
        return self
