/* FlashAttention-2 on Hopper's warpgroup MMA (wgmma, sm_90a), f16/bf16,
 * head dims (padded to) 64, 80, 96 and 128: the forward pass, the backward
 * pass's dK/dV kernel (with dQ by reductions), and its deterministic dQ
 * kernel. The mma.sync kernels (flash_attn_fwd.cu,
 * flash_attn_bwd.cu) stay the path for other GPUs and head dims. The
 * forward pass here runs only with TF_FLASH_FWD_WS=0: by default
 * flash_attn_fwd_ws.cu's warp-specialised kernel takes its place.
 *
 * Forward: one block of NWG warpgroups (128 threads each) owns BR = 64 NWG
 * query rows of one problem, each warpgroup 64 of them, and walks the key
 * blocks of BC keys:
 *   - Q, K and V tiles sit in shared memory in the 128-byte swizzled layout
 *     wgmma reads: rows of 64 elements (128 bytes), the 16-byte chunk c of
 *     row r stored at chunk c ^ (r mod 8), head dims above 64 as two such
 *     halves (80 and 96 padded to 128 in shared memory, but only their own
 *     columns loaded and multiplied); tiles start on 1024-byte boundaries.
 *     They are filled by 16-byte cp.async from every thread, K and V in
 *     STAGES buffers (block j + STAGES - 1 in flight while block j is
 *     used), and handed to the tensor cores' async proxy by
 *     fence.proxy.async before the block's barrier;
 *   - S = Q K^T by wgmma m64nBCk16, K-major K in shared memory and Q's A
 *     fragments in registers (read once by ldmatrix); the accumulators are
 *     in mma.sync's C layout, so the online softmax is the mma.sync
 *     kernel's: a row's max and sum over its 4-lane quad, exp2 by FFMA +
 *     MUFU.EX2, O rescaled only when some row's max moved;
 *   - P is rounded to 16 bits in registers and fed as the register A
 *     operand of O += P V (wgmma m64nHDk16, V N-major in shared memory);
 *   - with PINGPONG the two warpgroups take turns issuing products (named
 *     barriers), so that one's softmax runs while the other's product is on
 *     the tensor cores;
 *   - causal: key blocks past the block's last row are never loaded; blocks
 *     wholly below the diagonal run without mask code (no product sits in
 *     a branch: a block wholly above a warpgroup's rows is masked out);
 *   - O / sum is staged through the warpgroup's own Q rows and written with
 *     16-byte stores; lse = max |scale| + ln(sum).
 * The grid is the mma.sync kernel's: one block per (problem, query block),
 * problem by problem, the query blocks last-first. The backward kernels
 * are described where they start, below. */
#include "../flash_attn_common.cuh"

#include "wgmma_ptx.cuh"
#include "wgmma_softmax.cuh"
#include "wgmma_tiles.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_attn_wgmma.cu is built for sm_90a only"
#endif

/* Head dim HD (64, 80, 96 or 128; rows of HDS = 64 or 128 columns in
 * shared memory), NWG warpgroups, BC keys per block, K and V in STAGES
 * buffers, PINGPONG: the warpgroups take turns on the tensor cores,
 * MIN_BLOCKS resident blocks wanted per SM. */
template <int HD_, int NWG_, int BC_, int STAGES_, bool PINGPONG_ = false, int MIN_BLOCKS_ = 1>
struct tf_wgmma_fwd_cfg {
  static_assert(HD_ == 64 || HD_ == 80 || HD_ == 96 || HD_ == 128, "the head dims the kernels are built for");
  static constexpr int HD = HD_, HDS = tf_wgmma_hds(HD_), NWG = NWG_, BC = BC_, STAGES = STAGES_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr bool PINGPONG = PINGPONG_;
  static_assert(!PINGPONG || NWG == 2, "two warpgroups take turns");
  static constexpr int BR = 64 * NWG, THREADS = 128 * NWG;
  static constexpr int Q_BYTES = BR * HDS * 2, KV_BYTES = BC * HDS * 2;
  /* Q, K and V STAGES times, and the slack that aligns the base to 1024 bytes */
  static constexpr int SMEM = Q_BYTES + 2 * STAGES * KV_BYTES + 1024;
  static_assert(STAGES >= 2, "at least double-buffered");
  static_assert(BC == 64 || BC == 128, "S is one m64nBC product");
};

