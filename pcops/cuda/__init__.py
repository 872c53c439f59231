"""Launchers for the CUDA C++ kernels in ``csrc/``, compiled at run time with NVRTC."""
