# Sourced by scripts/test.sh and scripts/demo.sh: installs pcops and its test dependencies once.
# CPU machines take the CPU build of torch (torch==2.13.0 is on disk here; plain `torch`
# would pull a multi-GB CUDA build); a machine that already has torch keeps it.
if ! python -c "import torch, triton, pytest, matplotlib, pcops" >/dev/null 2>&1 \
   || ! python -c "import pcops._nvrtc as n; n.nvrtc()" >/dev/null 2>&1; then
  python -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>/dev/null \
    || python -c "import torch" || python -m pip install -q torch
  # numpy < 2.4: the Triton 3.6 CPU interpreter converts 1-element arrays with int()
  python -m pip install -q --disable-pip-version-check "triton==3.6.0" "numpy>=1.26,<2.4" pytest matplotlib \
    "nvidia-cuda-nvrtc==13.0.*"
  python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
fi
