// pcops native host path: the shared pieces declared in host.h, and the Python module.
#include "host.h"

#include <ATen/SavedTensorHooks.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

namespace pcops_host {

namespace {
using launch_fn_t = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                            void**, void**);
launch_fn_t launch_fn = nullptr;
PyObject* parameter_type = nullptr;  // torch.nn.Parameter, set by init()

// Remember torch.nn.Parameter; find the driver's launch entry point. Returns whether it was found
// (no driver, e.g. on a CPU-only machine: the module loads, registers nothing and takes no call).
bool init(py::handle parameter) {
  if (parameter_type == nullptr) {
    parameter_type = parameter.ptr();
    Py_INCREF(parameter_type);
  }
  if (!launch_fn) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib != nullptr) launch_fn = reinterpret_cast<launch_fn_t>(dlsym(lib, "cuLaunchKernel"));
  }
  return launch_fn != nullptr;
}
}  // namespace

Kernel make_kernel(int64_t function, int64_t warps, int64_t shared, int64_t present) {
  TORCH_CHECK(function != 0 && warps > 0 && shared >= 0 && present >= 0, "pcops native host: bad kernel");
  return Kernel{reinterpret_cast<void*>(function), static_cast<unsigned>(32 * warps), static_cast<unsigned>(shared),
                static_cast<uint32_t>(present)};
}

Kernel make_kernel(py::handle bound) {
  const py::tuple k = py::reinterpret_borrow<py::tuple>(bound);
  return make_kernel(k[0].cast<int64_t>(), k[1].cast<int64_t>(), k[2].cast<int64_t>(), k[3].cast<int64_t>());
}

Kernel nvrtc_kernel(int64_t function, int64_t threads) {
  TORCH_CHECK(function != 0 && threads > 0, "pcops native host: bad kernel");
  return Kernel{reinterpret_cast<void*>(function), static_cast<unsigned>(threads), 0, 0xFFFFFFFFu, false};
}

void launch(const Kernel& k, unsigned grid_x, at::Device device, void** args, int num_args, unsigned grid_y,
            unsigned grid_z) {
  TORCH_CHECK(launch_fn != nullptr, "pcops native host: no CUDA driver (init() found no cuLaunchKernel)");
  TORCH_CHECK(num_args <= 60, "pcops native host: too many kernel parameters");
  void* params[64];
  int n = 0;
  for (int i = 0; i < num_args; ++i) {
    if (k.present & (1u << i)) params[n++] = args[i];
  }
  uint64_t scratch = 0, profile = 0;
  if (k.scratch) {
    params[n++] = &scratch;
    params[n++] = &profile;
  }
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  void* stream = impl->getStream(device).native_handle();
  const int r = launch_fn(k.function, grid_x, grid_y, grid_z, k.threads, 1, 1, k.shared, stream, params, nullptr);
  TORCH_CHECK(r == 0, "pcops native host: cuLaunchKernel failed with CUresult ", r);
}

bool plain_tensor(py::handle obj) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()));
  return THPVariable_CheckExact(obj.ptr()) || (parameter_type != nullptr && type == parameter_type);
}

bool have_driver() { return launch_fn != nullptr; }

bool saved_tensor_hooks() { return !at::SavedTensorDefaultHooks::get_tls_state().stack.empty(); }

bool direct_ok(const at::Tensor& t) {
  if (t.layout() != at::kStrided || t.is_nested()) return false;
  static const c10::DispatchKeySet blocked({c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize,
                                            c10::DispatchKey::PythonTLSSnapshot});
  return !t.key_set().has_any(blocked);
}

bool intercepted() {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return true;
  // a functorch transform is active (its dynamic layer keys are in the thread's included set)
  if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)) return true;
  return torch::jit::tracer::isTracing() || at::hasCallbacks();
}

bool current_cuda(const at::Device& device) {
  if (!device.is_cuda()) return false;
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getDevice().index() == device.index();
}

bool as_double(py::handle obj, double* out) {
  PyObject* o = obj.ptr();
  if (PyFloat_CheckExact(o)) {
    *out = PyFloat_AS_DOUBLE(o);
    return true;
  }
  if (PyLong_CheckExact(o)) {
    *out = PyLong_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  return false;
}

bool as_doubles(py::handle obj, size_t n, double* out) {
  PyObject* o = obj.ptr();
  if (!(PyTuple_CheckExact(o) || PyList_CheckExact(o)) || static_cast<size_t>(PySequence_Fast_GET_SIZE(o)) != n)
    return false;
  for (size_t i = 0; i < n; ++i) {
    if (!as_double(PySequence_Fast_GET_ITEM(o, i), &out[i])) return false;
  }
  return true;
}

bool lengths_arg(py::handle obj, const at::Device& device, const at::Tensor** out, int64_t* dtype, int64_t* batch) {
  *out = nullptr;
  *dtype = -1;
  *batch = 1;
  if (obj.ptr() == Py_None) return true;
  if (!plain_tensor(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj.ptr());
  if (!direct_ok(t) || t.dim() != 1 || t.numel() < 1 || t.device() != device || !t.is_contiguous() || !aligned(t))
    return false;
  if (t.scalar_type() != at::kInt && t.scalar_type() != at::kLong) return false;
  *out = &t;
  *dtype = static_cast<int64_t>(t.scalar_type());
  *batch = t.numel();
  return true;
}

bool as_int(py::handle obj, int64_t* out) {
  PyObject* o = obj.ptr();
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  *out = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow || (*out == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  return true;
}

bool str_is(py::handle obj, const char* text) {
  return PyUnicode_Check(obj.ptr()) && PyUnicode_CompareWithASCIIString(obj.ptr(), text) == 0;
}

// per-op registration (one function per op file)
void register_layer_norm_gelu(py::module_& m);
void register_pillar_scatter(py::module_& m);
void register_voxelize_cells(py::module_& m);
void register_sparse_softmax(py::module_& m);
void register_kernel_map(py::module_& m);
void register_voxelize(py::module_& m);
void register_nms(py::module_& m);

}  // namespace pcops_host

PYBIND11_MODULE(_pcops_host, m) {
  m.doc() = "pcops native host path (built at run time; see pcops/_native.py)";
  m.def("init", &pcops_host::init, "remember torch.nn.Parameter; find the CUDA driver (returns whether found)");
  pcops_host::register_layer_norm_gelu(m);
  pcops_host::register_pillar_scatter(m);
  pcops_host::register_voxelize_cells(m);
  pcops_host::register_sparse_softmax(m);
  pcops_host::register_kernel_map(m);
  pcops_host::register_voxelize(m);
  pcops_host::register_nms(m);
}
