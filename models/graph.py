"""CUDA-graph capture of the PointPillars fast path (points on the GPU → padded detections)."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

import pcops

from .config import PointPillarsConfig
from .outputs import Detections

__all__ = ["GraphedPointPillars", "capture_graph"]


def capture_graph(fn, device: torch.device, warmup: int = 2):
    """``fn()`` run ``warmup`` times on a side stream (Triton compiles, cuDNN plans, workspaces),
    then captured: returns ``(graph, outputs of the captured call)``."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@contextlib.contextmanager
def cudnn_benchmark_mode(on: bool):
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

    def __init__(
        self,
        model,
        example_points: torch.Tensor,
        example_lengths=None,
        max_points: int | None = None,
        cudnn_benchmark: bool = False,
    ):
        from .pointpillars import PointPillars

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
        with cudnn_benchmark_mode(cudnn_benchmark), torch.no_grad():
            self.graph, self.outputs = capture_graph(self._run, self.device, warmup=3)

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
                    raise ValueError(
                        "lengths: give the per-scan counts on the CPU (a list or CPU tensor): "
                        "copying into the graph's buffer needs them on the host"
                    )
                lengths = lengths.tolist()
            segments = [int(v) for v in lengths]
        if len(segments) != self.batch_size:
            raise ValueError(
                f"lengths: expected {self.batch_size} scans (the captured batch size), got {len(segments)}"
            )
        if sum(segments) != points.shape[0]:
            raise ValueError(f"lengths: expected counts summing to {points.shape[0]}, got {sum(segments)}")
        start = 0
        for b, n in enumerate(segments):
            if n > self.max_points:
                raise ValueError(
                    f"points: scan {b} has {n} points, more than the captured capacity "
                    f"max_points={self.max_points}; capture again with a larger max_points"
                )
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


def fixed_voxelize(
    points: torch.Tensor, cfg: PointPillarsConfig, lengths: torch.Tensor, max_voxels: int | None = None
) -> _FixedVoxels:
    """Fixed-capacity voxelization (``B * max_voxels`` rows, default ``max_voxels_test``, padding rows
    last; no host sync)."""
    out = pcops.voxelize(
        points,
        cfg.voxel_size,
        cfg.point_cloud_range,
        cfg.max_points_per_voxel,
        cfg.max_voxels_test if max_voxels is None else max_voxels,
        lengths=lengths,
        pad_to_max=True,
    )
    count = out.num_voxels.sum().to(torch.int32).reshape(1)
    return _FixedVoxels(out.voxels, out.coords, out.num_points, count, out.num_dropped_voxels)
