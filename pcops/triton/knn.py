"""Triton kernels for KNN and ball query (and the Morton sort of the Triton KNN).

Every squared distance is ``dx*dx + dy*dy + dz*dz`` in that order and every kernel is launched
with ``enable_fp_fusion=False`` (no FMA contraction), so results equal the plain-torch reference
bit for bit and ties resolve identically (lowest index).

KNN: queries and references of each cloud are sorted along a Morton (Z-order) curve; the sorted
references are cut into tiles of ``_KNN_BR`` and superblocks of ``_KNN_SB`` tiles, each with a
bounding box. A program owns a block of ``_KNN_BQ`` sorted (hence spatially close) queries and
their top K as packed int64 keys ``(dist bits << 32) | original index`` (distinct keys; their
order is (distance, index), so ties go to the lowest index whatever order tiles are visited in).
Superblocks are visited outward from the block's own position along the curve; a superblock,
then a tile, is skipped when its box is farther from the block's box than every row's current
K-th distance (a sound test: the rounded box distance never exceeds a rounded point distance).
A tile that survives is merged smallest-candidate-first, one row-wide min per inserted key.

Ball query: one program per block of queries scans the references in index order, placing hits
with a running count (cumsum) until every row has K hits.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .. import _backend
from . import _launch

_F32 = struct.Struct("f")


def _f32(v: float) -> float:
    """``v`` rounded to float32, without a tensor (host-side kernel arguments)."""
    return _F32.unpack(_F32.pack(v))[0]


_KNN_BQ = 32  # sorted queries per program
_KNN_BR = 32  # sorted references per tile
_KNN_SB = 16  # tiles per superblock (two-level box test)
_KNN_WARPS = 4
_MORTON_BLOCK = 1024
_BALL_BQ = 32
_BALL_BR = 64
_MORTON_BITS = 10  # per axis: 30-bit codes
_INVALID_CODE = 1 << 30  # sorts padding after every valid point

_NO_FMA = dict(enable_fp_fusion=False)


# --- KNN: spatial sort, tiles with bounding boxes, register top-k ------------------------------


@triton.jit
def _spread_bits(v):
    # 10-bit integer -> every third bit of a 30-bit Morton code
    v = (v | (v << 16)) & 0x030000FF
    v = (v | (v << 8)) & 0x0300F00F
    v = (v | (v << 4)) & 0x030C30C3
    v = (v | (v << 2)) & 0x09249249
    return v


@triton.jit
def _morton_kernel(
    points_ptr,  # (B, N, 3) float32
    lengths_ptr,  # (B,) int64
    lo_ptr,  # (B, 3) float32 per-cloud minimum corner
    scale_ptr,  # (B, 3) float32 cells per unit length
    code_ptr,  # (B, N) int32 out: Morton code, _INVALID_CODE for padding
    n,  # N
    BLOCK: tl.constexpr,
    INVALID: tl.constexpr,
    CELLS: tl.constexpr,  # 2**bits per axis
):
    b = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    valid = live & (offs < tl.load(lengths_ptr + b))  # lengths past N (unclamped) read nothing past the cloud
    code = tl.zeros([BLOCK], dtype=tl.int32)
    for axis in tl.static_range(3):
        c = tl.load(points_ptr + (b * n + offs) * 3 + axis, mask=valid, other=0.0)
        lo = tl.load(lo_ptr + b * 3 + axis)
        scale = tl.load(scale_ptr + b * 3 + axis)
        q = tl.minimum(tl.maximum((c - lo) * scale, 0.0), CELLS - 1).to(tl.int32)
        code = code | (_spread_bits(q) << axis)
    code = tl.where(valid, code, INVALID)
    tl.store(code_ptr + b * n + offs, code, mask=live)


@triton.jit
def _sort_gather_kernel(
    points_ptr,  # (B, N, 3) float32
    perm_ptr,  # (B, N) int64: sorted position -> original index
    lengths_ptr,  # (B,) int64
    sorted_ptr,  # (B, N, 3) float32 out: points in sorted order
    box_ptr,  # (B, T, 8) float32 out: per-tile (min xyz, max xyz, -, -) of valid points
    n,  # N
    num_tiles,  # T
    TILE: tl.constexpr,
):
    t = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    pos = t * TILE + tl.arange(0, TILE)
    live = pos < n
    valid = live & (pos < tl.load(lengths_ptr + b))
    src = tl.load(perm_ptr + b * n + pos, mask=live, other=0)
    box = box_ptr + (b * num_tiles + t) * 8
    for axis in tl.static_range(3):
        c = tl.load(points_ptr + (b * n + src) * 3 + axis, mask=live, other=0.0)
        tl.store(sorted_ptr + (b * n + pos) * 3 + axis, c, mask=live)
        # an empty tile gets an inverted box (+inf, -inf): infinitely far, always skipped
        tl.store(box + axis, tl.min(tl.where(valid, c, float("inf")), axis=0))
        tl.store(box + 3 + axis, tl.max(tl.where(valid, c, -float("inf")), axis=0))


@triton.jit
def _box_lower(box, qx_lo, qy_lo, qz_lo, qx_hi, qy_hi, qz_hi):
    """Bits of the squared distance between the query block's box and ``box`` (min xyz, max xyz):
    a lower bound of every rounded point distance (rounding is monotone), so the test is exact."""
    gx = tl.maximum(tl.maximum(qx_lo - tl.load(box + 3), tl.load(box + 0) - qx_hi), 0.0)
    gy = tl.maximum(tl.maximum(qy_lo - tl.load(box + 4), tl.load(box + 1) - qy_hi), 0.0)
    gz = tl.maximum(tl.maximum(qz_lo - tl.load(box + 5), tl.load(box + 2) - qz_hi), 0.0)
    return (gx * gx + gy * gy + gz * gz).to(tl.int32, bitcast=True)


@triton.jit
def _knn_tile(r_base, r_perm, pos, r_len, qx, qy, qz, q_valid, topk, kth):
    """Merge one tile of sorted references (positions ``pos``) into the rows' top-K keys."""
    INT64_MAX: tl.constexpr = 0x7FFFFFFFFFFFFFFF
    r_valid = pos < r_len
    rx = tl.load(r_base + pos * 3 + 0, mask=r_valid, other=0.0)
    ry = tl.load(r_base + pos * 3 + 1, mask=r_valid, other=0.0)
    rz = tl.load(r_base + pos * 3 + 2, mask=r_valid, other=0.0)
    ridx = tl.load(r_perm + pos, mask=r_valid, other=0)
    dx = qx[:, None] - rx[None, :]
    dy = qy[:, None] - ry[None, :]
    dz = qz[:, None] - rz[None, :]
    d = dx * dx + dy * dy + dz * dz
    key = (d.to(tl.int32, bitcast=True).to(tl.int64) << 32) | ridx[None, :]
    key = tl.where(q_valid[:, None] & r_valid[None, :], key, INT64_MAX)
    # insert the tile's candidates smallest first; each round adds at most one per row
    n_new = tl.max(tl.sum((key < kth[:, None]).to(tl.int32), axis=1), axis=0)
    for _ in range(0, n_new):
        c = tl.min(key, axis=1)
        take = c < kth
        topk = tl.where((topk == kth[:, None]) & take[:, None], c[:, None], topk)
        key = tl.where(key == c[:, None], INT64_MAX, key)
        kth = tl.max(topk, axis=1)
    return topk, kth


