// csrc/nms.cu's device geometry (everything before its kernels, written by tests/test_boxes_iou.py
// to "nms_geometry.inc" with the float maths as std::), compiled as host C++: IoU of row-aligned
// pairs of (N, 7) float32 boxes.
#include <cmath>
#define __device__
#define __forceinline__ inline
#include "nms_geometry.inc"

extern "C" void iou_pairs(const float* a, const float* b, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    Box A = load_box(a, i, 7, 0, true), B = load_box(b, i, 7, 0, true);
    float inter = (A.ok && B.ok && circles_touch(A, B)) ? pair_inter(A, B) : 0.f;
    float sa = A.ok ? A.dx * A.dy : 0.f, sb = B.ok ? B.dx * B.dy : 0.f;
    float u = sa + sb - inter;
    out[i] = u > 0.f ? inter / u : 0.f;
  }
}
