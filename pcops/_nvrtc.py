"""Run-time compilation of ``csrc/*.cu`` with NVRTC, and launches on torch's current stream.

Users never need nvcc: a kernel source is compiled on first use for the GPU it runs on
(``sm_XY`` CUBIN), cached in memory and on disk (``$PCOPS_CACHE_DIR`` or
``~/.cache/pcops``, keyed by a hash of the source, options and NVRTC version), loaded with
the CUDA driver API and launched with ``cuLaunchKernel`` on ``torch.cuda.current_stream()``,
so CUDA-graph capture records it like any other kernel.

Only ``ctypes`` is used: NVRTC comes from the GPU machine's CUDA install or from the
``nvidia-cuda-nvrtc`` wheel (``pip install pcops[cuda]``); the driver from ``libcuda.so.1``.
NVRTC needs no GPU, so CI compiles every ``csrc/*.cu`` for sm_90 (``compile_all``).

Kernel conventions: sources are self-contained (NVRTC has no standard headers), entry points
are ``extern "C" __global__``; arguments are passed as ctypes scalars or tensors (device pointer).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import sys
import threading
from pathlib import Path

import torch


def _csrc_dir() -> Path:
    """``csrc/`` of a source checkout (or editable install), else the copy a wheel ships in ``pcops/csrc``."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "csrc", here / "csrc"):
        if any(candidate.glob("*.cu")):
            return candidate
    return here.parent / "csrc"


CSRC_DIR = _csrc_dir()

_lock = threading.Lock()
_nvrtc_lib = None
_cuda_lib = None
_modules: dict[tuple, ctypes.c_void_p] = {}
_functions: dict[tuple, "CudaKernel"] = {}


class NvrtcError(RuntimeError):
    """Compilation failed; the message carries NVRTC's log."""


def _candidate_nvrtc_paths() -> list[str]:
    names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    found: list[str] = []
    for base in sys.path + [os.path.dirname(torch.__file__) + "/.."]:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"):
            found += sorted(glob.glob(os.path.join(base, sub, "libnvrtc.so*")))
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if root:
            found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
    # plain sonames last: the loader's own search path
    return [p for p in found if "builtins" not in p and ".alt." not in p] + names


def nvrtc():
    """The NVRTC shared library (ctypes), loaded once; ``RuntimeError`` if none is installed."""
    global _nvrtc_lib
    if _nvrtc_lib is None:
        errors = []
        for path in _candidate_nvrtc_paths():
            try:
                # NVRTC dlopens its builtins library by soname: preload it from the same folder
                for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*"))):
                    if ".alt." not in builtins:
                        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                lib = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append(str(e))
        else:
            raise RuntimeError(
                "NVRTC not found: install the CUDA toolkit or `pip install pcops[cuda]` "
                "(nvidia-cuda-nvrtc). Tried: " + "; ".join(errors[-3:])
            )
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        _nvrtc_lib = lib
    return _nvrtc_lib


def nvrtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _nvrtc_check(status: int, what: str) -> None:
    if status != 0:
        raise NvrtcError(f"{what}: {nvrtc().nvrtcGetErrorString(status).decode()}")


def compile_source(source: str, name: str = "kernel.cu", arch: str = "sm_90", options=()) -> bytes:
    """Compile CUDA C++ ``source`` to a CUBIN for ``arch`` (e.g. ``"sm_90"``); ``NvrtcError`` with the log."""
    lib = nvrtc()
    prog = ctypes.c_void_p()
    _nvrtc_check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device", *options]
        c_opts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), c_opts)
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if status != 0:
            raise NvrtcError(f"compiling {name} for {arch} failed:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        _nvrtc_check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _nvrtc_check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_file(file: str, arch: str = "sm_90", options=()) -> bytes:
    """Compile ``csrc/<file>`` (cached on disk by source hash, options and NVRTC version)."""
    path = CSRC_DIR / file
    source = path.read_text()
    key = hashlib.sha256("\0".join([source, arch, *options, repr(nvrtc_version())]).encode()).hexdigest()[:24]
    cache_dir = Path(os.environ.get("PCOPS_CACHE_DIR", Path.home() / ".cache" / "pcops"))
    cached = cache_dir / f"{path.stem}-{arch}-{key}.cubin"
    if cached.exists():
        return cached.read_bytes()
    cubin = compile_source(source, file, arch, options)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(cubin)
        tmp.replace(cached)
    except OSError:
        pass  # a read-only home only costs a recompile next time
    return cubin


def compile_all(arch: str = "sm_90") -> dict[str, int]:
    """Compile every ``csrc/*.cu`` (no GPU needed); returns ``{file: cubin bytes}``."""
    return {p.name: len(compile_source(p.read_text(), p.name, arch)) for p in sorted(CSRC_DIR.glob("*.cu"))}


def _cuda():
    global _cuda_lib
    if _cuda_lib is None:
        _cuda_lib = ctypes.CDLL("libcuda.so.1")
    return _cuda_lib


def _cu_check(status: int, what: str) -> None:
    if status != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(status, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: CUDA error {status} ({(msg.value or b'?').decode()})")


class CudaKernel:
    """A loaded ``extern "C"`` kernel; call ``k(grid, block, args, shared_mem=0)``."""

    def __init__(self, func: ctypes.c_void_p, name: str):
        self._func = func
        self.name = name

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        holders = []
        for a in args:
            if isinstance(a, torch.Tensor):
                holders.append(ctypes.c_void_p(a.data_ptr()))
            elif isinstance(a, ctypes._SimpleCData):
                holders.append(a)
            else:
                raise TypeError(f"kernel argument: expected a tensor or a ctypes scalar, got {type(a).__name__}")
        params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _cu_check(
            _cuda().cuLaunchKernel(
                self._func,
                *[ctypes.c_uint(g) for g in grid],
                *[ctypes.c_uint(b) for b in block],
                ctypes.c_uint(shared_mem),
                stream,
                params,
                None,
            ),
            f"cuLaunchKernel({self.name})",
        )


def get_kernel(file: str, name: str, device: torch.device | None = None) -> CudaKernel:
    """The kernel ``name`` from ``csrc/<file>``, compiled for ``device``'s architecture (cached)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    index = device.index if device.index is not None else torch.cuda.current_device()
    fkey = (file, name, index)
    kernel = _functions.get(fkey)
    if kernel is not None:
        return kernel
    with _lock:
        if fkey in _functions:
            return _functions[fkey]
        torch.cuda.init()
        with torch.cuda.device(index):
            torch.cuda.current_stream()  # makes torch's primary context current on this thread
            major, minor = torch.cuda.get_device_capability(index)
            mkey = (file, index)
            module = _modules.get(mkey)
            if module is None:
                ctx = ctypes.c_void_p()
                _cuda().cuCtxGetCurrent(ctypes.byref(ctx))
                if not ctx.value:
                    dev = ctypes.c_int()
                    _cu_check(_cuda().cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
                    _cu_check(_cuda().cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
                    _cu_check(_cuda().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
                cubin = compile_file(file, f"sm_{major}{minor}")
                module = ctypes.c_void_p()
                _cu_check(_cuda().cuModuleLoadData(ctypes.byref(module), cubin), f"cuModuleLoadData({file})")
                _modules[mkey] = module
            func = ctypes.c_void_p()
            _cu_check(
                _cuda().cuModuleGetFunction(ctypes.byref(func), module, name.encode()), f"cuModuleGetFunction({name})"
            )
        kernel = _functions[fkey] = CudaKernel(func, name)
        return kernel
