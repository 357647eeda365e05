/* FlashAttention-2, forward and backward, bf16 on tensor cores (mma.sync
 * m16n8k16 with f32 accumulators, through tfhost.cuh), for contiguous
 * (B, H, T, D) q, k, v, o, dout and (B, H, T) f32 lse and delta, head dim
 * D 64 or 128, with or without the causal mask (key j visible to query i
 * iff j <= i). T is any length >= 1: rows and keys past T are zero-filled
 * in shared memory, masked out of every softmax and never written.
 * scale > 0 (1 / sqrt(D) in practice): scores are scale q.k.
 *
 * Launches (block 128 threads = 4 warps everywhere but the prep kernel;
 * LD = D + 8 elements a shared row; bytes of dynamic shared memory):
 *
 *   flash2_fwd<D, CAUSAL>(q, k, v, o, lse, T, scale)
 *     grid (ceil(T / 128), B H), block 128; shared (128 + 4 KT) LD 2:
 *     D 64: 55296 (KT 64), D 128: 69632 (KT 32).
 *     128 queries a block (32 a warp), key tiles of KT double-buffered (32
 *     at D 128: 241 registers a thread and no spills, where 64 spilled).
 *   flash2_bwd_prep<D>(o, dout, delta, T)
 *     grid (ceil(T / 8), B H), block 256, no shared memory: a warp a row.
 *   flash2_bwd_dkdv<D, CAUSAL>(q, k, v, dout, lse, delta, dk, dv, T, scale)
 *     grid (ceil(T / 64), B H), block 128; shared (2 64 + 4 64) LD 2 + 4 64 4:
 *     D 64: 56320, D 128: 105472.
 *     64 keys a block (16 a warp), query tiles of 64 double-buffered.
 *   flash2_bwd_dq<D, CAUSAL>(q, k, v, dout, lse, delta, dq, T, scale)
 *     grid (ceil(T / 64), B H), block 128; shared (2 64 + 4 64) LD 2:
 *     D 64: 55296, D 128: 104448.
 *     64 queries a block (16 a warp), key tiles of 64 double-buffered.
 *
 * Above 48 KiB the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize
 * must be raised first (tfhost's launcher does it from the launch's
 * `shared`; tests/gpu/own_kernel_nvcc.cu does it itself). At D 128 two
 * blocks of any kernel fit an SM's 227 KiB. The backward pass runs prep,
 * then dkdv and dq (either order): no atomics, the same bits every run.
 *
 * Fragments (tfhost.cuh's comment, PTX ISA "mma.m16n8k16"): lane = 4 g + t
 * holds rows g and g + 8 of a 16 x 8 f32 accumulator, columns 2t and 2t + 1
 * (c[0], c[1] row g; c[2], c[3] row g + 8). Two accumulators side by side
 * (16 columns) packed in pairs are the A operand of a product whose k runs
 * along those columns: P and dS never leave registers. A operands come
 * from row-major tiles by ldmatrix at frag_a_offset; B operands of Q K^T
 * style products (B^T row-major: K in Q K^T) by ldmatrix at frag_b_offset;
 * B operands stored [k][n] (V in P V, dO in P^T dO, Q in dS^T Q, K in dS K)
 * by ldmatrix.trans at frag_a_offset.
 *
 * Backward, with P = exp(scale S - lse):
 *   dV = P^T dO, dP = dO V^T, dS = P (dP - delta), dQ = scale dS K,
 *   dK = scale dS^T Q, delta = rowsum(dO * O).
 * The dK/dV kernel works on transposed scores (S^T = K Q^T, dP^T = V dO^T)
 * so that P^T and dS^T come out as A operands of dV and dK. */
#include <tfhost.cuh>

