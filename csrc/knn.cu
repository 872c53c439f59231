// Exact K nearest neighbours over Morton-sorted tiles, CUDA C++ compiled at run time by NVRTC
// (self-contained: no standard or CUDA headers; pcops/cuda/knn.py launches these kernels). Same
// results as pcops/reference/knn.py, bit for bit: distances are dx*dx + dy*dy + dz*dz in that order
// with explicit round-to-nearest intrinsics (no FMA contraction), ties ordered by the original
// reference index.
//
// Preprocessing (knn_prep_bounds, knn_prep_codes, torch.sort, knn_prep_gather, at the end of this
// file): each cloud's references sorted along a Morton curve, cut into tiles of 32 points with a
// bounding box each, and superblocks of `sb` tiles with a box each. A block of 32 threads owns 32
// consecutive sorted queries, one thread per query, with its top K in registers.
//
// Search: the block's own tile first (the K-th bests start small), then superblocks outward from
// the block's own position along the curve (its neighbourhood first, so the K-th distances shrink
// fast). A superblock, then a tile, is read only if some thread's query is within its current K-th
// distance of the box (the box distance is computed with the same rounded operations, so it never
// exceeds the distance of a point inside: the skip is exact; `<=` keeps boxes at exactly the K-th
// distance, where a lower index could still win a tie). A tile that survives is staged in shared
// memory and every thread that needs it scans its 32 points. No host synchronisation, one launch.
//
// Entry points: knn_netfu_q32_k{1,2,4,8,16,32} (KP = next power of two >= K slots), knn_prep_*.

#define F_INF __int_as_float(0x7f800000)

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

// The top K as 64-bit keys: the distance's bits (distances are >= +0, so their bit patterns order
// like the floats; NaN never enters) above index + 1, so comparing keys orders by (distance, index).
// The list holds KP keys, right-aligned: slots [0, KP - k) hold the sentinel 0 (below every real
// key, never displaced) and the K-th best is always key[KP - 1] -- no run-time index anywhere, so
// everything stays in registers (a run-time index would put the list in local memory). Insertion is
// a select network: new slot m = old m if the candidate is not below it, else old m - 1 if the
// candidate is not below that, else the candidate (each slot reads only old values: no KP-long
// dependent chain). A thread inserts on the spot when its candidate beats its K-th best.
typedef unsigned long long knn_key;
#define KEY_EMPTY 0x7f800000ffffffffULL  // (inf, no index): above every real key, never output
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ knn_key make_key(float d, int i) {
  return ((knn_key)__float_as_uint(d) << 32) | (knn_key)(unsigned)(i + 1);
}

__device__ __forceinline__ float key_dist(knn_key key) { return __uint_as_float((unsigned)(key >> 32)); }

// insert c into the ascending list, touching slots [P, KP) only: exact when c is not below
// key[P - 1] (always for P = 0); a no-op when c is not below key[KP - 1]
template <int KP, int P>
__device__ __forceinline__ void net_insert_from(knn_key (&key)[KP], knn_key c) {
  bool below_hi = c < key[KP - 1];
#pragma unroll
  for (int m = KP - 1; m > P; --m) {
    const bool below_lo = c < key[m - 1];
    key[m] = below_hi ? (below_lo ? key[m - 1] : c) : key[m];
    below_hi = below_lo;
  }
  key[P] = below_hi ? c : key[P];
}

template <int KP>
__device__ __forceinline__ void net_insert(knn_key (&key)[KP], knn_key c) {
  net_insert_from<KP, 0>(key, c);
}

