"""Two Triton kernels for PointPillars' sync-free post-processing on CUDA (issue 19's E1 eager):
the decoding of the top-k anchors and the gathering of the kept boxes after the NMS.

They replace about 70 small torch ops of :meth:`PostProcessMixin._post_fast`'s CPU path (index
arithmetic, gathers, :func:`box_coder.decode_boxes`, :func:`box_coder.apply_direction`, the
score threshold and the final masking), each with its own launch, by one launch each. The
arithmetic is the same operation by operation, without FMA contraction, with the correctly
rounded square root and division, libdevice's ``expf`` and ATen's CUDA rounding of a division by
a Python scalar (a multiplication by its float32 reciprocal), so the results are bit-identical
to the torch ops (a GPU test checks it; the one exception: Triton links libdevice with
flush-to-zero, so an ``exp`` whose result is subnormal, of an argument below -87, gives 0), and the
argmax over direction bins takes ATen's rule (the first maximum; a NaN wins).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from pcops.triton import _fused_common, _launch
from pcops.triton.knn import _f32

# read by @triton.jit code: the interpreter lacks libdevice (its exp is numpy's)
_INTERPRET = tl.constexpr(_fused_common.interpreting())

_BLOCK = 128
_FINAL_BLOCK = 512


@triton.jit
def _expf(x):
    """CUDA's ``expf`` (libdevice), as ATen's ``torch.exp`` and ``torch.sigmoid`` compute it."""
    if _INTERPRET:
        y = tl.exp(x)
    else:
        y = libdevice.exp(x)
    return y


@triton.jit
def _decode_kernel(
    dense_ptr,  # (B, HW * CH) head output, float32 or float16/bfloat16
    top_ptr,  # (B, K) int64: top-k anchor ids (cell * A + anchor)
    top_logit_ptr,  # (B, K) float32
    label_ptr,  # (B, HW * A) int64: argmax class per anchor
    anchors_ptr,  # (HW * A, 7) float32
    boxes_ptr,  # (B, K, 7) float32 out
    scores_ptr,  # (B, K) float32 out: sigmoid(top_logit)
    labels_ptr,  # (B, K) int64 out: class id + 1
    nms_scores_ptr,  # (B, K) float32 out: score, NaN below the threshold
    k,
    row_stride,  # HW * CH
    label_stride,  # HW * A
    score_thresh,
    dir_offset,
    dir_limit_offset,
    period,
    inv_period,
    A: tl.constexpr,
    CH: tl.constexpr,
    N_CLS_CH: tl.constexpr,
    N_BOX_CH: tl.constexpr,
    NB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < k
    t = tl.load(top_ptr + b * k + i, mask=m, other=0)
    logit = tl.load(top_logit_ptr + b * k + i, mask=m, other=0.0)
    score = tl.div_rn(1.0, 1.0 + _expf(-logit))  # ATen's CUDA sigmoid
    lab = tl.load(label_ptr + b * label_stride + t, mask=m, other=0) + 1
    cell = t // A
    loc = t % A
    base = dense_ptr + b * row_stride + cell * CH
    box = base + N_CLS_CH + loc * 7
    xt = tl.load(box + 0, mask=m, other=0.0).to(tl.float32)
    yt = tl.load(box + 1, mask=m, other=0.0).to(tl.float32)
    zt = tl.load(box + 2, mask=m, other=0.0).to(tl.float32)
    dxt = tl.load(box + 3, mask=m, other=0.0).to(tl.float32)
    dyt = tl.load(box + 4, mask=m, other=0.0).to(tl.float32)
    dzt = tl.load(box + 5, mask=m, other=0.0).to(tl.float32)
    rt = tl.load(box + 6, mask=m, other=0.0).to(tl.float32)
    anc = anchors_ptr + t * 7
    xa = tl.load(anc + 0, mask=m, other=0.0)
    ya = tl.load(anc + 1, mask=m, other=0.0)
    za = tl.load(anc + 2, mask=m, other=0.0)
    dxa = tl.load(anc + 3, mask=m, other=0.0)
    dya = tl.load(anc + 4, mask=m, other=0.0)
    dza = tl.load(anc + 5, mask=m, other=0.0)
    ra = tl.load(anc + 6, mask=m, other=0.0)
    diagonal = tl.sqrt_rn(dxa * dxa + dya * dya)
    # direction bin: ATen's max over the last dim (first maximum; a NaN wins)
    d = base + N_CLS_CH + N_BOX_CH + loc * NB
    best = tl.load(d, mask=m, other=0.0).to(tl.float32)
    arg = tl.zeros([BLOCK], dtype=tl.int32)
    for j in tl.static_range(1, NB):
        v = tl.load(d + j, mask=m, other=0.0).to(tl.float32)
        take = ((v > best) | (v != v)) & (best == best)
        best = tl.where(take, v, best)
        arg = tl.where(take, j, arg)
    heading = rt + ra
    # limit_period(heading - dir_offset, dir_limit_offset, period) + dir_offset + period * bin
    val = heading - dir_offset
    rot = val - tl.floor(val * inv_period + dir_limit_offset) * period
    heading = (rot + dir_offset) + period * arg.to(tl.float32)
    out = boxes_ptr + (b * k + i) * 7
    tl.store(out + 0, xt * diagonal + xa, mask=m)
    tl.store(out + 1, yt * diagonal + ya, mask=m)
    tl.store(out + 2, zt * dza + za, mask=m)
    tl.store(out + 3, _expf(dxt) * dxa, mask=m)
    tl.store(out + 4, _expf(dyt) * dya, mask=m)
    tl.store(out + 5, _expf(dzt) * dza, mask=m)
    tl.store(out + 6, heading, mask=m)
    tl.store(scores_ptr + b * k + i, score, mask=m)
    tl.store(labels_ptr + b * k + i, lab, mask=m)
    tl.store(nms_scores_ptr + b * k + i, tl.where(score >= score_thresh, score, float("nan")), mask=m)


@triton.jit
def _final_kernel(
    idx_ptr,  # (B, KMAX) int64 kept indices into the top-k, -1 padded
    boxes_ptr,  # (B, K, 7) float32
    scores_ptr,  # (B, K) float32
    labels_ptr,  # (B, K) int64
    out_boxes_ptr,  # (B, KMAX, 7) float32 out
    out_scores_ptr,  # (B, KMAX) float32 out
    out_labels_ptr,  # (B, KMAX) int64 out
    count_ptr,  # (B,) int64 out
    k,
    kmax,
    score_thresh,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    total = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, kmax, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = j < kmax
        idx = tl.load(idx_ptr + b * kmax + j, mask=m, other=-1)
        safe = tl.maximum(idx, 0)
        sc = tl.load(scores_ptr + b * k + safe, mask=m, other=0.0)
        valid = (idx >= 0) & (sc >= score_thresh)
        vf = valid.to(tl.float32)
        for c in tl.static_range(7):
            v = tl.load(boxes_ptr + (b * k + safe) * 7 + c, mask=m, other=0.0)
            tl.store(out_boxes_ptr + (b * kmax + j) * 7 + c, v * vf, mask=m)
        tl.store(out_scores_ptr + b * kmax + j, sc * vf, mask=m)
        lab = tl.load(labels_ptr + b * k + safe, mask=m, other=0)
        tl.store(out_labels_ptr + b * kmax + j, lab * valid.to(tl.int64), mask=m)
        total += (valid & m).to(tl.int64)
    tl.store(count_ptr + b, tl.sum(total, axis=0))


def decode_top(flat, top, top_logit, label, anchors, n_cls_ch, n_box_ch, num_bins, cfg):
    """``(boxes (B, K, 7), scores (B, K), labels (B, K) int64, nms_scores (B, K))`` of the top-k
    anchors ``top (B, K)`` of the fused head output ``flat (B, H * W, CH)`` (contiguous), with
    ``label (B, H * W, A)`` the best class per anchor; the NMS scores are NaN below
    ``cfg.score_thresh``. One launch, no host sync."""
    bsz, hw, ch = flat.shape
    k = top.shape[1]
    flat, top, top_logit, label, anchors = (t.contiguous() for t in (flat, top, top_logit, label, anchors))
    a_loc = cfg.num_anchors_per_location
    dev = flat.device
    boxes = torch.empty((bsz, k, 7), dtype=torch.float32, device=dev)
    scores = torch.empty((bsz, k), dtype=torch.float32, device=dev)
    labels = torch.empty((bsz, k), dtype=torch.int64, device=dev)
    nms_scores = torch.empty((bsz, k), dtype=torch.float32, device=dev)
    period = 2 * math.pi / num_bins
    _launch.launch(
        _decode_kernel,
        (triton.cdiv(k, _BLOCK), bsz),
        flat,
        top,
        top_logit,
        label,
        anchors,
        boxes,
        scores,
        labels,
        nms_scores,
        k,
        hw * ch,
        hw * a_loc,
        _f32(cfg.score_thresh),
        _f32(cfg.dir_offset),
        _f32(cfg.dir_limit_offset),
        _f32(period),
        _f32(1.0 / _f32(period)),
        A=a_loc,
        CH=ch,
        N_CLS_CH=n_cls_ch,
        N_BOX_CH=n_box_ch,
        NB=num_bins,
        BLOCK=_BLOCK,
        enable_fp_fusion=False,
    )
    return boxes, scores, labels, nms_scores


def gather_kept(idx, boxes, scores, labels, score_thresh):
    """The kept detections ``idx (B, KMAX)`` (−1 padded) of the decoded top-k: ``(boxes, scores,
    labels, count)`` with the padding rows zero, as the torch path returns them. One launch."""
    bsz, kmax = idx.shape
    k = boxes.shape[1]
    idx, boxes, scores, labels = (t.contiguous() for t in (idx, boxes, scores, labels))
    dev = idx.device
    out_boxes = torch.empty((bsz, kmax, 7), dtype=torch.float32, device=dev)
    out_scores = torch.empty((bsz, kmax), dtype=torch.float32, device=dev)
    out_labels = torch.empty((bsz, kmax), dtype=torch.int64, device=dev)
    count = torch.empty((bsz,), dtype=torch.int64, device=dev)
    _launch.launch(
        _final_kernel,
        (bsz,),
        idx,
        boxes,
        scores,
        labels,
        out_boxes,
        out_scores,
        out_labels,
        count,
        k,
        kmax,
        _f32(score_thresh),
        BLOCK=_FINAL_BLOCK,
        enable_fp_fusion=False,
    )
    return out_boxes, out_scores, out_labels, count
