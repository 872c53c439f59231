// A SIMT shim: CUDA kernels (csrc/*.cu with __shared__ -> static) compiled as host C++, one
// std::thread per CUDA thread, blocks run one after another, std::barrier for __syncthreads and
// for the warp intrinsics (ballot, shuffles, OR-reduction). Every lane must reach them, as on the
// GPU: a missed one deadlocks (the tests run the binary under a timeout). Dynamic shared memory
// is g_dyn_smem, set by the caller.
#pragma once
#include <math.h>
#include <string.h>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* g_block;
struct Warp { std::barrier<> bar{32}; unsigned long long slot[32]; };
static Warp* g_warps;
static unsigned long long* g_dyn_smem;
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline void __syncthreads() { g_block->arrive_and_wait(); }
static int g_sync_or;
static inline int __syncthreads_or(int p) {
  if (p) __atomic_fetch_or(&g_sync_or, 1, __ATOMIC_RELAXED);
  g_block->arrive_and_wait();
  const int r = __atomic_load_n(&g_sync_or, __ATOMIC_RELAXED);
  g_block->arrive_and_wait();
  if (threadIdx.x == 0) g_sync_or = 0;
  g_block->arrive_and_wait();
  return r;
}
template <class F> static unsigned long long warp_op(unsigned long long v, F f) {
  Warp& w = g_warps[threadIdx.x / 32];
  w.slot[threadIdx.x % 32] = v;
  w.bar.arrive_and_wait();
  unsigned long long r = f(w.slot);
  w.bar.arrive_and_wait();
  return r;
}
static inline unsigned __ballot_sync(unsigned, bool p) {
  return (unsigned)warp_op(p, [](unsigned long long* s) {
    unsigned long long r = 0; for (int i = 0; i < 32; ++i) r |= (unsigned long long)(s[i] != 0) << i; return r; });
}
static inline unsigned __reduce_or_sync(unsigned, unsigned v) {
  return (unsigned)warp_op(v, [](unsigned long long* s) {
    unsigned long long r = 0; for (int i = 0; i < 32; ++i) r |= s[i]; return r; });
}
static inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
  return (unsigned)warp_op(v, [src](unsigned long long* s) { return s[src & 31]; });
}
static inline int __shfl_sync(unsigned, int v, int src) {
  return (int)(unsigned)warp_op((unsigned)v, [src](unsigned long long* s) { return s[src & 31]; });
}
static inline int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x % 32;
  return (int)(unsigned)warp_op((unsigned)v, [lane, d](unsigned long long* s) { return s[lane >= d ? lane - d : lane]; });
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return old;
}
// one block of `threads` CUDA threads (a multiple of 32)
static void run_block(unsigned bx, unsigned by, int threads, const std::function<void()>& k) {
  blockIdx.x = bx;
  blockIdx.y = by;
  blockDim.x = threads;
  g_block = new std::barrier<>(threads);
  g_warps = new Warp[threads / 32];
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back([&, i] { threadIdx.x = i; k(); });
  for (auto& th : pool) th.join();
  delete g_block;
  delete[] g_warps;
}
