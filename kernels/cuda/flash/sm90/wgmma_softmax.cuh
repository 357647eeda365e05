/* The forward pass's online softmax on a warpgroup's S accumulator (64
 * rows, BC keys, mma.sync's C layout: the thread's rows row_in and
 * row_in + 8, h = 0 and 1), of the Hopper forward kernel
 * (flash_attn_fwd_ws.cu): the causal / key-end mask, the running max and sum (a
 * row's max and sum over its 4-lane quad, exp2 by FFMA + MUFU.EX2), O's
 * rescaling, P rounded to 16 bits as the register A operand of O += P V,
 * and lse; and the backward kernels' (flash_attn_bwd_ws.cu,
 * flash_attn_dq_ws.cu) dV += P^T dO and dK += dS^T Q from the same
 * packing. Include after flash_attn_common.cuh and rtc/tfhost_sm90.cuh. */
#ifndef TF_WGMMA_SOFTMAX_CUH
#define TF_WGMMA_SOFTMAX_CUH

#include <stdint.h>

/* Which scores of a warpgroup's accumulator (64 rows from row0, BC keys
 * from k0, mma.sync's C layout) are hidden: past the keys, or (causal)
 * after the row. For element e of column tile nt the key offset less the
 * lane's 2t is c = 8 nt + (e & 1) and the row offset less the thread's
 * row_in is r = 8 (e >> 1); the key is visible iff c < key_lim and
 * c - r <= diag. */
struct tf_wgmma_mask {
  int key_lim, diag;
  __device__ __forceinline__ bool hidden(int nt, int e) const {
    const int c = nt * 8 + (e & 1), r = (e & 2) * 4;
    return c >= key_lim || c - r > diag;
  }
};

template <int BC>
__device__ __forceinline__ tf_wgmma_mask tf_wgmma_mask_of(const tf_cuda_flash_params &p, int64_t row0, int row_in,
                                                          int64_t k0) {
  const int t2 = ((int)threadIdx.x & 3) * 2;
  return {(int)(p.seq_k - k0 < BC ? p.seq_k - k0 : BC) - t2, (p.causal ? (int)(row0 - k0) : BC) - (t2 - row_in)};
}

/* The hidden scores of s set to -inf. */
template <int BC>
__device__ __forceinline__ void tf_wgmma_mask_scores(float (&s)[BC / 2], const tf_wgmma_mask &m) {
#pragma unroll
  for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      if (m.hidden(nt, e)) s[4 * nt + e] = -INFINITY;
}

/* One key block: s becomes p = exp2(s sl2 - max sl2), the running max and
 * sum of the thread's two rows move, alpha[h] rescales row h of O. */
template <int BC>
__device__ __forceinline__ void tf_wgmma_softmax_step(float (&s)[BC / 2], float (&row_max)[2], float (&row_sum)[2],
                                                      float sl2, float (&alpha)[2]) {
  constexpr int NT = BC / 8;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float mx = row_max[h];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float bias = mx == -INFINITY ? 0.f : mx * sl2;
    alpha[h] = tf_cuda_exp2(row_max[h] * sl2 - bias);
    row_max[h] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      s[4 * nt + 2 * h] = tf_cuda_exp2(fmaf(s[4 * nt + 2 * h], sl2, -bias));
      s[4 * nt + 2 * h + 1] = tf_cuda_exp2(fmaf(s[4 * nt + 2 * h + 1], sl2, -bias));
      sum += s[4 * nt + 2 * h] + s[4 * nt + 2 * h + 1];
    }
    row_sum[h] = row_sum[h] * alpha[h] + sum;
  }
}

/* O's rows times alpha, only when some row's max moved in the warp (late
 * key blocks rarely move it). */
template <int HD> __device__ __forceinline__ void tf_wgmma_rescale(float (&o)[HD / 2], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
      o[4 * dt + 0] *= alpha[0];
      o[4 * dt + 1] *= alpha[0];
      o[4 * dt + 2] *= alpha[1];
      o[4 * dt + 3] *= alpha[1];
    }
  }
}

