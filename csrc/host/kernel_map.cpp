// Native host path of pcops.sparse_conv_kernel_map for submanifold maps (backend "auto" / "triton",
// CUDA int32 coords): the workspace fill and the insert, lookup and compaction launches of the
// Triton kernels pcops compiled for this configuration, in C++, with the same arguments as
// pcops/triton/kernel_map.py (the sizes derived from N below mirror its _capacity / _groups / the
// workspace layout, and registration checks them against the Python path's). Anything else returns
// None and the Python path runs (and raises its errors).
#include <torch/csrc/autograd/python_variable.h>

#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

// What pcops/triton/kernel_map.py's _plan gives a submanifold configuration (constant per key).
struct SubmPlan {
  int64_t num_k, block, kpad, block_half, kpad_half, block_n, sink;
  bool mirror;  // an odd kernel: a table-only map probes half the offsets
};

// The sizes a call of N voxels derives (pcops/triton/kernel_map.py: _capacity(N, 4), _groups, the
// workspace offsets).
struct Sizes {
  int64_t cap_in, log_in, sub, groups, counts_off, counters_off, sink_off, ws_len, rows_mult;
};

constexpr int64_t kMinCapacity = 16, kMaxGroups = 256, kCounters = 4 * 16, kCompactLanes = 2048;

int64_t pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

Sizes sizes_of(const SubmPlan& p, int64_t n) {
  Sizes s;
  s.cap_in = std::max(kMinCapacity, pow2(4 * std::max<int64_t>(1, n)));
  s.log_in = 0;
  while ((int64_t{1} << (s.log_in + 1)) <= s.cap_in) ++s.log_in;
  const int64_t blocks = (n + p.block - 1) / p.block;
  s.sub = (blocks + kMaxGroups - 1) / kMaxGroups;
  s.groups = (blocks + s.sub - 1) / s.sub;
  s.counts_off = 2 * s.cap_in;
  s.counters_off = s.counts_off + s.groups * p.kpad;
  s.sink_off = s.counters_off + kCounters;
  s.ws_len = s.sink_off + p.sink;
  // the compaction's ROWS: BLOCK_M times a power of two dividing `sub`
  s.rows_mult = std::min(s.sub & -s.sub, std::max<int64_t>(1, kCompactLanes / (p.block * p.kpad)));
  return s;
}

// (device, D, H, W, Kz, Ky, Kx, dz, dy, dx, pairs, pad_pairs, ROWS multiple, the specialisation
// classes of the N-dependent int arguments)
using Key = std::array<int64_t, 14>;
struct Entry {
  SubmPlan plan;
  Kernel insert, lookup, compact;  // compact: unused without pairs
};
std::unordered_map<Key, Entry, ArrayHash> entries;  // read and written under the GIL
// the plan of a configuration (device, D, H, W, Kz, Ky, Kx, dz, dy, dx): the same for every N
std::unordered_map<std::array<int64_t, 10>, SubmPlan, ArrayHash> plans;

std::array<int64_t, 10> plan_key(int64_t device, const std::array<int64_t, 9>& geo) {
  std::array<int64_t, 10> k;
  k[0] = device;
  std::copy(geo.begin(), geo.end(), k.begin() + 1);
  return k;
}

int64_t spec_signature(const Sizes& s, int64_t n, int64_t num_k, bool pairs) {
  const int64_t vals[] = {n, s.cap_in, s.log_in, s.counters_off, s.sink_off, s.counts_off,
                          s.sub, s.groups, pairs ? n * num_k : 0};
  int64_t sig = 0;
  for (const int64_t v : vals) sig = sig * 3 + spec(v);
  return sig;
}

Key key_of(int64_t device, const std::array<int64_t, 9>& geo, bool pairs, bool pad_pairs, const Sizes& s,
           int64_t sig) {
  // (the compaction's ROWS matters only with pairs)
  return Key{device, geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8],
             pairs,  pad_pairs, pairs ? s.rows_mult : 0, sig};
}

// An int (not bool) or a list / tuple of 3 of them, each >= min_value: (z, y, x); false otherwise.
bool triple(py::handle obj, int64_t min_value, int64_t* out) {
  int64_t v;
  if (as_int(obj, &v)) {
    if (v < min_value) return false;
    out[0] = out[1] = out[2] = v;
    return true;
  }
  if (!PyList_CheckExact(obj.ptr()) && !PyTuple_CheckExact(obj.ptr())) return false;
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  if (seq.size() != 3) return false;
  for (int i = 0; i < 3; ++i) {
    if (!as_int(seq[i], &v) || v < min_value) return false;
    out[i] = v;
  }
  return true;
}