namespace flash2 {

typedef __nv_bfloat16 bf16;

enum {
  THREADS = 128,  /* 4 warps */
  FWD_ROWS = 128, /* queries a forward block: 2 row tiles of 16 a warp */
  BWD_TILE = 64,  /* keys a dK/dV block, queries a dQ block, and the tiles they walk */
};

template <int D> struct dims {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  /* enumerators, not static constexpr members: NVRTC makes those device variables */
  enum {
    LD = D + 8, /* 16 bytes of padding: ldmatrix rows in distinct banks */
    KEY_TILE = D == 128 ? 32 : 64, /* keys a forward step: 32 at D 128 keep its registers under 255, unspilled */
    FWD_SMEM = (FWD_ROWS + 4 * KEY_TILE) * LD * 2,
    DKDV_SMEM = (2 * BWD_TILE + 4 * BWD_TILE) * LD * 2 + 4 * BWD_TILE * 4,
    DQ_SMEM = (2 * BWD_TILE + 4 * BWD_TILE) * LD * 2,
  };
};

template <bool B> struct flag {
  static constexpr bool value = B;
};

__device__ __forceinline__ unsigned byte_offset(int elements) { return (unsigned)(elements * 2); }

/* Rows [row0, row0 + ROWS) of a (T, D) bf16 matrix into shared rows of LD
 * elements at the shared address dst by the block's THREADS threads, 16
 * bytes a cp.async; rows past T are zero-filled (their source is the
 * matrix's first element, never read). Not committed. Shared addresses are
 * 32-bit numbers taken once from the tile's base: NVRTC, unlike nvcc, keeps
 * pointer arithmetic on shared memory in 64 bits. */
template <int ROWS, int D, int LD>
__device__ __forceinline__ void load_tile(unsigned dst, const bf16 *src, int row0, int T) {
  constexpr int CHUNKS = D / 8, STEP = THREADS / CHUNKS;
  static_assert(THREADS % CHUNKS == 0 && ROWS % STEP == 0, "the tile splits evenly over the threads");
  const int r = (int)threadIdx.x / CHUNKS, ch = (int)threadIdx.x % CHUNKS;
  const unsigned s = dst + byte_offset(r * LD + ch * 8);
#pragma unroll
  for (int i = 0; i < ROWS / STEP; i++) {
    const int row = row0 + r + i * STEP;
    const bool in = row < T;
    tf::cp_async16(s + byte_offset(i * STEP * LD), in ? src + (long long)row * D + ch * 8 : src, in);
  }
}

/* ROWS f32 statistics (lse, delta) from row0 into shared memory, 0 past T. Not committed. */
template <int ROWS> __device__ __forceinline__ void load_stat(unsigned dst, const float *src, int row0, int T) {
  static_assert(ROWS <= THREADS, "one value a thread");
  const int r = (int)threadIdx.x;
  if (r < ROWS) {
    const bool in = row0 + r < T;
    tf::cp_async4(dst + 4u * (unsigned)r, in ? src + row0 + r : src, in);
  }
}

/* A warp's `rows` shared rows (LD elements apart from src) to global rows
 * row0.. of a (T, D) matrix, 16 bytes a lane; rows past T are skipped. */
template <int D, int LD>
__device__ __forceinline__ void store_rows(bf16 *dst, const bf16 *src, int rows, int row0, int T) {
  constexpr int CHUNKS = D / 8;
  const int lane = (int)threadIdx.x % 32;
  for (int c = lane; c < rows * CHUNKS; c += 32) {
    const int r = c / CHUNKS, ch = c % CHUNKS;
    if (row0 + r < T)
      *reinterpret_cast<uint4 *>(dst + (long long)(row0 + r) * D + ch * 8) =
          *reinterpret_cast<const uint4 *>(src + r * LD + ch * 8);
  }
}

/* Accumulators lo (columns 16 kk .. + 7) and hi (+ 8 .. + 15) as the A operand of a product over those columns. */
__device__ __forceinline__ void acc_to_a(unsigned (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = tf::pack_bf16x2(lo[0], lo[1]);
  a[1] = tf::pack_bf16x2(lo[2], lo[3]);
  a[2] = tf::pack_bf16x2(hi[0], hi[1]);
  a[3] = tf::pack_bf16x2(hi[2], hi[3]);
}

template <int N> __device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
}

/* c[m][n] += A_m B_n^T over KD columns: A_m the 16-row tile m of M at
 * a_addr (the lane's ldmatrix address, rows of LD elements), B^T the N
 * 8-row tiles at b_addr (frag_b_offset address); both row-major with k
 * along the rows. Each B fragment feeds all M row tiles. */
template <int M, int N, int KD, int LD>
__device__ __forceinline__ void mma_abt(float (&c)[M][N][4], unsigned a_addr, unsigned b_addr) {
  static_assert(N % 2 == 0 && KD % 16 == 0, "whole fragment pairs");
#pragma unroll
  for (int kk = 0; kk < KD / 16; kk++) {
    unsigned a[M][4];
#pragma unroll
    for (int m = 0; m < M; m++) tf::ldmatrix_x4(a[m], a_addr + byte_offset(m * 16 * LD + kk * 16));
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      unsigned b[4];
      tf::ldmatrix_x4(b, b_addr + byte_offset(n * 8 * LD + kk * 16));
#pragma unroll
      for (int m = 0; m < M; m++) {
        tf::mma_16816<bf16>(c[m][n], a[m], b[0], b[1]);
        tf::mma_16816<bf16>(c[m][n + 1], a[m], b[2], b[3]);
      }
    }
  }
}

