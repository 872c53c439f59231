"""Launcher for ``csrc/knn.cu``: exact KNN, one thread per query, top K in registers (K ≤ 32).

Both clouds are Morton-sorted and boxed by csrc/knn.cu's prep kernels (``knn_prep_bounds``,
``knn_prep_codes``, one ``torch.sort``, ``knn_prep_gather``: the same outputs as
``pcops.triton.knn._morton_sort``), then one search kernel ``knn_netfu_q32_k<KP>`` runs (KP = next
power of two ≥ K slots). Larger ``K`` goes to the Triton kernel under ``backend="auto"``. The
measurements that chose this shape (and the variants removed) are in ``benchmarks/NOTES.md``.
"""

from __future__ import annotations

import ctypes

import torch

from .. import _backend
from .._nvrtc import get_kernel, nvrtc

TILE = 32  # queries per block = references per tile (smaller tiles measured faster)
MAX_K = 32  # the largest K the kernels are compiled for (KP = next power of two of K, up to 32)
_MAX_BATCH = 65535  # clouds are grid.y
_PREP_THREADS = 256  # threads per block of the prep kernels
_PREP_BOUNDS_CHUNK = 2048  # points per block of knn_prep_bounds (more for clouds over 2M points)
_PREP_CODES_PER_THREAD = 4  # points per thread of knn_prep_codes

_available: dict[int, str | None] = {}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(k: int) -> int:
    return 1 << (k - 1).bit_length()


def default_group(n: int) -> int:
    """Tiles per superblock for clouds of ``n`` reference points (measured: 4 for 16k, 8 for 120k)."""
    return 4 if n <= 32_768 else 8


def unsupported_reason(query: torch.Tensor, k: int) -> str | None:
    """Why the CUDA kernel cannot run for ``query (B, Nq, 3)`` and ``k`` (None: it can)."""
    if k > MAX_K:
        return f"k: the CUDA kernel is compiled for K <= {MAX_K}, got {k}"
    if query.shape[0] > _MAX_BATCH:
        return f"at most {_MAX_BATCH} clouds, got {query.shape[0]}"
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if index not in _available:
        try:
            nvrtc()
            _available[index] = None
        except RuntimeError as e:
            _available[index] = str(e)
    return _available[index]


def supported(query: torch.Tensor, k: int) -> bool:
    """Whether the CUDA C++ kernel can run here: NVRTC present, ``K ≤ 32``, batch ≤ 65,535."""
    return unsupported_reason(query, k) is None


