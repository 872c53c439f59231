// Farthest point sampling on Hopper (sm_90+), compiled at run time by NVRTC
// (pcops/cuda/fps.py launches these kernels).
//
// Each cloud is first ordered along a Morton curve (fps_morton_keys[32] + one stable 1-D sort), so
// 32 consecutive sorted points (a "group") are spatially compact and get a bounding box. Late in a
// farthest point sampling almost every region is already close to a sample, so a step changes
// few groups and is pure latency; fps_tile_md is built around that:
//   * one CTA holds up to 16,384 sorted points, or a cluster of C = 2, 4, 8 CTAs shares a cloud of
//     up to C * 16,384: coordinates and running min-distances of 13,824 points per CTA in shared
//     memory (one float4 each), the other 2,560 in registers; groups are dealt round-robin to the
//     16 warps, lane j of a warp holds the box and largest min-distance of the warp's group j;
//   * a step updates only the groups whose box is not farther from the new sample than their
//     largest min-distance (exact: rounding is monotone, so a box distance never exceeds the
//     distance of a point inside), U groups per batch;
//   * every warp publishes a record (largest min-distance, sorted position, coordinates); one
//     exchange per step (C == 1: a __syncthreads; C > 1: st.async stores into every CTA's shared
//     memory completing on its mbarrier, no barrier), then every warp reduces the records itself:
//     no global memory on the step's path. Records are double buffered by step parity.
// Ties go to the lowest original index; distances use explicit round-to-nearest intrinsics (no FMA
// contraction), so the indices equal the plain-torch reference bit for bit. Measurements of this
// design and of the removed alternatives: benchmarks/NOTES.md.
//
// Entry points: fps_morton_keys (64-bit keys), fps_morton_keys32 (32-bit keys, up to 4,096 clouds),
// fps_tile_md_sk_u1_c1 (one CTA per cloud), fps_tile_md_esk_u2_c{2,4,8} (clusters).

typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// All threads of all CTAs of the cluster; orders shared-memory writes before remote reads.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float sq_dist(float x, float y, float z, float cx, float cy, float cz) {
  float dx = __fsub_rn(x, cx), dy = __fsub_rn(y, cy), dz = __fsub_rn(z, cz);
  return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
}

#define TILE_WARPS 16
#define TILE_SLOTS 32                                  // groups per warp: one box per lane
#define TILE_RECORD_BYTES 24                           // int2 key + float4 coordinates

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

// The sorted order of fps_tile_md in one kernel and one stable 1-D sort of its keys (B * N): one CTA
// per cloud, a bounding-box pass, then each point's Morton code in the cloud's box; the cloud index
// in the high bits keeps the clouds apart, and padding sorts after every valid point.
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

// fps_tile_md layout (why: a register array indexed by a run-time group becomes a jump table, an
// indirect branch per access on the step's path):
//   * coordinates AND min-distances of the first S = 27 slots (13,824 points) live in shared memory,
//     one float4 (x, y, z, md) per point at j * 512 + tid for slot j (221,184 B): one 16-byte load;
//     the last 5 slots of each lane (2,560 points) stay in registers, read and written with 5-way
//     selects (16,384 points do not fit 227 KB at 16 B per point);
//   * needed groups are updated U at a time (the U loads and redux.sync issued together);
//   * the warp record is (max bits, sorted position) + coordinates, written by the lane that holds the
//     point; ties (equal maxima) take a slow path reading original indices from `order` (rare);
//     "_e_": the warp max is the max of the kept groups' redux (issued before the updates) and the
//     updates' own redux results, and the winner's record is read by one broadcast load;
//   * sorted positions are written to `out` during the run and turned into original indices after
//     the loop (no global load on the step's path).
// Arguments: points (B, N, 3) float32; order (B * N) int64 (flat indices b * N + i sorted by cloud,
// then Morton code, padding last); lengths, starts (B,) int64; out (B, M) int64 pre-filled with -1;
// cap = min(ceil(N / C) rounded up to 32, 13,824). Grid (C, B), 512 threads, cluster (C, 1, 1),
// 16 * cap bytes of dynamic shared memory.
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

// C > 1 (clouds over 16,384 points): a cluster of C CTAs shares the cloud (CTA `rank` holds sorted
// positions lo .. lo + cnt - 1); records carry global sorted positions and are sent by their owner
// lane to every CTA with st.async completing on the receiver's mbarrier (no barrier), then every
// warp reduces the C * W records of the step. The template also takes W (warps), L (a leader warp
// reduces the records), STATS (counters) and AD (adaptive batches): the entry points below use
// W = 16 and none of the others (their measurements: benchmarks/NOTES.md).
template <int N>
struct TmdInt {
  static constexpr int value = N;
};

// OPT (bits): TMD_SADDR: the step's shared-memory accesses to the
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
#define FPS_TILE_MD_ENTRY_OC(NAME, U, E, C, OPT)                                                           \
  extern "C" __global__ void __launch_bounds__(TMD_WARPS * 32, 1) FPS_TILE_MD_CLUSTER_##C                   \
      NAME(const float* points, const long long* order, const long long* lengths, const long long* starts,   \
           long long* out, int n, int num_samples, int cap) {                                               \
    fps_tile_md<U, E, C, 16, false, false, false, OPT>(points, order, lengths, starts, out, n, num_samples, cap); \
  }
// one CTA: U = 1 group per batch, TMD_SADDR | TMD_KEEP
FPS_TILE_MD_ENTRY_OC(fps_tile_md_sk_u1_c1, 1, false, 1, TMD_SADDR | TMD_KEEP)
// clouds over 16,384 points: clusters of 2, 4, 8 CTAs (st.async exchange, "_e_" reduction), U = 2
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u2_c2, 2, true, 2, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u2_c4, 2, true, 4, TMD_SADDR | TMD_KEEP)
FPS_TILE_MD_ENTRY_OC(fps_tile_md_esk_u2_c8, 2, true, 8, TMD_SADDR | TMD_KEEP)
