"""The README's quickstart runs as it is written, and the README stays small."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYPI_README = ROOT / "pcops" / "README_PYPI.md"
MODEL_LINE = "model = PointPillars.pretrained()"


def quickstart(path: Path) -> str:
    """The first ```python block of a Markdown file."""
    m = re.search(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)
    assert m, f"{path.name}: no ```python block"
    return m.group(1)


def test_readme_size_and_quickstart_length():
    assert README.stat().st_size <= 15 * 1024, "README.md: keep it under 15 KB (tables go to benchmarks/RESULTS.md)"
    lines = quickstart(README).strip().splitlines()
    assert len(lines) <= 15, f"the quickstart has {len(lines)} lines (at most 15)"
    # the PyPI page shows the same code
    assert quickstart(PYPI_README) == quickstart(README)
    assert "scripts/" not in PYPI_README.read_text(encoding="utf-8"), "the PyPI readme has checkout-only commands"


def test_readme_quickstart_runs(capsys):
    code = quickstart(README)
    assert MODEL_LINE in code
    ops_part, model_part = code.split(MODEL_LINE, 1)
    ns: dict = {"__name__": "readme_quickstart"}
    exec(compile(ops_part, "README.md quickstart", "exec"), ns)  # voxelize and rotated NMS
    assert ns["vox"].voxels.shape[1:] == (32, 4) and ns["keep"].dim() == 1

    from pcops.models import PointPillars
    from pcops.models import pointpillars as pp

    if not hasattr(PointPillars, "pretrained"):
        pytest.skip("PointPillars.pretrained() does not exist yet (the rest of the quickstart needs it)")
    if not Path(pp.PRETRAINED).exists():
        pytest.skip(f"the pretrained PointPillars weights are not in the checkout yet ({pp.PRETRAINED})")
    exec(compile(MODEL_LINE + model_part, "README.md quickstart", "exec"), ns)
    det = ns["det"]
    assert det.boxes.shape[0] == 1 and det.boxes.shape[2] == 7 and int(det.count[0]) >= 1
    assert "tensor" in capsys.readouterr().out
