/* FlashAttention-2 on the GPU: the backend entry (backend.h's
 * flash_attention and flash_workspace) and the family's map. Every kernel
 * of the family, in kernels/cuda/flash/ (sm90/: built for sm_90a alone);
 * the CPU twin of all of them is kernels/cpu/flash.c (its
 * tf_cpu_flash_forward_block, _dkdv_block, _dq_block), which
 * tests/c/test_flash.c checks against plain attention, and
 * tests/c/test_flash_cuda.c checks every kernel below against it (the
 * path in brackets is the name its table gives the kernel's checks):
 *
 *   kernel (file)                      when it runs
 *   ---------------------------------  -------------------------------------------------
 *   tf_flash_fwd_ws_kernel             forward pass on a 9.0 device (H100, H200), f16/bf16,
 *     (sm90/flash_attn_fwd_ws.cu)      head dim a multiple of 8 in 40..128 (at 64, 80, 96
 *     [wgmma-ws]                       or 128), 16-byte aligned buffers, TF_FLASH_WGMMA
 *                                      not 0; blocks of 192 keys at 64, and at 80 and 96
 *                                      from TF_FLASH_FWD_LONG (4096) keys on
 *   tf_flash_bwd_ws_kernel             backward pass's dK/dV there, with dQ by bulk
 *     (sm90/flash_attn_bwd_ws.cu)      reductions (into the swizzled f32 workspace), or
 *     [wgmma-ws]                       without dQ when deterministic
 *   tf_flash_dq_ws_kernel              deterministic dQ there (seq_k > 0), first: it also
 *     (sm90/flash_attn_dq_ws.cu)       sums D, so no row-sum kernel runs
 *     [wgmma-ws]
 *   tf_flash_fwd_tc_kernel             forward pass, f16/bf16, head dim a multiple of 8 up
 *     (flash_attn_fwd.cu) [tc]         to 128 (padded to 16, 32, 64, 96 or 128), aligned
 *                                      buffers, where the above do not run: every other
 *                                      GPU, head dims 8..32 on 9.0, TF_FLASH_WGMMA=0
 *   tf_flash_bwd_tc_kernel             backward pass's dK/dV there (mma.sync), with dQ by
 *     (flash_attn_bwd.cu) [tc]         float atomics (plain f32 workspace) unless
 *                                      deterministic
 *   tf_flash_dq_tc_kernel              deterministic dQ there; also on 9.0 when seq_k = 0
 *     (flash_attn_bwd.cu) [tc]
 *   tf_flash_fwd_simt_kernel           forward pass for everything else: f32, head dims
 *     (below) [simt]                   1..128 not multiples of 8, misaligned buffers; any
 *                                      GPU; f32 arithmetic with FMA, one warp per query
 *                                      row, exact to f32 rounding and deterministic
 *   tf_flash_dkdv_simt_kernel,         the backward pass there (always deterministic)
 *   tf_flash_dq_simt_kernel (below)
 *     [simt]
 *   tf_flash_rowdot_kernel (below)     D = rowsum(dO * O) (f32, into the workspace) first
 *                                      in every backward pass but the one whose dQ is
 *                                      tf_flash_dq_ws_kernel's
 *   tf_flash_dq_convert_kernel         last, where dQ was added up in the f32 workspace
 *     (below)                          (tensor cores, not deterministic): dq = scale dq_acc
 *
 * Chosen per call (environment variables read on every call, so a test
 * can run all of them): tf_flash_typed below picks the tensor-core or SIMT
 * path, flash_attn_fwd.cu's tf_cuda_flash_forward_tc and flash_attn_bwd.cu's
 * tf_cuda_flash_backward_tc and tf_cuda_flash_dq_tc the Hopper or mma.sync
 * kernels. TF_FLASH_WGMMA=0 exists to check the mma.sync kernels, the
 * path of every other GPU, on Hopper; TF_FLASH_FWD_LONG, to check the
 * forward kernel's 192-key blocks at short lengths. (An earlier Hopper
 * generation, non-specialised wgmma kernels, was retired:
 * docs/performance.md.) */
#include "flash_attn_common.cuh"
#include "nn_common.cuh"

#include <math.h>
#include <string.h>

