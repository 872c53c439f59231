# Sourced by scripts/test.sh and scripts/demo.sh (after `cd` to the checkout) with
# PCOPS_SETUP=test or PCOPS_SETUP=demo. Creates the virtual environment .venv/ in the checkout
# once, activates it, and installs into it only what is missing, printing each install.
#
# - A Python that already imports torch (the GPU machine, which has no network) gets a venv
#   with --system-site-packages: its torch, triton and numpy are used as they are.
# - Otherwise the venv is isolated and gets the CPU build torch==2.13.0 (plain `torch` from PyPI
#   would be a multi-GB CUDA build); set PCOPS_TORCH_INDEX to pick another wheel index.
# - `test` adds pytest, pytest-timeout, matplotlib, tqdm, and, where no CUDA device runs the
#   kernels, triton==3.6.0 + numpy<2.4 for Triton's CPU interpreter and the NVRTC wheel so CI
#   compiles csrc/*.cu. `demo` adds matplotlib for the pictures.
# PYTHON picks the interpreter that creates the venv (default: python3).

_pcops_setup() {
  local purpose="${PCOPS_SETUP:-test}" py="${PYTHON:-python3}" venv=".venv"
  if [ ! -x "$venv/bin/python" ]; then
    if "$py" -c "import torch" >/dev/null 2>&1; then
      echo "setup: creating $venv/ with --system-site-packages (reusing torch" \
        "$("$py" -c 'import torch; print(torch.__version__)') and pip of $(command -v "$py"))"
      "$py" -m venv --system-site-packages --without-pip "$venv"
      # --system-site-packages sees only the base interpreter's packages; when $py is itself a
      # venv (or has user-site packages), point the new venv at its site folders too
      local site_dir
      site_dir=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
      "$py" -c "import site, sys; dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []); print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in dirs))" \
        > "$site_dir/_pcops_parent_site.pth"
    else
      echo "setup: creating $venv/ (isolated: $(command -v "$py") has no torch)"
      "$py" -m venv "$venv"
    fi
  fi
  # shellcheck disable=SC1091
  source "$venv/bin/activate"
  local pip=(python -m pip install --disable-pip-version-check)

  if ! python -c "import torch" >/dev/null 2>&1; then
    local index="${PCOPS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
    echo "setup: installing torch==2.13.0 (CPU build; extra index $index)"
    "${pip[@]}" --retries 1 --extra-index-url "$index" "torch==2.13.0"
  fi

  # what is missing, as pip requirements
  local want
  want=$(PCOPS_SETUP="$purpose" python - <<'EOF'
import importlib.util, os
import torch
cuda = torch.cuda.is_available()
purpose = os.environ["PCOPS_SETUP"]
need = []
def missing(mod):
    return importlib.util.find_spec(mod) is None
if missing("numpy"):
    need.append("numpy>=1.26,<2.4" if not cuda else "numpy>=1.26")
try:  # an editable install without build isolation needs setuptools >= 70.1 (or wheel)
    import setuptools
    if tuple(int(v) for v in setuptools.__version__.split(".")[:2]) < (70, 1) and missing("wheel"):
        need.append("setuptools>=70.1")
except ImportError:
    need.append("setuptools>=70.1")
if missing("matplotlib"):
    need.append("matplotlib>=3.8")
if purpose == "test":
    for mod, req in (("pytest", "pytest>=8"), ("pytest_timeout", "pytest-timeout>=2.3"), ("tqdm", "tqdm>=4.60"),
                     ("numba", "numba>=0.60"), ("scipy", "scipy>=1.10")):
        if missing(mod):
            need.append(req)
    if not cuda:
        # the CPU interpreter of Triton 3.6 is what the tests are run with; it needs numpy < 2.4
        import importlib.metadata as md
        try:
            tv = md.version("triton")
        except md.PackageNotFoundError:
            tv = None
        if tv != "3.6.0":
            need.append("triton==3.6.0")
        if not missing("numpy"):
            major, minor = (int(v) for v in md.version("numpy").split(".")[:2])
            if (major, minor) >= (2, 4):
                need.append("numpy>=1.26,<2.4")
        try:  # NVRTC, so tests/test_nvrtc.py compiles csrc/*.cu without a GPU
            import ctypes, glob, sys
            paths = [p for s in sys.path if s for p in glob.glob(f"{s}/nvidia/*/lib/libnvrtc.so*")]
            if not paths:
                ctypes.CDLL("libnvrtc.so")
        except OSError:
            need.append("nvidia-cuda-nvrtc==13.0.*")
print(" ".join(need))
EOF
)
  if [ -n "$want" ]; then
    echo "setup: installing into $venv/: $want"
    # not fatal: a machine without network (the GPU machine) runs with what it has
    # shellcheck disable=SC2086
    "${pip[@]}" --retries 1 --timeout 30 $want \
      || echo "setup: WARNING: could not install $want (no network?); continuing without"
  fi

  # pcops itself, editable from this checkout (no dependencies: they are handled above)
  # (checked from / so that the checkout's own pcops/ folder does not count as installed)
  local here
  here=$(pwd)
  if ! (cd / && HERE="$here" python -c "import os, pathlib, sys, pcops.models; sys.exit(pathlib.Path(pcops.__file__).resolve().parent != pathlib.Path(os.environ['HERE'], 'pcops').resolve())") >/dev/null 2>&1; then
    echo "setup: installing pcops from $(pwd) (editable) into $venv/"
    "${pip[@]}" --no-deps --no-build-isolation -e .
  fi
  echo "setup: $venv/ ready: $(python -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")')"
}
_pcops_setup
unset -f _pcops_setup