/* c[m][n] += X_m B over K16 steps of 16: X_m from the accumulators x[m]
 * (16 rows, 16 K16 columns, in registers), B a [k][n] row-major tile at
 * bt_addr (frag_a_offset address, rows of LD elements), N 8-column tiles.
 * Each B fragment feeds all M row tiles. */
template <int M, int N, int K16, int LD>
__device__ __forceinline__ void mma_acc_b(float (&c)[M][N][4], const float (&x)[M][2 * K16][4], unsigned bt_addr) {
#pragma unroll
  for (int kk = 0; kk < K16; kk++) {
    unsigned a[M][4];
#pragma unroll
    for (int m = 0; m < M; m++) acc_to_a(a[m], x[m][2 * kk], x[m][2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      unsigned b[4];
      tf::ldmatrix_x4_trans(b, bt_addr + byte_offset(kk * 16 * LD + n * 8));
#pragma unroll
      for (int m = 0; m < M; m++) {
        tf::mma_16816<bf16>(c[m][n], a[m], b[0], b[1]);
        tf::mma_16816<bf16>(c[m][n + 1], a[m], b[2], b[3]);
      }
    }
  }
}

/* The same for one row tile (the backward kernels: a warp's 16 rows). */
template <int N, int KD, int LD> __device__ __forceinline__ void mma_abt(float (&c)[N][4], unsigned a_addr, unsigned b_addr) {
  mma_abt<1, N, KD, LD>(reinterpret_cast<float (&)[1][N][4]>(c), a_addr, b_addr);
}

template <int N, int K16, int LD>
__device__ __forceinline__ void mma_acc_b(float (&c)[N][4], const float (&x)[2 * K16][4], unsigned bt_addr) {
  mma_acc_b<1, N, K16, LD>(reinterpret_cast<float (&)[1][N][4]>(c), reinterpret_cast<const float (&)[1][2 * K16][4]>(x),
                           bt_addr);
}

} /* namespace flash2 */

/* ---- forward ------------------------------------------------------------------------------------ */