static size_t tf_flash_round256(size_t n) { return (n + 255) / 256 * 256; }

/* ---- D = rowsum(dO * O) and the dQ conversion ---------------------------------------- */

/* D a row at a time, the rows' lanes as tf_flash_rowdot_part has them (a
 * 16-byte word a lane, not a warp per row of 2-byte loads: near the copy
 * rate). Rows go to threads in the order O's layout stores them, so that
 * with the heads merged (o_group > 1) a warp reads neighbouring rows
 * (docs/performance.md, FlashAttention's design reasons). Where the
 * warp-specialised dQ kernel runs (deterministic, on 9.0 devices) it sums
 * D itself and this kernel does not run. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_flash_rowdot_kernel(const tf_cuda_flash_params p) {
  const int64_t rows = p.batch * p.seq_q, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t m = t / TF_FLASH_ROWDOT_TPR; /* the m-th row in memory (O's layout, dout's too) */
  const int part = (int)(t % TF_FLASH_ROWDOT_TPR);
  const int64_t group_rows = p.seq_q * p.o_group, in = m % group_rows, row = in / p.o_group;
  const int64_t b = m / group_rows * p.o_group + in % p.o_group; /* its problem and row */
  const float acc = tf_flash_rowdot_sum(m < rows ? tf_flash_rowdot_part<DT, VEC>(p, b, row, part) : 0.f);
  if (m < rows && part == 0) p.rowdot[b * p.seq_q + row] = acc;
}

/* dq = scale * dq_acc, rounded to the dtype (dq_acc's columns permuted
 * by tf_flash_dq_col when dq_acc_swizzled), for the tensor-core path's
 * 16-bit dtypes and head dims (multiples of 8, dq on a 16-byte boundary):
 * 8 columns a thread step, two 16-byte loads (the permutation moves whole
 * 4-column chunks) and one 16-byte store. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_flash_dq_convert_kernel(const tf_cuda_flash_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  static_assert(sizeof(S) == 2, "the tensor-core path's dtypes");
  S *dq = static_cast<S *>(p.dq);
  const int hd = p.head_dim, per_row = hd / 8;
  const int64_t n = p.batch * p.seq_q * per_row;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / per_row;
    const int c = (int)(i - row * per_row) * 8, r7 = (int)(row % p.seq_q & 7); /* r7: the row in its problem */
    auto at = [&](int col) { return row * hd + (p.dq_acc_swizzled ? tf_flash_dq_col(col, r7, hd) : col); };
    const float4 a = *reinterpret_cast<const float4 *>(p.dq_acc + at(c));
    const float4 b = *reinterpret_cast<const float4 *>(p.dq_acc + at(c + 4));
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    S raw[8];
#pragma unroll
    for (int u = 0; u < 8; u++) raw[u] = D::store(v[u] * p.scale);
    tf_cuda_store_n<S, 8>(dq + row * hd + c, raw);
  }
}

/* ---- the SIMT path ---------------------------------------------------------------------- */

/* 4 warps a block, 4 query rows (or keys) a warp, key and query blocks of
 * 32 (a lane each); head dims up to 128 (4 columns a lane). Shared rows that
 * lanes read down a column have an odd stride (no bank conflicts). */
enum { TF_FLASH_SIMT_WARPS = 4, TF_FLASH_SIMT_ROWS = 4, TF_FLASH_SIMT_TILE = 32 };
enum { TF_FLASH_SIMT_BR = TF_FLASH_SIMT_WARPS * TF_FLASH_SIMT_ROWS, TF_FLASH_SIMT_THREADS = TF_FLASH_SIMT_WARPS * 32 };

__device__ __forceinline__ float tf_flash_warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float tf_flash_warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/* f(u) for the lane's columns lane + 32 u (u < 4) below hd. */
template <class F> __device__ __forceinline__ void tf_flash_simt_cols(int lane, int hd, F &&f) {
#pragma unroll
  for (int u = 0; u < 4; u++)
    if (lane + 32 * u < hd) f(u);
}

/* Rows [row0, row0 + rows) of a (nrows, hd) matrix (rows src_ld elements
 * apart; 0: hd) into shared f32 rows of ld floats, zeros past nrows; by
 * the whole block. */
