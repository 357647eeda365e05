/* FlashAttention-2's forward pass on tensor cores (f16/bf16), the fast path
 * of flash_attn.cu. One block of WARPS warps owns BR = WARPS * 16 * MT query
 * rows of one problem (each warp MT row tiles of 16) and walks the key
 * blocks of BC keys:
 *   - a warp owns 32 rows (MT = 2), so that one ldmatrix of K or V feeds
 *     four mma and shared memory bandwidth stays below the tensor cores';
 *   - Q is loaded once; K and V blocks are double-buffered in shared memory
 *     by 16-byte cp.async, block j + 1 in flight while block j is used, one
 *     __syncthreads per block;
 *   - shared rows are padded by 16 bytes (LD = HD + 8 elements), so the
 *     eight row addresses of every ldmatrix fall in distinct bank quads;
 *   - S = Q K^T by mma.sync m16n8k16 (Q and K fragments by ldmatrix), then
 *     the online softmax in registers: a row's max and sum are reduced over
 *     the 4 lanes that share it, p = exp2(s |scale| log2 e - max |scale|
 *     log2 e) by one FFMA and one MUFU.EX2 per score, O rescaled by
 *     exp2(old max - new max) in registers, and only when some row's max
 *     moved (a warp vote: late key blocks rarely move it);
 *   - P is rounded to 16 bits in registers and is directly the A operand
 *     of O += P V (V fragments by ldmatrix.trans): P never touches shared
 *     memory; O stays in registers (f32) until the end, is divided by the
 *     row sums, staged through the warp's own Q rows and written with
 *     16-byte stores; lse = max |scale| + ln(sum);
 *   - causal: key blocks past the block's last row are never loaded; the
 *     blocks below every row's diagonal run a loop without any mask code,
 *     the few that cross it (or the end of the keys) a masked one, in which
 *     a warp skips a block wholly above its own rows;
 *   - one block per (problem, query block), problem by problem, the query
 *     blocks last-first: under the causal mask the longest rows start
 *     first and the short ones fill the tail. */
#include "flash_attn_common.cuh"

/* A forward configuration: head dim HD (padded), WARPS warps of MT 16-row
 * tiles, BC keys per block, MIN_BLOCKS resident blocks wanted per SM. */
template <int HD_, int WARPS_, int MT_, int BC_, int MIN_BLOCKS_> struct tf_flash_fwd_cfg {
  static constexpr int HD = HD_, WARPS = WARPS_, MT = MT_, BC = BC_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int BR = WARPS * 16 * MT, THREADS = WARPS * 32, LD = HD + 8;
  static constexpr int SMEM = (BR + 4 * BC) * LD * 2; /* Q, then K and V twice */
  static_assert(HD % 16 == 0 && BC % 16 == 0, "tiles are whole mma tiles");
};

