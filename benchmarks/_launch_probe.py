"""A trivial Triton kernel for host_overhead.py's launch baselines (Triton needs it in a file)."""

import triton
import triton.language as tl


@triton.jit
def probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
