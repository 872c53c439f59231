// Rotated BEV IoU and rotated NMS in CUDA C++, compiled at run time by NVRTC.
// Same geometry as pcops/triton/nms.py (see its docstring): float32 in box a's own frame, exact
// containment, fixed-vertex-count slab clipping, shoelace area. What CUDA adds over Triton, the NMS
// pipeline of pcops.cuda.nms.nms_padded (B samples per launch, no host round trip): nms_rank sorts
// the scores by ranking and writes the boxes in score order as prepared records (no sort library
// call, no gathers afterwards); nms_mask_b culls every pair of a 64x64 tile by bounding circles
// and compacts the survivors (warp scan), so the clipping runs only for pairs that can overlap
// (~1-2 % of the pairs of random scenes); nms_pass_b walks the tiles in one block per sample
// (pipelined: one warp resolves a tile from register-held diagonal words while the others OR the
// previous tile's kept rows into the later "removed" words in shared memory).
#define NMS_TILE 64
#define PASS_THREADS 1024
// |v| <= BIG is false for NaN and +-inf
#define BIG 3.0e38f

struct Box {
  float x, y, z, dx, dy, dz, h;
  int ok;
};

// Box row i of a (N, stride) float32 array: (x, y, dx, dy, h) when bev5, else OpenPCDet's 7 columns.
// Invalid boxes (non-finite, negative size, or not live) become a harmless unit box with ok = 0.
__device__ __forceinline__ Box load_box(const float* __restrict__ boxes, long long i, int stride, int bev5, bool live) {
  Box b;
  b.x = b.y = b.z = b.h = 0.f;
  b.dx = b.dy = b.dz = 1.f;
  b.ok = 0;
  if (!live) return b;
  const float* p = boxes + i * stride;
  float x = p[0], y = p[1], z, dx, dy, dz, h;
  if (bev5) {
    z = 0.f; dx = p[2]; dy = p[3]; dz = 0.f; h = p[4];
  } else {
    z = p[2]; dx = p[3]; dy = p[4]; dz = p[5]; h = p[6];
  }
  bool ok = fabsf(x) <= BIG && fabsf(y) <= BIG && fabsf(z) <= BIG && fabsf(h) <= BIG && dx >= 0.f &&
            dy >= 0.f && dz >= 0.f && dx <= BIG && dy <= BIG && dz <= BIG;
  if (ok) {
    b.x = x; b.y = y; b.z = z; b.dx = dx; b.dy = dy; b.dz = dz; b.h = h; b.ok = 1;
  }
  return b;
}

// (sin, cos) of x + lo: Cody-Waite reduction by pi/2 with a 3-part constant, cephes polynomials
// (the same arithmetic as the Triton kernel).
__device__ __forceinline__ void sincos_poly(float x, float lo, float* sin_out, float* cos_out) {
  float k = floorf(x * 0.6366197723675814f + 0.5f);
  float r = x - k * 1.5703125f;
  r = r - k * 4.837512969970703125e-4f;
  r = r - k * 7.54978995489188216e-8f;
  r = r + lo;
  float r2 = r * r;
  float s = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
  float c = 1.0f - 0.5f * r2 +
            r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
  int q = ((int)k) & 3;
  *sin_out = q == 0 ? s : (q == 1 ? c : (q == 2 ? -s : -c));
  *cos_out = q == 0 ? c : (q == 1 ? -s : (q == 2 ? -c : s));
}

// The part of segment p->q with |x| <= h as two points; a segment wholly outside gives its ends
// clamped onto the boundary line (collinear with the neighbouring points: no area added).
__device__ __forceinline__ void slab(float px, float py, float qx, float qy, float h,
                                     float& ax, float& ay, float& bx, float& by) {
  float d = qx - px;
  bool par = d == 0.f;
  float inv = 1.f / (par ? 1.f : d);
  float ta = (-h - px) * inv, tb = (h - px) * inv;
  bool inside_par = fabsf(px) <= h;
  float t0 = par ? (inside_par ? 0.f : 1.f) : fmaxf(fminf(ta, tb), 0.f);
  float t1 = par ? (inside_par ? 1.f : 0.f) : fminf(fmaxf(ta, tb), 1.f);
  bool hit = t0 <= t1;
  float ey = qy - py;
  ax = (hit && t0 != 0.f) ? px + t0 * d : px;
  ay = (hit && t0 != 0.f) ? py + t0 * ey : py;
  bx = (hit && t1 != 1.f) ? px + t1 * d : qx;
  by = (hit && t1 != 1.f) ? py + t1 * ey : qy;
  ax = fminf(fmaxf(ax, -h), h);
  bx = fminf(fmaxf(bx, -h), h);
}

