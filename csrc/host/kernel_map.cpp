// Native host path of pcops.sparse_conv_kernel_map (backend "auto" / "triton", CUDA int32 coords):
// submanifold maps, and regular / transposed maps of the default form (not static_shapes), with
// pairs (the table-only form: the Python path). The
// workspace fill and the insert, (sort,) lookup and compaction launches of the Triton kernels pcops
// compiled for this configuration, in C++, with the same arguments as pcops/triton/kernel_map.py
// (the sizes derived from N, and for a regular map from M and P after its sync, mirror its
// _capacity / _groups / the workspace layout; registration checks them against the Python path's).
// Anything else returns None and the Python path runs (and raises its errors). A regular map whose
// lookup and compaction are not registered for the classes of the M its sync read returns None
// after that sync: the Python path then builds the whole map again (and registers them).
#include <torch/csrc/autograd/python_variable.h>

#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

constexpr int kGeo = 16;  // D, H, W, Kz, Ky, Kx, sz, sy, sx, pz, py, px, dz, dy, dx, transposed | 2 subm
using Geo = std::array<int64_t, kGeo>;

// What pcops/triton/kernel_map.py's _plan gives a configuration (constant per key).
struct Plan {
  int64_t num_k, block, kpad, block_half, kpad_half, block_n, sink;
  bool mirror;  // an odd submanifold kernel: a table-only map probes half the offsets
  int64_t per_input;  // J: outputs one input reaches (0: submanifold)
  int64_t out_shape[3];
};

// The sizes a call of N voxels derives (pcops/triton/kernel_map.py: _capacity(N, 4), _groups, the
// workspace offsets). Submanifold: count groups from N; regular: 256 groups reserved, the output
// table for the N·J candidates.
struct Sizes {
  int64_t cap_in, log_in, cap_out, log_out, sub, groups, counts_off, counters_off, sink_off, ws_len, rows_mult;
};

constexpr int64_t kMinCapacity = 16, kMaxGroups = 256, kCounterStride = 16, kCounters = 4 * kCounterStride,
                  kCompactLanes = 2048;

std::pair<int64_t, int64_t> capacity(int64_t count, int64_t slack) {
  const int64_t cap = std::max(kMinCapacity, next_pow2(slack * std::max<int64_t>(1, count)));
  int64_t log = 0;
  while ((int64_t{1} << (log + 1)) <= cap) ++log;
  return {cap, log};
}

std::pair<int64_t, int64_t> groups_of(int64_t rows, int64_t block) {
  const int64_t blocks = (rows + block - 1) / block;
  const int64_t sub = (blocks + kMaxGroups - 1) / kMaxGroups;
  return {sub, (blocks + sub - 1) / sub};
}

// the compaction's ROWS: BLOCK_M times a power of two dividing `sub`
int64_t rows_mult(const Plan& p, int64_t sub) {
  return std::min(sub & -sub, std::max<int64_t>(1, kCompactLanes / (p.block * p.kpad)));
}

Sizes sizes_of(const Plan& p, int64_t n) {
  Sizes s;
  std::tie(s.cap_in, s.log_in) = capacity(n, 4);
  const int64_t bound = n * p.per_input;
  if (p.per_input == 0) {
    s.cap_out = s.log_out = 0;
    std::tie(s.sub, s.groups) = groups_of(n, p.block);
  } else {
    std::tie(s.cap_out, s.log_out) = capacity(bound + 1, 1);
    s.sub = 1;
    s.groups = kMaxGroups;  // (the group count is known after the sync; the most are reserved)
  }
  s.counts_off = 2 * s.cap_in + s.cap_out;
  s.counters_off = s.counts_off + s.groups * p.kpad;
  s.sink_off = s.counters_off + kCounters;
  s.ws_len = s.sink_off + p.sink + bound;  // (regular: the N·J key slots of the static form, unused)
  s.rows_mult = rows_mult(p, s.sub);
  return s;
}

int64_t signature(std::initializer_list<int64_t> vals) {
  int64_t sig = 0;
  for (const int64_t v : vals) sig = sig * 3 + spec(v);
  return sig;
}

