"""Dropout seeds and argument checks shared by the fused ops with dropout.

The GPU kernels draw the keep-mask with Philox (``tl.rand(seed, i)`` for flat element ``i``), so
the backward regenerates the mask from the seed instead of storing it. The seed is one int64
drawn per call from ``generator`` (default: the default generator of the input's device) with
``torch.randint`` on that generator's device: a tiny device-side draw for a CUDA generator (no
host synchronisation) or a host draw for a CPU generator (copied to the device asynchronously).
CUDA graphs: with a CUDA generator (the default) the draw is captured like any torch RNG op and
every replay gets a fresh seed; a CPU generator is not graph-safe (a host draw cannot be
replayed). The reference draws its mask from a CPU generator seeded with the same seed, so CPU
and GPU masks differ; each is reproducible.
"""

from __future__ import annotations

import torch

from . import _checks
from .reference import _dropout as _ref

_SEED_HIGH = 2**63 - 1


def draw_seed(device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """One Philox seed ``(1,)`` int64 on ``device``, drawn once per call (see the module docstring)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    gen_device = generator.device if generator is not None else device
    seed = torch.randint(0, _SEED_HIGH, (1,), dtype=torch.int64, device=gen_device, generator=generator)
    # host → device copies of 8 bytes need no wait; a device → host copy must complete before use
    return seed.to(device, non_blocking=device.type == "cuda")


def check_p(dropout_p) -> float:
    return _checks.check_float("dropout_p", dropout_p, min_value=0.0, max_value=1.0, max_open=True)


def check_training(training) -> bool:
    if not isinstance(training, bool):
        raise TypeError(f"training: expected a bool, got {type(training).__name__}")
    return training


def reference_keep(seed: torch.Tensor | None, shape, p: float) -> torch.Tensor | None:
    """The reference's keep-mask for ``seed`` (None: no dropout); reading the seed syncs a CUDA seed."""
    return None if seed is None else _ref.dropout_keep_mask(int(seed[0]), shape, p, device=seed.device)
