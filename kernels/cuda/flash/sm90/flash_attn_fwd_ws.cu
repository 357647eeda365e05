/* FlashAttention's forward pass on Hopper, warp-specialised (sm_90a): O and
 * lse (masks, scaling, rounding of P and lse: wgmma_softmax.cuh), f16/bf16,
 * head dims (padded to) 64, 80, 96 and 128. The forward kernel on a 9.0
 * device (flash_attn_fwd.cu).
 *
 * A block owns BR = 128 query rows of one problem and has three
 * warpgroups, with no block-wide barrier after its start:
 *   - warpgroup 0 gives its registers away (setmaxnreg) and loads: one
 *     thread brings the block's Q rows once, then each key block's K and V
 *     (BC = 192 keys at head dim 64, and at 80 and 96 from 4096 keys on;
 *     128 otherwise) by TMA (tiled copies from
 *     3-D tensor maps (head dim, seq, problem): rows past a problem's end
 *     land as zeros, in the 128-byte swizzled layout of wgmma_tiles.cuh)
 *     into a ring of STAGES buffers; K and V each have a full and an empty barrier per buffer,
 *     so that K of a block is reloaded as soon as S has read it while V
 *     waits for P V;
 *   - warpgroups 1 and 2 (the consumers, 64 rows each, O in f32
 *     registers) walk the key blocks:
 *       S_j = Q K_j^T          (both operands from shared memory)
 *       P_j = exp2(S_j |scale| log2 e - max |scale| log2 e), online
 *       O = O alpha_j + P_j V_j   (P_j from registers, V N-major)
 *     With OVERLAP, S_j and O += P_{j-1} V_{j-1} are issued together and
 *     the softmax of block j runs while P_{j-1} V_{j-1} is on the tensor
 *     cores (O's rescaling by alpha_j waits for that product); with
 *     PINGPONG the two consumers take turns issuing their products (two
 *     named barriers), so that one's softmax runs beside the other's
 *     products;
 *   - causal: key blocks past the block's last row are never loaded; the
 *     blocks below every row's diagonal run without mask code; a block
 *     wholly above a consumer's rows is computed and masked out (no
 *     product sits in a branch, and both consumers walk the same blocks);
 *   - scale < 0: each consumer flips the signs of its own Q rows once;
 *   - O / sum is staged through the consumer's own Q rows and written with
 *     16-byte stores; lse = max |scale| + ln(sum).
 * The grid is the mma.sync kernel's (flash_attn_fwd.cu): a block per
 * (problem, query block), problem by problem, the query blocks last-first.
 * OVERLAP, PINGPONG and 192-key blocks (half the waits and turns a key)
 * are each faster than the kernel without them; at 128, S of 192 keys
 * beside O and P would not fit the registers (docs/performance.md). */
#include "../flash_attn_common.cuh"

#include <stdlib.h>
#include <string.h>

#include "rtc/tfhost_sm90.cuh"
#include "tma_maps.cuh"
#include "tma_ptx.cuh"
#include "wgmma_softmax.cuh"
#include "wgmma_tiles.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_attn_fwd_ws.cu is built for sm_90a only"
#endif

/* Head dim HD, STAGES K/V buffers of BC keys, OVERLAP and PINGPONG as
 * above; shared memory as tf_ws_query_cfg lays it out: Q, K and V, the
 * barriers (Q full; K full, V full, K empty, V empty per buffer). */
template <int HD_, int STAGES_, int BC_ = 128, bool OVERLAP_ = true, bool PINGPONG_ = true>
struct tf_fwd_ws_cfg : tf_ws_query_cfg<HD_, BC_, STAGES_, 1, 4> {
  static_assert(BC_ == 128 || BC_ == 192, "S is one m64nBC product");
  static constexpr bool OVERLAP = OVERLAP_, PINGPONG = PINGPONG_;
};

/* The kernel's parameters: the tensor maps of Q, K and V (by address in
 * the parameter space, hence __grid_constant__), then the flash parameters. */
struct tf_fwd_ws_params {
  CUtensorMap q, k, v;
  tf_cuda_flash_params p;
};

