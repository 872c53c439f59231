// Native host path of pcops.pillar_scatter for the PointPillars case (float32 features, C and H·W
// multiples of 4, 16-byte aligned): the winner-map fill, csrc/pillar_scatter.cu's pillar_winner and
// pillar_canvas_b4x4, and the gradient as a C++ autograd node launching pillar_gather_b4x4, with
// the checks and allocations in C++. Anything else returns None and the Python path runs.
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

constexpr int kThreads = 256;  // pcops/cuda/pillar_scatter.py's _THREADS

struct Kernels {
  Kernel winner, canvas, gather;
  int64_t vecs_per_slice;
};
std::unordered_map<int64_t, Kernels> kernels;  // per device index (written under the GIL, read by autograd threads)
std::mutex mutex;
py::object* py_gather = nullptr;  // the Python gather op's call (set by ps_init), kept for the process

bool find(int64_t device, Kernels* out) {
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = kernels.find(device);
  if (it == kernels.end()) return false;
  *out = it->second;
  return true;
}

// the quad kernels' grid: (quads of cells / threads, batch, channel slices)
void quad_grid(int64_t hw, int64_t batch, int64_t channels, int64_t vecs_per_slice, unsigned* g) {
  g[0] = static_cast<unsigned>((hw / 4 + kThreads - 1) / kThreads);
  g[1] = static_cast<unsigned>(batch);
  g[2] = static_cast<unsigned>((channels / 4 + vecs_per_slice - 1) / vecs_per_slice);
}

// (canvas, winner) as pcops/cuda/pillar_scatter.py's pillar_scatter computes them.
std::pair<at::Tensor, at::Tensor> scatter(const Kernels& k, const at::Tensor& f, const at::Tensor& coords, int64_t batch,
                                          int64_t h, int64_t w) {
  const int64_t p = f.size(0), c = f.size(1), hw = h * w;
  at::Tensor winner = at::full({batch * hw}, -1, coords.options());
  at::Tensor canvas = at::empty({batch, c, h, w}, f.options());
  void* pc = coords.data_ptr();
  void* pw = winner.data_ptr();
  void* pf = f.data_ptr();
  void* po = canvas.data_ptr();
  int32_t p32 = static_cast<int32_t>(p), b32 = static_cast<int32_t>(batch), h32 = static_cast<int32_t>(h),
          w32 = static_cast<int32_t>(w), c32 = static_cast<int32_t>(c), hw32 = static_cast<int32_t>(hw),
          v32 = static_cast<int32_t>(k.vecs_per_slice);
  if (p) {
    void* args[] = {&pc, &pw, &p32, &b32, &h32, &w32};
    launch(k.winner, static_cast<unsigned>((p + kThreads - 1) / kThreads), f.device(), args, 6);
  }
  if (canvas.numel()) {
    unsigned g[3];
    quad_grid(hw, batch, c, k.vecs_per_slice, g);
    void* args[] = {&pf, &pw, &po, &c32, &hw32, &v32};
    launch(k.canvas, g[0], f.device(), args, 6, g[1], g[2]);
  }
  return {canvas, winner};
}

struct PillarScatter : public torch::autograd::Function<PillarScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& f, const at::Tensor& coords, const Kernels& k,
                            int64_t batch, int64_t h, int64_t w) {
    auto [canvas, winner] = scatter(k, f, coords, batch, h, w);
    ctx->save_for_backward({coords, winner});
    ctx->saved_data["channels"] = f.size(1);
    return canvas;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list none = {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor& grad = grads[0];
    if (!grad.defined() || !ctx->needs_input_grad(0)) return none;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &coords = saved[0], &winner = saved[1];
    at::Tensor g = grad.contiguous();
    const int64_t p = coords.size(0), c = ctx->saved_data["channels"].toInt();
    const int64_t batch = g.size(0), hw = g.size(2) * g.size(3);
    Kernels k;
    at::Tensor out;
    const bool usable = g.scalar_type() == at::kFloat && aligned(g) && winner.is_contiguous() && aligned(winner);
    if (!c10::GradMode::is_enabled() && usable && find(g.device().index(), &k)) {
      out = at::zeros({p, c}, g.options());
      if (p && g.numel()) {
        unsigned grid[3];
        quad_grid(hw, batch, c, k.vecs_per_slice, grid);
        void* pg = g.data_ptr();
        void* pw = winner.data_ptr();
        void* po = out.data_ptr();
        int32_t c32 = static_cast<int32_t>(c), hw32 = static_cast<int32_t>(hw),
                v32 = static_cast<int32_t>(k.vecs_per_slice);
        void* args[] = {&pg, &pw, &po, &c32, &hw32, &v32};
        launch(k.gather, grid[0], g.device(), args, 6, grid[1], grid[2]);
      }
    } else {  // create_graph (the gather's own gradient) or an unusual gradient: the Python gather op
      py::gil_scoped_acquire gil;
      out = (*py_gather)(g, coords, winner).cast<at::Tensor>();
    }
    variable_list r = none;
    r[0] = out;
    return r;
  }
};

