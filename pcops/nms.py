"""Rotated bird's-eye-view IoU and rotated NMS, the last op of every 3D detector.

Contract: public functions (docstring + argument checks) → ``torch.ops.pcops.boxes_iou_bev`` /
``boxes_iou_3d`` / ``nms_bev`` / ``nms_bev_batched`` → the implementation the ``backend`` argument
resolves to (``pcops._backend``: the reference on the CPU; Triton or CUDA C++ on CUDA) → kernels;
plus fake (shape) functions. Nothing here is differentiable (IoU for losses is out of scope).

Boxes follow OpenPCDet: ``(x, y, z, dx, dy, dz, heading)`` in metres and radians, ``dx`` along
the heading, the heading counter-clockwise around +z from +x, ``z`` the box centre. BEV-only
functions also take ``(x, y, dx, dy, heading)``; extra columns after the 7th (e.g. velocities)
are ignored.

Invalid boxes: a box with a non-finite BEV value (or, for 3D, ``z``/``dz``), or a negative size,
has IoU 0 with everything, itself included; in NMS it is never kept and never suppresses
another box, and neither is a box with a NaN score. Negative sizes raise ``ValueError`` for CPU
tensors; on the GPU they cannot be checked without a host sync and follow the rule above.
"""

from __future__ import annotations


import torch

from . import _backend, _checks, _library, _native
from .reference import nms as _ref

__all__ = ["boxes_iou_bev", "boxes_iou_3d", "nms_bev", "batched_nms_bev"]


