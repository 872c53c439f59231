"""Triton kernels for farthest point sampling (the GPU fallback of ``pcops.farthest_point_sample``).

One program per cloud. Small clouds (N ≤ ``_FPS_REG_MAX``) keep coordinates and running
min-distances in registers; each of the M steps is one distance update and one argmax reduction
(``tl.argmax`` returns the first maximum: the lowest index). Larger clouds stream their points from
global memory (L2) in chunks each step: simple and correct, not fast; the CUDA C++ kernel
(``csrc/fps.cu``) is the fast path up to 131,072 points. Every squared distance is
``dx*dx + dy*dy + dz*dz`` in that order, launched with ``enable_fp_fusion=False`` (no FMA
contraction), so the indices equal the plain-torch reference, ties included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _backend
from . import _launch

_FPS_REG_MAX = 16384  # largest cloud held in registers (BLOCK = next power of two of N)
_FPS_CHUNK = 4096  # points per chunk of the streaming FPS kernel

_NO_FMA = dict(enable_fp_fusion=False)


@triton.jit
def _fps_kernel(
    points_ptr,  # (B, N, 3) float32
    lengths_ptr,  # (B,) int64 valid counts
    start_ptr,  # (B,) int64 first index
    out_ptr,  # (B, M) int64, pre-filled with -1
    n,  # N
    num_samples,  # M
    BLOCK: tl.constexpr,  # next power of two >= N
):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    length = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), n).to(tl.int32)
    start = tl.load(start_ptr + b)
    # an invalid start gives a row of -1 (the CPU path raises instead)
    steps = tl.where((start >= 0) & (start < length), tl.minimum(length, num_samples), 0)
    valid = offs < length
    base = points_ptr + b * n * 3
    # the cloud lives in registers for all M steps
    x = tl.load(base + offs * 3 + 0, mask=valid, other=0.0)
    y = tl.load(base + offs * 3 + 1, mask=valid, other=0.0)
    z = tl.load(base + offs * 3 + 2, mask=valid, other=0.0)
    # running squared distance to the chosen set; -1 marks padding and chosen points
    min_dist = tl.where(valid, float("inf"), -1.0)
    sel = start.to(tl.int32)
    for s in range(0, steps):
        tl.store(out_ptr + b * num_samples + s, sel.to(tl.int64))
        # the new centre: three scalar loads (L1-resident) instead of three register reductions
        cx = tl.load(base + sel * 3 + 0)
        cy = tl.load(base + sel * 3 + 1)
        cz = tl.load(base + sel * 3 + 2)
        dx = x - cx
        dy = y - cy
        dz = z - cz
        min_dist = tl.minimum(min_dist, dx * dx + dy * dy + dz * dz)
        min_dist = tl.where(offs == sel, -1.0, min_dist)
        # one reduction per step; argmax returns the first maximum (lowest index on ties)
        sel = tl.argmax(min_dist, axis=0).to(tl.int32)


@triton.jit
def _fps_stream_kernel(
    points_ptr,  # (B, N, 3) float32
    lengths_ptr,  # (B,) int64
    start_ptr,  # (B,) int64
    min_dist_ptr,  # (B, N) float32 scratch: running min-distance
    out_ptr,  # (B, M) int64, pre-filled with -1
    n,  # N
    num_samples,  # M
    CHUNK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), n).to(tl.int32)
    start = tl.load(start_ptr + b)
    steps = tl.where((start >= 0) & (start < length), tl.minimum(length, num_samples), 0)
    base = points_ptr + b * n * 3
    dist_base = min_dist_ptr + b * n
    for c0 in range(0, length, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        tl.store(dist_base + offs, tl.full([CHUNK], float("inf"), tl.float32), mask=offs < length)
    sel = start.to(tl.int32)
    for s in range(0, steps):
        tl.store(out_ptr + b * num_samples + s, sel.to(tl.int64))
        cx = tl.load(base + sel * 3 + 0)
        cy = tl.load(base + sel * 3 + 1)
        cz = tl.load(base + sel * 3 + 2)
        best = -2.0
        best_idx = 0
        # chunks in increasing index order; a strictly larger value is needed to move the best,
        # so ties keep the lowest index
        for c0 in range(0, length, CHUNK):
            offs = c0 + tl.arange(0, CHUNK)
            live = offs < length
            x = tl.load(base + offs * 3 + 0, mask=live, other=0.0)
            y = tl.load(base + offs * 3 + 1, mask=live, other=0.0)
            z = tl.load(base + offs * 3 + 2, mask=live, other=0.0)
            md = tl.load(dist_base + offs, mask=live, other=-1.0)
            dx = x - cx
            dy = y - cy
            dz = z - cz
            md = tl.minimum(md, dx * dx + dy * dy + dz * dz)
            md = tl.where(offs == sel, -1.0, md)
            md = tl.where(live, md, -1.0)
            tl.store(dist_base + offs, md, mask=live)
            i = tl.argmax(md, axis=0)
            v = tl.max(md, axis=0)
            better = v > best
            best = tl.where(better, v, best)
            best_idx = tl.where(better, c0 + i, best_idx)
        sel = best_idx.to(tl.int32)


def farthest_point_sample(
    points: torch.Tensor,
    lengths: torch.Tensor,
    start_idx: torch.Tensor,
    num_samples: int,
    *,
    reg_max: int = _FPS_REG_MAX,
    chunk: int = _FPS_CHUNK,
) -> torch.Tensor:
    """Farthest point sampling on the GPU (or under the interpreter).

    Args:
        points: ``(B, N, 3)`` float32 contiguous.
        lengths: ``(B,)`` int64 valid counts (clamped to ``[0, N]``).
        start_idx: ``(B,)`` int64 first index (a row of −1 where outside ``[0, length)``).
        num_samples: ``M``.
        reg_max, chunk: the largest cloud kept in registers and the streaming kernel's chunk
            (tests shrink them to exercise the streaming kernel on tiny clouds).
    Returns:
        ``(B, M)`` int64 indices, −1 padded; no host synchronisation.
    """
    batch, n, _ = points.shape
    out = torch.full((batch, num_samples), -1, dtype=torch.int64, device=points.device)
    if batch == 0 or n == 0:
        return out
    if n <= reg_max:
        block = max(16, _launch.next_power_of_2(n))
        num_warps = min(32, max(4, block // 512))
        _launch.launch(
            _fps_kernel,
            (batch,),
            points,
            lengths,
            start_idx,
            out,
            n,
            num_samples,
            BLOCK=block,
            num_warps=num_warps,
            **_NO_FMA,
        )
        _backend.log_kernel("farthest_point_sample", f"triton _fps_kernel BLOCK={block}")
    else:
        scratch = torch.empty((batch, n), dtype=torch.float32, device=points.device)
        _launch.launch(
            _fps_stream_kernel,
            (batch,),
            points,
            lengths,
            start_idx,
            scratch,
            out,
            n,
            num_samples,
            CHUNK=chunk,
            num_warps=16,
            **_NO_FMA,
        )
        _backend.log_kernel("farthest_point_sample", f"triton _fps_stream_kernel CHUNK={chunk}")
    return out
