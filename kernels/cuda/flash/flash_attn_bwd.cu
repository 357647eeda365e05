/* FlashAttention-2's backward pass on tensor cores (f16/bf16), after
 * flash_attn.cu (or the warp-specialised dQ kernel) has put D =
 * rowsum(dO * O) in the workspace.
 *
 * dK/dV kernel: one block of WARPS warps owns BC = 16 WARPS keys of one
 * problem (each warp 16 keys) with their K and V rows in shared memory, and
 * walks the query blocks of BR rows that see them (under the causal mask,
 * from the block holding its first key on), Q, dO, lse and D
 * double-buffered by cp.async. Each warp works on the transposed scores of
 * its keys, so that every product it needs comes out in the layout the
 * next one takes, in registers:
 *   S^T = K Q^T, dP^T = V dO^T                       (mma, B from ldmatrix)
 *   P^T = exp2(S^T scale log2 e - lse log2 e), dS^T = P^T (dP^T - D)
 *   dV += P^T dO, dK += dS^T Q                      (A = P^T, dS^T in registers,
 *                                                    B by ldmatrix.trans)
 * dK and dV stay in registers (f32) until the end. For dQ the warps write
 * dS^T to shared memory (double-buffered, so one __syncthreads a query
 * block is enough), then split the block's dQ = dS K over (row tile, column
 * half) and add it to an f32 workspace with float2 atomics; a small kernel
 * scales and rounds it. With deterministic, the dK/dV kernel skips dQ and
 * tf_cuda_flash_dq_tc computes it (on a 9.0 device the warp-specialised
 * kernels do, the dQ kernel first: flash_attn.cu's tf_flash_backward):
 * one block per query block looping over the key blocks (S, dP, dS in
 * registers, dQ += dS K with dS straight from the registers), the same
 * bits every run. Shared rows are padded by 16 bytes against bank
 * conflicts, as in the forward kernel; the query (key) blocks that cross
 * the causal diagonal run a masked variant of the loop, the others one
 * without mask code; one block per (problem, key block), problem by
 * problem, key block 0 (the longest under the causal mask) first. */
#include "flash_attn_common.cuh"

/* Two products side by side, c1 += A1 B1 and c2 += A2 B2, over K16 k
 * steps of 16 and N column tiles of 8: a(kk, x1, x2) gives step kk's A
 * fragments, b1(kk, n, y) and b2(kk, n, y) the B fragments of tiles n and
 * n + 1 (one ldmatrix each), in the order the backward kernels issue them. */
template <int DT, int K16, int N, class FA, class FB1, class FB2>
__device__ __forceinline__ void tf_flash_mma_pair(float (&c1)[N][4], float (&c2)[N][4], FA a, FB1 b1, FB2 b2) {
#pragma unroll
  for (int kk = 0; kk < K16; kk++) {
    uint32_t x1[4], x2[4];
    a(kk, x1, x2);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      uint32_t y1[4], y2[4];
      b1(kk, n, y1);
      tf::mma_16816<tf_flash_elem<DT>>(c1[n], x1, y1[0], y1[1]);
      tf::mma_16816<tf_flash_elem<DT>>(c1[n + 1], x1, y1[2], y1[3]);
      b2(kk, n, y2);
      tf::mma_16816<tf_flash_elem<DT>>(c2[n], x2, y2[0], y2[1]);
      tf::mma_16816<tf_flash_elem<DT>>(c2[n + 1], x2, y2[2], y2[3]);
    }
  }
}

/* The two products a backward kernel starts a block with, over the head
 * dim HD: s = A1 B1^T and dp = A2 B2^T (the dK/dV kernel's S^T = K Q^T and
 * dP^T = V dO^T, the dQ kernel's S = Q K^T and dP = dO V^T). A fragments
 * by ldmatrix from a1 and a2 (16 columns a k step), B fragments from b1
 * and b2 at boff (rows of LD elements), NT column tiles of 8. */
