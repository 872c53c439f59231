"""Triton kernels and their launchers (the GPU path of most ops)."""