@triton.jit
def _knn_kernel(
    q_ptr,  # (B, Nq, 3) float32 queries in Morton order
    q_perm_ptr,  # (B, Nq) int64 original index of each sorted query
    r_ptr,  # (B, Nr, 3) float32 references in Morton order
    r_perm_ptr,  # (B, Nr) int64 original index of each sorted reference
    box_ptr,  # (B, S * SB, 8) float32 per-tile boxes (min xyz, max xyz, -, -) of the sorted refs
    sbox_ptr,  # (B, S, 8) float32 per-superblock boxes (SB tiles each)
    q_len_ptr,  # (B,) int64
    r_len_ptr,  # (B,) int64
    dist_ptr,  # (B, Nq, K) float32 out
    idx_ptr,  # (B, Nq, K) int64 out
    nq,  # Nq
    nr,  # Nr
    num_sb,  # S = cdiv(cdiv(Nr, BR), SB)
    k,  # K
    BQ: tl.constexpr,
    BR: tl.constexpr,
    SB: tl.constexpr,  # tiles per superblock
    KP: tl.constexpr,  # next power of two >= K (>= 2)
):
    INT64_MAX: tl.constexpr = 0x7FFFFFFFFFFFFFFF
    INF_BITS: tl.constexpr = 0x7F800000
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    q_len = tl.minimum(tl.maximum(tl.load(q_len_ptr + b), 0), nq)
    r_len = tl.minimum(tl.maximum(tl.load(r_len_ptr + b), 0), nr)
    rows = pid * BQ + tl.arange(0, BQ)
    q_valid = rows < q_len
    q_base = q_ptr + b * nq * 3
    qx = tl.load(q_base + rows * 3 + 0, mask=q_valid, other=0.0)
    qy = tl.load(q_base + rows * 3 + 1, mask=q_valid, other=0.0)
    qz = tl.load(q_base + rows * 3 + 2, mask=q_valid, other=0.0)
    # the block's bounding box (sorted queries are spatially close)
    qx_lo = tl.min(tl.where(q_valid, qx, float("inf")), axis=0)
    qy_lo = tl.min(tl.where(q_valid, qy, float("inf")), axis=0)
    qz_lo = tl.min(tl.where(q_valid, qz, float("inf")), axis=0)
    qx_hi = tl.max(tl.where(q_valid, qx, -float("inf")), axis=0)
    qy_hi = tl.max(tl.where(q_valid, qy, -float("inf")), axis=0)
    qz_hi = tl.max(tl.where(q_valid, qz, -float("inf")), axis=0)

    cols = tl.arange(0, KP)
    # top-K keys per row, unordered; distinct sentinels fill the K live slots (the largest is
    # replaced first) and the KP - K spare slots hold INT64_MIN, never the maximum, never replaced
    cols64 = cols.to(tl.int64)
    spare = tl.full([KP], -0x7FFFFFFFFFFFFFFF - 1, tl.int64)
    topk = tl.where(cols < k, INT64_MAX - cols64, spare)
    topk = tl.broadcast_to(topk[None, :], [BQ, KP])
    kth = tl.max(topk, axis=1)
    # pruning threshold: the largest K-th distance bits over the live rows (sentinels: 0x7FFFFFFF)
    thresh = tl.max(tl.where(q_valid, (kth >> 32).to(tl.int32), 0), axis=0)

    n_t = tl.where(pid * BQ < q_len, tl.cdiv(r_len, BR), 0)
    n_sb = tl.cdiv(n_t, SB)
    # visit superblocks outward from the one matching the block's position along the curve
    t0 = ((pid * BQ).to(tl.int64) * r_len // tl.maximum(q_len, 1)) // BR
    sb0 = tl.minimum(t0 // SB, tl.maximum(n_sb - 1, 0))
    r_base = r_ptr + b * nr * 3
    for step in range(0, n_sb):
        off = (step + 1) // 2
        sb = tl.where(step % 2 == 1, sb0 + off, sb0 - off)
        sb = (sb + n_sb) % n_sb
        # skip unless some row could gain a point (strict: at an equal distance a lower index wins)
        sb_lower = _box_lower(sbox_ptr + (b * num_sb + sb) * 8, qx_lo, qy_lo, qz_lo, qx_hi, qy_hi, qz_hi)
        if sb_lower <= thresh:
            for tt in range(0, SB):
                tile = sb * SB + tt
                lower = _box_lower(box_ptr + (b * num_sb * SB + tile) * 8, qx_lo, qy_lo, qz_lo, qx_hi, qy_hi, qz_hi)
                if (tile < n_t) & (lower <= thresh):
                    topk, kth = _knn_tile(
                        r_base,
                        r_perm_ptr + b * nr,
                        tile * BR + tl.arange(0, BR),
                        r_len,
                        qx,
                        qy,
                        qz,
                        q_valid,
                        topk,
                        kth,
                    )
                    thresh = tl.max(tl.where(q_valid, (kth >> 32).to(tl.int32), 0), axis=0)

    # ascending order; spare slots moved to the end
    topk = tl.where(cols[None, :] < k, topk, INT64_MAX)
    topk = tl.sort(topk, dim=1)
    hi = (topk >> 32).to(tl.int32)
    found = hi <= INF_BITS
    dist = tl.where(found, hi.to(tl.float32, bitcast=True), float("inf"))
    idx = tl.where(found, topk & 0xFFFFFFFF, -1)
    row_live = rows < nq
    orig = tl.load(q_perm_ptr + b * nq + rows, mask=row_live, other=0)
    out = (b * nq + orig)[:, None] * k + cols[None, :]
    keep = row_live[:, None] & (cols[None, :] < k)
    tl.store(dist_ptr + out, dist, mask=keep)
    tl.store(idx_ptr + out, idx, mask=keep)


def _morton_sort(points: torch.Tensor, lengths: torch.Tensor, tile: int, group: int = 1):
    """Sort each cloud along a Morton curve and box its tiles.

    Args:
        points: ``(B, N, 3)`` float32; lengths: ``(B,)`` int64; tile: points per tile;
        group: tiles per superblock.
    Returns:
        ``(sorted (B, N, 3), perm (B, N) int64, boxes (B, S * group, 8), superboxes (B, S, 8))`` with
        ``S = cdiv(cdiv(N, tile), group)``; padding sorts last, empty tiles get inverted boxes.
    """
    batch, n, _ = points.shape
    perm = _morton_order(points, lengths)
    num_sb = _launch.cdiv(_launch.cdiv(n, tile), group)
    ordered = torch.empty_like(points)
    boxes = torch.empty((batch, num_sb * group, 8), dtype=torch.float32, device=points.device)
    _launch.launch(
        _sort_gather_kernel,
        (num_sb * group, batch),
        points,
        perm,
        lengths,
        ordered,
        boxes,
        n,
        num_sb * group,
        TILE=tile,
        **_NO_FMA,
    )
    grouped = boxes.view(batch, num_sb, group, 8)
    superboxes = boxes.new_zeros((batch, num_sb, 8))
    superboxes[..., :3] = grouped[..., :3].amin(2)
    superboxes[..., 3:6] = grouped[..., 3:6].amax(2)
    return ordered, perm, boxes, superboxes


def _morton_order(points: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` int64: each cloud's point indices in Morton order of 10-bit cells of its
    bounding box (stable; padding last). No host synchronisation."""
    batch, n, _ = points.shape
    valid = torch.arange(n, device=points.device)[None, :] < lengths[:, None]
    lo = points.masked_fill(~valid[..., None], float("inf")).amin(1)
    hi = points.masked_fill(~valid[..., None], -float("inf")).amax(1)
    extent = (hi - lo).nan_to_num(0.0, 0.0, 0.0).clamp_min(1e-6)
    lo = lo.nan_to_num(0.0, 0.0, 0.0).contiguous()
    cells = 1 << _MORTON_BITS
    scale = ((cells - 1) / extent).contiguous()
    code = torch.empty((batch, n), dtype=torch.int32, device=points.device)
    _launch.launch(
        _morton_kernel,
        (_launch.cdiv(n, _MORTON_BLOCK), batch),
        points,
        lengths,
        lo,
        scale,
        code,
        n,
        BLOCK=_MORTON_BLOCK,
        INVALID=_INVALID_CODE,
        CELLS=cells,
        **_NO_FMA,
    )
    return torch.sort(code, dim=1, stable=True).indices


def knn(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    k: int,
    *,
    bq: int = _KNN_BQ,
    br: int = _KNN_BR,
    sb: int = _KNN_SB,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact KNN with Morton-sorted tiles and two-level bounding-box pruning.

    Args:
        query: ``(B, Nq, 3)`` float32 contiguous; ref: ``(B, Nr, 3)`` float32 contiguous.
        query_lengths, ref_lengths: ``(B,)`` int64 (clamped to the padded sizes).
        k: ``K`` ≥ 1.
        bq, br, sb: queries per program, references per tile, tiles per superblock (tests shrink
            them so that tiny clouds span several tiles).
    Returns:
        ``(dists (B, Nq, K) float32, idx (B, Nq, K) int64)``, ascending, ``inf`` / −1 padded.
        No host synchronisation (about 12 launches: bounds, codes, sort, gather, boxes, search;
        a self-KNN (``query is ref``, same lengths tensor) sorts once).
    """
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    dists = torch.empty((batch, nq, k), dtype=torch.float32, device=query.device)
    idx = torch.empty((batch, nq, k), dtype=torch.int64, device=query.device)
    if dists.numel() == 0:
        return dists, idx
    if nr == 0:
        return dists.fill_(float("inf")), idx.fill_(-1)
    r_sorted, r_perm, boxes, superboxes = _morton_sort(ref, ref_lengths, br, sb)
    same = (
        query.data_ptr() == ref.data_ptr()
        and query.shape == ref.shape
        and query_lengths.data_ptr() == ref_lengths.data_ptr()
        and bq == br
    )
    if same:  # self-KNN: one sort serves both sides
        q_sorted, q_perm = r_sorted, r_perm
    else:
        q_sorted, q_perm, _, _ = _morton_sort(query, query_lengths, bq)
    kp = max(2, _launch.next_power_of_2(k))
    grid = (_launch.cdiv(nq, bq), batch)
    _launch.launch(
        _knn_kernel,
        grid,
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
        nq,
        nr,
        superboxes.shape[1],
        k,
        BQ=bq,
        BR=br,
        SB=sb,
        KP=kp,
        num_warps=_KNN_WARPS,
        **_NO_FMA,
    )
    _backend.log_kernel("knn", f"triton _knn_kernel KP={kp}")
    return dists, idx


# --- ball query -------------------------------------------------------------------------------


@triton.jit
def _ball_query_kernel(
    q_ptr,  # (B, Nq, 3) float32
    r_ptr,  # (B, Nr, 3) float32
    q_len_ptr,  # (B,) int64
    r_len_ptr,  # (B,) int64
    idx_ptr,  # (B, Nq, K) int64 out, pre-filled with -1
    count_ptr,  # (B, Nq) int64 out
    nq,  # Nq
    nr,  # Nr
    radius2,  # radius² (float32)
    k,  # K
    BQ: tl.constexpr,
    BR: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    q_len = tl.minimum(tl.maximum(tl.load(q_len_ptr + b), 0), nq)
    r_len = tl.minimum(tl.maximum(tl.load(r_len_ptr + b), 0), nr)
    rows = pid * BQ + tl.arange(0, BQ)
    q_valid = rows < q_len
    qx = tl.load(q_ptr + (b * nq + rows) * 3 + 0, mask=q_valid, other=0.0)
    qy = tl.load(q_ptr + (b * nq + rows) * 3 + 1, mask=q_valid, other=0.0)
    qz = tl.load(q_ptr + (b * nq + rows) * 3 + 2, mask=q_valid, other=0.0)
    count = tl.zeros([BQ], dtype=tl.int32)
    n_t = tl.where(pid * BQ < q_len, tl.cdiv(r_len, BR), 0)
    t = 0
    # references in index order, until every live row has K hits
    while (t < n_t) & (tl.min(tl.where(q_valid, count, k), axis=0) < k):
        pos = t * BR + tl.arange(0, BR)
        r_valid = pos < r_len
        rx = tl.load(r_ptr + (b * nr + pos) * 3 + 0, mask=r_valid, other=0.0)
        ry = tl.load(r_ptr + (b * nr + pos) * 3 + 1, mask=r_valid, other=0.0)
        rz = tl.load(r_ptr + (b * nr + pos) * 3 + 2, mask=r_valid, other=0.0)
        dx = qx[:, None] - rx[None, :]
        dy = qy[:, None] - ry[None, :]
        dz = qz[:, None] - rz[None, :]
        hit = (dx * dx + dy * dy + dz * dz < radius2) & q_valid[:, None] & r_valid[None, :]
        # each hit's slot: the row's count so far plus its rank among this tile's hits
        slot = count[:, None] + tl.cumsum(hit.to(tl.int32), axis=1) - 1
        keep = hit & (slot < k)
        dst = (b * nq + rows)[:, None] * k + slot
        tl.store(idx_ptr + dst, tl.broadcast_to(pos[None, :].to(tl.int64), [BQ, BR]), mask=keep)
        count += tl.sum(keep.to(tl.int32), axis=1)
        t += 1
    tl.store(count_ptr + b * nq + rows, count.to(tl.int64), mask=rows < nq)


def ball_query(
    query: torch.Tensor,
    ref: torch.Tensor,
    query_lengths: torch.Tensor,
    ref_lengths: torch.Tensor,
    radius: float,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ball query (first K hits in index order).

    Args:
        query: ``(B, Nq, 3)`` float32 contiguous; ref: ``(B, Nr, 3)`` float32 contiguous.
        query_lengths, ref_lengths: ``(B,)`` int64. radius: > 0. k: ``K`` ≥ 1.
    Returns:
        ``(idx (B, Nq, K) int64 −1 padded, counts (B, Nq) int64)``; no host synchronisation.
    """
    batch, nq, _ = query.shape
    nr = ref.shape[1]
    idx = torch.full((batch, nq, k), -1, dtype=torch.int64, device=query.device)
    counts = torch.zeros((batch, nq), dtype=torch.int64, device=query.device)
    if batch == 0 or nq == 0:
        return idx, counts
    # radius² rounded to float32 once, as the reference does
    radius2 = _f32(radius * radius)
    grid = (_launch.cdiv(nq, _BALL_BQ), batch)
    _launch.launch(
        _ball_query_kernel,
        grid,
        query,
        ref,
        query_lengths,
        ref_lengths,
        idx,
        counts,
        nq,
        nr,
        radius2,
        k,
        BQ=_BALL_BQ,
        BR=_BALL_BR,
        num_warps=4,
        **_NO_FMA,
    )
    _backend.log_kernel("ball_query", "triton _ball_query_kernel")
    return idx, counts