template <int DT, int HD, int LD, int NT>
__device__ __forceinline__ void tf_flash_bwd_scores(float (&s)[NT][4], float (&dp)[NT][4], uint32_t a1, uint32_t a2,
                                                    uint32_t b1, uint32_t b2, uint32_t boff) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
  auto b_at = [&](uint32_t b, int kk, int nt, uint32_t(&y)[4]) {
    tf::ldmatrix_x4(y, b + (boff + (uint32_t)((nt * 8 * LD + kk * 16) * 2)));
  };
  tf_flash_mma_pair<DT, HD / 16, NT>(
      s, dp,
      [&](int kk, uint32_t(&x1)[4], uint32_t(&x2)[4]) {
        tf::ldmatrix_x4(x1, a1 + (uint32_t)(kk * 32));
        tf::ldmatrix_x4(x2, a2 + (uint32_t)(kk * 32));
      },
      [&](int kk, int nt, uint32_t(&y)[4]) { b_at(b1, kk, nt, y); },
      [&](int kk, int nt, uint32_t(&y)[4]) { b_at(b2, kk, nt, y); });
}

/* The dK/dV configuration: head dim HD (padded), WARPS warps (16 keys
 * each), BR queries per step. */
template <int HD_, int WARPS_, int BR_, int MIN_BLOCKS_> struct tf_flash_bwd_cfg {
  static constexpr int HD = HD_, WARPS = WARPS_, BR = BR_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int BC = WARPS * 16, THREADS = WARPS * 32, LD = HD + 8, LDS = BR + 8;
  /* K, V; Q and dO twice; lse and D twice; dS^T twice */
  static constexpr int SMEM_NO_DQ = (2 * BC * LD + 4 * BR * LD) * 2 + 4 * BR * 4;
  static constexpr int SMEM_DQ = SMEM_NO_DQ + 2 * BC * LDS * 2;
  /* dQ = dS K: the warps split the BR rows into 16-row tiles and HD into GROUPS column ranges */
  static constexpr int MQ = BR / 16, GROUPS = WARPS / MQ, NTW = HD / 8 / GROUPS;
  static_assert(HD % 16 == 0 && BR % 16 == 0, "tiles are whole mma tiles");
  static_assert(WARPS % MQ == 0 && (HD / 8) % GROUPS == 0, "dQ tiles split evenly over the warps");
};

