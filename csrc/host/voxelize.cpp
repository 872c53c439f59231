// Native host path of pcops.voxelize in the CSR layout and of pcops.dynamic_voxelize (voxels
// numbered; backend "auto" / "triton", CUDA): the work buffer, its fill, the main kernel pcops
// compiled for this grid (pcops/triton/voxelize.py: _run_main), then the voxel counts (dynamic) or
// the cumsum, scatter and rows kernels (hard) and, without pad_to_max, the one host sync for M, in C++. The sizes and the work buffer's layout derived from N below
// mirror _run_main; registration checks them against the Python path's. Anything else returns None
// and the Python path runs (and raises its errors).
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <unordered_map>

#include "host.h"

namespace pcops_host {
namespace {

constexpr int kViews = 13;  // coords, keys, first, row, ticket, flags, desc, stats, drop, lists, cnt, lrb, posb

// What does not depend on N: the grid (validated by the Python path), its cells, the launch shape.
struct Grid {
  int64_t gx, gy, gz;
  int64_t block_small, block_big, big_n;  // points per program below / from big_n points
};

// The caps of a hard voxelization (max_points 1 and max_voxels 2^31 - 1 for the dynamic form).
struct Caps {
  bool hard;
  int64_t max_points, max_voxels;
};

// N's sizes: the hash capacity, the programs, the per-sample list stride, the work views' offsets
// (int32 elements) and the main kernel's KEY64.
struct Layout {
  int64_t cap, blocks, block, list_stride, offsets[kViews + 1];
  bool key64;
  uint32_t align;  // bit i: view i starts 16-byte aligned (Triton specialises pointers on it)
};

// pcops/triton/voxelize.py _run_main (the dynamic form, or the hard form in the CSR layout)
Layout layout_of(const Grid& g, int64_t n, int64_t batch, bool pad_to_max, const Caps& caps) {
  Layout l;
  const int64_t cells = batch * g.gx * g.gy * g.gz;
  l.cap = std::max<int64_t>(next_pow2(2 * std::min(n, cells)), 64);
  l.block = n >= g.big_n ? g.block_big : g.block_small;
  l.blocks = (n + l.block - 1) / l.block;
  l.list_stride = caps.hard ? std::min(caps.max_voxels, n) : 0;
  l.key64 = (batch * l.list_stride + 1) * 2 * l.block >= (int64_t{1} << 31);
  const int64_t coords_len = !caps.hard && pad_to_max ? 4 * n : 0;
  const int64_t csr = caps.hard ? 1 : 0;  // (the hard form is taken in the CSR layout only)
  const int64_t sizes[kViews] = {coords_len, 2 * l.cap, l.cap,     l.cap,   3,      l.blocks, l.blocks,
                                 2 * batch,  batch,     0,         csr * batch * l.list_stride, csr * n, csr * n};
  l.offsets[0] = 0;
  l.align = 0;
  for (int i = 0; i < kViews; ++i) {
    l.offsets[i + 1] = l.offsets[i] + sizes[i];
    // an empty view's data pointer is null (torch), which counts as aligned
    if (sizes[i] == 0 || l.offsets[i] % 4 == 0) l.align |= 1u << i;
  }
  return l;
}

// (device, dtype, channels, lengths dtype (-1: none), batch, the 9 grid values' bits): a call's grid
using GridKey = std::array<int64_t, 14>;
// GridKey, then hard, max_points, max_voxels, pad_to_max, n >= big_n, KEY64, the specialisation
// classes of N, the capacity and the list stride, the views' alignment: what selects the kernels
using Key = std::array<int64_t, 22>;

struct Entry {
  Kernel main, scatter;
  Kernel rows[3];     // the hard form's rows kernel per specialisation class of the row count (spec())
  bool has_rows[3];
  int64_t scatter_block, rows_per_program;
};
std::unordered_map<Key, Entry, ArrayHash> entries;  // under the GIL
// (GridKey, hard) -> the grid: the same for every N
std::unordered_map<std::array<int64_t, 15>, Grid, ArrayHash> grids;
int64_t csr_max_points = 0;  // mode "auto" takes the CSR layout below this many points per sample

GridKey grid_key(const at::Tensor& points, int64_t lengths_dtype, int64_t batch, const double* grid) {
  GridKey k{points.device().index(), static_cast<int64_t>(points.scalar_type()), points.size(1), lengths_dtype, batch};
  for (int i = 0; i < 9; ++i) std::memcpy(&k[5 + i], &grid[i], sizeof(double));
  return k;
}

std::array<int64_t, 15> grid_of(const GridKey& gk, bool hard) {
  std::array<int64_t, 15> k;
  std::copy(gk.begin(), gk.end(), k.begin());
  k[14] = hard;
  return k;
}

Key key_of(const GridKey& gk, const Caps& caps, bool pad_to_max, const Grid& g, int64_t n, const Layout& l) {
  Key k;
  std::copy(gk.begin(), gk.end(), k.begin());
  k[14] = caps.hard;
  k[15] = caps.max_points;
  k[16] = caps.max_voxels;
  k[17] = pad_to_max;
  k[18] = n >= g.big_n;
  k[19] = l.key64;
  k[20] = 9 * spec(n) + 3 * spec(l.cap) + spec(l.list_stride);
  k[21] = l.align;
  return k;
}

// Remember the kernels of a voxelization the Python path ran (hard: the CSR layout): the main kernel,
// and for the hard form the scatter kernel and the rows kernel per class of the row count (None
// where not bound). `grid_values`: (gx, gy, gz, points per program below / from big_n, big_n,
// the CSR threshold); `sizes`: the Python path's (cap, programs, points per program, list stride,
// KEY64), checked against the layout derived here (false: nothing registered).
bool vx_register(const at::Tensor& points, py::object lengths_obj, std::vector<double> point_cloud_range,
                 std::vector<double> voxel_size, bool hard, int64_t max_points, int64_t max_voxels, bool pad_to_max,
                 py::tuple grid_values, py::tuple sizes, int64_t align, py::tuple main, py::object scatter,
                 py::object rows, int64_t scatter_block, int64_t rows_per_program) {
  TORCH_CHECK(points.dim() == 2 && points.is_cuda() && point_cloud_range.size() == 6 && voxel_size.size() == 3 &&
                  grid_values.size() == 7 && sizes.size() == 5,
              "vx_register: bad arguments");
  if (!have_driver()) return false;
  double grid[9];
  for (int i = 0; i < 6; ++i) grid[i] = point_cloud_range[i];
  for (int i = 0; i < 3; ++i) grid[6 + i] = voxel_size[i];
  const auto gv = [&](int i) { return grid_values[i].cast<int64_t>(); };
  const Grid g{gv(0), gv(1), gv(2), gv(3), gv(4), gv(5)};
  const at::Tensor* lengths;
  int64_t lengths_dtype, batch;
  if (!lengths_arg(lengths_obj, points.device(), &lengths, &lengths_dtype, &batch)) return false;
  const Caps caps{hard, max_points, max_voxels};
  const int64_t n = points.size(0);
  const Layout l = layout_of(g, n, batch, pad_to_max, caps);
  const int64_t want[] = {l.cap, l.blocks, l.block, l.list_stride, l.key64};
  for (int i = 0; i < 5; ++i) {
    if (sizes[i].cast<int64_t>() != want[i]) return false;
  }
  if (align != static_cast<int64_t>(l.align)) return false;
  Entry e{};
  e.main = make_kernel(main);
  if (hard) {
    TORCH_CHECK(!scatter.is_none() && py::len(rows) == 3, "vx_register: the hard form needs its scatter and rows kernels");
    e.scatter = make_kernel(scatter);
    const py::tuple r = rows.cast<py::tuple>();
    for (int i = 0; i < 3; ++i) {
      e.has_rows[i] = !r[i].is_none();
      if (e.has_rows[i]) e.rows[i] = make_kernel(r[i]);
    }
    // a variable-size call learns its row count after the main kernel: every class must be there
    if (!pad_to_max && !(e.has_rows[0] && e.has_rows[1] && e.has_rows[2])) return false;
    e.scatter_block = scatter_block;
    e.rows_per_program = rows_per_program;
    csr_max_points = gv(6);
  }
  const GridKey gk = grid_key(points, lengths_dtype, batch, grid);
  grids[grid_of(gk, hard)] = g;
  entries[key_of(gk, caps, pad_to_max, g, n, l)] = e;
  return true;
}

// A call's points, lengths and grid, parsed; false where this path does not take it.
struct Call {
  const at::Tensor* points;
  const at::Tensor* lengths;
  int64_t n, batch, lengths_dtype;
  double grid[9];
};

bool parse(py::handle points_obj, py::handle vs_obj, py::handle pcr_obj, py::handle lengths_obj, py::handle pad_obj,
           py::handle backend_obj, Call* c) {
  if (!plain_tensor(points_obj) || !PyBool_Check(pad_obj.ptr())) return false;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "triton")) return false;
  if (!as_doubles(pcr_obj, 6, c->grid) || !as_doubles(vs_obj, 3, c->grid + 6)) return false;
  const at::Tensor& points = THPVariable_Unpack(points_obj.ptr());
  if (!direct_ok(points) || intercepted()) return false;
  if (points.dim() != 2 || !points.is_contiguous() || !aligned(points)) return false;
  c->points = &points;
  c->n = points.size(0);
  if (c->n < 1 || c->n >= (int64_t{1} << 29) || !current_cuda(points.device())) return false;
  return lengths_arg(lengths_obj, points.device(), &c->lengths, &c->lengths_dtype, &c->batch);
}