/* Rows [row0, row0 + ROWS) of a (nrows, hd) matrix (rows ld elements
 * apart; 0: hd) into a swizzled tile at shared address dst, by THREADS
 * threads; rows past nrows and columns past hd zero-filled. Not committed. */
template <int ROWS, int HD, int THREADS>
__device__ __forceinline__ void tf_wgmma_load(uint32_t dst, const uint16_t *src, int64_t row0, int64_t nrows, int hd,
                                              int64_t ld = 0) {
  const int64_t stride = ld ? ld : hd;
  constexpr int CH = HD / 8, TOTAL = ROWS * CH;
#pragma unroll
  for (int i = 0; i < (TOTAL + THREADS - 1) / THREADS; i++) {
    const int idx = (int)threadIdx.x + i * THREADS;
    if (TOTAL % THREADS != 0 && idx >= TOTAL) break;
    const int r = idx / CH, c = idx % CH;
    const bool ok = row0 + r < nrows && c * 8 < hd;
    tf_flash_cp16(dst + tf_wgmma_chunk<ROWS>(r, c), ok ? src + (row0 + r) * stride + c * 8 : src, ok);
  }
}

template <int DT, class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) tf_flash_fwd_wgmma_kernel(const tf_cuda_flash_params p) {
  constexpr int HD = C::HD, BC = C::BC, BR = C::BR;
  unsigned char *sQ_ptr;
  const uint32_t sQ = tf_wgmma_smem_base(&sQ_ptr), sK = sQ + C::Q_BYTES, sV = sK + C::STAGES * C::KV_BYTES;
  const int wg = tf_wgmma_warpgroup(), warp = ((int)threadIdx.x / 32) % 4, lane = (int)threadIdx.x % 32;
  int64_t b, q0;
  int n_tiles;
  tf_flash_query_block_of<BR, BC>(p, &b, &q0, &n_tiles);
  const int hd = p.head_dim;
  const tf_flash_problem pr = tf_flash_problem_of(p, b);
  const uint16_t *Q = pr.q, *K = pr.k, *V = pr.v;

  /* block j's K and V into stage j mod STAGES */
  auto load_block = [&](int j) {
    const uint32_t stage = (uint32_t)((j % C::STAGES) * C::KV_BYTES);
    tf_wgmma_load<BC, HD, C::THREADS>(sK + stage, K, (int64_t)j * BC, p.seq_k, hd);
    tf_wgmma_load<BC, HD, C::THREADS>(sV + stage, V, (int64_t)j * BC, p.seq_k, hd);
  };
  tf_wgmma_load<BR, HD, C::THREADS>(sQ, Q, q0, p.seq_q, hd);
  if (n_tiles > 0) load_block(0);
  tf_flash_cp_commit();
#pragma unroll
  for (int j = 1; j < C::STAGES - 1; j++) {
    if (j < n_tiles) load_block(j);
    tf_flash_cp_commit();
  }
  /* scale < 0: the running max is of -q.k; q's signs are flipped once, in shared memory */
  if (p.q_sign) {
    tf_flash_cp_wait<0>();
    __syncthreads();
    uint32_t *words = reinterpret_cast<uint32_t *>(sQ_ptr);
    for (int i = (int)threadIdx.x; i < C::Q_BYTES / 4; i += C::THREADS) words[i] ^= p.q_sign;
  }

  const int64_t wq0 = q0 + wg * 64;        /* the warpgroup's first row */
  const int g = lane >> 2;
  const int row_in = warp * 16 + g;        /* the thread's rows: row_in and row_in + 8 of the warpgroup */
  const float sl2 = p.fwd_scale_log2;
  /* descriptors: K K-major (8-row groups 1024 bytes apart); V N-major (8-key
   * groups 1024 bytes apart, the head dim's 64-column halves BC rows apart) */

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  auto mask_scores = [&](float(&s)[BC / 2], int64_t k0) {
    tf_wgmma_mask_scores<BC>(s, tf_wgmma_mask_of<BC>(p, wq0, row_in, k0));
  };
  auto softmax_step = [&](float(&s)[BC / 2], float(&alpha)[2]) {
    tf_wgmma_softmax_step<BC>(s, row_max, row_sum, sl2, alpha);
  };
  auto rescale = [&](const float(&alpha)[2]) { tf_wgmma_rescale<HD>(o, alpha); };
  auto pack_p = [&](const float(&s)[BC / 2], uint32_t(&pa)[BC / 16][4]) { tf_wgmma_pack_p<DT, BC>(s, pa); };
  /* Q's A fragments in registers (ldmatrix from the swizzled rows once they
   * have landed), so that S's product reads only K from shared memory */
  uint32_t qa[HD / 16][4];
  auto load_q_fragments = [&]() {
    const int r = wg * 64 + warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) tf_flash_ldsm4(qa[kk], sQ + tf_wgmma_chunk<BR>(r, 2 * kk + (lane >> 4)));
  };
  auto issue_s = [&](float(&s)[BC / 2], uint32_t k_st) {
    const uint64_t dk = tf_wgmma_desc(k_st, 16, 1024);
    tf_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      const uint32_t off = (uint32_t)((kk & 3) * 32); /* the k step's 32 bytes inside a 128-byte row */
      tf_wgmma_rs<DT, 0>(s, qa[kk], tf_wgmma_desc_add(dk, (uint32_t)((kk >> 2) * BC * 128) + off), kk > 0);
    }
    tf_wgmma_commit();
  };
  auto issue_pv = [&](const uint32_t(&pa)[BC / 16][4], uint32_t v_st) { tf_wgmma_issue_acc<DT, BC>(o, pa, v_st); };
  int n_full = (int)(p.seq_k / BC); /* blocks below every row's diagonal and inside the keys */
  if (p.causal && (q0 + 1) / BC < n_full) n_full = (int)((q0 + 1) / BC);
  if (n_full > n_tiles) n_full = n_tiles;

  /* per block: S, softmax, O += P V, each product waited for; the copies of
   * block j + STAGES - 1 are issued at the start of block j (one group per
   * block, empty past the last) */
  /* PINGPONG (two warpgroups): the warpgroups take turns issuing products,
   * S_j of one, then S_j of the other, then P V of the first, ..., each turn
   * a named barrier (1 + wg) that the other warpgroup's previous turn
   * arrived at; so one warpgroup's softmax runs while the other's product
   * is on the tensor cores. */
  auto turn_begin = [&]() {
    if constexpr (C::PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
  };
  auto turn_end = [&]() {
    if constexpr (C::PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
  };
  if (C::PINGPONG && wg == 1) turn_end(); /* warpgroup 0 goes first */
  auto key_block = [&](int j, auto mask_tag) {
    constexpr bool MASK = decltype(mask_tag)::value;
    tf_flash_cp_wait<C::STAGES - 2>();
    tf_wgmma_fence_smem();
    __syncthreads(); /* block j has landed for the tensor cores; every warpgroup is done with block j - 1 */
    const int ahead = j + C::STAGES - 1;
    if (ahead < n_tiles) load_block(ahead);
    tf_flash_cp_commit();
    const int64_t k0 = (int64_t)j * BC;
    /* a block wholly above this warpgroup's rows (BC < BR) is computed and
     * masked out like the others: no product may sit in a branch */
    const uint32_t stage = (uint32_t)((j % C::STAGES) * C::KV_BYTES);
    float s[BC / 2], alpha[2];
    uint32_t pa[BC / 16][4];
    turn_begin();
    issue_s(s, sK + stage);
    turn_end();
    tf_wgmma_wait<0>();
    tf_wgmma_hold(s);
    if (MASK) mask_scores(s, k0);
    softmax_step(s, alpha);
    rescale(alpha);
    pack_p(s, pa);
    turn_begin();
    issue_pv(pa, sV + stage);
    turn_end();
    tf_wgmma_wait<0>();
    tf_wgmma_hold(o);
  };
  /* Q (in the first copy group) lands, then its fragments are read */
  tf_flash_cp_wait<C::STAGES - 2>();
  __syncthreads();
  load_q_fragments();
  for (int j = 0; j < n_full; j++) key_block(j, tf_flash_bool<false>());
  for (int j = n_full; j < n_tiles; j++) key_block(j, tf_flash_bool<true>());
  if (n_tiles == 0) { /* no keys at all: Q's copies land before its rows are reused */
    tf_flash_cp_wait<0>();
    __syncthreads();
  }
  if (C::PINGPONG && wg == 0) turn_begin(); /* warpgroup 1's last arrival */

  /* O / sum into the warpgroup's own (swizzled) Q rows, lse; then 16-byte stores */
  float inv[2];
  tf_wgmma_softmax_end(p, p.lse + b * p.seq_q, wq0, row_in, row_max, row_sum, inv);
  tf_wgmma_write_rows<DT, BR, HD>(tf_flash_o_of<uint16_t>(p, b), sQ_ptr, wg, o, inv, wq0, p.seq_q, hd, p.o_ld, 3 + wg);
}

/* ---- launch -------------------------------------------------------------------------- */

/* f(tf_flash_int<HD>()) for the wgmma head dim hd_w (64, 80, 96 or 128). */
template <class F> static tf_status tf_wgmma_with_hd(int hd_w, F f) {
  switch (hd_w) {
    case 64: return f(tf_flash_int<64>());
    case 80: return f(tf_flash_int<80>());
    case 96: return f(tf_flash_int<96>());
    case 128: return f(tf_flash_int<128>());
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no wgmma kernel for head dim %d", hd_w);
  }
}

template <int DT, class C> static tf_status tf_wgmma_fwd_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_q + C::BR - 1) / C::BR, &grid));
  TF_CUDA_CHECK(cudaFuncSetAttribute(tf_flash_fwd_wgmma_kernel<DT, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     C::SMEM));
  tf_flash_fwd_wgmma_kernel<DT, C><<<grid, C::THREADS, C::SMEM, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention forward kernel (wgmma)");
}