__device__ __forceinline__ float cross2(float ax, float ay, float bx, float by) { return ax * by - ay * bx; }

// BEV intersection area of two valid boxes.
__device__ float pair_inter(const Box& a, const Box& b) {
  const float hxa = a.dx * 0.5f, hya = a.dy * 0.5f, hxb = b.dx * 0.5f, hyb = b.dy * 0.5f;
  float sa, ca, sd, cd;
  sincos_poly(a.h, 0.f, &sa, &ca);
  // heading difference as an exact pair (Knuth's two-sum): identical headings give (0, 1)
  float dh = b.h - a.h;
  float bv = dh - b.h;
  float dh_lo = (b.h - (dh - bv)) + (-a.h - bv);
  sincos_poly(dh, dh_lo, &sd, &cd);
  // b's centre in a's frame (local origin)
  const float wx = b.x - a.x, wy = b.y - a.y;
  const float ox = ca * wx + sa * wy, oy = ca * wy - sa * wx;
  const float ux = cd * hxb, uy = sd * hxb, vx = -sd * hyb, vy = cd * hyb;
  const float area_a = a.dx * a.dy, area_b = b.dx * b.dy;
  // containment within a few ulps of each test's terms: the inner rectangle's area, exactly
  const float ulps = 4.0f * 1.1920928955078125e-07f;
  const float w1 = fabsf(wx) + fabsf(wy);
  const float ex = fabsf(ux) + fabsf(vx), eyy = fabsf(uy) + fabsf(vy);
  if (fabsf(ox) + ex <= hxa + ulps * (w1 + hxa + ex) && fabsf(oy) + eyy <= hya + ulps * (w1 + hya + eyy))
    return fminf(area_b, area_a);
  const float pbx = -(cd * ox + sd * oy), pby = -(cd * oy - sd * ox);
  const float fx = fabsf(cd * hxa) + fabsf(sd * hya), fy = fabsf(sd * hxa) + fabsf(cd * hya);
  if (fabsf(pbx) + fx <= hxb + ulps * (w1 + hxb + fx) && fabsf(pby) + fy <= hyb + ulps * (w1 + hyb + fy))
    return fminf(area_a, area_b);
  // b's corners, counter-clockwise
  float cx[4] = {ox + ux + vx, ox - ux + vx, ox - ux - vx, ox + ux - vx};
  float cy[4] = {oy + uy + vy, oy - uy + vy, oy - uy - vy, oy + uy - vy};
  // stage 1: |x| <= hxa -> 8 points
  float px[8], py[8];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    slab(cx[k], cy[k], cx[(k + 1) & 3], cy[(k + 1) & 3], hxa, px[2 * k], py[2 * k], px[2 * k + 1], py[2 * k + 1]);
  // stage 2: |y| <= hya on each of the 8 edges -> 16 points; shoelace
  float qx[16], qy[16];
#pragma unroll
  for (int k = 0; k < 8; ++k)
    slab(py[k], px[k], py[(k + 1) & 7], px[(k + 1) & 7], hya, qy[2 * k], qx[2 * k], qy[2 * k + 1], qx[2 * k + 1]);
  float twice = 0.f;
#pragma unroll
  for (int k = 0; k < 16; ++k) twice += cross2(qx[k], qy[k], qx[(k + 1) & 15], qy[(k + 1) & 15]);
  return fminf(fmaxf(twice * 0.5f, 0.f), fminf(area_a, area_b));
}

__device__ __forceinline__ bool circles_touch(const Box& a, const Box& b) {
  float ra = 0.5f * sqrtf(a.dx * a.dx + a.dy * a.dy), rb = 0.5f * sqrtf(b.dx * b.dx + b.dy * b.dy);
  float wx = b.x - a.x, wy = b.y - a.y;
  float reach = (ra + rb) * 1.0001f + 1e-6f;
  return wx * wx + wy * wy <= reach * reach;
}

