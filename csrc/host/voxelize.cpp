// Native host path of pcops.dynamic_voxelize (voxels numbered; backend "auto" / "triton", CUDA):
// the work buffer, its fill, the main kernel pcops compiled for this grid
// (pcops/triton/voxelize.py: _run_main with hard=False), the voxel counts and, without pad_to_max,
// the one host sync for M, in C++. The sizes and the work buffer's layout derived from N below
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

// N's sizes: the hash capacity, the programs, the work views' offsets (int32 elements).
struct Layout {
  int64_t cap, blocks, block, offsets[kViews + 1];
  uint32_t align;  // bit i: view i starts 16-byte aligned (Triton specialises pointers on it)
};

Layout layout_of(const Grid& g, int64_t n, int64_t batch, bool pad_to_max) {
  Layout l;
  const int64_t cells = batch * g.gx * g.gy * g.gz;
  int64_t cap = 1;
  while (cap < 2 * std::min(n, cells)) cap <<= 1;
  l.cap = std::max<int64_t>(cap, 64);
  l.block = n >= g.big_n ? g.block_big : g.block_small;
  l.blocks = (n + l.block - 1) / l.block;
  const int64_t sizes[kViews] = {pad_to_max ? 4 * n : 0, 2 * l.cap, l.cap, l.cap, 3, l.blocks, l.blocks,
                                 2 * batch,              batch,      0,     0,     0, 0};
  l.offsets[0] = 0;
  l.align = 0;
  for (int i = 0; i < kViews; ++i) {
    l.offsets[i + 1] = l.offsets[i] + sizes[i];
    // an empty view's data pointer is null (torch), which counts as aligned
    if (sizes[i] == 0 || l.offsets[i] % 4 == 0) l.align |= 1u << i;
  }
  return l;
}

// (device, dtype, channels, lengths dtype (-1: none), batch, the 9 grid values' bits; pad_to_max,
// n >= big_n, the specialisation classes of N and the capacity, the views' alignment)
using Key = std::array<int64_t, 18>;
std::unordered_map<Key, Kernel, ArrayHash> entries;  // under the GIL
// the grid of (device, dtype, channels, lengths dtype, batch, grid bits): the same for every N
std::unordered_map<std::array<int64_t, 14>, Grid, ArrayHash> grids;

