/* FlashAttention's backward pass on Hopper, warp-specialised (sm_90a):
 * dK and dV of 128 keys a block, and dQ added into the f32 workspace,
 * f16/bf16, head dims (padded to) 64, 80, 96 and 128. The dK/dV kernel
 * on a 9.0 device: without dQ for deterministic passes, with dQ by
 * reductions for the others (tf_flash_bwd_ws_on, flash_attn_bwd.cu).
 *
 * A block has three warpgroups and no block-wide barrier after its start:
 *   - warpgroup 0 gives its registers away (setmaxnreg) and loads: its
 *     warp 0 brings the block's K and V rows once, then, for each query
 *     block (128 rows at head dim 64, else 64) that sees the keys, Q and
 *     dO by TMA (tiled copies
 *     from 3-D tensor maps (head dim, seq, problem), so rows past a
 *     problem's end land as zeros, in the 128-byte swizzled layout wgmma
 *     reads) and lse log2(e) and D by its lanes, into a ring of STAGES
 *     buffers, each with a full and an empty barrier; its warp 1 adds each
 *     query block's dQ tile from shared memory into the workspace by one
 *     bulk reduction (cp.reduce.async.bulk .add.f32), so that no consumer
 *     issues an atomic;
 *   - warpgroups 1 and 2 (the consumers, 64 keys each, K and V rows in
 *     shared memory, dK and dV in f32 registers) compute per query block
 *       S^T = K Q^T, dP^T = V dO^T          (both operands from shared memory)
 *       P^T = exp2(S^T scale log2 e - lse log2 e), dS^T = P^T (dP^T - D)
 *       dV += P^T dO, dK += dS^T Q          (P^T, dS^T from registers)
 *       dQ = dS K over the block's 128 keys (dS^T through shared memory;
 *                                            128-row query blocks: 64 rows
 *                                            per warpgroup; 64-row ones:
 *                                            the two halves of the head
 *                                            dim one per warpgroup)
 *     in the order dV's product (while dS^T goes to shared memory), dQ's,
 *     dK's, so that the dQ tile (f32, rows of the problem's head dim, as
 *     the workspace holds them) is written while dK's product runs, as
 *     FlashAttention-3 orders them; then release the Q/dO buffer to the
 *     loader and hand the dQ tile to the dQ warp. The two consumers meet at
 *     one named barrier per query
 *     block (both dS^T tiles written); dS^T is double-buffered, and so is
 *     dQ where shared memory allows (64-row query blocks), so that
 *     nothing else waits.
 *     Without dQ the consumers take turns issuing their products instead
 *     (two named barriers, as in the forward kernel).
 * Without ATOMIC_DQ (deterministic) dS^T and dQ are skipped:
 * flash_attn_dq_ws.cu's dQ kernel computes dQ, and D, before this kernel
 * runs. The grid: a block per (problem, 128 keys), problem by problem. */
#include "../flash_attn_common.cuh"

#include <string.h>

#include "rtc/tfhost_sm90.cuh"
#include "tma_maps.cuh"
#include "tma_ptx.cuh"
#include "wgmma_softmax.cuh"
#include "wgmma_tiles.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_attn_bwd_ws.cu is built for sm_90a only"
#endif

/* Head dim HD (64, 80, 96 or 128), HDS its columns in shared memory, BC
 * keys a block (64 a consumer), query blocks of BR rows (128 at head dim
 * 64, 64 above, where S^T, dP^T, dK and dV would not fit a thread's
 * registers), STAGES Q/dO buffers, DQ_BUFS dQ tiles (DQ_: dQ by
 * reductions, else no dS^T or dQ tiles). Shared memory, from a
 * 1024-byte boundary: K, V (BC rows); Q and dO STAGES times (BR rows);
 * dS^T twice, each as BR / 64 query quarters of the two consumers' 64 x 64
 * tiles one after the other; dQ DQ_BUFS times (BR x HD f32); lse and D
 * STAGES times; the barriers. */
