"""Post-processing of PointPillars: OpenPCDet's reference path (host syncs) and the sync-free fast path."""

from __future__ import annotations

import torch

import pcops

from . import box_coder
from .outputs import Detections

__all__ = ["PostProcessMixin", "decode_top", "gather_kept"]


def decode_top(flat, top, top_logit, label, anchors, n_cls_ch, n_box_ch, num_bins, cfg):
    """The torch form of :func:`post_kernels.decode_top` (the CPU path, and the reference of the
    kernel): ``(boxes, scores, labels, nms_scores)`` of the top-k anchors ``top (B, K)``."""
    bsz, k = top.shape
    ch, a_loc = flat.shape[2], cfg.num_anchors_per_location
    top_scores = torch.sigmoid(top_logit)
    top_labels = torch.gather(label.reshape(bsz, -1), 1, top) + 1
    cell, loc = top // a_loc, top % a_loc
    box_idx = (cell * ch + n_cls_ch + loc * 7).unsqueeze(-1) + torch.arange(7, device=flat.device)
    nb = num_bins
    dir_idx = (cell * ch + n_cls_ch + n_box_ch + loc * nb).unsqueeze(-1) + torch.arange(nb, device=flat.device)
    flat1 = flat.reshape(bsz, -1)
    deltas = torch.gather(flat1, 1, box_idx.view(bsz, -1)).view(bsz, k, 7).float()
    dir_logits = torch.gather(flat1, 1, dir_idx.view(bsz, -1)).view(bsz, k, nb).float()
    boxes = box_coder.decode_boxes(deltas, anchors[top])
    heading = box_coder.apply_direction(boxes[..., 6], dir_logits, cfg.dir_offset, cfg.dir_limit_offset, nb)
    boxes = torch.cat([boxes[..., :6], heading.unsqueeze(-1)], dim=-1)
    # below-threshold boxes get a NaN score: pcops.nms_bev never keeps them, and they never suppress
    nms_scores = top_scores.where(top_scores >= cfg.score_thresh, float("nan"))
    return boxes, top_scores, top_labels, nms_scores


def gather_kept(idx, boxes, top_scores, top_labels, score_thresh):
    """The torch form of :func:`post_kernels.gather_kept`: the kept rows ``idx (B, KMAX)`` (−1
    padded) as ``(boxes, scores, labels, count)``, padding rows zero."""
    kept = idx >= 0
    safe = idx.clamp(min=0)
    sc = torch.gather(top_scores, 1, safe)
    valid = kept & (sc >= score_thresh)
    vf = valid.to(torch.float32)
    out_boxes = torch.gather(boxes, 1, safe.unsqueeze(-1).expand(-1, -1, boxes.shape[-1])) * vf.unsqueeze(-1)
    return out_boxes, sc * vf, torch.gather(top_labels, 1, safe) * valid, valid.sum(dim=1)


