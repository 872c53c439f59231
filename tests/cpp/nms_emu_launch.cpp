// csrc/nms.cu's kernels behind cuLaunchKernel's calling convention (params[i] points at argument
// i), run on the host by the SIMT shim, blocks one by one: tests/test_nms.py swaps this library in
// for pcops._nvrtc's kernels to run pcops.cuda.nms's launchers on CPU tensors.
#include <string>

#include "simt.h"
#include "nms_host.inc"

template <class F> static void grid_run(unsigned gx, unsigned gy, unsigned bx, F f) {
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) run_block(x, y, (int)bx, f);
}
#define P(T, i) (*(T*)p[i])
extern "C" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned bx, unsigned smem, void** p) {
  std::vector<unsigned long long> dyn(smem / 8 + 1, 0x5a5a5a5a5a5a5a5aull);
  g_dyn_smem = dyn.data();
  const std::string k(name);
  if (k == "nms_rank" || k == "nms_gather") {
    const bool rank = k == "nms_rank";
    grid_run(gx, gy, bx, [&] {
      if (rank)
        nms_rank(P(const float*, 0), P(const float*, 1), P(const long long*, 2), P(int, 3), P(int, 4), P(int, 5),
                 P(int, 6), P(int, 7), P(long long*, 8), P(float*, 9), P(long long*, 10));
      else
        nms_gather(P(const float*, 0), P(const float*, 1), P(const long long*, 2), P(int, 3), P(int, 4), P(int, 5),
                   P(int, 6), P(int, 7), P(const long long*, 8), P(float*, 9), P(long long*, 10));
    });
  } else if (k == "nms_mask_b") {
    grid_run(gx, gy, bx, [&] {
      nms_mask_b(P(const float*, 0), P(const long long*, 1), P(int, 2), P(int, 3), P(int, 4), P(float, 5),
                 P(unsigned long long*, 6), P(unsigned long long*, 7));
    });
  } else if (k == "nms_pass_b") {
    grid_run(gx, gy, bx, [&] {
      nms_pass_b(P(const unsigned long long*, 0), P(const unsigned long long*, 1), P(const long long*, 2), P(int, 3),
                 P(int, 4), P(int, 5), P(long long*, 6), P(long long*, 7));
    });
  } else {
    return 1;
  }
  return 0;
}
