"""Packaging: the wheel holds every package, the sample scans and the weights; installed into a
fresh virtual environment outside the checkout, the README quickstart and the demo run from a
temporary directory (issue 18's acceptance job; slow: it builds and installs a wheel)."""

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_dirs() -> dict[str, Path]:
    """Every package folder of the source tree, by the name it gets in the wheel."""
    cfg = _pyproject()["tool"]["setuptools"]
    mapping = {"pcops": ROOT / "pcops", **{k: ROOT / v for k, v in cfg["package-dir"].items()}}
    found = {}
    for name, folder in mapping.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            found[".".join((name, *rel.parts))] = init.parent
    return found


def test_pyproject_lists_every_package_and_no_triton_dependency():
    cfg = _pyproject()
    listed = set(cfg["tool"]["setuptools"]["packages"])
    missing = sorted(set(_package_dirs()) - listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages: add {missing} (the wheel would lack them)"
    deps = cfg["project"]["dependencies"]
    assert not [d for d in deps if d.startswith("triton")], "triton must not be a runtime dependency"
    test_extra = " ".join(cfg["project"]["optional-dependencies"]["test"])
    assert "triton==3.6.0" in test_extra and "numpy>=1.26,<2.4" in test_extra


def _build_wheel(out: Path) -> Path:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = out.glob("pcops-*.whl")
    return wheel


def _venv(where: Path) -> Path:
    """A fresh venv that sees this interpreter's packages (torch, numpy, matplotlib, pip) but not
    the checkout: --system-site-packages reaches only the base interpreter, so this one's site
    folders are added by a .pth (the checkout's editable pcops, if any, is shadowed by the wheel)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(where)], check=True, timeout=120
    )
    py = where / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    import site

    dirs = [d for d in site.getsitepackages() + [sysconfig.get_path("purelib")] if os.path.isdir(d)]
    Path(purelib, "_parent_site.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dict.fromkeys(dirs)) + "\n"
    )
    return py


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (
        "pcops/data/sample_000.bin",
        "pcops/data/sample_000.txt",
        "pcops/csrc/nms.cu",
        "pcops/csrc/host/host.cpp",
        "pcops/csrc/host/host.h",
        "pcops/csrc/host/layer_norm_gelu.cpp",
        "pcops/models/demo.py",
        "pcops-0.1.0.dist-info/licenses/LICENSE",
    ):
        assert f in names, f"the wheel lacks {f}"
    weights = sorted(p.name for p in (ROOT / "models" / "weights").glob("*.pt"))
    for w in weights:
        assert f"pcops/models/weights/{w}" in names, f"the wheel lacks the weights {w}"
    size_mb = wheel.stat().st_size / 2**20
    assert size_mb < 50, f"the wheel is {size_mb:.1f} MB"

    py = _venv(tmp_path / "venv")
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}

    def python(*args, timeout=600):
        r = subprocess.run([str(py), *args], capture_output=True, text=True, cwd=run, env=env, timeout=timeout)
        assert r.returncode == 0, f"{args}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r.stdout

    where = python("-c", "import pcops, pcops.models; print(pcops.__file__); print(pcops.models.__file__)")
    assert all(str(tmp_path / "venv") in line for line in where.split()), f"not the installed wheel: {where}"

    # the README quickstart (without the pretrained model while its weights are not shipped)
    code = re.search(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M).group(1)
    if not weights:
        code = code.split("model = PointPillars.pretrained()")[0]
    python("-c", code)

    # the demo: CPU, one scan from the wheel's data, writes a PNG
    out = python(
        "-m",
        "pcops.models.demo",
        "--device",
        "cpu",
        "--max-scans",
        "1",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        str(run / "out"),
    )
    pngs = sorted((run / "out").glob("*.png"))
    assert pngs and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out
    print(f"\nwheel {wheel.name}: {size_mb:.1f} MB, {len(names)} files; demo wrote {pngs[0].name}")