/* P rounded to 16 bits: the register A operand of O += P V, 16 keys a k step. */
template <int DT, int BC>
__device__ __forceinline__ void tf_wgmma_pack_p(const float (&s)[BC / 2], uint32_t (&pa)[BC / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++)
#pragma unroll
    for (int i = 0; i < 4; i++)
      pa[kk][i] = tf::pack2<tf_flash_elem<DT>>(s[8 * kk + 2 * i],
                                               s[8 * kk + 2 * i + 1]);
}

/* acc += A B over BC keys for a warpgroup: A (P, or dS) packed in
 * registers (tf_wgmma_pack_p, 16 keys a k step), B (V, or K) N-major from
 * b_st (8-key groups 1024 bytes apart, the head dim's halves BC rows
 * apart): the forward pass's O += P V, the dQ kernels' dQ += dS K, the
 * dK/dV kernel's dV += P^T dO or dK += dS^T Q alone (BC: the queries).
 * Committed, not waited for; the caller keeps a until it is. */
template <int DT, int BC, int R>
__device__ __forceinline__ void tf_wgmma_issue_acc(float (&acc)[R], const uint32_t (&a)[BC / 16][4], uint32_t b_st) {
  const uint64_t db = tf::wgmma_desc(b_st, BC * 128, 1024);
  tf::wgmma_hold(acc);
  tf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++)
    tf::wgmma_rs<tf_flash_elem<DT>, 1>(
        acc, a[kk], tf::wgmma_desc_add(db, kk * 16 * 128), true);
  tf::wgmma_commit();
}

/* The backward pass's scores and their gradients for a warpgroup's 64
 * rows, S = A B^T and dP = A2 B2^T: A and A2 its rows (from a and a2, in
 * tiles of A_ROWS rows a 64-column half), B and B2 N rows (from b and b2, N
 * rows a half), K-major, head dim HD in 128-byte swizzled halves, 16 a k
 * step; issued and committed, not waited for. The dK/dV kernels take
 * S^T = K Q^T and dP^T = V dO^T (A: the keys), the dQ kernel S = Q K^T
 * and dP = dO V^T (A: the queries). TWO_GROUPS commits S and dP as two
 * groups, so that S can be used while dP is still on the tensor cores. */
template <int DT, int HD, int A_ROWS, int N, bool TWO_GROUPS = false>
__device__ __forceinline__ void tf_wgmma_issue_s_dp(float (&s)[N / 2], float (&dp)[N / 2], uint32_t a, uint32_t a2,
                                                    uint32_t b, uint32_t b2) {
  const uint64_t da = tf::wgmma_desc(a, 16, 1024),
                 db = tf::wgmma_desc(b, 16, 1024);
  const uint64_t da2 = tf::wgmma_desc(a2, 16, 1024),
                 db2 = tf::wgmma_desc(b2, 16, 1024);
  /* the k step's 32 bytes in a 128-byte row of its half */
  auto oa = [](int kk) { return (uint32_t)((kk >> 2) * A_ROWS * 128 + (kk & 3) * 32); };
  auto ob = [](int kk) { return (uint32_t)((kk >> 2) * N * 128 + (kk & 3) * 32); };
  tf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++)
    tf::wgmma_ss<tf_flash_elem<DT>, 0, 0>(s, tf::wgmma_desc_add(da, oa(kk)),
                                          tf::wgmma_desc_add(db, ob(kk)),
                                          kk > 0);
  if constexpr (TWO_GROUPS)
    tf::wgmma_commit(); /* S alone first: wait<1> waits for S, not dP */
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++)
    tf::wgmma_ss<tf_flash_elem<DT>, 0, 0>(dp, tf::wgmma_desc_add(da2, oa(kk)),
                                          tf::wgmma_desc_add(db2, ob(kk)),
                                          kk > 0);
  tf::wgmma_commit();
}

