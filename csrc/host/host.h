// pcops native host path: shared pieces (the driver's launch entry point, bound Triton kernels,
// the checks every native op makes before it takes a call). Built at run time by pcops/_native.py.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

namespace pcops_host {

namespace py = pybind11;

// One compiled Triton kernel: its CUfunction (loaded by Triton in the device's primary context),
// threads per program and dynamic shared memory, as Triton's own launcher passes them.
struct Kernel {
  void* function = nullptr;
  unsigned threads = 0;
  unsigned shared = 0;
};

// Launch `k` on the current CUDA stream of `device` with a (grid_x, 1, 1) grid. `params` lists the
// kernel's runtime parameters in Triton's order (constexpr and specialised-away ones omitted);
// the launch appends Triton's two scratch pointers (null: only kernels without scratch are bound).
// Throws c10::Error when the driver refuses the launch.
void launch(const Kernel& k, unsigned grid_x, at::Device device, void** params, int num_params);

// The object is a plain torch.Tensor or torch.nn.Parameter (no subclass that could intercept).
bool plain_tensor(py::handle obj);

// Nothing could intercept a direct launch: no dispatch mode, functorch transform, JIT tracer or
// RecordFunction callback (profiler) is active, and `t` carries no Python or functorch key.
bool direct_ok(const at::Tensor& t);

// `device` is CUDA and the current CUDA device (the context Triton launches in).
bool current_cuda(const at::Device& device);

// A Python float or int (not bool) as double; false otherwise.
bool as_double(py::handle obj, double* out);

// A Python str equal to `text`.
bool str_is(py::handle obj, const char* text);

}  // namespace pcops_host