template <int DT, class C, bool ATOMIC_DQ>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) tf_flash_bwd_tc_kernel(const tf_cuda_flash_params p) {
  constexpr int HD = C::HD, BR = C::BR, BC = C::BC, LD = C::LD, LDS = C::LDS, NT = BR / 8, DT8 = HD / 8;
  uint16_t *sK =
      reinterpret_cast<uint16_t *>(tf::dynamic_smem<unsigned char>());
  uint16_t *sV = sK + BC * LD, *sQ = sV + BC * LD, *sdO = sQ + 2 * BR * LD;
  float *sLse = reinterpret_cast<float *>(sdO + 2 * BR * LD), *sD = sLse + 2 * BR;
  uint16_t *sdS = reinterpret_cast<uint16_t *>(sD + 2 * BR);
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  int64_t b, k0;
  tf_flash_key_block_of<BC>(p, &b, &k0);
  const int hd = p.head_dim;
  const tf_flash_problem pr = tf_flash_problem_of(p, b);
  const uint16_t *Q = pr.q, *dO = pr.dout, *K = pr.k, *V = pr.v;
  const float *lse = pr.lse, *D = pr.rowdot;

  tf_flash_load_rows<BC, HD, LD, C::THREADS>(sK, K, k0, p.seq_k, hd);
  tf_flash_load_rows<BC, HD, LD, C::THREADS>(sV, V, k0, p.seq_k, hd);
  tf::cp_async_commit();
  /* under the causal mask, queries before k0 see none of these keys */
  const int64_t q_blocks = (p.seq_q + BR - 1) / BR, first = p.causal ? k0 / BR : 0;
  const int n_it = (int)(q_blocks > first ? q_blocks - first : 0);
  auto load_queries = [&](int it) {
    const int stage = it & 1;
    const int64_t q0 = (first + it) * BR;
    tf_flash_load_rows<BR, HD, LD, C::THREADS>(sQ + stage * BR * LD, Q, q0, p.seq_q, hd);
    tf_flash_load_rows<BR, HD, LD, C::THREADS>(sdO + stage * BR * LD, dO, q0, p.seq_q, hd, p.o_ld);
    tf_flash_load_stat<BR, C::THREADS>(sLse + stage * BR, lse, q0, p.seq_q);
    tf_flash_load_stat<BR, C::THREADS>(sD + stage * BR, D, q0, p.seq_q);
    tf::cp_async_commit();
  };
  if (n_it > 0) load_queries(0);

  const int kw = warp * 16; /* the warp's first key in the block */
  const int64_t kw0 = k0 + kw;
  const uint32_t k_a = tf_flash_a_addr<LD>(sK, kw, lane), v_a = tf_flash_a_addr<LD>(sV, kw, lane);
  const uint32_t q_b = tf_flash_b_addr<LD>(sQ, lane), q_bt = tf_flash_a_addr<LD>(sQ, 0, lane);
  const uint32_t do_b = tf_flash_b_addr<LD>(sdO, lane), do_bt = tf_flash_a_addr<LD>(sdO, 0, lane);
  const float sl2 = p.scale_log2;

  float dk[DT8][4], dv[DT8][4];
#pragma unroll
  for (int dt = 0; dt < DT8; dt++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[dt][e] = dv[dt][e] = 0.f;

  /* where this lane adds its dQ values in the first query block (row tile
   * warp % MQ, column group warp / MQ) */
  const int dq_row = (warp % C::MQ) * 16 + (lane >> 2), col0 = (warp / C::MQ) * C::NTW * 8 + (lane & 3) * 2;
  float *const dq_first = ATOMIC_DQ ? p.dq_acc + (b * p.seq_q + first * BR + dq_row) * hd + col0 : nullptr;

  /* One query block; MASK: it crosses the causal diagonal of some key of
   * the block (the first few blocks; the later ones have no mask code). */
  auto query_block = [&](int it, auto mask_tag) {
    constexpr bool MASK = decltype(mask_tag)::value;
    const int stage = it & 1;
    const int64_t q0 = (first + it) * BR;
    tf::cp_async_wait<0>();
    __syncthreads(); /* block it has landed; every warp is done with block it - 1's Q and dO */
    if (it + 1 < n_it) load_queries(it + 1);
    const uint32_t qs = (uint32_t)(stage * BR * LD * 2);
    const float *lse_s = sLse + stage * BR, *D_s = sD + stage * BR;
    uint16_t *dsw = sdS + stage * BC * LDS + kw * LDS; /* this warp's 16 rows of dS^T */
    (void)dsw; /* unused without ATOMIC_DQ */
    const bool active = kw0 < p.seq_k && (!MASK || q0 + BR - 1 >= kw0);
    if (active) {
      float s[NT][4], dp[NT][4];
      tf_flash_bwd_scores<DT, HD, LD>(s, dp, k_a, v_a, q_b, do_b, qs); /* S^T = K Q^T, dP^T = V dO^T */
      /* P^T (masked where key > query) and dS^T = P^T (dP^T - D); query c
       * of the block is column c; key r of the warp is visible to it iff
       * r - c <= q0 - kw0 (r - c is a constant plus g - 2t) */
      const int t2 = (lane & 3) * 2, g = lane >> 2;
      const int diag = (int)(q0 - kw0) - (g - t2);
      /* keys past seq_k (zero rows of K and V) get P = 0, not exp(0 - lse):
       * with every score far below zero that overflowed dS^T in f16, and
       * dQ = dS K turned NaN through the zero rows. The lane's keys are g
       * and g + 8: key g + 8h is there iff 8h < key_lim. */
      const bool key_tail = kw0 + 16 > p.seq_k;
      const int key_lim = (int)(p.seq_k - kw0) - g;
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = nt * 8 + t2 + (e & 1);
          float pv = tf_cuda_exp2(fmaf(s[nt][e], sl2, -TF_FLASH_LOG2E * lse_s[c]));
          if (MASK && (e & 2) * 4 - (nt * 8 + (e & 1)) > diag) pv = 0.f;
          if (key_tail && (e & 2) * 4 >= key_lim) pv = 0.f;
          dp[nt][e] = pv * (dp[nt][e] - D_s[c]);
          s[nt][e] = pv;
        }
      /* dV += P^T dO and dK += dS^T Q over the block's queries (P^T, dS^T from the registers) */
      tf_flash_mma_pair<DT, BR / 16, DT8>(
          dv, dk,
          [&](int kk, uint32_t(&ap)[4], uint32_t(&ad)[4]) {
            tf_flash_c_to_a<DT>(ap, s[2 * kk], s[2 * kk + 1]);
            tf_flash_c_to_a<DT>(ad, dp[2 * kk], dp[2 * kk + 1]);
          },
          [&](int kk, int dt, uint32_t(&bo)[4]) {
            tf::ldmatrix_x4_trans(
                bo, do_bt + (qs + (uint32_t)((kk * 16 * LD + dt * 8) * 2)));
          },
          [&](int kk, int dt, uint32_t(&bq)[4]) {
            tf::ldmatrix_x4_trans(
                bq, q_bt + (qs + (uint32_t)((kk * 16 * LD + dt * 8) * 2)));
          });
      if constexpr (ATOMIC_DQ) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int h = 0; h < 2; h++)
            *reinterpret_cast<uint32_t *>(dsw + (g + 8 * h) * LDS + nt * 8 +
                                          t2) =
                tf::pack2<tf_flash_elem<DT>>(dp[nt][2 * h], dp[nt][2 * h + 1]);
      }
    } else if constexpr (ATOMIC_DQ) {
      for (int i = lane; i < 16 * BR / 2; i += 32)
        *reinterpret_cast<uint32_t *>(dsw + (i / (BR / 2)) * LDS + 2 * (i % (BR / 2))) = 0u;
    }
    if constexpr (ATOMIC_DQ) {
      __syncthreads(); /* all of dS^T is written */
      /* dQ (this block's rows) += dS K: row tile mq, columns cg * NTW * 8 .. */
      const int mq = warp % C::MQ, cg = warp / C::MQ;
      const uint16_t *ds = sdS + stage * BC * LDS;
      const uint32_t ds_a = tf_flash_b_addr<LDS>(ds + mq * 16, lane);
      const uint32_t k_bt = tf_flash_a_addr<LD>(sK + cg * C::NTW * 8, 0, lane);
      float acc[C::NTW][4];
#pragma unroll
      for (int n = 0; n < C::NTW; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BC / 16; kk++) {
        uint32_t a[4];
        tf::ldmatrix_x4_trans(a, ds_a + (uint32_t)(kk * 16 * LDS * 2));
#pragma unroll
        for (int n = 0; n + 1 < C::NTW; n += 2) {
          uint32_t kb[4];
          tf::ldmatrix_x4_trans(kb,
                                k_bt + (uint32_t)((kk * 16 * LD + n * 8) * 2));
          tf::mma_16816<tf_flash_elem<DT>>(acc[n], a, kb[0], kb[1]);
          tf::mma_16816<tf_flash_elem<DT>>(acc[n + 1], a, kb[2], kb[3]);
        }
        if constexpr (C::NTW % 2 == 1) {
          uint32_t kb[2];
          tf::ldmatrix_x2_trans(
              kb, k_bt + (uint32_t)((kk * 16 * LD + (C::NTW - 1) * 8) * 2));
          tf::mma_16816<tf_flash_elem<DT>>(acc[C::NTW - 1], a, kb[0], kb[1]);
        }
      }
      /* rows g and g + 8 of the tile, columns col0 + 8 n */
      const int64_t row = q0 + dq_row;
      float *dq = dq_first + (int64_t)it * BR * hd;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        if (row + 8 * h >= p.seq_q) continue;
#pragma unroll
        for (int n = 0; n < C::NTW; n++) {
          if (col0 + 8 * n >= hd) continue; /* padded columns */
          float *at = dq + 8 * h * hd + 8 * n;
#if __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2 *>(at), make_float2(acc[n][2 * h], acc[n][2 * h + 1]));
#else
          atomicAdd(at, acc[n][2 * h]);
          atomicAdd(at + 1, acc[n][2 * h + 1]);
#endif
        }
      }
    }
  };

  /* the query blocks that cross some key's diagonal come first under the causal mask */
  int n_mask = 0;
  if (p.causal) {
    const int64_t span = k0 + BC - 1 - first * BR; /* query blocks starting before k0 + BC - 1 */
    n_mask = (int)((span + BR - 1) / BR);
    if (n_mask > n_it) n_mask = n_it;
  }
  for (int it = 0; it < n_mask; it++) query_block(it, tf_flash_bool<true>());
  for (int it = n_mask; it < n_it; it++) query_block(it, tf_flash_bool<false>());

  /* dK (times scale) and dV through the warp's own K and V rows, once no
   * warp reads them and no copy is in flight */
  tf::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = kw + (lane >> 2) + 8 * h;
