// Native host path of pcops.sparse_softmax (backend "auto" / "triton", CUDA, float32/16-bit values):
// the checks, the allocation and the launch of the Triton kernel pcops autotuned and compiled for
// this shape class, in C++, with the gradient as a C++ autograd node. Anything else returns None
// and the Python path runs (and raises its errors); a backward whose kernel is not registered yet,
// or a create_graph backward, calls the Python backward op.
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// (backward, device, values dtype, crow dtype, SUB, VPT, AVG_LEN, 3 spec(rows) + spec(nnz)): what
// selects the compiled kernel (pointers are 16-byte aligned, as in the registered specialisation)
using Key = std::array<int64_t, 8>;
struct Plan {
  Kernel kernel;
  int64_t block_r;  // rows per program
};

// Read and written under `mutex` (the backward runs on autograd's threads).
std::unordered_map<Key, Plan, ArrayHash> plans;
std::mutex mutex;
py::object* py_backward = nullptr;  // the Python backward op (set by ss_init), kept for the process
std::atomic<int64_t> native_backwards{0};  // backwards the C++ node launched itself (tests)

// (SUB, VPT) for the mean row length, as pcops/triton/sparse_softmax.py's _group_shape: the
// smallest group capacity >= 1.9 * mean
std::pair<int64_t, int64_t> group_shape(int64_t rows, int64_t nnz) {
  static const int64_t shapes[4][2] = {{4, 8}, {8, 8}, {16, 8}, {32, 4}};
  const double longest = 1.9 * static_cast<double>(nnz) / static_cast<double>(std::max<int64_t>(rows, 1));
  for (const auto& s : shapes) {
    if (static_cast<double>(s[0] * s[1]) >= longest) return {s[0], s[1]};
  }
  return {32, 4};
}

// AVG_LEN, the autotune key: nnz // rows rounded up to a power of two
int64_t avg_len(int64_t rows, int64_t nnz) {
  return next_pow2(std::max<int64_t>(1, nnz / std::max<int64_t>(rows, 1)));
}

Key key_of(bool backward, const at::Tensor& v, const at::Tensor& crow, int64_t sub, int64_t vpt, int64_t rows,
           int64_t nnz) {
  return Key{backward,  v.device().index(), static_cast<int64_t>(v.scalar_type()), static_cast<int64_t>(crow.scalar_type()),
             sub,       vpt,                avg_len(rows, nnz),                  3 * spec(rows) + spec(nnz)};
}

// The registered plan for (v, crow), or false.
bool find_plan(bool backward, const at::Tensor& v, const at::Tensor& crow, Plan* out) {
  const int64_t rows = crow.numel() - 1, nnz = v.numel();
  const auto [sub, vpt] = group_shape(rows, nnz);
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = plans.find(key_of(backward, v, crow, sub, vpt, rows, nnz));
  if (it == plans.end()) return false;
  *out = it->second;
  return true;
}

// One launch of a registered kernel over the rows of crow: (tensors..., rows, nnz, AVG_LEN).
void run(const Plan& plan, std::initializer_list<const at::Tensor*> tensors, const at::Tensor& crow, int64_t nnz) {
  const int64_t rows = crow.numel() - 1;
  void* ptrs[4];
  void* args[7];
  int n = 0;
  for (const at::Tensor* t : tensors) {
    ptrs[n] = t->data_ptr();
    args[n] = &ptrs[n];
    ++n;
  }
  int32_t r32 = static_cast<int32_t>(rows), n32 = static_cast<int32_t>(nnz),
          a32 = static_cast<int32_t>(avg_len(rows, nnz));
  args[n++] = &r32;
  args[n++] = &n32;
  args[n++] = &a32;
  launch(plan.kernel, static_cast<unsigned>((rows + plan.block_r - 1) / plan.block_r), crow.device(), args, n);
}

// forward: (values, crow, out, rows, nnz, AVG_LEN); pcops/triton/sparse_softmax.py
at::Tensor run_forward(const Plan& plan, const at::Tensor& v, const at::Tensor& crow) {
  at::Tensor out = at::empty_like(v);
  run(plan, {&v, &crow, &out}, crow, v.numel());
  return out;
}