int64_t bits_of(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

std::array<int64_t, 14> grid_key(int64_t device, int64_t dtype, int64_t channels, int64_t lengths_dtype, int64_t batch,
                                 const double* grid) {
  std::array<int64_t, 14> k{device, dtype, channels, lengths_dtype, batch};
  for (int i = 0; i < 9; ++i) k[5 + i] = bits_of(grid[i]);
  return k;
}

Key key_of(const std::array<int64_t, 14>& gk, bool pad_to_max, const Grid& g, int64_t n, const Layout& l) {
  Key k;
  std::copy(gk.begin(), gk.end(), k.begin());
  k[14] = pad_to_max;
  k[15] = n >= g.big_n;
  k[16] = 3 * spec(n) + spec(l.cap);
  k[17] = l.align;
  return k;
}

// The lengths argument: None, or a plain int32/int64 1-D tensor on `device`, contiguous and aligned.
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

bool dv_register(const at::Tensor& points, py::object lengths_obj, std::vector<double> point_cloud_range,
                 std::vector<double> voxel_size, bool pad_to_max, py::tuple grid_values, py::tuple sizes,
                 int64_t align, py::tuple kernel) {
  TORCH_CHECK(points.dim() == 2 && points.is_cuda() && point_cloud_range.size() == 6 && voxel_size.size() == 3 &&
                  grid_values.size() == 6 && sizes.size() == 3,
              "dv_register: bad arguments");
  if (!have_driver()) return false;
  double grid[9];
  for (int i = 0; i < 6; ++i) grid[i] = point_cloud_range[i];
  for (int i = 0; i < 3; ++i) grid[6 + i] = voxel_size[i];
  const auto gv = [&](int i) { return grid_values[i].cast<int64_t>(); };
  const Grid g{gv(0), gv(1), gv(2), gv(3), gv(4), gv(5)};
  const at::Tensor* lengths;
  int64_t lengths_dtype, batch;
  if (!lengths_arg(lengths_obj, points.device(), &lengths, &lengths_dtype, &batch)) return false;
  const int64_t n = points.size(0);
  const Layout l = layout_of(g, n, batch, pad_to_max);
  if (sizes[0].cast<int64_t>() != l.cap || sizes[1].cast<int64_t>() != l.blocks ||
      sizes[2].cast<int64_t>() != l.block || align != static_cast<int64_t>(l.align))
    return false;
  const auto gk = grid_key(points.device().index(), static_cast<int64_t>(points.scalar_type()), points.size(1),
                           lengths_dtype, batch, grid);
  grids[gk] = g;
  entries[key_of(gk, pad_to_max, g, n, l)] = make_kernel(kernel[0].cast<int64_t>(), kernel[1].cast<int64_t>(),
                                                         kernel[2].cast<int64_t>(), kernel[3].cast<int64_t>());
  return true;
}

// (point_to_voxel, coords, num_voxels) = dynamic_voxelize(points, voxel_size, point_cloud_range,
// lengths, pad_to_max=pad_to_max, backend=backend), or None where this path does not apply.
py::object dv_forward(py::handle points_obj, py::handle vs_obj, py::handle pcr_obj, py::handle lengths_obj,
                      py::handle pad_obj, py::handle backend_obj) {
  const py::object none = py::none();
  if (!plain_tensor(points_obj) || !PyBool_Check(pad_obj.ptr())) return none;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "triton")) return none;
  const bool pad_to_max = pad_obj.ptr() == Py_True;
  double grid[9];
  if (!as_doubles(pcr_obj, 6, grid) || !as_doubles(vs_obj, 3, grid + 6)) return none;
  const at::Tensor& points = THPVariable_Unpack(points_obj.ptr());
  if (!direct_ok(points) || intercepted()) return none;
  if (points.dim() != 2 || !points.is_contiguous() || !aligned(points)) return none;
  const int64_t n = points.size(0);
  if (n < 1 || n >= (int64_t{1} << 29)) return none;
  const at::Device device = points.device();
  if (!current_cuda(device)) return none;
  const at::Tensor* lengths;
  int64_t lengths_dtype, batch;
  if (!lengths_arg(lengths_obj, device, &lengths, &lengths_dtype, &batch)) return none;
  const auto gk = grid_key(device.index(), static_cast<int64_t>(points.scalar_type()), points.size(1), lengths_dtype,
                           batch, grid);
  const auto gi = grids.find(gk);
  if (gi == grids.end()) return none;
  const Grid& g = gi->second;
  const Layout l = layout_of(g, n, batch, pad_to_max);
  if (l.offsets[kViews] >= (int64_t{1} << 31)) return none;
  const auto it = entries.find(key_of(gk, pad_to_max, g, n, l));
  if (it == entries.end()) return none;
  const auto opts = points.options();
  at::Tensor work = at::full({l.offsets[kViews]}, -1, opts.dtype(at::kInt));  // launch 1
  at::Tensor p2v = at::empty({n}, opts.dtype(at::kLong));
  at::Tensor coords = pad_to_max ? work.narrow(0, 0, 4 * n).view({n, 4}) : at::empty({n, 4}, opts.dtype(at::kInt));
  int32_t* base = work.data_ptr<int32_t>();
  void* views[kViews];
  for (int i = 0; i < kViews; ++i) views[i] = l.offsets[i + 1] > l.offsets[i] ? base + l.offsets[i] : nullptr;
  void* pp = points.data_ptr();
  void* pl = lengths != nullptr ? lengths->data_ptr() : views[4];  // (unread without lengths: the ticket view)
  void* pp2v = p2v.data_ptr();
  void* pc = coords.data_ptr();
  int32_t n32 = static_cast<int32_t>(n), c32 = static_cast<int32_t>(points.size(1)), b32 = static_cast<int32_t>(batch);
  int32_t cap = static_cast<int32_t>(l.cap), gx = static_cast<int32_t>(g.gx), gy = static_cast<int32_t>(g.gy),
          gz = static_cast<int32_t>(g.gz), one = 1, max_voxels = INT32_MAX, zero = 0;
  float f[9];
  for (int i = 0; i < 9; ++i) f[i] = static_cast<float>(grid[i]);
  // (points, lengths, keys, first, row, ticket, flags, desc, stats, drop, lists, p2v, coords, cnt, lrb,
  // posb, n, C, batch, cap, x_lo, y_lo, z_lo, x_hi, y_hi, z_hi, vx, vy, vz, gx, gy, gz, max_points,
  // max_voxels, list_stride): pcops/triton/voxelize.py _run_main
  void* args[] = {&pp,       &pl,       &views[1],  &views[2], &views[3], &views[4], &views[5],
                  &views[6], &views[7], &views[8],  &views[9], &pp2v,     &pc,       &views[10],
                  &views[11], &views[12], &n32,     &c32,      &b32,      &cap,      &f[0],
                  &f[1],     &f[2],     &f[3],      &f[4],     &f[5],     &f[6],     &f[7],
                  &f[8],     &gx,       &gy,        &gz,       &one,      &max_voxels, &zero};
  launch(it->second, static_cast<unsigned>(l.blocks), device, args, 35);  // launch 2
  at::Tensor stats = work.narrow(0, l.offsets[7], 2 * batch).view({2, batch});
  at::Tensor num_voxels = at::empty({batch}, opts.dtype(at::kLong));
  at::sub_out(num_voxels, stats[1], stats[0]);  // launch 3
  if (!pad_to_max) {
    // the one host sync: M (every launch is queued)
    const at::Tensor host = stats.to(at::kCPU);
    const int32_t* s = host.data_ptr<int32_t>();
    int64_t m = 0;
    for (int64_t b = 0; b < batch; ++b) m += static_cast<int64_t>(s[batch + b]) - s[b];
    coords = coords.narrow(0, 0, m);
  }
  return py::make_tuple(p2v, coords, num_voxels);
}

py::int_ dv_plans() { return py::int_(entries.size()); }

}  // namespace

void register_voxelize(py::module_& m) {
  m.def("dv_register", &dv_register);
  m.def("dv_forward", &dv_forward);
  m.def("dv_plans", &dv_plans, "registered dynamic voxelization classes (tests)");
}

}  // namespace pcops_host