// (device, geometry, kind-specific words): submanifold (pairs, pad_pairs, ROWS multiple with pairs,
// the N-dependent int arguments' classes); regular insert (the N-dependent classes); regular finish
// (the insert's words, then pairs, pad_pairs, int32 keys, ROWS multiple with pairs, the M-dependent
// classes)
using Key = std::array<int64_t, 1 + kGeo + 7>;

Key key_of(int64_t device, const Geo& geo, std::initializer_list<int64_t> words) {
  Key k{};
  k[0] = device;
  std::copy(geo.begin(), geo.end(), k.begin() + 1);
  int i = 1 + kGeo;
  for (const int64_t w : words) k[i++] = w;
  return k;
}

int64_t insert_signature(const Sizes& s, int64_t n) {
  return signature({n, s.cap_in, s.log_in, s.cap_out, s.log_out, s.counters_off, s.sink_off, s.counts_off});
}

struct Subm {
  Kernel insert, lookup, compact;  // compact: unused without pairs
};
struct Finish {
  Kernel lookup, compact;
};
// all read and written under the GIL
std::unordered_map<std::array<int64_t, 1 + kGeo>, Plan, ArrayHash> plans;
std::unordered_map<Key, Subm, ArrayHash> subm_entries;
std::unordered_map<Key, Kernel, ArrayHash> inserts;
std::unordered_map<Key, Finish, ArrayHash> finishes;

std::array<int64_t, 1 + kGeo> plan_key(int64_t device, const Geo& geo) {
  std::array<int64_t, 1 + kGeo> k;
  k[0] = device;
  std::copy(geo.begin(), geo.end(), k.begin() + 1);
  return k;
}

Key subm_key(int64_t device, const Geo& geo, const Plan& p, const Sizes& s, int64_t n, bool pairs, bool pad_pairs) {
  return key_of(device, geo,
                {pairs, pad_pairs, pairs ? s.rows_mult : 0,
                 signature({n, s.cap_in, s.log_in, s.counters_off, s.sink_off, s.counts_off, s.sub, s.groups,
                            pairs ? n * p.num_k : 0})});
}

// What a regular map's sync read, and the launch sizes they give.
struct After {
  int64_t m, p, sub, groups, cap_pairs;
  bool fits32;
};

Key finish_key(int64_t device, const Geo& geo, const Plan& plan, const Sizes& s, int64_t n, const After& a, bool pairs,
               bool pad_pairs) {
  return key_of(device, geo,
                {insert_signature(s, n), pairs, pad_pairs, a.fits32, pairs ? rows_mult(plan, a.sub) : 0,
                 signature({a.m, a.sub, a.groups, pairs ? a.cap_pairs : 0})});
}

After after_of(const Plan& plan, int64_t m, int64_t p, int64_t max_batch, bool pad_pairs) {
  After a;
  a.m = m;
  a.p = p;
  // (exact, as Python's integers: the product of a large grid and batch index can pass 2^63)
  const __int128 cells = static_cast<__int128>(max_batch + 1) * plan.out_shape[0] * plan.out_shape[1] * plan.out_shape[2];
  a.fits32 = cells < (static_cast<__int128>(1) << 31);
  std::tie(a.sub, a.groups) = groups_of(m, plan.block);
  a.cap_pairs = pad_pairs ? m * plan.num_k : p;
  return a;
}

Plan plan_of(py::tuple v) {
  TORCH_CHECK(v.size() == 12, "pcops native host: a kernel-map plan has 12 values");
  const auto at = [&](int i) { return v[i].cast<int64_t>(); };
  return Plan{at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7) != 0, at(8), {at(9), at(10), at(11)}};
}

Geo geo_of(py::tuple t) {
  TORCH_CHECK(t.size() == kGeo, "pcops native host: a kernel-map geometry has 16 values");
  Geo g;
  for (int i = 0; i < kGeo; ++i) g[i] = t[i].cast<int64_t>();
  return g;
}

// (cap_in, log_in, cap_out, log_out, sub, groups, counts_off, counters_off, sink_off, ws_len) for N
// voxels (tests)
py::tuple km_sizes(py::tuple plan_values, int64_t n) {
  const Sizes s = sizes_of(plan_of(plan_values), n);
  return py::make_tuple(s.cap_in, s.log_in, s.cap_out, s.log_out, s.sub, s.groups, s.counts_off, s.counters_off,
                        s.sink_off, s.ws_len);
}