template <int DT>
__device__ __forceinline__ void tf_flash_simt_rows(float *dst, int ld, const typename tf_cuda_dtype<DT>::storage *src,
                                                   int64_t row0, int rows, int64_t nrows, int hd, int64_t src_ld = 0) {
  const int64_t stride = src_ld ? src_ld : hd;
  for (int i = (int)threadIdx.x; i < rows * hd; i += (int)blockDim.x) {
    const int r = i / hd, c = i % hd;
    dst[r * ld + c] = row0 + r < nrows ? tf_cuda_dtype<DT>::load(src[(row0 + r) * stride + c]) : 0.f;
  }
}

/* The backward pass's dS of the score of query row `row` and key `key`
 * (live: both exist): s = q.k and dp = dO.v over the hd columns of the
 * shared rows q + qs, dout + qs and k + ks, v + ks; P = exp(s scale - lse)
 * where the key is visible (else 0) into pv; dS = P (dp - d). lse and d
 * by reference: read after the sums, which keeps the kernels' registers. */
__device__ __forceinline__ float tf_flash_simt_ds(const tf_cuda_flash_params &p, const float *q, int qs, const float *k,
                                                  int ks, const float *dout, const float *v, int hd, bool live,
                                                  int64_t key, int64_t row, const float &lse, const float &d, float &pv) {
  float s = 0.f, dp = 0.f;
  for (int c = 0; c < hd; c++) {
    s = fmaf(q[qs + c], k[ks + c], s);
    dp = fmaf(dout[qs + c], v[ks + c], dp);
  }
  const bool vis = live && (!p.causal || key <= row);
  pv = vis ? expf(s * p.scale - lse) : 0.f;
  return pv * (dp - d);
}

/* Key block k0 (T keys) of K and V into sK and sV (rows of ldk and ldv
 * floats), between the block's barriers. */
template <int DT, int T>
__device__ __forceinline__ void tf_flash_simt_keys(float *sK, int ldk, float *sV, int ldv,
                                                   const typename tf_cuda_dtype<DT>::storage *K,
                                                   const typename tf_cuda_dtype<DT>::storage *V, int64_t k0,
                                                   int64_t seq_k, int hd) {
  __syncthreads();
  tf_flash_simt_rows<DT>(sK, ldk, K, k0, T, seq_k, hd);
  tf_flash_simt_rows<DT>(sV, ldv, V, k0, T, seq_k, hd);
  __syncthreads();
}

/* Key blocks k0 of T keys below key_end, each loaded (tf_flash_simt_keys),
 * then f(r, lr, row, key) for the warp's R query rows lr = warp R + r
 * (row q0 + lr of the problem) and the lane's key k0 + lane. */
template <int DT, int T, int R, class F>
__device__ __forceinline__ void tf_flash_simt_key_blocks(float *sK, int ldk, float *sV, int ldv,
                                                         const typename tf_cuda_dtype<DT>::storage *K,
                                                         const typename tf_cuda_dtype<DT>::storage *V, int64_t key_end,
                                                         int64_t seq_k, int hd, int warp, int lane, int64_t q0, F &&f) {
  for (int64_t k0 = 0; k0 < key_end; k0 += T) {
    tf_flash_simt_keys<DT, T>(sK, ldk, sV, ldv, K, V, k0, seq_k, hd);
    const int64_t key = k0 + lane;
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int lr = warp * R + r;
      f(r, lr, q0 + lr, key);
    }
  }
}

/* A kernel over query blocks of BR rows: its problem *b and first row
 * *q0, and Q's rows in sQ (rows of hd). */
template <int DT, int BR>
__device__ __forceinline__ void tf_flash_simt_queries(const tf_cuda_flash_params &p, float *sQ, int64_t *b, int64_t *q0) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  const int hd = p.head_dim;
  int64_t qb;
  tf_flash_block_of((p.seq_q + BR - 1) / BR, true, b, &qb);
  *q0 = qb * BR;
  tf_flash_simt_rows<DT>(sQ, hd, static_cast<const S *>(p.q) + *b * p.seq_q * hd, *q0, BR, p.seq_q, hd);
}

