"""Launcher for ``csrc/fps.cu``: farthest point sampling with thread-block clusters (sm_90+).

Default (``_VARIANT = "tile_async"``, ``fps_tile_*``): a cloud of up to 16,384 points is one CTA
(coordinates in shared memory), larger ones a cluster of 2, 4 or 8 CTAs (up to 131,072 points);
see the ``"tile"`` entries below. Clouds beyond that use the older cluster kernels
(``fps_cluster``): one cluster of ``C`` CTAs (512 threads, ``PPT`` points per thread in registers)
per cloud; ``C`` grows (1, 2, 4, 8, 16) until each thread holds about ``_TARGET_PPT`` points (16 is
a non-portable cluster size, launched with ``cuLaunchKernelEx``; where the device refuses it, 8 is
used, and clouds too large for 8 × 512 × 32 points go to Triton).

Kernel variants (``_VARIANT``; all return identical indices, see ``csrc/fps.cu``):

- ``"keys"``: each thread tracks (value, slot) of its best point; warps reduce 64-bit keys.
- ``"lazy"``: each thread tracks the value only; the lanes holding the warp maximum find its slot.
- ``"flat"``: lazy, and no CTA-level stage: after the cluster barrier every warp reads all warp
  records of the cluster (clusters of ≤ 8 CTAs; 16-CTA clusters use ``"lazy"``).
- ``"pruned"``: the cloud is first sorted along a Morton curve (one Triton kernel and a sort) so
  each warp owns a compact run of points with a bounding box; a warp skips its update whenever
  its box is farther from the new sample than its largest min-distance (exact, see the kernel).
- ``"tile"`` / ``"tile_async"`` (``fps_tile_*``): Morton-sorted as ``"pruned"``, but each CTA keeps
  up to 16,384 points in shared memory with one box per 32-point group, and updates only the
  groups that can change; a cloud of ``N`` points takes ``C = 1, 2, 4, 8`` CTAs (the fewest with
  ``ceil(N / C) <= 16,384``, at least ``_tile_min_cluster``). One exchange per step: C = 1 a
  ``__syncthreads``; C > 1 one cluster barrier (``"tile"``) or st.async stores completing on the
  receivers' mbarriers, no barrier (``"tile_async"``). Clouds over 131,072 points use ``"pruned"``.
  Measured alternatives of the step (benchmark rows, GPU tests; defaults unchanged until measured
  better): ``_tile_opt`` (shuffle-tree reductions, unrolled slot loops, a leader warp reducing the
  records in one CTA), ``_tile_warps`` / ``_tile_groups`` (8 warps x 2 CTAs, 4 warps x 4 CTAs, or
  8 warps of 64 points per lane in one CTA for 16k clouds).
- ``"tile_md"`` (``fps_tile_md[_e]_u<U>_c1``, ``_tile_md_unroll``, ``_tile_md_early``): clouds of up to 16,384 points in one
  CTA with the min-distances in shared memory too (no jump tables on the step: see the kernel's
  notes on where fps_tile's step time goes); larger clouds as ``"tile_async"``, or with
  ``_tile_md_cluster`` as clusters of 2, 4, 8 such CTAs (``fps_tile_md_e_u<U>_c<C>``, st.async exchange).
  ``_tile_md_shape`` (one CTA): ``"l"`` a leader warp reduces the records, ``"w8"`` 8 warps of two boxes
  per lane, ``"w4"`` 4 warps of four, ``"w8l"`` / ``"w4l"`` with the leader; ``"s"`` the step's
  shared-memory addresses computed once per thread (no per-step ``S2UR SR_CgaCtaId``), ``"k"`` the warp
  record rebuilt only when the group of its point was updated, ``"sk"`` both (the default: F1 kernel
  2.47 ms against 2.87 on the H200), ``"esk"`` both with ``_e_``; clusters take the same options
  (``_tile_md_cluster_opt``, ``fps_tile_md_esk_u<U>_c<C>``). ``_tile_md_adaptive``:
  batches of ``U`` groups while at least ``U`` remain, then one at a time (``fps_tile_md_a_u<U>_c1``,
  ``fps_tile_md_e_a_u<U>_c8``).
"""
from __future__ import annotations