template <int HD_, int BR_, bool DQ_> struct tf_bwd_ws_cfg {
  static_assert(HD_ == 64 || HD_ == 80 || HD_ == 96 || HD_ == 128, "the head dims the kernel is built for");
  static_assert(BR_ == 64 || (BR_ == 128 && HD_ == 64), "128-row query blocks at head dim 64 only");
  static constexpr int HD = HD_, HDS = tf_wgmma_hds(HD_), BC = 128, BR = BR_;
  static constexpr int STAGES = HDS == 64 && BR == 64 ? 3 : 2, DQ_BUFS = BR == 64 ? 2 : 1;
  static constexpr uint32_t KV = BC * HDS * 2, QO = BR * HDS * 2, DS = 64 * 64 * 2, DQ = BR * HD * 4;
  static constexpr uint32_t K_AT = 0, V_AT = KV, Q_AT = 2 * KV, DO_AT = Q_AT + STAGES * QO;
  static constexpr uint32_t DS_AT = DO_AT + STAGES * QO, DQ_AT = DS_AT + (DQ_ ? 2 * (BR / 64) * 2 * DS : 0);
  static constexpr uint32_t LSE_AT = DQ_AT + (DQ_ ? DQ_BUFS * DQ : 0);
  static constexpr uint32_t D_AT = LSE_AT + STAGES * BR * 4, BAR_AT = D_AT + STAGES * BR * 4;
  /* barriers: K/V full, STAGES full, STAGES empty, 2 dQ full, 2 dQ empty (DQ_BUFS of each used) */
  static constexpr int N_BARS = 1 + 2 * STAGES + 4;
  static constexpr int SMEM = tf_ws_smem(BAR_AT, N_BARS);
  static_assert(SMEM <= 227 * 1024, "one block an SM");
};

/* The kernel's parameters: the tensor maps of Q, K, V and dO (by
 * address in the parameter space, hence __grid_constant__), then the
 * flash parameters. */
struct tf_bwd_ws_params {
  CUtensorMap q, k, v, dout;
  tf_cuda_flash_params p;
};

/* What the kernel's two parts share of a block: its shared memory (C's
 * layout from the 1024-byte boundary at base_ptr) and barriers, its head
 * dim, its problem b and first key k0, and the n_it query blocks from
 * block `first` on that see its keys (under the causal mask, queries
 * before k0 see none of them). */
template <class C> struct tf_bwd_ws_block {
  unsigned char *base_ptr;
  uint32_t sK, sV, sQ, sdO, sdS, sdQ;
  float *sLse, *sD;
  uint32_t bar_kv, bar_full, bar_empty, bar_dq_full, bar_dq_empty;
  int64_t b, k0, first;
  int hd, n_it;
};

template <class C> __device__ __forceinline__ tf_bwd_ws_block<C> tf_bwd_ws_block_of(const tf_cuda_flash_params &p) {
  constexpr int BC = C::BC, BR = C::BR, STAGES = C::STAGES;
  tf_bwd_ws_block<C> k;
  const uint32_t base = tf_wgmma_smem_base(&k.base_ptr);
  k.sK = base + C::K_AT, k.sV = base + C::V_AT, k.sQ = base + C::Q_AT, k.sdO = base + C::DO_AT;
  k.sdS = base + C::DS_AT, k.sdQ = base + C::DQ_AT;
  k.sLse = reinterpret_cast<float *>(k.base_ptr + C::LSE_AT), k.sD = reinterpret_cast<float *>(k.base_ptr + C::D_AT);
  k.bar_kv = base + C::BAR_AT, k.bar_full = k.bar_kv + 8, k.bar_empty = k.bar_full + 8 * STAGES;
  k.bar_dq_full = k.bar_empty + 8 * STAGES, k.bar_dq_empty = k.bar_dq_full + 16;
  tf_flash_key_block_of<BC>(p, &k.b, &k.k0);
  k.hd = p.head_dim;
  const int64_t q_blocks = (p.seq_q + BR - 1) / BR;
  k.first = p.causal ? k.k0 / BR : 0;
  k.n_it = (int)(q_blocks > k.first ? q_blocks - k.first : 0);
  return k;
}

/* The block's names for its shared memory, barriers and extent, the same in both parts. */
#define TF_BWD_WS_UNPACK(k)                                                                                           \
  unsigned char *const base_ptr = (k).base_ptr;                                                                       \
  const uint32_t sK = (k).sK, sV = (k).sV, sQ = (k).sQ, sdO = (k).sdO, sdS = (k).sdS, sdQ = (k).sdQ;                  \
  float *const sLse = (k).sLse, *const sD = (k).sD;                                                                   \
  const uint32_t bar_kv = (k).bar_kv, bar_full = (k).bar_full, bar_empty = (k).bar_empty;                             \
  const uint32_t bar_dq_full = (k).bar_dq_full, bar_dq_empty = (k).bar_dq_empty;                                      \
  const int64_t b = (k).b, k0 = (k).k0, first = (k).first;                                                            \
  const int hd = (k).hd, n_it = (k).n_it;                                                                             \
  (void)base_ptr, (void)sdS, (void)sdQ /* the dS^T tiles are the consumers', the dQ tiles' address the dQ warp's */

