"""Launchers for ``csrc/nms.cu`` (CUDA C++ compiled at run time with NVRTC): the IoU matrix and the
batched three-kernel NMS pipeline (rank sort, tile mask, greedy pass)."""

from __future__ import annotations

import ctypes

import torch

from .._nvrtc import get_kernel

_TILE = 64
_PASS_THREADS = 1024
_IOU_BLOCK = (32, 8)
# the pass keeps one "removed" word per 64 boxes in dynamic shared memory: 48 KB without opt-in,
# less the kernel's ~1 KB of static shared memory (M <= 376,832 boxes; Triton takes larger M)
MAX_WORDS = (48 * 1024 - 2048) // 8


def _as_f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def boxes_iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor, three_d: bool) -> torch.Tensor:
    """Same contract as ``pcops.triton.nms.boxes_iou``; no host sync (one launch, plus casts for
    non-float32 boxes)."""
    n, m = boxes_a.shape[0], boxes_b.shape[0]
    a, b = _as_f32(boxes_a), _as_f32(boxes_b)
    if a.shape[1] != b.shape[1] and 5 in (a.shape[1], b.shape[1]):
        a = a if a.shape[1] == 5 else a[:, [0, 1, 3, 4, 6]].contiguous()
        b = b if b.shape[1] == 5 else b[:, [0, 1, 3, 4, 6]].contiguous()
    out = torch.empty((n, m), dtype=torch.float32, device=a.device)
    if n and m:
        bx, by = _IOU_BLOCK
        get_kernel("nms.cu", "boxes_iou", a.device)(
            ((m + bx - 1) // bx, (n + by - 1) // by),
            (bx, by),
            [
                a,
                b,
                out,
                ctypes.c_int(n),
                ctypes.c_int(m),
                ctypes.c_int(a.shape[1]),
                ctypes.c_int(b.shape[1]),
                ctypes.c_int(int(a.shape[1] == 5)),
                ctypes.c_int(int(three_d)),
            ],
        )
    return out.to(torch.float64) if boxes_a.dtype == torch.float64 else out


# --- the batched pipeline: rank sort + prepared boxes, tile mask, pass; grid over the samples ------

_RANK_THREADS = 256
_RANK_BOXES = 32  # boxes ranked per block
_GATHER_THREADS = 256
_MASKB_THREADS = 64
_SBOX = 8  # floats per prepared box
# sizes sorted by ranking in one kernel (O(B·N²) compares; O(B·N) when the scores are already in
# order, e.g. top-k outputs): N ≤ RANK_MAX and B·N² ≤ RANK_WORK, where ranking beats torch.sort
# (benchmarks/NOTES.md). Larger inputs, and float64 scores (whose order float32 could merge), use
# torch.sort and a gather kernel.
RANK_MAX = 8192
RANK_WORK = 8 * 4096 * 4096
_MAX_GRID_Y = 65535
_RANK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def nms_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    groups: torch.Tensor | None,
    iou_threshold: float,
    pre_max_size: int | None,
    out_len: int,
    *,
    single: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded rotated NMS of ``B`` independent samples in three launches, no host sync.

    ``nms_rank`` (stable descending rank of every score, NaN last; the first ``M`` boxes in score
    order written as prepared float32 records: centre, size, heading, bounding radius, validity),
    ``nms_mask_b`` (the ``IoU > thr`` bitmask, grid over the triangle's 64 × 64 tiles and ``B``)
    and ``nms_pass_b`` (the pipelined greedy pass, one block per sample).
    Above ``RANK_MAX`` boxes per sample (or ``B·N² > RANK_WORK``), or for float64 scores,
    ``torch.sort`` + ``nms_gather`` replace ``nms_rank`` (+3-5 launches).

    Args:
        boxes: ``(B, N, C)``, C = 5 or ≥ 7, any float dtype (cast to float32 if needed).
        scores: ``(B, N)`` float (NaN = invalid box).
        groups: ``(B, N)`` int64 group ids (boxes of different groups never suppress each other) or None.
        pre_max_size: boxes considered per sample (None: all); ``M = min(N, pre_max_size)`` must
            satisfy ``ceil(M / 64) <= MAX_WORDS``.
        out_len: the padded output length (≥ 1 when ``M > 0``).
        single: ``B == 1`` and the outputs are ``(out_len,)`` and ``()`` (fresh tensors, not views).
    Returns:
        ``(indices (B, out_len) int64 into each sample's boxes, −1 padded, count (B,) int64)``.
    """
    bsz, n = scores.shape
    m = n if pre_max_size is None else min(n, pre_max_size)
    shape = ((out_len,), ()) if single else ((bsz, out_len), (bsz,))
    if bsz == 0 or m == 0:
        return (
            torch.full(shape[0], -1, dtype=torch.int64, device=boxes.device),
            torch.zeros(shape[1], dtype=torch.int64, device=boxes.device),
        )
    if bsz > _MAX_GRID_Y:  # the sample index is the grid's y dimension in two of the kernels
        parts = [
            nms_padded(
                boxes[s : s + _MAX_GRID_Y],
                scores[s : s + _MAX_GRID_Y],
                groups[s : s + _MAX_GRID_Y] if groups is not None else None,
                iou_threshold,
                pre_max_size,
                out_len,
            )
            for s in range(0, bsz, _MAX_GRID_Y)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    order, sbox, sgroups = rank_prepare(boxes, scores, groups, m)
    mask, invalid = mask_b(sbox, sgroups if groups is not None else None, iou_threshold)
    out = torch.empty(shape[0], dtype=torch.int64, device=boxes.device)
    count = torch.empty(shape[1], dtype=torch.int64, device=boxes.device)
    return pass_b(mask, invalid, order, out_len, out=out, count=count)


def rank_prepare(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor | None, m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1 of :func:`nms_padded` (1 launch: ``nms_rank``; or torch.sort + ``nms_gather``).

    Returns:
        ``order (B, M) int64`` (box index within the sample, in score order), ``sbox (B, M, 8)``
        float32 prepared records, ``sgroups (B, M)`` int64 (``order`` itself without groups).
    """
    bsz, n = scores.shape
    dev = boxes.device
    bx = _as_f32(boxes)
    stride = bx.shape[2]
    bev5 = ctypes.c_int(int(stride == 5))
    has = ctypes.c_int(int(groups is not None))
    sbox = torch.empty((bsz, m, _SBOX), dtype=torch.float32, device=dev)
    if scores.dtype in _RANK_DTYPES and n <= RANK_MAX and bsz * n * n <= RANK_WORK:
        order = torch.empty((bsz, m), dtype=torch.int64, device=dev)
        sgroups = torch.empty((bsz, m), dtype=torch.int64, device=dev) if groups is not None else order
        get_kernel("nms.cu", "nms_rank", dev)(
            ((n + _RANK_BOXES - 1) // _RANK_BOXES, bsz),
            (_RANK_THREADS,),
            [
                bx,
                _as_f32(scores),
                groups if groups is not None else order,
                has,
                ctypes.c_int(n),
                ctypes.c_int(m),
                ctypes.c_int(stride),
                bev5,
                order,
                sbox,
                sgroups,
            ],
        )
    else:
        key = torch.nan_to_num(scores, nan=float("-inf"))
        order = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :m].contiguous()
        sgroups = torch.empty((bsz, m), dtype=torch.int64, device=dev) if groups is not None else order
        get_kernel("nms.cu", "nms_gather", dev)(
            ((m + _GATHER_THREADS - 1) // _GATHER_THREADS, bsz),
            (_GATHER_THREADS,),
            [
                bx,
                _as_f32(scores),
                groups if groups is not None else order,
                has,
                ctypes.c_int(n),
                ctypes.c_int(m),
                ctypes.c_int(stride),
                bev5,
                order,
                sbox,
                sgroups,
            ],
        )
    return order, sbox, sgroups


def mask_b(sbox: torch.Tensor, sgroups: torch.Tensor | None, iou_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2 of :func:`nms_padded` (1 launch: ``nms_mask_b``): ``mask (B, M, W)`` int64 (words
    from the diagonal on are written) and ``invalid (B, W)`` int64 (invalid rows and rows ≥ M)."""
    bsz, m, _ = sbox.shape
    dev = sbox.device
    words = (m + _TILE - 1) // _TILE
    mask = torch.empty((bsz, m, words), dtype=torch.int64, device=dev)
    invalid = torch.empty((bsz, words), dtype=torch.int64, device=dev)
    get_kernel("nms.cu", "nms_mask_b", dev)(
        (words * (words + 1) // 2, bsz),
        (_MASKB_THREADS,),
        [
            sbox,
            sgroups if sgroups is not None else sbox,
            ctypes.c_int(int(sgroups is not None)),
            ctypes.c_int(m),
            ctypes.c_int(words),
            ctypes.c_float(iou_threshold),
            mask,
            invalid,
        ],
    )
    return mask, invalid


def pass_threads(words: int) -> int:
    """Threads per block of ``nms_pass_b``: 512 up to 128 mask words (8,192 boxes), 1024 above
    (the faster of 256 / 512 / 1024 at N = 4,096 and 16,384, benchmarks/NOTES.md)."""
    return 512 if words <= 128 else _PASS_THREADS


def pass_b(
    mask: torch.Tensor,
    invalid: torch.Tensor,
    order: torch.Tensor,
    out_len: int,
    *,
    threads: int | None = None,
    out: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 3 of :func:`nms_padded` (1 launch: ``nms_pass_b``, one block per sample):
    ``(indices (B, out_len) int64 −1 padded, count (B,) int64)``, written into ``out``/``count``
    when given (contiguous, ``B * out_len`` and ``B`` elements). ``threads``: threads per block, a
    multiple of 32 in [64, 1024] (default: :func:`pass_threads`; the benchmark sweeps it)."""
    if threads is None:
        threads = pass_threads(mask.shape[2])
    if threads % 32 or not 64 <= threads <= _PASS_THREADS:
        raise ValueError(f"threads: expected a multiple of 32 in [64, {_PASS_THREADS}], got {threads}")
    bsz, m, words = mask.shape
    dev = mask.device
    out = torch.empty((bsz, out_len), dtype=torch.int64, device=dev) if out is None else out
    count = torch.empty((bsz,), dtype=torch.int64, device=dev) if count is None else count
    get_kernel("nms.cu", "nms_pass_b", dev)(
        (bsz,),
        (threads,),
        [mask, invalid, order, ctypes.c_int(m), ctypes.c_int(words), ctypes.c_int(out_len), out, count],
        shared_mem=words * 8,
    )
    return out, count