import ctypes

import torch
import triton

from .._nvrtc import _cuda, get_kernel, nvrtc

_THREADS = 512
_MAX_PPT = 16
_TARGET_PPT = 4  # points per thread before another CTA joins the cluster
# measured on the H200 (bench_sampling): F1 8 x 16,384 -> 4,096: pruned 23.4 ms, tile (1 CTA per
# cloud) 5.0 ms; F2 120,268 -> 16,384: pruned 49.8 ms, tile 8-CTA cluster barrier 22.0 ms, tile_async
# 20.7 ms. Every variant is tested on the GPU (identical indices). 2026-11-30 04:05 H200 run: "tile_md"
# F1 3.17 ms (u2; tile_async 4.26), F2 17.67 ms with 8-CTA clusters (fps_tile_md_e_u2_c8; tile_async 18.48).
_VARIANT = "tile_md"
_VARIANTS = ("keys", "lazy", "flat", "pruned")  # fps_cluster kernels
_TILE_VARIANTS = ("tile", "tile_async", "tile_md")  # fps_tile kernels; clouds they cannot hold use "pruned"
_TILE_THREADS = 512
_TILE_CAP = 16384  # points per CTA of fps_tile_* (coordinates in shared memory)
_TILE_CLUSTERS = (1, 2, 4, 8)
_tile_min_cluster = 1  # benchmarks may spread small clouds over more CTAs
_TILE_OPTS = ("", "shfl", "unroll", "shfl_unroll")
_TILE_OPTS_C1 = _TILE_OPTS + ("leader", "shfl_leader")  # one CTA: warp 0 alone reduces the records
_tile_opt = ""  # code shape of the fps_tile step (see _tile_kernel_name)
_tile_warps = 16  # warps per CTA (16: 16,384 points per CTA; 8 and 4 compiled for 2 and 4 CTAs)
_TILE_FEW_WARPS = {(8, 2), (4, 4)}  # (warps, cluster) entry points with fewer warps
_tile_groups = 1  # 2: 64 points and two boxes per lane (fps_tile[_<opt>]_w8g2_c1: 8 warps, one CTA)
_TILE_G2_OPTS = ("", "shfl", "leader")
# "tile_md" (fps_tile_md_u<U>_c1, the default since the 04:05 run): clouds of <= 16,384 points, one CTA,
# coordinates and min-distances of 13,824 points in shared memory (the other 2,560 in registers),
# no jump tables on the step, U needed groups updated per batch; larger clouds take tile_md clusters (_tile_md_cluster) or "tile_async"
_TILE_MD_UNROLLS = (1, 2, 4)
# Morton keys as int32 (batch, padding, min(10, (30 - batch bits) // 3) bits per axis; int64 beyond 4,096
# clouds): the sort takes half the radix passes. H200 F1: keys + sort 0.068 vs 0.105 ms in a graph
# (0.114 vs 0.150 eager), the same kernel time on the 9-bit order (2.467 vs 2.462 ms; gpu run of 6c41fed)
_order_keys32 = True
_tile_md_unroll = 1  # H200 F1, plain step: kernel u1 2.86 / 3.22 ms vs u2 2.91 / 3.28 (two runs); "sk": u1 2.465, u2 2.52
_tile_md_early = False  # fps_tile_md_e_*: the warp max without its own redux, the winner by a broadcast load
_tile_md_cluster = True  # clouds over 16,384 points: fps_tile_md_e_u<U>_c<C> clusters instead of "tile_async"
_TILE_MD_CLUSTER_UNROLLS = {2: (2,), 4: (2,), 8: (2, 4)}  # compiled (cluster: unrolls), all "_e_"
_TILE_MD_CLUSTER_OPTS = ("", "sk")  # compiled for every cluster entry: fps_tile_md_e<opt>_u<U>_c<C>
_tile_md_cluster_opt = "sk"  # TMD_SADDR | TMD_KEEP in the cluster kernels too
# one CTA, fewer redux and instructions per step: "l" (a leader warp reduces the records), "w8" / "w4"
# (8 / 4 warps of two / four boxes per lane), "w8l", "w4l"; compiled without "_e_", unrolls {shape: unrolls}
_TILE_MD_SHAPES = {"": _TILE_MD_UNROLLS, "l": (1,), "w8": (1, 2), "w8l": (1, 2), "w4": (2, 4), "w4l": (2, 4),
                   # TMD_SADDR ("s"), TMD_KEEP ("k"), both ("sk"), and both with "_e_" ("esk")
                   "s": (1,), "k": (1,), "sk": (1, 2), "esk": (1,)}