/* The producer, warpgroup 0 (its registers given away): warp 0 loads,
 * warp 1 (with ATOMIC_DQ) adds the dQ tiles into the workspace. */
template <class C, bool ATOMIC_DQ>
__device__ __forceinline__ void tf_bwd_ws_produce(const tf_bwd_ws_params &a, const tf_bwd_ws_block<C> &blk, int lane) {
  constexpr int BC = C::BC, BR = C::BR, STAGES = C::STAGES, HALVES = C::HDS / 64, DQ_BUFS = C::DQ_BUFS;
  constexpr uint32_t QO = C::QO;
  const tf_cuda_flash_params &p = a.p;
  TF_BWD_WS_UNPACK(blk);
  const int warp = (int)threadIdx.x / 32;
  if (warp == 0) {
    /* the loader: K and V once, then each query block's Q, dO, lse and D */
    if (lane == 0) {
      tf::tma_prefetch_map(&a.q);
      tf::tma_prefetch_map(&a.dout);
      tf::mbar_arrive_expect_tx(bar_kv, 2 * C::KV);
      tf_tma_load_pair<HALVES, BC>(sK, &a.k, sV, &a.v, (int)k0, (int)b, bar_kv);
    }
    const float *lse = p.lse + b * p.seq_q, *D = p.rowdot + b * p.seq_q;
    for (int it = 0; it < n_it; it++) {
      const int s = it % STAGES;
      if (it >= STAGES)
        tf::mbar_wait_idle(bar_empty + 8 * s,
                           (uint32_t)((it / STAGES - 1) & 1));
      const int64_t q0 = (first + it) * BR;
      /* rows past the end: lse = inf makes their P (and dS) zero */
#pragma unroll
      for (int h = 0; h < BR / 32; h++) {
        const int64_t row = q0 + lane + 32 * h;
        sLse[s * BR + lane + 32 * h] = row < p.seq_q ? lse[row] * TF_FLASH_LOG2E : INFINITY;
        sD[s * BR + lane + 32 * h] = row < p.seq_q ? D[row] : 0.f;
      }
      const uint32_t full = bar_full + 8 * s;
      if (lane == 0) {
        tf::mbar_arrive_expect_tx(full, 2 * QO);
        tf_tma_load_q_do<HALVES, BR>(sQ + (uint32_t)s * QO, &a.q, sdO + (uint32_t)s * QO, &a.dout, (int)q0, (int)b,
                                     (int)p.o_group, full);
      } else {
        tf::mbar_arrive(full);
      }
    }
  } else if (ATOMIC_DQ && warp == 1 && lane == 0) {
    /* the dQ warp: each query block's tile (rows of hd f32) added into the workspace */
    for (int it = 0; it < n_it; it++) {
      const int buf = it % DQ_BUFS;
      tf::mbar_wait_idle(bar_dq_full + 8 * buf, (uint32_t)((it / DQ_BUFS) & 1));
      const int64_t q0 = (first + it) * BR, rows = p.seq_q - q0 < BR ? p.seq_q - q0 : BR;
      tf::bulk_reduce_add_f32(p.dq_acc + (b * p.seq_q + q0) * hd,
                              sdQ + (uint32_t)buf * C::DQ,
                              (uint32_t)(rows * hd * 4));
      tf::bulk_commit();
      tf::bulk_wait_read<0>();
      tf::mbar_arrive(bar_dq_empty + 8 * buf);
    }
    tf::bulk_wait<0>();
  }
}

/* The consumers, warpgroups 1 and 2 (cw 0 and 1: 64 keys each, their
 * registers raised): per query block S^T, dP^T, P^T, dS^T, then dV, dQ
 * and dK's products, and at the end dK and dV out. */