// Options of knn_body_keys (template flags, see PCOPS_KNN_KEYS_ENTRY):
// OWN: scan the block's own tile (the references at the queries' position on the curve) before
//   the outward sweep, so the K-th bests start small (fewer insertions, tighter culls); the sweep
//   skips it.
// UNR: unroll the candidate loop of a full tile by this factor.
template <int QB, int KP, bool OWN, int UNR>
__device__ __forceinline__ void knn_body_keys(
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
  knn_key key[KP];
#pragma unroll
  for (int m = 0; m < KP; ++m) key[m] = m < KP - k ? 0ULL : KEY_EMPTY;

  const int n_t = first < q_len ? (r_len + QB - 1) / QB : 0;
  const int n_sb = (n_t + sb - 1) / sb;
  const int num_tiles = num_sb * sb;
  const long long t0 = ((long long)first * r_len / (q_len > 0 ? q_len : 1)) / QB;
  const int sb0 = (int)min(t0 / sb, (long long)(n_sb > 0 ? n_sb - 1 : 0));
  const float* r_base = r_sorted + b * (long long)nr * 3;
  const long long* p_base = r_perm + b * (long long)nr;

  // stage tile `tile` in shared memory and scan it (need: this thread's query wants it)
  auto scan_tile = [&](int tile, bool need) {
    const int base = tile * QB;
    const int pos = base + threadIdx.x;
    if (pos < r_len) {
      const float px = r_base[pos * 3 + 0], py = r_base[pos * 3 + 1], pz = r_base[pos * 3 + 2];
      tile_pts[threadIdx.x] = make_float4(px, py, pz, __int_as_float((int)p_base[pos]));
    }
    __syncthreads();
    const int count = min(QB, r_len - base);
    if (need) {
      if (UNR > 1 && count == QB) {
#pragma unroll UNR
        for (int j = 0; j < QB; ++j) {
          const float4 r = tile_pts[j];
          const knn_key c = make_key(sq_dist(qx, qy, qz, r.x, r.y, r.z), __float_as_int(r.w));
          if (c < key[KP - 1]) {
            net_insert<KP>(key, c);
          }
        }
      } else {
        for (int j = 0; j < count; ++j) {
          const float4 r = tile_pts[j];
          const knn_key c = make_key(sq_dist(qx, qy, qz, r.x, r.y, r.z), __float_as_int(r.w));
          if (c < key[KP - 1]) {
            net_insert<KP>(key, c);
          }
        }
      }
    }
    __syncthreads();
  };

  int own = -1;
  if (OWN && n_t > 0) {  // n_t > 0: the block has a valid query (uniform)
    own = (int)min(t0, (long long)(n_t - 1));
    scan_tile(own, valid);
  }
  for (int step = 0; step < n_sb; ++step) {
    const int off = (step + 1) / 2;
    int s = (step & 1) ? sb0 + off : sb0 - off;
    s = (s + n_sb) % n_sb;
    const bool want = valid && box_dist(sboxes + (b * num_sb + s) * 8, qx, qy, qz) <= key_dist(key[KP - 1]);
    if (!__syncthreads_or(want)) continue;
    const int t_end = min((s + 1) * sb, n_t);
    for (int tile = s * sb; tile < t_end; ++tile) {
      if (OWN && tile == own) continue;
      const bool need = want && box_dist(boxes + (b * num_tiles + tile) * 8, qx, qy, qz) <= key_dist(key[KP - 1]);
      if (!__syncthreads_or(need)) continue;
      scan_tile(tile, need);
    }
  }
  if (row < nq) {
    const long long orig = q_perm[b * nq + row];
    const long long out = (b * nq + orig) * k;
#pragma unroll
    for (int m = 0; m < KP; ++m) {
      if (m >= KP - k) {  // the k real slots
        const bool found = valid && key[m] != KEY_EMPTY;
        dists[out + m - (KP - k)] = found ? key_dist(key[m]) : F_INF;
        idx[out + m - (KP - k)] = found ? (long long)(unsigned)key[m] - 1LL : -1LL;
      }
    }
  }
}

// knn_netfu_q32_k<KP>: OWN, UNR = 4 as above. __launch_bounds__ minimum resident blocks: 32 warps
// per SM for KP <= 16 (caps a thread at 64 registers, met without spilling, so K1's 4,096 one-warp
// blocks run in one wave), 24 for KP = 32 (80 registers, no spill)
#define PCOPS_KNN_KEYS_ENTRY(NAME, QB, KP, OWN, UNR, MINW)                              \
  extern "C" __global__ void __launch_bounds__(QB, ((MINW) * 32 + (QB) - 1) / (QB)) NAME(                         \
      const float* q_sorted, const long long* q_perm, const float* r_sorted, const long long* r_perm, \
      const float* boxes, const float* sboxes, const long long* q_len, const long long* r_len,       \
      float* dists, long long* idx, int nq, int nr, int num_sb, int sb, int k) {                     \
    knn_body_keys<QB, KP, OWN, UNR>(q_sorted, q_perm, r_sorted, r_perm, boxes, sboxes, \
                                                q_len, r_len, dists, idx, nq, nr, num_sb, sb, k);     \
  }

