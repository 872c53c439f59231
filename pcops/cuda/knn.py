"""Launcher for ``csrc/knn.cu``: exact KNN, one thread per query, top K in registers.

The clouds are Morton-sorted and boxed by the Triton helpers of ``pcops.triton.sampling`` (the
same preprocessing as the Triton KNN), or with the same outputs by csrc/knn.cu's prep kernels
(``prep="cuda"``); the search kernel is CUDA C++ compiled with NVRTC. It
handles ``K ≤ 32`` (the kernel keeps ``KP = next power of two ≥ K`` slots); larger ``K`` goes to
the Triton kernel.
"""
from __future__ import annotations

import ctypes

import torch
import triton

from .._nvrtc import get_kernel, nvrtc

# queries per block = references per tile (32 or 64: the kernels compiled in csrc/knn.cu) and
# tiles per superblock. Measured on the H200 (graph-captured; benchmarks/results/sampling.json):
# K1 (8 x 16,384, K = 16) 1.30 ms with 32 x 4, 1.33 with 32 x 8, 1.50 with 64 x 4, 1.90 with
# 128 x 8; K2 (120,268) 1.72 ms with 32 x 8, 1.95 with 32 x 4. Smaller tiles win because a
# block reads a tile whenever one of its queries needs it. Tried and removed: a per-thread
# buffered insertion (1.5-2.5x slower) and boxes for sub-tiles of 16 (no gain).
_QB = 32
TILES = (32, 64)
MAX_K = 32  # the largest K the kernels are compiled for (KP = next power of two of K, up to 32)

# top-K code shape (csrc/knn.cu; kernel knn_<variant>_q<tile>_k<KP>), all exact and identical:
# "sorted": (distance, index) arrays with a compare-and-swap chain; for KP < 32 the compiler keeps
#   them in local memory (the K-th best is read at the run-time index k - 1).
# "net": 64-bit keys right-aligned in KP slots (the K-th best is always the last slot: registers
#   only), inserted on the spot with a select network (no KP-long dependent chain).
# "netfu" (default): "net" that scans the block's own tile first (the K-th bests start small: on
#   K1 a query inserts 48 candidates instead of 67, by a CPU emulation of the kernel) with the
#   candidate loop of full tiles unrolled 4 times (independent loads and distances: the search is
#   latency-bound). Other shapes (own tile only, list-quarter skips, superblock and point pre-tests,
#   warp queues) were measured slower or not needed and removed (csrc/knn.cu lists them).
# "netfu" is capped at 64 registers for K <= 16 (32 resident warps per SM, so
# K1's 4,096 one-warp blocks run in one wave; ptxas reports no spills) and at 80-128 for K = 32.
# H200, 04:05 run (graph-captured; whole op / search kernel alone, ms; Morton sort 0.13 ms with
# prep="triton", 0.09 with "cuda"): K1 K=16 sorted 1.32 / 1.16, net 0.76 / 0.63, netfu 0.69 / 0.56;
# K1 K=32 sorted 1.85 / 1.73, net 1.30 / 1.16, netfu 1.22 / 1.11; K2 sorted 1.74 / 1.61, net 1.08 /
# 0.99, netfu 0.96 / 0.85 (csrc/knn.cu lists the removed variants' figures).
VARIANTS = ("sorted", "net", "netfu")
ALL_TILES = ("sorted", "net", "netfu")  # compiled for every tile in TILES (experimental variants: 32 only)
_VARIANT = "netfu"

# Morton sort and boxes: "triton" (pcops.triton.sampling._morton_sort: about 18 launches; H200
# K1 0.132 ms, K2 0.112) or "cuda" (default: csrc/knn.cu knn_prep_bounds + knn_prep_codes +
# torch.sort + knn_prep_gather, the same outputs in 4-5 launches; K1 0.092 ms, K2 0.069)
PREPS = ("triton", "cuda")
_PREP = "cuda"
_PREP_THREADS = 256  # threads per block of the prep kernels
_PREP_BOUNDS_CHUNK = 2048  # points per block of knn_prep_bounds (more for clouds over 2M points)
_PREP_CODES_PER_THREAD = 4  # points per thread of knn_prep_codes


