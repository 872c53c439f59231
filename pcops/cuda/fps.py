"""Launcher for ``csrc/fps.cu``: farthest point sampling with thread-block clusters (sm_90+).

A cloud of up to 16,384 points is one CTA (``fps_tile_md_sk_u1_c1``), a larger one a cluster of
2, 4 or 8 CTAs (``fps_tile_md_esk_u2_c<C>``, up to 131,072 points); each cloud is first ordered
along a Morton curve (``fps_morton_keys32`` / ``fps_morton_keys`` and one stable sort). The
kernels and their design are described in ``csrc/fps.cu``; the measurements that chose them
(and the variants removed) are in ``benchmarks/NOTES.md``.
"""

from __future__ import annotations

import ctypes

import torch

from .. import _backend
from .._nvrtc import _cuda, get_kernel, nvrtc

_THREADS = 512  # 16 warps per CTA (TMD_WARPS in csrc/fps.cu)
_CTA_POINTS = 16384  # points per CTA: 32 slots per lane
CLUSTERS = (1, 2, 4, 8)  # CTAs per cloud (portable cluster sizes)
MAX_POINTS = CLUSTERS[-1] * _CTA_POINTS
_MAX_BATCH = 65535  # clouds are grid.y
_SMEM_POINTS = 27 * 512  # TMD_SMEM_POINTS: points per CTA in shared memory, 16 bytes each
_SMEM_BYTES = 16 * _SMEM_POINTS
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute
_MAX_SHARED_PER_BLOCK_OPTIN = 97  # CUdevice_attribute
_KEYS32_MIN_BITS = 6  # coarser 32-bit Morton cells than this: 64-bit keys (more than 4,096 clouds)

_device_reason: dict[int, str | None] = {}
_smem_set: set = set()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cluster_size(n: int) -> int | None:
    """CTAs per cloud of ``n`` points: the fewest of ``CLUSTERS`` with at most 16,384 points each."""
    for cluster in CLUSTERS:
        if _cdiv(n, cluster) <= _CTA_POINTS:
            return cluster
    return None


def kernel_name(cluster: int) -> str:
    """The step kernel for ``cluster`` CTAs per cloud."""
    return "fps_tile_md_sk_u1_c1" if cluster == 1 else f"fps_tile_md_esk_u2_c{cluster}"


def _device_unsupported(index: int) -> str | None:
    """Why the kernels cannot run on device ``index`` (None: they can); cached per device."""
    if index not in _device_reason:
        reason = None
        major, minor = torch.cuda.get_device_capability(index)
        if (major, minor) < (9, 0):
            reason = f"needs sm_90 or newer (thread-block clusters), got sm_{major}{minor}"
        else:
            try:
                nvrtc()
            except RuntimeError as e:
                reason = str(e)
        if reason is None:
            optin = ctypes.c_int(0)
            status = _cuda().cuDeviceGetAttribute(ctypes.byref(optin), _MAX_SHARED_PER_BLOCK_OPTIN, index)
            if status != 0 or optin.value < _SMEM_BYTES:
                reason = f"needs {_SMEM_BYTES} bytes of shared memory per CTA, the device allows {optin.value}"
        _device_reason[index] = reason
    return _device_reason[index]


def unsupported_reason(points: torch.Tensor) -> str | None:
    """Why ``points (B, N, 3)`` (a CUDA tensor) cannot be sampled here (None: it can)."""
    batch, n, _ = points.shape
    if n > MAX_POINTS:
        return f"at most {MAX_POINTS} points per cloud (8 CTAs of {_CTA_POINTS}), got {n}"
    if batch > _MAX_BATCH:
        return f"at most {_MAX_BATCH} clouds, got {batch}"
    index = points.device.index if points.device.index is not None else torch.cuda.current_device()
    return _device_unsupported(index)