PCOPS_KNN_KEYS_ENTRY(knn_netfu_q32_k1, 32, 1, true, 4, 32)
PCOPS_KNN_KEYS_ENTRY(knn_netfu_q32_k2, 32, 2, true, 4, 32)
PCOPS_KNN_KEYS_ENTRY(knn_netfu_q32_k4, 32, 4, true, 4, 32)
PCOPS_KNN_KEYS_ENTRY(knn_netfu_q32_k8, 32, 8, true, 4, 32)
PCOPS_KNN_KEYS_ENTRY(knn_netfu_q32_k16, 32, 16, true, 4, 32)
PCOPS_KNN_KEYS_ENTRY(knn_netfu_q32_k32, 32, 32, true, 4, 24)

// ---------------------------------------------------------------------------------------------
// Preprocessing in three kernels, the same outputs as pcops/triton/knn.py's _morton_sort (about 18
// small launches): knn_prep_bounds (partial
// bounds of each cloud), knn_prep_codes (Morton codes), torch.sort, then knn_prep_gather (sorted
// points, tile boxes and superblock boxes). Any order keeps the search exact (boxes bound their own tiles); this one is
// the same Morton order (10-bit cells of each cloud's box; padding last).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ unsigned spread_bits(unsigned v) {  // 10 bits -> every third of 30
  v = (v | (v << 16)) & 0x030000FFu;
  v = (v | (v << 8)) & 0x0300F00Fu;
  v = (v | (v << 4)) & 0x030C30C3u;
  v = (v | (v << 2)) & 0x09249249u;
  return v;
}

__device__ __forceinline__ bool finite(float x) { return fabsf(x) < F_INF; }  // false for NaN too

// block-wide min (MAX = false) or max over blockDim.x <= 1024 threads (all must call)
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(FULL_MASK, v, o);
    v = MAX ? fmaxf(v, w) : fminf(v, w);
  }
  const int warps = (blockDim.x + 31) / 32;
  __syncthreads();  // scratch free to reuse
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = MAX ? -F_INF : F_INF;
  for (int w = 0; w < warps; ++w) v = MAX ? fmaxf(v, scratch[w]) : fminf(v, scratch[w]);
  return v;
}

// the block-wide bounds of this thread's lo[3] / hi[3], written by thread 0 as out[0..2] (min xyz),
// out[3..5] (max xyz) (all threads must call)
__device__ __forceinline__ void store_block_bounds(const float (&lo)[3], const float (&hi)[3], float* scratch,
                                                   float* out) {
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    const float mn = block_reduce<false>(lo[a], scratch);
    const float mx = block_reduce<true>(hi[a], scratch);
    if (threadIdx.x == 0) {
      out[a] = mn;
      out[3 + a] = mx;
    }
  }
}

// per-chunk bounds of the valid points: grid (chunks, B), blockDim.x a multiple of 32; chunk c
// covers points [c * per, (c + 1) * per)
extern "C" __global__ void __launch_bounds__(256) knn_prep_bounds(
    const float* __restrict__ points,      // (B, N, 3)
    const long long* __restrict__ lengths, // (B,)
    float* __restrict__ partial,           // (B, chunks, 6) out: min xyz, max xyz (+-inf if none)
    int n, int per) {
  __shared__ float scratch[32];
  const long long b = blockIdx.y;
  const int len = (int)min(max(lengths[b], 0LL), (long long)n);
  const float* p = points + b * (long long)n * 3;
  float lo[3] = {F_INF, F_INF, F_INF}, hi[3] = {-F_INF, -F_INF, -F_INF};
  const int end = min(len, (blockIdx.x + 1) * per);
  for (int i = blockIdx.x * per + threadIdx.x; i < end; i += blockDim.x) {
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const float c = p[(long long)i * 3 + a];
      lo[a] = fminf(lo[a], c);
      hi[a] = fmaxf(hi[a], c);
    }
  }
  store_block_bounds(lo, hi, scratch, partial + (b * gridDim.x + blockIdx.x) * 6);
}