// The work buffer (filled with -1), point_to_voxel and the dynamic form's coords, after the main kernel.
struct Main {
  at::Tensor work, p2v, coords;
  void* views[kViews];
};

Main run_main(const Call& c, const Grid& g, const Layout& l, const Caps& caps, bool pad_to_max, const Kernel& kernel) {
  const at::Tensor& points = *c.points;
  const int64_t n = c.n;
  const auto opts = points.options();
  Main m;
  m.work = at::full({l.offsets[kViews]}, -1, opts.dtype(at::kInt));  // launch 1
  m.p2v = at::empty({n}, opts.dtype(at::kLong));
  if (!caps.hard) {
    m.coords = pad_to_max ? m.work.narrow(0, 0, 4 * n).view({n, 4}) : at::empty({n, 4}, opts.dtype(at::kInt));
  }
  int32_t* base = m.work.data_ptr<int32_t>();
  for (int i = 0; i < kViews; ++i) m.views[i] = l.offsets[i + 1] > l.offsets[i] ? base + l.offsets[i] : nullptr;
  void* pp = points.data_ptr();
  void* pl = c.lengths != nullptr ? c.lengths->data_ptr() : m.views[4];  // (unread without lengths: the ticket view)
  void* pp2v = m.p2v.data_ptr();
  void* pc = caps.hard ? m.views[0] : m.coords.data_ptr();
  int32_t n32 = static_cast<int32_t>(n), c32 = static_cast<int32_t>(points.size(1)),
          b32 = static_cast<int32_t>(c.batch);
  int32_t cap = static_cast<int32_t>(l.cap), gx = static_cast<int32_t>(g.gx), gy = static_cast<int32_t>(g.gy),
          gz = static_cast<int32_t>(g.gz), max_points = static_cast<int32_t>(caps.max_points),
          max_voxels = static_cast<int32_t>(caps.max_voxels), list_stride = static_cast<int32_t>(l.list_stride);
  float f[9];
  for (int i = 0; i < 9; ++i) f[i] = static_cast<float>(c.grid[i]);
  void** v = m.views;
  // (points, lengths, keys, first, row, ticket, flags, desc, stats, drop, lists, p2v, coords, cnt, lrb,
  // posb, n, C, batch, cap, x_lo, y_lo, z_lo, x_hi, y_hi, z_hi, vx, vy, vz, gx, gy, gz, max_points,
  // max_voxels, list_stride): pcops/triton/voxelize.py _run_main
  void* args[] = {&pp,   &pl,   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],       &v[7],       &v[8],
                  &v[9], &pp2v, &pc,   &v[10], &v[11], &v[12], &n32, &c32,      &b32,        &cap,
                  &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7],       &f[8],       &gx,
                  &gy,   &gz,   &max_points, &max_voxels, &list_stride};
  launch(kernel, static_cast<unsigned>(l.blocks), points.device(), args, 35);  // launch 2
  return m;
}

