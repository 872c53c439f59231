// Pillar scatter (PointPillars' BEV pseudo-image) in CUDA C++, compiled at run time by NVRTC.
// Same algorithm and results as pcops/triton/pillar_scatter.py: a winner map (highest pillar
// index per cell, via atomicMax) and one pass that writes every canvas element exactly once.
// The canvas pass is pure data movement, so it is instantiated per element size (2, 4, 8 bytes)
// and works for every float dtype without the half/bfloat16 headers.

// Mark each cell with the highest index of the pillars that land in it.
// coords: (P, 4) int32 (batch, z, y, x); winner: (B*H*W,) int32 pre-filled with -1.
extern "C" __global__ void pillar_winner(const int* __restrict__ coords, int* __restrict__ winner,
                                         int num_pillars, int batch_size, int grid_h, int grid_w) {
  int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= num_pillars) return;
  // one 16-byte load per pillar: (batch, z, y, x)
  int4 c = reinterpret_cast<const int4*>(coords)[p];
  // pillars outside the grid are skipped: nothing is written out of bounds
  if (c.x < 0 || c.x >= batch_size || c.z < 0 || c.z >= grid_h || c.w < 0 || c.w >= grid_w) return;
  atomicMax(winner + ((long long)c.x * grid_h + c.z) * grid_w + c.w, p);
}

// Each thread owns one cell of one batch and writes its C channels (zero if the cell is empty).
// Consecutive threads own consecutive cells, so every store of a warp is coalesced.
template <typename T>
__device__ void pillar_canvas(const T* __restrict__ features, const int* __restrict__ winner,
                              T* __restrict__ canvas, int num_channels, int hw, int batch_size) {
  long long cell = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  int b = blockIdx.y;
  if (cell >= hw) return;
  int owner = winner[(long long)b * hw + cell];
  T* out = canvas + (long long)b * num_channels * hw + cell;
  if (owner < 0) {
    for (int c = 0; c < num_channels; ++c) out[(long long)c * hw] = T(0);
  } else {
    const T* row = features + (long long)owner * num_channels;
    for (int c = 0; c < num_channels; ++c) out[(long long)c * hw] = row[c];
  }
}

extern "C" __global__ void pillar_canvas_b2(const unsigned short* f, const int* w, unsigned short* o, int c, int hw, int b) {
  pillar_canvas<unsigned short>(f, w, o, c, hw, b);
}
extern "C" __global__ void pillar_canvas_b4(const unsigned int* f, const int* w, unsigned int* o, int c, int hw, int b) {
  pillar_canvas<unsigned int>(f, w, o, c, hw, b);
}

extern "C" __global__ void pillar_canvas_b8(const unsigned long long* f, const int* w, unsigned long long* o, int c, int hw, int b) {
  pillar_canvas<unsigned long long>(f, w, o, c, hw, b);
}

// 4-byte elements, C % 4 == 0 and H*W % 4 == 0 (the PointPillars case): each thread owns 4
// consecutive cells (one 16-byte winner load) and the channels [4 v0, 4 v1) of slice blockIdx.z
// (vecs_per_slice 4-channel vectors each); per 4 channels it loads the owners' 16-byte row pieces
// (occupied cells only) and writes 4 16-byte stores, one per channel, coalesced across the warp.
// Grid (ceil(H*W / 4 / blockDim), B, C / 4 / vecs_per_slice).
extern "C" __global__ void pillar_canvas_b4x4(const uint4* __restrict__ features, const int4* __restrict__ winner,
                                              uint4* __restrict__ canvas, int num_channels, int hw,
                                              int vecs_per_slice) {
  const long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // quad of cells
  const int b = blockIdx.y;
  const int hw4 = hw >> 2, vecs = num_channels >> 2;
  if (q >= hw4) return;
  const int4 o = winner[(long long)b * hw4 + q];
  uint4* out = canvas + (long long)b * num_channels * hw4 + q;
  const int v0 = blockIdx.z * vecs_per_slice, v1 = min(v0 + vecs_per_slice, vecs);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 2
  for (int v = v0; v < v1; ++v) {
    const uint4 r0 = o.x >= 0 ? features[(long long)o.x * vecs + v] : zero;
    const uint4 r1 = o.y >= 0 ? features[(long long)o.y * vecs + v] : zero;
    const uint4 r2 = o.z >= 0 ? features[(long long)o.z * vecs + v] : zero;
    const uint4 r3 = o.w >= 0 ? features[(long long)o.w * vecs + v] : zero;
    out[(long long)(4 * v + 0) * hw4] = make_uint4(r0.x, r1.x, r2.x, r3.x);
    out[(long long)(4 * v + 1) * hw4] = make_uint4(r0.y, r1.y, r2.y, r3.y);
    out[(long long)(4 * v + 2) * hw4] = make_uint4(r0.z, r1.z, r2.z, r3.z);
    out[(long long)(4 * v + 3) * hw4] = make_uint4(r0.w, r1.w, r2.w, r3.w);
  }
}

// The adjoint, streaming over the canvas instead of gathering per pillar: each thread owns 4
// consecutive cells and the 4-channel vectors of slice blockIdx.z; quads without an owner read
// nothing; otherwise 4 coalesced 16-byte loads (4 channels x 4 cells) per 4 channels, and each
// owner receives its 4 channels as one 16-byte store into its row of `out` ((P, C), zero-filled
// by the launcher: pillars that own no cell keep 0). Reading the canvas gradient in cell order keeps
// the HBM accesses sequential (a per-pillar gather reads C sectors at stride H*W: one DRAM page per
// element). Same layouts and grid as pillar_canvas_b4x4.
extern "C" __global__ void pillar_gather_b4x4(const uint4* __restrict__ canvas, const int4* __restrict__ winner,
                                              uint4* __restrict__ out, int num_channels, int hw, int vecs_per_slice) {
  const long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const int b = blockIdx.y;
  const int hw4 = hw >> 2, vecs = num_channels >> 2;
  if (q >= hw4) return;
  const int4 o = winner[(long long)b * hw4 + q];
  if ((o.x & o.y & o.z & o.w) < 0) return;  // all four cells empty (the AND of their sign bits)
  const uint4* src = canvas + (long long)b * num_channels * hw4 + q;
  const int v0 = blockIdx.z * vecs_per_slice, v1 = min(v0 + vecs_per_slice, vecs);
#pragma unroll 2
  for (int v = v0; v < v1; ++v) {
    const uint4 g0 = src[(long long)(4 * v + 0) * hw4];
    const uint4 g1 = src[(long long)(4 * v + 1) * hw4];
    const uint4 g2 = src[(long long)(4 * v + 2) * hw4];
    const uint4 g3 = src[(long long)(4 * v + 3) * hw4];
    if (o.x >= 0) out[(long long)o.x * vecs + v] = make_uint4(g0.x, g1.x, g2.x, g3.x);
    if (o.y >= 0) out[(long long)o.y * vecs + v] = make_uint4(g0.y, g1.y, g2.y, g3.y);
    if (o.z >= 0) out[(long long)o.z * vecs + v] = make_uint4(g0.z, g1.z, g2.z, g3.z);
    if (o.w >= 0) out[(long long)o.w * vecs + v] = make_uint4(g0.w, g1.w, g2.w, g3.w);
  }
}
