"""Voxelization: hard (PointPillars/SECOND, capped, first come first served) and dynamic, plus
per-voxel reduction of point features.

Deterministic at hash-table speed: on the GPU an open-addressing hash table on the packed
voxel key gives every occupied voxel its first point (``atomic_max`` on an encoded index);
voxels are numbered in first-point order by a prefix sum over "first point of its voxel"
flags (a single-pass decoupled look-back scan, segmented by sample), and each voxel keeps its
``max_points_per_voxel`` lowest point indices, in one of two layouts (``voxelize(mode=...)``):
CSR segments (one atomic per point counts each voxel's points, one ``torch.cumsum`` and a
scatter kernel lay them out, the rows kernel sorts each segment) or per-voxel lists filled by
``atomic_max`` insertion, whose final state does not depend on the order of the atomics (see
``pcops.triton.voxelize``). Output is bit-identical to the CPU reference
(``pcops/reference/voxelize.py``) and run to run.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from . import _backend, _checks, _library, _native, cpu
from .reference import voxelize as _ref

__all__ = ["voxelize", "dynamic_voxelize", "voxel_reduce", "Voxels", "DynamicVoxels"]

_REDUCE = ("mean", "max", "sum")
_MODES = ("auto", "csr", "lists")
_SUPPORTED = ("auto", "triton", "reference")


class Voxels(NamedTuple):
    """Result of ``pcops.voxelize``.

    Attributes:
        voxels: ``(M, max_points_per_voxel, C)`` of ``points.dtype``: the points of each voxel in
            point order, zero-padded after ``num_points``.
        coords: ``(M, 4)`` int32 ``(batch, z, y, x)`` voxel indices (OpenPCDet's ``voxel_coords``).
        num_points: ``(M,)`` int32, points stored per voxel (``1 .. max_points_per_voxel``).
        point_to_voxel: ``(N,)`` int64 row of each point in ``voxels``; −1 when the point is out
            of range or was dropped by a cap.
        num_voxels: ``(B,)`` int64 voxels kept per sample (``M = num_voxels.sum()``).
        num_dropped_points: ``(B,)`` int64 in-range points not stored (their voxel was dropped, or
            the voxel already held ``max_points_per_voxel`` earlier points).
        num_dropped_voxels: ``(B,)`` int64 occupied voxels dropped by ``max_voxels``.
    """

    voxels: torch.Tensor
    coords: torch.Tensor
    num_points: torch.Tensor
    point_to_voxel: torch.Tensor
    num_voxels: torch.Tensor
    num_dropped_points: torch.Tensor
    num_dropped_voxels: torch.Tensor


class DynamicVoxels(NamedTuple):
    """Result of ``pcops.dynamic_voxelize``.

    Attributes:
        point_to_voxel: ``(N,)`` int64 voxel row of each point, −1 out of range.
        coords: ``(M, 4)`` int32 ``(batch, z, y, x)`` of the occupied voxels, in first-point order.
        num_voxels: ``(B,)`` int64 occupied voxels per sample.
    """

    point_to_voxel: torch.Tensor
    coords: torch.Tensor
    num_voxels: torch.Tensor


def _resolve(backend, points: torch.Tensor, op: str = "voxelize") -> str:
    """``"triton"``, ``"cpu"`` or ``"reference"``. ``"auto"``: Triton on CUDA tensors (every float
    dtype: the coordinates are compared in float32 on every path, so there is nothing for the
    reference to do better), on the CPU ``"cpu"``: the numba hash-map pass of
    ``pcops.cpu.voxelize`` where numba imports, else the reference (every float dtype too).
    ``"torch"`` is the former name of ``"reference"``."""
    if backend == "torch":
        backend = "reference"
    backend = _backend.check(backend, op, _SUPPORTED)
    if backend == "reference":
        return "reference"
    on_cuda = points.device.type == "cuda"
    if backend == "triton" and not on_cuda:
        raise ValueError(
            f"backend: 'triton' runs on CUDA tensors only, got points on {points.device}; "
            "use backend='auto' or 'reference'"
        )
    return "triton" if on_cuda else "cpu"


_CHECKED_GRIDS: dict = {}  # (voxel_size, point_cloud_range) tuples of Python numbers -> _check_grid's result


def _check_grid(voxel_size, point_cloud_range) -> tuple[tuple, tuple, int]:
    """``(voxel_size, point_cloud_range)`` as float tuples and the grid's cell count, validated."""
    vs = _checks.check_floats("voxel_size", voxel_size, 3, positive=True)
    pcr = _checks.check_floats("point_cloud_range", point_cloud_range, 6)
    if not all(pcr[i] < pcr[i + 3] for i in range(3)):
        raise ValueError(f"point_cloud_range: expected min < max on every axis, got {pcr}")
    if not all(v == v and abs(v) != float("inf") for v in vs + pcr):
        raise ValueError(f"voxel_size/point_cloud_range: expected finite values, got {vs}, {pcr}")
    grid = _ref.grid_size(vs, pcr)
    return vs, pcr, grid[0] * grid[1] * grid[2]


def _check_common(points, voxel_size, point_cloud_range, lengths, pad_to_max):
    """The arguments voxelize and dynamic_voxelize share → ``(voxel_size, point_cloud_range)`` tuples."""
    if not isinstance(pad_to_max, bool):
        raise TypeError(f"pad_to_max: expected a bool, got {type(pad_to_max).__name__}")
    _checks.check_tensor("points", points, dtypes=_checks.FLOAT_DTYPES, ndim=2, min_last_dim=3)
    key = (voxel_size, point_cloud_range) if type(voxel_size) is tuple and type(point_cloud_range) is tuple else None
    checked = _CHECKED_GRIDS.get(key) if key is not None else None
    if checked is None:
        checked = _check_grid(voxel_size, point_cloud_range)
        if key is not None and all(type(v) is float or type(v) is int for v in key[0] + key[1]):
            if len(_CHECKED_GRIDS) >= 64:  # a few grids per program: a small memo of validated ones
                _CHECKED_GRIDS.clear()
            _CHECKED_GRIDS[key] = checked
    vs, pcr, cells = checked
    if lengths is not None:
        _checks.check_lengths("lengths", lengths, points.shape[0], points.device)
        if lengths.numel() == 0:
            raise ValueError("lengths: expected at least one sample, got an empty tensor")
    batch = 1 if lengths is None else max(lengths.numel(), 1)
    if cells * batch >= 2**62:
        grid = _ref.grid_size(vs, pcr)
        raise ValueError(f"voxel_size: grid {grid} × batch {batch} is too large for an int64 voxel key")
    return vs, pcr


def voxelize(
    points: torch.Tensor,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    max_points_per_voxel: int,
    max_voxels: int,
    lengths: torch.Tensor | None = None,
    *,
    pad_to_max: bool = False,
    mode: str = "auto",
    backend: str = "auto",
) -> Voxels:
    """Hard voxelization, first come first served (PointPillars, Lang et al. 2019; SECOND, Yan et al. 2018).

    Args:
        points: ``(N, C ≥ 3)`` float32/float16/bfloat16/float64, ``x, y, z`` in metres then any
            features (all ``C`` channels are copied into ``voxels``).
        voxel_size: ``(vx, vy, vz)`` metres, each > 0.
        point_cloud_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` metres, min < max. The
            grid is ``round((max - min) / voxel_size)`` cells per axis (as spconv and mmcv).
        max_points_per_voxel: ≥ 1; a voxel keeps its first points in point order.
        max_voxels: ≥ 1, **per sample**; the first voxels (by their first point) are kept.
        lengths: optional ``(B,)`` int32/int64 on the points' device: the points are a packed batch,
            sample ``b`` being the contiguous run of ``lengths[b]`` points. On the CPU the sum
            must be ``N`` (``ValueError``); on CUDA it is not checked (that would need a host
            sync): points past the sum are treated as out of range. ``None``: one sample.
        pad_to_max: the fixed-capacity form for CUDA-graph capture / ``torch.compile`` with
            static shapes: ``voxels``, ``coords`` and ``num_points`` get ``B * max_voxels`` rows;
            the ``M = num_voxels.sum()`` real rows come first, in the same order as the
            variable-size form (``out.voxels[:M]`` equals it), then padding rows with
            ``voxels`` 0, ``coords`` −1 (all four) and ``num_points`` 0. No host sync.
        mode: how the GPU path keeps each voxel's first points (same output): ``"auto"``
            (default: ``"csr"`` for samples below 2,000,000 points on average, as scans are,
            ``"lists"`` from there), ``"csr"`` (per-voxel CSR segments sorted in the rows kernel:
            fastest on scans, but a voxel of ``c`` points costs its rows program ``c / 32`` chunk
            loads) or ``"lists"`` (per-voxel ranked lists: no cost in the voxel size; use it for
            clouds with very dense voxels, see below). Ignored by the reference.
        backend: ``"auto"`` (default: Triton on CUDA tensors, for every float dtype; on CPU
            tensors the one-pass hash map of ``pcops.cpu.voxelize`` where numba is installed,
            else the reference), ``"triton"`` (CUDA tensors only) or ``"reference"`` (the
            plain-torch reference on any device: sort-based, same output, several host syncs;
            ``"torch"`` is accepted as its former name). There is no ``"cuda"`` (CUDA C++)
            implementation: it raises ``ValueError``.

    Returns:
        ``Voxels(voxels, coords, num_points, point_to_voxel, num_voxels, num_dropped_points,
        num_dropped_voxels)`` (see ``Voxels``). Rows are ordered by the first in-range point of
        each voxel, so batch-major (``coords[:, 0]`` non-decreasing).

    Semantics (identical on every device, and to spconv's CPU voxelizer / mmcv's deterministic
    mode): a point is in range iff ``range_min <= p < range_max`` (x, y, z, compared in
    float32) and its cell ``floor((p - range_min) / voxel_size)`` (float32, IEEE division)
    satisfies ``0 <= cell < grid``. NaN or ±inf coordinates are out of range. fp16/bf16 (and
    float64) coordinates are converted to float32 for these computations.

    Overflow is never silent: ``num_dropped_points`` / ``num_dropped_voxels`` count what the caps
    dropped (tensors: reading them is the caller's choice of host sync), and dropped points have
    ``point_to_voxel == -1``.

    Determinism and syncs: bit-identical output run to run and between the CPU reference and
    the GPU path. The variable-size form syncs the host once (to learn ``M``); with
    ``pad_to_max=True`` there is no host sync. GPU: one fill, the main Triton kernel, a
    ``torch.cumsum`` of the per-voxel counts, a scatter and a rows kernel (``mode="lists"``: one
    fill plus 2 Triton launches).

    Cost of very dense voxels: in the CSR layout the GPU path's time grows with the largest
    voxel's point count: a voxel holding 10^5 points (for example zero padding that lies inside
    the range) adds about 1.5 ms, 10^6 points about 14 ms, against about 0.05 ms for a KITTI scan
    (figures in ``benchmarks/NOTES.md``). Drop such points first, or pass ``mode="lists"`` (0.19 /
    1.04 ms for the same clouds, 0.09 ms for the scan alone).

    Host path: on CUDA a call in the CSR layout (``mode`` ``"auto"`` at scan sizes, or ``"csr"``) is
    taken by the native host path (``pcops._native``: the allocations, the launches and the one host
    sync in C++, once its build is loaded and the grid and caps have run once): the same kernels
    with the same arguments, the same voxels.

    Not differentiable: ``voxels`` carries no gradient to ``points`` (for learned per-point
    features use ``dynamic_voxelize`` + ``voxel_reduce``, which has a backward).

    Example:
        >>> v = pcops.voxelize(points, voxel_size=(0.16, 0.16, 4.0),        # PointPillars, KITTI
        ...                    point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1),
        ...                    max_points_per_voxel=32, max_voxels=40000)
        >>> v.voxels.shape, v.coords.shape                                  # (M, 32, C), (M, 4)
    """
    compiling = torch.compiler.is_compiling()
    args = (points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths, pad_to_max, mode, backend)
    host = None if compiling else _native.serves("voxelize")  # takes what it can (pcops._native)
    if host is not None:
        out = host.hv_forward(*args)
        if out is not None:
            return Voxels(*out)
    vs, pcr = _check_common(points, voxel_size, point_cloud_range, lengths, pad_to_max)
    max_points_per_voxel = _checks.check_int("max_points_per_voxel", max_points_per_voxel, min_value=1)
    max_voxels = _checks.check_int("max_voxels", max_voxels, min_value=1)
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    _resolve(backend, points)  # early, named errors (the registered kernels resolve again)
    out = _library.call(
        torch.ops.pcops.voxelize.default,
        points.detach().contiguous(),
        lengths,
        list(vs),
        list(pcr),
        max_points_per_voxel,
        max_voxels,
        pad_to_max,
        backend,
        mode,
    )
    if not compiling:  # (after a registration of this call's class: pcops._native.check)
        _native.check("voxelize", lambda: _native.MODULE.hv_forward(*args), out)
    return Voxels(*out)


def dynamic_voxelize(
    points: torch.Tensor,
    voxel_size: Sequence[float],
    point_cloud_range: Sequence[float],
    lengths: torch.Tensor | None = None,
    *,
    pad_to_max: bool = False,
    cells_only: bool = False,
    backend: str = "auto",
) -> DynamicVoxels | torch.Tensor:
    """Dynamic voxelization (MVF, Zhou et al. 2019): the voxel of every point, no caps, nothing dropped.

    Args (including ``backend``) and in-range semantics as ``pcops.voxelize`` (no caps, no ``mode``:
    no points are dropped, so there is nothing to rank). ``cells_only=True``: return only the
    ``(N, 4)`` int32 ``(batch, z, y, x)`` cell of every point, −1 rows for points out of range
    (mmcv's ``dynamic_voxelize`` output, with the batch column): the voxels are not numbered, so
    it is one elementwise pass (one launch on CUDA, no host sync); ``pad_to_max`` is then ignored.
    On CUDA that call, and the numbered form, are taken by the native host path (``pcops._native``:
    the checks, the allocations and the launches in C++, once its build is loaded and the grid has
    run once): the same kernels with the same arguments, the same results.

    Returns:
        ``DynamicVoxels(point_to_voxel (N,) int64, coords (M, 4) int32, num_voxels (B,) int64)``:
        voxel rows numbered in first-point order (batch-major), ``point_to_voxel`` −1 for
        points out of range. With ``pad_to_max=True`` ``coords`` has ``N`` rows (rows ≥ M are
        −1) and there is no host sync; otherwise one host sync learns ``M``.
        Feed ``point_to_voxel`` and ``M`` to ``pcops.voxel_reduce`` for per-voxel features.

    Example:
        >>> d = pcops.dynamic_voxelize(points, (0.16, 0.16, 4.0), (0, -39.68, -3, 69.12, 39.68, 1))
        >>> feats = pcops.voxel_reduce(points, d.point_to_voxel, d.coords.shape[0], "mean")
    """
    compiling = torch.compiler.is_compiling()
    host = None if compiling else _native.MODULE  # takes what it can (pcops._native)
    if host is not None and type(pad_to_max) is bool:
        if cells_only is True:
            cells = host.pc_forward(points, voxel_size, point_cloud_range, lengths, backend)  # (pcops._native)
            if cells is not None:
                return cells
        elif cells_only is False and _native.serves("dynamic_voxelize") is not None:
            out = host.dv_forward(points, voxel_size, point_cloud_range, lengths, pad_to_max, backend)
            if out is not None:
                return DynamicVoxels(*out)
    vs, pcr = _check_common(points, voxel_size, point_cloud_range, lengths, pad_to_max)
    if not isinstance(cells_only, bool):
        raise TypeError(f"cells_only: expected a bool, got {type(cells_only).__name__}")
    _resolve(backend, points, "dynamic_voxelize")
    if cells_only:
        return _library.call(
            torch.ops.pcops.point_cells.default, points.detach().contiguous(), lengths, list(vs), list(pcr), backend
        )
    out = _library.call(
        torch.ops.pcops.dynamic_voxelize.default,
        points.detach().contiguous(),
        lengths,
        list(vs),
        list(pcr),
        pad_to_max,
        backend,
    )
    if not compiling:  # (after a registration of this call's class: pcops._native.check)
        _native.check(
            "dynamic_voxelize",
            lambda: _native.MODULE.dv_forward(points, voxel_size, point_cloud_range, lengths, pad_to_max, backend),
            out,
        )
    return DynamicVoxels(*out)


def voxel_reduce(
    features: torch.Tensor,
    point_to_voxel: torch.Tensor,
    num_voxels: int,
    reduce: str = "mean",
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Reduce point features per voxel (dynamic voxel feature encoders, e.g. DV-SECOND / MVF).

    Args:
        features: ``(N, F)`` float, one row per point.
        point_to_voxel: ``(N,)`` int64 (int32 accepted) voxel row of each point in ``[0, M)``, −1 to
            ignore the point (as returned by ``pcops.voxelize`` / ``pcops.dynamic_voxelize``).
        num_voxels: ``M`` ≥ 0, the number of output rows (an int; e.g. ``coords.shape[0]``).
        reduce: ``"mean"`` (default), ``"max"`` or ``"sum"``.
        backend: ``"auto"`` or ``"reference"``, the same thing: the op is plain torch on every device
            (``"triton"`` and ``"cuda"`` raise ``ValueError``).

    Returns:
        ``(M, F)`` of ``features.dtype``; empty voxels give 0. fp16/bf16 sums accumulate in float32.

    Gradient w.r.t. ``features``: ``sum`` passes the voxel's gradient to each of its points,
    ``mean`` divides it by the voxel's point count, ``max`` sends it to the point holding the
    maximum only, the **lowest point index** among ties (per feature column).

    Determinism: ``max`` is exact on every device. ``sum``/``mean`` add in point order on the CPU;
    on CUDA they use atomic adds (``index_add_``), so float results can differ in the last bits
    run to run. Indices ≥ M are not checked on CUDA (the CPU path raises).

    Implementation: plain torch (``scatter_reduce_`` / ``index_add_``) on every device, a few
    launches and no host sync, so it can be captured in a CUDA graph.

    Example:
        >>> v = pcops.voxelize(points, (0.16, 0.16, 4.0), (0, -39.68, -3, 69.12, 39.68, 1), 32, 40000)
        >>> centres = pcops.voxel_reduce(points[:, :3], v.point_to_voxel, v.coords.shape[0], "mean")
    """
    _backend.check(backend, "voxel_reduce", ("auto", "reference"))
    _checks.check_tensor("features", features, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    _checks.check_tensor("point_to_voxel", point_to_voxel, dtypes=_checks.INT_DTYPES, ndim=1)
    _checks.check_same_device(features=features, point_to_voxel=point_to_voxel)
    if point_to_voxel.shape[0] != features.shape[0]:
        raise ValueError(
            f"point_to_voxel: expected {features.shape[0]} entries (one per row of features), "
            f"got {point_to_voxel.shape[0]}"
        )
    num_voxels = _checks.check_int("num_voxels", num_voxels, min_value=0)
    if reduce not in _REDUCE:
        raise ValueError(f"reduce: expected one of {_REDUCE}, got {reduce!r}")
    out, _ = _library.call(
        torch.ops.pcops.voxel_reduce.default,
        features.contiguous(),
        point_to_voxel.long().contiguous(),
        num_voxels,
        reduce,
    )
    return out


# --- registration ----------------------------------------------------------------------------


@_library.custom_op("pcops::voxelize", mutates_args=(), device_types="cpu")
def _voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: list[float],
    point_cloud_range: list[float],
    max_points_per_voxel: int,
    max_voxels: int,
    pad_to_max: bool,
    backend: str,
    mode: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if _resolve(backend, points) == "cpu" and cpu.numba_available():  # "triton" on CPU tensors raises
        from .cpu import voxelize as cpu_voxelize  # imported on first use: numba is an optional extra

        _backend.log_kernel("voxelize", "cpu hash map (numba)")
        return cpu_voxelize.voxelize(
            points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max
        )
    _backend.log_kernel("voxelize", "reference")
    return _ref.voxelize(points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max)


@_voxelize.register_kernel("cuda")
def _voxelize_cuda(
    points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max, backend, mode="auto"
):
    if _resolve(backend, points) == "reference":
        _backend.log_kernel("voxelize", "reference")
        return _ref.voxelize(
            points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max
        )
    from .triton import voxelize as impl

    return impl.voxelize(
        points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max, mode
    )


@_voxelize.register_fake
def _voxelize_fake(
    points, lengths, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, pad_to_max, backend, mode="auto"
):
    torch._check(points.dim() == 2 and points.shape[1] >= 3, lambda: "points: expected shape (N, C >= 3)")
    torch._check(len(voxel_size) == 3, lambda: "voxel_size: expected 3 values")
    torch._check(len(point_cloud_range) == 6, lambda: "point_cloud_range: expected 6 values")
    batch = 1 if lengths is None else lengths.shape[0]
    if pad_to_max:
        m = batch * max_voxels
    else:
        m = torch.library.get_ctx().new_dynamic_size()
    n, c = points.shape
    i64 = dict(dtype=torch.int64)
    return (
        points.new_empty((m, max_points_per_voxel, c)),
        points.new_empty((m, 4), dtype=torch.int32),
        points.new_empty((m,), dtype=torch.int32),
        points.new_empty((n,), **i64),
        points.new_empty((batch,), **i64),
        points.new_empty((batch,), **i64),
        points.new_empty((batch,), **i64),
    )


@_library.custom_op("pcops::dynamic_voxelize", mutates_args=(), device_types="cpu")
def _dynamic_voxelize(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: list[float],
    point_cloud_range: list[float],
    pad_to_max: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _resolve(backend, points, "dynamic_voxelize") == "cpu" and cpu.numba_available():
        from .cpu import voxelize as cpu_voxelize

        _backend.log_kernel("dynamic_voxelize", "cpu hash map (numba)")
        return cpu_voxelize.dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max)
    _backend.log_kernel("dynamic_voxelize", "reference")
    return _ref.dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max)


@_dynamic_voxelize.register_kernel("cuda")
def _dynamic_voxelize_cuda(points, lengths, voxel_size, point_cloud_range, pad_to_max, backend):
    if _resolve(backend, points, "dynamic_voxelize") == "reference":
        _backend.log_kernel("dynamic_voxelize", "reference")
        return _ref.dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max)
    from .triton import voxelize as impl

    _backend.log_kernel("dynamic_voxelize", "_voxelize_kernel")
    return impl.dynamic_voxelize(points, lengths, voxel_size, point_cloud_range, pad_to_max)


@_dynamic_voxelize.register_fake
def _dynamic_voxelize_fake(points, lengths, voxel_size, point_cloud_range, pad_to_max, backend):
    torch._check(points.dim() == 2 and points.shape[1] >= 3, lambda: "points: expected shape (N, C >= 3)")
    n = points.shape[0]
    m = n if pad_to_max else torch.library.get_ctx().new_dynamic_size()
    batch = 1 if lengths is None else lengths.shape[0]
    return (
        points.new_empty((n,), dtype=torch.int64),
        points.new_empty((m, 4), dtype=torch.int32),
        points.new_empty((batch,), dtype=torch.int64),
    )


@_library.custom_op("pcops::point_cells", mutates_args=(), device_types="cpu")
def _point_cells(
    points: torch.Tensor,
    lengths: torch.Tensor | None,
    voxel_size: list[float],
    point_cloud_range: list[float],
    backend: str,
) -> torch.Tensor:
    _resolve(backend, points, "dynamic_voxelize")  # validates; the CPU runs the (vectorised) reference
    _backend.log_kernel("point_cells", "reference")
    return _ref.point_cells(points, lengths, voxel_size, point_cloud_range)


@_point_cells.register_kernel("cuda")
def _point_cells_cuda(points, lengths, voxel_size, point_cloud_range, backend):
    if _resolve(backend, points, "dynamic_voxelize") == "reference":
        _backend.log_kernel("point_cells", "reference")
        return _ref.point_cells(points, lengths, voxel_size, point_cloud_range)
    from .triton import voxelize as impl

    _backend.log_kernel("point_cells", "_point_cells_kernel")
    return impl.point_cells(points, lengths, voxel_size, point_cloud_range)


@_point_cells.register_fake
def _point_cells_fake(points, lengths, voxel_size, point_cloud_range, backend):
    torch._check(points.dim() == 2 and points.shape[1] >= 3, lambda: "points: expected shape (N, C >= 3)")
    return points.new_empty((points.shape[0], 4), dtype=torch.int32)


@_library.custom_op("pcops::voxel_reduce", mutates_args=(), device_types=("cpu", "cuda"))
def _voxel_reduce(
    features: torch.Tensor, point_to_voxel: torch.Tensor, num_voxels: int, reduce: str
) -> tuple[torch.Tensor, torch.Tensor]:
    if (
        point_to_voxel.device.type == "cpu"
        and point_to_voxel.numel()
        and bool(((point_to_voxel >= num_voxels) | (point_to_voxel < -1)).any())
    ):
        raise ValueError(f"point_to_voxel: entries must be in [0, num_voxels={num_voxels}) or -1")
    return _ref.voxel_reduce(features, point_to_voxel, num_voxels, reduce)


@_voxel_reduce.register_fake
def _voxel_reduce_fake(features, point_to_voxel, num_voxels, reduce):
    torch._check(features.dim() == 2, lambda: "features: expected a 2-D tensor")
    torch._check(point_to_voxel.shape[0] == features.shape[0], lambda: "point_to_voxel: one entry per point")
    arg_rows = num_voxels if reduce == "max" else 0
    return (
        features.new_empty((num_voxels, features.shape[1])),
        features.new_empty((arg_rows, features.shape[1]), dtype=torch.int64),
    )


@_library.custom_op("pcops::voxel_reduce_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _voxel_reduce_backward(
    grad_out: torch.Tensor, point_to_voxel: torch.Tensor, arg: torch.Tensor, num_points: int, reduce: str
) -> torch.Tensor:
    return _ref.voxel_reduce_backward(
        grad_out, (num_points, grad_out.shape[1]), point_to_voxel, arg, reduce, grad_out.shape[0]
    )


@_voxel_reduce_backward.register_fake
def _voxel_reduce_backward_fake(grad_out, point_to_voxel, arg, num_points, reduce):
    return grad_out.new_empty((num_points, grad_out.shape[1]))


def _reduce_setup_context(ctx, inputs, output):
    features, point_to_voxel, num_voxels, reduce = inputs
    _, arg = output
    ctx.save_for_backward(point_to_voxel, arg)
    ctx.reduce = reduce
    ctx.num_points = features.shape[0]
    ctx.mark_non_differentiable(arg)


def _reduce_backward(ctx, grad_out, _grad_arg):
    point_to_voxel, arg = ctx.saved_tensors
    grad = _library.call(
        torch.ops.pcops.voxel_reduce_backward.default,
        grad_out.contiguous(),
        point_to_voxel,
        arg,
        ctx.num_points,
        ctx.reduce,
    )
    return grad, None, None, None


_voxel_reduce.register_autograd(_reduce_backward, setup_context=_reduce_setup_context)