#pragma unroll
    for (int dt = 0; dt < DT8; dt++) {
      const int c = dt * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t *>(sK + r * LD + c) =
          tf::pack2<tf_flash_elem<DT>>(dk[dt][2 * h] * p.scale,
                                       dk[dt][2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t *>(sV + r * LD + c) =
          tf::pack2<tf_flash_elem<DT>>(dv[dt][2 * h], dv[dt][2 * h + 1]);
    }
  }
  __syncwarp();
  tf_flash_store_rows<HD, LD>(static_cast<uint16_t *>(p.dk) + b * p.seq_k * hd, sK + kw * LD, 16, kw0, p.seq_k, hd, hd);
  tf_flash_store_rows<HD, LD>(static_cast<uint16_t *>(p.dv) + b * p.seq_k * hd, sV + kw * LD, 16, kw0, p.seq_k, hd, hd);
}

/* The deterministic dQ: one block of WARPS warps (16 query rows each) per
 * query block, K and V blocks of BC keys double-buffered; per key block
 * S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K, all in registers. */
template <int HD_, int WARPS_, int BC_, int MIN_BLOCKS_> struct tf_flash_dq_cfg {
  static constexpr int HD = HD_, WARPS = WARPS_, BC = BC_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int BR = WARPS * 16, THREADS = WARPS * 32, LD = HD + 8;
  static constexpr int SMEM = (2 * BR + 4 * BC) * LD * 2; /* Q, dO, then K and V twice */
  static_assert(HD % 16 == 0 && BC % 16 == 0, "tiles are whole mma tiles");
};

