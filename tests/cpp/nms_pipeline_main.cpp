// The batched NMS pipeline of csrc/nms.cu (nms_rank or nms_gather, nms_mask_b, nms_pass_b) run on
// the host by the SIMT shim. "nms_host.inc" is csrc/nms.cu with __shared__ -> static (written by
// tests/test_nms.py). stdin: records, each a header of 9 int32 (B, N, M, stride, bev5,
// has_groups, use_rank, post, pass threads) and the float32 threshold, then boxes, scores,
// groups (B N int64) and order (B M int64, read by nms_gather); stdout per record: order, sbox,
// mask, invalid, out, count.
#include "simt.h"
#include "nms_host.inc"

template <class T> static bool get(std::vector<T>& v) { return fread(v.data(), sizeof(T), v.size(), stdin) == v.size(); }
template <class T> static void put(const std::vector<T>& v) { fwrite(v.data(), sizeof(T), v.size(), stdout); }

int main() {
  int h[9];
  while (fread(h, 4, 9, stdin) == 9) {
    float thr;
    if (fread(&thr, 4, 1, stdin) != 1) return 2;
    const int B = h[0], n = h[1], m = h[2], stride = h[3], bev5 = h[4], has_groups = h[5], use_rank = h[6];
    const int post = h[7], threads = h[8], words = (m + 63) / 64;
    std::vector<float> boxes((size_t)B * n * stride), scores((size_t)B * n);
    std::vector<long long> groups((size_t)B * n), order((size_t)B * m, -7), sgroups((size_t)B * m, -7);
    if (!get(boxes) || !get(scores) || !get(groups) || !get(order)) return 2;
    // outputs start as garbage, as on the GPU
    std::vector<float> sbox((size_t)B * m * 8, -7.f);
    std::vector<unsigned long long> mask((size_t)B * m * words, 0x5a5a5a5a5a5a5a5aull), invalid((size_t)B * words, 7);
    std::vector<long long> out((size_t)B * post, -7), count(B, -7);
    for (int b = 0; b < B; ++b) {
      if (use_rank) {
        for (int x = 0; x < (n + 31) / 32; ++x)
          run_block(x, b, 256, [&] {
            nms_rank(boxes.data(), scores.data(), groups.data(), has_groups, n, m, stride, bev5, order.data(),
                     sbox.data(), sgroups.data());
          });
      } else {
        for (int x = 0; x < (m + 63) / 64; ++x)
          run_block(x, b, 64, [&] {
            nms_gather(boxes.data(), scores.data(), groups.data(), has_groups, n, m, stride, bev5, order.data(),
                       sbox.data(), sgroups.data());
          });
      }
      for (int L = 0; L < words * (words + 1) / 2; ++L)
        run_block(L, b, 64, [&] {
          nms_mask_b(sbox.data(), sgroups.data(), has_groups, m, words, thr, mask.data(), invalid.data());
        });
    }
    std::vector<unsigned long long> smem(words + 1, 0x5a5a5a5a5a5a5a5aull);
    g_dyn_smem = smem.data();
    for (int b = 0; b < B; ++b)
      run_block(b, 0, threads, [&] {
        nms_pass_b(mask.data(), invalid.data(), order.data(), m, words, post, out.data(), count.data());
      });
    put(order);
    put(sbox);
    put(mask);
    put(invalid);
    put(out);
    put(count);
  }
  return 0;
}
