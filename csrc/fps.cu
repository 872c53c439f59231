// Farthest point sampling with Hopper thread-block clusters, compiled at run time by NVRTC.
//
// One cluster of C CTAs (C = 1..16) samples one cloud: each CTA holds a contiguous share of the
// points and their running min-distances in registers (PPT points per thread, 512 threads), so a
// 120k-point scan is spread over 16 SMs instead of the one SM a block-per-cloud kernel uses.
// Each of the M - 1 steps is:
//   1. every thread updates its points' min-distance to the newest sample and keeps its best
//      (largest distance, lowest index) candidate;
//   2. warp shuffles, then one warp per CTA, reduce the candidates to the CTA's best, which is
//      written with its coordinates to a double-buffered shared-memory slot;
//   3. one cluster barrier (release/acquire) and every warp reads the C slots through distributed
//      shared memory (mapa + ld.shared::cluster) and reduces them: each warp learns the new sample
//      and its coordinates without touching global memory.
// Candidates are packed as (distance bits << 32) | (0xFFFFFFFF - index): distances are >= 0, so
// their bit patterns order like the floats, and a larger key means a larger distance or, on a
// tie, a lower index. The distance arithmetic uses explicit round-to-nearest intrinsics (no FMA
// contraction), matching the plain-torch reference bit for bit.
//
// Variants (template MODE / FLAT_C, entry-point prefixes; pcops/cuda/sampling.py picks one):
//   fps_*        MODE_KEYS: each thread tracks (value, slot) of its best point, warps reduce keys;
//   fps_lazy_*   MODE_LAZY: each thread tracks the value only, holders of the warp max find the slot;
//   fps_flat_*   MODE_LAZY with the flat exchange (2'): no CTA stage, every warp reads all warp
//                records of the cluster (compile-time cluster sizes <= 8);
//   fps_pruned_* MODE_PRUNED: Morton-sorted input, each warp owns a compact run of points and
//                skips its update while its bounding box is farther from the new sample than its
//                largest min-distance (exact: rounding is monotone), republishing its last record.
// *_c{C}_p{PPT} entries have a compile-time cluster shape (cuLaunchKernel); *_rt_p{PPT} entries
// take it from a launch attribute (cuLaunchKernelEx), the documented way to use 16-CTA clusters.

typedef unsigned long long u64;

#define FPS_THREADS 512
#define FPS_WARPS (FPS_THREADS / 32)
#define FULL_MASK 0xffffffffu

struct __align__(16) Candidate {
  u64 key;  // (distance bits << 32) | (0xFFFFFFFF - index); 0 = none
  float x, y, z, pad;
};

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned cluster_size() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}

// All threads of all CTAs of the cluster; orders shared-memory writes before remote reads.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// The address of the same shared variable in CTA `rank` of this cluster.
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

__device__ __forceinline__ uint4 load_cluster_v4(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ unsigned load_cluster_u32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ u64 warp_max(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u64 w = __shfl_xor_sync(FULL_MASK, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// x[j], y[j], z[j] for a run-time j, by an unrolled select: the arrays stay in registers.
template <int PPT>
__device__ __forceinline__ void select_slot(const float (&x)[PPT], const float (&y)[PPT], const float (&z)[PPT], int j,
                                            float& sx, float& sy, float& sz) {
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    if (i == j) {
      sx = x[i];
      sy = y[i];
      sz = z[i];
    }
  }
}

__device__ __forceinline__ float sq_dist(float x, float y, float z, float cx, float cy, float cz) {
  float dx = __fsub_rn(x, cx), dy = __fsub_rn(y, cy), dz = __fsub_rn(z, cz);
  return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
}

// points: (B, N, 3) float32; lengths, starts: (B,) int64; out: (B, M) int64 pre-filled with -1.
// MODE selects the per-point bookkeeping (see step 1): MODE_KEYS, MODE_LAZY, or MODE_PRUNED, which
// also needs `sorted` (B, N, 3), each cloud in Morton order, and `perm` (B, N) int32, the original
// index of each sorted point. FLAT_C > 0 selects the flat exchange for clusters of exactly FLAT_C
// CTAs (see step 2'). Every combination gives identical results.
#define MODE_KEYS 0
#define MODE_LAZY 1
#define MODE_PRUNED 2

template <int PPT, int MODE, int FLAT_C>
__device__ __forceinline__ void fps_cluster(const float* __restrict__ points, const float* __restrict__ sorted,
                                            const int* __restrict__ perm, const long long* __restrict__ lengths,
                                            const long long* __restrict__ starts, long long* __restrict__ out,
                                            int n, int num_samples) {
  __shared__ Candidate slot[2];                // this CTA's best, by step parity
  __shared__ Candidate warp_best[FPS_WARPS];  // each warp's best
  __shared__ Candidate records[FLAT_C > 0 ? 2 : 1][FPS_WARPS];  // flat exchange: per parity, per warp
  const unsigned rank = cluster_rank(), csize = cluster_size();
  const long long b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int length = (int)min(max(lengths[b], 0LL), (long long)n);
  const long long start = starts[b];
  // an invalid start gives a row of -1 (the CPU path raises instead); uniform over the cluster
  const int steps = (start >= 0 && start < length) ? min(length, num_samples) : 0;
  const float* p = points + b * (long long)n * 3;

  // this CTA's contiguous share [lo, hi); thread tid owns lo + tid + j * FPS_THREADS, or in
  // MODE_PRUNED (sorted points) warp w owns the contiguous, hence compact, run of 32 * PPT
  // points from lo + w * 32 * PPT, lane l the points lo + w * 32 * PPT + j * 32 + l
  const int share = (length + (int)csize - 1) / (int)csize;
  const int lo = (int)rank * share;
  const int hi = min(lo + share, length);
  const float* src = MODE == MODE_PRUNED ? sorted + b * (long long)n * 3 : p;
  float x[PPT], y[PPT], z[PPT], md[PPT];
  int oi[MODE == MODE_PRUNED ? PPT : 1];  // original indices (MODE_PRUNED)
  float bx_lo = __int_as_float(0x7f800000), by_lo = bx_lo, bz_lo = bx_lo;  // the warp's box
  float bx_hi = -bx_lo, by_hi = -bx_lo, bz_hi = -bx_lo;
#pragma unroll
  for (int j = 0; j < PPT; ++j) {
    const int i = MODE == MODE_PRUNED ? lo + warp * 32 * PPT + j * 32 + lane : lo + tid + j * FPS_THREADS;
    const bool valid = i < hi;
    x[j] = valid ? src[3 * i + 0] : 0.f;
    y[j] = valid ? src[3 * i + 1] : 0.f;
    z[j] = valid ? src[3 * i + 2] : 0.f;
    md[j] = valid ? __int_as_float(0x7f800000) : -1.f;  // -1: padding, later chosen points
    if constexpr (MODE == MODE_PRUNED) {
      oi[j] = valid ? perm[b * (long long)n + i] : -1;
      if (valid) {
        bx_lo = fminf(bx_lo, x[j]);
        by_lo = fminf(by_lo, y[j]);
        bz_lo = fminf(bz_lo, z[j]);
        bx_hi = fmaxf(bx_hi, x[j]);
        by_hi = fmaxf(by_hi, y[j]);
        bz_hi = fmaxf(bz_hi, z[j]);
      }
    }
  }
  if constexpr (MODE == MODE_PRUNED) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      bx_lo = fminf(bx_lo, __shfl_xor_sync(FULL_MASK, bx_lo, o));
      by_lo = fminf(by_lo, __shfl_xor_sync(FULL_MASK, by_lo, o));
      bz_lo = fminf(bz_lo, __shfl_xor_sync(FULL_MASK, bz_lo, o));
      bx_hi = fmaxf(bx_hi, __shfl_xor_sync(FULL_MASK, bx_hi, o));
      by_hi = fmaxf(by_hi, __shfl_xor_sync(FULL_MASK, by_hi, o));
      bz_hi = fmaxf(bz_hi, __shfl_xor_sync(FULL_MASK, bz_hi, o));
    }
  }
  // MODE_PRUNED: the warp's largest min-distance after its last update (+inf: never updated)
  // and the record it published then, republished while the warp skips
  float warp_max_md = __int_as_float(0x7f800000);
  bool cached_none = true;
  u64 cached_key = 0ull;
  float cached_x = 0.f, cached_y = 0.f, cached_z = 0.f;
  cluster_sync();  // every CTA of the cluster runs before any remote shared-memory access

  int sel = (int)start;
  float cx = 0.f, cy = 0.f, cz = 0.f;
  if (steps > 0) {
    cx = p[3 * sel + 0];
    cy = p[3 * sel + 1];
    cz = p[3 * sel + 2];
  }
  long long pending = start;  // warp 0 of rank 0: the index of step (s & ~31) + lane
  for (int s = 1; s < steps; ++s) {
    // 1. distances to the newest sample; the chosen point leaves the race. Then the warp's best
    // candidate: `holder` is the one lane that publishes it, with its key and coordinates.
    bool holder, none;
    u64 key;
    float wx = 0.f, wy = 0.f, wz = 0.f;
    if constexpr (MODE == MODE_KEYS) {
      // track (value, slot) per point, reduce packed 64-bit keys
      float best = -1.f;
      int best_j = -1;
#pragma unroll
      for (int j = 0; j < PPT; ++j) {
        const int i = lo + tid + j * FPS_THREADS;
        float m = fminf(md[j], sq_dist(x[j], y[j], z[j], cx, cy, cz));
        m = (i == sel) ? -1.f : m;
        md[j] = m;
        if (m > best) {  // strict: j ascending is index ascending, so ties keep the lowest index
          best = m;
          best_j = j;
        }
      }
      const unsigned my_index = (unsigned)(lo + tid + best_j * FPS_THREADS);
      key = best_j >= 0 ? ((u64)__float_as_uint(best) << 32) | (u64)(0xFFFFFFFFu - my_index) : 0ull;
      // keys of live candidates are distinct, so exactly one lane holds the max
      const u64 wmax = warp_max(key);
      holder = wmax != 0ull && key == wmax;
      none = wmax == 0ull;
      if (holder) select_slot<PPT>(x, y, z, best_j, wx, wy, wz);
    } else if constexpr (MODE == MODE_LAZY) {
      // track the value only (fewer instructions per point); the few lanes holding the warp's
      // maximum look up its slot afterwards
      const int delta = sel - lo - tid;  // the chosen point is ours iff delta == j * FPS_THREADS
      float best = -1.f;
#pragma unroll
      for (int j = 0; j < PPT; ++j) {
        float m = fminf(md[j], sq_dist(x[j], y[j], z[j], cx, cy, cz));
        m = (delta == j * FPS_THREADS) ? -1.f : m;
        md[j] = m;
        best = fmaxf(best, m);
      }
      float wbest = best;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) wbest = fmaxf(wbest, __shfl_xor_sync(FULL_MASK, wbest, o));
      int my_j = -1;
      if (wbest >= 0.f && best == wbest) {
#pragma unroll
        for (int j = PPT - 1; j >= 0; --j) {
          if (md[j] == wbest) my_j = j;  // descending: ends on the lowest slot, the lowest index
        }
      }
      const unsigned my_index = my_j >= 0 ? (unsigned)(lo + tid + my_j * FPS_THREADS) : 0xFFFFFFFFu;
      const unsigned holders = __ballot_sync(FULL_MASK, my_j >= 0);
      int winner = __ffs(holders) - 1;
      if (holders & (holders - 1)) {  // a tie across lanes (warp-uniform, rare): lowest index wins
        unsigned m = my_index;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = min(m, __shfl_xor_sync(FULL_MASK, m, o));
        winner = __ffs(__ballot_sync(FULL_MASK, my_j >= 0 && my_index == m)) - 1;
      }
      holder = lane == winner;
      none = winner < 0;
      key = ((u64)__float_as_uint(wbest) << 32) | (u64)(0xFFFFFFFFu - my_index);
      if (holder) select_slot<PPT>(x, y, z, my_j, wx, wy, wz);
    } else {
      // MODE_PRUNED: a warp whose box is farther from the new sample than every min-distance it
      // holds cannot change (d >= box distance > max min-distance; rounding is monotone, so the
      // test is exact): it skips the update and republishes its record. Late in the sampling,
      // when min-distances are small, most warps skip. The branch is warp-uniform.
      const float gx = fmaxf(fmaxf(__fsub_rn(bx_lo, cx), __fsub_rn(cx, bx_hi)), 0.f);
      const float gy = fmaxf(fmaxf(__fsub_rn(by_lo, cy), __fsub_rn(cy, by_hi)), 0.f);
      const float gz = fmaxf(fmaxf(__fsub_rn(bz_lo, cz), __fsub_rn(cz, bz_hi)), 0.f);
      const float lower = __fadd_rn(__fadd_rn(__fmul_rn(gx, gx), __fmul_rn(gy, gy)), __fmul_rn(gz, gz));
      if (!(lower > warp_max_md)) {
        float best = -1.f;
#pragma unroll
        for (int j = 0; j < PPT; ++j) {
          float m = fminf(md[j], sq_dist(x[j], y[j], z[j], cx, cy, cz));
          m = (oi[j] == sel) ? -1.f : m;
          md[j] = m;
          best = fmaxf(best, m);
        }
        float wbest = best;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) wbest = fmaxf(wbest, __shfl_xor_sync(FULL_MASK, wbest, o));
        // slots are not in index order here: the lowest original index among the holders wins
        unsigned my_oi = 0xFFFFFFFFu;
        int my_j = -1;
        if (wbest >= 0.f && best == wbest) {
#pragma unroll
          for (int j = 0; j < PPT; ++j) {
            if (md[j] == wbest && (unsigned)oi[j] < my_oi) {
              my_oi = (unsigned)oi[j];
              my_j = j;
            }
          }
        }
        unsigned m = my_oi;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = min(m, __shfl_xor_sync(FULL_MASK, m, o));
        const int winner = __ffs(__ballot_sync(FULL_MASK, my_j >= 0 && my_oi == m)) - 1;
        float hx = 0.f, hy = 0.f, hz = 0.f;
        if (lane == winner) select_slot<PPT>(x, y, z, my_j, hx, hy, hz);
        const int from = winner < 0 ? 0 : winner;
        cached_x = __shfl_sync(FULL_MASK, hx, from);
        cached_y = __shfl_sync(FULL_MASK, hy, from);
        cached_z = __shfl_sync(FULL_MASK, hz, from);
        cached_none = winner < 0;
        cached_key = cached_none ? 0ull : ((u64)__float_as_uint(wbest) << 32) | (u64)(0xFFFFFFFFu - m);
        warp_max_md = cached_none ? -1.f : wbest;
      }
      holder = lane == 0 && !cached_none;
      none = cached_none;
      key = cached_key;
      wx = cached_x;
      wy = cached_y;
      wz = cached_z;
    }
    const int parity = s & 1;
    u64 k = 0ull;
    float px = 0.f, py = 0.f, pz = 0.f;
    if constexpr (FLAT_C == 0) {
      // 2. warp records, then one warp reduces them to the CTA's best
      if (holder) {
        warp_best[warp].key = key;
        warp_best[warp].x = wx;
        warp_best[warp].y = wy;
        warp_best[warp].z = wz;
      } else if (none && lane == 0) {
        warp_best[warp].key = 0ull;
      }
      __syncthreads();
      if (warp == 0) {
        const u64 kw = lane < FPS_WARPS ? warp_best[lane].key : 0ull;
        const u64 cmax = warp_max(kw);
        if (cmax != 0ull ? (lane < FPS_WARPS && kw == cmax) : lane == 0) {
          slot[parity] = cmax != 0ull ? warp_best[lane] : Candidate{0ull, 0.f, 0.f, 0.f, 0.f};
        }
      }
      // 3. cluster: publish the CTA's best, read everyone's (double buffering makes one barrier
      // per step enough: a CTA rewrites slot[parity] only after all CTAs passed the next barrier)
      cluster_sync();
      if (lane < (int)csize) {
        const unsigned addr = map_to_rank(shared_address(&slot[parity]), (unsigned)lane);
        const uint4 a = load_cluster_v4(addr);
        k = ((u64)a.y << 32) | (u64)a.x;
        px = __uint_as_float(a.z);
        py = __uint_as_float(a.w);
        pz = __uint_as_float(load_cluster_u32(addr + 16));
      }
    } else {
      // 2'. flat: every warp publishes its record; after the one cluster barrier each warp reads
      // all FLAT_C * FPS_WARPS records itself (loads in flight together), no CTA-level stage
      if (holder) {
        records[parity][warp] = Candidate{key, wx, wy, wz, 0.f};
      } else if (none && lane == 0) {
        records[parity][warp].key = 0ull;
      }
      cluster_sync();
      constexpr int kRecords = FLAT_C * FPS_WARPS;
      constexpr int kPerLane = (kRecords + 31) / 32;
      uint4 a[kPerLane];
      unsigned zs[kPerLane];
      const unsigned base = shared_address(&records[parity][0]);
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int r = lane + 32 * t;
        if (r < kRecords) {
          const unsigned addr = map_to_rank(base + (unsigned)((r % FPS_WARPS) * sizeof(Candidate)), (unsigned)(r / FPS_WARPS));
          a[t] = load_cluster_v4(addr);
          zs[t] = load_cluster_u32(addr + 16);
        } else {
          a[t] = make_uint4(0u, 0u, 0u, 0u);
          zs[t] = 0u;
        }
      }
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const u64 kk = ((u64)a[t].y << 32) | (u64)a[t].x;
        if (kk > k) {
          k = kk;
          px = __uint_as_float(a[t].z);
          py = __uint_as_float(a[t].w);
          pz = __uint_as_float(zs[t]);
        }
      }
    }
    const u64 gmax = warp_max(k);
    const int winner = __ffs(__ballot_sync(FULL_MASK, k == gmax)) - 1;
    cx = __shfl_sync(FULL_MASK, px, winner);
    cy = __shfl_sync(FULL_MASK, py, winner);
    cz = __shfl_sync(FULL_MASK, pz, winner);
    sel = (int)(0xFFFFFFFFu - (unsigned)(gmax & 0xFFFFFFFFull));
    // indices leave in coalesced batches of 32 (lane l of warp 0 keeps step (s & ~31) + l): a
    // global store every step would make the next cluster barrier's release fence wait for it
    if (rank == 0 && warp == 0) {
      if (lane == (s & 31)) pending = sel;
      if ((s & 31) == 31 || s == steps - 1) {
        if (lane <= (s & 31)) out[b * num_samples + (s & ~31) + lane] = pending;
      }
    }
  }
  if (steps == 1 && rank == 0 && tid == 0) out[b * num_samples] = start;
  cluster_sync();  // no CTA exits while another may still read its shared memory
}

