/* FlashAttention's deterministic dQ on Hopper, warp-specialised (sm_90a):
 * products, masks and rounding as wgmma_softmax.cuh has them, f16/bf16,
 * head dims (padded to) 64, 80, 96 and 128. The dQ pass on a 9.0 device
 * when there are keys (tf_flash_backward, flash_attn.cu; 16-byte aligned
 * buffers and head dims of whole 16-byte words, as the Hopper kernels
 * take). It also sums D = rowsum(dO * O) of its rows, with the row-sum
 * kernel's arithmetic, and writes it for the dK/dV kernel, which runs
 * after it: the backward pass has no row-sum kernel then.
 *
 * A block owns BR = 128 query rows of one problem and has three
 * warpgroups, with no block-wide barrier after its start, as the forward
 * kernel (flash_attn_fwd_ws.cu):
 *   - warpgroup 0 gives its registers away (setmaxnreg) and loads: one
 *     thread brings the block's Q and dO rows once, then each key block's
 *     K and V (BC keys) by TMA into a ring of STAGES buffers, each with a
 *     full and an empty barrier;
 *   - warpgroups 1 and 2 (the consumers, 64 query rows each, dQ in f32
 *     registers) walk the key blocks the rows see:
 *       S_j = Q K_j^T, dP_j = dO V_j^T     (both operands from shared memory)
 *       P_j = exp2(S_j scale log2 e - lse log2 e), dS_j = P_j (dP_j - D)
 *       dQ += dS_j K_j                     (dS_j from registers, K N-major)
 *     dQ += dS_{j-1} K_{j-1} and S_j, dP_j are issued together, and the
 *     two consumers take turns issuing their products (two named
 *     barriers), so that one's exponentials run beside the other's
 *     products;
 *   - dQ times scale is staged through the consumer's own Q rows and
 *     written once with 16-byte stores: no atomics, the same bits every
 *     run.
 * The grid is the forward kernel's: a block per (problem, query block),
 * problem by problem, the query blocks last-first. */
#include "../flash_attn_common.cuh"

#include <string.h>

#include "rtc/tfhost_sm90.cuh"
#include "tma_maps.cuh"
#include "tma_ptx.cuh"
#include "wgmma_softmax.cuh"
#include "wgmma_tiles.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_attn_dq_ws.cu is built for sm_90a only"
#endif

/* Head dim HD, STAGES K/V buffers of BC keys; shared memory as
 * tf_ws_query_cfg lays it out: Q and dO, K and V, the barriers (Q/dO full;
 * full and empty per buffer). */
template <int HD_, int BC_, int STAGES_> struct tf_dq_ws_cfg : tf_ws_query_cfg<HD_, BC_, STAGES_, 2, 2> {
  static constexpr uint32_t DO_AT = tf_dq_ws_cfg::ROWS;
};

/* The kernel's parameters: the tensor maps of Q, dO, K and V (by address
 * in the parameter space, hence __grid_constant__), then the flash
 * parameters. */
struct tf_dq_ws_params {
  CUtensorMap q, dout, k, v;
  tf_cuda_flash_params p;
};

/* a row's four lanes in the products' fragments (lane & 3) are the lanes that sum its D */
static_assert(TF_FLASH_ROWDOT_TPR == 4, "D is summed by the four lanes that hold a row");