/* Two warpgroups (128 query rows) a block, Q's fragments in registers.
 * Head dim 64: 64 keys a block, double-buffered, two blocks an SM (128
 * registers a thread); head dims 80, 96 and 128: 128 keys a block, three
 * buffers, the warpgroups taking turns. Chosen on an H200 among 64 or 128
 * keys, 2 or 3 buffers, 2 or 3 warpgroups, turns or not, Q in registers or
 * shared memory, and a software-pipelined loop (slower): docs/performance.md. */
template <int DT> static tf_status tf_wgmma_fwd_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_w) {
  return tf_wgmma_with_hd(hd_w, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    if constexpr (HD == 64)
      return tf_wgmma_fwd_launch<DT, tf_wgmma_fwd_cfg<64, 2, 64, 2, false, 2>>(st, p);
    else
      return tf_wgmma_fwd_launch<DT, tf_wgmma_fwd_cfg<HD, 2, 128, 3, true>>(st, p);
  });
}

tf_status tf_cuda_flash_forward_wgmma(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w) {
  return dt == TF_BF16 ? tf_wgmma_fwd_dt<TF_BF16>(st, p, hd_w) : tf_wgmma_fwd_dt<TF_F16>(st, p, hd_w);
}

/* ---- the backward pass: dK and dV (and dQ by reductions) ------------------------------ */