#define FPS_ENTRY(C, PPT)                                                                                      \
  extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(FPS_THREADS, 1)                    \
      fps_c##C##_p##PPT(const float* points, const long long* lengths, const long long* starts, long long* out, \
                        int n, int num_samples) {                                                              \
    fps_cluster<PPT, MODE_KEYS, 0>(points, points, nullptr, lengths, starts, out, n, num_samples);                                     \
  }                                                                                                            \
  extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(FPS_THREADS, 1)                    \
      fps_lazy_c##C##_p##PPT(const float* points, const long long* lengths, const long long* starts,           \
                             long long* out, int n, int num_samples) {                                         \
    fps_cluster<PPT, MODE_LAZY, 0>(points, points, nullptr, lengths, starts, out, n, num_samples);                                      \
  }

#define FPS_FLAT_ENTRY(C, PPT)                                                                                \
  extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(FPS_THREADS, 1)                    \
      fps_flat_c##C##_p##PPT(const float* points, const long long* lengths, const long long* starts,           \
                             long long* out, int n, int num_samples) {                                         \
    fps_cluster<PPT, MODE_LAZY, C>(points, points, nullptr, lengths, starts, out, n, num_samples);                                   \
  }

#define FPS_ENTRIES(C) FPS_ENTRY(C, 1) FPS_ENTRY(C, 2) FPS_ENTRY(C, 4) FPS_ENTRY(C, 8) FPS_ENTRY(C, 16)

// The same kernel without a compile-time cluster shape, for cuLaunchKernelEx with a cluster
// dimension launch attribute (the documented way to launch the non-portable size 16).
#define FPS_RUNTIME_ENTRY(PPT)                                                                                   \
  extern "C" __global__ void __launch_bounds__(FPS_THREADS, 1)                                                  \
      fps_rt_p##PPT(const float* points, const long long* lengths, const long long* starts, long long* out,     \
                    int n, int num_samples) {                                                                    \
    fps_cluster<PPT, MODE_KEYS, 0>(points, points, nullptr, lengths, starts, out, n, num_samples);                                       \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(FPS_THREADS, 1)                                                  \
      fps_lazy_rt_p##PPT(const float* points, const long long* lengths, const long long* starts,               \
                         long long* out, int n, int num_samples) {                                               \
    fps_cluster<PPT, MODE_LAZY, 0>(points, points, nullptr, lengths, starts, out, n, num_samples);                                        \
  }

FPS_RUNTIME_ENTRY(4)
FPS_RUNTIME_ENTRY(8)
FPS_RUNTIME_ENTRY(16)

FPS_ENTRIES(1)
FPS_ENTRIES(2)
FPS_ENTRIES(4)
FPS_ENTRIES(8)
FPS_ENTRIES(16)

// flat exchange (lazy bookkeeping) for portable cluster sizes: C * 16 records, C / 2 per lane
#define FPS_FLAT_ENTRIES(C) \
  FPS_FLAT_ENTRY(C, 1) FPS_FLAT_ENTRY(C, 2) FPS_FLAT_ENTRY(C, 4) FPS_FLAT_ENTRY(C, 8) FPS_FLAT_ENTRY(C, 16)

FPS_FLAT_ENTRIES(1)
FPS_FLAT_ENTRIES(2)
FPS_FLAT_ENTRIES(4)
FPS_FLAT_ENTRIES(8)

// MODE_PRUNED: sorted points and original indices as extra arguments. Portable sizes use the flat
// exchange; the runtime-shaped entry (16-CTA clusters) the two-stage one.
#define FPS_PRUNED_ENTRY(C, PPT)                                                                              \
  extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(FPS_THREADS, 1)                    \
      fps_pruned_c##C##_p##PPT(const float* points, const float* sorted, const int* perm,                      \
                               const long long* lengths, const long long* starts, long long* out, int n,       \
                               int num_samples) {                                                              \
    fps_cluster<PPT, MODE_PRUNED, C>(points, sorted, perm, lengths, starts, out, n, num_samples);              \
  }
#define FPS_PRUNED_RUNTIME_ENTRY(PPT)                                                                          \
  extern "C" __global__ void __launch_bounds__(FPS_THREADS, 1)                                                \
      fps_pruned_rt_p##PPT(const float* points, const float* sorted, const int* perm, const long long* lengths, \
                           const long long* starts, long long* out, int n, int num_samples) {                  \
    fps_cluster<PPT, MODE_PRUNED, 0>(points, sorted, perm, lengths, starts, out, n, num_samples);              \
  }
#define FPS_PRUNED_ENTRIES(C)                                                                                  \
  FPS_PRUNED_ENTRY(C, 1) FPS_PRUNED_ENTRY(C, 2) FPS_PRUNED_ENTRY(C, 4) FPS_PRUNED_ENTRY(C, 8)                 \
  FPS_PRUNED_ENTRY(C, 16)