template <int DT, class C, bool ATOMIC_DQ>
__device__ __forceinline__ void tf_bwd_ws_consume(const tf_cuda_flash_params &p, const tf_bwd_ws_block<C> &blk, int cw,
                                                  int lane) {
  constexpr int HD = C::HD, BC = C::BC, BR = C::BR, NT = BR / 8, STAGES = C::STAGES, DQ_BUFS = C::DQ_BUFS;
  constexpr uint32_t QO = C::QO;
  /* 64-row query blocks: the head-dim columns of dQ that consumer 0 computes (consumer 1 the rest) */
  constexpr int DQ_N0 = HD == 64 ? 32 : 64;
  TF_BWD_WS_UNPACK(blk);
  const int warp = ((int)threadIdx.x / 32) % 4;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  /* the consumer's 64 keys: K and V rows (in each 64-column half) */
  const uint32_t k_w = sK + (uint32_t)cw * 64 * 128, v_w = sV + (uint32_t)cw * 64 * 128;
  const int key_in = cw * 64 + warp * 16 + g; /* the thread's keys: key_in and key_in + 8 of the block */
  const float sl2 = p.scale_log2;
  float dk[HD / 2], dv[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;

  /* Without ATOMIC_DQ the consumers take turns issuing their products (named
   * barriers 5 + cw, as the forward kernel's), so that one's exponentials
   * run beside the other's products. With ATOMIC_DQ they meet at the dS^T
   * barrier instead. */
  auto turn_begin = [&]() {
    if constexpr (!ATOMIC_DQ) asm volatile("bar.sync %0, 256;\n" ::"r"(5 + cw) : "memory");
  };
  auto turn_end = [&]() {
    if constexpr (!ATOMIC_DQ) asm volatile("bar.arrive %0, 256;\n" ::"r"(6 - cw) : "memory");
  };
  if (cw == 1) turn_end();
  tf::mbar_wait(bar_kv, 0);
  for (int it = 0; it < n_it; it++) {
    const int s = it % STAGES;
    tf::mbar_wait(bar_full + 8 * s, (uint32_t)((it / STAGES) & 1));
    const int64_t q0 = (first + it) * BR;
    const uint32_t q_st = sQ + (uint32_t)s * QO, do_st = sdO + (uint32_t)s * QO;
    const float *lse_s = sLse + s * BR, *D_s = sD + s * BR;

    /* S^T = K Q^T, dP^T = V dO^T. With dQ they are two commit groups, P^T
     * computed while dP^T is on the tensor cores (and no spills at head dims
     * 64-96); without dQ one group, the faster there (docs/performance.md) */
    constexpr bool SPLIT = ATOMIC_DQ;
    float sc[BR / 2], dp[BR / 2];
    turn_begin();
    tf_wgmma_issue_s_dp<DT, HD, BC, BR, SPLIT>(sc, dp, k_w, v_w, q_st, do_st);
    turn_end();

    /* P^T, masked where the key is after the query or past the keys (rows
     * past the queries have lse = inf); then dS^T = P^T (dP^T - D). `|`, not
     * `||`: p is a reference, whose seq_k the compiler would not read before
     * the test, and it would branch (a different schedule) */
    const bool edge = (p.causal && q0 < k0 + BC) | (k0 + BC > p.seq_k);
    tf::wgmma_wait<SPLIT ? 1 : 0>();
    tf::wgmma_hold(sc);
    if constexpr (!SPLIT)
      tf::wgmma_hold(dp);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = nt * 8 + t2 + (e & 1), i = 4 * nt + e;
        float pv = tf_cuda_exp2(fmaf(sc[i], sl2, -lse_s[c]));
        if (edge) {
          const int64_t key = k0 + key_in + 8 * (e >> 1), query = q0 + c;
          if ((p.causal && key > query) || key >= p.seq_k) pv = 0.f;
        }
        if constexpr (!SPLIT) dp[i] = pv * (dp[i] - D_s[c]);
        sc[i] = pv;
      }
    uint32_t pa[BR / 16][4], da[BR / 16][4];
    tf_wgmma_pack_p<DT, BR>(sc, pa);
    if constexpr (SPLIT) {
      tf::wgmma_wait<0>();
      tf::wgmma_hold(dp);
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dp[4 * nt + e] = sc[4 * nt + e] * (dp[4 * nt + e] - D_s[nt * 8 + t2 + (e & 1)]);
    }
    tf_wgmma_pack_p<DT, BR>(dp, da);
    /* the Q/dO buffer back to the loader once dV and dK's products are done (they read it and P^T, dS^T) */
    auto release_stage = [&]() {
      tf::wgmma_hold(dv);
      tf::wgmma_hold(dk);
      tf::wgmma_hold_regs(pa);
      tf::wgmma_hold_regs(da);
      tf::mbar_arrive(bar_empty + 8 * s);
    };
    if constexpr (!ATOMIC_DQ) {
      turn_begin();
      tf_wgmma_bwd_dv_dk<DT, BR>(dv, dk, pa, da, do_st, q_st);
      turn_end();
      tf::wgmma_wait<0>();
      release_stage();
    } else {
      /* dS^T (keys x queries) into this consumer's tiles of buffer it & 1: 64 queries a tile. One
       * stmatrix a 16-query step: da[kk][j] is the 8 x 8 matrix of the warp's keys 8 (j & 1) .. + 7
       * and the step's queries 8 (j >> 1) .. + 7 (chunk c of the query block), whose row r lane
       * 8 j + r addresses (with 32-bit stores, four a step and an address each, the integer pipe
       * was the kernel's busiest) */
      const uint32_t ds_tiles = sdS + (uint32_t)(it & 1) * (BR / 64) * 2 * C::DS;
      const int mj = lane >> 3, key_row = warp * 16 + (lane & 7) + 8 * (mj & 1);
#pragma unroll
      for (int kk = 0; kk < BR / 16; kk++) {
        const int c = 2 * kk + (mj >> 1);
        tf::stmatrix_x4(ds_tiles + cw * C::DS +
                            (uint32_t)((c >> 3) * 2 * C::DS) +
                            tf_wgmma_chunk<64>(key_row, c & 7),
                        da[kk]);
      }
      /* dV's product runs while both consumers' dS^T tiles are completed */
      tf_wgmma_issue_acc<DT, BR>(dv, pa, do_st);
      tf::fence_proxy_async();
      asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* both consumers' dS^T are written */
      const int buf = it % DQ_BUFS;
      float *const dq_tile = reinterpret_cast<float *>(base_ptr + C::DQ_AT + (uint32_t)buf * C::DQ);
      /* dQ (64 rows from row0, columns col0.. col0 + N - 1) = dS K over the
       * block's 128 keys: A reads the 64 rows' two dS^T tiles (16 keys a
       * step, 2048 bytes apart) M-major, B reads K N-major (never across a
       * 64-column half). dK's product is issued behind it, so that dQ's
       * tile is written (in dq_acc's layout, tf_flash_dq_col) while dK's
       * product runs. */
      auto add_dq = [&](int row0, int col0, auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        const uint32_t ds_rows = ds_tiles + (uint32_t)(row0 / 64) * 2 * C::DS;
        const uint32_t k_cols = sK + (uint32_t)((col0 >> 6) * BC * 128 + (col0 & 63) * 2);
        const uint64_t d_ds = tf::wgmma_desc(ds_rows, 64 * 128, 1024),
                       d_k = tf::wgmma_desc(k_cols, BC * 128, 1024);
        float dq[N / 2];
        tf::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++)
          tf::wgmma_ss<tf_flash_elem<DT>, 1, 1>(
              dq, tf::wgmma_desc_add(d_ds, kk * 2048),
              tf::wgmma_desc_add(d_k, kk * 2048), kk > 0);
        tf::wgmma_commit();
        tf_wgmma_issue_acc<DT, BR>(dk, da, q_st);
        tf::wgmma_wait<1>(); /* dV and dQ */
        tf::wgmma_hold(dq);
        tf::wgmma_hold(dv);
        tf::wgmma_hold_regs(pa);
        if (it >= DQ_BUFS)
          tf::mbar_wait(bar_dq_empty + 8 * buf,
                        (uint32_t)((it / DQ_BUFS - 1) & 1));
        /* the row's permutation from a register the compiler cannot see
         * through, so that it does not keep the tile's N / 4 addresses live
         * across the loop (they spilled at head dim 128); not at 80, where
         * that is slower (docs/performance.md) */
        int r7 = g;
        if constexpr (HD != 80) asm volatile("" : "+r"(r7));
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int r = row0 + warp * 16 + g + 8 * h;
#pragma unroll
          for (int nt = 0; nt < N / 8; nt++) {
            const int col = col0 + nt * 8 + t2;
            if (col < hd)
              *reinterpret_cast<float2 *>(dq_tile + r * hd + tf_flash_dq_col(col, r7, hd)) =
                  make_float2(dq[4 * nt + 2 * h], dq[4 * nt + 2 * h + 1]);
          }
        }
        tf::fence_proxy_async();
        tf::mbar_arrive(bar_dq_full + 8 * buf);
      };
      if constexpr (BR == 128) /* each consumer 64 query rows, every column */
        add_dq(cw * 64, 0, tf_flash_int<HD>());
      else if (cw == 0)
        add_dq(0, 0, tf_flash_int<DQ_N0>());
      else
        add_dq(0, DQ_N0, tf_flash_int<HD - DQ_N0>());
      tf::wgmma_wait<0>(); /* dK */
      release_stage();
    }
  }

  if (cw == 0) turn_begin();
  /* dK (times scale) and dV through the consumer's own K and V rows, once both consumers are done with K */
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  tf_wgmma_bwd_store_dk_dv<DT, BC, HD>(p, b, k0, cw, warp, hd, base_ptr + C::K_AT, base_ptr + C::V_AT, dk, dv, 2 + cw);
}