def knn(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    k: int,
    *,
    group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``pcops.triton.knn.knn`` for ``K ≤ 32``; no host synchronisation.

    Args:
        query: ``(B, Nq, 3)`` float32; ref: ``(B, Nr, 3)`` float32 (copied if not contiguous).
        query_lengths, ref_lengths: ``(B,)`` int64 (clamped to the padded sizes).
        k: ``1 ≤ K ≤ 32``.
        group: tiles per superblock (default ``default_group(Nr)``; any value ≥ 1 gives the same
            results, tests vary it to exercise the superblock walk).
    Returns:
        ``(dists (B, Nq, K) float32, idx (B, Nq, K) int64)``, ascending, ``inf`` / −1 padded.
        Launches: the Morton sort of each side (a self-KNN with one lengths tensor sorts once)
        and one search kernel.
    Raises:
        RuntimeError: where the kernel cannot run (``unsupported_reason``).
    """
    reason = unsupported_reason(query, k)
    if reason is not None:
        raise RuntimeError(f"backend 'cuda': knn cannot run here: {reason}")
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    dists = torch.empty((batch, nq, k), dtype=torch.float32, device=query.device)
    idx = torch.empty((batch, nq, k), dtype=torch.int64, device=query.device)
    if dists.numel() == 0:
        return dists, idx
    if nr == 0:
        return dists.fill_(float("inf")), idx.fill_(-1)
    group = default_group(nr) if group is None else group
    if group < 1:
        raise ValueError(f"group: expected tiles per superblock >= 1, got {group}")
    # the kernels index dense rows (no-ops for the op's own calls; a strided view is copied)
    query, ref = query.contiguous(), ref.contiguous()
    query_lengths, ref_lengths = query_lengths.contiguous(), ref_lengths.contiguous()
    prepared = prepare(query, ref, query_lengths, ref_lengths, group)
    search(prepared, query_lengths, ref_lengths, dists, idx, k, group)
    return dists, idx


def prepare(query, ref, query_lengths, ref_lengths, group: int) -> tuple:
    """The Morton sort of both sides (one for a self-KNN): ``(q_sorted, q_perm, r_sorted, r_perm,
    boxes, superboxes)``. Split from ``search`` so a benchmark can time each part."""
    r_sorted, r_perm, boxes, superboxes = morton_sort(ref, ref_lengths, group)
    same = (
        query.data_ptr() == ref.data_ptr()
        and query.shape == ref.shape
        and query_lengths.data_ptr() == ref_lengths.data_ptr()
    )
    if same:  # self-KNN: one sort serves both sides
        q_sorted, q_perm = r_sorted, r_perm
    else:
        q_sorted, q_perm, _, _ = morton_sort(query, query_lengths)
    return q_sorted, q_perm, r_sorted, r_perm, boxes, superboxes


def morton_sort(points: torch.Tensor, lengths: torch.Tensor, group: int = 1):
    """``pcops.triton.knn._morton_sort(points, lengths, TILE, group)`` with csrc/knn.cu's prep kernels:
    the same ``(sorted (B, N, 3), perm (B, N) int64, boxes (B, S * group, 8), superboxes (B, S, 8))``."""
    batch, n, _ = points.shape
    threads = _PREP_THREADS
    per = max(_PREP_BOUNDS_CHUNK, _cdiv(n, 1024))  # points per bounds block (at most 1,024 blocks)
    chunks = _cdiv(n, per)
    partial = torch.empty((batch, chunks, 6), dtype=torch.float32, device=points.device)
    get_kernel("knn.cu", "knn_prep_bounds", points.device)(
        (chunks, batch), (threads,), [points, lengths, partial, ctypes.c_int(n), ctypes.c_int(per)]
    )
    code = torch.empty((batch, n), dtype=torch.int32, device=points.device)
    per_block = threads * _PREP_CODES_PER_THREAD
    get_kernel("knn.cu", "knn_prep_codes", points.device)(
        (_cdiv(n, per_block), batch),
        (threads,),
        [points, lengths, partial, code, ctypes.c_int(n), ctypes.c_int(chunks), ctypes.c_int(per_block)],
    )
    perm = torch.sort(code, dim=1, stable=True).indices
    num_sb = _cdiv(_cdiv(n, TILE), group)
    ordered = torch.empty_like(points)
    boxes = torch.empty((batch, num_sb * group, 8), dtype=torch.float32, device=points.device)
    superboxes = torch.empty((batch, num_sb, 8), dtype=torch.float32, device=points.device)
    get_kernel("knn.cu", "knn_prep_gather", points.device)(
        (num_sb, batch),
        (threads,),
        [
            points,
            perm,
            lengths,
            ordered,
            boxes,
            superboxes,
            ctypes.c_int(n),
            ctypes.c_int(num_sb),
            ctypes.c_int(group),
            ctypes.c_int(TILE),
        ],
    )
    return ordered, perm, boxes, superboxes


def search(prepared: tuple, query_lengths, ref_lengths, dists, idx, k: int, group: int) -> None:
    """One launch of the search kernel ``knn_netfu_q32_k<KP>`` on ``prepare``'s output, writing
    ``dists`` and ``idx`` (``(B, Nq, K)``; ``Nq ≥ 1``, ``Nr ≥ 1``)."""
    q_sorted, q_perm, r_sorted, r_perm, boxes, superboxes = prepared
    batch, nq, _ = q_sorted.shape
    nr = r_sorted.shape[1]
    name = f"knn_netfu_q{TILE}_k{_next_pow2(k)}"
    kernel = get_kernel("knn.cu", name, q_sorted.device)
    kernel(
        (_cdiv(nq, TILE), batch),
        (TILE,),
        [
            q_sorted,
            q_perm,
            r_sorted,
            r_perm,
            boxes,
            superboxes,
            query_lengths,
            ref_lengths,
            dists,
            idx,
            ctypes.c_int(nq),
            ctypes.c_int(nr),
            ctypes.c_int(superboxes.shape[1]),
            ctypes.c_int(group),
            ctypes.c_int(k),
        ],
    )
    _backend.log_kernel("knn", name)