def _group(n: int) -> int:
    """Tiles per superblock for clouds of ``n`` reference points (measured: 4 for 16k, 8 for 120k)."""
    return 4 if n <= 32_768 else 8


_available: dict[int, bool] = {}


def supported(query: torch.Tensor, k: int) -> bool:
    """Whether the CUDA C++ kernel can run here: NVRTC present, ``K ≤ 32``, batch ≤ 65,535."""
    if k > MAX_K or query.shape[0] > 65535:
        return False
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if index not in _available:
        try:
            nvrtc()
            _available[index] = True
        except RuntimeError:
            _available[index] = False
    return _available[index]


def knn(
    query: torch.Tensor, ref: torch.Tensor, query_lengths: torch.Tensor, ref_lengths: torch.Tensor, k: int,
    tile: int | None = None, group: int | None = None, variant: str | None = None, prep: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``pcops.triton.sampling.knn`` for ``K ≤ 32``; no host synchronisation.

    Args:
        query: ``(B, Nq, 3)`` float32; ref: ``(B, Nr, 3)`` float32 (copied if not contiguous).
        query_lengths, ref_lengths: ``(B,)`` int64 (clamped to the padded sizes).
        k: ``1 ≤ K ≤ 32``.
        tile: queries per block = references per tile, 32 or 64 (default ``_QB``).
        group: tiles per superblock (default: 4 up to 32,768 reference points, else 8).
        variant: top-K code shape, one of ``VARIANTS`` (default ``_VARIANT``); same results.
        prep: Morton sort implementation, one of ``PREPS`` (default ``_PREP``); same results.
    Returns:
        ``(dists (B, Nq, K) float32, idx (B, Nq, K) int64)``, ascending, ``inf`` / −1 padded.
        Launches: the Morton sort of each side (about 14 small ops; a self-KNN with one lengths
        tensor sorts once) and one search kernel.
    """
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    dists = torch.empty((batch, nq, k), dtype=torch.float32, device=query.device)
    idx = torch.empty((batch, nq, k), dtype=torch.int64, device=query.device)
    if dists.numel() == 0:
        return dists, idx
    if nr == 0:
        return dists.fill_(float("inf")), idx.fill_(-1)
    tile, group, variant = _options(nr, tile, group, variant)
    # the kernels index dense rows (no-ops for the op's own calls; a strided view is copied)
    query, ref = query.contiguous(), ref.contiguous()
    query_lengths, ref_lengths = query_lengths.contiguous(), ref_lengths.contiguous()
    prepared = prepare(query, ref, query_lengths, ref_lengths, tile, group, prep)
    search(prepared, query_lengths, ref_lengths, dists, idx, k, tile, group, variant)
    return dists, idx


def _options(nr: int, tile: int | None, group: int | None, variant: str | None) -> tuple[int, int, str]:
    tile = _QB if tile is None else tile
    group = _group(nr) if group is None else group
    variant = _VARIANT if variant is None else variant
    if tile not in TILES or group < 1:
        raise ValueError(f"tile, group: expected tile in {TILES} and group >= 1, got {tile}, {group}")
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    if tile != TILES[0] and variant not in ALL_TILES:
        raise ValueError(f"tile: variant {variant!r} is compiled for tiles of {TILES[0]} only, got {tile}")
    return tile, group, variant


def prepare(query, ref, query_lengths, ref_lengths, tile: int, group: int, prep: str | None = None) -> tuple:
    """The Morton sort of both sides (one for a self-KNN): ``(q_sorted, q_perm, r_sorted, r_perm,
    boxes, superboxes)``. Split from ``search`` so a benchmark can time each part."""
    prep = _PREP if prep is None else prep
    if prep not in PREPS:
        raise ValueError(f"prep: expected one of {PREPS}, got {prep!r}")
    if prep == "cuda":
        _morton_sort = _morton_sort_cuda
    else:
        from ..triton.sampling import _morton_sort

    r_sorted, r_perm, boxes, superboxes = _morton_sort(ref, ref_lengths, tile, group)
    same = query.data_ptr() == ref.data_ptr() and query.shape == ref.shape and query_lengths.data_ptr() == ref_lengths.data_ptr()
    if same:  # self-KNN: one sort serves both sides
        q_sorted, q_perm = r_sorted, r_perm
    else:
        q_sorted, q_perm, _, _ = _morton_sort(query, query_lengths, tile)
    return q_sorted, q_perm, r_sorted, r_perm, boxes, superboxes


def _morton_sort_cuda(points: torch.Tensor, lengths: torch.Tensor, tile: int, group: int = 1):
    """``pcops.triton.sampling._morton_sort`` with csrc/knn.cu's prep kernels: the same
    ``(sorted (B, N, 3), perm (B, N) int64, boxes (B, S * group, 8), superboxes (B, S, 8))``."""
    batch, n, _ = points.shape
    threads = _PREP_THREADS
    per = max(_PREP_BOUNDS_CHUNK, triton.cdiv(n, 1024))  # points per bounds block (at most 1,024 blocks)
    chunks = triton.cdiv(n, per)
    partial = torch.empty((batch, chunks, 6), dtype=torch.float32, device=points.device)
    get_kernel("knn.cu", "knn_prep_bounds", points.device)(
        (chunks, batch), (threads,), [points, lengths, partial, ctypes.c_int(n), ctypes.c_int(per)])
    code = torch.empty((batch, n), dtype=torch.int32, device=points.device)
    per_block = threads * _PREP_CODES_PER_THREAD
    get_kernel("knn.cu", "knn_prep_codes", points.device)(
        (triton.cdiv(n, per_block), batch), (threads,),
        [points, lengths, partial, code, ctypes.c_int(n), ctypes.c_int(chunks), ctypes.c_int(per_block)])
    perm = torch.sort(code, dim=1, stable=True).indices
    num_sb = triton.cdiv(triton.cdiv(n, tile), group)
    ordered = torch.empty_like(points)
    boxes = torch.empty((batch, num_sb * group, 8), dtype=torch.float32, device=points.device)
    superboxes = torch.empty((batch, num_sb, 8), dtype=torch.float32, device=points.device)
    get_kernel("knn.cu", "knn_prep_gather", points.device)(
        (num_sb, batch), (threads,),
        [points, perm, lengths, ordered, boxes, superboxes, ctypes.c_int(n), ctypes.c_int(num_sb), ctypes.c_int(group),
         ctypes.c_int(tile)])
    return ordered, perm, boxes, superboxes


def search(prepared: tuple, query_lengths, ref_lengths, dists, idx, k: int, tile: int, group: int, variant: str) -> None:
    """One launch of the search kernel ``knn_<variant>_q<tile>_k<KP>`` on ``prepare``'s output,
    writing ``dists`` and ``idx`` (``(B, Nq, K)``; ``Nq ≥ 1``, ``Nr ≥ 1``)."""
    q_sorted, q_perm, r_sorted, r_perm, boxes, superboxes = prepared
    batch, nq, _ = q_sorted.shape
    nr = r_sorted.shape[1]
    kp = triton.next_power_of_2(k)
    kernel = get_kernel("knn.cu", f"knn_{variant}_q{tile}_k{kp}", q_sorted.device)
    kernel(
        (triton.cdiv(nq, tile), batch), (tile,),
        [q_sorted, q_perm, r_sorted, r_perm, boxes, superboxes, query_lengths, ref_lengths, dists, idx,
         ctypes.c_int(nq), ctypes.c_int(nr), ctypes.c_int(superboxes.shape[1]), ctypes.c_int(group), ctypes.c_int(k)],
    )