/* Forward: online softmax per row over key blocks of 32. Shared: Q (BR,
 * hd), K (32, ldk), V (32, hd). */
template <int DT>
__global__ void __launch_bounds__(TF_FLASH_SIMT_THREADS) tf_flash_fwd_simt_kernel(const tf_cuda_flash_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  constexpr int BR = TF_FLASH_SIMT_BR, T = TF_FLASH_SIMT_TILE, R = TF_FLASH_SIMT_ROWS;
  const int hd = p.head_dim, ldk = hd | 1, warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  float *sQ = reinterpret_cast<float *>(tf::dynamic_smem<unsigned char>()),
        *sK = sQ + BR * hd, *sV = sK + T * ldk;
  int64_t b, q0;
  tf_flash_simt_queries<DT, BR>(p, sQ, &b, &q0);
  const S *K = static_cast<const S *>(p.k) + b * p.seq_k * hd, *V = static_cast<const S *>(p.v) + b * p.seq_k * hd;
  int64_t key_end = p.seq_k;
  if (p.causal && q0 + BR < key_end) key_end = q0 + BR;
  float m[R], l[R], o[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int u = 0; u < 4; u++) o[r][u] = 0.f;
  }
  tf_flash_simt_key_blocks<DT, T, R>(sK, ldk, sV, hd, K, V, key_end, p.seq_k, hd, warp, lane, q0,
                                     [&](int r, int lr, int64_t row, int64_t key) {
    float s = 0.f;
    for (int c = 0; c < hd; c++) s = fmaf(sQ[lr * hd + c], sK[lane * ldk + c], s);
    const bool vis = key < p.seq_k && (!p.causal || key <= row);
    s = vis ? s * p.scale : -INFINITY;
    const float mx = fmaxf(m[r], tf_flash_warp_max(s));
    if (mx == -INFINITY) return; /* nothing visible yet (the same in every lane) */
    const float alpha = expf(m[r] - mx), pv = vis ? expf(s - mx) : 0.f;
    l[r] = l[r] * alpha + tf_flash_warp_sum(pv);
    m[r] = mx;
#pragma unroll
    for (int u = 0; u < 4; u++) o[r][u] *= alpha;
    for (int j = 0; j < T; j++) {
      const float pj = __shfl_sync(0xffffffffu, pv, j);
      tf_flash_simt_cols(lane, hd, [&](int u) { o[r][u] = fmaf(pj, sV[j * hd + lane + 32 * u], o[r][u]); });
    }
  });
  S *O = tf_flash_o_of<S>(p, b);
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int64_t row = q0 + warp * R + r;
    if (row >= p.seq_q) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    tf_flash_simt_cols(lane, hd, [&](int u) { O[row * p.o_ld + lane + 32 * u] = D::store(o[r][u] * inv); });
    if (lane == 0) p.lse[b * p.seq_q + row] = l[r] > 0.f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

/* dK and dV of 16 keys (4 a warp) over query blocks of 32 (a lane each).
 * Shared: K, V (16, hd); Q, dO (32, ldq); lse, D (32). */
