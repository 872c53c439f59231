"""Launcher for ``csrc/fps.cu`` (CUDA C++ compiled at run time with NVRTC): not written yet."""
from __future__ import annotations

import torch


def fps_supported(points: torch.Tensor) -> bool:
    """Whether the CUDA C++ FPS kernel can run ``points`` here."""
    return False


def farthest_point_sample(points, lengths, start_idx, num_samples):
    raise NotImplementedError("backend='cuda': the CUDA C++ FPS kernel is not available yet")
