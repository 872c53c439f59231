"""Argument checks shared by every public op.

Each check raises a ``TypeError`` (wrong type/dtype) or ``ValueError`` (wrong shape,
device or value) whose message starts with the argument's name, so a user sees at
once which input is wrong and what was expected. These run in the public Python
function, before ``torch.ops.pcops.*``; the fake (meta) functions repeat the shape
parts with ``torch._check`` so ``torch.compile`` sees the same contract.
"""

from __future__ import annotations

import numbers
from typing import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    name: str,
    t,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
    last_dim: int | None = None,
    min_last_dim: int | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check one tensor argument; returns it unchanged."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dtype_names(dtypes)}, got {t.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(t.shape)}")
    if last_dim is not None and (t.dim() == 0 or t.shape[-1] != last_dim):
        raise ValueError(f"{name}: expected last dimension {last_dim}, got shape {tuple(t.shape)}")
    if min_last_dim is not None and (t.dim() == 0 or t.shape[-1] < min_last_dim):
        raise ValueError(f"{name}: expected last dimension >= {min_last_dim}, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like the other inputs), got {t.device}")
    return t


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """All given tensors (None skipped) must share one device."""
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for k, v in items[1:]:
        if v.device != first.device:
            raise ValueError(f"{k}: expected a tensor on {first.device} (the device of {first_name}), got {v.device}")


def check_int(name: str, v, *, min_value: int | None = None) -> int:
    """A Python int (bools and floats refused), optionally bounded below."""
    if type(v) is int:  # the common case, without the slower ABC checks below
        if min_value is not None and v < min_value:
            raise ValueError(f"{name}: expected an int >= {min_value}, got {v}")
        return v
    if isinstance(v, torch.Tensor) and v.dim() == 0 and not v.is_floating_point():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):  # numpy ints are Integral too
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    v = int(v)
    if min_value is not None and v < min_value:
        raise ValueError(f"{name}: expected an int >= {min_value}, got {v}")
    return v


def check_float(name: str, v, *, min_value=None, max_value=None, min_open=False, max_open=False) -> float:
    """A real number in [min, max] (or open ends), returned as float."""
    if type(v) is not float and type(v) is not int and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
        raise TypeError(f"{name}: expected a float, got {type(v).__name__}")  # (numpy floats are Real too)
    v = float(v)
    if v != v:
        raise ValueError(f"{name}: expected a number, got nan")
    lo_bad = min_value is not None and (v <= min_value if min_open else v < min_value)
    hi_bad = max_value is not None and (v >= max_value if max_open else v > max_value)
    if lo_bad or hi_bad:
        lo = "-inf" if min_value is None else min_value
        hi = "inf" if max_value is None else max_value
        lb = "(" if min_open else "["
        rb = ")" if max_open else "]"
        raise ValueError(f"{name}: expected a value in {lb}{lo}, {hi}{rb}, got {v}")
    return v


def check_floats(name: str, v, n: int, *, positive: bool = False) -> tuple[float, ...]:
    """A sequence (or 1-D tensor) of ``n`` real numbers."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().tolist()
    try:
        vals = tuple(float(x) for x in v)
    except TypeError:
        raise TypeError(f"{name}: expected a sequence of {n} floats, got {type(v).__name__}") from None
    if len(vals) != n:
        raise ValueError(f"{name}: expected {n} values, got {len(vals)}")
    if positive and not all(x > 0 for x in vals):
        raise ValueError(f"{name}: expected all values > 0, got {vals}")
    return vals


def check_lengths(name: str, lengths, total: int, device: torch.device) -> torch.Tensor:
    """``lengths (B,)`` integer counts on ``device`` (checked for sum == total on the CPU only,
    where it costs no device sync)."""
    check_tensor(name, lengths, dtypes=INT_DTYPES, ndim=1)
    if lengths.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like the points), got {lengths.device}")
    if lengths.device.type == "cpu" and lengths.numel():
        if bool((lengths < 0).any()):
            raise ValueError(f"{name}: expected non-negative counts, got {lengths.tolist()}")
        s = int(lengths.sum())
        if s != total:
            raise ValueError(f"{name}: expected counts summing to {total}, got sum {s}")
    return lengths