// IoU matrix: one thread per pair. a: (N, stride_a), b: (M, stride_b) float32; out: (N, M) float32.
extern "C" __global__ void boxes_iou(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                                     int n, int m, int stride_a, int stride_b, int bev5, int three_d) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  int i = blockIdx.y * blockDim.y + threadIdx.y;
  if (i >= n || j >= m) return;
  Box A = load_box(a, i, stride_a, bev5, true);
  Box B = load_box(b, j, stride_b, bev5, true);
  float inter = (A.ok && B.ok && circles_touch(A, B)) ? pair_inter(A, B) : 0.f;
  float size_a = A.dx * A.dy, size_b = B.dx * B.dy;
  if (three_d) {
    float top = fminf(A.z + A.dz * 0.5f, B.z + B.dz * 0.5f), bottom = fmaxf(A.z - A.dz * 0.5f, B.z - B.dz * 0.5f);
    inter *= fmaxf(top - bottom, 0.f);
    size_a *= A.dz;
    size_b *= B.dz;
  }
  size_a = A.ok ? size_a : 0.f;
  size_b = B.ok ? size_b : 0.f;
  float uni = size_a + size_b - inter;
  out[(long long)i * m + j] = uni > 0.f ? inter / uni : 0.f;
}

// ---- the batched pipeline (pcops.cuda.nms.nms_padded): rank sort + box preparation, tile mask,
// greedy pass (nms_pass_b, below), each launch covering B independent samples (grid over B) -------
// Sorted, prepared boxes: SBOX floats per box in score order, (x, y, radius of the bounding
// circle, heading) and (dx, dy, ok, 0); an invalid box (non-finite, negative size, NaN score) is
// the unit box with radius NaN (never a candidate) and ok 0.
#define SBOX 8
#define RANK_THREADS 256
#define RANK_CHUNK 2048
#define MASKB_THREADS 64
#define F32_NAN __int_as_float(0x7fc00000)

// 64-bit key, larger = earlier: the score's order-preserving bits (NaN as -inf, -0 as +0) over the
// complemented index (equal scores: the lower index first). All keys of a sample are distinct.
__device__ __forceinline__ unsigned long long rank_key(float s, int j) {
  unsigned u = __float_as_uint(s);
  if (s != s) u = 0xff800000u;
  if ((u << 1) == 0u) u = 0u;
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned)j);
}

// Prepared record of box i (boxes: one sample's (N, stride) rows) with score s, at dst (16-byte aligned).
__device__ __forceinline__ void write_prepared(float* __restrict__ dst, const float* __restrict__ boxes, long long i,
                                               int stride, int bev5, float s) {
  const Box b = load_box(boxes, i, stride, bev5, true);
  const bool ok = b.ok && s == s;
  float4* d = (float4*)dst;
  d[0] = make_float4(ok ? b.x : 0.f, ok ? b.y : 0.f, ok ? 0.5f * sqrtf(b.dx * b.dx + b.dy * b.dy) : F32_NAN,
                     ok ? b.h : 0.f);
  d[1] = make_float4(ok ? b.dx : 1.f, ok ? b.dy : 1.f, ok ? 1.f : 0.f, 0.f);
}

__device__ __forceinline__ Box prepared_box(float4 p0, float4 p1) {
  Box b;
  b.x = p0.x; b.y = p0.y; b.dx = p1.x; b.dy = p1.y; b.h = p0.w;
  b.z = 0.f; b.dz = 0.f;
  b.ok = p1.z != 0.f;
  return b;
}