/* One block of two warpgroups owns BC = 128 keys of one problem, each
 * warpgroup 64 of them, with their K and V rows in shared memory, and walks
 * the query blocks of 64 rows that see them (Q, dO, lse and D double-
 * buffered by cp.async), as flash_attn_bwd.cu's kernel does, with every
 * product a warpgroup one:
 *   S^T = K Q^T, dP^T = V dO^T            (both operands K-major in shared memory)
 *   P^T = exp2(S^T scale log2 e - lse log2 e), dS^T = P^T (dP^T - D)
 *   dV += P^T dO, dK += dS^T Q           (A = P^T, dS^T in registers, B N-major)
 *   dQ (this block's rows) += dS K       (dS^T through shared memory, read
 *                                          M-major; K N-major)
 * dK and dV stay in registers (f32) until the end (at head dim 128, 128
 * registers a thread). With ATOMIC_DQ dQ of the block's 128 keys is added
 * into the f32 workspace by 16-byte reductions (red .v4.f32), the two
 * warpgroups splitting the head dim; without it the dQ kernel below
 * computes dQ, deterministically. */
template <int HD> struct tf_wgmma_bwd_layout {
  static constexpr int BC = 128, BR = 64, HDS = tf_wgmma_hds(HD);
  /* K and V (BC rows), Q and dO twice (BR rows), dS^T of each warpgroup
   * (64 x 64, with atomic dQ), then lse and D twice */
  static constexpr uint32_t KV = BC * HDS * 2, QO = BR * HDS * 2, DS = 64 * 128;
  static constexpr uint32_t STATS = 2 * KV + 4 * QO + 2 * DS;
  static constexpr int SMEM = (int)STATS + 4 * BR * 4 + 1024;
};

