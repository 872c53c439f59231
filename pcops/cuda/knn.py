"""Launcher for ``csrc/knn.cu``: exact KNN, one thread per query, top K in registers.

The clouds are Morton-sorted and boxed by the Triton helpers of ``pcops.triton.sampling`` (the
same preprocessing as the Triton KNN); the search kernel is CUDA C++ compiled with NVRTC. It
handles ``K ≤ 32`` (the kernel keeps ``KP = next power of two ≥ K`` slots); larger ``K`` goes to
the Triton kernel.
"""
from __future__ import annotations

import ctypes

import torch
import triton

from .._nvrtc import get_kernel, nvrtc

# queries per block = references per tile (32 or 64: the kernels compiled in csrc/knn.cu) and
# tiles per superblock. Measured on the H200 (K1/K2, graph-captured): tiles of 64 beat 128 by
# 20 % (fewer distances per query: a block reads a tile if any of its queries needs it), 64 x 4
# was the best K1 shape; a buffered insertion variant was 1.5-2.5x slower and was removed.
_QB = 64
_SB = 4
_SUB = 0  # 0 or 16: sub-tiles of 16 points with boxes of their own (csrc/knn.cu knn_sub16_*)
TILES = (32, 64)
SUBS = (0, 16)
MAX_K = 32

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
    tile: int | None = None, group: int | None = None, sub: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``pcops.triton.sampling.knn`` for ``K ≤ 32``; no host synchronisation.

    Args:
        query: ``(B, Nq, 3)`` float32 contiguous; ref: ``(B, Nr, 3)`` float32 contiguous.
        query_lengths, ref_lengths: ``(B,)`` int64 (clamped to the padded sizes).
        k: ``1 ≤ K ≤ 32``.
        tile: queries per block = references per tile, 32 or 64 (default ``_QB``).
        group: tiles per superblock (default ``_SB``).
        sub: 0, or 16 for sub-tile boxes inside each tile (default ``_SUB``).
    Returns:
        ``(dists (B, Nq, K) float32, idx (B, Nq, K) int64)``, ascending, ``inf`` / −1 padded.
        Launches: the Morton sort of each side (about 14 small ops; a self-KNN with one lengths
        tensor sorts once) and one search kernel.
    """
    from ..triton.sampling import _morton_sort

    batch, nq, _ = query.shape
    nr = ref.shape[1]
    dists = torch.empty((batch, nq, k), dtype=torch.float32, device=query.device)
    idx = torch.empty((batch, nq, k), dtype=torch.int64, device=query.device)
    if dists.numel() == 0:
        return dists, idx
    if nr == 0:
        return dists.fill_(float("inf")), idx.fill_(-1)
    tile = _QB if tile is None else tile
    group = _SB if group is None else group
    sub = _SUB if sub is None else sub
    if tile not in TILES or group < 1 or sub not in SUBS:
        raise ValueError(f"tile, group, sub: expected tile in {TILES}, group >= 1, sub in {SUBS}, got {tile}, {group}, {sub}")
    if sub:
        # boxes of sub-tiles (the sort's tiles), of tiles (its superblocks), then of superblocks
        r_sorted, r_perm, sub_boxes, tile_boxes = _morton_sort(ref, ref_lengths, sub, tile // sub)
        boxes, superboxes = _group_boxes(tile_boxes, group)
    else:
        r_sorted, r_perm, boxes, superboxes = _morton_sort(ref, ref_lengths, tile, group)
        sub_boxes = boxes
    same = query.data_ptr() == ref.data_ptr() and query.shape == ref.shape and query_lengths.data_ptr() == ref_lengths.data_ptr()
    if same:  # self-KNN: one sort serves both sides
        q_sorted, q_perm = r_sorted, r_perm
    else:
        q_sorted, q_perm, _, _ = _morton_sort(query, query_lengths, tile)
    kp = triton.next_power_of_2(k)
    kernel = get_kernel("knn.cu", f"knn_{'sub16' if sub else 'sorted'}_q{tile}_k{kp}", query.device)
    kernel(
        (triton.cdiv(nq, tile), batch), (tile,),
        [q_sorted, q_perm, r_sorted, r_perm, boxes, superboxes, sub_boxes, ctypes.c_int(sub_boxes.shape[1]),
         query_lengths, ref_lengths, dists, idx,
         ctypes.c_int(nq), ctypes.c_int(nr), ctypes.c_int(superboxes.shape[1]), ctypes.c_int(group), ctypes.c_int(k)],
    )
    return dists, idx


def _group_boxes(boxes: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``boxes (B, T, 8)`` → ``(boxes padded to (B, S * group, 8), group boxes (B, S, 8))``; the
    padding boxes are inverted (+inf min, −inf max): infinitely far, never visited."""
    batch, num, _ = boxes.shape
    num_groups = triton.cdiv(num, group)
    padded = boxes.new_empty((batch, num_groups * group, 8))
    padded[:, :num] = boxes
    padded[:, num:, :3] = float("inf")
    padded[:, num:, 3:] = -float("inf")
    grouped = padded.view(batch, num_groups, group, 8)
    out = padded.new_zeros((batch, num_groups, 8))
    out[..., :3] = grouped[..., :3].amin(2)
    out[..., 3:6] = grouped[..., 3:6].amax(2)
    return padded, out