// Stable descending sort by ranking: rank(i) = #{j : key_j > key_i}. Grid (ceil(N / 32), B); the 8
// warps of a block count over eighths of the keys (staged in shared memory) for the same 32 boxes.
// Boxes of rank < M are written in score order: order (B, M) int64 (index within the sample),
// sbox (B, M, SBOX) float32, sgroups (B, M) int64 (when has_groups). boxes (B, N, stride),
// scores (B, N) float32, groups (B, N) int64.
extern "C" __global__ void __launch_bounds__(RANK_THREADS)
nms_rank(const float* __restrict__ boxes, const float* __restrict__ scores, const long long* __restrict__ groups,
         int has_groups, int n, int m, int stride, int bev5, long long* __restrict__ order,
         float* __restrict__ sbox, long long* __restrict__ sgroups) {
  __shared__ unsigned long long keys[RANK_CHUNK];
  __shared__ int partial[RANK_THREADS / 32][32];
  __shared__ unsigned s_unsorted;
  const int b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* __restrict__ sc = scores + (long long)b * n;
  const int i = blockIdx.x * 32 + lane;
  const unsigned long long ki = i < n ? rank_key(sc[i], i) : 0ull;
  // already in order (e.g. top-k scores): rank(i) = i, no counting (O(N) per block, not O(N^2 / 8))
  if (tid == 0) s_unsorted = 0u;
  __syncthreads();
  bool unsorted = false;
#pragma unroll 8
  for (int k = tid; k + 1 < n; k += RANK_THREADS) unsorted |= rank_key(sc[k], k) < rank_key(sc[k + 1], k + 1);
  if (unsorted) atomicOr(&s_unsorted, 1u);
  __syncthreads();
  int cnt = s_unsorted ? 0 : (i < n ? i : 0);
  for (int c0 = 0; s_unsorted && c0 < n; c0 += RANK_CHUNK) {
    const int len = min(RANK_CHUNK, n - c0);
    __syncthreads();  // the previous chunk is consumed
#pragma unroll 8
    for (int k = tid; k < len; k += RANK_THREADS) keys[k] = rank_key(sc[c0 + k], c0 + k);
    __syncthreads();
    const int per = (len + RANK_THREADS / 32 - 1) / (RANK_THREADS / 32);
    const int k1 = min(len, (warp + 1) * per);
#pragma unroll 4
    for (int k = warp * per; k < k1; ++k) cnt += keys[k] > ki ? 1 : 0;
  }
  partial[warp][lane] = warp == 0 || s_unsorted ? cnt : 0;
  __syncthreads();
  if (warp == 0 && i < n) {
    int r = 0;
#pragma unroll
    for (int w = 0; w < RANK_THREADS / 32; ++w) r += partial[w][lane];
    if (r < m) {
      const long long dst = (long long)b * m + r;
      order[dst] = i;
      write_prepared(sbox + dst * SBOX, boxes + (long long)b * n * stride, i, stride, bev5, sc[i]);
      if (has_groups) sgroups[dst] = groups[(long long)b * n + i];
    }
  }
}

// The same outputs from a given order (B, M) int64 (e.g. torch.sort's, for large N or float64
// scores): grid (ceil(M / blockDim.x), B).
extern "C" __global__ void nms_gather(const float* __restrict__ boxes, const float* __restrict__ scores,
                                      const long long* __restrict__ groups, int has_groups, int n, int m, int stride,
                                      int bev5, const long long* __restrict__ order, float* __restrict__ sbox,
                                      long long* __restrict__ sgroups) {
  const int b = blockIdx.y, p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= m) return;
  const long long dst = (long long)b * m + p, i = order[dst];
  write_prepared(sbox + dst * SBOX, boxes + (long long)b * n * stride, i, stride, bev5, scores[(long long)b * n + i]);
  if (has_groups) sgroups[dst] = groups[(long long)b * n + i];
}

// Bit r: the bounding circle of row box r (rc[r] = (x, y, radius, heading)) touches the column box's
// (the arithmetic of circles_touch; NaN radii, i.e. invalid boxes and rows past M, never touch)
// and, with groups, the groups are equal. Fully unrolled: constant bit positions.
template <bool GROUPS>
__device__ __forceinline__ unsigned long long cull_column(const float4* rc, const long long* rg, float cx, float cy,
                                                          float crad, long long cg) {
  unsigned long long cand = 0ull;
#pragma unroll
  for (int r = 0; r < NMS_TILE; ++r) {
    const float4 p = rc[r];
    const float wx = cx - p.x, wy = cy - p.y;
    const float reach = (p.z + crad) * 1.0001f + 1e-6f;
    bool t = wx * wx + wy * wy <= reach * reach;
    if (GROUPS) t = t && rg[r] == cg;
    if (t) cand |= 1ull << r;
  }
  return cand;
}