template <int DT>
__global__ void __launch_bounds__(TF_FLASH_SIMT_THREADS) tf_flash_dkdv_simt_kernel(const tf_cuda_flash_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  constexpr int BK = TF_FLASH_SIMT_BR, T = TF_FLASH_SIMT_TILE, R = TF_FLASH_SIMT_ROWS;
  const int hd = p.head_dim, ldq = hd | 1, warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  float *sK = reinterpret_cast<float *>(tf::dynamic_smem<unsigned char>()),
        *sV = sK + BK * hd, *sQ = sV + BK * hd;
  float *sdO = sQ + T * ldq, *sLse = sdO + T * ldq, *sD = sLse + T;
  int64_t b, kb;
  tf_flash_block_of((p.seq_k + BK - 1) / BK, false, &b, &kb);
  const int64_t k0 = kb * BK;
  const S *Q = static_cast<const S *>(p.q) + b * p.seq_q * hd;
  const S *dO = static_cast<const S *>(p.dout) + tf_flash_o_offset(p, b); /* O's layout */
  tf_flash_simt_rows<DT>(sK, hd, static_cast<const S *>(p.k) + b * p.seq_k * hd, k0, BK, p.seq_k, hd);
  tf_flash_simt_rows<DT>(sV, hd, static_cast<const S *>(p.v) + b * p.seq_k * hd, k0, BK, p.seq_k, hd);
  float dk[R][4], dv[R][4];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int u = 0; u < 4; u++) dk[r][u] = dv[r][u] = 0.f;
  const int64_t first = p.causal ? k0 / T * T : 0;
  for (int64_t q0 = first; q0 < p.seq_q; q0 += T) {
    __syncthreads();
    tf_flash_simt_rows<DT>(sQ, ldq, Q, q0, T, p.seq_q, hd);
    tf_flash_simt_rows<DT>(sdO, ldq, dO, q0, T, p.seq_q, hd, p.o_ld);
    if (threadIdx.x < T) {
      const int64_t row = q0 + threadIdx.x;
      sLse[threadIdx.x] = row < p.seq_q ? p.lse[b * p.seq_q + row] : 0.f;
      sD[threadIdx.x] = row < p.seq_q ? p.rowdot[b * p.seq_q + row] : 0.f;
    }
    __syncthreads();
    const int64_t row = q0 + lane;
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int lk = warp * R + r;
      const int64_t key = k0 + lk;
      if (key >= p.seq_k) continue;
      float pv;
      const float ds = tf_flash_simt_ds(p, sQ, lane * ldq, sK, lk * hd, sdO, sV, hd, row < p.seq_q, key, row, sLse[lane],
                                        sD[lane], pv);
      for (int i = 0; i < T; i++) {
        const float pi = __shfl_sync(0xffffffffu, pv, i), dsi = __shfl_sync(0xffffffffu, ds, i);
        tf_flash_simt_cols(lane, hd, [&](int u) {
          dv[r][u] = fmaf(pi, sdO[i * ldq + lane + 32 * u], dv[r][u]);
          dk[r][u] = fmaf(dsi, sQ[i * ldq + lane + 32 * u], dk[r][u]);
        });
      }
    }
  }
  S *dK = static_cast<S *>(p.dk) + b * p.seq_k * hd, *dV = static_cast<S *>(p.dv) + b * p.seq_k * hd;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int64_t key = k0 + warp * R + r;
    if (key >= p.seq_k) continue;
    tf_flash_simt_cols(lane, hd, [&](int u) {
      dK[key * hd + lane + 32 * u] = D::store(dk[r][u] * p.scale);
      dV[key * hd + lane + 32 * u] = D::store(dv[r][u]);
    });
  }
}

/* dQ of 16 query rows (4 a warp) over key blocks of 32 (a lane each).
 * Shared: Q, dO (16, hd); K, V (32, ldk). */
template <int DT>
__global__ void __launch_bounds__(TF_FLASH_SIMT_THREADS) tf_flash_dq_simt_kernel(const tf_cuda_flash_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  constexpr int BR = TF_FLASH_SIMT_BR, T = TF_FLASH_SIMT_TILE, R = TF_FLASH_SIMT_ROWS;
  const int hd = p.head_dim, ldk = hd | 1, warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  float *sQ = reinterpret_cast<float *>(tf::dynamic_smem<unsigned char>()),
        *sdO = sQ + BR * hd, *sK = sdO + BR * hd;
  float *sV = sK + T * ldk;
  int64_t b, q0;
  tf_flash_simt_queries<DT, BR>(p, sQ, &b, &q0);
  const S *K = static_cast<const S *>(p.k) + b * p.seq_k * hd, *V = static_cast<const S *>(p.v) + b * p.seq_k * hd;
  const S *dO = static_cast<const S *>(p.dout) + tf_flash_o_offset(p, b); /* O's layout */
  tf_flash_simt_rows<DT>(sdO, hd, dO, q0, BR, p.seq_q, hd, p.o_ld);
  float lse[R], dd[R], dq[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int64_t row = q0 + warp * R + r;
    lse[r] = row < p.seq_q ? p.lse[b * p.seq_q + row] : 0.f;
    dd[r] = row < p.seq_q ? p.rowdot[b * p.seq_q + row] : 0.f;
#pragma unroll
    for (int u = 0; u < 4; u++) dq[r][u] = 0.f;
  }
  int64_t key_end = p.seq_k;
  if (p.causal && q0 + BR < key_end) key_end = q0 + BR;
  tf_flash_simt_key_blocks<DT, T, R>(sK, ldk, sV, ldk, K, V, key_end, p.seq_k, hd, warp, lane, q0,
                                     [&](int r, int lr, int64_t row, int64_t key) {
    if (row >= p.seq_q) return;
    float pv;
    const float ds = tf_flash_simt_ds(p, sQ, lr * hd, sK, lane * ldk, sdO, sV, hd, key < p.seq_k, key, row, lse[r], dd[r],
                                      pv);
    (void)pv; /* dQ needs dS alone */
    for (int j = 0; j < T; j++) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      tf_flash_simt_cols(lane, hd, [&](int u) { dq[r][u] = fmaf(dsj, sK[j * ldk + lane + 32 * u], dq[r][u]); });
    }
  });
  S *dQ = static_cast<S *>(p.dq) + b * p.seq_q * hd;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int64_t row = q0 + warp * R + r;
    if (row >= p.seq_q) continue;
    tf_flash_simt_cols(lane, hd, [&](int u) { dQ[row * hd + lane + 32 * u] = D::store(dq[r][u] * p.scale); });
  }
}