/* One block: 128 queries of one (b, h), 32 a warp (two 16-row tiles), over
 * the key tiles that they see; the online softmax in registers (scores in
 * log2 units, scale log2 e folded in), O in f32 registers until the end,
 * written through the warp's own Q rows. Causal: the query blocks go
 * last-first (the longest start first), and a warp skips a masked key tile
 * wholly past its last row. */
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2) flash2_fwd(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                                     __nv_bfloat16 *o, float *lse, int T, float scale) {
  using namespace flash2;
  constexpr int LD = dims<D>::LD, BR = FWD_ROWS, BC = dims<D>::KEY_TILE, MT = 2, NT = BC / 8, DN = D / 8;
  bf16 *sQ = tf::dynamic_smem<bf16>(); /* Q's rows, then K's and V's (two buffers each) */
  const unsigned sQ_a = tf::smem_addr(sQ), sK_a = sQ_a + byte_offset(BR * LD), sV_a = sK_a + byte_offset(2 * BC * LD);
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  const int qblock = CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qblock * BR;
  const long long base = (long long)blockIdx.y * T;
  const bf16 *Q = q + base * D, *K = k + base * D, *V = v + base * D;

  const int key_end = CAUSAL && q0 + BR < T ? q0 + BR : T;
  const int n_tiles = (key_end + BC - 1) / BC;
  /* tiles with every key inside T and at or below every row's diagonal need no mask */
  int n_full = T / BC;
  if (CAUSAL && (q0 + 1) / BC < n_full) n_full = (q0 + 1) / BC;

  load_tile<BR, D, LD>(sQ_a, Q, q0, T);
  load_tile<BC, D, LD>(sK_a, K, 0, T);
  load_tile<BC, D, LD>(sV_a, V, 0, T);
  tf::cp_async_commit();

  const int wrow = warp * 16 * MT, wq0 = q0 + wrow;
  const unsigned q_a = sQ_a + byte_offset(wrow * LD + tf::frag_a_offset(lane, LD));
  const unsigned k_b = sK_a + byte_offset(tf::frag_b_offset(lane, LD));
  const unsigned v_bt = sV_a + byte_offset(tf::frag_a_offset(lane, LD));
  const float sl2 = scale * tf::log2e;
  const int g = lane / 4, t2 = (lane % 4) * 2;

  float acc[MT][DN][4];
  float row_max[MT][2], row_sum[MT][2]; /* max in log2 units; the lane's share of the sum */
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    zero(acc[mt]);
    row_max[mt][0] = row_max[mt][1] = -tf::infinity();
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  for (int j = 0; j < n_tiles; j++) {
    tf::cp_async_wait<0>();
    __syncthreads(); /* tile j landed; every warp is done with tile j - 1's buffer */
    if (j + 1 < n_tiles) {
      const int buf = (j + 1) & 1;
      load_tile<BC, D, LD>(sK_a + byte_offset(buf * BC * LD), K, (j + 1) * BC, T);
      load_tile<BC, D, LD>(sV_a + byte_offset(buf * BC * LD), V, (j + 1) * BC, T);
      tf::cp_async_commit();
    }
    const int k0 = j * BC;
    const bool masked = j >= n_full;
    if (wq0 >= T || (CAUSAL && masked && k0 > wq0 + 16 * MT - 1)) continue; /* nothing this warp sees */
    const unsigned kv = byte_offset((j & 1) * BC * LD);

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) zero(s[mt]);
    mma_abt<MT, NT, D, LD>(s, q_a, k_b + kv);
    /* log2 units; keys past T and (causal) past the row masked: element
     * (mt, nt, e) is key k0 + t2 + c of row wq0 + g + r, c and r the
     * constants below, masked iff c >= T - k0 - t2 or c - r > wq0 + g - k0 - t2 */
    const int key_lim = T - k0 - t2, diag = CAUSAL ? wq0 + g - k0 - t2 : BC;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = nt * 8 + (e & 1), r = mt * 16 + (e >> 1) * 8;
          s[mt][nt][e] *= sl2;
          if (masked && (c >= key_lim || c - r > diag)) s[mt][nt][e] = -tf::infinity();
        }

    /* online softmax: rows g and g + 8 of each tile, reduced over the lane quad */
    bool moved = false;
    float alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = tf::warp_max<4>(mx);
        const float ref = mx == -tf::infinity() ? 0.f : mx; /* a row that sees nothing yet: exp2(-inf) = 0 */
        alpha[mt][h] = tf::fast_exp2(row_max[mt][h] - ref);
        moved |= mx != row_max[mt][h];
        row_max[mt][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          s[mt][nt][2 * h] = tf::fast_exp2(s[mt][nt][2 * h] - ref);
          s[mt][nt][2 * h + 1] = tf::fast_exp2(s[mt][nt][2 * h + 1] - ref);
          sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
        }
        row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
      }
    /* O rescaled only when some row's max moved (late tiles seldom move it) */
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
          acc[mt][dn][0] *= alpha[mt][0];
          acc[mt][dn][1] *= alpha[mt][0];
          acc[mt][dn][2] *= alpha[mt][1];
          acc[mt][dn][3] *= alpha[mt][1];
        }
    }
    /* O += P V with P straight from the registers */
    mma_acc_b<MT, DN, BC / 16, LD>(acc, s, v_bt + kv);
  }

  /* O / sum through the warp's own Q rows (only this warp reads them), lse for rows inside T */
  __syncwarp();
  float *L = lse + base;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float sum = tf::warp_sum<4>(row_sum[mt][h]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int r = wrow + mt * 16 + g + 8 * h;
#pragma unroll
      for (int dn = 0; dn < DN; dn++)
        *reinterpret_cast<unsigned *>(sQ + r * LD + dn * 8 + t2) =
            tf::pack_bf16x2(acc[mt][dn][2 * h] * inv, acc[mt][dn][2 * h + 1] * inv);
      if (lane % 4 == 0 && q0 + r < T) L[q0 + r] = sum > 0.f ? (row_max[mt][h] + log2f(sum)) * tf::ln2 : -tf::infinity();
    }
  __syncwarp();
  store_rows<D, LD>(o + base * D, sQ + wrow * LD, 16 * MT, wq0, T);
}