/* The block's state and barriers, then its producer or consumer part. */
template <int DT, int HD, int BR_, bool ATOMIC_DQ>
__global__ void __launch_bounds__(384, 1) tf_flash_bwd_ws_kernel(const __grid_constant__ tf_bwd_ws_params a) {
  using C = tf_bwd_ws_cfg<HD, BR_, ATOMIC_DQ>;
  constexpr int STAGES = C::STAGES, DQ_BUFS = C::DQ_BUFS;
  const tf_cuda_flash_params &p = a.p;
  const tf_bwd_ws_block<C> blk = tf_bwd_ws_block_of<C>(p);
  TF_BWD_WS_UNPACK(blk);

  if (threadIdx.x == 0) {
    tf::mbar_init(bar_kv, 1);
    for (int s = 0; s < STAGES; s++) {
      tf::mbar_init(bar_full + 8 * s,
                    32); /* the loading warp's lanes (lse, D), one of them with
                            Q and dO's bytes */
      tf::mbar_init(bar_empty + 8 * s,
                    256); /* the consumers' threads (each has read lse and D) */
    }
    for (int i = 0; i < DQ_BUFS; i++) {
      tf::mbar_init(bar_dq_full + 8 * i, 256); /* the consumers' threads */
      tf::mbar_init(bar_dq_empty + 8 * i, 1);  /* the dQ warp */
    }
    tf::mbar_init_fence();
  }
  __syncthreads();

  const int wg = tf_wgmma_warpgroup(), lane = (int)threadIdx.x % 32;
  if (wg == 0) {
    tf::setmaxnreg_dec<TF_WS_LOAD_REGS>();
    tf_bwd_ws_produce<C, ATOMIC_DQ>(a, blk, lane);
  } else {
    tf::setmaxnreg_inc<TF_WS_MMA_REGS>();
    tf_bwd_ws_consume<DT, C, ATOMIC_DQ>(p, blk, wg - 1, lane);
  }
}

