"""The host-time benchmark scripts run (on the CPU here; the GPU run uses the same code): every
public op case records the pcops ops its wrapper calls, and the layers add up."""

import sys
from pathlib import Path

import pytest

from _util import gpu

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(BENCH))
    try:
        import dispatch_overhead
        import host_overhead

        yield host_overhead, dispatch_overhead
    finally:
        sys.path.remove(str(BENCH))


def test_host_overhead_layers_for_every_op(scripts):
    host_overhead, _ = scripts
    rows = host_overhead.measure("cpu", calls=2)
    assert len(rows) == len(host_overhead.cases("cpu")) >= 20
    for r in rows:
        assert r["pcops_ops"], r["op"]  # the wrapper's op was recorded
        assert r["kernel_us"] > 0 and r["aux_torch_ops"] >= 0 and r["launches"] is None, r
        assert abs(r["wrapper_us"] + r["dispatch_us"] + r["kernel_us"] - r["call_us"]) < 0.05, r
    ops = {o for r in rows for o in r["pcops_ops"].split("+")}
    assert {"knn", "voxelize", "point_cells", "sparse_conv3d", "pillar_gather", "layer_norm_gelu_backward"} <= ops


def test_dispatch_overhead_worker(scripts):
    _, dispatch_overhead = scripts
    res = dispatch_overhead.worker("cpu", 2)
    assert res and all(isinstance(v, float) and v > 0 for v in res.values()), res


def test_every_case_has_a_documented_launch_count(scripts):
    host_overhead, _ = scripts
    assert set(host_overhead.cases("cpu")) == set(host_overhead.LAUNCHES)


@pytest.mark.gpu
@gpu[1]
def test_launches_per_call_stay_within_the_documented_counts(scripts):
    host_overhead, _ = scripts
    counts = host_overhead.launch_counts("cuda")
    over = {k: (v, host_overhead.LAUNCHES[k]) for k, v in counts.items() if v > host_overhead.LAUNCHES[k]}
    assert not over, f"more GPU launches per call than documented (got, documented): {over}"