# "sk" (TMD_SADDR | TMD_KEEP, the default since 6c41fed's run): H200 F1 kernel 2.465 ms against 2.865 for
# the plain u1 ("s" alone 2.72, "k" alone 2.61, "sk" u2 2.52, "esk" 2.47)
_tile_md_shape = "sk"
# "_a_" (adaptive batches: U groups while at least U remain, then one at a time): {cluster: unrolls}
_TILE_MD_ADAPTIVE = {1: (2, 4, 8), 8: (4, 8)}
_tile_md_adaptive = False
_TILE_MD_SMEM_POINTS = 27 * 512  # TMD_SMEM_POINTS in csrc/fps.cu
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute
_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID

_max_cluster: dict[int, int] = {}  # device index -> largest cluster size known to launch
_available: dict[int, bool] = {}
last_launch = ""  # which kernel the last call used (diagnostics for tests and benchmarks)


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_byte * 64), ("cluster_dim", ctypes.c_uint * 3)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_byte * 4), ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint),
    ]


def _config(n: int, max_cluster: int, max_ppt: int = _MAX_PPT) -> tuple[int, int] | None:
    """``(cluster size, points per thread)`` for clouds of ``n`` points, or None if too large."""
    cluster = 1
    while cluster < max_cluster and cluster * _THREADS * _TARGET_PPT < n:
        cluster *= 2
    ppt = triton.next_power_of_2(max(1, triton.cdiv(triton.cdiv(n, cluster), _THREADS)))
    return (cluster, ppt) if ppt <= max_ppt else None


def _plan(n: int, index: int) -> tuple[int, int] | None:
    """The configuration for this device: 16-CTA clusters unless refused; then the pruned variant
    still covers 131,072 points with 8 CTAs of 32 points per thread (``fps_pruned_c8_p32``)."""
    max_cluster = _max_cluster.get(index, 16)
    config = _config(n, max_cluster)
    if config is None and max_cluster == 8 and _VARIANT in ("pruned", *_TILE_VARIANTS):
        config = _config(n, 8, max_ppt=32)
    return config


def _kernel_name(variant: str, cluster: int, ppt: int, runtime_shape: bool) -> str:
    """The ``csrc/fps.cu`` entry point: compile-time cluster shape, or runtime-shaped (``_rt_``)."""
    variant = "pruned" if variant in _TILE_VARIANTS else variant  # clouds too large for fps_tile
    if runtime_shape:
        prefix = {"keys": "fps", "lazy": "fps_lazy", "flat": "fps_lazy", "pruned": "fps_pruned"}[variant]
        return f"{prefix}_rt_p{ppt}"
    prefix = {"keys": "fps", "lazy": "fps_lazy", "flat": "fps_flat", "pruned": "fps_pruned"}[variant]
    if cluster > 8 and variant in ("flat", "pruned"):  # compiled for portable cluster sizes only
        prefix = "fps_lazy"
    return f"{prefix}_c{cluster}_p{ppt}"


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
    return _available[index] and _plan(points.shape[1], index) is not None


def _note(what: str) -> None:
    global last_launch
    last_launch = what


