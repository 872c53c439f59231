// pcops native host path: shared pieces (the driver's launch entry point, bound Triton kernels,
// the checks every native op makes before it takes a call). Built at run time by pcops/_native.py.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>

namespace pcops_host {

namespace py = pybind11;

// One compiled Triton kernel: its CUfunction (loaded by Triton in the device's primary context),
// threads per program and dynamic shared memory, as Triton's own launcher passes them.
// `present`: bit i set where the kernel's i-th positional argument is a runtime parameter (Triton
// turns an int argument equal to 1 into a constant: that specialisation has its own Kernel).
// `scratch`: a Triton kernel (two scratch pointers follow its parameters); false for NVRTC ones.
struct Kernel {
  void* function = nullptr;
  unsigned threads = 0;
  unsigned shared = 0;
  uint32_t present = 0;
  bool scratch = true;
};

// Triton's specialisation class of an int argument: 0 for 1, 1 for a multiple of 16, 2 otherwise.
inline int spec(int64_t v) { return v == 1 ? 0 : (v % 16 == 0 ? 1 : 2); }

// A Kernel from Python's description (see pcops/_native.py: bind()).
Kernel make_kernel(int64_t function, int64_t warps, int64_t shared, int64_t present);

// A Kernel from pcops._native.bind()'s tuple (function, warps, shared, present).
Kernel make_kernel(py::handle bound);

// A Kernel for an NVRTC-compiled csrc/*.cu function: every argument passed, no scratch pointers.
Kernel nvrtc_kernel(int64_t function, int64_t threads);

// Launch `k` on the current CUDA stream of `device` with a (grid_x, grid_y, grid_z) grid. `args`
// points at the kernel's positional arguments in order (`num_args` of them); those `k.present`
// marks are passed, then (Triton kernels) the two scratch pointers, null: only kernels without
// scratch are bound. Throws c10::Error when the driver refuses the launch.
void launch(const Kernel& k, unsigned grid_x, at::Device device, void** args, int num_args, unsigned grid_y = 1,
            unsigned grid_z = 1);

// A hash for plan keys made of small integers (std::array<int64_t, N>).
struct ArrayHash {
  template <size_t N>
  size_t operator()(const std::array<int64_t, N>& a) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const int64_t v : a) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// The smallest power of two >= v (1 for v <= 1): Python's next_power_of_2 for v >= 1.
inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Rounds a float count up to 16 bytes (a second buffer carved from one allocation stays aligned,
// as Triton's pointer specialisation assumes).
inline int64_t pad4(int64_t v) { return (v + 3) & ~int64_t{3}; }

// The object is a plain torch.Tensor or torch.nn.Parameter (no subclass that could intercept).
bool plain_tensor(py::handle obj);

// `t` can be launched on directly: a strided, non-nested tensor without a Python or functorch key
// (nothing of the tensor's could intercept the call). Call it before any other query of `t`.
bool direct_ok(const at::Tensor& t);

// Something of the thread's could intercept a direct launch: a dispatch mode, a functorch
// transform, the JIT tracer or a RecordFunction callback (profiler). Once per call.
bool intercepted();

// The data pointer is 16-byte aligned (Triton specialises pointer arguments on it).
inline bool aligned(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0; }

// Saved-tensor hooks (activation checkpointing, offloading) are active: a gradient must take the
// Python path, which saves the tensors those hooks expect.
bool saved_tensor_hooks();

// The CUDA driver was found (init()): without it nothing is registered and no call is taken.
bool have_driver();

// `device` is CUDA and the current CUDA device (the context Triton launches in).
bool current_cuda(const at::Device& device);

// A Python float or int (not bool) as double; false otherwise.
bool as_double(py::handle obj, double* out);

// A list or tuple of `n` Python floats or ints (as_double) into `out`; false otherwise.
bool as_doubles(py::handle obj, size_t n, double* out);

// A voxelizer's lengths argument: None (one sample), or a plain int32/int64 1-D tensor of at least one
// sample on `device`, contiguous and aligned (*out, its dtype and numel; null, -1 and 1 for None);
// false where the native path does not take it.
bool lengths_arg(py::handle obj, const at::Device& device, const at::Tensor** out, int64_t* dtype, int64_t* batch);

// A Python int (not bool) that fits int64; false otherwise.
bool as_int(py::handle obj, int64_t* out);

// A Python str equal to `text`.
bool str_is(py::handle obj, const char* text);

}  // namespace pcops_host
