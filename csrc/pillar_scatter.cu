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

// 4-byte elements with C % 4 == 0 (the PointPillars case, C = 64): each thread reads its
// owner's row as 16-byte vectors (C/4 loads instead of C) and still stores one coalesced
// 4-byte word per channel.
extern "C" __global__ void pillar_canvas_b4v(const uint4* __restrict__ features, const int* __restrict__ winner,
                                            unsigned int* __restrict__ canvas, int num_channels, int hw, int batch_size) {
  long long cell = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  int b = blockIdx.y;
  if (cell >= hw) return;
  int owner = winner[(long long)b * hw + cell];
  unsigned int* out = canvas + (long long)b * num_channels * hw + cell;
  int vecs = num_channels >> 2;
  const uint4* row = features + (long long)(owner < 0 ? 0 : owner) * vecs;
  for (int v = 0; v < vecs; ++v) {
    uint4 q = owner < 0 ? make_uint4(0u, 0u, 0u, 0u) : row[v];
    out[(long long)(4 * v + 0) * hw] = q.x;
    out[(long long)(4 * v + 1) * hw] = q.y;
    out[(long long)(4 * v + 2) * hw] = q.z;
    out[(long long)(4 * v + 3) * hw] = q.w;
  }
}
extern "C" __global__ void pillar_canvas_b8(const unsigned long long* f, const int* w, unsigned long long* o, int c, int hw, int b) {
  pillar_canvas<unsigned long long>(f, w, o, c, hw, b);
}