FPS_PRUNED_ENTRIES(1)
FPS_PRUNED_ENTRIES(2)
FPS_PRUNED_ENTRIES(4)
FPS_PRUNED_ENTRIES(8)
// portable fallback for 65k..131k-point clouds where 16-CTA clusters are refused: 32 points per
// thread spill part of the arrays to local memory, touched only by the warps that update
FPS_PRUNED_ENTRY(8, 32)
FPS_PRUNED_RUNTIME_ENTRY(4)
FPS_PRUNED_RUNTIME_ENTRY(8)
FPS_PRUNED_RUNTIME_ENTRY(16)

// -------------------------------------------------------------------------------------------------
// fps_tile_*: pruned FPS with each CTA's share of the (Morton-sorted) cloud in shared memory.
//
// Late in a farthest point sampling almost every region is already close to a sample, so the
// work per step is tiny (on KITTI, 2% of 32-point groups change per step for F1, 0.5% for F2)
// and the step is pure latency. This kernel is built around that:
//   * one CTA holds up to 16,384 sorted points: coordinates in shared memory (SoA), running
//     min-distances and original indices in registers, 32 slots per lane; a "group" is 32
//     consecutive sorted points (one slot of one warp, one point per lane) with a bounding box;
//     groups are dealt round-robin to the 16 warps so the groups around a new sample, which are
//     neighbours on the Morton curve, are updated by different warps in parallel;
//   * lane j of a warp holds the box and the current maximum min-distance of the warp's group j,
//     so one box test per lane and a ballot tell the warp which groups can change; only those are
//     updated (the update is exact: rounding is monotone, see MODE_PRUNED above), each followed by
//     a redux.sync max for the group's new maximum;
//   * a warp whose groups did not change republishes its cached record (max, lowest original
//     index, coordinates); records are (distance bits, index) pairs compared as integers: the
//     distances are >= 0 floats, so their bit patterns order like the values; ties -> lowest index;
//   * one exchange per step: C == 1, a __syncthreads over double-buffered records; C > 1 (a
//     cluster of C CTAs shares a cloud), each warp writes its record into every CTA's shared
//     memory, then either one cluster barrier (fps_tile_c*) or, fps_tile_async_c*, st.async stores
//     that complete-tx on the receiver's mbarrier: no barrier at all, each warp waits until the
//     C * 16 records of the step have landed locally. Then every warp reduces the records itself
//     (two redux.sync) and reads the winner's coordinates: no global memory on the step's path.
// Double buffering by step parity makes one exchange per step safe: a record slot is rewritten
// two steps later, and nobody can get there before everyone finished reading it (a CTA needs the
// records of step s + 1 from every warp before it computes step s + 2, and each warp sends its
// step s + 1 record only after reading the step s records).
#define TILE_WARPS 16
#define TILE_THREADS (TILE_WARPS * 32)
#define TILE_SLOTS 32                                  // groups per warp: one box per lane
#define TILE_CAP (TILE_WARPS * TILE_SLOTS * 32)        // 16,384 points per CTA
#define TILE_MAX_C 8
#define TILE_RECORDS (TILE_MAX_C * TILE_WARPS)         // records per step: one per warp of the cluster
#define TILE_RECORD_BYTES 24                           // int2 key + float4 coordinates
#define EXCH_BAR 0
#define EXCH_ASYNC 1

__device__ __forceinline__ int redux_max_s32(int v) {
  int r;
  asm volatile("redux.sync.max.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}

__device__ __forceinline__ unsigned redux_min_u32(unsigned v) {
  unsigned r;
  asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}

__device__ __forceinline__ void store_cluster_v2(unsigned addr, int a, unsigned b) {
  asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(a), "r"(b) : "memory");
}

__device__ __forceinline__ void store_cluster_v4(unsigned addr, float x, float y, float z) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(x), "f"(y), "f"(z), "f"(0.f)
               : "memory");
}

__device__ __forceinline__ void store_shared_v2(unsigned addr, int a, unsigned b) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(a), "r"(b) : "memory");
}

__device__ __forceinline__ void store_shared_v4(unsigned addr, float x, float y, float z, float w = 0.f) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}

__device__ __forceinline__ int2 load_shared_v2(unsigned addr) {
  int2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ float4 load_shared_v4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ void store_async_v2(unsigned addr, int a, unsigned b, unsigned mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.u32 [%0], {%1, %2}, [%3];" ::"r"(addr),
               "r"(a), "r"(b), "r"(mbar)
               : "memory");
}

__device__ __forceinline__ void store_async_v4(unsigned addr, float x, float y, float z, unsigned mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   addr),
               "f"(x), "f"(y), "f"(z), "f"(0.f), "r"(mbar)
               : "memory");
}

__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned addr, unsigned bytes) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.relaxed.cluster.shared::cta.b64 st, [%0], %1; }" ::"r"(addr),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(unsigned addr, unsigned parity) {
  unsigned done;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(addr), "r"(parity)
      : "memory");
  return done != 0;
}

// warp reductions: redux.sync (one instruction) or, TILE_SHFL variants, a 5-round shuffle tree
template <bool SHFL>
__device__ __forceinline__ int tile_max(int v) {
  if constexpr (SHFL) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
  } else {
    return redux_max_s32(v);
  }
}

template <bool SHFL>
__device__ __forceinline__ unsigned tile_min(unsigned v) {
  if constexpr (SHFL) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
  } else {
    return redux_min_u32(v);
  }
}

#define TILE_SHFL 1    // OPT bit: shuffle-tree warp reductions instead of redux.sync
#define TILE_UNROLL 2  // OPT bit: unrolled predicated loops over the 32 slots instead of switch jumps
#define TILE_LEADER 4  // OPT bit (one CTA): warp 0 alone reduces the records, a second __syncthreads

#define TILE_CASES(X)                                                                                              \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19)    \
  X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)
#define TILE_CASES_HI(X)                                                                                           \
  X(32) X(33) X(34) X(35) X(36) X(37) X(38) X(39) X(40) X(41) X(42) X(43) X(44) X(45) X(46) X(47) X(48) X(49)      \
  X(50) X(51) X(52) X(53) X(54) X(55) X(56) X(57) X(58) X(59) X(60) X(61) X(62) X(63)

// slot j of warp w, lane l: CTA-local sorted position ((j * W + w) * 32 + l), W warps per CTA
#define TILE_Q(J) (((J) * W + warp) * 32 + lane)

// update group J (warp-uniform): new min-distances, the chosen point leaves, the group's new max
#define TILE_UPDATE(J)                                                                        \
  {                                                                                           \
    const int q = TILE_Q(J);                                                                  \
    float m = fminf(md[J], sq_dist(xs[q], ys[q], zs[q], cx, cy, cz));                         \
    m = TILE_OI(J) == sel ? -1.f : m;                                                         \
    md[J] = m;                                                                                \
    const int gm = tile_max<SHFL>(__float_as_int(m));                                         \
    if (lane == ((J) & 31)) gmax[(J) >> 5] = __int_as_float(gm);                              \
  }
#define TILE_UPDATE_CASE(J) \
  case J:                   \
    TILE_UPDATE(J) break;

// the lowest original index among this lane's points of group J holding the warp's max
#define TILE_PICK(J)                                                 \
  {                                                                  \
    if (__float_as_int(md[J]) == rd && TILE_OI(J) < cand) {          \
      cand = TILE_OI(J);                                             \
      cq = ((J) * W + warp) * 32 + lane;                             \
    }                                                                \
  }
// original index of slot J: PACK (one CTA, 64 slots) keeps two 16-bit indices per register
#define TILE_OI(J) (PACK ? ((oi[(J) >> 1] >> (((J) & 1) * 16)) & 0xFFFFu) : oi[J])

#define TILE_PICK_CASE(J) \
  case J:                 \
    TILE_PICK(J) break;