/* ---- launch ------------------------------------------------------------------------------- */

template <int DT, int HD, int BR, bool ATOMIC_DQ>
static tf_status tf_bwd_ws_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  using C = tf_bwd_ws_cfg<HD, BR, ATOMIC_DQ>;
  unsigned grid = 0;
  tf_bwd_ws_params a;
  TF_TRY(tf_ws_params_of(p, (p->seq_k + C::BC - 1) / C::BC, &a, &grid));
  TF_TRY(tf_tma_map_bwd(&a.q, &a.dout, &a.k, &a.v, p, C::BR, C::BC));
  return tf_ws_launch(st, tf_flash_bwd_ws_kernel<DT, HD, BR, ATOMIC_DQ>, grid, C::SMEM, a,
                      "flash_attention backward kernel (warp-specialised)");
}

template <int DT>
static tf_status tf_bwd_ws_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_w, bool atomic_dq) {
  auto with = [&](auto hd, auto br) {
    constexpr int HD = decltype(hd)::value, BR = decltype(br)::value;
    return atomic_dq ? tf_bwd_ws_launch<DT, HD, BR, true>(st, p) : tf_bwd_ws_launch<DT, HD, BR, false>(st, p);
  };
  /* 128-row query steps at head dim 64, the faster both ways
   * (docs/performance.md) */
  constexpr auto rows64 = tf_flash_int<64>();
  switch (hd_w) {
    case 64: return with(tf_flash_int<64>(), tf_flash_int<128>());
    case 80: return with(tf_flash_int<80>(), rows64);
    case 96: return with(tf_flash_int<96>(), rows64);
    case 128: return with(tf_flash_int<128>(), rows64);
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no warp-specialised backward kernel for head dim %d", hd_w);
  }
}

tf_status tf_cuda_flash_backward_ws(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w,
                                    bool atomic_dq) {
  return dt == TF_BF16 ? tf_bwd_ws_dt<TF_BF16>(st, p, hd_w, atomic_dq) : tf_bwd_ws_dt<TF_F16>(st, p, hd_w, atomic_dq);
}