// The NVRTC kernels of csrc/pillar_scatter.cu loaded for `device` (their CUfunction handles).
void ps_register(int64_t device, int64_t winner_fn, int64_t canvas_fn, int64_t gather_fn, int64_t vecs_per_slice) {
  TORCH_CHECK(vecs_per_slice > 0, "ps_register: bad vecs_per_slice");
  if (!have_driver()) return;
  std::lock_guard<std::mutex> lock(mutex);
  kernels[device] = Kernels{nvrtc_kernel(winner_fn, kThreads), nvrtc_kernel(canvas_fn, kThreads),
                            nvrtc_kernel(gather_fn, kThreads), vecs_per_slice};
}

void ps_init(py::function gather) {
  if (py_gather == nullptr) py_gather = new py::object(gather);  // (never freed: used until exit)
}

// canvas = pillar_scatter(features, coords, batch_size, grid_hw, backend=backend), or None where this
// path does not apply.
py::object ps_forward(py::handle f_obj, py::handle c_obj, py::handle batch_obj, py::handle hw_obj,
                      py::handle backend_obj) {
  const py::object none = py::none();
  if (!plain_tensor(f_obj) || !plain_tensor(c_obj)) return none;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "cuda")) return none;
  int64_t batch, h, w;
  if (!as_int(batch_obj, &batch) || batch < 1) return none;
  PyObject* hw = hw_obj.ptr();
  if (!(PyTuple_CheckExact(hw) || PyList_CheckExact(hw)) || PySequence_Fast_GET_SIZE(hw) != 2) return none;
  if (!as_int(PySequence_Fast_GET_ITEM(hw, 0), &h) || !as_int(PySequence_Fast_GET_ITEM(hw, 1), &w)) return none;
  if (h < 1 || w < 1 || h >= (int64_t{1} << 31) || w >= (int64_t{1} << 31) || batch >= (int64_t{1} << 31)) return none;
  const at::Tensor& f = THPVariable_Unpack(f_obj.ptr());
  const at::Tensor& coords = THPVariable_Unpack(c_obj.ptr());
  if (!direct_ok(f) || !direct_ok(coords) || intercepted()) return none;
  if (f.dim() != 2 || f.scalar_type() != at::kFloat || coords.dim() != 2 || coords.size(1) != 4) return none;
  if (coords.scalar_type() != at::kInt || coords.size(0) != f.size(0)) return none;
  const int64_t c = f.size(1);
  if (c % 4 != 0 || (h * w) % 4 != 0 || batch * h * w >= (int64_t{1} << 31) || f.size(0) >= (int64_t{1} << 31))
    return none;
  const at::Device device = f.device();
  if (!current_cuda(device) || coords.device() != device) return none;
  if (!f.is_contiguous() || !coords.is_contiguous() || !aligned(f) || !aligned(coords)) return none;
  Kernels k;
  if (!find(device.index(), &k)) return none;
  at::Tensor canvas;
  if (c10::GradMode::is_enabled() && f.requires_grad()) {
    if (py_gather == nullptr || saved_tensor_hooks()) return none;
    canvas = PillarScatter::apply(f, coords, k, batch, h, w);
  } else {
    canvas = scatter(k, f, coords, batch, h, w).first;
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(canvas)));
}

}  // namespace

void register_pillar_scatter(py::module_& m) {
  m.def("ps_init", &ps_init, "the Python gather, for gradients the native kernels do not take");
  m.def("ps_register", &ps_register);
  m.def("ps_forward", &ps_forward);
}

}  // namespace pcops_host