template <int DT, class C>
__global__ void __launch_bounds__(384, 1) tf_flash_dq_ws_kernel(const __grid_constant__ tf_dq_ws_params a) {
  const tf_cuda_flash_params &p = a.p;
  constexpr int HD = C::HD, BR = C::BR, BC = C::BC, STAGES = C::STAGES, HALVES = C::HDS / 64;
  constexpr uint32_t KV = C::KV;
  unsigned char *base_ptr;
  const uint32_t base = tf_wgmma_smem_base(&base_ptr);
  const uint32_t sQ = base + C::Q_AT, sdO = base + C::DO_AT, sK = base + C::K_AT, sV = base + C::V_AT;
  const uint32_t bar_q = base + C::BAR_AT, bar_full = bar_q + 8, bar_empty = bar_full + 8 * STAGES;
  int64_t b, q0;
  int n_tiles;
  tf_flash_query_block_of<BR, BC>(p, &b, &q0, &n_tiles);

  tf_ws_query_bars<STAGES, 1>(bar_q); /* Q/dO full; full and empty a buffer */

  const int wg = tf_wgmma_warpgroup(), lane = (int)threadIdx.x % 32;
  if (wg == 0) {
    tf::setmaxnreg_dec<TF_WS_LOAD_REGS>();
    if (threadIdx.x == 0) {
      /* the loader: Q and dO once, then block j's K and V into buffer j mod STAGES */
      tf_ws_loader_begin(&a.k, &a.v, bar_q, 2 * C::ROWS);
      tf_tma_load_q_do<HALVES, BR>(sQ, &a.q, sdO, &a.dout, (int)q0, (int)b, (int)p.o_group, bar_q);
      for (int j = 0; j < n_tiles; j++) {
        const int s = j % STAGES;
        const uint32_t at = (uint32_t)s * KV, full = bar_full + 8 * s;
        if (j >= STAGES)
          tf::mbar_wait_idle(bar_empty + 8 * s,
                             (uint32_t)((j / STAGES - 1) & 1));
        tf::mbar_arrive_expect_tx(full, 2 * KV);
        tf_tma_load_pair<HALVES, BC>(sK + at, &a.k, sV + at, &a.v, j * BC, (int)b, full);
      }
    }
    return;
  }

  /* ---- the consumers ---- */
  tf::setmaxnreg_inc<TF_WS_MMA_REGS>();
  const int cw = wg - 1, warp = ((int)threadIdx.x / 32) % 4, g = lane >> 2;
  const int row_in = warp * 16 + g; /* the thread's rows: row_in and row_in + 8 of the consumer */
  const int64_t wq0 = q0 + cw * 64; /* the consumer's first row */
  const uint32_t q_w = sQ + (uint32_t)(cw * 64 * 128), do_w = sdO + (uint32_t)(cw * 64 * 128);
  /* lse of the thread's rows, and D summed here as the row-sum kernel sums
   * it (the four lanes of a row, lane & 3, the same words in the same
   * order: the same bits), from memory while the loader's copies are on
   * their way; the row's first lane writes it for the dK/dV kernel */
  float lse_l2[2], dd[2];
  tf_wgmma_dq_lse(p, b, wq0, row_in, lse_l2);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t row = wq0 + row_in + 8 * h;
    const bool live = row < p.seq_q;
    dd[h] = tf_flash_rowdot_sum(live ? tf_flash_rowdot_part<DT, true>(p, b, row, lane & 3) : 0.f);
    if (live && (lane & 3) == 0) p.rowdot[b * p.seq_q + row] = dd[h];
  }
  const float sl2 = p.scale_log2;
  float dq[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;

  auto full = [&](int j) {
    tf::mbar_wait(bar_full + 8 * (j % STAGES), (uint32_t)((j / STAGES) & 1));
  };
  auto release = [&](int j) { tf::mbar_arrive(bar_empty + 8 * (j % STAGES)); };
  float s[BC / 2], dp[BC / 2];
  uint32_t da[BC / 16][4];
  auto issue_s_dp = [&](int j) {
    const uint32_t at = (uint32_t)(j % STAGES) * KV;
    tf_wgmma_issue_s_dp<DT, HD, BR, BC>(s, dp, q_w, do_w, sK + at, sV + at);
  };
  auto issue_dq = [&](int j) { tf_wgmma_issue_acc<DT, BC>(dq, da, sK + (uint32_t)(j % STAGES) * KV); }; /* dQ += dS_j K_j */
  /* a turn is a named barrier (1 + cw) that the other consumer's previous
   * turn arrived at; consumer 0 goes first, and takes one turn more at the
   * end (consumer 1's last arrival) */
  auto turn_begin = [&]() { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory"); };
  auto turn_end = [&]() { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory"); };
  if (cw == 1) turn_end();

  int n_full = (int)(p.seq_k / BC); /* blocks below every row's diagonal and inside the keys */
  if (p.causal && (q0 + 1) / BC < n_full) n_full = (int)((q0 + 1) / BC);
  if (n_full > n_tiles) n_full = n_tiles;
  /* S_j and dP_j waited for, then dS_j packed */
  auto grads = [&](int j) {
    tf::wgmma_wait<0>();
    tf::wgmma_hold(s);
    tf::wgmma_hold(dp);
    if (j < n_full)
      tf_wgmma_dq_grads<BC, false>(s, dp, lse_l2, dd, sl2, tf_wgmma_mask{});
    else
      tf_wgmma_dq_grads<BC, true>(s, dp, lse_l2, dd, sl2, tf_wgmma_mask_of<BC>(p, wq0, row_in, (int64_t)j * BC));
    tf_wgmma_pack_p<DT, BC>(dp, da);
  };
  /* Q and dO landed (their own barrier: key block 0's may complete first;
   * until 2026-11-28 nothing waited here, and block 0's products could read
   * tiles still arriving, a rare change of dQ's last bits) */
  tf::mbar_wait(bar_q, 0);
  if (n_tiles > 0) {
    full(0);
    turn_begin();
    issue_s_dp(0);
    turn_end();
    grads(0);
    for (int j = 1; j < n_tiles; j++) {
      /* dQ += dS_{j-1} K_{j-1} and S_j, dP_j in one turn; block j - 1 released once its product is done */
      full(j);
      turn_begin();
      issue_dq(j - 1);
      issue_s_dp(j);
      turn_end();
      tf::wgmma_wait<1>();
      tf::wgmma_hold(dq);
      tf::wgmma_hold_regs(da);
      release(j - 1);
      grads(j);
    }
    turn_begin();
    issue_dq(n_tiles - 1);
    turn_end();
    tf::wgmma_wait<0>();
    tf::wgmma_hold(dq);
    tf::wgmma_hold_regs(da);
    release(n_tiles - 1);
  }
  if (cw == 0) turn_begin();

  /* dQ times scale through the consumer's own (swizzled) Q rows, then 16-byte stores */
  const float scale[2] = {p.scale, p.scale};
  tf_wgmma_write_rows<DT, BR, HD>(static_cast<uint16_t *>(p.dq) + b * p.seq_q * p.head_dim, base_ptr + C::Q_AT, cw, dq,
                                  scale, wq0, p.seq_q, p.head_dim, p.head_dim, 3 + cw);
}

/* ---- launch ------------------------------------------------------------------------------- */

template <int DT, class C> static tf_status tf_dq_ws_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  unsigned grid = 0;
  tf_dq_ws_params a;
  TF_TRY(tf_ws_params_of(p, (p->seq_q + C::BR - 1) / C::BR, &a, &grid));
  TF_TRY(tf_tma_map_bwd(&a.q, &a.dout, &a.k, &a.v, p, C::BR, C::BC));
  return tf_ws_launch(st, tf_flash_dq_ws_kernel<DT, C>, grid, C::SMEM, a, "flash_attention dq kernel (warp-specialised)");
}

/* The configuration of head dim HD, the fastest measured
 * (docs/performance.md): at 64, 128 keys a block and three K/V buffers;
 * above, 64 keys (S, dP and dQ in one thread's registers) and four
 * buffers. */
template <int DT> static tf_status tf_dq_ws_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_w) {
  switch (hd_w) {
    case 64: return tf_dq_ws_launch<DT, tf_dq_ws_cfg<64, 128, 3>>(st, p);
    case 80: return tf_dq_ws_launch<DT, tf_dq_ws_cfg<80, 64, 4>>(st, p);
    case 96: return tf_dq_ws_launch<DT, tf_dq_ws_cfg<96, 64, 4>>(st, p);
    case 128: return tf_dq_ws_launch<DT, tf_dq_ws_cfg<128, 64, 4>>(st, p);
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no warp-specialised dq kernel for head dim %d", hd_w);
  }
}

tf_status tf_cuda_flash_dq_ws(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w) {
  return dt == TF_BF16 ? tf_dq_ws_dt<TF_BF16>(st, p, hd_w) : tf_dq_ws_dt<TF_F16>(st, p, hd_w);
}