// Upper-triangular IoU > thr bitmask of the prepared boxes, mask (B, M, W) (bit c of word ct of row
// i: box j = 64 ct + c comes after i, shares its group, IoU > thr), and invalid (B, W): bit k of word
// t set when row 64 t + k is invalid or >= M (written by the diagonal tiles). Grid
// (W (W + 1) / 2, B), MASKB_THREADS = 64 threads (words of tiles without a valid row or column
// box are not written, see below): thread c holds column box 64 ct + c in registers
// and tests the bounding circles of the 64 row boxes (broadcast shared reads, no bank conflicts);
// the candidate pairs are compacted (warp scan) and clipped by all threads.
extern "C" __global__ void __launch_bounds__(MASKB_THREADS, 16)
nms_mask_b(const float* __restrict__ sbox, const long long* __restrict__ sgroups, int has_groups, int m, int words,
           float thr, unsigned long long* __restrict__ mask, unsigned long long* __restrict__ invalid) {
  const long long L = blockIdx.x;
  int ct = (int)((sqrtf(8.f * (float)L + 1.f) - 1.f) * 0.5f);
  while ((long long)(ct + 1) * (ct + 2) / 2 <= L) ++ct;
  while ((long long)ct * (ct + 1) / 2 > L) --ct;
  const int rt = (int)(L - (long long)ct * (ct + 1) / 2);
  const int b = blockIdx.y;

  __shared__ float4 r0s[NMS_TILE], r1s[NMS_TILE], c0s[NMS_TILE], c1s[NMS_TILE];
  __shared__ long long rgs[NMS_TILE];
  __shared__ unsigned bits32[2 * NMS_TILE];
  __shared__ unsigned short list[NMS_TILE * NMS_TILE];
  __shared__ int n_list;
  const int tid = threadIdx.x, lane = tid & 31;
  const float4* __restrict__ sb = (const float4*)(sbox + (long long)b * m * SBOX);
  const long long* __restrict__ sg = sgroups + (long long)b * m;
  const float4 dead0 = make_float4(0.f, 0.f, F32_NAN, 0.f), dead1 = make_float4(1.f, 1.f, 0.f, 0.f);
  const int i = rt * NMS_TILE + tid, j = ct * NMS_TILE + tid;
  const float4 a0 = i < m ? sb[2 * (long long)i] : dead0, a1 = i < m ? sb[2 * (long long)i + 1] : dead1;
  const float4 b0 = j < m ? sb[2 * (long long)j] : dead0, b1 = j < m ? sb[2 * (long long)j + 1] : dead1;
  const long long gj = (has_groups && j < m) ? sg[j] : 0;
  r0s[tid] = a0;
  r1s[tid] = a1;
  c0s[tid] = b0;
  c1s[tid] = b1;
  rgs[tid] = (has_groups && i < m) ? sg[i] : 0;
  bits32[tid] = 0u;
  bits32[tid + NMS_TILE] = 0u;
  if (tid == 0) n_list = 0;
  if (rt == ct) {
    const unsigned bad = __ballot_sync(0xffffffffu, !(a1.z != 0.f));
    if (lane == 0) ((unsigned*)invalid)[2 * ((long long)b * words + rt) + (tid >> 5)] = bad;
  }
  // A tile whose rows or columns are all invalid (e.g. a NaN-score tail) has no bits: its words
  // are left unwritten. The pass never uses them: it reads words of valid (kept or undecided)
  // rows only, and ORs them into "removed" words whose boxes are all removed from the start.
  const int any_row = __syncthreads_or(a1.z != 0.f), any_col = __syncthreads_or(b1.z != 0.f);
  if (!any_row || !any_col) return;
  unsigned long long cand = has_groups ? cull_column<true>(r0s, rgs, b0.x, b0.y, b0.z, gj)
                                       : cull_column<false>(r0s, rgs, b0.x, b0.y, b0.z, gj);
  if (rt == ct) cand &= (1ull << tid) - 1ull;  // rows before the column only
  // compact the candidates (r << 6 | c) into list: warp inclusive scan, one atomic per warp
  const int cnt = __popcll(cand);
  int incl = cnt;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int base = 0;
  if (lane == 31) base = atomicAdd(&n_list, incl);
  base = __shfl_sync(0xffffffffu, base, 31);
  int pos = base + incl - cnt;
  while (cand) {
    const int r = __ffsll((long long)cand) - 1;
    cand &= cand - 1ull;
    list[pos++] = (unsigned short)((r << 6) | tid);
  }
  __syncthreads();
  const int total = n_list;
  for (int k = tid; k < total; k += MASKB_THREADS) {
    const int p = list[k], r = p >> 6, c = p & 63;
    const Box A = prepared_box(r0s[r], r1s[r]), B = prepared_box(c0s[c], c1s[c]);
    const float inter = pair_inter(A, B);
    const float uni = A.dx * A.dy + B.dx * B.dy - inter;
    const float iou = uni > 0.f ? inter / uni : 0.f;
    if (iou > thr) atomicOr(&bits32[2 * r + (c >> 5)], 1u << (c & 31));
  }
  __syncthreads();
  if (i < m)
    mask[((long long)b * m + i) * words + ct] = ((unsigned long long)bits32[2 * tid + 1] << 32) | bits32[2 * tid];
}

