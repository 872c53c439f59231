"""The fast inference path of PointPillars: BatchNorm folded into the convolutions, the fused
pillar feature net, the folded backbone with a fused bias + ReLU epilogue, one fused head conv."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import pcops

from .graph import GraphedPointPillars, capture_graph

__all__ = ["EPILOGUES", "FastParams", "FastPathMixin"]

# how the fast backbone runs bias + ReLU + concat on CUDA; "auto" = "cudnn" where cuDNN is
# available, else "triton" (measurements in benchmarks/NOTES.md)
EPILOGUES = ("auto", "torch", "triton", "cudnn")
MAX_EAGER_GRAPHS = 4  # eager_graph: graphs kept per model (one per batch size, dtype, ...; the oldest goes)


def _conv_flags() -> tuple:
    """The flags that pick the convolutions' kernels: an ``eager_graph`` graph captured under
    other values would replay other kernels (TF32 or not) than the op-by-op path runs now."""
    cudnn = torch.backends.cudnn
    return (
        cudnn.enabled,
        cudnn.allow_tf32,
        cudnn.deterministic,
        cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
    )


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


class FastParams(NamedTuple):
    pfn_weight: torch.Tensor  # (10, C) float32
    pfn_bias: torch.Tensor  # (C,) float32
    blocks: list[list[_FoldedConv]]
    deblocks: list[_FoldedConv]
    head_weight: torch.Tensor  # (18 + 42 + 12, C, 1, 1)
    head_bias: torch.Tensor
    dtype: torch.dtype
    channels_last: bool


class FastPathMixin:
    """The fast-path pieces of :class:`~pcops.models.pointpillars.PointPillars`."""

    def __getstate__(self):  # copies and pickles leave the eager graphs behind (captured again on use)
        state = dict(self.__dict__)
        state["_graphs"] = {}
        return state

    def _head_splits(self) -> tuple[int, int]:
        a = self.config.num_anchors_per_location
        return a * self.config.num_classes, a * 7

    def _fast_params(self, device: torch.device) -> FastParams:
        channels_last = self.channels_last if self.channels_last is not None else device.type == "cuda"
        tensors = [*self.parameters(), *self.buffers()]
        key = (
            device,
            self.dtype,
            channels_last,
            tuple(t._version for t in tensors),
            tuple(t.data_ptr() for t in tensors),
        )
        if self._fast is not None and self._fast[0] == key:
            return self._fast[1]
        dt = self.dtype

        def conv(fc: _FoldedConv) -> _FoldedConv:
            w = fc.weight.to(device=device, dtype=dt)
            if channels_last:
                w = w.contiguous(memory_format=torch.channels_last)
            return fc._replace(weight=w, bias=fc.bias.to(device=device, dtype=dt))

        from pcops.pfn import fold_batchnorm

        single = len(self.vfe.pfn_layers) == 1 and self.config.use_absolute_xyz and not self.config.with_distance
        layer = self.vfe.pfn_layers[0]
        if single and self.config.num_pfn_inputs == 10:
            w, b = fold_batchnorm(
                layer.linear.weight.detach(),
                layer.norm.weight.detach(),
                layer.norm.bias.detach(),
                layer.norm.running_mean,
                layer.norm.running_var,
                layer.norm.eps,
            )
        else:
            w = b = None
        head = self.dense_head
        hw = torch.cat([head.conv_cls.weight, head.conv_box.weight, head.conv_dir_cls.weight]).detach()
        hb = torch.cat([head.conv_cls.bias, head.conv_box.bias, head.conv_dir_cls.bias]).detach()
        hw = hw.to(device=device, dtype=dt)
        if channels_last:
            hw = hw.contiguous(memory_format=torch.channels_last)
        fp = FastParams(
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

    def _new_canvas(self, batch_size: int, device, fp: FastParams) -> torch.Tensor:
        h, w = self.config.bev_hw
        c = self.config.vfe_filters[-1]
        if fp.channels_last:
            return torch.zeros(batch_size, h, w, c, device=device, dtype=fp.dtype).permute(0, 3, 1, 2)
        return torch.zeros(batch_size, c, h, w, device=device, dtype=fp.dtype)

    def _pfn_scatter(self, voxels, num_points, coords, batch_size, fp: FastParams, count=None, out=None):
        """Pillar features into the BEV canvas; ``out``: a canvas of :meth:`_new_canvas`'s shape
        and layout to write into (zeroed here) instead of a new one."""
        if fp.pfn_weight is None:  # a VFE the fused kernel does not cover: unfused, then scatter
            pillars = self.vfe(voxels, num_points, coords).to(fp.dtype)
            canvas = self.map_to_bev_module(pillars, coords, batch_size, reference=False)
            canvas = canvas.contiguous(memory_format=torch.channels_last) if fp.channels_last else canvas
            return canvas if out is None else out.copy_(canvas)
        canvas = self._new_canvas(batch_size, voxels.device, fp) if out is None else out.zero_()
        if voxels.device.type == "cuda":
            from pcops.triton.pfn import pfn_scatter

            cfg = self.config
            return pfn_scatter(
                voxels,
                num_points,
                coords,
                fp.pfn_weight,
                fp.pfn_bias,
                canvas,
                cfg.voxel_size,
                cfg.point_cloud_range[:3],
                count=count,
            )
        # CPU: the same folded arithmetic in torch (decorate, x @ W' + b', ReLU, max), then scatter
        feats = self.vfe.decorate(voxels, num_points, coords)
        pillars = torch.relu(feats @ fp.pfn_weight + fp.pfn_bias).amax(dim=1)
        if count is not None:  # fixed-capacity padding rows (num_points 0, coords -1): drop them
            live = num_points > 0
            pillars, coords = pillars[live], coords[live]
        canvas_nchw = pcops.pillar_scatter(pillars.to(fp.dtype), coords, batch_size, self.config.bev_hw)
        canvas = canvas_nchw.contiguous(memory_format=torch.channels_last) if fp.channels_last else canvas_nchw
        return canvas if out is None else out.copy_(canvas)

    def _backbone_head(self, x: torch.Tensor, fp: FastParams) -> torch.Tensor:
        """The folded backbone and the fused head conv: canvas → ``(B, H, W, 72)``."""
        x = self._backbone_fast(x, fp)
        return F.conv2d(x, fp.head_weight, fp.head_bias).permute(0, 2, 3, 1)  # a free view when channels-last

    def _graphed_backbone(self, batch_size: int, device: torch.device, fp: FastParams, post: bool = False):
        """The backbone + head (+ with ``post``, the sync-free post-processing) as a CUDA graph for
        eager calls (``eager_graph``), or ``None`` where it does not apply (CPU, graph capture or
        ``torch.compile`` under way, ``eager_graph=False``).

        Captured at the first call per (device, batch size, dtype, layout, epilogue, ``post``,
        cuDNN / TF32 flags: a replay keeps the kernels chosen at capture) and again after the
        weights change (a new :class:`FastParams`), the config is replaced or the anchors change;
        the replay runs the same kernels on the same shapes as the op-by-op path, so the results
        are identical. Returns ``(canvas, replay)``: the static canvas to fill, then ``replay()`` →
        the static ``(B, H, W, 72)`` head output, overwritten by the next call, or with ``post``
        the :class:`Detections`, cloned (the caller owns them)."""
        if not self._eager_graph_applies(device):
            return None
        anchors = self.anchors(device) if post else None

        def build():
            canvas = self._new_canvas(batch_size, device, fp)

            def run():
                out = self._backbone_head(canvas, fp)
                return self._post_fast(out) if post else out

            return (canvas, *capture_graph(run, device))

        entry = self._eager_graph_entry(device, batch_size, fp, post, anchors, build)
        canvas, graph, out = entry[3:]

        def replay():
            graph.replay()
            return type(out)(*(t.clone() for t in out)) if post else out

        return canvas, replay

    def _eager_graph_applies(self, device: torch.device) -> bool:
        """Whether an eager call on ``device`` replays graphs (``eager_graph``, CUDA, no capture or
        ``torch.compile`` under way)."""
        if not self.eager_graph or device.type != "cuda" or torch.compiler.is_compiling():
            return False
        return not torch.cuda.is_current_stream_capturing()

    def _eager_graph_entry(self, device, batch_size: int, fp: FastParams, kind, anchors, build, fits=None) -> tuple:
        """The kept eager graph ``(fp, config, anchors, *build())`` of (device, batch size, dtype,
        layout, epilogue, ``kind``, inference mode, cuDNN / TF32 flags): ``build()`` captures it
        when there is none, after the weights (a new :class:`FastParams`), the config or the
        anchors change, or where ``fits(entry)`` is false; the oldest graphs make room
        (``MAX_EAGER_GRAPHS``)."""
        key = (
            device,
            batch_size,
            fp.dtype,
            fp.channels_last,
            self.epilogue,
            kind,
            torch.is_inference_mode_enabled(),
            *_conv_flags(),
        )
        entry = self._graphs.get(key)
        stale = entry is None or entry[0] is not fp or entry[1] is not self.config or entry[2] is not anchors
        if stale or (fits is not None and not fits(entry)):
            self._graphs.pop(key, None)  # the old graph's memory goes back to the allocator first
            while len(self._graphs) >= MAX_EAGER_GRAPHS:  # the oldest graph makes room
                self._graphs.pop(next(iter(self._graphs)))
            entry = (fp, self.config, anchors, *build())
            self._graphs[key] = entry
        return entry

    def _graphed_scan(self, points: torch.Tensor, fp: FastParams):
        """The whole detection of one scan (voxelization through post-processing) as a CUDA graph
        for eager calls, where :meth:`_eager_graph_applies` (the caller checks): a
        :class:`~pcops.models.graph.GraphedPointPillars` kept per (device, dtype, layout,
        epilogue, cuDNN / TF32 flags). Captured at the first call, and again after the weights,
        the config or the anchors change, or for a scan larger than its capacity (the next power
        of two of points, at least 131,072: a KITTI scan fits). Returns ``(detections,
        dropped_voxels)``, both copied out of the graph (the caller owns them)."""
        device = points.device
        n = points.shape[0]

        def build():
            capacity = max(131_072, 1 << max(n - 1, 0).bit_length())
            graphed = GraphedPointPillars(self, points, max_points=capacity)
            # captured: later calls need the model only for checks and the config; a weak reference
            # keeps the model → graph → model cycle from holding the graph's memory after the model
            graphed.model = weakref.proxy(self)
            return (graphed,)

        entry = self._eager_graph_entry(
            device, 1, fp, "scan", self.anchors(device), build, fits=lambda e: n <= e[3].max_points
        )
        graphed = entry[3]
        det = graphed(points)
        return type(det)(*(t.clone() for t in det)), graphed.dropped_voxels.clone()

    def _backbone_fast(self, x: torch.Tensor, fp: FastParams) -> torch.Tensor:
        """The folded 2-D backbone. ``epilogue`` (a constructor argument) picks how bias + ReLU (+ concat) run on
        CUDA: ``"torch"`` (``F.conv2d`` with bias, ``relu_``, ``torch.cat``), ``"triton"``
        (convolutions without bias, then one Triton pass each that adds the bias, applies ReLU and
        writes the upsampled maps straight into the concatenated output) or ``"cudnn"`` (cuDNN's
        fused convolution + bias + ReLU for the 3×3 convolutions, the Triton pass for the upsampling)."""
        mode = self.epilogue if x.is_cuda else "torch"
        cudnn_ok = torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
        if mode == "auto":
            mode = "cudnn" if cudnn_ok else "triton"
        elif mode == "cudnn" and not cudnn_ok:
            raise RuntimeError("epilogue: 'cudnn' needs cuDNN (torch.backends.cudnn is unavailable or disabled)")
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
                    x = torch.ops.aten.cudnn_convolution_relu(
                        x, c.weight, c.bias, [c.stride] * 2, [c.padding] * 2, [1, 1], 1
                    )
                else:
                    x = bias_relu(F.conv2d(x, c.weight, None, stride=c.stride, padding=c.padding), c.bias)
            up = F.conv_transpose2d(x, de.weight, None, stride=de.stride)
            if out is None:  # the concatenated map, in the layout of the first upsampled one
                total = sum(d.bias.shape[0] for d in fp.deblocks)
                shape = (up.shape[0], total, up.shape[2], up.shape[3])
                if fp.channels_last:
                    out = torch.empty(
                        (shape[0], shape[2], shape[3], shape[1]), device=up.device, dtype=up.dtype
                    ).permute(0, 3, 1, 2)
                else:
                    out = torch.empty(shape, device=up.device, dtype=up.dtype)
            bias_relu(up, de.bias, out, channel_offset=offset)
            offset += de.bias.shape[0]
        return out