template <int DT, class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) tf_flash_fwd_tc_kernel(const tf_cuda_flash_params p) {
  constexpr int HD = C::HD, MT = C::MT, BC = C::BC, BR = C::BR, LD = C::LD, NT = BC / 8, DT8 = HD / 8;
  uint16_t *sQ =
      reinterpret_cast<uint16_t *>(tf::dynamic_smem<unsigned char>());
  uint16_t *sK = sQ + BR * LD, *sV = sK + 2 * BC * LD;
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  int64_t b, q0;
  int n_tiles;
  const tf_flash_problem pr = tf_flash_query_problem_of<BR, BC>(p, &b, &q0, &n_tiles);
  const int hd = p.head_dim;
  const uint16_t *Q = pr.q, *K = pr.k, *V = pr.v;

  tf_flash_load_rows<BR, HD, LD, C::THREADS>(sQ, Q, q0, p.seq_q, hd);
  if (n_tiles > 0) {
    tf_flash_load_rows<BC, HD, LD, C::THREADS>(sK, K, 0, p.seq_k, hd);
    tf_flash_load_rows<BC, HD, LD, C::THREADS>(sV, V, 0, p.seq_k, hd);
  }
  tf::cp_async_commit();

  const int wrow = warp * 16 * MT; /* the warp's first row in the block */
  const int64_t wq0 = q0 + wrow;
  /* ldmatrix row addresses: Q as A operands, K as B operands, V as transposed B operands */
  const uint32_t q_addr = tf_flash_a_addr<LD>(sQ, wrow, lane), k_addr = tf_flash_b_addr<LD>(sK, lane);
  const uint32_t v_addr = tf_flash_a_addr<LD>(sV, 0, lane);
  const float sl2 = p.fwd_scale_log2;

  float o[MT][DT8][4];
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int dt = 0; dt < DT8; dt++) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  /* scale < 0: the running max is of -q.k; q's signs are flipped once, in shared memory */
  if (p.q_sign) {
    tf::cp_async_wait<0>();
    __syncthreads();
    uint32_t *words = reinterpret_cast<uint32_t *>(sQ);
    for (int i = (int)threadIdx.x; i < BR * LD / 2; i += C::THREADS) words[i] ^= p.q_sign;
  }

  /* One key block; MASK: the block crosses the causal diagonal of some row
   * of the block, or the end of the keys (the blocks before never do, and
   * their loop has no mask code at all). */
  auto key_block = [&](int j, auto mask_tag) {
    constexpr bool MASK = decltype(mask_tag)::value;
    tf_flash_kv_step<BC, HD, LD, C::THREADS>(p, sK, sV, K, V, j + 1, n_tiles, hd);
    const int64_t k0 = (int64_t)j * BC;
    if (MASK && (wq0 >= p.seq_q || (p.causal && k0 > wq0 + 16 * MT - 1))) return; /* nothing this warp sees */
    const uint32_t kst = k_addr + (uint32_t)((j & 1) * BC * LD * 2), vst = v_addr + (uint32_t)((j & 1) * BC * LD * 2);

    /* S = Q K^T */
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < NT; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        tf::ldmatrix_x4(a[mt],
                        q_addr + (uint32_t)((mt * 16 * LD + kk * 16) * 2));
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t kb[4];
        tf::ldmatrix_x4(kb, kst + (uint32_t)((nt * 8 * LD + kk * 16) * 2));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          tf::mma_16816<tf_flash_elem<DT>>(s[mt][nt], a[mt], kb[0], kb[1]);
          tf::mma_16816<tf_flash_elem<DT>>(s[mt][nt + 1], a[mt], kb[2], kb[3]);
        }
      }
    }

    if constexpr (MASK) {
      /* key c of the block is visible to row r of the warp iff c < key_lim
       * and c - r <= wq0 - k0; c - r is a constant plus 2t - g */
      const int t2 = (lane & 3) * 2, g = lane >> 2;
      const int key_lim = (int)(p.seq_k - k0 < BC ? p.seq_k - k0 : BC) - t2;
      const int diag = (p.causal ? (int)(wq0 - k0) : BC) - (t2 - g);
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int c = nt * 8 + (e & 1), r = mt * 16 + (e & 2) * 4; /* less the lane's 2t and g */
            if (c >= key_lim || c - r > diag) s[mt][nt][e] = -INFINITY;
          }
    }

    /* online softmax: rows g and g + 8 of each tile, reduced over the lane quad */
    float alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx * sl2;
        alpha[mt][h] = tf_cuda_exp2(row_max[mt][h] * sl2 - base);
        row_max[mt][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          s[mt][nt][2 * h] = tf_cuda_exp2(fmaf(s[mt][nt][2 * h], sl2, -base));
          s[mt][nt][2 * h + 1] = tf_cuda_exp2(fmaf(s[mt][nt][2 * h + 1], sl2, -base));
          sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
        }
        row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
      }
    /* O is rescaled only when some row's max moved (late blocks rarely move it) */
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) moved |= alpha[mt][0] != 1.f || alpha[mt][1] != 1.f;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT8; dt++) {
          o[mt][dt][0] *= alpha[mt][0];
          o[mt][dt][1] *= alpha[mt][0];
          o[mt][dt][2] *= alpha[mt][1];
          o[mt][dt][3] *= alpha[mt][1];
        }
    }

    /* O += P V, P straight from the S registers */
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) tf_flash_c_to_a<DT>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < DT8; dt += 2) {
        uint32_t vb[4];
        tf::ldmatrix_x4_trans(vb,
                              vst + (uint32_t)((kk * 16 * LD + dt * 8) * 2));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          tf::mma_16816<tf_flash_elem<DT>>(o[mt][dt], a[mt], vb[0], vb[1]);
          tf::mma_16816<tf_flash_elem<DT>>(o[mt][dt + 1], a[mt], vb[2], vb[3]);
        }
      }
    }
  };

  /* key blocks below every row's diagonal and inside the keys first, then the rest with the mask */
  int n_full = (int)(p.seq_k / BC);
  if (p.causal && (q0 + 1) / BC < n_full) n_full = (int)((q0 + 1) / BC);
  if (n_full > n_tiles) n_full = n_tiles;
  for (int j = 0; j < n_full; j++) key_block(j, tf_flash_bool<false>());
  for (int j = n_full; j < n_tiles; j++) key_block(j, tf_flash_bool<true>());

  if (n_tiles == 0) { /* no keys at all: Q's copies must land before its rows are reused */
    tf::cp_async_wait<0>();
    __syncthreads();
  }
  /* O / sum through the warp's own Q rows (no other warp reads them), lse */
  __syncwarp();
  float *lse = p.lse + b * p.seq_q;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int r = wrow + mt * 16 + (lane >> 2) + 8 * h;