// ---- the greedy pass (nms_pass_b): the exact greedy result of the bitmask, one block per sample ----
// Per tile only one L2 latency stays on the critical path:
//  * invalid boxes start out removed (the invalid words of nms_mask_b): their rows are never ORed;
//  * warp 0 (the leader) resolves tile t from register-held diagonal words (lane l holds rows l and
//    l + 32), prefetched one tile ahead with the same rows' next word and their box indices (two
//    alternating register sets: the prefetch stays in flight across the barrier). The resolve runs
//    in rounds of two warp OR-reductions (__reduce_or_sync): every undecided box that no earlier
//    undecided box suppresses is kept, then the boxes those suppress are removed (random scenes
//    need 1-3 rounds). After NMS_ROUNDS rounds the rest goes one kept box at a time (lowest
//    undecided box, its row by __shfl_sync);
//  * the leader ORs tile t's kept rows into word t + 1 itself (from the prefetched words), so the
//    other warps apply tile t to words >= t + 2 during the next iteration, overlapped with the
//    leader's resolve of tile t + 1: one __syncthreads per tile;
//  * the workers read only kept rows (a compact list from the leader), coalesced over words.
// OR of word w of listed rows: loads are issued in groups of PASS_BATCH independent loads (one
// memory latency per group, not per row).
#define PASS_BATCH 8
#define NMS_ROUNDS 6
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ unsigned long long warp_or64(unsigned long long v) {
  const unsigned lo = __reduce_or_sync(FULL_MASK, (unsigned)v);
  const unsigned hi = __reduce_or_sync(FULL_MASK, (unsigned)(v >> 32));
  return ((unsigned long long)hi << 32) | lo;
}

// OR of lane l's rows l and l + 32 that are selected in s
__device__ __forceinline__ unsigned long long pick_rows(unsigned long long s, int lane, unsigned long long r0,
                                                        unsigned long long r1) {
  return (((s >> lane) & 1ull) ? r0 : 0ull) | (((s >> (lane + 32)) & 1ull) ? r1 : 0ull);
}

// The leader's registers for a tile t: rows 64t + lane (0) and 64t + lane + 32 (1): their diagonal
// word t (d), their word t + 1 (n) and their box index (o); zero / -1 past the end.
struct Lead {
  unsigned long long d0, d1, n0, n1;
  long long o0, o1;
};

__device__ __forceinline__ void load_leader(const unsigned long long* __restrict__ mask,
                                            const long long* __restrict__ order, int m, int words, int t, int lane,
                                            Lead& L) {
  const int r0 = t * NMS_TILE + lane, r1 = r0 + 32;
  const bool a = t < words && r0 < m, b = t < words && r1 < m, next = t + 1 < words;
  L.d0 = a ? mask[(long long)r0 * words + t] : 0ull;
  L.d1 = b ? mask[(long long)r1 * words + t] : 0ull;
  L.n0 = (a && next) ? mask[(long long)r0 * words + t + 1] : 0ull;
  L.n1 = (b && next) ? mask[(long long)r1 * words + t + 1] : 0ull;
  L.o0 = a ? order[r0] : -1;
  L.o1 = b ? order[r1] : -1;
}

// The leader (warp 0) on tile t: prefetch tile t + 1 into nxt, resolve tile t from cur (removed[t]
// holds the invalid bits and the kept rows of tiles <= t - 2, carry those of tile t - 1), write
// the kept box indices, set carry to the kept rows at word t + 1, publish the kept set, its compact
// list and the running count for the workers. The caller alternates two Lead sets (no register
// copies that would wait for the prefetch before the barrier).
__device__ __forceinline__ unsigned long long resolve_tile(unsigned long long und, int lane, unsigned long long d0,
                                                           unsigned long long d1, long long o0, long long o1,
                                                           int count, int post, long long* __restrict__ out,
                                                           unsigned char* list);

