// Softmax over the stored values of each CSR row, forward and backward, in CUDA C++ compiled at
// run time by NVRTC (self-contained: no standard or CUDA headers). Same results as
// pcops/triton/sparse_softmax.py (up to float32 rounding).
//
// Work split: a block of WARPS warps owns RPB = WARPS · 32 / SUB consecutive rows; each group of
// SUB lanes (32: a warp; 16, 8 or 4: 2, 4 or 8 rows per warp) owns one row. A row with at most CAP = SUB · VPT entries is done by its group alone, entirely in
// registers (one read, one write; the reductions are log2(SUB) xor-shuffles that all groups of
// a warp run together, so the shuffles stay warp-converged). Short rows packed several per warp
// give each warp several rows of loads in flight at once. Longer rows are flagged in
// shared memory and then done one after another by the whole block (online max/sum over a
// strided loop, a block reduction through shared memory, then a second pass that writes).
// One launch, no host sync. The launcher picks SUB from the mean row length (no host sync):
// the smallest group whose CAP covers 1.9·mean (≈ the longest row when lengths are uniform).
// One entry point per direction and value type: the group shape and the crow index type are
// run-time arguments (a block-uniform switch), so NVRTC compiles 4 shapes per entry, not 16.
//
// Empty rows write nothing; an all −inf row gives zeros (the max is replaced by 0 so that
// exp(−inf − 0) = 0 and the zero sum gives a zero output instead of 0/0); a row holding a NaN or
// +inf value gives NaN everywhere (its sum is NaN), as torch.softmax. Row ranges are
// clamped to [0, nnz], so a malformed crow never reads or writes out of bounds.
//
// Element types: float32, and float16/bfloat16 held as 16-bit storage, converted with PTX cvt
// (half) or bit shifts with round-to-nearest-even (bfloat16); arithmetic is float32.

#define WARPS 8
#define THREADS (WARPS * 32)
#define NEG_INF __int_as_float(0xff800000)

template <int KIND> struct Elem;
template <> struct Elem<0> {  // float32
  typedef float T;
  static __device__ __forceinline__ float load(T v) { return v; }
  static __device__ __forceinline__ T store(float f) { return f; }
};
template <> struct Elem<1> {  // float16
  typedef unsigned short T;
  static __device__ __forceinline__ float load(T v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ __forceinline__ T store(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
};
template <> struct Elem<2> {  // bfloat16: the high half of a float32
  typedef unsigned short T;
  static __device__ __forceinline__ float load(T v) { return __uint_as_float(((unsigned int)v) << 16); }
  static __device__ __forceinline__ T store(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return (unsigned short)(u >> 16);
  }
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Max / sum over the SUB lanes of an aligned group (xor offsets < SUB stay inside the group).
// Every lane of the warp must call these (full mask): callers predicate, never branch around.
template <int SUB>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = SUB / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <int SUB>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = SUB / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Merge the running (max, sum of exp(v - max)) pair (m2, s2) into (m, s); −inf maxima are empty
// (their sums are 0, or NaN once a NaN value was merged: fmaxf ignores NaN, the sum carries it).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  float mx = fmaxf(m, m2);
  if (mx == NEG_INF) {
    s += s2;
    return;
  }
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// Row range [start, end) clamped to [0, nnz]; crow holds int64 (crow64 != 0) or int32 pointers.
__device__ __forceinline__ void row_range(const void* crow, int crow64, long long row, long long nnz, long long& start,
                                          long long& end) {
  if (crow64) {
    start = ((const long long*)crow)[row];
    end = ((const long long*)crow)[row + 1];
  } else {
    start = (long long)((const int*)crow)[row];
    end = (long long)((const int*)crow)[row + 1];
  }
  start = start < 0 ? 0 : (start > nnz ? nnz : start);
  end = end < start ? start : (end > nnz ? nnz : end);
}

template <int KIND, int SUB, int VPT>
__device__ void softmax_fwd(const typename Elem<KIND>::T* __restrict__ values, const void* __restrict__ crow, int crow64,
                            typename Elem<KIND>::T* __restrict__ out, long long rows, long long nnz) {
  typedef Elem<KIND> E;
  constexpr int RPW = 32 / SUB;    // rows per warp
  constexpr int RPB = WARPS * RPW;  // rows per block
  constexpr int CAP = SUB * VPT;    // longest row a group holds in registers
  __shared__ int is_long[RPB];
  __shared__ float red_m[WARPS], red_s[WARPS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = warp * RPW + lane / SUB, sl = lane % SUB;  // the group's row in the block, lane in the group
  const long long first = (long long)blockIdx.x * RPB;
  const long long row = first + slot;
  long long start = 0, end = 0;
  if (row < rows) row_range(crow, crow64, row, nnz, start, end);
  const long long len = end - start;
  if (sl == 0) is_long[slot] = len > CAP;
  // short rows: one group each, values in registers; long (and empty) rows load nothing here
  const int n = len <= CAP ? (int)len : 0;
  float v[VPT];
  float m = NEG_INF;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = sl + SUB * k;
    v[k] = i < n ? E::load(values[start + i]) : NEG_INF;
    m = fmaxf(m, v[k]);
  }
  m = group_max<SUB>(m);
  const float ref = m == NEG_INF ? 0.f : m;  // all −inf: exp gives 0, the output 0
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    v[k] = __expf(v[k] - ref);
    s += v[k];
  }
  s = group_sum<SUB>(s);
  const float inv = s != 0.f ? 1.f / s : 0.f;  // NaN sum (NaN or +inf value): NaN row
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = sl + SUB * k;
    if (i < n) out[start + i] = E::store(v[k] * inv);
  }
  __syncthreads();
  // long rows: the whole block, one row after another (the flags are block-uniform)
  for (int r = 0; r < RPB; ++r) {
    if (!is_long[r]) continue;
    long long s0, e0;
    row_range(crow, crow64, first + r, nnz, s0, e0);
    float m = NEG_INF, s = 0.f;
    for (long long i = s0 + threadIdx.x; i < e0; i += THREADS) {
      const float x = E::load(values[i]);
      merge(m, s, x, x == x ? 1.f : x);  // a NaN value: a NaN sum
    }
    for (int o = 16; o > 0; o >>= 1) {
      float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      red_m[warp] = m;
      red_s[warp] = s;
    }
    __syncthreads();
    m = NEG_INF;
    s = 0.f;
    for (int k = 0; k < WARPS; ++k) merge(m, s, red_m[k], red_s[k]);  // same order in every thread
    const float ref = m == NEG_INF ? 0.f : m;
    const float inv = s != 0.f ? 1.f / s : 0.f;  // NaN sum (NaN or +inf value): NaN row
    for (long long i = s0 + threadIdx.x; i < e0; i += THREADS) out[i] = E::store(__expf(E::load(values[i]) - ref) * inv);
    __syncthreads();  // red_m/red_s are reused by the next long row
  }
}

template <int KIND, int SUB, int VPT>
__device__ void softmax_bwd(const typename Elem<KIND>::T* __restrict__ grad, const typename Elem<KIND>::T* __restrict__ y,
                            const void* __restrict__ crow, int crow64, typename Elem<KIND>::T* __restrict__ dx,
                            long long rows, long long nnz) {
  typedef Elem<KIND> E;
  constexpr int RPW = 32 / SUB;
  constexpr int RPB = WARPS * RPW;
  constexpr int CAP = SUB * VPT;
  __shared__ int is_long[RPB];
  __shared__ float red[WARPS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = warp * RPW + lane / SUB, sl = lane % SUB;
  const long long first = (long long)blockIdx.x * RPB;
  const long long row = first + slot;
  long long start = 0, end = 0;
  if (row < rows) row_range(crow, crow64, row, nnz, start, end);
  const long long len = end - start;
  if (sl == 0) is_long[slot] = len > CAP;
  const int n = len <= CAP ? (int)len : 0;
  float g[VPT], yv[VPT];
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = sl + SUB * k;
    g[k] = i < n ? E::load(grad[start + i]) : 0.f;
    yv[k] = i < n ? E::load(y[start + i]) : 0.f;
    dot += g[k] * yv[k];
  }
  dot = group_sum<SUB>(dot);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = sl + SUB * k;
    if (i < n) dx[start + i] = E::store(yv[k] * (g[k] - dot));
  }
  __syncthreads();
  for (int r = 0; r < RPB; ++r) {
    if (!is_long[r]) continue;
    long long s0, e0;
    row_range(crow, crow64, first + r, nnz, s0, e0);
    float dot = 0.f;
    for (long long i = s0 + threadIdx.x; i < e0; i += THREADS) dot += E::load(grad[i]) * E::load(y[i]);
    dot = warp_sum(dot);
    if (lane == 0) red[warp] = dot;
    __syncthreads();
    dot = 0.f;
    for (int k = 0; k < WARPS; ++k) dot += red[k];
    for (long long i = s0 + threadIdx.x; i < e0; i += THREADS) dx[i] = E::store(E::load(y[i]) * (E::load(grad[i]) - dot));
    __syncthreads();
  }
}