template <int DT, class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) tf_flash_dq_tc_kernel(const tf_cuda_flash_params p) {
  constexpr int HD = C::HD, BR = C::BR, BC = C::BC, LD = C::LD, NT = BC / 8, DT8 = HD / 8;
  uint16_t *sQ =
      reinterpret_cast<uint16_t *>(tf::dynamic_smem<unsigned char>());
  uint16_t *sdO = sQ + BR * LD, *sK = sdO + BR * LD, *sV = sK + 2 * BC * LD;
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  int64_t b, q0;
  int n_tiles;
  tf_flash_query_block_of<BR, BC>(p, &b, &q0, &n_tiles);
  const int hd = p.head_dim;
  const tf_flash_problem pr = tf_flash_problem_of(p, b);
  const uint16_t *Q = pr.q, *K = pr.k, *V = pr.v, *dO = pr.dout;
  tf_flash_load_rows<BR, HD, LD, C::THREADS>(sQ, Q, q0, p.seq_q, hd);
  tf_flash_load_rows<BR, HD, LD, C::THREADS>(sdO, dO, q0, p.seq_q, hd, p.o_ld);
  if (n_tiles > 0) {
    tf_flash_load_rows<BC, HD, LD, C::THREADS>(sK, K, 0, p.seq_k, hd);
    tf_flash_load_rows<BC, HD, LD, C::THREADS>(sV, V, 0, p.seq_k, hd);
  }
  tf::cp_async_commit();

  const int wrow = warp * 16;
  const int64_t wq0 = q0 + wrow;
  /* the statistics of the lane's rows g and g + 8 (P = 0 past the last row) */
  float lse2[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t row = wq0 + (lane >> 2) + 8 * h;
    lse2[h] = row < p.seq_q ? p.lse[b * p.seq_q + row] * TF_FLASH_LOG2E : INFINITY;
    dd[h] = row < p.seq_q ? p.rowdot[b * p.seq_q + row] : 0.f;
  }
  /* the ldmatrix addresses spelt out (tf_flash_a_addr's and tf_flash_b_addr's), which keeps
   * this kernel's schedule as it was (with the helpers ptxas moved 9-35 instructions) */
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
  const uint32_t q_a = tf::smem_addr(sQ + (wrow + a_row) * LD + a_col);
  const uint32_t do_a = tf::smem_addr(sdO + (wrow + a_row) * LD + a_col);
  const uint32_t k_b = tf::smem_addr(sK + b_row * LD + b_col),
                 k_bt = tf::smem_addr(sK + a_row * LD + a_col);
  const uint32_t v_b = tf::smem_addr(sV + b_row * LD + b_col);
  const float sl2 = p.scale_log2;

  float dq[DT8][4];
#pragma unroll
  for (int dt = 0; dt < DT8; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;

  for (int j = 0; j < n_tiles; j++) {
    tf_flash_kv_step<BC, HD, LD, C::THREADS>(p, sK, sV, K, V, j + 1, n_tiles, hd);
    const int64_t k0 = (int64_t)j * BC;
    if (wq0 >= p.seq_q || (p.causal && k0 > wq0 + 15)) continue;
    const uint32_t ks = (uint32_t)((j & 1) * BC * LD * 2);

    float s[NT][4], dp[NT][4];
    tf_flash_bwd_scores<DT, HD, LD>(s, dp, q_a, do_a, k_b, v_b, ks); /* S = Q K^T, dP = dO V^T */
    const bool mask = (p.causal && k0 + BC - 1 > wq0) || k0 + BC > p.seq_k;
    const int key_lim = (int)(p.seq_k - k0 < BC ? p.seq_k - k0 : BC);
    const int diag = p.causal ? (int)(wq0 - k0) : BC;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = (lane >> 2) + (e & 2) * 4, c = nt * 8 + (lane & 3) * 2 + (e & 1);
        float pv = tf_cuda_exp2(fmaf(s[nt][e], sl2, -lse2[e >> 1]));
        if (mask && (c >= key_lim || c > diag + r)) pv = 0.f;
        dp[nt][e] = pv * (dp[nt][e] - dd[e >> 1]);
      }
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
      uint32_t a[4];
      tf_flash_c_to_a<DT>(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < DT8; dt += 2) {
        uint32_t kb[4];
        tf::ldmatrix_x4_trans(kb, k_bt + ks +
                                      (uint32_t)((kk * 16 * LD + dt * 8) * 2));
        tf::mma_16816<tf_flash_elem<DT>>(dq[dt], a, kb[0], kb[1]);
        tf::mma_16816<tf_flash_elem<DT>>(dq[dt + 1], a, kb[2], kb[3]);
      }
    }
  }

  if (n_tiles == 0) {
    tf::cp_async_wait<0>();
    __syncthreads();
  }
  __syncwarp();
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = wrow + (lane >> 2) + 8 * h;
#pragma unroll
    for (int dt = 0; dt < DT8; dt++)
      *reinterpret_cast<uint32_t *>(sQ + r * LD + dt * 8 + (lane & 3) * 2) =
          tf::pack2<tf_flash_elem<DT>>(dq[dt][2 * h] * p.scale,
                                       dq[dt][2 * h + 1] * p.scale);
  }
  __syncwarp();
  tf_flash_store_rows<HD, LD>(static_cast<uint16_t *>(p.dq) + b * p.seq_q * hd, sQ + wrow * LD, 16, wq0, p.seq_q, hd, hd);
}

