// Native host path of pcops.dynamic_voxelize(..., cells_only=True): the cell of every point in one
// launch of the Triton kernel pcops compiled for this grid (pcops/triton/voxelize_cells.py), with
// the checks and the allocation in C++. Anything else returns None and the Python path runs.
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <vector>

#include "host.h"

namespace pcops_host {
namespace {

// A registered launch: the grid (voxel size and range as the Python path validated them), the
// tensors' kinds and the Triton specialisation classes of the int arguments.
struct Plan {
  std::array<double, 9> grid;  // x_lo, y_lo, z_lo, x_hi, y_hi, z_hi, vx, vy, vz
  int64_t device, channels;
  int8_t dtype, lengths_dtype;  // lengths_dtype -1: no lengths
  int64_t batch;                // samples (the kernel's BMAX depends on it)
  int spec_n;
  Kernel kernel;
  int64_t block;
  int32_t gx, gy, gz;
};
std::vector<Plan> plans;  // (few: one per grid, dtype and specialisation; under the GIL)

void pc_register(const at::Tensor& points, py::object lengths_obj, std::vector<double> point_cloud_range,
                 std::vector<double> voxel_size, int64_t function, int64_t warps, int64_t shared, int64_t present,
                 int64_t block, int64_t gx, int64_t gy, int64_t gz) {
  TORCH_CHECK(points.dim() == 2 && points.is_cuda() && point_cloud_range.size() == 6 && voxel_size.size() == 3 &&
                  block > 0,
              "pc_register: bad arguments");
  if (!have_driver()) return;
  Plan plan;
  for (int i = 0; i < 6; ++i) plan.grid[i] = point_cloud_range[i];
  for (int i = 0; i < 3; ++i) plan.grid[6 + i] = voxel_size[i];
  plan.device = points.device().index();
  plan.channels = points.size(1);
  plan.dtype = static_cast<int8_t>(points.scalar_type());
  plan.lengths_dtype = -1;
  plan.batch = 1;
  if (!lengths_obj.is_none()) {
    const at::Tensor& lengths = THPVariable_Unpack(lengths_obj.ptr());
    plan.lengths_dtype = static_cast<int8_t>(lengths.scalar_type());
    plan.batch = lengths.numel();
  }
  plan.spec_n = spec(points.size(0));
  plan.kernel = make_kernel(function, warps, shared, present);
  plan.block = block;
  plan.gx = static_cast<int32_t>(gx);
  plan.gy = static_cast<int32_t>(gy);
  plan.gz = static_cast<int32_t>(gz);
  for (Plan& p : plans) {
    if (p.grid == plan.grid && p.device == plan.device && p.channels == plan.channels && p.dtype == plan.dtype &&
        p.lengths_dtype == plan.lengths_dtype && p.batch == plan.batch && p.spec_n == plan.spec_n) {
      p = plan;
      return;
    }
  }
  plans.push_back(plan);
}

// cells = dynamic_voxelize(points, voxel_size, point_cloud_range, lengths, cells_only=True,
// backend=backend), or None where this path does not apply.
py::object pc_forward(py::handle points_obj, py::handle vs_obj, py::handle pcr_obj, py::handle lengths_obj,
                      py::handle backend_obj) {
  const py::object none = py::none();
  if (!plain_tensor(points_obj)) return none;
  if (!str_is(backend_obj, "auto") && !str_is(backend_obj, "triton")) return none;
  std::array<double, 9> grid;
  if (!as_doubles(pcr_obj, 6, grid.data()) || !as_doubles(vs_obj, 3, grid.data() + 6)) return none;
  const at::Tensor& points = THPVariable_Unpack(points_obj.ptr());
  if (!direct_ok(points) || intercepted()) return none;
  if (points.dim() != 2 || !points.is_contiguous() || !aligned(points)) return none;
  const int64_t n = points.size(0);
  if (n < 1 || n >= (int64_t{1} << 31)) return none;
  const at::Device device = points.device();
  if (!current_cuda(device)) return none;
  const at::Tensor* lengths;
  int64_t lengths_type, batch;
  if (!lengths_arg(lengths_obj, device, &lengths, &lengths_type, &batch)) return none;
  const int8_t lengths_dtype = static_cast<int8_t>(lengths_type);
  const int8_t dtype = static_cast<int8_t>(points.scalar_type());
  const int sn = spec(n);
  const Plan* plan = nullptr;
  for (const Plan& p : plans) {
    if (p.grid == grid && p.device == device.index() && p.channels == points.size(1) && p.dtype == dtype &&
        p.lengths_dtype == lengths_dtype && p.batch == batch && p.spec_n == sn) {
      plan = &p;
      break;
    }
  }
  if (plan == nullptr) return none;
  at::Tensor out = at::empty({n, 4}, points.options().dtype(at::kInt));
  void* pp = points.data_ptr();
  void* po = out.data_ptr();
  void* pl = lengths != nullptr ? lengths->data_ptr() : po;
  int32_t n32 = static_cast<int32_t>(n), c32 = static_cast<int32_t>(points.size(1)),
          b32 = static_cast<int32_t>(batch), gx = plan->gx, gy = plan->gy, gz = plan->gz;
  float g[9];
  for (int i = 0; i < 9; ++i) g[i] = static_cast<float>(grid[i]);
  // (points, lengths, out, N, C, B, x_lo, y_lo, z_lo, x_hi, y_hi, z_hi, vx, vy, vz, gx, gy, gz)
  void* args[] = {&pp,   &pl,   &po,   &n32,  &c32,  &b32,  &g[0], &g[1], &g[2],
                  &g[3], &g[4], &g[5], &g[6], &g[7], &g[8], &gx,   &gy,   &gz};
  launch(plan->kernel, static_cast<unsigned>((n + plan->block - 1) / plan->block), device, args, 18);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(out)));
}

}  // namespace

void register_voxelize_cells(py::module_& m) {
  m.def("pc_register", &pc_register);
  m.def("pc_forward", &pc_forward);
}

}  // namespace pcops_host