__device__ __forceinline__ void leader_tile(const unsigned long long* __restrict__ mask,
                                            const long long* __restrict__ order, int m, int words, int post, int t,
                                            int lane, const Lead& cur, Lead& nxt, const unsigned long long* removed,
                                            unsigned long long& carry, int& count, long long* __restrict__ out,
                                            unsigned long long* s_kept, int* s_count, int* s_total,
                                            unsigned char* list) {
  load_leader(mask, order, m, words, t + 1, lane, nxt);
  const unsigned long long kept =
      resolve_tile(~(removed[t] | carry), lane, cur.d0, cur.d1, cur.o0, cur.o1, count, post, out, list);
  carry = warp_or64(pick_rows(kept, lane, cur.n0, cur.n1));
  count += __popcll(kept);
  if (lane == 0) {
    *s_kept = kept;
    *s_count = count;
    *s_total = count;
  }
}

// The greedy resolve of one tile by the leader warp: und = its undecided boxes, lane l holds the
// diagonal words d0, d1 of rows l and l + 32 and their box indices o0, o1. Writes the kept boxes'
// indices at out[count + rank] (below post) and their rows into list; returns the kept set.
__device__ __forceinline__ unsigned long long resolve_tile(unsigned long long und, int lane, unsigned long long d0,
                                                           unsigned long long d1, long long o0, long long o1,
                                                           int count, int post, long long* __restrict__ out,
                                                           unsigned char* list) {
  unsigned long long kept = 0ull;
  for (int round = 0; und && round < NMS_ROUNDS; ++round) {
    // rows only have bits above their own: a box no undecided earlier box suppresses is kept
    const unsigned long long fresh = und & ~warp_or64(pick_rows(und, lane, d0, d1));
    kept |= fresh;
    und &= ~(fresh | warp_or64(pick_rows(fresh, lane, d0, d1)));
  }
  while (und) {  // the lowest undecided box is kept (every box before it is decided)
    const int b = __ffsll((long long)und) - 1;
    const unsigned long long src = b < 32 ? d0 : d1;
    const unsigned lo = __shfl_sync(FULL_MASK, (unsigned)src, b & 31);
    const unsigned hi = __shfl_sync(FULL_MASK, (unsigned)(src >> 32), b & 31);
    kept |= 1ull << b;
    und &= ~((((unsigned long long)hi << 32) | lo) | (1ull << b));
  }
  const unsigned klo = (unsigned)kept, khi = (unsigned)(kept >> 32), below = (1u << lane) - 1u;
  if ((klo >> lane) & 1u) {
    const int rank = __popc(klo & below);
    if (count + rank < post) out[count + rank] = o0;
    list[rank] = (unsigned char)lane;
  }
  if ((khi >> lane) & 1u) {
    const int rank = __popc(klo) + __popc(khi & below);
    if (count + rank < post) out[count + rank] = o1;
    list[rank] = (unsigned char)(lane + 32);
  }
  return kept;
}

// OR of word w of the rows row0 + list[k], k = first, first + step, ... < nk (PASS_BATCH loads in flight).
__device__ __forceinline__ unsigned long long or_listed_rows(const unsigned long long* __restrict__ mask,
                                                             long long row0, int words, int w,
                                                             const unsigned char* list, int nk, int first, int step) {
  unsigned long long acc = 0ull;
  for (int k0 = first; k0 < nk; k0 += PASS_BATCH * step) {
    unsigned long long v[PASS_BATCH];
#pragma unroll
    for (int q = 0; q < PASS_BATCH; ++q) {
      const int k = k0 + q * step;
      v[q] = k < nk ? mask[(row0 + list[k]) * words + w] : 0ull;
    }
#pragma unroll
    for (int q = 0; q < PASS_BATCH; ++q) acc |= v[q];
  }
  return acc;
}