template <int DT, int HD, bool ATOMIC_DQ>
__global__ void __launch_bounds__(256, 1) tf_flash_bwd_wgmma_kernel(const tf_cuda_flash_params p) {
  using L = tf_wgmma_bwd_layout<HD>;
  constexpr int BC = L::BC, BR = L::BR, NT = BR / 8;
  constexpr uint32_t QO = L::QO;
  /* the head-dim columns of dQ that warpgroup 0 adds up */
  constexpr int DQ_N0 = HD == 64 ? 32 : 64;
  unsigned char *base_ptr;
  const uint32_t base = tf_wgmma_smem_base(&base_ptr), sK = base, sV = sK + L::KV, sQ = sV + L::KV;
  const uint32_t sdO = sQ + 2 * QO, sdS = sdO + 2 * QO;
  float *const sLse = reinterpret_cast<float *>(base_ptr + L::STATS), *const sD = sLse + 2 * BR;
  const int wg = tf_wgmma_warpgroup(), warp = ((int)threadIdx.x / 32) % 4, lane = (int)threadIdx.x % 32;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  int64_t b, k0;
  tf_flash_key_block_of<BC>(p, &b, &k0);
  const int hd = p.head_dim;
  const tf_flash_problem pr = tf_flash_problem_of(p, b);
  const uint16_t *Q = pr.q, *dO = pr.dout, *K = pr.k, *V = pr.v;
  const float *lse = pr.lse, *D = pr.rowdot;

  tf_wgmma_load<BC, HD, 256>(sK, K, k0, p.seq_k, hd);
  tf_wgmma_load<BC, HD, 256>(sV, V, k0, p.seq_k, hd);
  tf_flash_cp_commit();
  /* under the causal mask, queries before k0 see none of these keys */
  const int64_t q_blocks = (p.seq_q + BR - 1) / BR, first = p.causal ? k0 / BR : 0;
  const int n_it = (int)(q_blocks > first ? q_blocks - first : 0);
  auto load_queries = [&](int it) {
    const int stage = it & 1;
    const int64_t q0 = (first + it) * BR;
    tf_wgmma_load<BR, HD, 256>(sQ + (uint32_t)stage * QO, Q, q0, p.seq_q, hd);
    tf_wgmma_load<BR, HD, 256>(sdO + (uint32_t)stage * QO, dO, q0, p.seq_q, hd, p.o_ld);
    tf_flash_load_stat<BR, 256>(sLse + stage * BR, lse, q0, p.seq_q);
    tf_flash_load_stat<BR, 256>(sD + stage * BR, D, q0, p.seq_q);
    tf_flash_cp_commit();
  };
  if (n_it > 0) load_queries(0);

  /* the warpgroup's 64 keys: K and V rows (in each 64-column half), and its dS^T tile */
  const uint32_t k_w = sK + (uint32_t)wg * 64 * 128, v_w = sV + (uint32_t)wg * 64 * 128, ds_w = sdS + (uint32_t)wg * L::DS;
  const int key_in = wg * 64 + warp * 16 + g; /* the thread's keys: key_in and key_in + 8 of the block */
  const float sl2 = p.scale_log2;
  float dk[HD / 2], dv[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;

  /* dQ (rows q0..q0 + 63) += dS K over the block's 128 keys, into the f32
   * workspace by 16-byte reductions, N columns from col0 (a product never
   * crosses a 64-column half of K's rows); the warpgroups split the head
   * dim, warpgroup 0 taking the first DQ_N0 columns. A reads the two
   * warpgroups' dS^T tiles (they follow each other: 16 keys a step, 2048
   * bytes apart) M-major, B reads K N-major. */
  auto add_dq = [&](int64_t q0, int col0, auto n_tag) {
    constexpr int N = decltype(n_tag)::value;
    const uint32_t k_cols = sK + (uint32_t)((col0 >> 6) * BC * 128 + (col0 & 63) * 2);
    const uint64_t d_ds = tf_wgmma_desc(sdS, 64 * 128, 1024), d_k = tf_wgmma_desc(k_cols, BC * 128, 1024);
    float dq[N / 2];
    tf_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++)
      tf_wgmma_ss<DT, 1, 1>(dq, tf_wgmma_desc_add(d_ds, kk * 2048), tf_wgmma_desc_add(d_k, kk * 2048), kk > 0);
    tf_wgmma_commit();
    tf_wgmma_wait<0>();
    tf_wgmma_hold(dq);
    tf_wgmma_hold(dv);
    tf_wgmma_hold(dk);
    /* rows (queries) warp * 16 + g (+ 8), columns col0 + 8 nt + 2t (+ 1): lane pairs
     * swap halves so that the even lane adds 4 columns of row g, the odd one of row g + 8 */
    const bool odd = lane & 1;
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++) {
      const float give0 = odd ? dq[4 * nt + 0] : dq[4 * nt + 2], give1 = odd ? dq[4 * nt + 1] : dq[4 * nt + 3];
      const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
      const int64_t row = q0 + warp * 16 + g + (odd ? 8 : 0);
      const int col = col0 + nt * 8 + (odd ? t2 - 2 : t2);
      if (row < p.seq_q && col < hd) {
        const float4 v = odd ? make_float4(got0, got1, dq[4 * nt + 2], dq[4 * nt + 3])
                             : make_float4(dq[4 * nt + 0], dq[4 * nt + 1], got0, got1);
        float *at = p.dq_acc + (b * p.seq_q + row) * hd + col;
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at), "f"(v.x), "f"(v.y), "f"(v.z),
                     "f"(v.w)
                     : "memory");
      }
    }
  };

  for (int it = 0; it < n_it; it++) {
    tf_flash_cp_wait<0>();
    tf_wgmma_fence_smem();
    __syncthreads(); /* block it has landed; every warpgroup is done with block it - 1 */
    if (it + 1 < n_it) load_queries(it + 1);
    const int stage = it & 1;
    const int64_t q0 = (first + it) * BR;
    const uint32_t q_st = sQ + (uint32_t)stage * QO, do_st = sdO + (uint32_t)stage * QO;
    const float *lse_s = sLse + stage * BR, *D_s = sD + stage * BR;

    /* S^T = K Q^T, dP^T = V dO^T */
    float s[BR / 2], dp[BR / 2];
    tf_wgmma_bwd_s_dp<DT, HD, BC, BR>(s, dp, k_w, v_w, q_st, do_st);

    /* P^T and dS^T; masked where the key is after the query, or either is past the end */
    const bool edge = (p.causal && q0 < k0 + BC) || q0 + BR > p.seq_q || k0 + BC > p.seq_k;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = nt * 8 + t2 + (e & 1), i = 4 * nt + e;
        float pv = tf_cuda_exp2(fmaf(s[i], sl2, -TF_FLASH_LOG2E * lse_s[c]));
        if (edge) {
          const int64_t key = k0 + key_in + 8 * (e >> 1), query = q0 + c;
          if ((p.causal && key > query) || query >= p.seq_q || key >= p.seq_k) pv = 0.f;
        }
        dp[i] = pv * (dp[i] - D_s[c]);
        s[i] = pv;
      }
    uint32_t pa[BR / 16][4], da[BR / 16][4];
    tf_wgmma_pack_p<DT, BR>(s, pa);
    tf_wgmma_pack_p<DT, BR>(dp, da);
    tf_wgmma_bwd_dv_dk<DT, BR>(dv, dk, pa, da, do_st, q_st);

    if constexpr (ATOMIC_DQ) {
      /* dS^T (keys x queries) into the warpgroup's tile; once both are
       * written, dQ = dS K over the block's 128 keys (add_dq) */
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int kk = 0; kk < BR / 16; kk++)
#pragma unroll
          for (int half = 0; half < 2; half++) /* queries 16 kk + 8 half .. + 7: chunk 2 kk + half */
            *reinterpret_cast<uint32_t *>(base_ptr + (ds_w - base) + tf_wgmma_chunk<64>(warp * 16 + g + 8 * h, 2 * kk + half) +
                                          t2 * 2) = da[kk][2 * half + h];
      if constexpr (HD == 128) { /* dV and dK done first: P^T and dS^T's registers are free for dQ (no spills) */
        tf_wgmma_wait<0>();
        tf_wgmma_hold(dv);
        tf_wgmma_hold(dk);
      }
      tf_wgmma_fence_smem();
      __syncthreads(); /* both warpgroups' dS^T are written */
      if constexpr (HD == 128) { /* 32 columns a product: 16 registers for dQ, not 32 */
        add_dq(q0, wg * 64, tf_flash_int<32>());
        add_dq(q0, wg * 64 + 32, tf_flash_int<32>());
      } else if (wg == 0) {
        add_dq(q0, 0, tf_flash_int<DQ_N0>());
      } else {
        add_dq(q0, DQ_N0, tf_flash_int<HD - DQ_N0>());
      }
    } else {
      tf_wgmma_wait<0>();
      tf_wgmma_hold(dv);
      tf_wgmma_hold(dk);
    }
  }

  /* dK (times scale) and dV through the warpgroup's own K and V rows, once no copy is in flight */
  tf_flash_cp_wait<0>();
  __syncthreads();
  tf_wgmma_bwd_store_dk_dv<DT, BC, HD>(p, b, k0, wg, warp, hd, base_ptr + (sK - base), base_ptr + (sV - base), dk, dv,
                                       3 + wg);
}