// points: (B, N, 3) float32; order: (B * N) int64, flat indices b * N + i sorted by cloud, then
// Morton code (valid points first: fps_morton_keys + one stable 1-D sort); lengths, starts: (B,)
// int64; out: (B, M) int64 pre-filled with -1; cap: floats per coordinate array in the dynamic shared
// memory (>= ceil(N / C) rounded up to 32). Grid (C, B), TILE_THREADS threads, cluster (C, 1, 1).
template <int C, int EXCH, int OPT, int W, int G>
__device__ __forceinline__ void fps_tile(const float* __restrict__ points, const long long* __restrict__ order,
                                         const long long* __restrict__ lengths,
                                         const long long* __restrict__ starts, long long* __restrict__ out, int n,
                                         int num_samples, int cap) {
  extern __shared__ float tile_smem[];  // xs[cap], ys[cap], zs[cap]
  __shared__ int2 tkey[2][TILE_RECORDS];    // (distance bits, original index) by parity, record
  __shared__ float4 tcrd[2][TILE_RECORDS];  // the record's coordinates
  __shared__ unsigned long long tbar[2];    // EXCH_ASYNC: one mbarrier per parity
  static_assert(W >= 1 && W <= TILE_WARPS && C * W <= TILE_RECORDS, "records per step");
  static_assert(G == 1 || G == 2, "groups per lane");
  constexpr int SLOTS = 32 * G;  // points per lane; lane l holds the boxes of slots l + 32 g
  constexpr int R = C * W;
  constexpr bool SHFL = (OPT & TILE_SHFL) != 0;
  constexpr bool UNROLL = (OPT & TILE_UNROLL) != 0;
  constexpr bool LEADER = (OPT & TILE_LEADER) != 0;
  static_assert(!LEADER || C == 1, "the leader reduction is for one CTA");
  __shared__ float4 tcent;  // TILE_LEADER: the new sample (coordinates, index bits)
  float* xs = tile_smem;
  float* ys = tile_smem + cap;
  float* zs = tile_smem + 2 * cap;
  const unsigned rank = C > 1 ? cluster_rank() : 0u;
  const long long b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int length = (int)min(max(lengths[b], 0LL), (long long)n);
  const long long start = starts[b];
  const int steps = (start >= 0 && start < length) ? min(length, num_samples) : 0;
  const int share = (length + C - 1) / C;
  const int lo = (int)rank * share;
  const int cnt = max(0, min(lo + share, length) - lo);

  const long long* ord = order + b * (long long)n + lo;  // flat indices of this CTA's sorted points
  for (int q = tid; q < cap; q += W * 32) {
    const bool valid = q < cnt;
    const float* src = points + 3 * (valid ? ord[q] : 0LL);
    xs[q] = valid ? src[0] : 0.f;
    ys[q] = valid ? src[1] : 0.f;
    zs[q] = valid ? src[2] : 0.f;
  }
  float md[SLOTS];
  // PACK: one CTA holds the whole cloud (N <= 16,384), so original indices fit 16 bits (0xFFFF: none)
  constexpr bool PACK = C == 1 && G == 2;
  unsigned oi[SLOTS];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    const int q = TILE_Q(j);
    const bool valid = q < cnt;
    md[j] = valid ? __int_as_float(0x7f800000) : -1.f;  // -1: padding, later the chosen points
    const unsigned index = valid ? (unsigned)(ord[q] - b * (long long)n) : 0xFFFFFFFFu;
    if constexpr (PACK) {
      if (j & 1) oi[j >> 1] |= (index & 0xFFFFu) << 16;
      else oi[j >> 1] = index & 0xFFFFu;
    } else {
      oi[j] = index;
    }
  }
  if (EXCH == EXCH_ASYNC && tid == 0) {
    mbar_init(shared_address(&tbar[0]), 1);
    mbar_init(shared_address(&tbar[1]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // lane l: the boxes of this warp's groups (slots) l + 32 g (+-inf for an empty group, which then
  // never updates) and their largest min-distances
  float blx[G], bly[G], blz[G], bhx[G], bhy[G], bhz[G], gmax[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    blx[g] = bly[g] = blz[g] = __int_as_float(0x7f800000);
    bhx[g] = bhy[g] = bhz[g] = __int_as_float(0xff800000);
    const int q0 = ((lane + 32 * g) * W + warp) * 32;
    for (int t = 0; t < 32; ++t) {
      const int q = q0 + t;
      if (q < cnt) {
        blx[g] = fminf(blx[g], xs[q]);
        bly[g] = fminf(bly[g], ys[q]);
        blz[g] = fminf(blz[g], zs[q]);
        bhx[g] = fmaxf(bhx[g], xs[q]);
        bhy[g] = fmaxf(bhy[g], ys[q]);
        bhz[g] = fmaxf(bhz[g], zs[q]);
      }
    }
    gmax[g] = q0 < cnt ? __int_as_float(0x7f800000) : -1.f;
  }
  if (C > 1) cluster_sync();  // every CTA runs (and its mbarriers are initialised) before remote stores

  unsigned sel = (unsigned)start;
  float cx = 0.f, cy = 0.f, cz = 0.f;
  if (steps > 0) {
    const float* p = points + (b * (long long)n + start) * 3;
    cx = p[0];
    cy = p[1];
    cz = p[2];
  }
  // this warp's record (warp-uniform): max min-distance bits (< 0: none), lowest original index, coordinates
  int rd = -1;
  unsigned ri = 0xFFFFFFFFu;
  float rx = 0.f, ry = 0.f, rz = 0.f;
  bool dead = false;  // EXCH_ASYNC watchdog: a wait that never ends gives garbage, not a hang
  const unsigned key_base = shared_address(&tkey[0][0]);
  const unsigned crd_base = shared_address(&tcrd[0][0]);
  const unsigned bar_base = shared_address(&tbar[0]);
  const unsigned cent_addr = shared_address(&tcent);
  long long pending = start;  // warp 0 of rank 0: the index of step (s & ~31) + lane
  for (int s = 1; s < steps; ++s) {
    const int parity = s & 1;
    // 1. which groups can change: box distance to the new sample <= the group's max min-distance
    unsigned need[G];
    bool changed = false;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float gx = fmaxf(fmaxf(__fsub_rn(blx[g], cx), __fsub_rn(cx, bhx[g])), 0.f);
      const float gy = fmaxf(fmaxf(__fsub_rn(bly[g], cy), __fsub_rn(cy, bhy[g])), 0.f);
      const float gz = fmaxf(fmaxf(__fsub_rn(blz[g], cz), __fsub_rn(cz, bhz[g])), 0.f);
      const float lower = __fadd_rn(__fadd_rn(__fmul_rn(gx, gx), __fmul_rn(gy, gy)), __fmul_rn(gz, gz));
      need[g] = __ballot_sync(FULL_MASK, !(lower > gmax[g]));
      changed |= need[g] != 0u;
    }
    if constexpr (UNROLL) {
#pragma unroll
      for (int j = 0; j < SLOTS; ++j) {
        if (need[j >> 5] & (1u << (j & 31))) TILE_UPDATE(j)
      }
    } else {
      while (need[0]) {
        const int j = __ffs(need[0]) - 1;
        need[0] &= need[0] - 1u;
        switch (j) { TILE_CASES(TILE_UPDATE_CASE) }
      }
      if constexpr (G == 2) {
        while (need[G - 1]) {
          const int j = 32 + __ffs(need[G - 1]) - 1;
          need[G - 1] &= need[G - 1] - 1u;
          switch (j) { TILE_CASES_HI(TILE_UPDATE_CASE) }
        }
      }
    }
    // 2. the warp's record, recomputed only if one of its groups changed
    if (changed) {
      int lane_max = __float_as_int(gmax[0]);
#pragma unroll
      for (int g = 1; g < G; ++g) lane_max = max(lane_max, __float_as_int(gmax[g]));
      rd = tile_max<SHFL>(lane_max);
      ri = 0xFFFFFFFFu;
      if (rd >= 0) {
        unsigned cand = 0xFFFFFFFFu;
        int cq = 0;
        unsigned holders[G];  // groups holding the max
#pragma unroll
        for (int g = 0; g < G; ++g) holders[g] = __ballot_sync(FULL_MASK, __float_as_int(gmax[g]) == rd);
        if constexpr (UNROLL) {
#pragma unroll
          for (int j = 0; j < SLOTS; ++j) {
            if (holders[j >> 5] & (1u << (j & 31))) TILE_PICK(j)
          }
        } else {
          while (holders[0]) {
            const int j = __ffs(holders[0]) - 1;
            holders[0] &= holders[0] - 1u;
            switch (j) { TILE_CASES(TILE_PICK_CASE) }
          }
          if constexpr (G == 2) {
            while (holders[G - 1]) {
              const int j = 32 + __ffs(holders[G - 1]) - 1;
              holders[G - 1] &= holders[G - 1] - 1u;
              switch (j) { TILE_CASES_HI(TILE_PICK_CASE) }
            }
          }
        }
        // every lane loads its candidate's coordinates while the index is reduced (latency hidden)
        const float lx = xs[cq], ly = ys[cq], lz = zs[cq];
        ri = tile_min<SHFL>(cand);  // original indices are distinct: one lane holds it
        const int from = __ffs(__ballot_sync(FULL_MASK, cand == ri)) - 1;
        rx = __shfl_sync(FULL_MASK, lx, from);
        ry = __shfl_sync(FULL_MASK, ly, from);
        rz = __shfl_sync(FULL_MASK, lz, from);
      }
    }
    // 3. exchange the records of the step (shared addresses precomputed: no per-step address maths)
    const unsigned key_par = key_base + (unsigned)parity * (TILE_RECORDS * 8);
    const unsigned crd_par = crd_base + (unsigned)parity * (TILE_RECORDS * 16);
    if constexpr (C == 1) {
      if (lane == 0) {
        store_shared_v2(key_par + (unsigned)warp * 8u, rd, ri);
        store_shared_v4(crd_par + (unsigned)warp * 16u, rx, ry, rz);
      }
      __syncthreads();
    } else {
      const unsigned slot = rank * W + (unsigned)warp;
      const unsigned key_addr = key_par + slot * 8u;
      const unsigned crd_addr = crd_par + slot * 16u;
      if constexpr (EXCH == EXCH_BAR) {
        if (lane < C) {
          store_cluster_v2(map_to_rank(key_addr, (unsigned)lane), rd, ri);
          store_cluster_v4(map_to_rank(crd_addr, (unsigned)lane), rx, ry, rz);
        }
        cluster_sync();
      } else {
        const unsigned bar = bar_base + (unsigned)parity * 8u;
        if (tid == 0) mbar_arrive_expect_tx(bar, R * TILE_RECORD_BYTES);
        if (lane < C) {
          const unsigned remote_bar = map_to_rank(bar, (unsigned)lane);
          store_async_v2(map_to_rank(key_addr, (unsigned)lane), rd, ri, remote_bar);
          store_async_v4(map_to_rank(crd_addr, (unsigned)lane), rx, ry, rz, remote_bar);
        }
        // the k-th use of this parity's mbarrier completes its phase k (parity k & 1)
        const unsigned phase = (unsigned)((s - 1) >> 1) & 1u;
        if (!dead && !mbar_try_wait(bar, phase)) {
          const long long t0 = clock64();
          while (!mbar_try_wait(bar, phase)) {
            if (clock64() - t0 > (1LL << 31)) {  // ~1 s: give up waiting (wrong indices, no hang)
              dead = true;
              break;
            }
          }
        }
      }
    }
    // 4. every warp (TILE_LEADER: warp 0, which then shares the result through shared memory after a
    // second __syncthreads) reduces the R records: the largest distance, then the lowest index
    if (!LEADER || warp == 0) {
      int bd = -2147483647 - 1;
      unsigned bi = 0xFFFFFFFFu;
      int br = 0;
#pragma unroll
      for (int t = 0; t < (R + 31) / 32; ++t) {
        const int r = lane + 32 * t;
        if (r < R) {
          const int2 k = load_shared_v2(key_par + (unsigned)r * 8u);
          if (k.x > bd || (k.x == bd && (unsigned)k.y < bi)) {
            bd = k.x;
            bi = (unsigned)k.y;
            br = r;
          }
        }
      }
      const float4 mine = load_shared_v4(crd_par + (unsigned)br * 16u);  // loaded while the reductions run
      const int gd = tile_max<SHFL>(bd);
      const unsigned c = bd == gd ? bi : 0xFFFFFFFFu;
      sel = tile_min<SHFL>(c);
      const int from = __ffs(__ballot_sync(FULL_MASK, c == sel)) - 1;
      cx = __shfl_sync(FULL_MASK, mine.x, from);
      cy = __shfl_sync(FULL_MASK, mine.y, from);
      cz = __shfl_sync(FULL_MASK, mine.z, from);
      if (LEADER && lane == 0) store_shared_v4(cent_addr, cx, cy, cz, __uint_as_float(sel));
    }
    if constexpr (LEADER) {
      // one buffer is enough: warp 0 rewrites it after the next step's first barrier, which every
      // warp reaches only after reading it
      __syncthreads();
      const float4 centre = load_shared_v4(cent_addr);
      cx = centre.x;
      cy = centre.y;
      cz = centre.z;
      sel = __float_as_uint(centre.w);
    }
    // the indices leave in coalesced batches of 32 (lane l of warp 0 keeps step s0 + l): a global
    // store every step would make the release fence of the next cluster barrier wait for it
    if (rank == 0 && warp == 0) {
      if (lane == (s & 31)) pending = sel;
      if ((s & 31) == 31 || s == steps - 1) {
        if (lane <= (s & 31)) out[b * num_samples + (s & ~31) + lane] = pending;
      }
    }
  }
  if (steps == 1 && rank == 0 && tid == 0) out[b * num_samples] = start;
  if (C > 1) cluster_sync();  // no CTA exits while others may still write to its shared memory
}

// entry points: fps_tile[_async][_shfl|_unroll|_shfl_unroll]_c{C} (bar exchange only with the default OPT)
#define FPS_TILE_CLUSTER_1
#define FPS_TILE_CLUSTER_2 __cluster_dims__(2, 1, 1)
#define FPS_TILE_CLUSTER_4 __cluster_dims__(4, 1, 1)
#define FPS_TILE_CLUSTER_8 __cluster_dims__(8, 1, 1)
#define FPS_TILE_ENTRY_WG(NAME, C, EXCH, OPT, W, G)                                                              \
  extern "C" __global__ void __launch_bounds__(W * 32, 1) FPS_TILE_CLUSTER_##C                                  \
      NAME(const float* points, const long long* order, const long long* lengths, const long long* starts,       \
           long long* out, int n, int num_samples, int cap) {                                                    \
    fps_tile<C, EXCH, OPT, W, G>(points, order, lengths, starts, out, n, num_samples, cap);                      \
  }
#define FPS_TILE_ENTRY_W(NAME, C, EXCH, OPT, W) FPS_TILE_ENTRY_WG(NAME, C, EXCH, OPT, W, 1)
#define FPS_TILE_ENTRY(NAME, C, EXCH, OPT) FPS_TILE_ENTRY_W(NAME, C, EXCH, OPT, TILE_WARPS)
#define FPS_TILE_OPTS(PREFIX, C, EXCH)                                 \
  FPS_TILE_ENTRY(PREFIX##_c##C, C, EXCH, 0)                            \
  FPS_TILE_ENTRY(PREFIX##_shfl_c##C, C, EXCH, TILE_SHFL)               \
  FPS_TILE_ENTRY(PREFIX##_unroll_c##C, C, EXCH, TILE_UNROLL)           \
  FPS_TILE_ENTRY(PREFIX##_shfl_unroll_c##C, C, EXCH, TILE_SHFL | TILE_UNROLL)

// one CTA (no cluster): the exchange is a __syncthreads
FPS_TILE_OPTS(fps_tile, 1, EXCH_BAR)
FPS_TILE_ENTRY(fps_tile_leader_c1, 1, EXCH_BAR, TILE_LEADER)
FPS_TILE_ENTRY(fps_tile_shfl_leader_c1, 1, EXCH_BAR, TILE_SHFL | TILE_LEADER)
FPS_TILE_ENTRY(fps_tile_c2, 2, EXCH_BAR, 0)
FPS_TILE_ENTRY(fps_tile_c4, 4, EXCH_BAR, 0)
FPS_TILE_ENTRY(fps_tile_c8, 8, EXCH_BAR, 0)
FPS_TILE_OPTS(fps_tile_async, 2, EXCH_ASYNC)
FPS_TILE_OPTS(fps_tile_async, 4, EXCH_ASYNC)
FPS_TILE_OPTS(fps_tile_async, 8, EXCH_ASYNC)
// fewer warps per CTA (W * 1,024 points), more CTAs per cloud: the same 16 records per step for
// 16,384 points, a quarter or half of the per-step instructions on each SM
FPS_TILE_ENTRY_W(fps_tile_w8_c2, 2, EXCH_BAR, 0, 8)
FPS_TILE_ENTRY_W(fps_tile_async_w8_c2, 2, EXCH_ASYNC, 0, 8)
FPS_TILE_ENTRY_W(fps_tile_w4_c4, 4, EXCH_BAR, 0, 4)
FPS_TILE_ENTRY_W(fps_tile_async_w4_c4, 4, EXCH_ASYNC, 0, 4)
// 8 warps of 64 points per lane (two boxes per lane, 16-bit original indices): 16,384 points in
// one CTA with half the warps
FPS_TILE_ENTRY_WG(fps_tile_w8g2_c1, 1, EXCH_BAR, 0, 8, 2)
FPS_TILE_ENTRY_WG(fps_tile_shfl_w8g2_c1, 1, EXCH_BAR, TILE_SHFL, 8, 2)
FPS_TILE_ENTRY_WG(fps_tile_leader_w8g2_c1, 1, EXCH_BAR, TILE_LEADER, 8, 2)

// The fps_tile order in one kernel and one sort: keys (B * N) int64, key of point i of cloud b =
// (b << 32) | its 30-bit Morton code in the cloud's bounding box (10 bits per axis), 1 << 30 for
// padding (sorts after every valid point). One CTA per cloud: a bounding-box pass, then the codes.
__device__ __forceinline__ unsigned spread_bits(unsigned v) {  // 10 bits -> every third bit
  v = (v | (v << 16)) & 0x030000FFu;
  v = (v | (v << 8)) & 0x0300F00Fu;
  v = (v | (v << 4)) & 0x030C30C3u;
  v = (v | (v << 2)) & 0x09249249u;
  return v;
}

// K = long long: key (b << 32) | code, 10 bits per axis, padding 1 << 30. K = int (fps_morton_keys32,
// for a sort of half the passes): key (b << (3 bits + 1)) | padding << 3 bits | code, `bits` per axis
// (chosen by the launcher so that the key fits 31 bits: bits = min(10, (30 - batch bits) / 3)).
template <typename K>
__device__ __forceinline__ void morton_keys(const float* __restrict__ points, const long long* __restrict__ lengths,
                                            K* __restrict__ keys, int n, int bits) {
  __shared__ float partial[6][32];
  __shared__ float box[6];
  const long long b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int length = (int)min(max(lengths[b], 0LL), (long long)n);
  const float* p = points + b * (long long)n * 3;
  float v[6] = {__int_as_float(0x7f800000), __int_as_float(0x7f800000), __int_as_float(0x7f800000),
                __int_as_float(0xff800000), __int_as_float(0xff800000), __int_as_float(0xff800000)};
  for (int i = tid; i < length; i += blockDim.x) {
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const float c = p[3 * i + a];
      v[a] = fminf(v[a], c);
      v[3 + a] = fmaxf(v[3 + a], c);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      v[a] = fminf(v[a], __shfl_xor_sync(FULL_MASK, v[a], o));
      v[3 + a] = fmaxf(v[3 + a], __shfl_xor_sync(FULL_MASK, v[3 + a], o));
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int a = 0; a < 6; ++a) partial[a][warp] = v[a];
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (int)(blockDim.x >> 5);
#pragma unroll
    for (int a = 0; a < 6; ++a) {
      float w = lane < warps ? partial[a][lane] : v[a];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float t = __shfl_xor_sync(FULL_MASK, w, o);
        w = a < 3 ? fminf(w, t) : fmaxf(w, t);
      }
      if (lane == 0) box[a] = w;
    }
  }
  __syncthreads();
  float lo[3], scale[3];
  const float top = (float)((1 << bits) - 1);
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    lo[a] = box[a];
    scale[a] = top / fmaxf(box[3 + a] - box[a], 1e-6f);  // NaN (empty cloud) -> 1e-6
  }
  const K high = (K)b << (sizeof(K) == 8 ? 32 : 3 * bits + 1);  // above the padding bit 1 << (3 bits)
  for (int i = tid; i < n; i += blockDim.x) {
    unsigned code = 1u << (3 * bits);
    if (i < length) {
      code = 0u;
#pragma unroll
      for (int a = 0; a < 3; ++a) {
        const float t = fminf(fmaxf((p[3 * i + a] - lo[a]) * scale[a], 0.f), top);  // NaN -> 0
        code |= spread_bits((unsigned)t) << a;
      }
    }
    keys[b * (long long)n + i] = high | (K)code;
  }
}

extern "C" __global__ void __launch_bounds__(1024)
    fps_morton_keys(const float* __restrict__ points, const long long* __restrict__ lengths,
                    long long* __restrict__ keys, int n) {
  morton_keys<long long>(points, lengths, keys, n, 10);
}

extern "C" __global__ void __launch_bounds__(1024)
    fps_morton_keys32(const float* __restrict__ points, const long long* __restrict__ lengths,
                      int* __restrict__ keys, int n, int bits) {
  morton_keys<int>(points, lengths, keys, n, bits);
}

// -------------------------------------------------------------------------------------------------
// fps_probe: latencies of the instructions on the fps_tile step's path, for the benchmark's notes
// (cycles per dependent operation, thread 0's clock64; and the SM clock from %globaltimer).
// out (16,) int64: [0] redux.sync chain, [1] shfl chain, [2] ballot chain, [3] shared-load chain,
// [4] __syncthreads loop (all threads of the CTA), [5] switch jump chain, [6] cluster barrier loop
// (cluster launches only, else 0), [7] kHz of the SM clock. Loops are not unrolled: each figure
// includes about 2 cycles of loop control.
#define PROBE_ITERS 4096

__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int CLUSTER>
__device__ __forceinline__ void fps_probe_body(long long* out) {
  __shared__ int chain[1024];
  const int tid = threadIdx.x, lane = tid & 31;
  for (int i = tid; i < 1024; i += blockDim.x) chain[i] = (i * 37 + 11) & 1023;
  __syncthreads();
  const long long g0 = global_ns(), c0 = clock64();
  int v = lane;
  long long t = clock64();
#pragma unroll 1
  for (int i = 0; i < PROBE_ITERS; ++i) v = redux_max_s32(v) + 1;
  const long long r0 = clock64() - t;
  v += lane;  // lane-varying: the shuffles cannot be folded
  t = clock64();
#pragma unroll 1
  for (int i = 0; i < PROBE_ITERS; ++i) v = __shfl_xor_sync(FULL_MASK, v, 1) + 1;
  const long long r1 = clock64() - t;
  t = clock64();
#pragma unroll 1
  for (int i = 0; i < PROBE_ITERS; ++i) v = (int)__ballot_sync(FULL_MASK, (v & 1) != 0) + lane;
  const long long r2 = clock64() - t;
  int idx = lane;
  t = clock64();
#pragma unroll 1
  for (int i = 0; i < PROBE_ITERS; ++i) idx = chain[idx];
  const long long r3 = clock64() - t;
  t = clock64();
#pragma unroll 1
  for (int i = 0; i < PROBE_ITERS; ++i) __syncthreads();
  const long long r4 = clock64() - t;
  // a warp-uniform switch over a register array, as fps_tile's slot updates
  float arr[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) arr[j] = (float)(j + lane);
  int w = redux_max_s32(v) & 31;
  t = clock64();
#pragma unroll 1
  for (int i = 0; i < PROBE_ITERS; ++i) {
    switch (w) {
#define PROBE_CASE(J)                           \
  case J:                                       \
    arr[J] = __fadd_rn(arr[J], 1.f);            \
    w = (w * 7 + (J ^ 5) + 1) & 31;             \
    break;
      TILE_CASES(PROBE_CASE)
#undef PROBE_CASE
    }
  }
  const long long r5 = clock64() - t;
  long long r6 = 0;
  if (CLUSTER) {
    t = clock64();
#pragma unroll 1
    for (int i = 0; i < PROBE_ITERS; ++i) cluster_sync();
    r6 = clock64() - t;
  }
  float f = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) f = __fadd_rn(f, arr[j]);
  const long long g1 = global_ns(), c1 = clock64();
  if (tid == 0 && blockIdx.x == 0) {
    out[0] = r0 / PROBE_ITERS;
    out[1] = r1 / PROBE_ITERS;
    out[2] = r2 / PROBE_ITERS;
    out[3] = r3 / PROBE_ITERS;
    out[4] = r4 / PROBE_ITERS;
    out[5] = r5 / PROBE_ITERS;
    out[6] = r6 / PROBE_ITERS;
    out[7] = g1 > g0 ? (c1 - c0) * 1000000LL / (g1 - g0) : 0;
    out[8] = (long long)v + (long long)f + idx + w;  // keeps the chains alive
  }
}

extern "C" __global__ void __launch_bounds__(512, 1) fps_probe(long long* out) { fps_probe_body<0>(out); }
extern "C" __global__ void __launch_bounds__(512, 1) __cluster_dims__(2, 1, 1) fps_probe_c2(long long* out) {
  fps_probe_body<1>(out);
}

// -------------------------------------------------------------------------------------------------
// fps_tile_md[_e]_u{U}_c{C}: fps_tile with a short step (one CTA per cloud of <= 16,384 points;
// clusters of C CTAs, "_e_" only, for larger clouds).
//
// Where fps_tile's step goes (H200, F1: 1.0 us = 1,980 cycles late, 1.63 us early; fps_probe
// latencies; SASS of fps_tile_c1): its min-distances live in registers, md[32] per lane, so every
// access to a group picked at run time is a 32-way switch, an indirect jump (BRX, 211 cycles, 30 of
// them in a 4,700-instruction kernel), and every group update ends in a redux.sync (63) whose result
// the next jump waits for: ~330 cycles per updated group on the busiest warp; the record rebuild
// jumps again (pick) and costs redux max + ballot + jump + shared loads + redux min + ballot + shfl
// (~500); then __syncthreads (~60) and the reduction of the 16 records (2 loads, redux max, redux
// min, ballot, 3 shfl: ~270). Roughly 60 (box test) + 330 k + 500 + 60 + 270 = ~900 + 330 k cycles
// for k updated groups on the busiest warp: k ~ 3 late, ~5 early, hence 1.0 and 1.6 us. (The
// winner's coordinates never come from global memory there either: records carry them.)
// This kernel removes the jumps and most dependent pairs:
//   * the coordinates AND min-distances of the first S = 27 slots (13,824 points) are in shared
//     memory, one float4 (x, y, z, md) per point (221,184 B), at j * 512 + tid for slot j: one
//     16-byte load, no switch; the last 5 slots of each lane (2,560 points) stay in registers, read
//     and written with 5-way selects (16,384 points do not fit 227 KB at 16 B per point);
//   * needed groups are updated U at a time (the U loads issued together, U redux.sync in flight
//     together): a batch costs about one group's latency (~130 cycles);
//   * the warp record is (max bits, sorted position) + coordinates, written by the lane that holds
//     the point (no shuffles); fast path (one group holds the warp max, one lane in it): ballot +
//     one 16-byte load + ballot; ties (equal maxima) take a slow path reading original indices from
//     `order` (global; rare). "_e_": the warp max is max(redux of the groups that did not change,
//     issued before the updates, the updates' own redux results): no redux on the record's path;
//   * the reduction after the one __syncthreads: 16 records, redux max + ballot, then 4 shuffles
//     from the winning lane ("_e_": one broadcast 16-byte load of the winner's record);
//   * sorted positions are written to `out` during the run and turned into original indices after
//     the loop (no global load on the step's path).
// Expected "_e_" step (SASS, one batch on the busiest warp): box test ~70 + batch address/load/
// distance/redux ~145 + record (max, ballot, load, ballot, store) ~150 + barrier ~60 + reduction
// (load, redux, ballot, load) ~165 = ~600 cycles (0.30 us); each further batch ~130.
// Measured (H200, F1, whole op): u1 3.16 ms = 0.77 us (~1,500 cycles) per step against fps_tile's
// 1.04; u2 the same, u4 4.19 (duplicated groups in short batches cost: most warps update ~1 group
// per step late), _e_ no better, the leader warp no better, 8 or 4 warps (w8, w4: more boxes per
// lane) slower (3.68, 5.16: fewer warps hide less of the update batches' latency). So the step is
// ~600 cycles of dependent latency plus the busiest warp's extra batches and the SM's issue and
// redux.sync throughput (16 warps in lockstep); fps_tile_md_stats_u1_c1 counts the group updates
// per step (bench notes) to split the rest. Then (OPT below) "sk": shared addresses hoisted out of
// the step and records kept unless their group changed: kernel 2.465 ms against 2.865 for u1 (the
// default since; op 2.51 ms in a graph with 32-bit Morton keys). Same
// arguments, results and double buffering as fps_tile; grid (C, B), 512 threads, 16 * cap bytes of
// dynamic shared memory with cap = min(ceil(N / C) rounded up to 32, 13,824).
#define TMD_WARPS 16
#define TMD_SLOTS_SMEM 27
#define TMD_SLOTS_REG (TILE_SLOTS - TMD_SLOTS_SMEM)
#define TMD_SMEM_POINTS (TMD_SLOTS_SMEM * TMD_WARPS * 32)  // 13,824 points in shared memory

template <int R>
__device__ __forceinline__ float tmd_pick(const float (&a)[R], int r) {
  float v = a[0];
#pragma unroll
  for (int i = 1; i < R; ++i) v = r == i ? a[i] : v;
  return v;
}

// point q (slot j) of this lane: shared memory for j < S (one 16-byte load: x, y, z, min-distance),
// else register slot j - S. Split in two so that a batch issues all its loads before any branch.
// (point q = j * 32 W + tid; a register slot j >= S exists only when cap = S * 32 W, so the clamped
// address is valid: one min and one multiply-add before the load)
template <int S, int W>
__device__ __forceinline__ float4 tmd_fetch(int j, int tid, const float4* pts) {
  return pts[min(j, S - 1) * (W * 32) + tid];
}
template <int S, int R>
__device__ __forceinline__ void tmd_regs(int j, const float (&rx)[R], const float (&ry)[R], const float (&rz)[R],
                                         const float (&rm)[R], float4& v) {
  if (j >= S) {  // warp-uniform
    const int r = j - S;
    v.x = tmd_pick<R>(rx, r);
    v.y = tmd_pick<R>(ry, r);
    v.z = tmd_pick<R>(rz, r);
    v.w = tmd_pick<R>(rm, r);
  }
}

__device__ __forceinline__ void store_async_v4w(unsigned addr, float x, float y, float z, float w, unsigned mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   addr),
               "f"(x), "f"(y), "f"(z), "f"(w), "r"(mbar)
               : "memory");
}

