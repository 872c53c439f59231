"""Import cost: `import pcops` and the first CPU op calls, measured in a fresh interpreter.

The goal (issue 18): the first CPU op call after `import pcops` costs <= 0.3 s beyond the op's
own work, and neither `import pcops` nor a CPU op call imports Triton or pcops' GPU kernels.
The times are printed (and so appear in CI logs); they are not asserted, since a loaded CI
machine runs several times slower.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, sys, time

def mods(prefix):
    return sorted(m for m in sys.modules if m == prefix or m.startswith(prefix + "."))

def state():
    return {"triton": len(mods("triton")), "pcops_gpu": mods("pcops.triton") + mods("pcops.cuda"),
            "dynamo": "torch._dynamo" in sys.modules,
            # optional modules pcops loaded (torch itself may import tqdm)
            "optional": [m for m in ("matplotlib", "open3d", "tqdm", "pcops.models", "pcops.sim", "pcops.viz")
                         if m in sys.modules and m not in after_torch]}

out = {}
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
after_torch = set(sys.modules)
import pcops
t2 = time.perf_counter()
out["import_torch_s"], out["import_pcops_s"] = t1 - t0, t2 - t1
out["after_import"] = state()

torch.set_num_threads(1)  # the CPU kernels must leave it so (numba's pool start resets OpenMP's count)
g = torch.Generator().manual_seed(0)
pts = torch.rand(2000, 4, generator=g) * 10
boxes = torch.rand(16, 7, generator=g) * 4 + 1
scores = torch.rand(16, generator=g)
calls = [
    ("voxelize_reference", lambda: pcops.voxelize(pts, (0.5, 0.5, 10.0), (0, 0, -5, 10, 10, 5), 8, 1000,
                                                  backend="reference")),
    ("voxelize", lambda: pcops.voxelize(pts, (0.5, 0.5, 10.0), (0, 0, -5, 10, 10, 5), 8, 1000)),
    ("nms_bev", lambda: pcops.nms_bev(boxes, scores, 0.5)),
    ("knn", lambda: pcops.knn(pts[None, :256, :3], pts[None, :, :3], 8)),
    ("farthest_point_sample", lambda: pcops.farthest_point_sample(pts[None, :, :3], 64)),
]
out["ops"] = {}
for name, f in calls:
    t = time.perf_counter(); f(); first = time.perf_counter() - t
    t = time.perf_counter(); f(); second = time.perf_counter() - t
    out["ops"][name] = {"first_s": first, "second_s": second}
out["after_ops"] = state()
out["torch_threads_after_ops"] = torch.get_num_threads()
print("PROBE" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBE"))
    return json.loads(line[len("PROBE") :])


def test_report_import_and_first_call_times(probe, capsys):
    ops = probe["ops"]
    first = ops["voxelize_reference"]  # pcops' own first-call cost (the numba paths add their JIT load)
    overhead = first["first_s"] - first["second_s"]
    lines = [
        f"import torch {probe['import_torch_s']:.3f} s, import pcops {probe['import_pcops_s']:.3f} s (on top)",
        f"first CPU op call overhead (voxelize, reference, first - second call): {overhead:.3f} s (goal <= 0.3 s)",
    ]
    lines += [
        f"  {name}: first {v['first_s'] * 1e3:.1f} ms, second {v['second_s'] * 1e3:.1f} ms" for name, v in ops.items()
    ]
    lines.append(
        f"  after the calls: {probe['after_ops']['triton']} triton modules, "
        f"torch._dynamo {'imported' if probe['after_ops']['dynamo'] else 'not imported'}"
    )
    with capsys.disabled():
        print("\n[import cost] " + "\n[import cost] ".join(lines))


def test_import_pcops_imports_no_kernels_and_no_optional_dependencies(probe):
    s = probe["after_import"]
    assert s["triton"] == 0, "import pcops imported triton"
    assert s["pcops_gpu"] == [], f"import pcops imported GPU kernel modules: {s['pcops_gpu']}"
    assert s["optional"] == [], f"import pcops imported optional modules: {s['optional']}"
    assert not s["dynamo"], "import pcops imported torch._dynamo"


def test_cpu_op_calls_import_no_pcops_kernels(probe):
    assert probe["after_ops"]["pcops_gpu"] == [], "a CPU op call imported pcops.triton / pcops.cuda modules"


def test_first_cpu_op_call_imports_no_triton(probe):
    # torch.library.custom_op's kernel wrappers would import torch._dynamo (and Triton) on the
    # first call: pcops._lazy_dynamo defers that until something else imports torch._dynamo
    s = probe["after_ops"]
    assert s["triton"] == 0, f"the CPU op calls imported {s['triton']} triton modules"
    assert not s["dynamo"], "a CPU op call imported torch._dynamo"


def test_lazy_dynamo_disable_still_disables_under_compile():
    """Once torch._dynamo is imported, the kernels run under torch's own dynamo.disable wrapper."""
    import torch

    import pcops

    f = torch.compile(lambda x: pcops.farthest_point_sample(x, 4, backend="reference") + 1, fullgraph=True)
    x = torch.rand(2, 64, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(f(x), pcops.farthest_point_sample(x, 4, backend="reference") + 1)


def test_cpu_ops_keep_torch_thread_count(probe):
    """A torch.set_num_threads(1) made before the first CPU op call is still in force after it
    (numba's first parallel launch used to reset it to the core count: pcops.cpu.keeps_torch_threads)."""
    assert probe["torch_threads_after_ops"] == 1


_MODEL_PROBE = r"""
import sys, warnings
import torch
from pcops.models.pointpillars import PointPillars

warnings.simplefilter("ignore")  # random weights warn once
g = torch.Generator().manual_seed(0)
pts = torch.rand(3000, 4, generator=g) * torch.tensor([60.0, 60.0, 3.0, 1.0]) - torch.tensor([0.0, 30.0, 2.0, 0.0])
with torch.no_grad():
    det = PointPillars(impl="fast").eval()(pts)
print("MODEL", det.boxes.shape[0], sorted(m for m in sys.modules if m == "triton" or m.startswith(("triton.", "pcops.triton", "pcops.cuda"))))
"""


def test_cpu_pointpillars_fast_path_imports_no_triton():
    """The demo's model on the CPU (a fresh `pip install ".[viz]"` has no Triton) runs without
    importing Triton or pcops' GPU kernel modules."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-c", _MODEL_PROBE], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MODEL"))
    assert line.endswith("[]"), f"the CPU model imported GPU modules: {line}"