/* ---- launch -------------------------------------------------------------------------- */

template <class K> static tf_status tf_flash_smem_attrs(K kernel, int bytes) {
  TF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  TF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     (int)cudaSharedmemCarveoutMaxShared));
  return TF_OK;
}

template <int DT, class C>
static tf_status tf_flash_bwd_launch(tf_cuda_state *st, const tf_cuda_flash_params *p, bool atomic_dq) {
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_k + C::BC - 1) / C::BC, &grid));
  if (atomic_dq) {
    TF_TRY(tf_flash_smem_attrs(tf_flash_bwd_tc_kernel<DT, C, true>, C::SMEM_DQ));
    tf_flash_bwd_tc_kernel<DT, C, true><<<grid, C::THREADS, C::SMEM_DQ, st->stream>>>(*p);
  } else {
    TF_TRY(tf_flash_smem_attrs(tf_flash_bwd_tc_kernel<DT, C, false>, C::SMEM_NO_DQ));
    tf_flash_bwd_tc_kernel<DT, C, false><<<grid, C::THREADS, C::SMEM_NO_DQ, st->stream>>>(*p);
  }
  return tf_cuda_launched("flash_attention backward kernel");
}

template <int DT, class C> static tf_status tf_flash_dq_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_q + C::BR - 1) / C::BR, &grid));
  TF_TRY(tf_flash_smem_attrs(tf_flash_dq_tc_kernel<DT, C>, C::SMEM));
  tf_flash_dq_tc_kernel<DT, C><<<grid, C::THREADS, C::SMEM, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention dq kernel");
}