// The registered entry of a call, or null.
const Entry* find(const Call& c, const Caps& caps, bool pad_to_max, Grid* g, Layout* l) {
  const GridKey gk = grid_key(*c.points, c.lengths_dtype, c.batch, c.grid);
  const auto gi = grids.find(grid_of(gk, caps.hard));
  if (gi == grids.end()) return nullptr;
  *g = gi->second;
  *l = layout_of(*g, c.n, c.batch, pad_to_max, caps);
  if (l->offsets[kViews] >= (int64_t{1} << 31)) return nullptr;
  const auto it = entries.find(key_of(gk, caps, pad_to_max, *g, c.n, *l));
  return it == entries.end() ? nullptr : &it->second;
}

// The per-sample voxel counts (after - before) read on the host: the one host sync of a variable-size call.
std::vector<int64_t> counts_on_host(const at::Tensor& stats) {
  at::Tensor host;
  {
    py::gil_scoped_release nogil;  // (as torch's .tolist() does while it waits)
    host = stats.to(at::kCPU);
  }
  const int32_t* s = host.data_ptr<int32_t>();
  const int64_t batch = stats.size(1);
  std::vector<int64_t> out(batch);
  for (int64_t b = 0; b < batch; ++b) out[b] = static_cast<int64_t>(s[batch + b]) - s[b];
  return out;
}

