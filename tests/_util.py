"""Small helpers shared by the tests (markers and seeded generators)."""
import os

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
gpu = [pytest.mark.gpu, requires_cuda]
_interpret_skip = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton interpreter off (a CUDA device runs the real kernels)"
)


def interpret(test):
    """Marks a test that runs Triton kernels on the CPU under TRITON_INTERPRET=1."""
    return pytest.mark.interpret(_interpret_skip(test))


def generator(seed: int, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
