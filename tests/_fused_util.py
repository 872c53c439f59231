"""Inputs, oracles and tolerances shared by the fused-op tests (LayerNorm+GELU, Swish, CSR softmax).

Tolerances: float32 1e-5 (forward) / 1e-4 (gradients; weight and bias gradients are sums over
rows, so their absolute tolerance grows with the row count); float16 and bfloat16 one rounding
of the output (atol/rtol 2e-3 and 1.6e-2).
"""

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from _util import generator

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    torch.float64: dict(atol=1e-12, rtol=1e-12),
}
GRAD_TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
}
AWKWARD_LENGTHS = [0, 1, 5, 0, 0, 17, 1, 64, 3, 130, 2, 0, 33, 1]


def make_ln(rows, width, seed, dtype=torch.float32, device="cpu", lead=()):
    g = generator(seed)
    x = (torch.randn(*lead, rows, width, generator=g) * 2 + 0.5).to(dtype)
    w = (1 + 0.5 * torch.randn(width, generator=g)).to(dtype)
    b = (0.5 * torch.randn(width, generator=g)).to(dtype)
    return x.to(device), w.to(device), b.to(device)


def torch_ln_gelu(x, w, b, eps=1e-5, approximate="tanh"):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = F.gelu(F.layer_norm(x.to(acc), (x.shape[-1],), w.to(acc), b.to(acc), eps), approximate=approximate)
    return y.to(x.dtype)


def make_csr(lengths, seed, dtype=torch.float32, index_dtype=torch.int64, neg_inf_rows=(), device="cpu"):
    """CSR rows of the given lengths, N(0, 3²) values, a few stored −inf, whole −inf rows on request."""
    g = generator(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    crow = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    crow[1:] = lengths.cumsum(0)
    nnz = int(crow[-1])
    values = torch.randn(nnz, generator=g) * 3
    values[torch.rand(nnz, generator=g) < 0.05] = -math.inf
    for r in neg_inf_rows:
        values[crow[r] : crow[r + 1]] = -math.inf
    return values.to(dtype).to(device), crow.to(index_dtype).to(device)


def dense_softmax_oracle(values, crow):
    """Row by row: torch.softmax in float64, all −inf rows → 0."""
    out = torch.zeros(values.shape, dtype=torch.float64)
    v = values.double().cpu()
    crow = crow.cpu()
    for r in range(crow.numel() - 1):
        s, e = int(crow[r]), int(crow[r + 1])
        if e > s and not bool(torch.isneginf(v[s:e]).all()):
            out[s:e] = torch.softmax(v[s:e], 0)
    return out


def check_dropout_stats(kept: torch.Tensor, p: float):
    n = kept.numel()
    frac = kept.float().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(frac - (1 - p)) <= 3 * sigma, (frac, 1 - p, sigma)


def kernels_run(caplog, op: str) -> list[str]:
    """The kernels ``pcops._backend.log_kernel`` reported for ``op`` (caplog at DEBUG on "pcops")."""
    return [
        r.getMessage().split(": ", 1)[1]
        for r in caplog.records
        if r.name == "pcops" and r.getMessage().startswith(op + ": ")
    ]


def watch_kernels(caplog):
    """Record ``pcops._backend.log_kernel`` messages from here on (pytest's ``caplog`` at DEBUG)."""
    caplog.set_level(logging.DEBUG, logger="pcops")
    return caplog


@pytest.fixture(autouse=True)
def _fixed_triton_configs(request, monkeypatch):
    """The launchers' fixed default configs instead of autotuning (which compiles and times up
    to 10 configs per new row length: the GPU tests see dozens), except in the tests named
    ``test_gpu_autotuned_*``. (The interpreter never autotunes.)"""
    if not request.node.name.startswith("test_gpu_autotuned"):
        from pcops.triton import _fused_common

        monkeypatch.setattr(_fused_common, "AUTOTUNE", False)