/* ---- backward ----------------------------------------------------------------------------------- */

/* delta = rowsum(dout * o) in f32, a warp a row (D / 32 elements a lane, one load each). */
template <int D>
__global__ void __launch_bounds__(256) flash2_bwd_prep(const __nv_bfloat16 *o, const __nv_bfloat16 *dout, float *delta, int T) {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  constexpr int E = D / 32;
  typedef tf::vec<__nv_bfloat16, E> word;
  const int row = (int)blockIdx.x * 8 + (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  if (row >= T) return;
  const long long at = ((long long)blockIdx.y * T + row) * D + lane * E;
  const word a = *reinterpret_cast<const word *>(o + at), b = *reinterpret_cast<const word *>(dout + at);
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < E; u++) s = fmaf(tf::to_float(a.v[u]), tf::to_float(b.v[u]), s);
  s = tf::warp_sum(s);
  if (lane == 0) delta[(long long)blockIdx.y * T + row] = s;
}

/* dK and dV of 64 keys (16 a warp), K and V rows in shared memory, over
 * the query tiles of 64 that see them (causal: from the tile of the first
 * key on; only that first tile crosses the diagonal), Q, dO, lse and delta
 * double-buffered. dK and dV stay in f32 registers, are written at the end
 * through the warp's own K and V rows. Keys past T make rows of dK and dV
 * that are never written (nothing mixes keys here), so only queries are
 * masked. */
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
    flash2_bwd_dkdv(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout,
                    const float *lse, const float *delta, __nv_bfloat16 *dk, __nv_bfloat16 *dv, int T, float scale) {
  using namespace flash2;
  constexpr int LD = dims<D>::LD, BC = BWD_TILE, BR = BWD_TILE, NT = BR / 8, DN = D / 8;
  bf16 *sK = tf::dynamic_smem<bf16>(), *sV = sK + BC * LD, *sQ = sV + BC * LD, *sdO = sQ + 2 * BR * LD;
  float *sL = reinterpret_cast<float *>(sdO + 2 * BR * LD), *sDelta = sL + 2 * BR;
  const unsigned sK_a = tf::smem_addr(sK), sV_a = sK_a + byte_offset(BC * LD), sQ_a = sV_a + byte_offset(BC * LD),
                 sdO_a = sQ_a + byte_offset(2 * BR * LD), sL_a = sdO_a + byte_offset(2 * BR * LD),
                 sDelta_a = sL_a + 4u * (unsigned)(2 * BR);
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  const int k0 = (int)blockIdx.x * BC;
  const long long base = (long long)blockIdx.y * T;
  const bf16 *Q = q + base * D, *K = k + base * D, *V = v + base * D, *dO = dout + base * D;
  const float *L = lse + base, *Dl = delta + base;

  const int first = CAUSAL ? k0 / BR : 0, n_tiles = (T + BR - 1) / BR - first;
  load_tile<BC, D, LD>(sK_a, K, k0, T);
  load_tile<BC, D, LD>(sV_a, V, k0, T);
  auto load_queries = [&](int it) {
    const int buf = it & 1, r0 = (first + it) * BR;
    load_tile<BR, D, LD>(sQ_a + byte_offset(buf * BR * LD), Q, r0, T);
    load_tile<BR, D, LD>(sdO_a + byte_offset(buf * BR * LD), dO, r0, T);
    load_stat<BR>(sL_a + 4u * (unsigned)(buf * BR), L, r0, T);
    load_stat<BR>(sDelta_a + 4u * (unsigned)(buf * BR), Dl, r0, T);
  };
  load_queries(0); /* n_tiles >= 1: k0 < T */
  tf::cp_async_commit();

  const int kw = warp * 16, kw0 = k0 + kw;
  const unsigned k_a = sK_a + byte_offset(kw * LD + tf::frag_a_offset(lane, LD));
  const unsigned v_a = sV_a + byte_offset(kw * LD + tf::frag_a_offset(lane, LD));
  const unsigned q_b = sQ_a + byte_offset(tf::frag_b_offset(lane, LD)), q_bt = sQ_a + byte_offset(tf::frag_a_offset(lane, LD));
  const unsigned do_b = sdO_a + byte_offset(tf::frag_b_offset(lane, LD)), do_bt = sdO_a + byte_offset(tf::frag_a_offset(lane, LD));
  const float sl2 = scale * tf::log2e;
  const int g = lane / 4, t2 = (lane % 4) * 2;

  float acc_dk[DN][4], acc_dv[DN][4];
  zero(acc_dk);
  zero(acc_dv);

  for (int it = 0; it < n_tiles; it++) {
    tf::cp_async_wait<0>();
    __syncthreads(); /* tile it landed; every warp is done with tile it - 1's buffer */
    if (it + 1 < n_tiles) {
      load_queries(it + 1);
      tf::cp_async_commit();
    }
    const int r0 = (first + it) * BR;
    const bool masked = (CAUSAL && r0 < k0 + BC - 1) || r0 + BR > T;
    if (kw0 >= T) continue; /* the warp's keys are all past T */
    const int buf = it & 1;
    const unsigned qo = byte_offset(buf * BR * LD);
    const float *Ls = sL + buf * BR, *Ds = sDelta + buf * BR;

    float s[NT][4], dp[NT][4]; /* S^T = K Q^T, dP^T = V dO^T: rows keys g, g + 8; columns queries */
    zero(s);
    zero(dp);
    mma_abt<NT, D, LD>(s, k_a, q_b + qo);
    mma_abt<NT, D, LD>(dp, v_a, do_b + qo);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = nt * 8 + t2 + (e & 1);
        float p = tf::fast_exp2(fmaf(s[nt][e], sl2, -Ls[c] * tf::log2e));
        if (masked) {
          const int query = r0 + c, key = kw0 + g + (e >> 1) * 8;
          if (query >= T || (CAUSAL && key > query)) p = 0.f;
        }
        dp[nt][e] = p * (dp[nt][e] - Ds[c]);
        s[nt][e] = p;
      }
    /* dV += P^T dO, dK += dS^T Q (the scale at the end) */
    mma_acc_b<DN, BR / 16, LD>(acc_dv, s, do_bt + qo);
    mma_acc_b<DN, BR / 16, LD>(acc_dk, dp, q_bt + qo);
  }

  /* through the warp's own K and V rows, once no warp reads them and no copy is in flight */
  tf::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = kw + g + 8 * h;