// (point_to_voxel, coords, num_voxels) = dynamic_voxelize(points, voxel_size, point_cloud_range,
// lengths, pad_to_max=pad_to_max, backend=backend), or None where this path does not apply.
py::object dv_forward(py::handle points_obj, py::handle vs_obj, py::handle pcr_obj, py::handle lengths_obj,
                      py::handle pad_obj, py::handle backend_obj) {
  Call c;
  if (!parse(points_obj, vs_obj, pcr_obj, lengths_obj, pad_obj, backend_obj, &c)) return py::none();
  const bool pad_to_max = pad_obj.ptr() == Py_True;
  const Caps caps{false, 1, INT32_MAX};
  Grid g;
  Layout l;
  const Entry* e = find(c, caps, pad_to_max, &g, &l);
  if (e == nullptr) return py::none();
  Main m = run_main(c, g, l, caps, pad_to_max, e->main);
  at::Tensor stats = m.work.narrow(0, l.offsets[7], 2 * c.batch).view({2, c.batch});
  at::Tensor num_voxels = at::empty({c.batch}, c.points->options().dtype(at::kLong));
  at::sub_out(num_voxels, stats[1], stats[0]);  // launch 3
  at::Tensor coords = m.coords;
  if (!pad_to_max) {
    int64_t rows = 0;
    for (const int64_t k : counts_on_host(stats)) rows += k;  // the one host sync: M (every launch is queued)
    // as Python's coords[:M] (lengths are not checked on CUDA: M can be off for counts not summing to N)
    rows = rows < 0 ? std::max<int64_t>(0, c.n + rows) : std::min(rows, c.n);
    coords = coords.narrow(0, 0, rows);
  }
  return py::make_tuple(m.p2v, coords, num_voxels);
}