// Morton codes: grid (cdiv(N, blockDim.x * PER), B); each block first combines the cloud's
// `chunks` partial bounds (as _morton_order: extent nan/inf -> 0, at least 1e-6; lo nan/inf -> 0;
// 1023 cells / extent)
extern "C" __global__ void __launch_bounds__(256) knn_prep_codes(
    const float* __restrict__ points,      // (B, N, 3)
    const long long* __restrict__ lengths, // (B,)
    const float* __restrict__ partial,     // (B, chunks, 6) from knn_prep_bounds
    int* __restrict__ code,                // (B, N) out: Morton code, 1 << 30 for padding
    int n, int chunks, int per_block) {
  __shared__ float scratch[32];
  const long long b = blockIdx.y;
  const int len = (int)min(max(lengths[b], 0LL), (long long)n);
  const float* p = points + b * (long long)n * 3;
  float lo[3], scale[3];
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    float mn = F_INF, mx = -F_INF;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      mn = fminf(mn, partial[(b * chunks + c) * 6 + a]);
      mx = fmaxf(mx, partial[(b * chunks + c) * 6 + 3 + a]);
    }
    mn = block_reduce<false>(mn, scratch);
    mx = block_reduce<true>(mx, scratch);
    float extent = __fsub_rn(mx, mn);
    extent = fmaxf(finite(extent) ? extent : 0.0f, 1e-6f);
    lo[a] = finite(mn) ? mn : 0.0f;
    scale[a] = __fdiv_rn(1023.0f, extent);
  }
  const int end = min(n, (blockIdx.x + 1) * per_block);
  for (int i = blockIdx.x * per_block + threadIdx.x; i < end; i += blockDim.x) {
    unsigned c = 1u << 30;
    if (i < len) {
      c = 0;
#pragma unroll
      for (int a = 0; a < 3; ++a) {
        const float v = fminf(fmaxf(__fmul_rn(__fsub_rn(p[(long long)i * 3 + a], lo[a]), scale[a]), 0.0f), 1023.0f);
        c |= spread_bits((unsigned)(int)v) << a;
      }
    }
    code[b * n + i] = (int)c;
  }
}

// one block per superblock: grid (num_sb, B), blockDim.x a multiple of 32; a warp per tile
extern "C" __global__ void __launch_bounds__(256) knn_prep_gather(
    const float* __restrict__ points,      // (B, N, 3)
    const long long* __restrict__ perm,    // (B, N) sorted position -> original index
    const long long* __restrict__ lengths, // (B,)
    float* __restrict__ sorted,            // (B, N, 3) out
    float* __restrict__ boxes,             // (B, num_sb * group, 8) out: (min xyz, max xyz, -, -)
    float* __restrict__ sboxes,            // (B, num_sb, 8) out: (min xyz, max xyz, 0, 0)
    int n, int num_sb, int group, int tile) {
  __shared__ float scratch[32];
  const int s = blockIdx.x;
  const long long b = blockIdx.y;
  const int len = (int)min(max(lengths[b], 0LL), (long long)n);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float slo[3] = {F_INF, F_INF, F_INF}, shi[3] = {-F_INF, -F_INF, -F_INF};
  for (int g = warp; g < group; g += warps) {
    const int t = s * group + g;
    float lo[3] = {F_INF, F_INF, F_INF}, hi[3] = {-F_INF, -F_INF, -F_INF};
    for (int j = lane; j < tile; j += 32) {
      const int pos = t * tile + j;
      if (pos < n) {
        const long long src = perm[b * n + pos];
#pragma unroll
        for (int a = 0; a < 3; ++a) {
          const float c = points[(b * n + src) * 3 + a];
          sorted[(b * n + pos) * 3 + a] = c;
          if (pos < len) {
            lo[a] = fminf(lo[a], c);
            hi[a] = fmaxf(hi[a], c);
          }
        }
      }
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        lo[a] = fminf(lo[a], __shfl_xor_sync(FULL_MASK, lo[a], o));
        hi[a] = fmaxf(hi[a], __shfl_xor_sync(FULL_MASK, hi[a], o));
      }
      slo[a] = fminf(slo[a], lo[a]);
      shi[a] = fmaxf(shi[a], hi[a]);
    }
    if (lane == 0) {
      float* box = boxes + (b * num_sb * group + t) * 8;
      box[0] = lo[0], box[1] = lo[1], box[2] = lo[2], box[3] = hi[0], box[4] = hi[1], box[5] = hi[2];
    }
  }
  float* sbox = sboxes + (b * num_sb + s) * 8;
  store_block_bounds(slo, shi, scratch, sbox);
  if (threadIdx.x == 0) sbox[6] = sbox[7] = 0.0f;
}
