"""Boxes and oracles shared by tests/test_boxes_iou.py and tests/test_nms.py."""

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from pcops.reference import nms as ref
from _util import generator


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread():
    """The float64 reference runs many small elementwise ops: with several intra-op threads on a
    busy or over-subscribed host they run 10-50x slower than on one thread (measured: 0.07 s on one
    thread vs 2.3 s on two for a 700 x 333 IoU matrix on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_boxes(n, seed, span=(69.12, 79.36), dtype=torch.float32, device="cpu"):
    """OpenPCDet-like car boxes (WORKLOADS.md ranges) in an area ``span`` metres wide, and scores."""
    g = generator(seed)
    u = lambda lo, hi: lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)
    boxes = torch.stack(
        [
            u(0, span[0]),
            u(-span[1] / 2, span[1] / 2),
            u(-2, 0),
            u(3.2, 4.7),
            u(1.4, 2.0),
            u(1.4, 1.7),
            u(-math.pi, math.pi),
        ],
        1,
    )
    scores = torch.rand(n, generator=g, dtype=torch.float64)
    return boxes.to(dtype).to(device), scores.float().to(device)


def hard_cases():
    """Row-aligned ``(a, b)`` float32 ``(P, 7)`` pairs: the hard cases of issue 5."""
    rows = []
    for cx, cy in [(0.0, 0.0), (70.0, -39.5), (69.12, 39.68)]:
        for h in [0.0, 0.3, -1.2, math.pi / 2, math.pi, 2.9]:
            for dx, dy in [(3.9, 1.6), (4.0, 0.05), (0.6, 0.6), (4.0, 0.01)]:
                base = [cx, cy, -1.0, dx, dy, 1.5, h]
                c, s = math.cos(h), math.sin(h)
                rows.append((base, base))  # identical
                for d in (1e-4, -1e-4):  # shifted by 0.1 mm
                    rows.append((base, [cx + d, cy, -1.0, dx, dy, 1.5, h]))
                    rows.append((base, [cx + d * c, cy + d * s, -1.0, dx, dy, 1.5, h]))
                    rows.append((base, [cx - d * s, cy + d * c, -1.0, dx, dy, 1.5, h]))
                for k in (1, 2, 3, -1):  # the same rectangle, heading + k * 90 degrees
                    ddx, ddy = (dy, dx) if k % 2 else (dx, dy)
                    rows.append((base, [cx, cy, -1.0, ddx, ddy, 1.5, h + k * math.pi / 2]))
                rows.append((base, [cx, cy, -1.0, dx * 0.5, dy * 0.5, 1.5, h]))  # nested, same centre
                rows.append((base, [cx + 0.2 * dx * c, cy + 0.2 * dx * s, -1.0, dx * 0.5, dy * 0.5, 1.5, h + 0.01]))
                rows.append((base, [cx, cy, -1.0, dx, dy, 1.5, h + 0.3]))  # same centre, rotated
                for f in (1.0, 0.5, 0.25):  # shared edge (f = 1: touching), collinear overlaps
                    rows.append((base, [cx + f * dx * c, cy + f * dx * s, -1.0, dx, dy, 1.5, h]))
                    rows.append((base, [cx - f * dy * s, cy + f * dy * c, -1.0, dx, dy, 1.5, h]))
                rows.append((base, [cx + dx * c - dy * s, cy + dx * s + dy * c, -1.0, dx, dy, 1.5, h]))  # corner
                rows.append((base, [cx, cy, -1.0, dx, dy, 1.5, h + 1.0]))  # crossing
                rows.append((base, [cx + 0.1, cy - 0.05, -1.0, dx, dy, 1.5, h + 0.001]))
    a = torch.tensor([r[0] for r in rows], dtype=torch.float64).float()
    b = torch.tensor([r[1] for r in rows], dtype=torch.float64).float()
    return a, b


def pair_iou(fn, a, b, chunk=64):
    """Row-aligned IoU through a matrix function (diagonals of chunk × chunk blocks)."""
    return torch.cat([fn(a[i : i + chunk], b[i : i + chunk]).diagonal() for i in range(0, a.shape[0], chunk)]).double()


# --- an independent oracle: textbook Sutherland–Hodgman with Python floats ------------------


def sh_iou(a, b):
    """IoU of two (x, y, dx, dy, heading) rectangles: clip a by b (variable-length polygons)."""
    ox, oy = a[0], a[1]

    def corners(x, y, dx, dy, h):
        c, s = math.cos(h), math.sin(h)
        return [
            (x - ox + c * u - s * v, y - oy + s * u + c * v)
            for u, v in ((dx / 2, dy / 2), (-dx / 2, dy / 2), (-dx / 2, -dy / 2), (dx / 2, -dy / 2))
        ]

    poly, clip = corners(*a), corners(*b)
    for k in range(4):
        (x1, y1), (x2, y2) = clip[k], clip[(k + 1) % 4]
        side = lambda p: (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1)
        out = []
        for i in range(len(poly)):
            cur, prev = poly[i], poly[i - 1]
            sc, sp = side(cur), side(prev)
            if (sc >= 0) != (sp >= 0):
                t = sp / (sp - sc)
                out.append((prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])))
            if sc >= 0:
                out.append(cur)
        poly = out
        if not poly:
            return 0.0
    inter = abs(math.fsum(poly[i - 1][0] * poly[i][1] - poly[i][0] * poly[i - 1][1] for i in range(len(poly)))) / 2
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def check_keep(got, want, boxes, scores, thr):
    """Equal keep lists, unless an IoU lies within 1e-6 of the threshold (then no assertion)."""
    if got.tolist() != want.tolist():
        order = torch.sort(scores, descending=True, stable=True).indices
        dev = "cuda" if torch.cuda.is_available() else "cpu"  # the float64 reference, on the GPU for speed
        iou = ref.boxes_iou_bev(boxes[order].to(dev), boxes[order].to(dev)).cpu()
        assert ((iou - thr).abs() < 1e-6).any(), "keep lists differ away from the threshold"


def ref_nms(boxes, scores, thr, **kw):
    """The float64 reference, run on the GPU (plain torch on any device) for speed."""
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return ref.nms_bev(boxes.cuda(), scores.cuda(), thr, **kw).cpu()


CPP_DIR = Path(__file__).resolve().parent / "cpp"


def build_host_cpp(tmp_dir, main: str, includes: dict, out_name: str, flags=()) -> Path:
    """Compile ``tests/cpp/<main>`` for the host, with the generated ``includes`` (name → text)
    written to ``tmp_dir``; skips without a host C++ compiler (or without C++20 ``<barrier>``)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    tmp_dir = Path(tmp_dir)
    for name, text in includes.items():
        (tmp_dir / name).write_text(text)
    out = tmp_dir / out_name
    cmd = [cxx, *flags, f"-I{CPP_DIR}", f"-I{tmp_dir}", "-o", str(out), str(CPP_DIR / main)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 and "barrier" in res.stderr and "No such file" in res.stderr:
        pytest.skip("the host C++ library has no <barrier>")
    assert res.returncode == 0, res.stderr[-3000:]
    return out