class PostProcessMixin:
    """Decoding, score threshold, top-k and rotated NMS of :class:`~pcops.models.pointpillars.PointPillars`."""

    def _post_fast(self, dense: torch.Tensor) -> Detections:
        """Sync-free post-processing on the fused head output ``(B, H, W, 72)``.

        Top-k over ``max_class(logit)`` (sigmoid is monotonic, so this is the order of the scores),
        decode only those anchors, padded NMS. Boxes below the score threshold are in the top-k only
        when fewer than ``pre_max_size`` clear it; they sort after every box above it, so they cannot
        suppress one, and they are dropped after the NMS: the kept set equals OpenPCDet's.
        """
        cfg = self.config
        bsz, h, w, ch = dense.shape
        a_loc, n_cls = cfg.num_anchors_per_location, cfg.num_classes
        n_cls_ch, n_box_ch = self._head_splits()
        flat = dense.reshape(bsz, h * w, ch)
        logits = flat[:, :, :n_cls_ch].reshape(bsz, h * w, a_loc, n_cls)
        max_logit, label = logits.max(dim=-1)  # (B, HW, A)
        max_logit = max_logit.reshape(bsz, -1).float()
        k = min(cfg.nms_pre_max_size, max_logit.shape[1])
        top_logit, top = torch.topk(max_logit, k, dim=1)  # sorted, descending
        decode, gather = decode_top, gather_kept
        if dense.is_cuda:  # two Triton launches instead of about 70 torch ops, bit-identical
            from . import post_kernels

            decode, gather = post_kernels.decode_top, post_kernels.gather_kept
        args = (top, top_logit, label, self.anchors(dense.device), n_cls_ch, n_box_ch, cfg.num_dir_bins, cfg)
        boxes, top_scores, top_labels, nms_scores = decode(flat, *args)
        idx = self._nms_padded(boxes, nms_scores)  # (B, kmax), -1 padded
        return Detections(*gather(idx, boxes, top_scores, top_labels, cfg.score_thresh))

    def _nms_padded(self, boxes: torch.Tensor, nms_scores: torch.Tensor) -> torch.Tensor:
        """Class-agnostic rotated NMS of every scan: ``(B, nms_post_max_size)`` kept indices into
        ``boxes (B, k, 7)``, −1 padded. CUDA: one batched ``pcops.nms_bev`` call (one set of
        launches for all scans, no host sync). CPU: per scan, the invalid tail (NaN scores) cut
        first, since the CPU NMS is quadratic (a sync is free there)."""
        cfg = self.config
        kmax = cfg.nms_post_max_size
        if boxes.is_cuda:
            return pcops.nms_bev(boxes, nms_scores, cfg.nms_thresh, post_max_size=kmax, padded=True)[0]
        out = []
        for b in range(boxes.shape[0]):
            n_valid = int((nms_scores[b] == nms_scores[b]).sum())  # not NaN: above the threshold
            idx, _ = pcops.nms_bev(
                boxes[b, :n_valid], nms_scores[b, :n_valid], cfg.nms_thresh, post_max_size=kmax, padded=True
            )
            out.append(idx)
        return torch.stack(out)

    # ----- reference post-processing (OpenPCDet's code path, with host syncs)
    def _post_reference(self, cls_preds, box_preds, dir_preds) -> Detections:
        from . import _reference_ops

        cfg = self.config
        bsz = cls_preds.shape[0]
        n = self.num_anchors
        anchors = self.anchors(cls_preds.device).unsqueeze(0)
        batch_cls = cls_preds.reshape(bsz, n, -1).float()
        batch_box = box_coder.decode_boxes(box_preds.reshape(bsz, n, -1), anchors)
        dir_logits = dir_preds.reshape(bsz, n, -1)
        heading = box_coder.apply_direction(
            batch_box[..., 6], dir_logits, cfg.dir_offset, cfg.dir_limit_offset, cfg.num_dir_bins
        )
        batch_box = torch.cat([batch_box[..., :6], heading.unsqueeze(-1)], dim=-1)
        kmax = cfg.nms_post_max_size
        boxes = torch.zeros(bsz, kmax, 7, device=cls_preds.device)
        scores = torch.zeros(bsz, kmax, device=cls_preds.device)
        labels = torch.zeros(bsz, kmax, dtype=torch.int64, device=cls_preds.device)
        count = torch.zeros(bsz, dtype=torch.int64, device=cls_preds.device)
        for b in range(bsz):
            cls_scores, label = torch.max(torch.sigmoid(batch_cls[b]), dim=-1)
            label = label + 1
            mask = cls_scores >= cfg.score_thresh
            s, bx = cls_scores[mask], batch_box[b][mask]
            if s.shape[0] == 0:
                continue
            s_top, order = torch.topk(s, k=min(cfg.nms_pre_max_size, s.shape[0]))
            keep = _reference_ops.nms(bx[order], s_top, cfg.nms_thresh)
            selected = mask.nonzero().view(-1)[order[keep[:kmax]]]
            m = selected.numel()
            boxes[b, :m] = batch_box[b][selected]
            scores[b, :m] = cls_scores[selected]
            labels[b, :m] = label[selected]
            count[b] = m
        return Detections(boxes, scores, labels, count)