template <int DT, int HD, bool ATOMIC_DQ>
static tf_status tf_wgmma_bwd_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  using L = tf_wgmma_bwd_layout<HD>;
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_k + L::BC - 1) / L::BC, &grid));
  TF_CUDA_CHECK(cudaFuncSetAttribute(tf_flash_bwd_wgmma_kernel<DT, HD, ATOMIC_DQ>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, L::SMEM));
  tf_flash_bwd_wgmma_kernel<DT, HD, ATOMIC_DQ><<<grid, 256, L::SMEM, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention backward kernel (wgmma)");
}

template <int DT>
static tf_status tf_wgmma_bwd_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_w, bool atomic_dq) {
  return tf_wgmma_with_hd(hd_w, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return atomic_dq ? tf_wgmma_bwd_launch<DT, HD, true>(st, p) : tf_wgmma_bwd_launch<DT, HD, false>(st, p);
  });
}

tf_status tf_cuda_flash_backward_wgmma(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w,
                                       bool atomic_dq) {
  return dt == TF_BF16 ? tf_wgmma_bwd_dt<TF_BF16>(st, p, hd_w, atomic_dq)
                       : tf_wgmma_bwd_dt<TF_F16>(st, p, hd_w, atomic_dq);
}

/* ---- the backward pass's deterministic dQ ---------------------------------------------- */