// a set of a warp's slots (bit j % 32 of word j / 32: slot j), warp-uniform
template <int G>
struct SlotMask {
  unsigned m[G];
  __device__ __forceinline__ bool any() const {
    unsigned a = 0u;
#pragma unroll
    for (int g = 0; g < G; ++g) a |= m[g];
    return a != 0u;
  }
  __device__ __forceinline__ int count() const {
    int c = 0;
#pragma unroll
    for (int g = 0; g < G; ++g) c += __popc(m[g]);
    return c;
  }
  __device__ __forceinline__ bool single() const {
    int c = 0;
#pragma unroll
    for (int g = 0; g < G; ++g) c += __popc(m[g]);
    return c == 1;
  }
  // the lowest non-empty word and its first slot, by selects (no branches, no dynamic index)
  __device__ __forceinline__ void lowest(unsigned& w, int& base) const {
    w = 0u;
    base = 0;
#pragma unroll
    for (int g = G - 1; g >= 0; --g) {
      base = m[g] ? 32 * g : base;
      w = m[g] ? m[g] : w;
    }
  }
  __device__ __forceinline__ int first() const {  // the lowest slot, -1 if none
    unsigned w;
    int base;
    lowest(w, base);
    return base + __ffs(w) - 1;  // __ffs(0) = 0: -1
  }
  __device__ __forceinline__ int pop() {  // the lowest slot, removed; -1 if none
    unsigned w;
    int base;
    lowest(w, base);
#pragma unroll
    for (int g = 0; g < G; ++g) m[g] = base == 32 * g ? (m[g] & (m[g] - 1u)) : m[g];
    return w ? base + __ffs(w) - 1 : -1;
  }
};

