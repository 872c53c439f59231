"""The native host path: a small C++ module (``csrc/host/*.cpp``) that takes an op's eager call,
checks it, allocates and launches the Triton kernel pcops already compiled for that shape class.

Why: an eager call's host time in Python (argument checks, the op dispatch, allocations through
the Python API, Triton's launcher) is several times its kernel time for the small and mid-sized
calls of a training or inference loop (issue 19; ``benchmarks/NOTES.md``); in C++ the same work
takes a few µs.

How it is used (today: ``fused_layer_norm_gelu`` without dropout and ``sparse_softmax``, their
gradients C++ autograd nodes; ``pillar_scatter`` (float32), ``voxelize`` in the CSR layout,
``dynamic_voxelize`` (numbered or ``cells_only``), ``sparse_conv_kernel_map`` (submanifold, and
regular or transposed maps of the default form) and ``nms_bev`` / ``batched_nms_bev`` (float32, the
CUDA C++ pipeline's rank-sort sizes)):

- the op's public function hands the call to the module first (``MODULE.<op>_forward``); the
  module returns ``None`` for anything it does not take (another device or backend, a tensor
  subclass, a gradient, an active dispatch mode, functorch transform, tracer or profiler, a shape
  class it has no kernel for, ...), and the Python path runs, with its checks and errors;
- the Python path, after launching the kernel it autotuned for a shape class, registers that
  kernel (its ``CUfunction``, threads, shared memory, rows per program) with the module
  (``register``), so later calls of that class take the native path. Both paths launch the same
  binary with the same arguments: results are bit-identical. Where an op derives buffer sizes
  from its input (workspaces, hash capacities, views), the C++ side derives them itself and its
  registration compares them with the Python path's (a mismatch registers nothing and is logged);
  the key of a registered kernel holds every Triton specialisation its arguments can take (int
  classes, pointer alignment of workspace views, constexprs chosen from the sizes);
- the self-checked ops (``sparse_softmax``, ``voxelize``, numbered ``dynamic_voxelize``, kernel
  maps, NMS) are served only once the native call of each class they registered matched the Python
  path's outputs on the registering call's arguments (``check`` / ``serves`` below).

Build: the first CUDA call of such an op starts a background thread that compiles the module
with the C++ compiler (``$CXX`` or ``g++``, against torch's headers; about 15-30 s on one core,
the calls meanwhile take the Python path) into ``$PCOPS_CACHE_DIR`` (default ``~/.cache/pcops``),
keyed by a hash of the sources, the torch and Python versions and the flags; later processes
load the cached module at once. Where no compiler is found or the build fails, the reason is
logged once (logger ``"pcops"``, WARNING) and everything stays on the Python path.
``PCOPS_NATIVE_HOST=0`` turns the native path off (e.g. where run-time compilation is not
allowed).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from ._nvrtc import CSRC_DIR

__all__ = [
    "MODULE",
    "request",
    "loaded",
    "build",
    "bind",
    "on_load",
    "registrable",
    "spec",
    "enabled",
    "status",
    "registered",
    "serves",
    "check",
]

MODULE = None  # the loaded module; None until built and loaded (or where it cannot be)

_logger = logging.getLogger("pcops")
_lock = threading.Lock()
_state = {"started": False, "error": None}
_NAME = "_pcops_host"


def enabled() -> bool:
    """False where ``PCOPS_NATIVE_HOST=0``."""
    return os.environ.get("PCOPS_NATIVE_HOST", "1") != "0"


def status() -> str:
    """``"loaded"``, ``"building"``, ``"off"``, ``"not started"`` or ``"failed: <reason>"``."""
    if MODULE is not None:
        return "loaded"
    if not enabled():
        return "off"
    if _state["error"] is not None:
        return f"failed: {_state['error']}"
    return "building" if _state["started"] else "not started"


def _sources() -> list[Path]:
    folder = CSRC_DIR / "host"
    return sorted(folder.glob("*.cpp")) + sorted(folder.glob("*.h"))


def _compiler() -> str | None:
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def _flags() -> list[str]:
    from torch.utils import cpp_extension as ce

    flags = ["-O2", "-fPIC", "-std=c++17", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    flags += [f"-I{p}" for p in ce.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    return flags


def _link_flags() -> list[str]:
    from torch.utils import cpp_extension as ce

    libs = ce.library_paths()
    return (
        [f"-L{p}" for p in libs]
        + [f"-Wl,-rpath,{p}" for p in libs]
        + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl"]
    )


def _target() -> Path:
    h = hashlib.sha256()
    for src in _sources():
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    h.update(" ".join([torch.__version__, sys.version, *_flags(), *_link_flags()]).encode())
    cache = Path(os.environ.get("PCOPS_CACHE_DIR", Path.home() / ".cache" / "pcops"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache / "host" / h.hexdigest()[:16] / f"{_NAME}{suffix}"


def build(force: bool = False) -> Path:
    """Compile the module into the cache (each source in its own compiler process, then a link)
    and return its path; the cached build when it exists (unless ``force``). Raises
    ``RuntimeError`` with the compiler's message when a step fails."""
    target = _target()
    if target.exists() and not force:
        return target
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objs, procs = [], []
        for src in (s for s in _sources() if s.suffix == ".cpp"):
            obj = Path(tmp) / (src.stem + ".o")
            objs.append(str(obj))
            cmd = [cxx, *_flags(), "-c", str(src), "-o", str(obj)]
            procs.append((src, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for src, proc in procs:
            out, _ = proc.communicate()
            if proc.returncode:
                raise RuntimeError(f"compiling {src.name} failed:\n{out[-4000:]}")
        so = Path(tmp) / target.name
        link = subprocess.run([cxx, "-shared", *objs, "-o", str(so), *_link_flags()], capture_output=True, text=True)
        if link.returncode:
            raise RuntimeError(f"linking {_NAME} failed:\n{(link.stdout + link.stderr)[-4000:]}")
        os.replace(so, target)  # atomic: a concurrent process loads either build, never half of one
    return target


_ON_LOAD: list = []  # callables(module), run once the module is loaded (per-op set-up)


def on_load(fn) -> None:
    """Run ``fn(module)`` when the module is loaded (at once if it is)."""
    _ON_LOAD.append(fn)
    if MODULE is not None:
        fn(MODULE)


def loaded():
    """The module, or None after starting its load (:func:`request`): what a registration calls."""
    if MODULE is None:
        request()
    return MODULE


def registrable(*tensors: torch.Tensor) -> bool:
    """A kernel launched for these tensors may be handed to the module: they are on the current CUDA
    device (Triton loads the kernel there; the module keys it by the tensors' device) and 16-byte
    aligned (Triton specialises on it; the module passes aligned pointers only)."""
    index = torch.cuda.current_device()
    return all(t.is_cuda and t.device.index == index and not t.data_ptr() & 15 for t in tensors)


def spec(v: int) -> int:
    """Triton's specialisation class of an int argument, as ``csrc/host/host.h``'s ``spec``: 0 for
    1, 1 for a multiple of 16, 2 otherwise."""
    return 0 if v == 1 else (1 if v % 16 == 0 else 2)


_KINDS = {"p": lambda t: t.startswith("*"), "i": lambda t: t == "i32", "f": lambda t: t == "fp32"}


def bind(kernel, grid: tuple, args: tuple, kwargs: dict, kinds: str) -> tuple[int, int, int, int] | None:
    """``(function, warps, shared, present)`` of the kernel Triton compiled for ``kernel[grid](*args,
    **kwargs)`` (from its cache: no launch), as the C++ side launches it: ``kinds[i]`` is the C++
    type of positional argument ``i`` (``p`` pointer, ``i`` int32, ``f`` float32) and ``present``
    has bit ``i`` set where Triton kept it a runtime parameter. None where the kernel takes another
    type (an int64 int), any runtime parameter by keyword, scratch memory or several CTAs."""
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    if hasattr(compiled, "result"):
        compiled = compiled.result()
    compiled._init_handles()
    types = list(compiled.src.signature.values())
    if len(types) < len(kinds) or any(t != "constexpr" for t in types[len(kinds) :]):
        return None
    present = 0
    for i, kind in enumerate(kinds):
        if types[i] == "constexpr":
            continue
        if not _KINDS[kind](types[i]):
            return None
        present |= 1 << i
    md = compiled.metadata
    if md.num_ctas != 1 or md.global_scratch_size or md.profile_scratch_size or getattr(md, "tensordesc_meta", None):
        return None
    if getattr(md, "launch_pdl", False) or getattr(md, "launch_cooperative_grid", False):
        return None  # (plain cuLaunchKernel sets no launch attributes)
    return compiled.function, md.num_warps, md.shared, present


# Self-check of the ops whose native calls are checked against the Python path before they are
# served (``serves``): each registration of one of the op's classes puts the op on hold until the
# public call that registered it has also run the native call on the same arguments and every
# output matched bit for bit (one extra call and one host sync per registered class, skipped while
# a CUDA graph is being captured: a later eager call of the op checks). A mismatch, or an error in
# the native call, turns the op's native path off for the process, with a warning.
_PENDING: set = set()  # ops with a class registered and not checked yet: on hold
_CHECKED: set = set()  # ops whose native calls matched the Python path's outputs
_FAILED: set = set()  # ops whose native call differed or failed: the Python path only


def registered(op: str) -> None:
    """A class of ``op`` was registered with the module: the op is on hold until a call checks it."""
    if op not in _FAILED:
        _PENDING.add(op)


def serves(op: str):
    """The module where it may take ``op``'s calls (checked, not on hold), else None."""
    return MODULE if op in _CHECKED and op not in _PENDING else None


def _flat(value) -> list:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flat(v)]
    return [value]


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same(a, b) -> bool:
    """Bit for bit (NaN payloads included) for tensors, ``==`` for anything else."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.element_size() in _BITS:
        bits = _BITS[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


def check(op: str, native_call, result) -> None:
    """Compare ``native_call()`` (the module on the arguments that gave ``result``) with ``result``
    while ``op`` is on hold (see ``serves``). ``native_call`` returning None (not taken) leaves the
    check for a later call."""
    if op not in _PENDING or MODULE is None:
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return  # (no sync inside a capture: a later eager call checks)
    try:
        with torch.no_grad():
            got = native_call()
    except Exception as e:  # noqa: BLE001 - the Python path's result stands; the op goes off
        got, error = False, e
    else:
        error = None
    if got is None:
        return
    _PENDING.discard(op)
    want = _flat(result)
    if error is None:
        got = _flat(got)
        if len(want) == len(got) and all(_same(a, b) for a, b in zip(want, got)):
            _CHECKED.add(op)
            return
    _CHECKED.discard(op)
    _FAILED.add(op)
    _logger.warning(
        "pcops: the native host path's %s %s the Python path's on the same arguments; it is off for %s "
        "in this process (please report this)",
        op,
        f"failed ({error})" if error is not None else "differs from",
        op,
    )


def _load(path: Path):
    loader = importlib.machinery.ExtensionFileLoader(_NAME, str(path))
    spec = importlib.util.spec_from_file_location(_NAME, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.init(torch.nn.Parameter)
    return module


def _build_and_load() -> None:
    global MODULE
    try:
        module = _load(build())
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, said once
        _state["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
        _logger.warning("pcops: the native host path is unavailable (%s); eager calls stay on the Python path", e)
        return
    for fn in _ON_LOAD:
        fn(module)
    MODULE = module


def request(wait: bool = False) -> None:
    """Start loading the module (once per process): the cached build at once, else a build in a
    background thread. ``wait=True`` returns after it is loaded or has failed (tests)."""
    if not enabled():
        return
    with _lock:
        if not _state["started"]:
            _state["started"] = True
            try:
                cached = _target().exists()
            except Exception as e:  # noqa: BLE001 - e.g. no setuptools for torch's header paths, no home directory
                _state["error"] = str(e) or type(e).__name__
                _logger.warning(
                    "pcops: the native host path is unavailable (%s); eager calls stay on the Python path", e
                )
                return
            if cached:
                _build_and_load()
            else:
                _state["thread"] = threading.Thread(target=_build_and_load, name="pcops-native-build", daemon=True)
                _state["thread"].start()
    thread = _state.get("thread")
    if wait and thread is not None:
        thread.join()
