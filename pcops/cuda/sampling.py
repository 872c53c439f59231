"""Launcher for ``csrc/fps.cu``: farthest point sampling with thread-block clusters (sm_90+).

One cluster of ``C`` CTAs (512 threads, ``PPT`` points per thread in registers) samples one
cloud; ``C`` grows (1, 2, 4, 8, 16) until each thread holds about ``_TARGET_PPT`` points, so a
16k-point cloud uses 8 SMs and a 120k-point scan 16 (a non-portable cluster size: where the
device refuses it, 8 is used, and clouds too large for 8 × 512 × 16 points go to Triton).
"""
from __future__ import annotations

import ctypes

import torch
import triton

from .._nvrtc import _cuda, get_kernel, nvrtc

_THREADS = 512
_MAX_PPT = 16
_TARGET_PPT = 4  # points per thread before another CTA joins the cluster
# kernel variant of csrc/fps.cu (identical results): "keys" tracks (value, slot) per point and
# reduces 64-bit keys; "lazy" tracks the value only and looks the slot up afterwards; "flat" is
# lazy with no CTA-level stage (each warp reads every warp's record of the cluster; clusters of
# at most 8 CTAs, larger ones use "lazy")
_VARIANT = "keys"
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute
_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_byte * 64), ("cluster_dim", ctypes.c_uint * 3)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_byte * 4), ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint),
    ]
_max_cluster: dict[int, int] = {}  # device index -> largest cluster size known to launch
_available: dict[int, bool] = {}
last_launch = ""  # which kernel the last call used (diagnostics for tests and benchmarks)


def _config(n: int, max_cluster: int) -> tuple[int, int] | None:
    """``(cluster size, points per thread)`` for clouds of ``n`` points, or None if too large."""
    cluster = 1
    while cluster < max_cluster and cluster * _THREADS * _TARGET_PPT < n:
        cluster *= 2
    ppt = triton.next_power_of_2(max(1, triton.cdiv(triton.cdiv(n, cluster), _THREADS)))
    return (cluster, ppt) if ppt <= _MAX_PPT else None


def fps_supported(points: torch.Tensor) -> bool:
    """Whether the cluster kernel can sample ``points (B, N, 3)`` here (sm_90+, NVRTC, N ≤ 131,072)."""
    index = points.device.index if points.device.index is not None else torch.cuda.current_device()
    if index not in _available:
        ok = torch.cuda.get_device_capability(index) >= (9, 0)
        if ok:
            try:
                nvrtc()
            except RuntimeError:
                ok = False
        _available[index] = ok
    if points.shape[0] > 65535:  # clouds are grid.y
        return False
    return _available[index] and _config(points.shape[1], _max_cluster.get(index, 16)) is not None


def _allow_non_portable(kernel) -> None:
    status = _cuda().cuFuncSetAttribute(kernel._func, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(non-portable cluster size) failed: CUDA error {status}")


def _launch(points, lengths, start_idx, out, num_samples, cluster, ppt):
    """A kernel whose cluster shape is fixed at compile time (``__cluster_dims__``): cuLaunchKernel."""
    prefix = {"keys": "fps", "lazy": "fps_lazy", "flat": "fps_flat" if cluster <= 8 else "fps_lazy"}[_VARIANT]
    name = f"{prefix}_c{cluster}_p{ppt}"
    kernel = get_kernel("fps.cu", name, points.device)
    if cluster > 8:
        _allow_non_portable(kernel)
    batch, n, _ = points.shape
    kernel((cluster, batch), (_THREADS,), [points, lengths, start_idx, out, ctypes.c_int(n), ctypes.c_int(num_samples)])
    _note(f"{name} (cuLaunchKernel, compile-time cluster {cluster})")


def _note(what: str) -> None:
    global last_launch
    last_launch = what


def _launch_ex(points, lengths, start_idx, out, num_samples, cluster, ppt):
    """The runtime-shaped kernel with a cluster-dimension launch attribute: cuLaunchKernelEx."""
    name = f"{'fps' if _VARIANT == 'keys' else 'fps_lazy'}_rt_p{ppt}"
    kernel = get_kernel("fps.cu", name, points.device)
    _allow_non_portable(kernel)
    batch, n, _ = points.shape
    attr = _LaunchAttribute()
    attr.id = _LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.cluster_dim[:] = [cluster, 1, 1]
    config = _LaunchConfig()
    config.grid[:] = [cluster, batch, 1]
    config.block[:] = [_THREADS, 1, 1]
    config.shared_mem = 0
    config.stream = torch.cuda.current_stream(points.device).cuda_stream
    config.attrs = ctypes.pointer(attr)
    config.num_attrs = 1
    holders = [ctypes.c_void_p(t.data_ptr()) for t in (points, lengths, start_idx, out)]
    holders += [ctypes.c_int(n), ctypes.c_int(num_samples)]
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    # a cluster shape the device cannot hold must fail here, not asynchronously in the launch
    resident = ctypes.c_int(0)
    status = _cuda().cuOccupancyMaxActiveClusters(ctypes.byref(resident), kernel._func, ctypes.byref(config))
    if status != 0 or resident.value < 1:
        raise RuntimeError(f"{name}: {cluster}-CTA clusters cannot be resident (status {status}, {resident.value})")
    status = _cuda().cuLaunchKernelEx(ctypes.byref(config), kernel._func, params, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx({name}, cluster {cluster}) failed: CUDA error {status}")
    _note(f"{name} (cuLaunchKernelEx, cluster {cluster}, {resident.value} clusters resident at once)")


def farthest_point_sample(
    points: torch.Tensor, lengths: torch.Tensor, start_idx: torch.Tensor, num_samples: int
) -> torch.Tensor:
    """Same contract as ``pcops.triton.sampling.farthest_point_sample``; no host synchronisation.

    Args:
        points: ``(B, N, 3)`` float32 contiguous; lengths, start_idx: ``(B,)`` int64.
    Returns:
        ``(B, M)`` int64, −1 padded.
    """
    batch, n, _ = points.shape
    out = torch.full((batch, num_samples), -1, dtype=torch.int64, device=points.device)
    if batch == 0 or n == 0:
        return out
    index = points.device.index if points.device.index is not None else torch.cuda.current_device()
    config = _config(n, _max_cluster.get(index, 16)) if batch <= 65535 else None
    if config is not None and config[0] > 8:
        # non-portable cluster size: the launch-attribute path, then the compile-time shape
        for launch in (_launch_ex, _launch):
            try:
                launch(points, lengths, start_idx, out, num_samples, *config)
                return out
            except RuntimeError:
                pass
        _max_cluster[index] = 8  # the device refuses 16-CTA clusters: stay with portable sizes
        config = _config(n, 8)
    if config is None:
        from ..triton import sampling as tri

        _note("triton fallback")
        return tri.farthest_point_sample(points, lengths, start_idx, num_samples)
    _launch(points, lengths, start_idx, out, num_samples, *config)
    return out
