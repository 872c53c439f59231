// Native host path of pcops.nms_bev and pcops.batched_nms_bev: pcops/cuda/nms.py's nms_padded
// pipeline (csrc/nms.cu's nms_rank, nms_mask_b and nms_pass_b, NVRTC-compiled) for float32 boxes
// and scores within the rank sort's sizes (N <= 8,192 boxes per sample, B·N² <= 8·4096²),
// contiguous, group ids None or int64, backend "auto" or "cuda"; the checks and allocations in
// C++. The variable-length form keeps its one host sync (the kept count sizes the output).
// Anything else returns None and the Python path runs (and raises its errors).
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

// pcops/cuda/nms.py's constants
constexpr int64_t kTile = 64;        // boxes per mask word
constexpr int64_t kRankThreads = 256;
constexpr int64_t kRankBoxes = 32;   // boxes ranked per block
constexpr int64_t kMaskThreads = 64;
constexpr int64_t kSbox = 8;         // floats per prepared box
constexpr int64_t kRankMax = 8192;
constexpr int64_t kRankWork = int64_t{8} * 4096 * 4096;
constexpr int64_t kMaxGridY = 65535;

struct Kernels {
  Kernel rank, mask, pass;
};
std::unordered_map<int64_t, Kernels> kernels;  // per device index (written and read under the GIL)

// The NVRTC kernels of csrc/nms.cu loaded for `device` (their CUfunction handles).
void nms_register(int64_t device, int64_t rank_fn, int64_t mask_fn, int64_t pass_fn) {
  if (!have_driver()) return;
  kernels[device] = Kernels{nvrtc_kernel(rank_fn, kRankThreads), nvrtc_kernel(mask_fn, kMaskThreads),
                            nvrtc_kernel(pass_fn, 512)};
}

// None (-1) or a Python int >= 1.
bool optional_size(py::handle obj, int64_t* out) {
  if (obj.ptr() == Py_None) {
    *out = -1;
    return true;
  }
  return as_int(obj, out) && *out >= 1;
}