/* One block of two warpgroups per 128 query rows (64 each), walking the key
 * blocks of 64 keys that the rows see (K and V double-buffered), as
 * flash_attn_bwd.cu's dQ kernel does:
 *   S = Q K^T, dP = dO V^T                (K-major operands in shared memory)
 *   P = exp2(S scale log2 e - lse log2 e), dS = P (dP - D)
 *   dQ += dS K                            (dS from registers, K N-major)
 * dQ stays in registers and is written once, times scale: no atomics, the
 * same bits every run. */
template <int DT, int HD>
__global__ void __launch_bounds__(256, 1) tf_flash_dq_wgmma_kernel(const tf_cuda_flash_params p) {
  constexpr int BC = 64, BR = 128, HDS = tf_wgmma_hds(HD);
  constexpr uint32_t ROWS_BYTES = BR * HDS * 2, KV_BYTES = BC * HDS * 2;
  unsigned char *base_ptr;
  const uint32_t sQ = tf_wgmma_smem_base(&base_ptr), sdO = sQ + ROWS_BYTES, sK = sdO + ROWS_BYTES, sV = sK + 2 * KV_BYTES;
  const int wg = tf_wgmma_warpgroup(), warp = ((int)threadIdx.x / 32) % 4, lane = (int)threadIdx.x % 32;
  const int g = lane >> 2;
  int64_t b, q0;
  int n_tiles;
  tf_flash_query_block_of<BR, BC>(p, &b, &q0, &n_tiles);
  const int64_t wq0 = q0 + wg * 64;
  const int hd = p.head_dim;
  const tf_flash_problem pr = tf_flash_problem_of(p, b);
  const uint16_t *Q = pr.q, *K = pr.k, *V = pr.v, *dO = pr.dout;
  auto load_block = [&](int j) {
    const uint32_t stage = (uint32_t)((j & 1) * KV_BYTES);
    tf_wgmma_load<BC, HD, 256>(sK + stage, K, (int64_t)j * BC, p.seq_k, hd);
    tf_wgmma_load<BC, HD, 256>(sV + stage, V, (int64_t)j * BC, p.seq_k, hd);
  };
  tf_wgmma_load<BR, HD, 256>(sQ, Q, q0, p.seq_q, hd);
  tf_wgmma_load<BR, HD, 256>(sdO, dO, q0, p.seq_q, hd, p.o_ld);
  if (n_tiles > 0) load_block(0);
  tf_flash_cp_commit();

  /* the statistics of the thread's rows row_in and row_in + 8 */
  const int row_in = warp * 16 + g;
  float lse_l2[2], dd[2];
  tf_wgmma_dq_row_stats(p, b, wq0, row_in, lse_l2, dd);
  const float sl2 = p.scale_log2;
  const uint32_t q_wg = sQ + (uint32_t)(wg * 64 * 128), do_wg = sdO + (uint32_t)(wg * 64 * 128);
  float dq[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;

  auto key_block = [&](int j, auto mask_tag) {
    constexpr bool MASK = decltype(mask_tag)::value;
    tf_flash_cp_wait<0>();
    tf_wgmma_fence_smem();
    __syncthreads(); /* block j has landed; every warpgroup is done with block j - 1 */
    if (j + 1 < n_tiles) load_block(j + 1);
    tf_flash_cp_commit();
    const int64_t k0 = (int64_t)j * BC;
    const uint32_t k_st = sK + (uint32_t)((j & 1) * KV_BYTES), v_st = sV + (uint32_t)((j & 1) * KV_BYTES);
    float s[BC / 2], dp[BC / 2];
    tf_wgmma_issue_s_dp<DT, HD, BR, BC>(s, dp, q_wg, do_wg, k_st, v_st);
    tf_wgmma_wait<0>();
    tf_wgmma_hold(s);
    tf_wgmma_hold(dp);
    tf_wgmma_dq_grads<BC, MASK>(s, dp, lse_l2, dd, sl2, tf_wgmma_mask_of<BC>(p, wq0, row_in, k0));
    uint32_t da[BC / 16][4];
    tf_wgmma_pack_p<DT, BC>(dp, da);
    tf_wgmma_issue_acc<DT, BC>(dq, da, k_st);
    tf_wgmma_wait<0>();
    tf_wgmma_hold(dq);
  };
  int n_full = (int)(p.seq_k / BC); /* blocks below every row's diagonal and inside the keys */
  if (p.causal && (q0 + 1) / BC < n_full) n_full = (int)((q0 + 1) / BC);
  if (n_full > n_tiles) n_full = n_tiles;
  for (int j = 0; j < n_full; j++) key_block(j, tf_flash_bool<false>());
  for (int j = n_full; j < n_tiles; j++) key_block(j, tf_flash_bool<true>());
  tf_flash_cp_wait<0>();
  __syncthreads();

  /* dQ times scale through the warpgroup's own (swizzled) Q rows, then 16-byte stores */
  const float scale[2] = {p.scale, p.scale};
  tf_wgmma_write_rows<DT, BR, HD>(static_cast<uint16_t *>(p.dq) + b * p.seq_q * hd, base_ptr, wg, dq, scale, wq0,
                                  p.seq_q, hd, hd, 1 + wg);
}

template <int DT, int HD> static tf_status tf_wgmma_dq_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  constexpr int HDS = tf_wgmma_hds(HD), SMEM = 2 * 128 * HDS * 2 + 4 * 64 * HDS * 2 + 1024; /* Q, dO, K and V twice, alignment */
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_q + 127) / 128, &grid));
  TF_CUDA_CHECK(cudaFuncSetAttribute(tf_flash_dq_wgmma_kernel<DT, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     SMEM));
  tf_flash_dq_wgmma_kernel<DT, HD><<<grid, 256, SMEM, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention dq kernel (wgmma)");
}

template <int DT> static tf_status tf_wgmma_dq_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_w) {
  return tf_wgmma_with_hd(hd_w, [&](auto hd) { return tf_wgmma_dq_launch<DT, decltype(hd)::value>(st, p); });
}

tf_status tf_cuda_flash_dq_wgmma(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w) {
  return dt == TF_BF16 ? tf_wgmma_dq_dt<TF_BF16>(st, p, hd_w) : tf_wgmma_dq_dt<TF_F16>(st, p, hd_w);
}
