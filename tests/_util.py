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


def run_compiler_script(script: str, *args: str, timeout: int = 600, extra_env: dict | None = None):
    """Run ``script`` in a fresh Python without ``TRITON_INTERPRET`` (so ``@triton.jit`` kernels are
    real JIT functions) and assert it printed ``compiled``.

    Used to compile every Triton kernel variant ahead of time for sm_90 with Triton's own ptxas,
    no GPU needed: the interpreter accepts code the compiler rejects (constants specialised from
    integer arguments equal to 1, Python float globals, ...). Skips when Triton has no CUDA backend.
    """
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    env.update(extra_env or {})
    res = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if res.returncode != 0 and "ptxas" in res.stderr and "not found" in res.stderr.lower():
        pytest.skip("no ptxas for Triton's CUDA backend")
    assert res.returncode == 0 and "compiled" in res.stdout, res.stderr[-4000:]
    return res
