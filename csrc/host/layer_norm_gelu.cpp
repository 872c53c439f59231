// Native host path of pcops.fused_layer_norm_gelu (no dropout): the checks, the allocations and
// the launches of the Triton kernels pcops autotuned and compiled for this shape class, in C++,
// with the gradient as a C++ autograd node. Anything else returns None and the Python path runs
// (and raises its errors); a backward whose kernels are not registered yet calls the Python one.
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <mutex>
#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What selects a compiled kernel: device, dtypes of x / weight / bias, N, the GELU form, and the
// Triton specialisation classes of the int arguments (spec()); all user pointers are 16-byte
// aligned (checked per call), as in the registered specialisation.
struct Key {
  int64_t n;
  int16_t device;
  int8_t x, w, b;
  int8_t tanh, a, c;  // a, c: the class of the row count / per-op extra
  bool operator==(const Key& o) const {
    return n == o.n && device == o.device && x == o.x && w == o.w && b == o.b && tanh == o.tanh && a == o.a &&
           c == o.c;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = static_cast<uint64_t>(k.n) * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(static_cast<uint16_t>(k.device)) << 48) ^
         (static_cast<uint64_t>(static_cast<uint8_t>(k.x)) << 40) ^
         (static_cast<uint64_t>(static_cast<uint8_t>(k.w)) << 32) ^
         (static_cast<uint64_t>(static_cast<uint8_t>(k.b)) << 24) ^ (static_cast<uint64_t>(k.tanh) << 16) ^
         (static_cast<uint64_t>(k.a) << 8) ^ static_cast<uint64_t>(k.c);
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

Key key_of(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t n, bool tanh, int a, int c) {
  return Key{n,
             static_cast<int16_t>(x.device().index()),
             static_cast<int8_t>(x.scalar_type()),
             static_cast<int8_t>(w.scalar_type()),
             static_cast<int8_t>(b.scalar_type()),
             static_cast<int8_t>(tanh),
             static_cast<int8_t>(a),
             static_cast<int8_t>(c)};
}

struct FwdPlan {
  Kernel kernel;
  int64_t rows_per_program;
};
// the backward's tiling of a shape class: rows per tile before the clamp to next_pow2(M) (keyed
// per class), and programs for each tile height (G = min(programs, tiles))
struct BwdShape {
  int64_t value;
};
struct BwdPlan {
  Kernel tiled;
  Kernel column_sum;
  int64_t sum_block_n;  // columns per column-sum program
};

// Forward plans are read and written under the GIL; the backward's are read on autograd's
// threads too, under `bwd_mutex`.
std::unordered_map<Key, FwdPlan, KeyHash> fwd_plans;  // c: the row class of the forward's autotune key
std::unordered_map<Key, BwdShape, KeyHash> bwd_shapes;  // a 0, c 0: the full tile height; a 1, c log2(BLOCK_M): programs
std::unordered_map<Key, BwdPlan, KeyHash> bwd_plans;    // a: 3 spec(M) + spec(G), c: plan_class()
std::mutex bwd_mutex;
int64_t big_rows = INT64_MAX;       // the forward's row-class threshold (set by registration)
py::object* py_backward = nullptr;  // the Python backward (set by lng_init), kept for the process

int log2_of(int64_t v) {
  int r = 0;
  while ((int64_t{1} << r) < v) ++r;
  return r;
}

// the column-sum launch's BLOCK_G for G partial rows (layer_norm_gelu_column_sum.py: column_sum_config)
int64_t sum_block_g(int64_t g) { return std::min<int64_t>(4096, int64_t{1} << log2_of(std::max<int64_t>(g, 16))); }

// the part of a backward plan's key the tile height and the column sum's BLOCK_G decide
int plan_class(int64_t block_m, int64_t g) { return log2_of(block_m) * 13 + log2_of(sum_block_g(g)); }

bool float_type(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16;
}

// y (x's shape) and stats (mean at 0, rstd at pad4(M)) through the registered forward kernel.
std::pair<at::Tensor, at::Tensor> run_forward(const FwdPlan& plan, const at::Tensor& x, const at::Tensor& w,
                                              const at::Tensor& b, int64_t m, int64_t n, double eps, double p) {
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor stats = at::empty({pad4(m) + m}, x.options().dtype(at::kFloat));
  void* px = x.data_ptr();
  void* pw = w.data_ptr();
  void* pb = b.data_ptr();
  void* py_ = y.data_ptr();
  void* pmean = stats.data_ptr();
  void* prstd = static_cast<float*>(pmean) + pad4(m);
  int32_t m32 = static_cast<int32_t>(m), n32 = static_cast<int32_t>(n);
  float feps = static_cast<float>(eps), fp = static_cast<float>(p);
  // (x, weight, bias, y, mean, rstd, seed (unread: x), M, N, eps, dropout_p): pcops/triton/layer_norm_gelu.py
  void* args[] = {&px, &pw, &pb, &py_, &pmean, &prstd, &px, &m32, &n32, &feps, &fp};
  const unsigned grid = static_cast<unsigned>((m + plan.rows_per_program - 1) / plan.rows_per_program);
  launch(plan.kernel, grid, x.device(), args, 11);
  return {y, stats};
}

// (dx, dweight, dbias) through the registered backward kernels, or false where none is registered.
bool run_backward(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                  const at::Tensor& stats, bool tanh, double p, variable_list* out) {
  const int64_t n = x.size(-1), m = x.numel() / n;
  int64_t g;
  BwdPlan plan;
  {
    std::lock_guard<std::mutex> lock(bwd_mutex);
    const auto full = bwd_shapes.find(key_of(x, w, b, n, tanh, 0, 0));
    if (full == bwd_shapes.end()) return false;
    const int64_t bm = std::min(full->second.value, int64_t{1} << log2_of(m));  // the tile height, as Python clamps it
    const auto programs = bwd_shapes.find(key_of(x, w, b, n, tanh, 1, log2_of(bm)));
    if (programs == bwd_shapes.end()) return false;
    g = std::min(programs->second.value, (m + bm - 1) / bm);
    const auto it = bwd_plans.find(key_of(x, w, b, n, tanh, 3 * spec(m) + spec(g), plan_class(bm, g)));
    if (it == bwd_plans.end()) return false;
    plan = it->second;
  }
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dw = at::empty_like(w);
  at::Tensor db = at::empty_like(b);
  at::Tensor parts = at::empty({pad4(g * n) + g * n}, x.options().dtype(at::kFloat));
  void* pgy = gy.data_ptr();
  void* px = x.data_ptr();
  void* pw = w.data_ptr();
  void* pb = b.data_ptr();
  void* pmean = stats.data_ptr();
  void* prstd = static_cast<float*>(pmean) + pad4(m);
  void* pdx = dx.data_ptr();
  void* pdwp = parts.data_ptr();
  void* pdbp = static_cast<float*>(pdwp) + pad4(g * n);
  void* pdw = dw.data_ptr();
  void* pdb = db.data_ptr();
  int32_t m32 = static_cast<int32_t>(m), n32 = static_cast<int32_t>(n), g32 = static_cast<int32_t>(g);
  float fp = static_cast<float>(p);
  // (dy, x, weight, bias, mean, rstd, seed (unread: x), dx, dw_part, db_part, M, N, G, dropout_p)
  void* targs[] = {&pgy, &px, &pw, &pb, &pmean, &prstd, &px, &pdx, &pdwp, &pdbp, &m32, &n32, &g32, &fp};
  launch(plan.tiled, static_cast<unsigned>(g), x.device(), targs, 14);
  // (dw_part, db_part, dweight, dbias, G, N): pcops/triton/layer_norm_gelu_column_sum.py
  void* sargs[] = {&pdwp, &pdbp, &pdw, &pdb, &g32, &n32};
  launch(plan.column_sum, static_cast<unsigned>((n + plan.sum_block_n - 1) / plan.sum_block_n), x.device(), sargs, 6);
  *out = {dx, dw, db};
  return true;
}

struct LayerNormGelu : public torch::autograd::Function<LayerNormGelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            const FwdPlan* plan, double eps, bool tanh, double p) {
    const int64_t n = x.size(-1), m = x.numel() / n;
    auto [y, stats] = run_forward(*plan, x, w, b, m, n, eps, p);
    ctx->save_for_backward({x, w, b, stats});
    ctx->saved_data["tanh"] = tanh;
    ctx->saved_data["p"] = p;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
                                 at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2], &stats = saved[3];
    const bool tanh = ctx->saved_data["tanh"].toBool();
    const double p = ctx->saved_data["p"].toDouble();
    at::Tensor gy = grad.scalar_type() == x.scalar_type() ? grad.contiguous() : grad.to(x.scalar_type()).contiguous();
    variable_list out;
    // create_graph (grad mode on) or no registered kernels: the Python backward, as the Python path runs it
    const bool usable = aligned(gy) && aligned(x) && aligned(w) && aligned(b) && aligned(stats) && x.is_contiguous() &&
                        w.is_contiguous() && b.is_contiguous() && stats.is_contiguous();
    if (c10::GradMode::is_enabled() || !usable || intercepted() || !run_backward(gy, x, w, b, stats, tanh, p, &out)) {
      const int64_t n = x.size(-1), m = x.numel() / n;
      py::gil_scoped_acquire gil;
      py::object r = (*py_backward)(gy.view({m, n}), x.view({m, n}), w, b, stats.narrow(0, 0, m),
                                    stats.narrow(0, pad4(m), m), tanh ? "tanh" : "none", p);
      auto t = r.cast<py::tuple>();
      out = {t[0].cast<at::Tensor>().view(x.sizes()), t[1].cast<at::Tensor>(), t[2].cast<at::Tensor>()};
    }
    return {ctx->needs_input_grad(0) ? out[0] : at::Tensor(),
            ctx->needs_input_grad(1) ? out[1] : at::Tensor(),
            ctx->needs_input_grad(2) ? out[2] : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// Remember the forward kernel the Python path launched for the shape class of (x2 (M, N), w, b).
void lng_register(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& b, bool tanh, int64_t big_rows_threshold,
                  int64_t function, int64_t warps, int64_t shared, int64_t present, int64_t rows_per_program) {
  TORCH_CHECK(x2.dim() == 2 && x2.is_cuda() && rows_per_program > 0, "lng_register: bad arguments");
  if (!have_driver()) return;
  big_rows = big_rows_threshold;
  const int64_t m = x2.size(0);
  fwd_plans[key_of(x2, w, b, x2.size(1), tanh, spec(m), m >= big_rows)] =
      FwdPlan{make_kernel(function, warps, shared, present), rows_per_program};
}

// Remember the backward kernels (tiled, column sum) the Python path launched for x2 (M, N): tiles of
// `block_m` rows (`full_block_m` before the clamp to next_pow2(M)), `programs` programs at most, G of them.
void lng_register_backward(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& b, bool tanh,
                           int64_t full_block_m, int64_t block_m, int64_t programs, int64_t g, int64_t tiled_function,
                           int64_t tiled_warps, int64_t tiled_shared, int64_t tiled_present, int64_t sum_function,
                           int64_t sum_warps, int64_t sum_shared, int64_t sum_present, int64_t sum_block_n) {
  TORCH_CHECK(x2.dim() == 2 && x2.is_cuda() && block_m > 0 && programs > 0 && sum_block_n > 0,
              "lng_register_backward: bad arguments");
  if (!have_driver()) return;
  const int64_t n = x2.size(1), m = x2.size(0);
  TORCH_CHECK(block_m == std::min(full_block_m, int64_t{1} << log2_of(m)) && (block_m & (block_m - 1)) == 0,
              "lng_register_backward: BLOCK_M does not match");
  TORCH_CHECK(g == std::min(programs, (m + block_m - 1) / block_m), "lng_register_backward: G does not match");
  std::lock_guard<std::mutex> lock(bwd_mutex);
  bwd_shapes[key_of(x2, w, b, n, tanh, 0, 0)] = BwdShape{full_block_m};
  bwd_shapes[key_of(x2, w, b, n, tanh, 1, log2_of(block_m))] = BwdShape{programs};
  bwd_plans[key_of(x2, w, b, n, tanh, 3 * spec(m) + spec(g), plan_class(block_m, g))] =
      BwdPlan{make_kernel(tiled_function, tiled_warps, tiled_shared, tiled_present),
              make_kernel(sum_function, sum_warps, sum_shared, sum_present), sum_block_n};
}

void lng_init(py::function backward) {
  if (py_backward == nullptr) py_backward = new py::object(backward);  // (never freed: used until exit)
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
  if (!direct_ok(x) || !direct_ok(w) || !direct_ok(b) || intercepted()) return none;
  if (x.dim() < 1 || w.dim() != 1 || b.dim() != 1) return none;
  const int64_t n = x.size(-1);
  if (n <= 1 || w.size(0) != n || b.size(0) != n) return none;
  if (!float_type(x) || !float_type(w) || !float_type(b)) return none;
  const at::Device device = x.device();
  if (!current_cuda(device) || w.device() != device || b.device() != device) return none;
  if (!x.is_contiguous() || !w.is_contiguous() || !b.is_contiguous()) return none;
  if (!aligned(x) || !aligned(w) || !aligned(b)) return none;
  const int64_t m = x.numel() / n;
  if (m < 1 || m >= (int64_t{1} << 31)) return none;
  const auto it = fwd_plans.find(key_of(x, w, b, n, tanh, spec(m), m >= big_rows));
  if (it == fwd_plans.end()) return none;
  const bool grad = c10::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || b.requires_grad());
  if (grad) {
    if (py_backward == nullptr || saved_tensor_hooks()) return none;
    at::Tensor y = LayerNormGelu::apply(x, w, b, &it->second, eps, tanh, p);
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
  }
  at::Tensor y = run_forward(it->second, x, w, b, m, n, eps, p).first;
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
}

py::tuple lng_plans() {
  std::lock_guard<std::mutex> lock(bwd_mutex);
  return py::make_tuple(fwd_plans.size(), bwd_plans.size());
}

}  // namespace

void register_layer_norm_gelu(py::module_& m) {
  m.def("lng_init", &lng_init, "the Python backward, for gradients whose kernels are not registered");
  m.def("lng_register", &lng_register);
  m.def("lng_register_backward", &lng_register_backward);
  m.def("lng_forward", &lng_forward);
  m.def("lng_plans", &lng_plans, "(forward, backward) registered shape classes (tests)");
}

}  // namespace pcops_host