template <int DT, class C>
__global__ void __launch_bounds__(384, 1) tf_flash_fwd_ws_kernel(const __grid_constant__ tf_fwd_ws_params a) {
  constexpr int HD = C::HD, BR = C::BR, BC = C::BC, STAGES = C::STAGES, HALVES = C::HDS / 64;
  constexpr uint32_t KV = C::KV;
  const tf_cuda_flash_params &p = a.p;
  unsigned char *base_ptr;
  const uint32_t base = tf_wgmma_smem_base(&base_ptr);
  const uint32_t sQ = base + C::Q_AT, sK = base + C::K_AT, sV = base + C::V_AT;
  const uint32_t bar_q = base + C::BAR_AT, bar_kf = bar_q + 8, bar_vf = bar_kf + 8 * STAGES;
  const uint32_t bar_ke = bar_vf + 8 * STAGES, bar_ve = bar_ke + 8 * STAGES;
  int64_t b, q0;
  int n_tiles;
  tf_flash_query_block_of<BR, BC>(p, &b, &q0, &n_tiles);

  tf_ws_query_bars<STAGES, 2>(bar_q); /* Q full; K full, V full, K empty, V empty a buffer */

  const int wg = tf_wgmma_warpgroup(), lane = (int)threadIdx.x % 32;
  if (wg == 0) {
    tf::setmaxnreg_dec<TF_WS_LOAD_REGS>();
    if (threadIdx.x == 0) {
      /* the loader: Q once, then block j's K and V into buffer j mod STAGES */
      tf_ws_loader_begin(&a.k, &a.v, bar_q, C::ROWS);
      for (int h = 0; h < HALVES; h++)
        tf::tma_load_3d(sQ + (uint32_t)(h * BR * 128), &a.q, h * 64, (int)q0,
                        (int)b, bar_q);
      for (int j = 0; j < n_tiles; j++) {
        const int s = j % STAGES;
        const uint32_t again = (uint32_t)((j / STAGES - 1) & 1), at = (uint32_t)s * KV;
        if (j >= STAGES)
          tf::mbar_wait_idle(bar_ke + 8 * s, again);
        tf::mbar_arrive_expect_tx(bar_kf + 8 * s, KV);
        for (int h = 0; h < HALVES; h++)
          tf::tma_load_3d(sK + at + (uint32_t)(h * BC * 128), &a.k, h * 64,
                          j * BC, (int)b, bar_kf + 8 * s);
        if (j >= STAGES)
          tf::mbar_wait_idle(bar_ve + 8 * s, again);
        tf::mbar_arrive_expect_tx(bar_vf + 8 * s, KV);
        for (int h = 0; h < HALVES; h++)
          tf::tma_load_3d(sV + at + (uint32_t)(h * BC * 128), &a.v, h * 64,
                          j * BC, (int)b, bar_vf + 8 * s);
      }
    }
    return;
  }

  /* ---- the consumers ---- */
  tf::setmaxnreg_inc<TF_WS_MMA_REGS>();
  const int cw = wg - 1, warp = ((int)threadIdx.x / 32) % 4, g = lane >> 2;
  const int row_in = warp * 16 + g; /* the thread's rows: row_in and row_in + 8 of the consumer */
  const int64_t wq0 = q0 + cw * 64; /* the consumer's first row */
  const uint32_t q_w = sQ + (uint32_t)(cw * 64 * 128); /* its Q rows (in each 64-column half) */
  const float sl2 = p.fwd_scale_log2;

  tf::mbar_wait(bar_q, 0);
  /* scale < 0: the running max is of -q.k; the consumer's Q rows change sign, for the tensor cores' reads */
  if (p.q_sign) {
    for (int h = 0; h < HALVES; h++) {
      uint32_t *words = reinterpret_cast<uint32_t *>(base_ptr + C::Q_AT + h * BR * 128 + cw * 64 * 128);
      for (int i = (int)threadIdx.x % 128; i < 64 * 128 / 4; i += 128) words[i] ^= p.q_sign;
    }
    tf::fence_proxy_async();
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + cw) : "memory");
  }

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  auto k_full = [&](int j) {
    tf::mbar_wait(bar_kf + 8 * (j % STAGES), (uint32_t)((j / STAGES) & 1));
  };
  auto v_full = [&](int j) {
    tf::mbar_wait(bar_vf + 8 * (j % STAGES), (uint32_t)((j / STAGES) & 1));
  };
  auto k_free = [&](int j) { tf::mbar_arrive(bar_ke + 8 * (j % STAGES)); };
  auto v_free = [&](int j) { tf::mbar_arrive(bar_ve + 8 * (j % STAGES)); };
  /* S = Q K_j^T: K-major operands, the k step's 32 bytes in a 128-byte row of its half */
  auto issue_s = [&](float(&s)[BC / 2], int j) {
    const uint64_t dq = tf::wgmma_desc(q_w, 16, 1024),
                   dk = tf::wgmma_desc(sK + (uint32_t)(j % STAGES) * KV, 16,
                                       1024);
    tf::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      const uint32_t off = (uint32_t)((kk & 3) * 32), half = (uint32_t)(kk >> 2);
      tf::wgmma_ss<tf_flash_elem<DT>, 0, 0>(
          s, tf::wgmma_desc_add(dq, half * BR * 128 + off),
          tf::wgmma_desc_add(dk, half * BC * 128 + off), kk > 0);
    }
    tf::wgmma_commit();
  };
  /* O += P V_j: V N-major (8-key groups 1024 bytes apart, the head dim's halves BC rows apart) */
  auto issue_pv = [&](const uint32_t(&pa)[BC / 16][4], int j) {
    tf_wgmma_issue_acc<DT, BC>(o, pa, sV + (uint32_t)(j % STAGES) * KV);
  };
  /* PINGPONG: a turn is a named barrier (1 + cw) that the other consumer's
   * previous turn arrived at; consumer 0 goes first, and takes one turn
   * more at the end (consumer 1's last arrival) */
  auto turn_begin = [&]() {
    if constexpr (C::PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory");
  };
  auto turn_end = [&]() {
    if constexpr (C::PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
  };
  if (cw == 1) turn_end();

  int n_full = (int)(p.seq_k / BC); /* blocks below every row's diagonal and inside the keys */
  if (p.causal && (q0 + 1) / BC < n_full) n_full = (int)((q0 + 1) / BC);
  if (n_full > n_tiles) n_full = n_tiles;
  float s[BC / 2], alpha[2];
  uint32_t pa[BC / 16][4];
  auto softmax = [&](int j, bool mask) {
    if (mask) tf_wgmma_mask_scores<BC>(s, tf_wgmma_mask_of<BC>(p, wq0, row_in, (int64_t)j * BC));
    tf_wgmma_softmax_step<BC>(s, row_max, row_sum, sl2, alpha);
  };

  if constexpr (C::OVERLAP) {
    /* block j: S_j and P_{j-1} V_{j-1} in one turn; the softmax of S_j
     * while P_{j-1} V_{j-1} runs; then O rescaled and P_j packed */
    auto step = [&](int j, auto mask_tag) {
      k_full(j);
      v_full(j - 1);
      turn_begin();
      issue_s(s, j);
      issue_pv(pa, j - 1);
      turn_end();
      tf::wgmma_wait<1>();
      tf::wgmma_hold(s);
      k_free(j);
      softmax(j, decltype(mask_tag)::value);
      tf::wgmma_wait<0>();
      tf::wgmma_hold(o);
      tf::wgmma_hold_regs(pa);
      v_free(j - 1);
      tf_wgmma_rescale<HD>(o, alpha);
      tf_wgmma_pack_p<DT, BC>(s, pa);
    };
    if (n_tiles > 0) {
      k_full(0);
      turn_begin();
      issue_s(s, 0);
      turn_end();
      tf::wgmma_wait<0>();
      tf::wgmma_hold(s);
      k_free(0);
      softmax(0, n_full == 0); /* O is still zero: no rescaling */
      tf_wgmma_pack_p<DT, BC>(s, pa);
      for (int j = 1; j < n_full; j++) step(j, tf_flash_bool<false>());
      for (int j = n_full > 1 ? n_full : 1; j < n_tiles; j++) step(j, tf_flash_bool<true>());
      v_full(n_tiles - 1);
      turn_begin();
      issue_pv(pa, n_tiles - 1);
      turn_end();
      tf::wgmma_wait<0>();
      tf::wgmma_hold(o);
      tf::wgmma_hold_regs(pa);
      v_free(n_tiles - 1);
    }
  } else {
    /* block j: S_j, its softmax, then P_j V_j, each product waited for (two turns) */
    auto step = [&](int j, auto mask_tag) {
      k_full(j);
      turn_begin();
      issue_s(s, j);
      turn_end();
      tf::wgmma_wait<0>();
      tf::wgmma_hold(s);
      k_free(j);
      softmax(j, decltype(mask_tag)::value);
      tf_wgmma_rescale<HD>(o, alpha);
      tf_wgmma_pack_p<DT, BC>(s, pa);
      v_full(j);
      turn_begin();
      issue_pv(pa, j);
      turn_end();
      tf::wgmma_wait<0>();
      tf::wgmma_hold(o);
      tf::wgmma_hold_regs(pa);
      v_free(j);
    };
    for (int j = 0; j < n_full; j++) step(j, tf_flash_bool<false>());
    for (int j = n_full; j < n_tiles; j++) step(j, tf_flash_bool<true>());
  }
  if (cw == 0) turn_begin();

  /* O / sum into the consumer's own (swizzled) Q rows, lse; then 16-byte stores */
  float inv[2];
  tf_wgmma_softmax_end(p, p.lse + b * p.seq_q, wq0, row_in, row_max, row_sum, inv);
  tf_wgmma_write_rows<DT, BR, HD>(tf_flash_o_of<uint16_t>(p, b), base_ptr + C::Q_AT, cw, o, inv, wq0, p.seq_q, p.head_dim,
                                  p.o_ld, 3 + cw);
}

/* ---- launch ------------------------------------------------------------------------------- */

template <int DT, class C> static tf_status tf_fwd_ws_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  unsigned grid = 0;
  tf_fwd_ws_params a;
  TF_TRY(tf_ws_params_of(p, (p->seq_q + C::BR - 1) / C::BR, &a, &grid));
  TF_TRY(tf_tma_map_rows(&a.q, p->q, p->seq_q, p->batch, p->head_dim, C::BR));
  TF_TRY(tf_tma_map_rows(&a.k, p->k, p->seq_k, p->batch, p->head_dim, C::BC));
  TF_TRY(tf_tma_map_rows(&a.v, p->v, p->seq_k, p->batch, p->head_dim, C::BC));
  return tf_ws_launch(st, tf_flash_fwd_ws_kernel<DT, C>, grid, C::SMEM, a, "flash_attention forward kernel (warp-specialised)");
}