/* ---- host side ---------------------------------------------------------------------------- */

/* Dynamic shared memory above 48 KiB needs the kernel's consent. */
template <class K> static tf_status tf_flash_simt_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  return TF_OK;
}

template <int DT> static tf_status tf_flash_simt_forward(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_q + TF_FLASH_SIMT_BR - 1) / TF_FLASH_SIMT_BR, &grid));
  const int hd = p->head_dim;
  const size_t smem = sizeof(float) * (size_t)(TF_FLASH_SIMT_BR * hd + TF_FLASH_SIMT_TILE * (hd | 1) +
                                                TF_FLASH_SIMT_TILE * hd);
  TF_TRY(tf_flash_simt_smem(tf_flash_fwd_simt_kernel<DT>, smem));
  tf_flash_fwd_simt_kernel<DT><<<grid, TF_FLASH_SIMT_THREADS, smem, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention SIMT forward kernel");
}

template <int DT> static tf_status tf_flash_simt_backward(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  const int hd = p->head_dim;
  if (p->seq_k > 0) {
    unsigned grid = 0;
    TF_TRY(tf_flash_grid(p->batch, (p->seq_k + TF_FLASH_SIMT_BR - 1) / TF_FLASH_SIMT_BR, &grid));
    const size_t smem =
        sizeof(float) * (size_t)(2 * TF_FLASH_SIMT_BR * hd + 2 * TF_FLASH_SIMT_TILE * (hd | 1) + 2 * TF_FLASH_SIMT_TILE);
    TF_TRY(tf_flash_simt_smem(tf_flash_dkdv_simt_kernel<DT>, smem));
    tf_flash_dkdv_simt_kernel<DT><<<grid, TF_FLASH_SIMT_THREADS, smem, st->stream>>>(*p);
    TF_TRY(tf_cuda_launched("flash_attention SIMT dk/dv kernel"));
  }
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_q + TF_FLASH_SIMT_BR - 1) / TF_FLASH_SIMT_BR, &grid));
  const size_t smem = sizeof(float) * (size_t)(2 * TF_FLASH_SIMT_BR * hd + 2 * TF_FLASH_SIMT_TILE * (hd | 1));
  TF_TRY(tf_flash_simt_smem(tf_flash_dq_simt_kernel<DT>, smem));
  tf_flash_dq_simt_kernel<DT><<<grid, TF_FLASH_SIMT_THREADS, smem, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention SIMT dq kernel");
}

/* Whether the tensor-core kernels take this problem: their dtypes and
 * head dims (alignment aside). */
static bool tf_flash_tc_shape(const tf_flash_args *a) {
  return (a->dtype == TF_F16 || a->dtype == TF_BF16) && tf_flash_tc_dim(a->head_dim) > 0;
}