def supported(points: torch.Tensor) -> bool:
    """Whether the CUDA kernel can sample ``points (B, N, 3)`` here (sm_90+, NVRTC, N ≤ 131,072)."""
    return unsupported_reason(points) is None


def order(points: torch.Tensor, lengths: torch.Tensor, keys32: bool | None = None) -> torch.Tensor:
    """``(B * N)`` int64: flat indices ``b * N + i`` sorted by cloud, then Morton code, padding last.

    ``keys32`` (default: where the batch leaves at least 6 bits per axis, i.e. up to 4,096
    clouds): 32-bit keys with ``min(10, (30 - batch bits) // 3)`` bits per axis, so the sort takes
    half the radix passes of the 64-bit keys (10 bits per axis). One CTA per cloud, one sort.
    """
    batch, n, _ = points.shape
    bits = min(10, (30 - (batch - 1).bit_length()) // 3)
    device = points.device
    if keys32 is None:
        keys32 = bits >= _KEYS32_MIN_BITS
    if keys32:
        if bits < _KEYS32_MIN_BITS:
            raise ValueError(f"keys32: {batch} clouds leave {bits} bits per axis, need {_KEYS32_MIN_BITS}")
        keys = torch.empty(batch * n, dtype=torch.int32, device=device)
        get_kernel("fps.cu", "fps_morton_keys32", device)(
            (batch,), (1024,), [points, lengths, keys, ctypes.c_int(n), ctypes.c_int(bits)]
        )
    else:
        keys = torch.empty(batch * n, dtype=torch.int64, device=device)
        get_kernel("fps.cu", "fps_morton_keys", device)((batch,), (1024,), [points, lengths, keys, ctypes.c_int(n)])
    return torch.sort(keys, stable=True).indices


def _step_kernel(name: str, device):
    """The step kernel, allowed the dynamic shared memory it needs (set once per kernel and device)."""
    kernel = get_kernel("fps.cu", name, device)
    if (name, device) not in _smem_set:
        status = _cuda().cuFuncSetAttribute(kernel._func, _MAX_DYNAMIC_SHARED_SIZE_BYTES, _SMEM_BYTES)
        if status != 0:
            raise RuntimeError(f"cuFuncSetAttribute({name}, max dynamic shared memory) failed: CUDA error {status}")
        _smem_set.add((name, device))
    return kernel


def farthest_point_sample(
    points: torch.Tensor, lengths: torch.Tensor, start_idx: torch.Tensor, num_samples: int
) -> torch.Tensor:
    """Same contract as ``pcops.triton.fps.farthest_point_sample``; no host synchronisation.

    Args:
        points: ``(B, N, 3)`` float32 contiguous CUDA; lengths, start_idx: ``(B,)`` int64.
    Returns:
        ``(B, M)`` int64, −1 padded.
    Raises:
        RuntimeError: where the kernel cannot run (``unsupported_reason``).
    """
    batch, n, _ = points.shape
    out = torch.full((batch, num_samples), -1, dtype=torch.int64, device=points.device)
    if batch == 0 or n == 0:
        return out
    reason = unsupported_reason(points)
    if reason is not None:
        raise RuntimeError(f"backend 'cuda': farthest_point_sample cannot run here: {reason}")
    cluster = cluster_size(n)
    name = kernel_name(cluster)
    kernel = _step_kernel(name, points.device)
    # floats per shared coordinate array: this CTA's share, rounded up to whole 32-point groups
    cap = min(_cdiv(_cdiv(n, cluster), 32) * 32, _SMEM_POINTS)
    args = [
        points,
        order(points, lengths),
        lengths,
        start_idx,
        out,
        ctypes.c_int(n),
        ctypes.c_int(num_samples),
        ctypes.c_int(cap),
    ]
    kernel((cluster, batch), (_THREADS,), args, shared_mem=16 * cap)
    _backend.log_kernel("farthest_point_sample", f"{name} (cluster {cluster}, {_cdiv(n, cluster)} points per CTA)")
    return out