// (voxels, coords, num_points, point_to_voxel, num_voxels, num_dropped_points, num_dropped_voxels) =
// voxelize(points, voxel_size, point_cloud_range, max_points_per_voxel, max_voxels, lengths,
// pad_to_max=..., mode=..., backend=...) in the CSR layout, or None where this path does not apply.
py::object hv_forward(py::handle points_obj, py::handle vs_obj, py::handle pcr_obj, py::handle max_points_obj,
                      py::handle max_voxels_obj, py::handle lengths_obj, py::handle pad_obj, py::handle mode_obj,
                      py::handle backend_obj) {
  Call c;
  if (!parse(points_obj, vs_obj, pcr_obj, lengths_obj, pad_obj, backend_obj, &c)) return py::none();
  int64_t max_points, max_voxels;
  if (!as_int(max_points_obj, &max_points) || !as_int(max_voxels_obj, &max_voxels)) return py::none();
  if (max_points < 1 || max_voxels < 1 || max_points > 4096 || max_voxels >= (int64_t{1} << 30)) return py::none();
  const bool csr = str_is(mode_obj, "csr") || (str_is(mode_obj, "auto") && c.n < csr_max_points * c.batch);
  if (!csr) return py::none();  // the ranked lists ("lists", or big clouds): the Python path
  const bool pad_to_max = pad_obj.ptr() == Py_True;
  const Caps caps{true, max_points, max_voxels};
  Grid g;
  Layout l;
  const Entry* e = find(c, caps, pad_to_max, &g, &l);
  if (e == nullptr) return py::none();
  const int64_t n = c.n, batch = c.batch, channels = c.points->size(1);
  const at::Device device = c.points->device();
  // (the row count is known after the main kernel; a padded call's is known now)
  if (pad_to_max && !e->has_rows[spec(batch * max_voxels)]) return py::none();
  Main m = run_main(c, g, l, caps, pad_to_max, e->main);
  at::Tensor stats = m.work.narrow(0, l.offsets[7], 2 * batch);
  int64_t rows = 0;
  if (pad_to_max) {
    rows = batch * max_voxels;
  } else {
    // the one host sync: M (every launch is queued)
    for (const int64_t k : counts_on_host(stats.view({2, batch}))) rows += std::min(k, max_voxels);
  }
  TORCH_CHECK(e->has_rows[spec(rows)], "pcops native host: no rows kernel for this row count's class");
  const auto opts = c.points->options();
  at::Tensor voxels = at::empty({rows, max_points, channels}, opts);
  at::Tensor coords = at::empty({rows, 4}, opts.dtype(at::kInt));
  at::Tensor npts = at::empty({rows}, opts.dtype(at::kInt));
  at::Tensor counts[3];
  for (auto& t : counts) t = at::empty({batch}, opts.dtype(at::kLong));
  at::Tensor cnt = m.work.narrow(0, l.offsets[10], batch * l.list_stride);
  at::Tensor csum = at::cumsum(cnt, 0, at::kInt);
  at::Tensor seg = at::empty({n}, opts.dtype(at::kInt));
  void** v = m.views;
  void* pcnt = cnt.data_ptr();
  void* pcsum = csum.data_ptr();
  void* pseg = seg.data_ptr();
  int32_t n32 = static_cast<int32_t>(n);
  // scatter: (lrb, posb, cnt, csum, seg, n): pcops/triton/voxelize.py voxelize
  void* sargs[] = {&v[11], &v[12], &pcnt, &pcsum, &pseg, &n32};
  launch(e->scatter, static_cast<unsigned>((n + e->scatter_block - 1) / e->scatter_block), device, sargs, 6);
  void* pp = c.points->data_ptr();
  void* pst = stats.data_ptr();
  void* pvox = voxels.data_ptr();
  void* pco = coords.data_ptr();
  void* pnp = npts.data_ptr();
  void* pp2v = m.p2v.data_ptr();
  void* pk[3] = {counts[0].data_ptr(), counts[1].data_ptr(), counts[2].data_ptr()};
  int32_t c32 = static_cast<int32_t>(channels), b32 = static_cast<int32_t>(batch), r32 = static_cast<int32_t>(rows),
          mp = static_cast<int32_t>(max_points), mv = static_cast<int32_t>(max_voxels),
          ls = static_cast<int32_t>(l.list_stride);
  float f[6];
  for (int i = 0; i < 3; ++i) f[i] = static_cast<float>(c.grid[i]);
  for (int i = 0; i < 3; ++i) f[3 + i] = static_cast<float>(c.grid[6 + i]);
  // rows: (points, stats, drop, lists, cnt, csum, seg, voxels, coords, npts, p2v, 3 counts, n, C, batch,
  // rows, x_lo, y_lo, z_lo, vx, vy, vz, max_points, max_voxels, list_stride)
  void* rargs[] = {&pp,   &pst,   &v[8],  &v[9],  &pcnt,  &pcsum, &pseg, &pvox, &pco,
                   &pnp,  &pp2v,  &pk[0], &pk[1], &pk[2], &n32,   &c32,  &b32,  &r32,
                   &f[0], &f[1],  &f[2],  &f[3],  &f[4],  &f[5],  &mp,   &mv,   &ls};
  const int64_t programs = std::max<int64_t>((rows + e->rows_per_program - 1) / e->rows_per_program, 1);
  launch(e->rows[spec(rows)], static_cast<unsigned>(programs), device, rargs, 27);
  return py::make_tuple(voxels, coords, npts, m.p2v, counts[0], counts[1], counts[2]);
}

py::int_ vx_plans() { return py::int_(entries.size()); }

}  // namespace

void register_voxelize(py::module_& m) {
  m.def("vx_register", &vx_register);
  m.def("dv_forward", &dv_forward);
  m.def("hv_forward", &hv_forward);
  m.def("vx_plans", &vx_plans, "registered voxelization classes, hard and dynamic (tests)");
}

}  // namespace pcops_host
