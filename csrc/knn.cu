// Exact K nearest neighbours over Morton-sorted tiles, CUDA C++ compiled at run time by NVRTC
// (self-contained: no standard or CUDA headers). Same results as pcops/reference/sampling.py's
// knn, bit for bit: distances are dx*dx + dy*dy + dz*dz in that order with explicit
// round-to-nearest intrinsics (no FMA contraction), ties ordered by the original reference index.
//
// Inputs come from pcops/triton/sampling.py's _morton_sort: each cloud's references sorted along
// a Morton curve, cut into tiles of QB points with a bounding box each, and superblocks of `sb`
// tiles with a box each. A block of QB threads (QB = 32 or 64, a template parameter; the
// kernels are knn_sorted_q<QB>_k<KP>) owns QB consecutive sorted queries, one thread per query;
// each thread keeps its top KP as (distance, index) pairs sorted ascending in
// registers (an unrolled compare-and-swap insertion, so nothing spills to local memory).
//
// Search: superblocks are visited outward from the block's own position along the curve (its
// neighbourhood first, so the K-th distances shrink fast). A superblock, then a tile, is read
// only if some thread's query is within its current K-th distance of the box (the box distance
// is computed with the same rounded operations, so it never exceeds the distance of a point
// inside: the skip is exact; `<=` keeps boxes at exactly the K-th distance, where a lower index
// could still win a tie). A tile that survives is staged in shared memory and every thread that
// needs it scans its QB points. No host synchronisation, one launch.

#define F_INF __int_as_float(0x7f800000)
#define NO_INDEX 0x7fffffff

__device__ __forceinline__ float sq_dist(float qx, float qy, float qz, float rx, float ry, float rz) {
  const float dx = __fsub_rn(qx, rx), dy = __fsub_rn(qy, ry), dz = __fsub_rn(qz, rz);
  return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
}

// squared distance from a point to a box (min xyz at box[0..2], max at box[3..5]); an empty box
// is stored inverted (+inf min, -inf max) and is infinitely far
__device__ __forceinline__ float box_dist(const float* __restrict__ box, float qx, float qy, float qz) {
  const float gx = fmaxf(fmaxf(__fsub_rn(box[0], qx), __fsub_rn(qx, box[3])), 0.0f);
  const float gy = fmaxf(fmaxf(__fsub_rn(box[1], qy), __fsub_rn(qy, box[4])), 0.0f);
  const float gz = fmaxf(fmaxf(__fsub_rn(box[2], qz), __fsub_rn(qz, box[5])), 0.0f);
  return __fadd_rn(__fadd_rn(__fmul_rn(gx, gx), __fmul_rn(gy, gy)), __fmul_rn(gz, gz));
}

__device__ __forceinline__ bool key_less(float d, int i, float bd, int bi) {
  return d < bd || (d == bd && i < bi);
}

// insert (d, i) into the ascending top-KP list (compare-and-swap down the list, fully unrolled so
// the arrays stay in registers) and refresh the K-th best (kd, ki)
template <int KP>
__device__ __forceinline__ void insert(float (&bd)[KP], int (&bi)[KP], float d, int i, int k, float& kd, int& ki) {
  float cd = d;
  int ci = i;
#pragma unroll
  for (int m = 0; m < KP; ++m) {
    if (key_less(cd, ci, bd[m], bi[m])) {
      const float td = bd[m];
      const int ti = bi[m];
      bd[m] = cd;
      bi[m] = ci;
      cd = td;
      ci = ti;
    }
  }
#pragma unroll
  for (int m = 0; m < KP; ++m) {
    if (m == k - 1) {
      kd = bd[m];
      ki = bi[m];
    }
  }
}