#pragma unroll
    for (int dn = 0; dn < DN; dn++) {
      *reinterpret_cast<unsigned *>(sK + r * LD + dn * 8 + t2) =
          tf::pack_bf16x2(acc_dk[dn][2 * h] * scale, acc_dk[dn][2 * h + 1] * scale);
      *reinterpret_cast<unsigned *>(sV + r * LD + dn * 8 + t2) = tf::pack_bf16x2(acc_dv[dn][2 * h], acc_dv[dn][2 * h + 1]);
    }
  }
  __syncwarp();
  store_rows<D, LD>(dk + base * D, sK + kw * LD, 16, kw0, T);
  store_rows<D, LD>(dv + base * D, sV + kw * LD, 16, kw0, T);
}

/* dQ of 64 queries (16 a warp), Q and dO in shared memory, over the key
 * tiles of 64 they see, K and V double-buffered: S = Q K^T, dP = dO V^T,
 * dS = P (dP - delta), dQ += dS K, all in registers; one block writes each
 * row, so no atomics. Causal: the query blocks go last-first. */
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
    flash2_bwd_dq(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout,
                  const float *lse, const float *delta, __nv_bfloat16 *dq, int T, float scale) {
  using namespace flash2;
  constexpr int LD = dims<D>::LD, BR = BWD_TILE, BC = BWD_TILE, NT = BC / 8, DN = D / 8;
  bf16 *sQ = tf::dynamic_smem<bf16>(); /* Q's rows, dO's, then K's and V's (two buffers each) */
  const unsigned sQ_a = tf::smem_addr(sQ), sdO_a = sQ_a + byte_offset(BR * LD), sK_a = sdO_a + byte_offset(BR * LD),
                 sV_a = sK_a + byte_offset(2 * BC * LD);
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  const int qblock = CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qblock * BR;
  const long long base = (long long)blockIdx.y * T;
  const bf16 *Q = q + base * D, *K = k + base * D, *V = v + base * D, *dO = dout + base * D;

  const int key_end = CAUSAL && q0 + BR < T ? q0 + BR : T;
  const int n_tiles = (key_end + BC - 1) / BC;
  load_tile<BR, D, LD>(sQ_a, Q, q0, T);
  load_tile<BR, D, LD>(sdO_a, dO, q0, T);
  load_tile<BC, D, LD>(sK_a, K, 0, T);
  load_tile<BC, D, LD>(sV_a, V, 0, T);
  tf::cp_async_commit();

  const int wrow = warp * 16, wq0 = q0 + wrow;
  const int g = lane / 4, t2 = (lane % 4) * 2;
  /* the lane's rows g and g + 8: lse in log2 units (+inf past T: P = 0) and delta */
  float lse2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = wq0 + g + 8 * h;
    lse2[h] = row < T ? lse[base + row] * tf::log2e : tf::infinity();
    dl[h] = row < T ? delta[base + row] : 0.f;
  }
  const unsigned q_a = sQ_a + byte_offset(wrow * LD + tf::frag_a_offset(lane, LD));
  const unsigned do_a = sdO_a + byte_offset(wrow * LD + tf::frag_a_offset(lane, LD));
  const unsigned k_b = sK_a + byte_offset(tf::frag_b_offset(lane, LD)), k_bt = sK_a + byte_offset(tf::frag_a_offset(lane, LD));
  const unsigned v_b = sV_a + byte_offset(tf::frag_b_offset(lane, LD));
  const float sl2 = scale * tf::log2e;

  float acc[DN][4];
  zero(acc);

  for (int j = 0; j < n_tiles; j++) {
    tf::cp_async_wait<0>();
    __syncthreads(); /* tile j landed; every warp is done with tile j - 1's buffer */
    if (j + 1 < n_tiles) {
      const int buf = (j + 1) & 1;
      load_tile<BC, D, LD>(sK_a + byte_offset(buf * BC * LD), K, (j + 1) * BC, T);
      load_tile<BC, D, LD>(sV_a + byte_offset(buf * BC * LD), V, (j + 1) * BC, T);
      tf::cp_async_commit();
    }
    const int k0 = j * BC;
    if (wq0 >= T || (CAUSAL && k0 > wq0 + 15)) continue; /* nothing this warp sees */
    const bool masked = (CAUSAL && k0 + BC - 1 > wq0) || k0 + BC > T;
    const unsigned kv = byte_offset((j & 1) * BC * LD);

    float s[NT][4], dp[NT][4];
    zero(s);
    zero(dp);
    mma_abt<NT, D, LD>(s, q_a, k_b + kv);
    mma_abt<NT, D, LD>(dp, do_a, v_b + kv);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = tf::fast_exp2(fmaf(s[nt][e], sl2, -lse2[e >> 1]));
        if (masked) {
          const int key = k0 + nt * 8 + t2 + (e & 1), row = wq0 + g + (e >> 1) * 8;
          if (key >= T || (CAUSAL && key > row)) p = 0.f;
        }
        dp[nt][e] = p * (dp[nt][e] - dl[e >> 1]);
      }
    mma_acc_b<DN, BC / 16, LD>(acc, dp, k_bt + kv); /* dQ += dS K (the scale at the end) */
  }

  /* through the warp's own Q rows (only this warp reads them) */
  __syncwarp();
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = wrow + g + 8 * h;
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
      *reinterpret_cast<unsigned *>(sQ + r * LD + dn * 8 + t2) =
          tf::pack_bf16x2(acc[dn][2 * h] * scale, acc[dn][2 * h + 1] * scale);
  }
  __syncwarp();
  store_rows<D, LD>(dq + base * D, sQ + wrow * LD, 16, wq0, T);
}
