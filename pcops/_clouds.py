"""Argument handling shared by the point-set ops (``pcops.fps``, ``pcops.knn``).

One batching convention, as PyTorch3D: clouds are padded to ``(B, N, 3)`` with ``lengths (B,)``
valid counts (``None``: every cloud has ``N`` points); an unbatched ``(N, 3)`` cloud is accepted
and returned without the batch dimension.
"""

from __future__ import annotations

import torch

from . import _checks


def check_cloud(name: str, points) -> tuple[torch.Tensor, bool]:
    """``(B, N, 3)`` or ``(N, 3)`` float tensor → ``((B, N, 3), was_unbatched)``."""
    _checks.check_tensor(name, points, dtypes=_checks.FLOAT_DTYPES, ndim=(2, 3), last_dim=3)
    return (points.unsqueeze(0), True) if points.dim() == 2 else (points, False)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    # half precision is widened: distances are accumulated and returned in float32
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def can_check(t: torch.Tensor) -> bool:
    """Value checks run on CPU tensors only (free there), and not while torch.compile traces."""
    return t.device.type == "cpu" and t.numel() > 0 and not torch.compiler.is_compiling()


_FILLED: dict = {}  # (device index, raw stream, batch, value) -> (batch,) int64 tensor, only ever read
_FILLED_MAX = 64  # entries kept (the oldest goes; its memory is reused in stream order)


def filled(batch: int, value: int, device: torch.device) -> torch.Tensor:
    """``torch.full((batch,), value, dtype=torch.int64, device=device)`` for an op to read (never to
    write). On CUDA, outside graph capture, ``torch.compile`` and dispatch modes, one tensor per (device, current
    stream, batch, value) is kept and returned again: an eager call with default lengths or start
    indices then launches no fill. Per stream, so the fill is ordered before every use."""
    if (
        device.type != "cuda"
        or torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()  # FakeTensorMode, make_fx, ...: their tensors are not kept
        or torch.cuda.is_current_stream_capturing()
    ):
        return torch.full((batch,), value, dtype=torch.int64, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index), batch, value)
    t = _FILLED.get(key)
    if t is None:
        while len(_FILLED) >= _FILLED_MAX:
            _FILLED.pop(next(iter(_FILLED), None), None)  # another thread may have taken it
        t = _FILLED[key] = torch.full((batch,), value, dtype=torch.int64, device=device)
    return t


def check_lengths(name: str, lengths, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """``lengths (B,)`` integer counts in ``[0, N]`` → int64 on ``device`` (``None``: all ``N``).

    The range is checked on the CPU only; on the GPU that would cost a host synchronisation, so
    the kernels clamp counts to ``[0, N]`` instead.
    """
    if lengths is None:
        return filled(batch, n, device)
    _checks.check_tensor(name, lengths, dtypes=_checks.INT_DTYPES, ndim=1)
    if lengths.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like the points), got {lengths.device}")
    if lengths.shape[0] != batch:
        raise ValueError(f"{name}: expected {batch} counts (one per cloud), got {lengths.shape[0]}")
    if can_check(lengths):
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > n:
            raise ValueError(f"{name}: expected counts in [0, {n}], got {lengths.tolist()}")
    return lengths.to(torch.int64).contiguous()


def check_pair(query, ref, query_lengths, ref_lengths):
    """Query and reference clouds of one batch → ``(q, r, ql, rl, unbatched)`` in the compute dtype.

    ``ref is query`` (and one lengths tensor for both) keeps one tensor for both sides, so the GPU
    path sorts the cloud once.
    """
    q, q_unbatched = check_cloud("query", query)
    r, r_unbatched = check_cloud("ref", ref)
    if q_unbatched != r_unbatched:
        raise ValueError(f"ref: expected a {query.dim()}-D tensor like query, got shape {tuple(ref.shape)}")
    _checks.check_same_device(query=q, ref=r)
    if q.shape[0] != r.shape[0]:
        raise ValueError(f"ref: expected batch size {q.shape[0]} (as query), got {r.shape[0]}")
    dtype = compute_dtype(q) if q.dtype == r.dtype else torch.promote_types(compute_dtype(q), compute_dtype(r))
    self_query = ref is query
    q = q.to(dtype).contiguous()
    r = q if self_query else r.to(dtype).contiguous()
    ql = check_lengths("query_lengths", query_lengths, q.shape[0], q.shape[1], q.device)
    if self_query and ref_lengths is query_lengths:
        rl = ql
    else:
        rl = check_lengths("ref_lengths", ref_lengths, r.shape[0], r.shape[1], r.device)
    return q, r, ql, rl, q_unbatched