SubmPlan plan_of(py::tuple plan_values) {
  TORCH_CHECK(plan_values.size() == 8, "pcops native host: a submanifold plan has 8 values");
  const auto pv = [&](int i) { return plan_values[i].cast<int64_t>(); };
  return SubmPlan{pv(0), pv(1), pv(2), pv(3), pv(4), pv(5), pv(6), pv(7) != 0};
}

// (cap_in, log_in, sub, groups, counts_off, counters_off, sink_off, ws_len) for N voxels (tests)
py::tuple km_sizes(py::tuple plan_values, int64_t n) {
  const Sizes s = sizes_of(plan_of(plan_values), n);
  return py::make_tuple(s.cap_in, s.log_in, s.sub, s.groups, s.counts_off, s.counters_off, s.sink_off, s.ws_len);
}

// Remember the launches of a submanifold map of `coords`; false (nothing registered) where the
// sizes the Python path used differ from those derived here.
bool km_register(const at::Tensor& coords, py::tuple geometry, bool pairs, bool pad_pairs, py::tuple plan_values,
                 py::tuple sizes, py::tuple insert, py::tuple lookup, py::object compact) {
  TORCH_CHECK(coords.is_cuda() && coords.dim() == 2 && geometry.size() == 9 && sizes.size() == 8,
              "km_register: bad arguments");
  if (!have_driver()) return false;
  std::array<int64_t, 9> geo;
  for (int i = 0; i < 9; ++i) geo[i] = geometry[i].cast<int64_t>();
  const SubmPlan plan = plan_of(plan_values);
  const int64_t n = coords.size(0);
  const Sizes s = sizes_of(plan, n);
  const int64_t want[] = {s.cap_in, s.log_in, s.sub, s.groups, s.counts_off, s.counters_off, s.sink_off, s.ws_len};
  for (int i = 0; i < 8; ++i) {
    if (sizes[i].cast<int64_t>() != want[i]) return false;
  }
  const auto kernel = [](py::tuple t) {
    return make_kernel(t[0].cast<int64_t>(), t[1].cast<int64_t>(), t[2].cast<int64_t>(), t[3].cast<int64_t>());
  };
  Entry e{plan, kernel(insert), kernel(lookup), Kernel{}};
  if (pairs) e.compact = kernel(compact.cast<py::tuple>());
  plans[plan_key(coords.device().index(), geo)] = plan;
  entries[key_of(coords.device().index(), geo, pairs, pad_pairs, s, spec_signature(s, n, plan.num_k, pairs))] = e;
  return true;
}