/* The configuration of head dim HD: at 64, 192 keys a block and three
 * buffers; above, two buffers (the O accumulator takes 40 to 64 registers
 * a thread more), of 192 keys at 80 and 96 from TF_FWD_WS_LONG keys on
 * (no spills; 224 KiB of shared memory: faster on long sequences, slower
 * on short ones, whose last block of 192 is mostly empty) and of 128 keys
 * below that and at 128 (docs/performance.md). */
enum { TF_FWD_WS_LONG = 4096 };

/* The keys from which 80 and 96 take blocks of 192: TF_FWD_WS_LONG, or
 * TF_FLASH_FWD_LONG from the environment (read on every call), so that
 * the tests can run that configuration at short lengths (under racecheck). */
static int64_t tf_fwd_ws_long(void) {
  const char *v = getenv("TF_FLASH_FWD_LONG");
  if (!v || !*v) return (int64_t)TF_FWD_WS_LONG;
  char *end = NULL;
  const long long n = strtoll(v, &end, 10);
  return end && *end == '\0' && n >= 0 ? (int64_t)n : (int64_t)TF_FWD_WS_LONG;
}

template <int DT, int HD> static tf_status tf_fwd_ws_hd(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  if constexpr (HD == 64)
    return tf_fwd_ws_launch<DT, tf_fwd_ws_cfg<64, 3, 192>>(st, p);
  else if constexpr (HD == 80 || HD == 96) {
    if (p->seq_k >= tf_fwd_ws_long()) return tf_fwd_ws_launch<DT, tf_fwd_ws_cfg<HD, 2, 192>>(st, p);
    return tf_fwd_ws_launch<DT, tf_fwd_ws_cfg<HD, 2>>(st, p);
  } else
    return tf_fwd_ws_launch<DT, tf_fwd_ws_cfg<HD, 2>>(st, p);
}

template <int DT> static tf_status tf_fwd_ws_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_w) {
  switch (hd_w) {
    case 64: return tf_fwd_ws_hd<DT, 64>(st, p);
    case 80: return tf_fwd_ws_hd<DT, 80>(st, p);
    case 96: return tf_fwd_ws_hd<DT, 96>(st, p);
    case 128: return tf_fwd_ws_hd<DT, 128>(st, p);
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no warp-specialised forward kernel for head dim %d", hd_w);
  }
}

tf_status tf_cuda_flash_forward_ws(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w) {
  return dt == TF_BF16 ? tf_fwd_ws_dt<TF_BF16>(st, p, hd_w) : tf_fwd_ws_dt<TF_F16>(st, p, hd_w);
}