static bool tf_flash_aligned(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

/* The tensor-core path also needs every buffer it moves by 16 bytes aligned. */
static bool tf_flash_tc_ok(const tf_flash_args *a) {
  if (!tf_flash_tc_shape(a)) return false;
  const void *ptrs[] = {a->q, a->k, a->v, a->o};
  for (int i = 0; i < 4; i++)
    if (!tf_flash_aligned(ptrs[i])) return false;
  if (!a->backward) return true;
  const void *grads[] = {a->dout, a->dq, a->dk, a->dv};
  for (int i = 0; i < 4; i++)
    if (!tf_flash_aligned(grads[i])) return false;
  return true;
}

/* Whether the backward pass computes dQ in a pass of its own (no f32 dQ
 * accumulator): when deterministic, and off the tensor-core path (dQ by
 * reductions is the faster way where the tensor cores run). */
static bool tf_flash_dq_pass(const tf_flash_args *a) { return a->deterministic || !tf_flash_tc_shape(a); }

/* D (f32 per query row), then, where dQ has no pass of its own, the f32
 * dQ accumulator. */
static size_t tf_flash_workspace_bytes(const tf_flash_args *a) {
  if (!a->backward || a->batch <= 0 || a->seq_q <= 0 || a->head_dim <= 0) return 0;
  const size_t rows = (size_t)a->batch * (size_t)a->seq_q;
  size_t bytes = tf_flash_round256(rows * sizeof(float));
  if (!tf_flash_dq_pass(a)) bytes += tf_flash_round256(rows * (size_t)a->head_dim * sizeof(float));
  return bytes;
}

size_t tf_cuda_flash_workspace(tf_device_ctx *ctx, const tf_flash_args *a) {
  (void)ctx;
  return tf_flash_workspace_bytes(a);
}

template <int DT> static tf_status tf_flash_backward(tf_cuda_state *st, tf_cuda_flash_params *p, bool tc, bool det) {
  const int64_t rows = p->batch * p->seq_q;
  const int hd_pad = tf_flash_tc_dim(p->head_dim);
#ifdef TF_WITH_SM90A
  if (tc && det && p->seq_k > 0 && tf_flash_bwd_ws_on(st, p->head_dim)) {
    /* the warp-specialised dQ kernel sums D itself and writes it for the
     * dK/dV kernel, which therefore runs second: no row-sum kernel */
    TF_TRY(tf_cuda_flash_dq_ws(st, p, (tf_dtype)DT, tf_flash_wgmma_dim(p->head_dim)));
    return tf_cuda_flash_backward_tc(st, p, (tf_dtype)DT, hd_pad, false);
  }
#endif
  const unsigned row_blocks =
      (unsigned)((rows * TF_FLASH_ROWDOT_TPR + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS); /* short blocks */
  const bool vec = p->head_dim % (int)(16 / sizeof(typename tf_cuda_dtype<DT>::storage)) == 0 &&
                   ((uintptr_t)p->o | (uintptr_t)p->dout) % 16 == 0;
  if (vec)
    tf_flash_rowdot_kernel<DT, true><<<row_blocks, TF_CUDA_THREADS, 0, st->stream>>>(*p);
  else
    tf_flash_rowdot_kernel<DT, false><<<row_blocks, TF_CUDA_THREADS, 0, st->stream>>>(*p);
  /* O and dO read, D written (one f32 a row of a problem) */
  tf_cuda_traffic("tf_flash_rowdot_kernel",
                  (double)rows * (2.0 * p->head_dim * sizeof(typename tf_cuda_dtype<DT>::storage) + 4));
  TF_TRY(tf_cuda_launched("flash_attention rowdot kernel"));
  if (!tc) return tf_flash_simt_backward<DT>(st, p);
  if (det) {
    if (p->seq_k > 0) TF_TRY(tf_cuda_flash_backward_tc(st, p, (tf_dtype)DT, hd_pad, false));
    return tf_cuda_flash_dq_tc(st, p, (tf_dtype)DT, hd_pad);
  }
  const int64_t n = rows * p->head_dim;
  p->dq_acc_swizzled = tf_flash_bwd_ws_on(st, p->head_dim);
  TF_TRY(tf_cuda_memset(st, p->dq_acc, 0, (size_t)n * sizeof(float)));
  if (p->seq_k > 0) TF_TRY(tf_cuda_flash_backward_tc(st, p, (tf_dtype)DT, hd_pad, true));
  if constexpr (DT == TF_F16 || DT == TF_BF16) { /* the tensor-core path: head dims of 8s, 16-byte aligned (tc_ok) */
    tf_flash_dq_convert_kernel<DT><<<tf_cuda_blocks(st, n / 8), TF_CUDA_THREADS, 0, st->stream>>>(*p);
    return tf_cuda_launched("flash_attention dq convert kernel");
  }
  return tf_fail(TF_ERR_STATE, "flash_attention: dQ by reductions on the tensor-core path only");
}

template <int DT> static tf_status tf_flash_typed(tf_cuda_state *st, const tf_flash_args *a) {
  tf_cuda_flash_params p;
  memset(&p, 0, sizeof p);
  p.q = a->q, p.k = a->k, p.v = a->v, p.dout = a->dout;
  p.o = a->o;
  p.lse = static_cast<float *>(a->lse);
  p.dq = a->dq, p.dk = a->dk, p.dv = a->dv;
  p.batch = a->batch, p.seq_q = a->seq_q, p.seq_k = a->seq_k;
  p.head_dim = (int)a->head_dim;
  p.causal = a->causal;
  p.scale = (float)a->scale;
  p.scale_log2 = (float)(a->scale * TF_CUDA_LOG2E);
  p.fwd_scale_log2 = (float)(fabs(a->scale) * TF_CUDA_LOG2E);
  p.q_sign = a->scale < 0 ? 0x80008000u : 0u;
  TF_TRY(tf_flash_o_layout(a, &p.o_ld, &p.o_group));
  const bool tc = (DT == TF_F16 || DT == TF_BF16) && tf_flash_tc_ok(a);
  if (!a->backward) {
    if (tc) return tf_cuda_flash_forward_tc(st, &p, (tf_dtype)DT, tf_flash_tc_dim(a->head_dim));
    return tf_flash_simt_forward<DT>(st, &p);
  }
  const size_t need = tf_flash_workspace_bytes(a);
  if (!a->workspace && need > 0)
    return tf_fail(TF_ERR_ARG, "flash_attention backward: no workspace (%zu bytes needed)", need);
  const size_t rows = (size_t)a->batch * (size_t)a->seq_q;
  p.rowdot = static_cast<float *>(a->workspace);
  p.dq_acc = reinterpret_cast<float *>(static_cast<char *>(a->workspace) + tf_flash_round256(rows * sizeof(float)));
  /* the dQ accumulator is there only where flash_workspace counted it */
  return tf_flash_backward<DT>(st, &p, tc, tf_flash_dq_pass(a));
}

/* The backend entry: the dispatcher has checked shapes and devices. */
tf_status tf_cuda_flash_attention(tf_device_ctx *ctx, const tf_flash_args *a) {
  if (a->dtype != TF_F32 && a->dtype != TF_F16 && a->dtype != TF_BF16)
    return tf_fail(TF_ERR_ARG, "flash_attention: the CUDA backend takes f32, f16 or bf16, not %s",
                   tf_dtype_name(a->dtype));
  if (a->head_dim < 1 || a->head_dim > 128)
    return tf_fail(TF_ERR_ARG, "flash_attention: the CUDA backend takes head dims 1..128, not %lld",
                   (long long)a->head_dim);
  if (a->seq_q >= INT32_MAX || a->seq_k >= INT32_MAX || a->seq_k < 0)
    return tf_fail(TF_ERR_ARG, "flash_attention: sequence lengths %lld and %lld are out of the CUDA kernels' range",
                   (long long)a->seq_q, (long long)a->seq_k);
  if (a->batch <= 0 || a->seq_q <= 0) return TF_OK;
  if (a->batch > INT32_MAX)
    return tf_fail(TF_ERR_ARG, "flash_attention: batch %lld is too large for the CUDA kernels", (long long)a->batch);
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F16: return tf_flash_typed<TF_F16>(st, a);
    case TF_BF16: return tf_flash_typed<TF_BF16>(st, a);
    default: return tf_flash_typed<TF_F32>(st, a);
  }
}
