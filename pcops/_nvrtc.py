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
import struct
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


_CU_LAUNCH_PARAM_END, _CU_LAUNCH_PARAM_BUFFER_POINTER, _CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
_launch_fn = None  # cuLaunchKernel with declared argument types (plain ints pass without ctypes wrappers)


def _cu_launch():
    global _launch_fn
    if _launch_fn is None:
        fn = _cuda()["cuLaunchKernel"]  # indexing gives a function object of its own: argtypes set here only
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int
        _launch_fn = fn
    return _launch_fn


def _struct_code(kind) -> tuple[str, int]:
    """``(struct code, alignment)`` of a kernel argument type: a tensor (device pointer) or a ctypes scalar."""
    if issubclass(kind, torch.Tensor):
        return "Q", 8
    if not issubclass(kind, ctypes._SimpleCData) or kind._type_ not in "bBhHiIlLqQfd?":
        raise TypeError(f"kernel argument: expected a tensor or a ctypes scalar, got {kind.__name__}")
    size = ctypes.sizeof(kind)
    if kind._type_ in "fd":
        return {4: "f", 8: "d"}[size], size
    if kind._type_ == "?":
        return "?", 1
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[size]
    return (code if kind._type_.islower() else code.upper()), size


class _Layout:
    """The packed parameter buffer of one argument-type signature (CUDA's kernel-parameter ABI:
    each argument at its natural alignment) and the ``extra`` array that hands it to
    ``cuLaunchKernel`` (``CU_LAUNCH_PARAM_BUFFER_POINTER``)."""

    __slots__ = ("packer", "tensors", "buf", "size", "extra")

    def __init__(self, kinds: tuple):
        fmt, offset = "<", 0
        for kind in kinds:
            code, align = _struct_code(kind)
            pad = -offset % align
            fmt += "x" * pad + code
            offset += pad + struct.calcsize("<" + code)
        self.packer = struct.Struct(fmt)
        self.tensors = tuple(issubclass(k, torch.Tensor) for k in kinds)
        self.size = ctypes.c_size_t(max(offset, 1))
        self.buf = ctypes.create_string_buffer(max(offset, 1))
        self.extra = (ctypes.c_void_p * 5)(
            _CU_LAUNCH_PARAM_BUFFER_POINTER,
            ctypes.addressof(self.buf),
            _CU_LAUNCH_PARAM_BUFFER_SIZE,
            ctypes.addressof(self.size),
            _CU_LAUNCH_PARAM_END,
        )


class CudaKernel:
    """A loaded ``extern "C"`` kernel; call ``k(grid, block, args, shared_mem=0)``.

    ``args``: tensors (passed as their device pointers) and ctypes scalars, in the kernel's
    parameter order. The arguments are packed into one buffer per argument-type signature
    (``struct``, built once) and passed through ``cuLaunchKernel``'s ``extra`` parameter: no
    ctypes object per argument per launch (host times: ``benchmarks/NOTES.md``)."""

    def __init__(self, func: ctypes.c_void_p, name: str):
        self._func = func
        self._handle = func.value
        self.name = name
        self._layouts: dict = {}
        self._lock = threading.Lock()  # one buffer per signature: launches from two threads take turns

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        kinds = tuple(map(type, args))
        layout = self._layouts.get(kinds)
        if layout is None:
            layout = self._layouts[kinds] = _Layout(kinds)
        values = [a.data_ptr() if t else a.value for a, t in zip(args, layout.tensors)]
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        with self._lock:
            layout.packer.pack_into(layout.buf, 0, *values)
            status = _cu_launch()(self._handle, gx, gy, gz, bx, by, bz, shared_mem, stream, None, layout.extra)
        if status:
            _cu_check(status, f"cuLaunchKernel({self.name})")


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
