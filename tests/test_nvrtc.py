"""The CUDA C++ path: every csrc/*.cu compiles with NVRTC for sm_90 (no GPU needed)."""

from pathlib import Path

import pytest

from pcops import _nvrtc

CU_FILES = sorted(p.name for p in _nvrtc.CSRC_DIR.glob("*.cu"))


def test_csrc_exists():
    assert "pillar_scatter.cu" in CU_FILES


@pytest.mark.parametrize("name", CU_FILES)
def test_compiles_for_sm90(name):
    source = (_nvrtc.CSRC_DIR / name).read_text()
    cubin = _nvrtc.compile_source(source, name, "sm_90")
    assert cubin[:4] == b"\x7fELF"


def test_syntax_error_is_reported_with_log():
    with pytest.raises(_nvrtc.NvrtcError, match="bad.cu"):
        _nvrtc.compile_source('extern "C" __global__ void k() { int x = ; }', "bad.cu", "sm_90")


def test_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PCOPS_CACHE_DIR", str(tmp_path))
    first = _nvrtc.compile_file("pillar_scatter.cu", "sm_90")
    files = list(Path(tmp_path).glob("pillar_scatter-sm_90-*.cubin"))
    assert len(files) == 1 and files[0].read_bytes() == first
    assert _nvrtc.compile_file("pillar_scatter.cu", "sm_90") == first