// The pipelined loop of nms_pass_b for one sample: removed (dynamic shared, words
// entries) already holds the invalid bits; mask (M, W), order (M,), out (post,), count_out ().
__device__ __forceinline__ void pass_pipeline(const unsigned long long* __restrict__ mask,
                                              const long long* __restrict__ order, int m, int words, int post,
                                              long long* __restrict__ out, long long* __restrict__ count_out,
                                              unsigned long long* removed) {
  __shared__ unsigned long long s_kept[2];
  __shared__ int s_count[2];
  __shared__ int s_total, s_tiles;
  __shared__ unsigned char s_list[2][NMS_TILE];
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  if (tid == 0) {
    s_total = 0;
    s_tiles = 0;
  }
  __syncthreads();  // the caller's removed[] and the counters
  // tiles past the last one with a valid box have nothing to keep (e.g. a NaN-score tail): skipped
  for (int w = tid; w < words; w += nt)
    if (~removed[w]) atomicMax(&s_tiles, w + 1);

  Lead la, lb;  // the leader's registers: tile t in la when t is even, in lb when odd
  unsigned long long carry = 0ull;
  int count = 0;  // the leader's running count (equal to s_count of the last tile)
  if (tid < 32) load_leader(mask, order, m, words, 0, lane, la);
  __syncthreads();
  const int tiles = s_tiles;

  bool stop = post <= 0;
  for (int t = 0; t < tiles && !stop; ++t) {
    const int cur = t & 1;
    if (tid < 32) {
      if (cur == 0)
        leader_tile(mask, order, m, words, post, t, lane, la, lb, removed, carry, count, out, &s_kept[0], &s_count[0],
                    &s_total, s_list[0]);
      else
        leader_tile(mask, order, m, words, post, t, lane, lb, la, removed, carry, count, out, &s_kept[1], &s_count[1],
                    &s_total, s_list[1]);
    } else if (t > 0) {
      // workers: tile t - 1's kept rows remove boxes of words t + 1 .. tiles - 1
      const int prev = cur ^ 1, rest = tiles - t - 1;
      const unsigned long long kept = s_kept[prev];
      const int nk = __popcll(kept);
      if (nk && rest > 0) {
        const int wid = tid - 32, nw = nt - 32;
        const long long row0 = (long long)(t - 1) * NMS_TILE;
        if (rest >= nw) {
          for (int w = t + 1 + wid; w < tiles; w += nw)
            removed[w] |= or_listed_rows(mask, row0, words, w, s_list[prev], nk, 0, 1);
        } else {
          // as few threads per word as keep one batch of loads per thread (less atomic contention)
          const int groups = min(nw / rest, (nk + PASS_BATCH - 1) / PASS_BATCH);
          const int g = wid / rest, w = t + 1 + wid % rest;
          if (g < groups) {
            const unsigned long long acc = or_listed_rows(mask, row0, words, w, s_list[prev], nk, g, groups);
            if (groups == 1) {
              removed[w] |= acc;
            } else {  // 32-bit shared atomics (native)
              unsigned* half = (unsigned*)&removed[w];
              if ((unsigned)acc) atomicOr(half, (unsigned)acc);
              if (acc >> 32) atomicOr(half + 1, (unsigned)(acc >> 32));
            }
          }
        }
      }
    }
    __syncthreads();
    stop = s_count[cur] >= post;
  }
  const int total = s_total < post ? s_total : post;
  for (int p = total + tid; p < post; p += nt) out[p] = -1;
  if (tid == 0) *count_out = total;
}

// The greedy pass of the batched pipeline: one block of PASS_THREADS per sample (grid (B,)), the
// pipeline above started from the invalid words of nms_mask_b. mask (B, M, W), invalid
// (B, W), order (B, M) int64; out (B, post) int64 -1 padded, count_out (B,) int64. Dynamic shared
// memory: words * 8 bytes.
extern "C" __global__ void __launch_bounds__(PASS_THREADS)
nms_pass_b(const unsigned long long* __restrict__ mask, const unsigned long long* __restrict__ invalid,
           const long long* __restrict__ order, int m, int words, int post, long long* __restrict__ out,
           long long* __restrict__ count_out) {
  extern __shared__ unsigned long long removed[];
  const long long b = blockIdx.x;
  for (int w = threadIdx.x; w < words; w += blockDim.x) removed[w] = invalid[b * words + w];
  pass_pipeline(mask + b * m * words, order + b * m, m, words, post, out + b * post, count_out + b, removed);
}