template <int QB, int KP>
__device__ __forceinline__ void knn_body(
    const float* __restrict__ q_sorted,     // (B, Nq, 3) queries in Morton order
    const long long* __restrict__ q_perm,   // (B, Nq) original index of each sorted query
    const float* __restrict__ r_sorted,     // (B, Nr, 3) references in Morton order
    const long long* __restrict__ r_perm,   // (B, Nr) original index of each sorted reference
    const float* __restrict__ boxes,        // (B, S * sb, 8) tile boxes (min xyz, max xyz, -, -)
    const float* __restrict__ sboxes,       // (B, S, 8) superblock boxes
    const long long* __restrict__ q_len_p,  // (B,)
    const long long* __restrict__ r_len_p,  // (B,)
    float* __restrict__ dists,              // (B, Nq, k) out, ascending, inf padded
    long long* __restrict__ idx,            // (B, Nq, k) out, -1 padded
    int nq, int nr, int num_sb, int sb, int k) {
  __shared__ float4 tile_pts[QB];  // x, y, z, original index (bits)
  const long long b = blockIdx.y;
  const int q_len = (int)min(max(q_len_p[b], 0LL), (long long)nq);
  const int r_len = (int)min(max(r_len_p[b], 0LL), (long long)nr);
  const int first = blockIdx.x * QB;
  const int row = first + threadIdx.x;
  const bool valid = row < q_len;
  float qx = 0.0f, qy = 0.0f, qz = 0.0f;
  if (valid) {
    const float* q = q_sorted + (b * nq + row) * 3;
    qx = q[0];
    qy = q[1];
    qz = q[2];
  }
  float bd[KP];
  int bi[KP];
#pragma unroll
  for (int j = 0; j < KP; ++j) {
    bd[j] = F_INF;
    bi[j] = NO_INDEX;
  }
  float kd = F_INF;  // the K-th best so far (slot k - 1)
  int ki = NO_INDEX;

  const int n_t = first < q_len ? (r_len + QB - 1) / QB : 0;
  const int n_sb = (n_t + sb - 1) / sb;
  const int num_tiles = num_sb * sb;
  const long long t0 = ((long long)first * r_len / (q_len > 0 ? q_len : 1)) / QB;
  const int sb0 = (int)min(t0 / sb, (long long)(n_sb > 0 ? n_sb - 1 : 0));
  const float* r_base = r_sorted + b * (long long)nr * 3;
  const long long* p_base = r_perm + b * (long long)nr;
  for (int step = 0; step < n_sb; ++step) {
    const int off = (step + 1) / 2;
    int s = (step & 1) ? sb0 + off : sb0 - off;
    s = (s + n_sb) % n_sb;
    const bool want = valid && box_dist(sboxes + (b * num_sb + s) * 8, qx, qy, qz) <= kd;
    if (!__syncthreads_or(want)) continue;
    const int t_end = min((s + 1) * sb, n_t);
    for (int tile = s * sb; tile < t_end; ++tile) {
      const bool need = want && box_dist(boxes + (b * num_tiles + tile) * 8, qx, qy, qz) <= kd;
      if (!__syncthreads_or(need)) continue;
      const int base = tile * QB;
      const int pos = base + threadIdx.x;
      if (pos < r_len) {
        tile_pts[threadIdx.x] = make_float4(r_base[pos * 3 + 0], r_base[pos * 3 + 1], r_base[pos * 3 + 2],
                                            __int_as_float((int)p_base[pos]));
      }
      __syncthreads();
      if (need) {
        const int count = min(QB, r_len - base);
        for (int j = 0; j < count; ++j) {
          const float4 r = tile_pts[j];
          const float d = sq_dist(qx, qy, qz, r.x, r.y, r.z);
          const int i = __float_as_int(r.w);
          if (key_less(d, i, kd, ki)) insert<KP>(bd, bi, d, i, k, kd, ki);
        }
      }
      __syncthreads();
    }
  }
  if (row < nq) {
    const long long orig = q_perm[b * nq + row];
    const long long out = (b * nq + orig) * k;
#pragma unroll
    for (int m = 0; m < KP; ++m) {
      if (m < k) {
        const bool found = valid && bi[m] != NO_INDEX;
        dists[out + m] = found ? bd[m] : F_INF;
        idx[out + m] = found ? (long long)bi[m] : -1LL;
      }
    }
  }
}

#define PCOPS_KNN_ENTRY(QB, KP)                                                                          \
  extern "C" __global__ void __launch_bounds__(QB) knn_sorted_q##QB##_k##KP(                             \
      const float* q_sorted, const long long* q_perm, const float* r_sorted, const long long* r_perm,   \
      const float* boxes, const float* sboxes, const long long* q_len, const long long* r_len,         \
      float* dists, long long* idx, int nq, int nr, int num_sb, int sb, int k) {                       \
    knn_body<QB, KP>(q_sorted, q_perm, r_sorted, r_perm, boxes, sboxes, q_len, r_len, dists, idx, nq,  \
                     nr, num_sb, sb, k);                                                                 \
  }

#define PCOPS_KNN_ENTRIES(QB) \
  PCOPS_KNN_ENTRY(QB, 1)      \
  PCOPS_KNN_ENTRY(QB, 2)      \
  PCOPS_KNN_ENTRY(QB, 4)      \
  PCOPS_KNN_ENTRY(QB, 8)      \
  PCOPS_KNN_ENTRY(QB, 16)     \
  PCOPS_KNN_ENTRY(QB, 32)

PCOPS_KNN_ENTRIES(32)
PCOPS_KNN_ENTRIES(64)