/* The dQ kernels' lse log2(e) of the thread's rows row_in and row_in + 8
 * of a warpgroup's 64 from wq0 in problem b (inf past the last row, so
 * that P is 0 there). */
__device__ __forceinline__ void tf_wgmma_dq_lse(const tf_cuda_flash_params &p, int64_t b, int64_t wq0, int row_in,
                                                float (&lse_l2)[2]) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t row = wq0 + row_in + 8 * h;
    lse_l2[h] = row < p.seq_q ? p.lse[b * p.seq_q + row] * TF_FLASH_LOG2E : INFINITY;
  }
}

/* The dQ kernels' dS = P (dP - D) into dp for a warpgroup's 64 query rows
 * over BC keys (the thread's rows h = 0 and 1: lse log2(e) and D of each),
 * P = exp2(S scale log2 e - lse log2 e), zero where the mask hides the
 * score (MASK). */
template <int BC, bool MASK>
__device__ __forceinline__ void tf_wgmma_dq_grads(const float (&s)[BC / 2], float (&dp)[BC / 2], const float (&lse_l2)[2],
                                                  const float (&dd)[2], float sl2, const tf_wgmma_mask &m) {
#pragma unroll
  for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = 4 * nt + e, h = e >> 1;
      float pv = tf_cuda_exp2(fmaf(s[i], sl2, -lse_l2[h]));
      if (MASK && m.hidden(nt, e)) pv = 0.f;
      dp[i] = pv * (dp[i] - dd[h]);
    }
}

/* The backward pass's dV += P^T dO and dK += dS^T Q for a warpgroup's 64
 * keys over BR queries, P^T and dS^T packed (tf_wgmma_pack_p) into pa and
 * da, which the caller keeps until the products are waited for (wgmma
 * reads them as it runs); dO and Q N-major in shared memory from do_st and
 * q_st, 16 queries a k step, 8-row groups 1024 bytes apart. Committed, not
 * waited for (one commit group; tf_wgmma_issue_acc issues one of them
 * alone). */
template <int DT, int BR, int R>
__device__ __forceinline__ void tf_wgmma_bwd_dv_dk(float (&dv)[R], float (&dk)[R], const uint32_t (&pa)[BR / 16][4],
                                                   const uint32_t (&da)[BR / 16][4], uint32_t do_st, uint32_t q_st) {
  const uint64_t d_do = tf::wgmma_desc(do_st, BR * 128, 1024),
                 d_q = tf::wgmma_desc(q_st, BR * 128, 1024);
  tf::wgmma_hold(dv);
  tf::wgmma_hold(dk);
  tf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BR / 16; kk++)
    tf::wgmma_rs<tf_flash_elem<DT>, 1>(
        dv, pa[kk], tf::wgmma_desc_add(d_do, kk * 2048), true);
#pragma unroll
  for (int kk = 0; kk < BR / 16; kk++)
    tf::wgmma_rs<tf_flash_elem<DT>, 1>(
        dk, da[kk], tf::wgmma_desc_add(d_q, kk * 2048), true);
  tf::wgmma_commit();
}

/* The end of the rows: inv[h] = 1 / sum (0 for a row that saw no key), and
 * lse = max |scale| + ln(sum) of rows row0 + row_in (+ 8) below seq_q
 * (-inf for a row that saw no key) written by the quad's first lane. */
__device__ __forceinline__ void tf_wgmma_softmax_end(const tf_cuda_flash_params &p, float *lse, int64_t row0,
                                                     int row_in, const float (&row_max)[2], const float (&row_sum)[2],
                                                     float (&inv)[2]) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[h] = sum > 0.f ? 1.f / sum : 0.f;
    const int64_t r = row0 + row_in + 8 * h;
    if (((int)threadIdx.x & 3) == 0 && r < p.seq_q)
      lse[r] = sum > 0.f ? row_max[h] * (p.fwd_scale_log2 / TF_FLASH_LOG2E) + logf(sum) : -INFINITY;
  }
}

#endif