#pragma unroll
      for (int dt = 0; dt < DT8; dt++)
        *reinterpret_cast<uint32_t *>(sQ + r * LD + dt * 8 + (lane & 3) * 2) =
            tf::pack2<tf_flash_elem<DT>>(o[mt][dt][2 * h] * inv,
                                         o[mt][dt][2 * h + 1] * inv);
      if ((lane & 3) == 0 && q0 + r < p.seq_q)
        lse[q0 + r] = sum > 0.f ? row_max[mt][h] * (p.fwd_scale_log2 / TF_FLASH_LOG2E) + logf(sum) : -INFINITY;
    }
  __syncwarp();
  tf_flash_store_rows<HD, LD>(tf_flash_o_of<uint16_t>(p, b), sQ + wrow * LD, 16 * MT, wq0, p.seq_q, hd, p.o_ld);
}

/* ---- launch -------------------------------------------------------------------------- */

template <int DT, class C> static tf_status tf_flash_fwd_launch(tf_cuda_state *st, const tf_cuda_flash_params *p) {
  unsigned grid = 0;
  TF_TRY(tf_flash_grid(p->batch, (p->seq_q + C::BR - 1) / C::BR, &grid));
  TF_CUDA_CHECK(cudaFuncSetAttribute(tf_flash_fwd_tc_kernel<DT, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     C::SMEM));
  TF_CUDA_CHECK(cudaFuncSetAttribute(tf_flash_fwd_tc_kernel<DT, C>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     (int)cudaSharedmemCarveoutMaxShared));
  tf_flash_fwd_tc_kernel<DT, C><<<grid, C::THREADS, C::SMEM, st->stream>>>(*p);
  return tf_cuda_launched("flash_attention forward kernel");
}

/* The configurations: 4 warps of 2 row tiles (128 query rows), two blocks
 * an SM (255 registers a thread at most); 128 keys per block up to head dim
 * 64, 64 above (the O accumulator alone then holds 128 f32 a thread). */
template <int DT> static tf_status tf_flash_fwd_dt(tf_cuda_state *st, const tf_cuda_flash_params *p, int hd_pad) {
  switch (hd_pad) {
    case 16: return tf_flash_fwd_launch<DT, tf_flash_fwd_cfg<16, 4, 2, 128, 2>>(st, p);
    case 32: return tf_flash_fwd_launch<DT, tf_flash_fwd_cfg<32, 4, 2, 128, 2>>(st, p);
    case 64: return tf_flash_fwd_launch<DT, tf_flash_fwd_cfg<64, 4, 2, 128, 2>>(st, p);
    case 96: return tf_flash_fwd_launch<DT, tf_flash_fwd_cfg<96, 4, 2, 64, 2>>(st, p);
    case 128: return tf_flash_fwd_launch<DT, tf_flash_fwd_cfg<128, 4, 2, 64, 2>>(st, p);
    default: return tf_fail(TF_ERR_ARG, "flash_attention: no tensor-core kernel for head dim %d", hd_pad);
  }
}

#ifdef TF_WITH_SM90A
/* Whether st's device runs the sm_90a (wgmma) kernels: compute capability
 * 9.0, unless TF_FLASH_WGMMA=0 asks for the mma.sync kernels (read on every
 * call, so a test can run both). */
bool tf_flash_wgmma_here(const tf_cuda_state *st) {
  return st->cc == 90 && !tf_env_is("TF_FLASH_WGMMA", "0");
}
#endif

tf_status tf_cuda_flash_forward_tc(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_pad) {
#ifdef TF_WITH_SM90A
  const int hd_w = tf_flash_wgmma_dim(p->head_dim);
  if (hd_w > 0 && tf_flash_wgmma_here(st)) return tf_cuda_flash_forward_ws(st, p, dt, hd_w);
#endif
  return dt == TF_BF16 ? tf_flash_fwd_dt<TF_BF16>(st, p, hd_pad) : tf_flash_fwd_dt<TF_F16>(st, p, hd_pad);
}
