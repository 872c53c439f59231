// Native host path of pcops.fused_layer_norm_gelu's forward (no gradient, no dropout): the checks,
// the two allocations and the launch of the Triton kernel pcops autotuned and compiled for this
// shape class, in C++. Anything else returns None and the Python path runs (and raises its errors).
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cmath>
#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

// What selects the compiled kernel: device, dtypes of x / weight / bias, N, the row class of the
// autotune key, and Triton's specialisation of M (a multiple of 16 or not); all pointers are
// 16-byte aligned (checked per call) and M, N > 1 (Triton turns 1 into a constant).
struct Key {
  int16_t device;
  int8_t x, w, b;
  bool big, m16, tanh;
  int64_t n;
  bool operator==(const Key& o) const {
    return device == o.device && x == o.x && w == o.w && b == o.b && big == o.big && m16 == o.m16 &&
           tanh == o.tanh && n == o.n;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = static_cast<uint64_t>(k.n) * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(k.device) << 32) ^ (static_cast<uint64_t>(static_cast<uint8_t>(k.x)) << 24) ^
         (static_cast<uint64_t>(static_cast<uint8_t>(k.w)) << 16) ^
         (static_cast<uint64_t>(static_cast<uint8_t>(k.b)) << 8) ^ (k.big << 2) ^ (k.m16 << 1) ^ k.tanh;
    return static_cast<size_t>(h);
  }
};
struct Plan {
  Kernel kernel;
  int64_t rows_per_program;
};

std::unordered_map<Key, Plan, KeyHash> plans;  // (the GIL serialises registration and lookups)
int64_t big_rows = INT64_MAX;                  // the row class threshold (set by registration)

Key key_of(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t m, int64_t n, bool tanh) {
  return Key{static_cast<int16_t>(x.device().index()),
             static_cast<int8_t>(x.scalar_type()),
             static_cast<int8_t>(w.scalar_type()),
             static_cast<int8_t>(b.scalar_type()),
             m >= big_rows,
             m % 16 == 0,
             tanh,
             n};
}

bool aligned(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0; }

// Remember the kernel the Python path launched for the shape class of (x2 (M, N), weight, bias).
void lng_register(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& b, bool tanh, int64_t big_rows_threshold,
                  int64_t function, int64_t rows_per_program, int64_t warps, int64_t shared) {
  TORCH_CHECK(x2.dim() == 2 && x2.is_cuda(), "lng_register: x2 must be a 2-D CUDA tensor");
  TORCH_CHECK(rows_per_program > 0 && warps > 0 && shared >= 0 && function != 0, "lng_register: bad plan");
  big_rows = big_rows_threshold;
  Plan plan{Kernel{reinterpret_cast<void*>(function), static_cast<unsigned>(32 * warps), static_cast<unsigned>(shared)},
            rows_per_program};
  plans[key_of(x2, w, b, x2.size(0), x2.size(1), tanh)] = plan;
}

bool float_type(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16;
}

// y = fused_layer_norm_gelu(x, weight, bias, eps, approximate, dropout_p, training, backend=backend), or
// None where this path does not apply (the caller then takes the Python path).
py::object lng_forward(py::handle x_obj, py::handle w_obj, py::handle b_obj, py::handle eps_obj, py::handle approx_obj,
                       py::handle p_obj, py::handle training_obj, py::handle backend_obj) {
  const py::object none = py::none();
  if (!plain_tensor(x_obj) || !plain_tensor(w_obj) || !plain_tensor(b_obj)) return none;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "triton")) return none;
  bool tanh;
  if (str_is(approx_obj, "tanh")) {
    tanh = true;
  } else if (str_is(approx_obj, "none")) {
    tanh = false;
  } else {
    return none;
  }
  double eps, p;
  if (!as_double(eps_obj, &eps) || !(eps > 0.0)) return none;
  if (!as_double(p_obj, &p) || !(p >= 0.0 && p < 1.0)) return none;
  if (training_obj.ptr() == Py_True) {
    if (p > 0.0) return none;  // dropout: the Python path draws the seed
  } else if (training_obj.ptr() != Py_False) {
    return none;
  }
  const at::Tensor& x = THPVariable_Unpack(x_obj.ptr());
  const at::Tensor& w = THPVariable_Unpack(w_obj.ptr());
  const at::Tensor& b = THPVariable_Unpack(b_obj.ptr());
  if (x.dim() < 1 || w.dim() != 1 || b.dim() != 1) return none;
  const int64_t n = x.size(-1);
  if (n <= 1 || w.size(0) != n || b.size(0) != n) return none;
  if (!float_type(x) || !float_type(w) || !float_type(b)) return none;
  const at::Device device = x.device();
  if (!current_cuda(device) || w.device() != device || b.device() != device) return none;
  if (c10::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || b.requires_grad())) return none;
  if (!x.is_contiguous() || !w.is_contiguous() || !b.is_contiguous()) return none;
  if (!aligned(x) || !aligned(w) || !aligned(b)) return none;
  if (!direct_ok(x) || !direct_ok(w) || !direct_ok(b)) return none;
  const int64_t m = x.numel() / n;
  if (m <= 1 || m >= (int64_t{1} << 31)) return none;
  const auto it = plans.find(key_of(x, w, b, m, n, tanh));
  if (it == plans.end()) return none;
  const Plan& plan = it->second;
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor stats = at::empty({2 * m}, x.options().dtype(at::kFloat));  // mean, rstd (unused without a gradient)
  void* px = x.data_ptr();
  void* pw = w.data_ptr();
  void* pb = b.data_ptr();
  void* py_ = y.data_ptr();
  void* pmean = stats.data_ptr();
  void* prstd = static_cast<float*>(pmean) + m;
  int32_t m32 = static_cast<int32_t>(m), n32 = static_cast<int32_t>(n);
  float feps = static_cast<float>(eps), fp = static_cast<float>(p);
  // (x, weight, bias, y, mean, rstd, seed (unread: x), M, N, eps, dropout_p): layer_norm_gelu.py's order
  void* params[] = {&px, &pw, &pb, &py_, &pmean, &prstd, &px, &m32, &n32, &feps, &fp};
  const unsigned grid = static_cast<unsigned>((m + plan.rows_per_program - 1) / plan.rows_per_program);
  launch(plan.kernel, grid, device, params, 11);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
}

size_t lng_plans() { return plans.size(); }

}  // namespace

void register_layer_norm_gelu(py::module_& m) {
  m.def("lng_register", &lng_register);
  m.def("lng_forward", &lng_forward);
  m.def("lng_plans", &lng_plans, "number of registered shape classes (tests)");
}

}  // namespace pcops_host
