"""The last pass of the LayerNorm+GELU backward: the fixed-order sum of the per-program partial
``dweight`` / ``dbias`` rows (no atomics: reproducible)."""

from __future__ import annotations

import triton
import triton.language as tl
from . import _launch

# column-sum kernel (``_column_sum``): BLOCK_G = next_pow2(G) ≤ 4096 partial rows × BLOCK_N =
# 4096 / BLOCK_G columns per program (at most 8): the G ≈ 5-10·SMs partial rows in one step
_SUM_MAX_BLOCK_G = 4096
_SUM_ELEMENTS = 4096


@triton.jit
def _column_sum_kernel(
    dw_part_ptr,  # (G, N) float32 partial sums
    db_part_ptr,  # (G, N) float32 partial sums
    dw_ptr,  # (N,) output, dtype of weight
    db_ptr,  # (N,) output, dtype of bias
    G,  # partial rows
    N,  # columns
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc_w = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    # a fixed summation order: the result does not depend on scheduling
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        mask = (g < G)[:, None] & col_ok[None, :]
        offs = g.to(tl.int64)[:, None] * N + cols[None, :]
        acc_w += tl.load(dw_part_ptr + offs, mask=mask, other=0.0)
        acc_b += tl.load(db_part_ptr + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
    tl.store(db_ptr + cols, tl.sum(acc_b, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)


def _column_sum(dw_part, db_part, dweight, dbias, g: int, n: int) -> None:
    """``dweight = Σ_g dw_part[g]``, ``dbias = Σ_g db_part[g]`` (fixed order), cast on store.

    One launch. Each program owns ``BLOCK_N`` columns and reads all ``G`` partial rows in one
    step when ``G ≤ 4096`` (``BLOCK_G = next_pow2(G)``, 8 values per thread: every load
    independent, one L2 round trip; narrow column blocks give ``N / BLOCK_N`` programs).
    The partials were just written, so the reads hit L2 and the partly used sectors cost little.
    """
    if not n:
        return
    kwargs = column_sum_config(g)
    _launch.launch(
        _column_sum_kernel, (_launch.cdiv(n, kwargs["BLOCK_N"]),), dw_part, db_part, dweight, dbias, g, n, **kwargs
    )


def column_sum_config(g: int) -> dict:
    """The column-sum launch keywords for ``g`` partial rows: ``BLOCK_G``, ``BLOCK_N`` (columns per
    program), ``num_warps``."""
    block_g = min(_SUM_MAX_BLOCK_G, _launch.next_power_of_2(max(g, 16)))
    block_n = max(1, min(8, _SUM_ELEMENTS // block_g))
    return {"BLOCK_G": block_g, "BLOCK_N": block_n, "num_warps": max(1, min(16, block_g * block_n // (32 * 8)))}