// The map's tensors: (out_coords, pair_in, pair_out, offsets, out_in), or (out_coords, out_in)
// without pairs; None where this path does not apply.
py::object km_forward(py::handle coords_obj, py::handle shape_obj, py::handle kernel_obj, py::handle stride_obj,
                      py::handle padding_obj, py::handle dilation_obj, py::handle subm_obj, py::handle transposed_obj,
                      py::handle pad_pairs_obj, py::handle static_obj, py::handle pairs_obj, py::handle backend_obj) {
  const py::object none = py::none();
  if (subm_obj.ptr() != Py_True || transposed_obj.ptr() != Py_False) return none;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "triton")) return none;
  if (!PyBool_Check(pad_pairs_obj.ptr()) || !PyBool_Check(static_obj.ptr()) || !PyBool_Check(pairs_obj.ptr()))
    return none;
  const bool pad_pairs = pad_pairs_obj.ptr() == Py_True || static_obj.ptr() == Py_True;
  const bool pairs = pairs_obj.ptr() == Py_True;
  if (!plain_tensor(coords_obj)) return none;
  if (!PyList_CheckExact(shape_obj.ptr()) && !PyTuple_CheckExact(shape_obj.ptr())) return none;
  std::array<int64_t, 9> geo;
  int64_t stride[3], padding[3];
  if (!triple(shape_obj, 1, &geo[0]) || !triple(kernel_obj, 1, &geo[3]) || !triple(dilation_obj, 1, &geo[6]) ||
      !triple(stride_obj, 1, stride) || !triple(padding_obj, 0, padding))
    return none;
  if (stride[0] != 1 || stride[1] != 1 || stride[2] != 1) return none;
  const at::Tensor& coords = THPVariable_Unpack(coords_obj.ptr());
  if (!direct_ok(coords) || intercepted()) return none;
  if (coords.dim() != 2 || coords.size(1) != 4 || coords.scalar_type() != at::kInt) return none;
  if (!current_cuda(coords.device()) || !coords.is_contiguous() || !aligned(coords)) return none;
  const int64_t n = coords.size(0);
  if (n < 1 || n >= (int64_t{1} << 28)) return none;
  const auto found = plans.find(plan_key(coords.device().index(), geo));
  if (found == plans.end()) return none;
  const SubmPlan& plan = found->second;
  const Sizes s = sizes_of(plan, n);
  const int64_t num_k = plan.num_k;
  if (n * num_k >= (int64_t{1} << 31) || s.ws_len >= (int64_t{1} << 31)) return none;
  const auto it = entries.find(
      key_of(coords.device().index(), geo, pairs, pad_pairs, s, spec_signature(s, n, num_k, pairs)));
  if (it == entries.end()) return none;
  const Entry& e = it->second;
  const at::Device device = coords.device();
  const auto i32 = coords.options();
  at::Tensor ws = at::full({s.ws_len}, -1, i32.dtype(at::kLong));  // launch 1
  at::Tensor out_coords = at::empty({n, 4}, i32);
  at::Tensor out_in = at::empty({n, num_k}, i32);
  const bool mirror = plan.mirror && !pairs;
  void* pc = coords.data_ptr();
  void* pws = ws.data_ptr();
  void* poc = out_coords.data_ptr();
  void* poi = out_in.data_ptr();
  void* pmirror = mirror ? poi : pc;
  int32_t n32 = static_cast<int32_t>(n), zero = 0, one = 1;
  int32_t d = static_cast<int32_t>(geo[0]), h = static_cast<int32_t>(geo[1]), w = static_cast<int32_t>(geo[2]);
  int32_t cap_in = static_cast<int32_t>(s.cap_in), log_in = static_cast<int32_t>(s.log_in);
  int32_t counts_off = static_cast<int32_t>(s.counts_off), counters_off = static_cast<int32_t>(s.counters_off);
  int32_t sink_off = static_cast<int32_t>(s.sink_off), sub = static_cast<int32_t>(s.sub);
  int32_t groups = static_cast<int32_t>(s.groups), k32 = static_cast<int32_t>(num_k);
  // insert: (coords, ws, out_keys, out_keys32, out_coords, bits, out_in, n, fill_len, nbatch, D, H, W,
  // cap_in, log_in, cap_out, log_out, counters_off, sink_off, Do, Ho, Wo)
  void* iargs[] = {&pc,    &pws,  &pws,  &pc,          &poc,      &pws, &pmirror, &n32, &zero, &zero, &d,
                   &h,     &w,    &cap_in, &log_in,     &one,      &zero, &counters_off, &sink_off, &d, &h, &w};
  launch(e.insert, static_cast<unsigned>((n + plan.block_n - 1) / plan.block_n), device, iargs, 22);  // launch 2
  // lookup: (coords, ws, keys, out_coords, out_in, ibits, ipre, in_rows, in_cells, m_total, counts_off,
  // m_off, sub, D, H, W, cap_in, log_in, Do, Ho, Wo)
  void* largs[] = {&pc,  &pws, &pws, &poc, &poi, &pc, &pc, &zero, &zero, &n32, &counts_off,
                   &counters_off, &sub, &d, &h, &w, &cap_in, &log_in, &d, &h, &w};
  const int64_t block = mirror ? plan.block_half : plan.block;
  launch(e.lookup, static_cast<unsigned>((n + block - 1) / block), device, largs, 21);  // launch 3
  py::tuple result;
  if (!pairs) {
    result = py::make_tuple(out_coords, out_in);
  } else {
    const int64_t cap_pairs = n * num_k;
    at::Tensor pair_in = at::empty({cap_pairs}, i32);
    at::Tensor pair_out = at::empty({cap_pairs}, i32);
    at::Tensor offsets = at::empty({num_k + 1}, i32);
    void* ppi = pair_in.data_ptr();
    void* ppo = pair_out.data_ptr();
    void* pof = offsets.data_ptr();
    int32_t cap32 = static_cast<int32_t>(cap_pairs);
    // compaction: (out_in, counts, pair_in, pair_out, offsets, counts_off, m_total, K, sub, num_groups,
    // cap_pairs, m_off)
    void* cargs[] = {&poi, &pws, &ppi, &ppo, &pof, &counts_off, &n32, &k32, &sub, &groups, &cap32, &zero};
    launch(e.compact, static_cast<unsigned>(s.groups), device, cargs, 12);  // launch 4
    if (!pad_pairs) {
      // host sync: the pair count is an output size (every launch is queued)
      int64_t p;
      {
        py::gil_scoped_release nogil;  // (as torch's .cpu() does while it waits)
        p = offsets[num_k].item<int32_t>();
      }
      pair_in = pair_in.narrow(0, 0, p);
      pair_out = pair_out.narrow(0, 0, p);
    }
    result = py::make_tuple(out_coords, pair_in, pair_out, offsets, out_in);
  }
  return std::move(result);
}

py::int_ km_plans() { return py::int_(entries.size()); }

}  // namespace

void register_kernel_map(py::module_& m) {
  m.def("km_register", &km_register);
  m.def("km_sizes", &km_sizes, "the sizes derived from N (tests)");
  m.def("km_forward", &km_forward);
  m.def("km_plans", &km_plans, "registered submanifold configurations (tests)");
}

}  // namespace pcops_host