// A plain tensor `obj` on `device`, contiguous, of dtype `dtype` and the sizes of `like` up to `dims`.
const at::Tensor* operand(py::handle obj, const at::Device& device, at::ScalarType dtype, const at::Tensor& like,
                          int64_t dims) {
  if (!plain_tensor(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj.ptr());
  if (!direct_ok(t) || t.scalar_type() != dtype || t.device() != device || !t.is_contiguous()) return nullptr;
  if (t.dim() != dims) return nullptr;
  for (int64_t d = 0; d < dims; ++d) {
    if (t.size(d) != like.size(d)) return nullptr;
  }
  return &t;
}

// What pcops.nms_bev(boxes, scores, iou_threshold, pre_max_size, post_max_size, padded,
// backend=backend) (idxs None) or pcops.batched_nms_bev(boxes, scores, idxs, ...) returns: the kept
// indices (padded=False), or (indices, count); None where this path does not apply.
py::object nms_forward(py::handle boxes_obj, py::handle scores_obj, py::handle idxs_obj, py::handle thr_obj,
                       py::handle pre_obj, py::handle post_obj, py::handle padded_obj, py::handle backend_obj) {
  const py::object none = py::none();
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "cuda")) return none;
  if (!PyBool_Check(padded_obj.ptr())) return none;
  const bool padded = padded_obj.ptr() == Py_True;
  double thr;
  if (!as_double(thr_obj, &thr) || !(thr >= 0.0 && thr <= 1.0)) return none;  // (NaN fails too)
  int64_t pre, post;
  if (!optional_size(pre_obj, &pre) || !optional_size(post_obj, &post)) return none;
  if (padded && post < 0) return none;
  if (!plain_tensor(boxes_obj)) return none;
  const at::Tensor& boxes = THPVariable_Unpack(boxes_obj.ptr());
  if (!direct_ok(boxes) || intercepted()) return none;
  const bool batched = boxes.dim() == 3;
  if ((!batched && boxes.dim() != 2) || (batched && !padded)) return none;
  if (boxes.scalar_type() != at::kFloat || !boxes.is_contiguous()) return none;
  const at::Device device = boxes.device();
  if (!current_cuda(device)) return none;
  const int64_t dims = boxes.dim() - 1;  // the dims of scores and idxs
  const int64_t stride = boxes.size(dims);
  if (stride != 5 && stride < 7) return none;
  const at::Tensor* scores = operand(scores_obj, device, at::kFloat, boxes, dims);
  if (scores == nullptr) return none;
  const at::Tensor* groups = nullptr;
  if (idxs_obj.ptr() != Py_None) {
    groups = operand(idxs_obj, device, at::kLong, boxes, dims);
    if (groups == nullptr) return none;
  }
  const int64_t bsz = batched ? boxes.size(0) : 1, n = boxes.size(dims - 1);
  const int64_t m = pre < 0 ? n : std::min(n, pre);
  if (bsz < 1 || m < 1) return none;  // (the Python path's empty outputs)
  if (bsz > kMaxGridY || n > kRankMax || bsz * n * n > kRankWork) return none;  // torch.sort's sizes
  const auto found = kernels.find(device.index());
  if (found == kernels.end()) return none;
  const Kernels& k = found->second;
  const int64_t out_len = padded ? post : std::min(m, post < 0 ? m : post);
  const int64_t words = (m + kTile - 1) / kTile;
  const at::TensorOptions f32 = boxes.options(), i64 = boxes.options().dtype(at::kLong);
  // stage 1, nms_rank: the stable descending rank, the first m boxes as prepared records
  at::Tensor sbox = at::empty({bsz, m, kSbox}, f32);
  at::Tensor order = at::empty({bsz, m}, i64);
  at::Tensor sgroups = groups != nullptr ? at::empty({bsz, m}, i64) : order;
  void* pb = boxes.data_ptr();
  void* ps = scores->data_ptr();
  void* pg = groups != nullptr ? groups->data_ptr() : order.data_ptr();
  void* po = order.data_ptr();
  void* psb = sbox.data_ptr();
  void* psg = sgroups.data_ptr();
  int32_t has = groups != nullptr, n32 = static_cast<int32_t>(n), m32 = static_cast<int32_t>(m),
          stride32 = static_cast<int32_t>(stride), bev5 = stride == 5, words32 = static_cast<int32_t>(words),
          out32 = static_cast<int32_t>(out_len);
  {
    void* args[] = {&pb, &ps, &pg, &has, &n32, &m32, &stride32, &bev5, &po, &psb, &psg};
    launch(k.rank, static_cast<unsigned>((n + kRankBoxes - 1) / kRankBoxes), device, args, 11,
           static_cast<unsigned>(bsz));
  }
  // stage 2, nms_mask_b: the IoU > thr bitmask over the triangle's tiles
  at::Tensor mask = at::empty({bsz, m, words}, i64);
  at::Tensor invalid = at::empty({bsz, words}, i64);
  {
    void* pgm = groups != nullptr ? psg : psb;
    void* pm = mask.data_ptr();
    void* pi = invalid.data_ptr();
    float thr32 = static_cast<float>(thr);
    void* args[] = {&psb, &pgm, &has, &m32, &words32, &thr32, &pm, &pi};
    launch(k.mask, static_cast<unsigned>(words * (words + 1) / 2), device, args, 8, static_cast<unsigned>(bsz));
  }
  // stage 3, nms_pass_b: the greedy pass, one block per sample
  const bool single = !batched;
  at::Tensor out = single ? at::empty({out_len}, i64) : at::empty({bsz, out_len}, i64);
  at::Tensor count = single ? at::empty({}, i64) : at::empty({bsz}, i64);
  {
    Kernel pass = k.pass;
    pass.threads = words <= 128 ? 512 : 1024;  // pcops/cuda/nms.py's pass_threads
    pass.shared = static_cast<unsigned>(words * 8);
    void* pm = mask.data_ptr();
    void* pi = invalid.data_ptr();
    void* pout = out.data_ptr();
    void* pc = count.data_ptr();
    void* args[] = {&pm, &pi, &po, &m32, &words32, &out32, &pout, &pc};
    launch(pass, static_cast<unsigned>(bsz), device, args, 8);
  }
  if (padded) return py::make_tuple(out, count);
  int64_t kept;
  {
    py::gil_scoped_release nogil;  // the one host sync of the variable-length form: the kept count
    kept = count.item<int64_t>();
  }
  return py::cast(kept == out_len ? out : out.narrow(0, 0, kept).clone());
}

py::int_ nms_plans() { return py::int_(kernels.size()); }

}  // namespace

void register_nms(py::module_& m) {
  m.def("nms_register", &nms_register);
  m.def("nms_forward", &nms_forward);
  m.def("nms_plans", &nms_plans, "devices with registered kernels (tests)");
}

}  // namespace pcops_host