// Remember the launches of a map of `coords`: submanifold (sizes: cap_in, log_in, sub, groups,
// counts_off, counters_off, sink_off, ws_len) or regular / transposed (sizes: cap_in, log_in,
// cap_out, log_out, counts_off, counters_off, sink_off, ws_len, then M, P, int32 keys, sub, groups).
// False (nothing registered) where those differ from the sizes derived here.
bool km_register(const at::Tensor& coords, py::tuple geometry, bool pairs, bool pad_pairs, py::tuple plan_values,
                 py::tuple sizes, py::tuple insert, py::tuple lookup, py::object compact) {
  TORCH_CHECK(coords.is_cuda() && coords.dim() == 2, "km_register: bad arguments");
  if (!have_driver()) return false;
  const Geo geo = geo_of(geometry);
  const Plan plan = plan_of(plan_values);
  const int64_t n = coords.size(0), device = coords.device().index();
  const Sizes s = sizes_of(plan, n);
  const auto size = [&](int i) { return sizes[i].cast<int64_t>(); };
  const bool subm = plan.per_input == 0;
  if (subm) {
    const int64_t want[] = {s.cap_in, s.log_in, s.sub, s.groups, s.counts_off, s.counters_off, s.sink_off, s.ws_len};
    if (sizes.size() != 8) return false;
    for (int i = 0; i < 8; ++i) {
      if (size(i) != want[i]) return false;
    }
    plans[plan_key(device, geo)] = plan;
    Subm e{make_kernel(insert), make_kernel(lookup), Kernel{}};
    if (pairs) e.compact = make_kernel(compact);
    subm_entries[subm_key(device, geo, plan, s, n, pairs, pad_pairs)] = e;
    return true;
  }
  const int64_t want[] = {s.cap_in, s.log_in, s.cap_out, s.log_out, s.counts_off, s.counters_off, s.sink_off, s.ws_len};
  if (sizes.size() != 13) return false;
  for (int i = 0; i < 8; ++i) {
    if (size(i) != want[i]) return false;
  }
  // (max_batch only decides the key width: fits32 as the Python path found it)
  After a = after_of(plan, size(8), size(9), 0, pad_pairs);
  a.fits32 = size(10) != 0;
  if (size(11) != a.sub || size(12) != a.groups) return false;
  plans[plan_key(device, geo)] = plan;
  inserts[key_of(device, geo, {insert_signature(s, n)})] = make_kernel(insert);
  finishes[finish_key(device, geo, plan, s, n, a, pairs, pad_pairs)] =
      Finish{make_kernel(lookup), pairs ? make_kernel(compact) : Kernel{}};
  return true;
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

// The tensors and ints of one map call.
struct MapCall {
  const at::Tensor* coords;
  at::Device device{at::kCUDA};
  at::TensorOptions i32;
  int64_t n;
  Geo geo;
  const Plan* plan;
  Sizes s;
};

// The insert pass: (coords, ws, out_keys, out_keys32, out_coords, bits, out_in, n, fill_len, nbatch,
// D, H, W, cap_in, log_in, cap_out, log_out, counters_off, sink_off, Do, Ho, Wo)
void launch_insert(const MapCall& c, const Kernel& k, at::Tensor& ws, void* out_keys, void* out_keys32,
                   void* out_coords, void* out_in) {
  void* pc = c.coords->data_ptr();
  void* pws = ws.data_ptr();
  int32_t n32 = static_cast<int32_t>(c.n), zero = 0;
  int32_t d = static_cast<int32_t>(c.geo[0]), h = static_cast<int32_t>(c.geo[1]), w = static_cast<int32_t>(c.geo[2]);
  int32_t od = static_cast<int32_t>(c.plan->out_shape[0]), oh = static_cast<int32_t>(c.plan->out_shape[1]),
          ow = static_cast<int32_t>(c.plan->out_shape[2]);
  int32_t cap_in = static_cast<int32_t>(c.s.cap_in), log_in = static_cast<int32_t>(c.s.log_in);
  int32_t cap_out = static_cast<int32_t>(std::max<int64_t>(c.s.cap_out, 1)), log_out = static_cast<int32_t>(c.s.log_out);
  int32_t counters_off = static_cast<int32_t>(c.s.counters_off), sink_off = static_cast<int32_t>(c.s.sink_off);
  void* args[] = {&pc,     &pws,    &out_keys, &out_keys32, &out_coords,    &pws,      &out_in, &n32,
                  &zero,   &zero,   &d,        &h,          &w,             &cap_in,   &log_in, &cap_out,
                  &log_out, &counters_off, &sink_off, &od,  &oh,            &ow};
  launch(k, static_cast<unsigned>((c.n + c.plan->block_n - 1) / c.plan->block_n), c.device, args, 22);
}

// The lookup pass over `m` outputs: (coords, ws, keys, out_coords, out_in, ibits, ipre, in_rows,
// in_cells, m_total, counts_off, m_off, sub, D, H, W, cap_in, log_in, Do, Ho, Wo)
void launch_lookup(const MapCall& c, const Kernel& k, at::Tensor& ws, void* keys, void* out_coords, void* out_in,
                   int64_t m, int64_t sub, int64_t block) {
  void* pc = c.coords->data_ptr();
  void* pws = ws.data_ptr();
  int32_t m32 = static_cast<int32_t>(m), sub32 = static_cast<int32_t>(sub), zero = 0;
  int32_t d = static_cast<int32_t>(c.geo[0]), h = static_cast<int32_t>(c.geo[1]), w = static_cast<int32_t>(c.geo[2]);
  int32_t od = static_cast<int32_t>(c.plan->out_shape[0]), oh = static_cast<int32_t>(c.plan->out_shape[1]),
          ow = static_cast<int32_t>(c.plan->out_shape[2]);
  int32_t cap_in = static_cast<int32_t>(c.s.cap_in), log_in = static_cast<int32_t>(c.s.log_in);
  int32_t counts_off = static_cast<int32_t>(c.s.counts_off), counters_off = static_cast<int32_t>(c.s.counters_off);
  void* args[] = {&pc,   &pws, &keys, &out_coords, &out_in, &pc, &pc,     &zero,   &zero, &m32, &counts_off,
                  &counters_off, &sub32, &d, &h, &w, &cap_in, &log_in, &od, &oh, &ow};
  launch(k, static_cast<unsigned>((m + block - 1) / block), c.device, args, 21);
}

// The compaction into pairs: (out_in, counts, pair_in, pair_out, offsets, counts_off, m_total, K, sub,
// num_groups, cap_pairs, m_off); returns (pair_in, pair_out, offsets) of cap_pairs entries.
std::tuple<at::Tensor, at::Tensor, at::Tensor> launch_compact(const MapCall& c, const Kernel& k, at::Tensor& ws,
                                                              at::Tensor& out_in, int64_t m, int64_t sub,
                                                              int64_t groups, int64_t cap_pairs) {
  at::Tensor pair_in = at::empty({cap_pairs}, c.i32);
  at::Tensor pair_out = at::empty({cap_pairs}, c.i32);
  at::Tensor offsets = at::empty({c.plan->num_k + 1}, c.i32);
  void* poi = out_in.data_ptr();
  void* pws = ws.data_ptr();
  void* ppi = pair_in.data_ptr();
  void* ppo = pair_out.data_ptr();
  void* pof = offsets.data_ptr();
  int32_t counts_off = static_cast<int32_t>(c.s.counts_off), m32 = static_cast<int32_t>(m),
          k32 = static_cast<int32_t>(c.plan->num_k), sub32 = static_cast<int32_t>(sub),
          g32 = static_cast<int32_t>(groups), cap32 = static_cast<int32_t>(cap_pairs), zero = 0;
  void* args[] = {&poi, &pws, &ppi, &ppo, &pof, &counts_off, &m32, &k32, &sub32, &g32, &cap32, &zero};
  launch(k, static_cast<unsigned>(groups), c.device, args, 12);
  return {pair_in, pair_out, offsets};
}

py::object subm_map(MapCall& c, bool pad_pairs) {
  const Plan& plan = *c.plan;
  const auto it = subm_entries.find(subm_key(c.device.index(), c.geo, plan, c.s, c.n, true, pad_pairs));
  if (it == subm_entries.end()) return py::none();
  const Subm& e = it->second;
  const int64_t n = c.n, num_k = plan.num_k;
  at::Tensor ws = at::full({c.s.ws_len}, -1, c.i32.dtype(at::kLong));  // launch 1
  at::Tensor out_coords = at::empty({n, 4}, c.i32);
  at::Tensor out_in = at::empty({n, num_k}, c.i32);
  void* pc = c.coords->data_ptr();
  // (no candidate keys: out_keys is the workspace, out_keys32 the coords; with pairs no mirrored half-table)
  launch_insert(c, e.insert, ws, ws.data_ptr(), pc, out_coords.data_ptr(), pc);
  launch_lookup(c, e.lookup, ws, ws.data_ptr(), out_coords.data_ptr(), out_in.data_ptr(), n, c.s.sub,
                plan.block);  // launch 3
  auto [pair_in, pair_out, offsets] = launch_compact(c, e.compact, ws, out_in, n, c.s.sub, c.s.groups, n * num_k);
  if (!pad_pairs) {
    int64_t p;
    {
      py::gil_scoped_release nogil;  // host sync: the pair count is an output size (every launch is queued)
      p = offsets[num_k].item<int32_t>();
    }
    pair_in = pair_in.narrow(0, 0, p);
    pair_out = pair_out.narrow(0, 0, p);
  }
  return py::make_tuple(out_coords, pair_in, pair_out, offsets, out_in);
}

py::object regular_map(MapCall& c, bool pad_pairs) {
  const Plan& plan = *c.plan;
  const int64_t device = c.device.index();
  const auto ins = inserts.find(key_of(device, c.geo, {insert_signature(c.s, c.n)}));
  if (ins == inserts.end()) return py::none();
  const int64_t n = c.n, num_k = plan.num_k, bound = n * plan.per_input;
  at::Tensor ws = at::full({c.s.ws_len}, -1, c.i32.dtype(at::kLong));  // launch 1
  at::Tensor out_keys = at::empty({bound}, c.i32.dtype(at::kLong));
  at::Tensor out_keys32 = at::empty({bound}, c.i32);
  void* pc = c.coords->data_ptr();
  launch_insert(c, ins->second, ws, out_keys.data_ptr(), out_keys32.data_ptr(), pc, pc);  // launch 2
  int64_t last, max_batch, last_pair;
  {
    py::gil_scoped_release nogil;  // the one host sync: the output count M (with P and the largest batch index)
    const at::Tensor counters = ws.narrow(0, c.s.counters_off, 3 * kCounterStride).to(at::kCPU);
    const int64_t* v = counters.data_ptr<int64_t>();
    last = v[0];
    max_batch = v[kCounterStride];
    last_pair = v[2 * kCounterStride];
  }
  const int64_t m = last + 1;
  if (m <= 0) return py::none();  // no outputs: the Python path's empty map
  if (m * num_k >= (int64_t{1} << 31)) return py::none();  // (int32 sizes only)
  const After a = after_of(plan, m, last_pair + 1, max_batch, pad_pairs);
  const auto fin = finishes.find(finish_key(device, c.geo, plan, c.s, n, a, true, pad_pairs));
  if (fin == finishes.end()) return py::none();  // (the Python path builds the map again and registers these)
  // linear keys sort lexicographically by (b, z, y, x); int32 keys where they fit
  at::Tensor keys = std::get<0>(at::sort((a.fits32 ? out_keys32 : out_keys).narrow(0, 0, m)));
  at::Tensor out_coords = at::empty({m, 4}, c.i32);
  at::Tensor out_in = at::empty({m, num_k}, c.i32);
  launch_lookup(c, fin->second.lookup, ws, keys.data_ptr(), out_coords.data_ptr(), out_in.data_ptr(), m, a.sub,
                plan.block);
  auto [pair_in, pair_out, offsets] =
      launch_compact(c, fin->second.compact, ws, out_in, m, a.sub, a.groups, a.cap_pairs);
  return py::make_tuple(out_coords, pair_in, pair_out, offsets, out_in);
}

// The map's tensors (out_coords, pair_in, pair_out, offsets, out_in) and the output grid (D', H', W');
// None where this path does not apply.
py::object km_forward(py::handle coords_obj, py::handle shape_obj, py::handle kernel_obj, py::handle stride_obj,
                      py::handle padding_obj, py::handle dilation_obj, py::handle subm_obj, py::handle transposed_obj,
                      py::handle pad_pairs_obj, py::handle static_obj, py::handle pairs_obj, py::handle backend_obj) {
  const py::object none = py::none();
  if (!PyBool_Check(subm_obj.ptr()) || !PyBool_Check(transposed_obj.ptr())) return none;
  const bool subm = subm_obj.ptr() == Py_True, transposed = transposed_obj.ptr() == Py_True;
  if (subm && transposed) return none;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "triton")) return none;
  if (!PyBool_Check(pad_pairs_obj.ptr()) || !PyBool_Check(static_obj.ptr()) || !PyBool_Check(pairs_obj.ptr()))
    return none;
  if (static_obj.ptr() == Py_True && !subm) return none;  // the static regular map: the Python path
  const bool pad_pairs = pad_pairs_obj.ptr() == Py_True || static_obj.ptr() == Py_True;
  // the table-only maps (pairs=False) differed from the Python path's in GPU tests (odd subm
  // kernels, regular maps; not diagnosed yet): the Python path takes them (and registers none)
  if (pairs_obj.ptr() != Py_True) return none;
  if (!plain_tensor(coords_obj)) return none;
  if (!PyList_CheckExact(shape_obj.ptr()) && !PyTuple_CheckExact(shape_obj.ptr())) return none;
  MapCall c;
  Geo& geo = c.geo;
  int64_t padding[3];
  if (!triple(shape_obj, 1, &geo[0]) || !triple(kernel_obj, 1, &geo[3]) || !triple(stride_obj, 1, &geo[6]) ||
      !triple(padding_obj, 0, padding) || !triple(dilation_obj, 1, &geo[12]))
    return none;
  geo[15] = transposed | (subm << 1);  // (a subm map and a same-padding regular one share the rest)
  for (int i = 0; i < 3; ++i) {
    if (subm) {
      if (geo[6 + i] != 1) return none;  // (the Python path raises)
      geo[9 + i] = (geo[3 + i] - 1) / 2 * geo[12 + i];  // a centred kernel: the padding is ignored
    } else {
      geo[9 + i] = padding[i];
    }
  }
  const at::Tensor& coords = THPVariable_Unpack(coords_obj.ptr());
  if (!direct_ok(coords) || intercepted()) return none;
  if (coords.dim() != 2 || coords.size(1) != 4 || coords.scalar_type() != at::kInt) return none;
  if (!current_cuda(coords.device()) || !coords.is_contiguous() || !aligned(coords)) return none;
  c.coords = &coords;
  c.device = coords.device();
  c.i32 = coords.options();
  c.n = coords.size(0);
  if (c.n < 1 || c.n >= (int64_t{1} << 28)) return none;
  const auto found = plans.find(plan_key(c.device.index(), geo));
  if (found == plans.end()) return none;
  c.plan = &found->second;
  const Plan& plan = *c.plan;
  if ((plan.per_input == 0) != subm) return none;
  c.s = sizes_of(plan, c.n);
  const int64_t span = std::max(c.n * plan.num_k, c.n * std::max<int64_t>(plan.per_input, 1));
  if (span >= (int64_t{1} << 31) || c.s.ws_len >= (int64_t{1} << 31) || 2 * c.s.cap_in >= (int64_t{1} << 31))
    return none;
  py::object maps = subm ? subm_map(c, pad_pairs) : regular_map(c, pad_pairs);
  if (maps.is_none()) return none;
  return py::make_tuple(maps, py::make_tuple(plan.out_shape[0], plan.out_shape[1], plan.out_shape[2]));
}

py::tuple km_plans() { return py::make_tuple(subm_entries.size(), inserts.size(), finishes.size()); }

}  // namespace

void register_kernel_map(py::module_& m) {
  m.def("km_register", &km_register);
  m.def("km_sizes", &km_sizes, "the sizes derived from N (tests)");
  m.def("km_forward", &km_forward);
  m.def("km_plans", &km_plans, "(submanifold classes, regular insert classes, regular finish classes) (tests)");
}

}  // namespace pcops_host