struct SparseSoftmax : public torch::autograd::Function<SparseSoftmax> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& v, const at::Tensor& crow, const Plan* plan,
                            bool triton) {
    at::Tensor out = run_forward(*plan, v, crow);
    ctx->save_for_backward({out, crow});
    ctx->saved_data["triton"] = triton;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad = grads[0];
    const variable_list none = {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    if (!grad.defined() || !ctx->needs_input_grad(0)) return none;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &y = saved[0], &crow = saved[1];
    at::Tensor g = grad.contiguous();
    Plan plan;
    at::Tensor dx;
    // (dy, y, dx, crow, rows, nnz, AVG_LEN); the Python backward where no kernel is registered,
    // for create_graph (grad mode on) and for a gradient of another dtype or a misaligned one
    if (!c10::GradMode::is_enabled() && g.scalar_type() == y.scalar_type() && direct_ok(g) && aligned(g) &&
        !intercepted() && find_plan(true, y, crow, &plan)) {
      dx = at::empty_like(y);
      run(plan, {&g, &y, &dx, &crow}, crow, y.numel());
      native_backwards.fetch_add(1, std::memory_order_relaxed);
    } else {
      py::gil_scoped_acquire gil;
      const char* backend = ctx->saved_data["triton"].toBool() ? "triton" : "auto";
      dx = (*py_backward)(g, y, crow, backend).cast<at::Tensor>();
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Remember the kernel the Python path launched for (v (nnz,), crow (rows + 1,)): the forward
// (v: values) or the backward (v: the forward's output) with SUB x VPT groups, BLOCK_R rows per program.
void ss_register(const at::Tensor& v, const at::Tensor& crow, bool backward, int64_t sub, int64_t vpt,
                 int64_t function, int64_t warps, int64_t shared, int64_t present, int64_t block_r) {
  TORCH_CHECK(v.dim() == 1 && crow.dim() == 1 && v.is_cuda() && block_r > 0, "ss_register: bad arguments");
  if (!have_driver()) return;
  const int64_t rows = crow.numel() - 1, nnz = v.numel();
  const auto shape = group_shape(rows, nnz);
  if (shape.first != sub || shape.second != vpt) return;  // a fixed config, not the default path's
  std::lock_guard<std::mutex> lock(mutex);
  plans[key_of(backward, v, crow, sub, vpt, rows, nnz)] = Plan{make_kernel(function, warps, shared, present), block_r};
}

void ss_init(py::function backward) {
  if (py_backward == nullptr) py_backward = new py::object(backward);  // (never freed: used until exit)
}

bool value_type(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16;
}

// y = sparse_softmax(values, crow_indices, backend=backend, validate=validate), or None where this
// path does not apply (the caller then takes the Python path).
py::object ss_forward(py::handle v_obj, py::handle crow_obj, py::handle backend_obj, py::handle validate_obj) {
  const py::object none = py::none();
  if (!plain_tensor(v_obj) || !plain_tensor(crow_obj)) return none;
  bool triton;
  if (str_is(backend_obj, "triton")) {
    triton = true;
  } else if (str_is(backend_obj, "auto")) {
    triton = false;
  } else {
    return none;
  }
  if (!validate_obj.is_none() && validate_obj.ptr() != Py_False) return none;  // validation: the Python path
  const at::Tensor& v = THPVariable_Unpack(v_obj.ptr());
  const at::Tensor& crow = THPVariable_Unpack(crow_obj.ptr());
  if (!direct_ok(v) || !direct_ok(crow) || intercepted()) return none;
  if (v.dim() != 1 || crow.dim() != 1 || !value_type(v)) return none;
  if (crow.scalar_type() != at::kInt && crow.scalar_type() != at::kLong) return none;
  const at::Device device = v.device();
  if (!current_cuda(device) || crow.device() != device) return none;
  if (!v.is_contiguous() || !crow.is_contiguous() || !aligned(v) || !aligned(crow)) return none;
  const int64_t rows = crow.numel() - 1, nnz = v.numel();
  if (rows < 1 || nnz < 1 || rows >= (int64_t{1} << 31) || nnz >= (int64_t{1} << 31)) return none;
  Plan plan;
  if (!find_plan(false, v, crow, &plan)) return none;
  at::Tensor y;
  if (c10::GradMode::is_enabled() && v.requires_grad()) {
    if (py_backward == nullptr || saved_tensor_hooks()) return none;
    y = SparseSoftmax::apply(v, crow, &plan, triton);
  } else {
    y = run_forward(plan, v, crow);
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
}

py::tuple ss_plans() {
  std::lock_guard<std::mutex> lock(mutex);
  return py::make_tuple(plans.size(), native_backwards.load());
}

}  // namespace

void register_sparse_softmax(py::module_& m) {
  m.def("ss_init", &ss_init, "the Python backward op, for gradients whose kernel is not registered");
  m.def("ss_register", &ss_register);
  m.def("ss_forward", &ss_forward);
  m.def("ss_plans", &ss_plans, "(registered shape classes, forward and backward; native backward launches) (tests)");
}

}  // namespace pcops_host