/* dK/dV: 8 warps (128 keys) a block, 64 queries a step; 128 at head dim 64,
 * where it is faster (its registers do not fit above). */
template <int DT>
static tf_status tf_flash_bwd_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_pad, bool atomic_dq) {
  switch (hd_pad) {
    case 16: return tf_flash_bwd_launch<DT, tf_flash_bwd_cfg<16, 8, 64, 1>>(st, p, atomic_dq);
    case 32: return tf_flash_bwd_launch<DT, tf_flash_bwd_cfg<32, 8, 64, 1>>(st, p, atomic_dq);
    case 64: return tf_flash_bwd_launch<DT, tf_flash_bwd_cfg<64, 8, 128, 1>>(st, p, atomic_dq);
    case 96: return tf_flash_bwd_launch<DT, tf_flash_bwd_cfg<96, 8, 64, 1>>(st, p, atomic_dq);
    case 128: return tf_flash_bwd_launch<DT, tf_flash_bwd_cfg<128, 8, 64, 1>>(st, p, atomic_dq);
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no tensor-core kernel for head dim %d", hd_pad);
  }
}

/* dQ: 4 warps (64 query rows) a block, 64 keys a step. */
template <int DT> static tf_status tf_flash_dq_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_pad) {
  switch (hd_pad) {
    case 16: return tf_flash_dq_launch<DT, tf_flash_dq_cfg<16, 4, 64, 2>>(st, p);
    case 32: return tf_flash_dq_launch<DT, tf_flash_dq_cfg<32, 4, 64, 2>>(st, p);
    case 64: return tf_flash_dq_launch<DT, tf_flash_dq_cfg<64, 4, 64, 2>>(st, p);
    case 96: return tf_flash_dq_launch<DT, tf_flash_dq_cfg<96, 4, 64, 2>>(st, p);
    case 128: return tf_flash_dq_launch<DT, tf_flash_dq_cfg<128, 4, 64, 2>>(st, p);
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no tensor-core kernel for head dim %d", hd_pad);
  }
}

bool tf_flash_bwd_ws_on(const tf_cuda_state *st, int64_t hd) {
#ifdef TF_WITH_SM90A
  return tf_flash_wgmma_dim(hd) > 0 && tf_flash_wgmma_here(st);
#else
  (void)st, (void)hd;
  return false;
#endif
}

tf_status tf_cuda_flash_backward_tc(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_pad,
                                    bool atomic_dq) {
#ifdef TF_WITH_SM90A
  const int hd_w = tf_flash_wgmma_dim(p->head_dim);
  if (hd_w > 0 && tf_flash_bwd_ws_on(st, p->head_dim)) {
    if (atomic_dq && !p->dq_acc_swizzled)
      return tf_fail(TF_ERR_STATE, "flash_attention: the warp-specialised backward kernel wants a swizzled dQ workspace");
    return tf_cuda_flash_backward_ws(st, p, dt, hd_w, atomic_dq);
  }
#endif
  /* the mma.sync kernel adds dQ up in the workspace's plain layout (the
   * choice above is read from the environment on every call: never mix the two) */
  if (atomic_dq && p->dq_acc_swizzled)
    return tf_fail(TF_ERR_STATE, "flash_attention: a swizzled dQ workspace for a kernel that adds dQ up unswizzled");
  return dt == TF_BF16 ? tf_flash_bwd_dt<TF_BF16>(st, p, hd_pad, atomic_dq)
                       : tf_flash_bwd_dt<TF_F16>(st, p, hd_pad, atomic_dq);
}

/* Also on a 9.0 device where there are no keys (no warp-specialised dQ
 * kernel then: it takes seq_k > 0), which writes dq = 0. */
tf_status tf_cuda_flash_dq_tc(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_pad) {
  return dt == TF_BF16 ? tf_flash_dq_dt<TF_BF16>(st, p, hd_pad) : tf_flash_dq_dt<TF_F16>(st, p, hd_pad);
}