// Entry points: sparse_softmax_{fwd,bwd}_{f32,f16,bf16}. sub picks the group shape g{SUB}x{VPT}:
// 4, 8, 16 → 8 entries per lane (rows of ≤ 32, 64, 128 in registers, 8, 4, 2 rows per warp); 32 →
// g32x4 (a warp per row of ≤ 128). Blocks hold WARPS · 32 / sub rows.
#define PCOPS_SOFTMAX_SHAPES(CALL) \
  switch (sub) {                    \
    case 4: CALL(4, 8); break;      \
    case 8: CALL(8, 8); break;      \
    case 16: CALL(16, 8); break;    \
    default: CALL(32, 4); break;    \
  }
#define PCOPS_SOFTMAX_FWD(SUB, VPT) softmax_fwd<KIND, SUB, VPT>(values, crow, crow64, out, rows, nnz)
#define PCOPS_SOFTMAX_BWD(SUB, VPT) softmax_bwd<KIND, SUB, VPT>(grad, y, crow, crow64, dx, rows, nnz)
#define PCOPS_SOFTMAX_ENTRY(SUFFIX, KIND_)                                                             \
  extern "C" __global__ void __launch_bounds__(THREADS) sparse_softmax_fwd_##SUFFIX(                  \
      const Elem<KIND_>::T* values, const void* crow, Elem<KIND_>::T* out, long long rows, long long nnz, \
      int crow64, int sub) {                                                                           \
    constexpr int KIND = KIND_;                                                                        \
    PCOPS_SOFTMAX_SHAPES(PCOPS_SOFTMAX_FWD)                                                            \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS) sparse_softmax_bwd_##SUFFIX(                  \
      const Elem<KIND_>::T* grad, const Elem<KIND_>::T* y, const void* crow, Elem<KIND_>::T* dx,        \
      long long rows, long long nnz, int crow64, int sub) {                                            \
    constexpr int KIND = KIND_;                                                                        \
    PCOPS_SOFTMAX_SHAPES(PCOPS_SOFTMAX_BWD)                                                            \
  }

PCOPS_SOFTMAX_ENTRY(f32, 0)
PCOPS_SOFTMAX_ENTRY(f16, 1)
PCOPS_SOFTMAX_ENTRY(bf16, 2)
