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


def test_launch_parameters_pack_at_their_alignment():
    """The packed parameter buffer follows CUDA's kernel-parameter ABI (every argument at its
    natural alignment), with the tensors' device pointers and the scalars' values in order."""
    import ctypes
    import struct

    import torch

    kinds = (torch.Tensor, ctypes.c_int, ctypes.c_float, ctypes.c_longlong, torch.nn.Parameter, ctypes.c_int)
    layout = _nvrtc._Layout(kinds)
    assert layout.size.value == 36 and layout.tensors == (True, False, False, False, True, False)
    layout.packer.pack_into(layout.buf, 0, 0x1000, -3, 2.5, 2**40 + 7, 0x2000, 9)
    raw = layout.buf.raw
    assert struct.unpack_from("<Q", raw, 0)[0] == 0x1000 and struct.unpack_from("<i", raw, 8)[0] == -3
    assert struct.unpack_from("<f", raw, 12)[0] == 2.5 and struct.unpack_from("<q", raw, 16)[0] == 2**40 + 7
    assert struct.unpack_from("<Q", raw, 24)[0] == 0x2000 and struct.unpack_from("<i", raw, 32)[0] == 9
    # an int after a 4-byte float then a pointer: padded to 8
    assert _nvrtc._Layout((ctypes.c_int, torch.Tensor)).packer.format == "<ixxxxQ"
    assert _nvrtc._Layout((ctypes.c_uint, ctypes.c_ulonglong)).packer.format == "<IxxxxQ"
    with pytest.raises(TypeError, match="kernel argument"):
        _nvrtc._Layout((int,))