// C > 1 (fps_tile_md_e_u<U>_c<C>, clouds over 16,384 points): a cluster of C CTAs shares the cloud as
// fps_tile_async does (CTA `rank` holds sorted positions lo .. lo + cnt - 1); records carry global
// sorted positions and are sent by their owner lane to every CTA with st.async completing on the
// receiver's mbarrier (no barrier), then every warp reduces the C * W records of the step.
// W warps of G = 16 / W boxes per lane (slots j = lane + 32 g; 13,824 points in shared memory either
// way: S = 432 / W shared slots, 32 G - S register slots per lane; W = 16, 8, 4). L (one CTA): warp 0 alone
// reduces the records and hands the new sample over through shared memory and a second
// __syncthreads (one redux instead of W on the step; fewer instructions per step on the SM).
// STATS (fps_tile_md_stats_u1_c1, a diagnostic): counters added to stats (8,) int64 at the end:
// [0] group updates, [1] update batches, [2] sum over steps and warps of (groups updated)^2,
// [3] record rebuilds, [4] record tie paths, [5] reduction tie paths, [6] steps (one CTA's),
// [7] warp-steps with no update.
template <int N>
struct TmdInt {
  static constexpr int value = N;
};

// OPT (bits; 0 for the entries compiled before): TMD_SADDR: the step's shared-memory accesses to the
// points use a 32-bit address computed once per thread before the loop (ptxas otherwise rebuilds the
// window address from SR_CgaCtaId, an S2UR, on each step's path); TMD_KEEP: the warp record is rebuilt
// only when the group holding the record's point was updated (every other point's min-distance only
// decreases, so an untouched record is still the warp's largest, ties included).
#define TMD_SADDR 1
#define TMD_KEEP 2
__device__ __forceinline__ unsigned pin_u32(unsigned v) {  // an opaque copy: not rematerialised in loops
  unsigned r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ void store_shared_f32(unsigned addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

template <int U, bool E, int C, int W, bool L, bool STATS = false, bool AD = false, int OPT = 0>
__device__ __forceinline__ void fps_tile_md(const float* __restrict__ points, const long long* __restrict__ order,
                                            const long long* __restrict__ lengths,
                                            const long long* __restrict__ starts, long long* __restrict__ out, int n,
                                            int num_samples, int cap, long long* __restrict__ stats = nullptr) {
  long long st_upd = 0, st_batch = 0, st_sq = 0, st_rec = 0, st_rtie = 0, st_ftie = 0, st_idle = 0;
  constexpr int G = TILE_WARPS / W, NSLOT = 32 * G, S = TMD_SMEM_POINTS / (W * 32), R = NSLOT - S, RR = C * W;
  static_assert(C == 1 || E, "clusters: the broadcast-load reduction only");
  static_assert(!L || C == 1, "the leader reduction is for one CTA");
  static_assert((W == 16 || W == 8 || W == 4) && S * W * 32 == TMD_SMEM_POINTS && R > 0 && R <= 20, "slot layout");
  extern __shared__ float4 tmd_smem[];  // (x, y, z, min-distance)[cap]
  __shared__ int2 mkey[2][RR];         // (max bits, global sorted position) by parity, record
  __shared__ float4 mcrd[2][RR];       // the record's coordinates (and the sorted position's bits)
  __shared__ unsigned long long mbar[2];  // C > 1: one mbarrier per parity
  __shared__ float4 mcent;             // L: the new sample (coordinates, sorted position bits)
  __shared__ int mstart;               // local sorted position of the start point, -1: another CTA's
  float4* pts = tmd_smem;
  const unsigned rank = C > 1 ? cluster_rank() : 0u;
  const long long b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int length = (int)min(max(lengths[b], 0LL), (long long)n);
  const long long start = starts[b];
  const int steps = (start >= 0 && start < length) ? min(length, num_samples) : 0;
  const int share = (length + C - 1) / C;
  const int lo = (int)rank * share;
  const int cnt = max(0, min(lo + share, length) - lo);
  const long long cloud = b * (long long)n;
  const long long* ord = order + cloud + lo;  // flat indices of this CTA's points in Morton order
  const float kInf = __int_as_float(0x7f800000);

  if (tid == 0) {
    mstart = -1;
    if (C > 1) {
      mbar_init(shared_address(&mbar[0]), 1);
      mbar_init(shared_address(&mbar[1]), 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  __syncthreads();
#pragma unroll 4
  for (int p = tid; p < cap; p += W * 32) {  // unrolled: 4 gathers in flight per thread
    const bool valid = p < cnt;
    const long long f = valid ? ord[p] : cloud;
    // -1: padding, later the chosen points
    pts[p] = valid ? make_float4(points[3 * f + 0], points[3 * f + 1], points[3 * f + 2], kInf)
                   : make_float4(0.f, 0.f, 0.f, -1.f);
    if (valid && f - cloud == start) mstart = p;
  }
  float rx[R], ry[R], rz[R], rm[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int q = (S + r) * (W * 32) + tid;
    const bool valid = q < cnt;
    const long long f = valid ? ord[q] : cloud;
    rx[r] = valid ? points[3 * f + 0] : 0.f;
    ry[r] = valid ? points[3 * f + 1] : 0.f;
    rz[r] = valid ? points[3 * f + 2] : 0.f;
    rm[r] = valid ? kInf : -1.f;
    if (valid && f - cloud == start) mstart = q;
  }
  __syncthreads();
  // lane l, box g: box and largest min-distance of this warp's slot j = l + 32 g (points j * 32 W +
  // 32 warp + 0..31); +-inf boxes for empty groups, which then never update
  float blx[G], bly[G], blz[G], bhx[G], bhy[G], bhz[G], gmax[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int j = lane + 32 * g;
    const int q0 = j * (W * 32) + warp * 32;
    blx[g] = bly[g] = blz[g] = kInf;
    bhx[g] = bhy[g] = bhz[g] = -kInf;
    if (j < S) {
      for (int t = 0; t < 32; ++t) {
        const int q = q0 + t;
        if (q < cnt) {
          const float4 v = pts[q];
          blx[g] = fminf(blx[g], v.x);
          bly[g] = fminf(bly[g], v.y);
          blz[g] = fminf(blz[g], v.z);
          bhx[g] = fmaxf(bhx[g], v.x);
          bhy[g] = fmaxf(bhy[g], v.y);
          bhz[g] = fmaxf(bhz[g], v.z);
        }
      }
    }
    gmax[g] = q0 < cnt ? kInf : -1.f;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {  // register slots: the box by warp reductions, kept by lane (S + r) % 32
    const bool valid = (S + r) * (W * 32) + tid < cnt;
    float v[6] = {valid ? rx[r] : kInf, valid ? ry[r] : kInf, valid ? rz[r] : kInf,
                  valid ? rx[r] : -kInf, valid ? ry[r] : -kInf, valid ? rz[r] : -kInf};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int a = 0; a < 3; ++a) {
        v[a] = fminf(v[a], __shfl_xor_sync(FULL_MASK, v[a], o));
        v[3 + a] = fmaxf(v[3 + a], __shfl_xor_sync(FULL_MASK, v[3 + a], o));
      }
    }
    constexpr int dummy = 0;
    (void)dummy;
    const int j = S + r, g = j >> 5;
    if (lane == (j & 31)) {
#pragma unroll
      for (int gg = 0; gg < G; ++gg) {
        if (gg == g) {
          blx[gg] = v[0];
          bly[gg] = v[1];
          blz[gg] = v[2];
          bhx[gg] = v[3];
          bhy[gg] = v[4];
          bhz[gg] = v[5];
        }
      }
    }
  }
  if (C > 1) cluster_sync();  // every CTA runs (and its mbarriers are initialised) before remote stores

  // selq: global sorted position of the newest sample (the start: only its CTA knows it, the others
  // hold -1, which matches none of their points)
  int selq = steps > 0 && mstart >= 0 ? lo + mstart : -1;
  float cx = 0.f, cy = 0.f, cz = 0.f;
  if (steps > 0) {
    const float* p = points + (cloud + start) * 3;
    cx = p[0];
    cy = p[1];
    cz = p[2];
  }
  // this warp's record: max bits (< 0: none, uniform), and, in the lane that holds the point
  // (`owner`; lane 0 when none), its global sorted position and coordinates
  int c_rd = -1, c_q = 0;
  float c_x = 0.f, c_y = 0.f, c_z = 0.f;
  bool owner = lane == 0;
  bool dead = false;  // C > 1 watchdog: a wait that never ends gives garbage, not a hang
  const unsigned key_base = shared_address(&mkey[0][0]);
  const unsigned crd_base = shared_address(&mcrd[0][0]);
  const unsigned bar_base = shared_address(&mbar[0]);
  const unsigned cent_addr = shared_address(&mcent);
  // TMD_SADDR: this thread's point of slot 0; slot j at + j * 16 * 32 W bytes
  const unsigned pts_lane = (OPT & TMD_SADDR) ? pin_u32(shared_address(pts) + (unsigned)tid * 16u) : 0u;
  auto fetch = [&](int j) -> float4 {
    if constexpr ((OPT & TMD_SADDR) != 0) {
      return load_shared_v4(pts_lane + (unsigned)min(j, S - 1) * (unsigned)(W * 32 * 16));
    } else {
      return tmd_fetch<S, W>(j, tid, pts);
    }
  };
  auto store_md = [&](int j, float v) {
    if constexpr ((OPT & TMD_SADDR) != 0) {
      store_shared_f32(pts_lane + (unsigned)j * (unsigned)(W * 32 * 16) + 12u, v);
    } else {
      pts[j * (W * 32) + tid].w = v;
    }
  };
  int rec_j = -1;  // TMD_KEEP: the slot of the record's point (warp-uniform), -1: rebuild when changed
  long long pending = start;  // rank 0, warp 0: step (s & ~31) + lane (sorted positions from step 1 on)
  for (int s = 1; s < steps; ++s) {
    const int parity = s & 1;
    const int sel = selq - lo;  // the newest sample's local position (none of ours if out of range)
    // 1. which of the warp's groups can change (bit j of `need`: slot j)
    SlotMask<G> need;
    int keep = -2147483647 - 1;  // E: this lane's largest max among its boxes that do not change
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float gx = fmaxf(fmaxf(__fsub_rn(blx[g], cx), __fsub_rn(cx, bhx[g])), 0.f);
      const float gy = fmaxf(fmaxf(__fsub_rn(bly[g], cy), __fsub_rn(cy, bhy[g])), 0.f);
      const float gz = fmaxf(fmaxf(__fsub_rn(blz[g], cz), __fsub_rn(cz, bhz[g])), 0.f);
      const float lower = __fadd_rn(__fadd_rn(__fmul_rn(gx, gx), __fmul_rn(gy, gy)), __fmul_rn(gz, gz));
      const bool upd_g = !(lower > gmax[g]);
      need.m[g] = __ballot_sync(FULL_MASK, upd_g);
      if (!upd_g) keep = max(keep, __float_as_int(gmax[g]));
    }
    const bool changed = need.any();
    const SlotMask<G> needed = need;  // TMD_KEEP: the batches below consume `need`
    if constexpr (STATS) {
      int k = 0;
#pragma unroll
      for (int g = 0; g < G; ++g) k += __popc(need.m[g]);
      st_upd += k;
      st_sq += (long long)k * k;
      st_batch += (k + U - 1) / U;
      st_rec += changed ? 1 : 0;
      st_idle += changed ? 0 : 1;
    }
    // E: the largest max of the groups that do not change, reduced while the others update; the
    // warp max is then one integer max away from the updates' redux results
    const int kept = E ? redux_max_s32(keep) : 0;
    int upd = -2147483647 - 1;  // E: the largest new maximum of the updated groups
    // 2. update them, U groups per batch (a short batch repeats its last group: same values)
    // (AD: batches of U while at least U groups remain, then one group at a time: no duplicated
    // work late in the sampling, when a warp updates about one group per step)
    auto batch = [&](auto uu) {
      constexpr int UB = decltype(uu)::value;
      int js[UB];
      js[0] = need.pop();
#pragma unroll
      for (int u = 1; u < UB; ++u) {
        const int j = need.pop();
        js[u] = j >= 0 ? j : js[u - 1];
      }
      float4 v[UB];
#pragma unroll
      for (int u = 0; u < UB; ++u) v[u] = fetch(js[u]);
#pragma unroll
      for (int u = 0; u < UB; ++u) tmd_regs<S, R>(js[u], rx, ry, rz, rm, v[u]);
      float nm[UB];
#pragma unroll
      for (int u = 0; u < UB; ++u) {
        const float m = fminf(v[u].w, sq_dist(v[u].x, v[u].y, v[u].z, cx, cy, cz));
        nm[u] = js[u] * (W * 32) + tid == sel ? -1.f : m;
      }
      int gm[UB];  // the groups' new maxima (issued before the stores, which are off the path)
#pragma unroll
      for (int u = 0; u < UB; ++u) gm[u] = redux_max_s32(__float_as_int(nm[u]));
#pragma unroll
      for (int u = 0; u < UB; ++u) {
        const int j = js[u];
        if (j < S) {
          store_md(j, nm[u]);
        } else {
#pragma unroll
          for (int r = 0; r < R; ++r) rm[r] = j - S == r ? nm[u] : rm[r];
        }
      }
#pragma unroll
      for (int u = 0; u < UB; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (js[u] == lane + 32 * g) gmax[g] = __int_as_float(gm[u]);
        }
        if (E) upd = max(upd, gm[u]);
      }
    };
    while (need.any()) {
      if constexpr (AD && U > 1) {
        if (need.count() >= U) {
          batch(TmdInt<U>{});
        } else {
          batch(TmdInt<1>{});
        }
      } else {
        batch(TmdInt<U>{});
      }
    }
    // 3. the warp's record, rebuilt only if one of its groups changed (TMD_KEEP: the record's)
    bool rebuild = changed;
    if constexpr ((OPT & TMD_KEEP) != 0) {
      if (rec_j >= 0) {
        unsigned word = needed.m[0];
#pragma unroll
        for (int g = 1; g < G; ++g) word = (rec_j >> 5) == g ? needed.m[g] : word;
        rebuild = ((word >> (rec_j & 31)) & 1u) != 0u;
      }
    }
    if (rebuild) {
      int lmax = __float_as_int(gmax[0]);
#pragma unroll
      for (int g = 1; g < G; ++g) lmax = max(lmax, __float_as_int(gmax[g]));
      const int rd = E ? max(kept, upd) : redux_max_s32(lmax);
      c_rd = rd;
      owner = lane == 0;
      rec_j = -1;
      if (rd >= 0) {
        SlotMask<G> holders;
#pragma unroll
        for (int g = 0; g < G; ++g) holders.m[g] = __ballot_sync(FULL_MASK, __float_as_int(gmax[g]) == rd);
        const int j = holders.first();
        const int q = j * (W * 32) + tid;
        float4 v = fetch(j);
        tmd_regs<S, R>(j, rx, ry, rz, rm, v);
        const unsigned hit = __ballot_sync(FULL_MASK, __float_as_int(v.w) == rd);
        if (holders.single() && (hit & (hit - 1u)) == 0u) {  // one point holds the max
          rec_j = j;
          owner = lane == __ffs(hit) - 1;
          c_q = lo + q;
          c_x = v.x;
          c_y = v.y;
          c_z = v.z;
        } else {  // ties: the lowest original index among the holders (from `order`, global)
          rec_j = -1;
          if (STATS) ++st_rtie;
          unsigned best = 0xFFFFFFFFu;
          SlotMask<G> h = holders;
          while (h.any()) {
            const int jj = h.pop();
            const int qq = jj * (W * 32) + tid;
            float4 vv = fetch(jj);
            tmd_regs<S, R>(jj, rx, ry, rz, rm, vv);
            if (__float_as_int(vv.w) == rd) {
              const unsigned oi = (unsigned)(ord[qq] - cloud);
              if (oi < best) {
                best = oi;
                c_q = lo + qq;
                c_x = vv.x;
                c_y = vv.y;
                c_z = vv.z;
              }
            }
          }
          const unsigned low = redux_min_u32(best);  // original indices are distinct: one lane
          owner = lane == __ffs(__ballot_sync(FULL_MASK, best == low)) - 1;
        }
      }
    }
    // 4. exchange: the owner lane publishes (C == 1: one __syncthreads; C > 1: st.async to every
    // CTA of the cluster, completing on its mbarrier); double buffered by parity
    const unsigned key_par = key_base + (unsigned)parity * (RR * 8);
    const unsigned crd_par = crd_base + (unsigned)parity * (RR * 16);
    const unsigned slot = rank * W + (unsigned)warp;
    if constexpr (C == 1) {
      if (owner) {
        store_shared_v2(key_par + slot * 8u, c_rd, (unsigned)c_q);
        store_shared_v4(crd_par + slot * 16u, c_x, c_y, c_z, __int_as_float(c_q));
      }
      __syncthreads();
    } else {
      const unsigned bar = bar_base + (unsigned)parity * 8u;
      if (tid == 0) mbar_arrive_expect_tx(bar, RR * TILE_RECORD_BYTES);
      if (owner) {
#pragma unroll
        for (int d = 0; d < C; ++d) {
          const unsigned remote_bar = map_to_rank(bar, (unsigned)d);
          store_async_v2(map_to_rank(key_par + slot * 8u, (unsigned)d), c_rd, (unsigned)c_q, remote_bar);
          store_async_v4w(map_to_rank(crd_par + slot * 16u, (unsigned)d), c_x, c_y, c_z, __int_as_float(c_q),
                          remote_bar);
        }
      }
      // the k-th use of this parity's mbarrier completes its phase k (parity k & 1)
      const unsigned phase = (unsigned)((s - 1) >> 1) & 1u;
      if (!dead && !mbar_try_wait(bar, phase)) {
        const long long t0 = clock64();
        while (!mbar_try_wait(bar, phase)) {
          if (clock64() - t0 > (1LL << 31)) {  // ~1 s: give up waiting (wrong indices, no hang)
            dead = true;
            break;
          }
        }
      }
    }
    // 5. every warp (L: warp 0) reduces the RR records: the largest distance, then the lowest
    // original index
    if (!L || warp == 0) {
      if constexpr (!E) {
        const int2 k = load_shared_v2(key_par + (unsigned)(lane % RR) * 8u);
        const float4 c = load_shared_v4(crd_par + (unsigned)(lane % RR) * 16u);
        const int kd = lane < RR ? k.x : (-2147483647 - 1);
        const int gd = redux_max_s32(kd);
        const unsigned win = __ballot_sync(FULL_MASK, kd == gd);
        int from = __ffs(win) - 1;
        if (win & (win - 1u)) {  // equal maxima in several warps (rare): original indices decide
          if (STATS) ++st_ftie;
          const unsigned oi = kd == gd ? (unsigned)(order[cloud + k.y] - cloud) : 0xFFFFFFFFu;
          const unsigned low = redux_min_u32(oi);
          from = __ffs(__ballot_sync(FULL_MASK, kd == gd && oi == low)) - 1;
        }
        selq = __shfl_sync(FULL_MASK, k.y, from);
        cx = __shfl_sync(FULL_MASK, c.x, from);
        cy = __shfl_sync(FULL_MASK, c.y, from);
        cz = __shfl_sync(FULL_MASK, c.z, from);
      } else {
        // lane l: records l, l + 32, ...: its largest distance, the first record holding it, and
        // whether another of its records ties it
        int bd = -2147483647 - 1, br = 0;
        bool dup = false;
#pragma unroll
        for (int t = 0; t < (RR + 31) / 32; ++t) {
          const int r = lane + 32 * t;
          if (r < RR) {
            const int kx = load_shared_v2(key_par + (unsigned)r * 8u).x;
            dup = kx == bd || (dup && kx < bd);
            if (kx > bd) {
              bd = kx;
              br = r;
            }
          }
        }
        const int gd = redux_max_s32(bd);
        const unsigned win = __ballot_sync(FULL_MASK, bd == gd);
        const int from = __ffs(win) - 1;
        int rec = RR <= 32 ? from : __shfl_sync(FULL_MASK, br, from);
        if ((win & (win - 1u)) || (RR > 32 && __ballot_sync(FULL_MASK, dup && bd == gd))) {
          if (STATS) ++st_ftie;
          // equal maxima in several records (rare): original indices decide
          unsigned mo = 0xFFFFFFFFu;
          int mr = 0;
#pragma unroll
          for (int t = 0; t < (RR + 31) / 32; ++t) {
            const int r = lane + 32 * t;
            if (r < RR) {
              const int2 k = load_shared_v2(key_par + (unsigned)r * 8u);
              if (k.x == gd) {
                const unsigned oi = (unsigned)(order[cloud + k.y] - cloud);
                if (oi < mo) {
                  mo = oi;
                  mr = r;
                }
              }
            }
          }
          const unsigned low = redux_min_u32(mo);
          rec = __shfl_sync(FULL_MASK, mr, __ffs(__ballot_sync(FULL_MASK, mo == low)) - 1);
        }
        // the winner's record read by every lane (a broadcast load, not 4 shuffles)
        const float4 w = load_shared_v4(crd_par + (unsigned)rec * 16u);
        selq = __float_as_int(w.w);
        cx = w.x;
        cy = w.y;
        cz = w.z;
      }
      if (L && lane == 0) store_shared_v4(cent_addr, cx, cy, cz, __int_as_float(selq));
    }
    if constexpr (L) {
      // one buffer is enough: warp 0 rewrites it after the next step's first barrier, which every
      // warp reaches only after reading it
      __syncthreads();
      const float4 centre = load_shared_v4(cent_addr);
      cx = centre.x;
      cy = centre.y;
      cz = centre.z;
      selq = __float_as_int(centre.w);
    }
    // sorted positions leave in coalesced batches of 32 (rank 0, warp 0), translated after the loop
    if (rank == 0 && warp == 0) {
      if (lane == (s & 31)) pending = selq;
      if ((s & 31) == 31 || s == steps - 1) {
        if (lane <= (s & 31)) out[b * num_samples + (s & ~31) + lane] = pending;
      }
    }
  }
  if (rank == 0) {
    if (steps == 1 && tid == 0) out[b * num_samples] = start;
    __syncthreads();  // warp 0's stores are visible to the CTA
    for (int t = 1 + tid; t < steps; t += W * 32) {
      const long long q = out[b * num_samples + t];
      out[b * num_samples + t] = order[cloud + q] - cloud;
    }
  }
  if constexpr (STATS) {
    if (lane == 0) {
      atomicAdd((unsigned long long*)&stats[0], (unsigned long long)st_upd);
      atomicAdd((unsigned long long*)&stats[1], (unsigned long long)st_batch);
      atomicAdd((unsigned long long*)&stats[2], (unsigned long long)st_sq);
      atomicAdd((unsigned long long*)&stats[3], (unsigned long long)st_rec);
      atomicAdd((unsigned long long*)&stats[4], (unsigned long long)st_rtie);
      atomicAdd((unsigned long long*)&stats[7], (unsigned long long)st_idle);
      if (warp == 0) {
        atomicAdd((unsigned long long*)&stats[5], (unsigned long long)st_ftie);
        atomicAdd((unsigned long long*)&stats[6], (unsigned long long)max(steps - 1, 0));
      }
    }
  }
  if (C > 1) cluster_sync();  // no CTA exits while others may still write to its shared memory
}

#define FPS_TILE_MD_CLUSTER_1
#define FPS_TILE_MD_CLUSTER_2 __cluster_dims__(2, 1, 1)
#define FPS_TILE_MD_CLUSTER_4 __cluster_dims__(4, 1, 1)
#define FPS_TILE_MD_CLUSTER_8 __cluster_dims__(8, 1, 1)
#define FPS_TILE_MD_ENTRY_WL(NAME, U, E, C, W, L)                                                            \
  extern "C" __global__ void __launch_bounds__(W * 32, 1) FPS_TILE_MD_CLUSTER_##C                         \
      NAME(const float* points, const long long* order, const long long* lengths, const long long* starts,   \
           long long* out, int n, int num_samples, int cap) {                                               \
    fps_tile_md<U, E, C, W, L>(points, order, lengths, starts, out, n, num_samples, cap);                 \
  }
#define FPS_TILE_MD_ENTRY(NAME, U, E, C) FPS_TILE_MD_ENTRY_WL(NAME, U, E, C, 16, false)
// _a_: adaptive batches (U groups while at least U remain, then one at a time)
#define FPS_TILE_MD_ENTRY_A(NAME, U, E, C)                                                                    \
  extern "C" __global__ void __launch_bounds__(TMD_WARPS * 32, 1) FPS_TILE_MD_CLUSTER_##C                 \
      NAME(const float* points, const long long* order, const long long* lengths, const long long* starts,   \
           long long* out, int n, int num_samples, int cap) {                                               \
    fps_tile_md<U, E, C, 16, false, false, true>(points, order, lengths, starts, out, n, num_samples, cap); \
  }
FPS_TILE_MD_ENTRY_A(fps_tile_md_a_u2_c1, 2, false, 1)
FPS_TILE_MD_ENTRY_A(fps_tile_md_a_u4_c1, 4, false, 1)
FPS_TILE_MD_ENTRY_A(fps_tile_md_a_u8_c1, 8, false, 1)
FPS_TILE_MD_ENTRY_A(fps_tile_md_e_a_u4_c8, 4, true, 8)
FPS_TILE_MD_ENTRY_A(fps_tile_md_e_a_u8_c8, 8, true, 8)
FPS_TILE_MD_ENTRY(fps_tile_md_u1_c1, 1, false, 1)
// OPT variants (TMD_SADDR, TMD_KEEP), one CTA: _s_ shared addresses, _k_ kept records, _sk_ both
#define FPS_TILE_MD_ENTRY_OC(NAME, U, E, C, OPT)                                                           \
  extern "C" __global__ void __launch_bounds__(TMD_WARPS * 32, 1) FPS_TILE_MD_CLUSTER_##C                   \
      NAME(const float* points, const long long* order, const long long* lengths, const long long* starts,   \
           long long* out, int n, int num_samples, int cap) {                                               \
    fps_tile_md<U, E, C, 16, false, false, false, OPT>(points, order, lengths, starts, out, n, num_samples, cap); \
  }
#define FPS_TILE_MD_ENTRY_O(NAME, U, E, OPT) FPS_TILE_MD_ENTRY_OC(NAME, U, E, 1, OPT)
FPS_TILE_MD_ENTRY_O(fps_tile_md_s_u1_c1, 1, false, TMD_SADDR)
FPS_TILE_MD_ENTRY_O(fps_tile_md_k_u1_c1, 1, false, TMD_KEEP)
FPS_TILE_MD_ENTRY_O(fps_tile_md_sk_u1_c1, 1, false, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_O(fps_tile_md_sk_u2_c1, 2, false, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_O(fps_tile_md_esk_u1_c1, 1, true, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY(fps_tile_md_u2_c1, 2, false, 1)
FPS_TILE_MD_ENTRY(fps_tile_md_u4_c1, 4, false, 1)
// _e_: the warp max from the kept groups' redux (issued before the updates) and the updates' own
// maxima (saves the record's redux, ~60 cycles), the winner's record read by a broadcast load
FPS_TILE_MD_ENTRY(fps_tile_md_e_u1_c1, 1, true, 1)
FPS_TILE_MD_ENTRY(fps_tile_md_e_u2_c1, 2, true, 1)
FPS_TILE_MD_ENTRY(fps_tile_md_e_u4_c1, 4, true, 1)
// clouds over 16,384 points: clusters of 2, 4, 8 CTAs (st.async exchange)
FPS_TILE_MD_ENTRY(fps_tile_md_e_u2_c2, 2, true, 2)
FPS_TILE_MD_ENTRY(fps_tile_md_e_u2_c4, 2, true, 4)
FPS_TILE_MD_ENTRY(fps_tile_md_e_u2_c8, 2, true, 8)
FPS_TILE_MD_ENTRY(fps_tile_md_e_u4_c8, 4, true, 8)
// the same with TMD_SADDR | TMD_KEEP (_esk_; pcops.cuda.sampling._tile_md_cluster_opt)
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u2_c2, 2, true, 2, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u2_c4, 2, true, 4, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u2_c8, 2, true, 8, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u4_c8, 4, true, 8, TMD_SADDR | TMD_KEEP)
// fewer redux and instructions per step on the SM (the H200 run: u4 slower than u1, so the SM's
// issue and redux throughput, not latency alone, set the step): _l_ one leader warp reduces the
// records; _w8_ 8 warps of two boxes per lane (8 records, 8 reductions per step)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_l_u1_c1, 1, false, 1, 16, true)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w8_u1_c1, 1, false, 1, 8, false)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w8_u2_c1, 2, false, 1, 8, false)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w8l_u1_c1, 1, false, 1, 8, true)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w8l_u2_c1, 2, false, 1, 8, true)
// diagnostic: fps_tile_md_u1_c1 with counters (pcops.cuda.sampling.tile_md_stats)
extern "C" __global__ void __launch_bounds__(TMD_WARPS * 32, 1)
    fps_tile_md_stats_u1_c1(const float* points, const long long* order, const long long* lengths,
                            const long long* starts, long long* out, int n, int num_samples, int cap, long long* stats) {
  fps_tile_md<1, false, 1, 16, false, true>(points, order, lengths, starts, out, n, num_samples, cap, stats);
}
// 4 warps of four boxes per lane (one warp per SM sub-partition; 20 register slots per lane)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w4_u2_c1, 2, false, 1, 4, false)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w4_u4_c1, 4, false, 1, 4, false)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w4l_u2_c1, 2, false, 1, 4, true)
FPS_TILE_MD_ENTRY_WL(fps_tile_md_w4l_u4_c1, 4, false, 1, 4, true)