def _check_boxes(name: str, boxes, *, bev: bool) -> torch.Tensor:
    _checks.check_tensor(name, boxes, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    c = boxes.shape[1]
    if (bev and c not in (5,) and c < 7) or (not bev and c < 7):
        want = "5 (x, y, dx, dy, heading) or >= 7 (x, y, z, dx, dy, dz, heading, ...)" if bev else ">= 7"
        raise ValueError(f"{name}: expected shape (N, {want}), got {tuple(boxes.shape)}")
    return boxes.contiguous()


def _check_sizes_cpu(name: str, boxes: torch.Tensor) -> None:
    """Negative sizes raise on the CPU (inside the CPU kernel, so compiled graphs check too)."""
    cols = [2, 3] if boxes.shape[1] == 5 else [3, 4, 5]
    if boxes.numel() and bool((boxes[:, cols] < 0).any()):
        raise ValueError(f"{name}: box sizes must be >= 0 (negative dx/dy/dz found)")


def boxes_iou_bev(boxes_a: torch.Tensor, boxes_b: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """Rotated bird's-eye-view IoU of every pair (OpenPCDet ``boxes_iou_bev``, exact on hard cases).

    Args:
        boxes_a: ``(N, 7+)`` OpenPCDet boxes or ``(N, 5)`` ``(x, y, dx, dy, heading)``;
            float32/float16/bfloat16/float64.
        boxes_b: ``(M, 7+)`` or ``(M, 5)``, same device.
        backend: ``"auto"`` (default: Triton on CUDA; the reference on the CPU and for float64
            boxes), ``"triton"``, ``"cuda"`` (CUDA C++ compiled at run time with NVRTC; both
            CUDA tensors only) or ``"reference"`` (the float64 clipping oracle, any device).

    Returns:
        ``(N, M)`` IoU in ``[0, 1]``: float64 for float64 boxes, float32 otherwise.

    Accuracy: the CPU path is float64 polygon clipping (``pcops.reference.nms``). The GPU path
    computes in float32 in box ``a``'s own frame (local origin, slab clipping, see
    ``pcops.triton.nms``; the CUDA C++ backend runs the same arithmetic) and stays within 1e-5 of
    float64 (measured: ~2e-7 on random pairs, ≤ 4e-6 on the hard cases: shifted by 1e-4 m, rotated
    by k·90°, nested, shared edges/corners, 1 cm thin boxes, x ≈ 70 m); identical boxes give
    exactly 1 and a box nested in another the exact area ratio ``dx·dy / dx'·dy'``. fp16/bf16
    boxes are computed in float32. Invalid boxes give 0; negative sizes raise on the CPU (see the
    module docstring). No host sync on the GPU.

    Example:
        >>> a = torch.tensor([[0.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.0]])
        >>> b = torch.tensor([[1.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.0]])
        >>> pcops.boxes_iou_bev(a, b)  # 6 m² shared of 10 m² union
        tensor([[0.6000]])
    """
    boxes_a = _check_boxes("boxes_a", boxes_a, bev=True)
    boxes_b = _check_boxes("boxes_b", boxes_b, bev=True)
    _checks.check_same_device(boxes_a=boxes_a, boxes_b=boxes_b)
    _backend.resolve(backend, "boxes_iou_bev", boxes_a, boxes_b)  # bad values fail before the dispatch
    return _library.call(torch.ops.pcops.boxes_iou_bev.default, boxes_a, boxes_b, backend)


def boxes_iou_3d(boxes_a: torch.Tensor, boxes_b: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """3D IoU of every pair of rotated boxes (OpenPCDet ``boxes_iou3d_gpu``): BEV intersection area
    × height overlap, over the union volume.

    Args:
        boxes_a: ``(N, 7+)`` ``(x, y, z, dx, dy, dz, heading, ...)``, ``z`` the centre.
        boxes_b: ``(M, 7+)``, same device.
        backend: as :func:`boxes_iou_bev`.

    Returns:
        ``(N, M)`` IoU, float64 for float64 boxes, float32 otherwise; same accuracy and invalid-box
        rules as :func:`boxes_iou_bev`. No host sync on the GPU.

    Example:
        >>> a = torch.tensor([[0.0, 0.0, 0.0, 4.0, 2.0, 2.0, 0.0]])
        >>> b = torch.tensor([[0.0, 0.0, 1.0, 4.0, 2.0, 2.0, 0.0]])
        >>> pcops.boxes_iou_3d(a, b)  # half the height shared: 8 / 24
        tensor([[0.3333]])
    """
    boxes_a = _check_boxes("boxes_a", boxes_a, bev=False)
    boxes_b = _check_boxes("boxes_b", boxes_b, bev=False)
    _checks.check_same_device(boxes_a=boxes_a, boxes_b=boxes_b)
    _backend.resolve(backend, "boxes_iou_3d", boxes_a, boxes_b)
    return _library.call(torch.ops.pcops.boxes_iou_3d.default, boxes_a, boxes_b, backend)


def _nms_batched_args(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend):
    """Checks of the batched form (``boxes (B, N, C)``) and the call of ``pcops::nms_bev_batched``."""
    _checks.check_tensor("boxes", boxes, dtypes=_checks.FLOAT_DTYPES, ndim=3)
    c = boxes.shape[2]
    if c != 5 and c < 7:
        raise ValueError(f"boxes: expected shape (B, N, 5) or (B, N, >= 7), got {tuple(boxes.shape)}")
    _checks.check_tensor("scores", scores, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    _checks.check_same_device(boxes=boxes, scores=scores, idxs=idxs)
    if tuple(scores.shape) != tuple(boxes.shape[:2]):
        raise ValueError(f"scores: expected shape {tuple(boxes.shape[:2])} (one per box), got {tuple(scores.shape)}")
    if idxs is not None:
        _checks.check_tensor("idxs", idxs, dtypes=_checks.INT_DTYPES + (torch.int16, torch.int8, torch.uint8), ndim=2)
        if tuple(idxs.shape) != tuple(boxes.shape[:2]):
            raise ValueError(f"idxs: expected shape {tuple(boxes.shape[:2])} (one per box), got {tuple(idxs.shape)}")
        idxs = idxs.to(torch.int64).contiguous()
    thr = _checks.check_float("iou_threshold", iou_threshold, min_value=0.0, max_value=1.0)
    if pre_max_size is not None:
        pre_max_size = _checks.check_int("pre_max_size", pre_max_size, min_value=1)
    if post_max_size is not None:
        post_max_size = _checks.check_int("post_max_size", post_max_size, min_value=1)
    if not isinstance(padded, bool):
        raise TypeError(f"padded: expected a bool, got {type(padded).__name__}")
    if not padded:
        raise ValueError("padded: the batched form (boxes (B, N, C)) returns padded outputs only: pass padded=True")
    if post_max_size is None:
        raise ValueError("post_max_size: required with padded=True (the fixed output length)")
    _backend.resolve(backend, "nms_bev", boxes, scores)
    return _library.call(
        torch.ops.pcops.nms_bev_batched.default,
        boxes.contiguous(),
        scores.contiguous(),
        idxs,
        thr,
        pre_max_size,
        post_max_size,
        backend,
    )


_OP = "nms_bev"  # the native host path's name of nms_bev / batched_nms_bev (pcops._native)


def _nms_args(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend):
    """The public NMS call: the native host path where it takes it, else the checks and the op."""
    args = (boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend)
    compiling = torch.compiler.is_compiling()
    host = None if compiling else _native.serves(_OP)  # takes what it can (pcops._native)
    if host is not None:
        out = host.nms_forward(*args)
        if out is not None:
            return out
    out = _nms_python(*args)
    if not compiling:  # (after the registration of this device's kernels: pcops._native.check)
        _native.check(_OP, lambda: _native.MODULE.nms_forward(*args), out)
    return out


def _nms_python(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend):
    if isinstance(boxes, torch.Tensor) and boxes.dim() == 3:
        return _nms_batched_args(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend)
    boxes = _check_boxes("boxes", boxes, bev=True)
    _checks.check_tensor("scores", scores, dtypes=_checks.FLOAT_DTYPES, ndim=1)
    _checks.check_same_device(boxes=boxes, scores=scores, idxs=idxs)
    if scores.shape[0] != boxes.shape[0]:
        raise ValueError(f"scores: expected {boxes.shape[0]} values (one per box), got {scores.shape[0]}")
    if idxs is not None:
        _checks.check_tensor("idxs", idxs, dtypes=_checks.INT_DTYPES + (torch.int16, torch.int8, torch.uint8), ndim=1)
        if idxs.shape[0] != boxes.shape[0]:
            raise ValueError(f"idxs: expected {boxes.shape[0]} values (one per box), got {idxs.shape[0]}")
        idxs = idxs.to(torch.int64).contiguous()
    thr = _checks.check_float("iou_threshold", iou_threshold, min_value=0.0, max_value=1.0)
    if pre_max_size is not None:
        pre_max_size = _checks.check_int("pre_max_size", pre_max_size, min_value=1)
    if post_max_size is not None:
        post_max_size = _checks.check_int("post_max_size", post_max_size, min_value=1)
    if not isinstance(padded, bool):
        raise TypeError(f"padded: expected a bool, got {type(padded).__name__}")
    if padded and post_max_size is None:
        raise ValueError("post_max_size: required with padded=True (the fixed output length)")
    _backend.resolve(backend, "nms_bev", boxes, scores)
    out = _library.call(
        torch.ops.pcops.nms_bev.default,
        boxes,
        scores.contiguous(),
        idxs,
        thr,
        pre_max_size,
        post_max_size,
        padded,
        backend,
    )
    return out if padded else out[0]


def nms_bev(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    pre_max_size: int | None = None,
    post_max_size: int | None = None,
    padded: bool = False,
    *,
    backend: str = "auto",
):
    """Greedy rotated NMS in bird's-eye view (OpenPCDet ``nms_gpu`` semantics, fully on the GPU).

    Boxes are ranked by score (descending; equal scores keep the lower index first: a stable
    sort), the first ``pre_max_size`` are considered, and each is kept unless its BEV IoU with
    an already kept, higher-ranked box is **> iou_threshold**; at most ``post_max_size`` are kept.

    Args:
        boxes: ``(N, 7+)`` OpenPCDet boxes or ``(N, 5)`` ``(x, y, dx, dy, heading)``, any float dtype;
            or ``(B, N, 7+)`` / ``(B, N, 5)``: ``B`` independent samples (the batched form, below).
        scores: ``(N,)`` float, same device (``(B, N)`` with batched boxes). A NaN score makes the
            box invalid (never kept; it ranks as −inf for ``pre_max_size``).
        iou_threshold: in ``[0, 1]``. The GPU compares float32 IoUs with ``float32(threshold)``
            (decisions can differ from float64 only where an IoU lies within ~1e-6 of it).
        pre_max_size: consider only the top ``pre_max_size`` boxes by score (None: all).
        post_max_size: keep at most this many (None: no cap).
        padded: return the fixed-size form (requires ``post_max_size``).
        backend: ``"auto"`` (default: on CUDA the CUDA C++ pipeline through NVRTC, or Triton when
            NVRTC cannot be loaded or a sample keeps more than 64 · ``pcops.cuda.nms.MAX_WORDS``
            boxes after ``pre_max_size``; the reference on the CPU and for float64 boxes or
            scores), ``"cuda"``, ``"triton"`` (CUDA tensors only; ``"cuda"`` raises ``ValueError``
            above that size) or ``"reference"`` (any device).

    Returns:
        ``padded=False``: kept indices ``(K,)`` int64 into ``boxes``, in descending score order.
        On the GPU this form makes one host sync (reading ``K`` to size the output).

        ``padded=True``: ``(indices (post_max_size,) int64 padded with −1, count () int64)``, no
        host sync at all (the whole post-processing can be captured in a CUDA graph).

        Batched form, ``boxes (B, N, C)``, ``scores (B, N)`` (requires ``padded=True``):
        ``(indices (B, post_max_size) int64 into each sample's N boxes, −1 padded, count (B,)
        int64)``; every sample is an independent NMS (``pre_max_size``/``post_max_size`` per
        sample), equal to a loop of per-sample calls, but on CUDA one set of launches for all
        samples (grid over ``B``) and no host sync.

    Invalid boxes (non-finite values, negative sizes on the GPU) are never kept and never suppress.
    Deterministic; the same keep list as the float64 reference except where an IoU lies within
    ~1e-6 of the threshold (e.g. boxes that only touch, at threshold 0).

    Example:
        >>> boxes = torch.tensor([[0.0, 0, 0, 4, 2, 1.5, 0], [0.5, 0, 0, 4, 2, 1.5, 0], [9.0, 0, 0, 4, 2, 1.5, 0]])
        >>> scores = torch.tensor([0.9, 0.8, 0.7])
        >>> pcops.nms_bev(boxes, scores, iou_threshold=0.5)
        tensor([0, 2])
        >>> pcops.nms_bev(boxes, scores, 0.5, post_max_size=4, padded=True)
        (tensor([ 0,  2, -1, -1]), tensor(2))

    Notes:
        Rotated NMS without a host round trip (unlike OpenPCDet's and mmcv's host loop). The CUDA
        C++ backend runs three kernels per call whatever ``B`` (``pcops.cuda.nms.nms_padded``): a
        stable rank sort of the scores (no counting when they are already in descending order,
        e.g. top-k outputs) that also writes the first ``pre_max_size`` boxes in score order as
        prepared records; the upper-triangular ``IoU > thr`` bitmask in 64-bit words (pairs whose
        bounding circles do not touch are culled before any clipping); a single-block (per
        sample) pipelined greedy pass that stops once ``post_max_size`` boxes are kept. Above
        8,192 boxes per sample (or B·N² > 8·4,096²) or with float64 scores, ``torch.sort`` and a
        gather kernel replace the rank sort; non-float32 boxes add a cast. The Triton backend:
        ``torch.sort``, a mask kernel and a pass kernel per sample. The variable-length form adds
        the sync and a copy.

        Host path: on CUDA, float32 contiguous boxes and scores within the rank sort's sizes (group
        ids None or int64) are taken by the native host path (``pcops._native``: the checks,
        allocations and the three launches in C++; served once a call's native result matched
        this path's) under ``"auto"`` and ``"cuda"``: the same kernels, the same outputs.
    """
    return _nms_args(boxes, scores, None, iou_threshold, pre_max_size, post_max_size, padded, backend)


def batched_nms_bev(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
    pre_max_size: int | None = None,
    post_max_size: int | None = None,
    padded: bool = False,
    *,
    backend: str = "auto",
):
    """:func:`nms_bev` where boxes with different ``idxs`` (class or sample id) never suppress each other.

    Args:
        idxs: ``(N,)`` integer group of each box, same device (``(B, N)`` with batched boxes
            ``(B, N, C)``: groups within each sample).
        Others as :func:`nms_bev` (``backend`` included); ``pre_max_size`` and ``post_max_size``
        apply to all groups together (the global score ranking), as one NMS over the union would.

    Returns:
        As :func:`nms_bev` (indices into ``boxes`` in descending score order across groups).

    Example:
        >>> boxes = torch.tensor([[0.0, 0, 0, 4, 2, 1.5, 0], [0.5, 0, 0, 4, 2, 1.5, 0]])
        >>> pcops.batched_nms_bev(boxes, torch.tensor([0.9, 0.8]), torch.tensor([0, 1]), 0.5)
        tensor([0, 1])
    """
    if idxs is None:
        raise TypeError("idxs: expected a tensor of group ids, got None")
    return _nms_args(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend)


# --- registration: one schema per op; the device's implementation is picked by ``_backend`` -------


def _iou_dtype(boxes_a: torch.Tensor) -> torch.dtype:
    return torch.float64 if boxes_a.dtype == torch.float64 else torch.float32


def _iou_run(impl: str, boxes_a: torch.Tensor, boxes_b: torch.Tensor, three_d: bool) -> torch.Tensor:
    """Both IoU ops with the resolved implementation ``impl``."""
    if impl == "reference":
        if boxes_a.device.type == "cpu":  # inside the op, so compiled graphs check too
            _check_sizes_cpu("boxes_a", boxes_a)
            _check_sizes_cpu("boxes_b", boxes_b)
        ref_fn = _ref.boxes_iou_3d if three_d else _ref.boxes_iou_bev
        return ref_fn(boxes_a, boxes_b).to(_iou_dtype(boxes_a))
    if impl == "cuda":
        from .cuda import nms as gpu
    else:
        from .triton import nms as gpu
    return gpu.boxes_iou(boxes_a, boxes_b, three_d=three_d)


def _iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor, backend: str, three_d: bool) -> torch.Tensor:
    op = "boxes_iou_3d" if three_d else "boxes_iou_bev"
    impl = _backend.resolve(backend, op, boxes_a, boxes_b)  # "auto" on CUDA: Triton
    impl = "reference" if impl == "cpu" else impl
    _backend.log_kernel(op, impl)
    return _iou_run(impl, boxes_a, boxes_b, three_d)


def _iou_fake(boxes_a: torch.Tensor, boxes_b: torch.Tensor, three_d: bool) -> torch.Tensor:
    torch._check(boxes_a.dim() == 2 and boxes_b.dim() == 2, lambda: "boxes: expected 2-D tensors")
    if three_d:
        torch._check(boxes_a.shape[1] >= 7 and boxes_b.shape[1] >= 7, lambda: "boxes: expected (N, >=7)")
    return boxes_a.new_empty((boxes_a.shape[0], boxes_b.shape[0]), dtype=_iou_dtype(boxes_a))


@_library.custom_op("pcops::boxes_iou_bev", mutates_args=(), device_types=("cpu", "cuda"))
def _boxes_iou_bev(boxes_a: torch.Tensor, boxes_b: torch.Tensor, backend: str) -> torch.Tensor:
    return _iou(boxes_a, boxes_b, backend, three_d=False)


@_boxes_iou_bev.register_fake
def _boxes_iou_bev_fake(boxes_a, boxes_b, backend):
    return _iou_fake(boxes_a, boxes_b, three_d=False)


@_library.custom_op("pcops::boxes_iou_3d", mutates_args=(), device_types=("cpu", "cuda"))
def _boxes_iou_3d(boxes_a: torch.Tensor, boxes_b: torch.Tensor, backend: str) -> torch.Tensor:
    return _iou(boxes_a, boxes_b, backend, three_d=True)


@_boxes_iou_3d.register_fake
def _boxes_iou_3d_fake(boxes_a, boxes_b, backend):
    return _iou_fake(boxes_a, boxes_b, three_d=True)


_nvrtc_available = _backend.nvrtc_available


def _nms_impl(backend: str, boxes: torch.Tensor, scores: torch.Tensor, m: int) -> str:
    """``"reference"``, ``"triton"`` or ``"cuda"`` for NMS of ``m`` boxes per sample."""
    impl = _backend.resolve(backend, "nms_bev", boxes, scores, auto_cuda="cuda")
    if impl == "cpu":
        from . import cpu

        return "cpu" if cpu.numba_available() else "reference"
    if impl == "reference":
        return "reference"
    if impl == "triton":
        return impl
    from .cuda import nms as cuda_impl

    # the CUDA pass keeps one "removed" bit per box in shared memory; Triton handles any size
    fits = -(-m // 64) <= cuda_impl.MAX_WORDS
    if backend == "auto":
        return "cuda" if fits and _nvrtc_available() else "triton"
    if not fits:
        raise ValueError(
            f"backend: 'cuda' handles at most {64 * cuda_impl.MAX_WORDS} boxes per sample after "
            f"pre_max_size, got {m}; use backend='auto' or 'triton'"
        )
    return "cuda"


def _nms_run(impl, boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded):
    """``pcops::nms_bev`` with the resolved implementation ``impl``."""
    if impl == "cpu":  # pcops.cpu.nms (numba): the reference's decisions with bounding-circle culling
        from .cpu import nms as cpu_nms

        _check_sizes_cpu("boxes", boxes)
        keep = cpu_nms.nms_bev(boxes, scores, iou_threshold, pre_max_size, post_max_size, idxs)
        count = torch.tensor(keep.numel(), dtype=torch.int64)
        if not padded:
            return keep, count
        out = torch.full((post_max_size,), -1, dtype=torch.int64)
        out[: keep.numel()] = keep
        return out, count
    if impl == "reference":
        if boxes.device.type == "cpu":
            _check_sizes_cpu("boxes", boxes)
        if padded:
            return _ref.nms_bev_padded(boxes, scores, iou_threshold, pre_max_size, post_max_size, idxs)
        keep = _ref.nms_bev(boxes, scores, iou_threshold, pre_max_size, post_max_size, idxs)
        return keep, torch.tensor(keep.numel(), dtype=torch.int64, device=boxes.device)
    if impl == "triton":
        from .triton import nms as tri

        return tri.nms_bev(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded)
    from .cuda import nms as cuda_impl

    if boxes.device.index not in _NATIVE_DONE:
        _native_register(boxes.device)
    m = boxes.shape[0] if pre_max_size is None else min(boxes.shape[0], pre_max_size)
    out_len = post_max_size if padded else min(m, post_max_size or m)
    groups = idxs.unsqueeze(0) if idxs is not None else None
    out, count = cuda_impl.nms_padded(
        boxes.unsqueeze(0), scores.unsqueeze(0), groups, iou_threshold, pre_max_size, out_len, single=True
    )
    if padded:
        return out, count
    k = int(count)  # the one host sync of the variable-length form
    return out[:k].clone(), count


@_library.custom_op("pcops::nms_bev", mutates_args=(), device_types=("cpu", "cuda"))
def _nms_bev(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor | None,
    iou_threshold: float,
    pre_max_size: int | None,
    post_max_size: int | None,
    padded: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    m = boxes.shape[0] if pre_max_size is None else min(boxes.shape[0], pre_max_size)
    impl = _nms_impl(backend, boxes, scores, m)
    _backend.log_kernel("nms_bev", impl)
    return _nms_run(impl, boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded)


@_nms_bev.register_fake
def _nms_bev_fake(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, padded, backend):
    torch._check(boxes.dim() == 2, lambda: "boxes: expected a 2-D tensor")
    torch._check(scores.dim() == 1 and scores.shape[0] == boxes.shape[0], lambda: "scores: one per box")
    count = boxes.new_empty((), dtype=torch.int64)
    if padded:
        return boxes.new_empty((post_max_size,), dtype=torch.int64), count
    k = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty((k,), dtype=torch.int64), count


def _nms_batched_run(impl, boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size):
    """``pcops::nms_bev_batched`` with the resolved implementation ``impl``."""
    if impl == "cuda":
        from .cuda import nms as cuda_impl

        if boxes.device.index not in _NATIVE_DONE:
            _native_register(boxes.device)
        return cuda_impl.nms_padded(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size)
    # the reference and Triton: one call per sample
    outs = [
        _nms_run(
            impl,
            boxes[b],
            scores[b],
            idxs[b] if idxs is not None else None,
            iou_threshold,
            pre_max_size,
            post_max_size,
            True,
        )
        for b in range(boxes.shape[0])
    ]
    if not outs:
        return boxes.new_empty((0, post_max_size), dtype=torch.int64), boxes.new_empty((0,), dtype=torch.int64)
    return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])


@_library.custom_op("pcops::nms_bev_batched", mutates_args=(), device_types=("cpu", "cuda"))
def _nms_bev_batched(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor | None,
    iou_threshold: float,
    pre_max_size: int | None,
    post_max_size: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    n = boxes.shape[1]
    impl = _nms_impl(backend, boxes, scores, n if pre_max_size is None else min(n, pre_max_size))
    _backend.log_kernel("nms_bev_batched", impl)
    return _nms_batched_run(impl, boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size)


@_nms_bev_batched.register_fake
def _nms_bev_batched_fake(boxes, scores, idxs, iou_threshold, pre_max_size, post_max_size, backend):
    torch._check(boxes.dim() == 3, lambda: "boxes: expected a 3-D tensor")
    torch._check(
        scores.dim() == 2 and scores.shape[0] == boxes.shape[0] and scores.shape[1] == boxes.shape[1],
        lambda: "scores: one per box",
    )
    bsz = boxes.shape[0]
    return (boxes.new_empty((bsz, post_max_size), dtype=torch.int64), boxes.new_empty((bsz,), dtype=torch.int64))


_NATIVE_DONE: set = set()  # device indices whose kernels the native host path has (or cannot have)


def _native_register(device: torch.device) -> None:
    """Hand ``csrc/nms.cu``'s pipeline kernels for ``device`` to the native host path (once per
    device; the first CUDA call starts the module's build). The op is then on hold until a call's
    native result matched the Python path's (``pcops._native.check``)."""
    host = _native.loaded()
    if host is None:
        return
    _NATIVE_DONE.add(device.index)
    from ._nvrtc import get_kernel

    try:
        handles = [get_kernel("nms.cu", k, device)._handle for k in ("nms_rank", "nms_mask_b", "nms_pass_b")]
    except Exception as e:  # noqa: BLE001 - NVRTC cannot build them here: the Python path stays
        _backend.logger.warning("pcops: nms_bev's CUDA C++ kernels are unavailable to the native path (%s)", e)
        return
    host.nms_register(device.index, *handles)
    _native.registered(_OP)