def _allow_non_portable(kernel) -> None:
    status = _cuda().cuFuncSetAttribute(kernel._func, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(non-portable cluster size) failed: CUDA error {status}")


class _Inputs:
    """Kernel arguments of one call; the Morton-sorted copy for ``fps_pruned_*`` is made on demand."""

    def __init__(self, points, lengths, start_idx, out, num_samples):
        self.points, self.lengths, self.start_idx, self.out = points, lengths, start_idx, out
        self.num_samples = num_samples
        self.cap = 0  # fps_tile_*: floats per coordinate array in shared memory
        self._sorted = None
        self._order = None

    def args(self, name: str) -> list:
        n = self.points.shape[1]
        tail = [self.lengths, self.start_idx, self.out, ctypes.c_int(n), ctypes.c_int(self.num_samples)]
        if name.startswith("fps_tile"):
            return [self.points, self.order(), *tail, ctypes.c_int(self.cap)]
        if not name.startswith("fps_pruned"):
            return [self.points, *tail]
        return [self.points, *self.sorted(), *tail]

    def order(self) -> torch.Tensor:
        """``(B * N)`` int64: flat indices ``b * N + i`` sorted by cloud, then Morton code, padding
        last in each cloud: ``fps_morton_keys32`` (``_order_keys32``, up to 4,096 clouds: 32-bit keys,
        ``min(10, (30 - batch bits) // 3)`` bits per axis) or ``fps_morton_keys`` (64-bit keys, 10 bits
        per axis), one CTA per cloud, then one stable 1-D sort. H200 F1 (``fps_f1.json``): 0.068 ms in a
        graph with 32-bit keys, 0.103 with 64-bit ones; a per-cloud sort of 32-bit codes (stop 13)
        measured slower than the 64-bit 1-D sort (0.161 vs 0.150 ms eager)."""
        if self._order is None:
            batch, n, _ = self.points.shape
            bits = min(10, (30 - (batch - 1).bit_length()) // 3)
            device = self.points.device
            if _order_keys32 and bits >= 6:  # 32-bit keys: half the radix passes of the sort
                keys = torch.empty(batch * n, dtype=torch.int32, device=device)
                kernel = get_kernel("fps.cu", "fps_morton_keys32", device)
                kernel((batch,), (1024,), [self.points, self.lengths, keys, ctypes.c_int(n), ctypes.c_int(bits)])
            else:
                keys = torch.empty(batch * n, dtype=torch.int64, device=device)
                kernel = get_kernel("fps.cu", "fps_morton_keys", device)
                kernel((batch,), (1024,), [self.points, self.lengths, keys, ctypes.c_int(n)])
            self._order = torch.sort(keys, stable=True).indices
        return self._order

    def sorted(self) -> tuple:
        """``(points in Morton order per cloud, original index of each sorted point (int32))``."""
        if self._sorted is None:
            from ..triton.sampling import _morton_order

            perm = _morton_order(self.points, self.lengths)
            ordered = torch.gather(self.points, 1, perm[..., None].expand(-1, -1, 3)).contiguous()
            self._sorted = (ordered, perm.to(torch.int32))
        return self._sorted


def _launch(inputs: _Inputs, cluster: int, ppt: int, variant: str | None = None) -> None:
    """A kernel whose cluster shape is fixed at compile time (``__cluster_dims__``): cuLaunchKernel."""
    name = _kernel_name(variant or _VARIANT, cluster, ppt, runtime_shape=False)
    kernel = get_kernel("fps.cu", name, inputs.points.device)
    if cluster > 8:
        _allow_non_portable(kernel)
    batch = inputs.points.shape[0]
    kernel((cluster, batch), (_THREADS,), inputs.args(name))
    _note(f"{name} (cuLaunchKernel, compile-time cluster {cluster})")


def _launch_ex(inputs: _Inputs, cluster: int, ppt: int, variant: str | None = None) -> None:
    """The runtime-shaped kernel with a cluster-dimension launch attribute: cuLaunchKernelEx."""
    name = _kernel_name(variant or _VARIANT, cluster, ppt, runtime_shape=True)
    device = inputs.points.device
    kernel = get_kernel("fps.cu", name, device)
    _allow_non_portable(kernel)
    attr = _LaunchAttribute()
    attr.id = _LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.cluster_dim[:] = [cluster, 1, 1]
    config = _LaunchConfig()
    config.grid[:] = [cluster, inputs.points.shape[0], 1]
    config.block[:] = [_THREADS, 1, 1]
    config.shared_mem = 0
    config.stream = torch.cuda.current_stream(device).cuda_stream
    config.attrs = ctypes.pointer(attr)
    config.num_attrs = 1
    # a cluster shape the device cannot hold must fail here, not asynchronously in the launch
    resident = ctypes.c_int(0)
    status = _cuda().cuOccupancyMaxActiveClusters(ctypes.byref(resident), kernel._func, ctypes.byref(config))
    if status != 0 or resident.value < 1:
        raise RuntimeError(f"{name}: {cluster}-CTA clusters cannot be resident (status {status}, {resident.value})")
    holders = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in inputs.args(name)]
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    status = _cuda().cuLaunchKernelEx(ctypes.byref(config), kernel._func, params, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx({name}, cluster {cluster}) failed: CUDA error {status}")
    _note(f"{name} (cuLaunchKernelEx, cluster {cluster}, {resident.value} clusters resident at once)")


def _tile_plan(n: int, min_cluster: int | None = None, warps: int | None = None,
               groups: int | None = None) -> int | None:
    """Cluster size of ``fps_tile_*`` for clouds of ``n`` points (the fewest CTAs of at most
    ``warps * groups * 1,024`` points each, at least ``min_cluster``), or None above 8 such CTAs."""
    lowest = _tile_min_cluster if min_cluster is None else min_cluster
    cap = (_tile_warps if warps is None else warps) * 1024 * (_tile_groups if groups is None else groups)
    for cluster in _TILE_CLUSTERS:
        if cluster >= lowest and triton.cdiv(n, cluster) <= cap:
            return cluster
    return None


def _tile_kernel_name(cluster: int, exchange: str, opt: str | None = None, warps: int | None = None,
                      groups: int | None = None) -> str:
    """``fps_tile[_async][_<opt>]_c<C>``; ``opt`` (default ``_tile_opt``) picks the code shape of the
    step: ``""`` (redux.sync reductions, switch jumps to the slot), ``"shfl"`` (shuffle-tree
    reductions), ``"unroll"`` (unrolled predicated slot loops), ``"shfl_unroll"``; the cluster-barrier
    exchange (C > 1, ``exchange="bar"``) is compiled with the default only."""
    opt = _tile_opt if opt is None else opt
    warps = _tile_warps if warps is None else warps
    groups = _tile_groups if groups is None else groups
    if groups == 2:
        if warps != 8 or cluster != 1 or opt not in _TILE_G2_OPTS:
            raise ValueError("fps_tile with 64 points per lane is compiled for 8 warps, one CTA")
        return f"fps_tile{'_' + opt if opt else ''}_w8g2_c1"
    if warps != 16:  # fewer warps per CTA: compiled for (8, 2) and (4, 4), default code shape
        if (warps, cluster) not in _TILE_FEW_WARPS or opt:
            raise ValueError(f"fps_tile with {warps} warps is compiled for (warps, cluster) {sorted(_TILE_FEW_WARPS)}, "
                             "default code shape, only")
        return f"fps_tile_async_w{warps}_c{cluster}" if exchange == "async" else f"fps_tile_w{warps}_c{cluster}"
    suffix = f"_{opt}" if opt else ""
    if cluster == 1:
        return f"fps_tile{suffix}_c1"  # no cluster: a __syncthreads is the exchange
    if opt not in _TILE_OPTS:
        raise ValueError(f"fps_tile code shape {opt!r} is compiled for one CTA only")
    return f"fps_tile_async{suffix}_c{cluster}" if exchange == "async" else f"fps_tile_c{cluster}"


_tile_smem_set: set = set()


def _smem_kernel(name: str, device, max_bytes: int):
    """``get_kernel("fps.cu", name)`` allowed ``max_bytes`` of dynamic shared memory (set once per
    kernel and device)."""
    kernel = get_kernel("fps.cu", name, device)
    if (name, device) not in _tile_smem_set:
        status = _cuda().cuFuncSetAttribute(kernel._func, _MAX_DYNAMIC_SHARED_SIZE_BYTES, max_bytes)
        if status != 0:
            raise RuntimeError(f"cuFuncSetAttribute({name}, max dynamic shared memory) failed: CUDA error {status}")
        _tile_smem_set.add((name, device))
    return kernel


def _tile_choice(n: int) -> tuple[int, str, int, int] | None:
    """``(cluster, opt, warps, groups)`` of the fps_tile launch for clouds of ``n`` points: the
    configured code shape (``_tile_opt``, ``_tile_warps``, ``_tile_groups``) where it is compiled
    for the cluster size the cloud needs, else the general one (16 warps, one group per lane, the
    code shape without its one-CTA-only parts); None above 131,072 points."""
    cluster = _tile_plan(n)
    if cluster is not None:
        try:
            _tile_kernel_name(cluster, "async")
            return cluster, _tile_opt, _tile_warps, _tile_groups
        except ValueError:
            pass
    cluster = _tile_plan(n, warps=16, groups=1)
    if cluster is None:
        return None
    opt = _tile_opt if cluster == 1 or _tile_opt in _TILE_OPTS else _tile_opt.replace("_leader", "").replace("leader", "")
    return cluster, opt, 16, 1


def _launch_tile(inputs: _Inputs, cluster: int, exchange: str = "bar", opt: str | None = None,
                 warps: int | None = None, groups: int | None = None) -> None:
    """``fps_tile_*`` (compile-time cluster shape, cuLaunchKernel) with ``12 * cap`` bytes of
    dynamic shared memory, ``cap = ceil(N / C)`` rounded up to 32 (at most 196,608 bytes)."""
    warps = _tile_warps if warps is None else warps
    groups = _tile_groups if groups is None else groups
    name = _tile_kernel_name(cluster, exchange, opt, warps, groups)
    kernel = _smem_kernel(name, inputs.points.device, 12 * _TILE_CAP)
    batch, n, _ = inputs.points.shape
    inputs.cap = triton.cdiv(triton.cdiv(n, cluster), 32) * 32
    if inputs.cap > warps * 1024 * groups:
        raise RuntimeError(f"{name}: {inputs.cap} points per CTA exceed {warps} warps")
    kernel((cluster, batch), (32 * warps,), inputs.args(name), shared_mem=12 * inputs.cap)
    _note(f"{name} (cuLaunchKernel, cluster {cluster}, {inputs.cap} points per CTA)")


def _tile_md_kernel_name(unroll: int | None = None, early: bool | None = None, cluster: int = 1,
                         shape: str | None = None, adaptive: bool | None = None, opt: str | None = None) -> str:
    """``fps_tile_md[_e|_<shape>]_u<U>_c<C>`` (defaults ``_tile_md_unroll``, ``_tile_md_early``,
    ``_tile_md_shape``); clusters (C > 1) are compiled with ``_e_``, the unrolls of
    ``_TILE_MD_CLUSTER_UNROLLS`` (else U = 2) and the options of ``_TILE_MD_CLUSTER_OPTS`` (default
    ``_tile_md_cluster_opt``); shapes without ``_e_`` (but "esk")."""
    unroll = _tile_md_unroll if unroll is None else unroll
    early = _tile_md_early if early is None else early
    shape = _tile_md_shape if shape is None else shape
    adaptive = _tile_md_adaptive if adaptive is None else adaptive
    if adaptive and not shape and unroll in _TILE_MD_ADAPTIVE.get(cluster, ()):
        return f"fps_tile_md_a_u{unroll}_c1" if cluster == 1 else f"fps_tile_md_e_a_u{unroll}_c{cluster}"
    if adaptive and unroll not in _TILE_MD_UNROLLS:  # not compiled for this shape / cluster: the largest below
        unroll = max(u for u in _TILE_MD_UNROLLS if u <= unroll)
    if unroll not in _TILE_MD_UNROLLS:
        raise ValueError(f"fps_tile_md is compiled for unroll in {_TILE_MD_UNROLLS}, got {unroll}")
    if shape not in _TILE_MD_SHAPES:
        raise ValueError(f"fps_tile_md shapes are {sorted(_TILE_MD_SHAPES)}, got {shape!r}")
    if cluster == 1 and shape:
        unroll = unroll if unroll in _TILE_MD_SHAPES[shape] else _TILE_MD_SHAPES[shape][0]
        return f"fps_tile_md_{shape}_u{unroll}_c1"
    if cluster == 1:
        return f"fps_tile_md{'_e' if early else ''}_u{unroll}_c1"
    if cluster not in _TILE_MD_CLUSTER_UNROLLS:
        raise ValueError(f"fps_tile_md is compiled for clusters of {sorted(_TILE_MD_CLUSTER_UNROLLS)} CTAs, got {cluster}")
    unroll = unroll if unroll in _TILE_MD_CLUSTER_UNROLLS[cluster] else 2
    opt = _tile_md_cluster_opt if opt is None else opt
    if opt not in _TILE_MD_CLUSTER_OPTS:
        raise ValueError(f"fps_tile_md clusters are compiled with options {_TILE_MD_CLUSTER_OPTS}, got {opt!r}")
    return f"fps_tile_md_e{opt}_u{unroll}_c{cluster}"


def _launch_tile_md(inputs: _Inputs, unroll: int | None = None, early: bool | None = None, cluster: int = 1,
                    shape: str | None = None, adaptive: bool | None = None, opt: str | None = None) -> None:
    """``fps_tile_md[_e]_u<U>_c<C>`` (one CTA, or a cluster of ``C`` CTAs, per cloud of at most
    ``C * 16,384`` points; cuLaunchKernel) with ``16 * cap`` bytes of dynamic shared memory,
    ``cap = min(ceil(N / C) rounded up to 32, 13,824)``."""
    name = _tile_md_kernel_name(unroll, early, cluster, shape, adaptive, opt)
    batch, n, _ = inputs.points.shape
    if triton.cdiv(n, cluster) > _TILE_CAP:
        raise RuntimeError(f"fps_tile_md holds at most {_TILE_CAP} points per CTA, got {n} points for {cluster}")
    kernel = _smem_kernel(name, inputs.points.device, 16 * _TILE_MD_SMEM_POINTS)
    inputs.cap = min(triton.cdiv(triton.cdiv(n, cluster), 32) * 32, _TILE_MD_SMEM_POINTS)
    threads = 32 * (8 if "_w8" in name else 4 if "_w4" in name else 16)
    kernel((cluster, batch), (threads,), inputs.args(name), shared_mem=16 * inputs.cap)
    _note(f"{name} (cuLaunchKernel, cluster {cluster}, {triton.cdiv(n, cluster)} points per CTA)")


def tile_md_stats(points: torch.Tensor, num_samples: int) -> tuple[dict, torch.Tensor]:
    """Counters of ``fps_tile_md_stats_u1_c1`` (a diagnostic for the benchmark's notes) on ``points
    (B, N <= 16,384, 3)`` float32 CUDA, all points valid, start 0: group updates per step (per CTA,
    and per warp: mean and root mean square), update batches, record rebuilds, tie paths; and the
    indices it returned (B, M). Host sync."""
    batch, n, _ = points.shape
    if n > _TILE_CAP:
        raise ValueError(f"tile_md_stats: at most {_TILE_CAP} points per cloud, got {n}")
    lengths = torch.full((batch,), n, dtype=torch.int64, device=points.device)
    starts = torch.zeros(batch, dtype=torch.int64, device=points.device)
    out = torch.full((batch, num_samples), -1, dtype=torch.int64, device=points.device)
    inputs = _Inputs(points, lengths, starts, out, num_samples)
    name = "fps_tile_md_stats_u1_c1"
    kernel = _smem_kernel(name, points.device, 16 * _TILE_MD_SMEM_POINTS)
    inputs.cap = min(triton.cdiv(n, 32) * 32, _TILE_MD_SMEM_POINTS)
    stats = torch.zeros(8, dtype=torch.int64, device=points.device)
    kernel((1, batch), (_TILE_THREADS,), [*inputs.args(name), stats], shared_mem=16 * inputs.cap)
    c = stats.tolist()
    steps = max(1, c[6])  # summed over the CTAs
    warp_steps = steps * 16
    return {
        "groups updated per step per CTA (of 512)": round(c[0] / steps, 2),
        "groups updated per warp-step: mean": round(c[0] / warp_steps, 3),
        "groups updated per warp-step: rms": round((c[2] / warp_steps) ** 0.5, 3),
        "warp-steps without update": round(c[7] / warp_steps, 3),
        "record rebuilds per step per CTA (of 16)": round(c[3] / steps, 2),
        "record tie paths": c[4], "reduction tie paths (per warp)": c[5],
    }, out


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
    config = _plan(n, index) if batch <= 65535 else None
    inputs = _Inputs(points, lengths, start_idx, out, num_samples)
    if _VARIANT == "tile_md" and batch <= 65535:
        cluster = _tile_plan(n, warps=16, groups=1)
        if cluster is not None and (cluster == 1 or _tile_md_cluster):
            try:
                _launch_tile_md(inputs, cluster=cluster)
                return out
            except (RuntimeError, ValueError):  # launch refused or shape not compiled: the fps_tile kernels
                pass
    if _VARIANT in _TILE_VARIANTS and batch <= 65535:
        choice = _tile_choice(n)
        if choice is not None:
            cluster, opt, warps, groups = choice
            exchange = "bar" if _VARIANT == "tile" else "async"  # tile_md: larger clouds as tile_async
            try:
                _launch_tile(inputs, cluster, exchange, opt, warps, groups)
                return out
            except RuntimeError:  # launch refused (e.g. cluster shape or shared memory): the cluster kernels
                pass
    if config is not None and config[0] > 8:
        # non-portable cluster size: the launch-attribute path, then the compile-time shape
        for launch in (_launch_ex, _launch):
            try:
                launch(inputs, *config)
                return out
            except RuntimeError:
                pass
        _max_cluster[index] = 8  # the device refuses 16-CTA clusters: stay with portable sizes
        config = _plan(n, index)
    if config is None:
        from ..triton import sampling as tri

        _note("triton fallback")
        return tri.farthest_point_sample(points, lengths, start_idx, num_samples)
    _launch(inputs, *config)
    return out


def probe(device=None) -> dict:
    """Cycles per dependent operation on the fps_tile step's path, measured by ``fps_probe`` (one CTA
    of 512 threads; a second launch as a 2-CTA cluster for the cluster barrier), and the SM clock.
    A diagnostic for the benchmark's notes."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    names = ("redux.sync", "shfl", "ballot", "shared load", "__syncthreads", "switch jump", "cluster barrier")
    out = torch.zeros(16, dtype=torch.int64, device=device)
    get_kernel("fps.cu", "fps_probe", device)((1,), (512,), [out])
    first = out.clone()
    get_kernel("fps.cu", "fps_probe_c2", device)((2,), (512,), [out])
    values = first.tolist()
    values[6] = int(out[6])
    result = {f"{name} cycles": values[i] for i, name in enumerate(names)}
    result["SM clock MHz"] = values[7] / 1000
    return result
