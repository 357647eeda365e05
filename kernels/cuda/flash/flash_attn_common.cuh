/* What the FlashAttention-2 files share (flash_attn.cu: the entry, the
 * small kernels and the SIMT path; flash_attn_fwd.cu and flash_attn_bwd.cu:
 * the tensor-core kernels): the kernels' parameters, the tile loads and
 * stores built on the PTX wrappers of rtc/tfhost.cuh (the header of the
 * kernels scripts compile: one copy serves both), and the launchers'
 * declarations.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 for 16-bit A/B): with lane =
 * 4 g + t, an A fragment (16 x 16, row-major) holds rows g and g + 8, columns
 * 2t, 2t + 1 and 2t + 8, 2t + 9; a B fragment (16 x 8) holds rows (k) 2t,
 * 2t + 1 and 2t + 8, 2t + 9 of column (n) g; a C fragment (16 x 8, f32) holds
 * rows g and g + 8, columns 2t and 2t + 1. A C fragment pair therefore packs
 * into the A fragment of the next product without leaving registers, which
 * is how P (and dS) feed P V (dS K, P^T dO, dS^T Q). */
#ifndef TF_FLASH_ATTN_COMMON_CUH
#define TF_FLASH_ATTN_COMMON_CUH

#include "cuda_common.cuh"

#include <string.h>

#include "rtc/tfhost.cuh"

/* The element type of tfhost.cuh's templates for a 16-bit dtype. */
template <int DT> struct tf_flash_elem_of;
template <> struct tf_flash_elem_of<TF_BF16> { typedef __nv_bfloat16 type; };
template <> struct tf_flash_elem_of<TF_F16> { typedef __half type; };
template <int DT> using tf_flash_elem = typename tf_flash_elem_of<DT>::type;

/* Everything a flash kernel reads, by value. Element pointers are of the
 * problem dtype; lse, rowdot (D) and dq_acc are f32. */
typedef struct tf_cuda_flash_params {
  const void *q, *k, *v, *dout;
  void *o;            /* forward: written; backward: read */
  float *lse;         /* forward: written; backward: read */
  void *dq, *dk, *dv; /* backward */
  float *rowdot;      /* backward: D = rowsum(dout * o), (batch, seq_q) */
  float *dq_acc;      /* backward with atomics: dQ / scale, (batch, seq_q, head_dim) */
  int dq_acc_swizzled; /* dq_acc's columns are where tf_flash_dq_col puts them (the warp-specialised kernel) */
  int64_t batch, seq_q, seq_k;
  int head_dim;
  int causal;
  float scale;        /* as given (any sign) */
  float scale_log2;   /* scale * log2(e): P = exp2(s scale_log2 - lse log2(e)) */
  int64_t o_ld;       /* O's (and in the backward pass dout's) row stride (elements) ... */
  int64_t o_group;    /* ... and the problems side by side in a row (tf_flash_o_layout) */
  float fwd_scale_log2; /* |scale| log2(e): the forward pass's running max is of q.k times sign(scale) */
  uint32_t q_sign;    /* 0x80008000 when scale < 0: the forward pass flips the signs of its copy of q */
} tf_cuda_flash_params;

#define TF_FLASH_LOG2E ((float)TF_CUDA_LOG2E)

/* A compile-time flag for generic lambdas (key blocks with or without the mask). */
template <bool V> struct tf_flash_bool {
  static constexpr bool value = V;
};

/* A compile-time int for generic lambdas (a product's width). */
template <int V> struct tf_flash_int {
  static constexpr int value = V;
};

/* A C fragment pair (columns 16 kk .. 16 kk + 15 of a 16-row tile) as the A
 * fragment of a product whose k runs along those columns. */
template <int DT>
__device__ __forceinline__ void tf_flash_c_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = tf::pack2<tf_flash_elem<DT>>(lo[0], lo[1]);
  a[1] = tf::pack2<tf_flash_elem<DT>>(lo[2], lo[3]);
  a[2] = tf::pack2<tf_flash_elem<DT>>(hi[0], hi[1]);
  a[3] = tf::pack2<tf_flash_elem<DT>>(hi[2], hi[3]);
}

/* A lane's ldmatrix row address in a 16 x 16 tile at row row0 of a shared
 * tile of LD-element rows: A operands and transposed B operands take
 * (lane % 16, 8 (lane / 16)); plain B operands (8 (lane / 16) + lane % 8,
 * 8 ((lane / 8) % 2)). */
template <int LD> __device__ __forceinline__ uint32_t tf_flash_a_addr(const uint16_t *tile, int row0, int lane) {
  return tf::smem_addr(tile + (row0 + (lane & 15)) * LD + (lane >> 4) * 8);
}

template <int LD> __device__ __forceinline__ uint32_t tf_flash_b_addr(const uint16_t *tile, int lane) {
  return tf::smem_addr(tile + ((lane & 7) + ((lane >> 4) << 3)) * LD +
                       ((lane >> 3) & 1) * 8);
}

/* Where the warp-specialised backward kernel (sm90/flash_attn_bwd_ws.cu)
 * keeps column c of a dQ row r (r7 = r mod 8) of hd columns in the f32
 * workspace: its 4-column chunks permuted by XOR with 2 r7 mod 8 inside each
 * whole group of 32 columns, the tail as it is. A row stays a row, so a
 * block's rows are one contiguous range (one bulk reduction), and the
 * kernel's shared-memory tile of that range is written without bank
 * conflicts: a warp's 8-byte stores go in two halves of 16 lanes, 4 rows of
 * 8 columns each, which the XOR puts on 4 different pairs of chunks (XOR
 * with r7 would put rows 2i and 2i + 1 on the same pair: twice the
 * wavefronts). */
__host__ __device__ __forceinline__ int tf_flash_dq_col(int c, int r7, int hd) {
  return c < (hd & ~31) ? c ^ ((r7 << 3) & 28) : c;
}

/* ---- grids ------------------------------------------------------------------------------- */

/* Flash grids are one-dimensional, problem after problem (so that the
 * blocks running together share one problem's K and V rows in L2),
 * `blocks` blocks a problem. This block's problem *b and block *blk,
 * counted from the last when last_first (under the causal mask the last
 * query blocks are the longest: they start first, the short ones fill the
 * tail). */
__device__ __forceinline__ void tf_flash_block_of(int64_t blocks, bool last_first, int64_t *b, int64_t *blk) {
  const int64_t id = blockIdx.x, prob = id / blocks, i = id - prob * blocks;
  *b = prob;
  *blk = last_first ? blocks - 1 - i : i;
}

/* Element 0 of problem b's rows in O's layout (rows p.o_ld elements apart). */
__device__ __forceinline__ int64_t tf_flash_o_offset(const tf_cuda_flash_params &p, int64_t b) {
  return (b / p.o_group) * p.seq_q * p.o_ld + (b % p.o_group) * p.head_dim;
}

/* Row 0 of problem b's O, of S elements (its rows p.o_ld elements apart). */
template <typename S> __device__ __forceinline__ S *tf_flash_o_of(const tf_cuda_flash_params &p, int64_t b) {
  return static_cast<S *>(p.o) + tf_flash_o_offset(p, b);
}

/* Problem b's tensors: q, k, v and dout (16-bit elements; dout null in the
 * forward pass, in O's layout: rows p.o_ld apart), lse and rowdot (null
 * where not given). */
struct tf_flash_problem {
  const uint16_t *q, *k, *v, *dout;
  const float *lse, *rowdot;
};

__device__ __forceinline__ tf_flash_problem tf_flash_problem_of(const tf_cuda_flash_params &p, int64_t b) {
  const int64_t hd = p.head_dim, qs = b * p.seq_q, ks = b * p.seq_k;
  return {static_cast<const uint16_t *>(p.q) + qs * hd, static_cast<const uint16_t *>(p.k) + ks * hd,
          static_cast<const uint16_t *>(p.v) + ks * hd,
          p.dout ? static_cast<const uint16_t *>(p.dout) + tf_flash_o_offset(p, b) : nullptr,
          p.lse ? p.lse + qs : nullptr, p.rowdot ? p.rowdot + qs : nullptr};
}

/* ---- D = rowsum(dO * O), a row at a time ---------------------------------------------- */

/* TF_FLASH_ROWDOT_TPR consecutive lanes sum a row: lane `part` takes the
 * row's 16-byte words part, part + TPR, ... when VEC (head dims of whole
 * words, aligned rows), else its single elements so. It loads its first
 * TF_FLASH_ROWDOT_WORDS words of each operand before adding any (head dims
 * up to 128 in bf16: every word waits on memory together), the rest one by
 * one; the order of the sum is the same either way. The row-sum kernel
 * (flash_attn.cu) and the warp-specialised dQ kernel (sm90/flash_attn_dq_ws.cu)
 * both sum so, and so get the same bits. */
enum { TF_FLASH_ROWDOT_TPR = 4, TF_FLASH_ROWDOT_WORDS = 4 };

/* Lane `part`'s share of D for row `row` of problem b. */
template <int DT, bool VEC>
__device__ __forceinline__ float tf_flash_rowdot_part(const tf_cuda_flash_params &p, int64_t b, int64_t row, int part) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  constexpr int W = VEC ? (int)(16 / sizeof(S)) : 1, TPR = TF_FLASH_ROWDOT_TPR, N = VEC ? TF_FLASH_ROWDOT_WORDS : 0;
  const int hd = p.head_dim;
  const int64_t at = tf_flash_o_offset(p, b) + row * p.o_ld;
  const S *da = static_cast<const S *>(p.dout) + at, *ob = static_cast<const S *>(p.o) + at;
  float acc = 0.f;
  if constexpr (VEC) {
    uint4 wa[N], wb[N];
#pragma unroll
    for (int i = 0; i < N; i++) {
      const int c = (part + i * TPR) * W;
      if (c < hd) wa[i] = *reinterpret_cast<const uint4 *>(da + c), wb[i] = *reinterpret_cast<const uint4 *>(ob + c);
    }
#pragma unroll
    for (int i = 0; i < N; i++) {
      if ((part + i * TPR) * W >= hd) continue;
      S a[W], o[W];
      memcpy(a, &wa[i], 16);
      memcpy(o, &wb[i], 16);
#pragma unroll
      for (int u = 0; u < W; u++) acc = fmaf(D::load(a[u]), D::load(o[u]), acc);
    }
  }
  for (int c = (part + N * TPR) * W; c < hd; c += TPR * W) {
    S a[W], o[W];
    if constexpr (VEC) {
      const uint4 wa = *reinterpret_cast<const uint4 *>(da + c);
      const uint4 wb = *reinterpret_cast<const uint4 *>(ob + c);
      memcpy(a, &wa, 16);
      memcpy(o, &wb, 16);
    } else {
      a[0] = da[c];
      o[0] = ob[c];
    }
#pragma unroll
    for (int u = 0; u < W; u++) acc = fmaf(D::load(a[u]), D::load(o[u]), acc);
  }
  return acc;
}

/* The row's D from its lanes' shares (every lane of the warp takes part), in a fixed order. */
__device__ __forceinline__ float tf_flash_rowdot_sum(float acc) {
#pragma unroll
  for (int off = TF_FLASH_ROWDOT_TPR / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

/* What a kernel over query blocks of BR rows starts from: its problem b
 * and first row q0, and the key blocks of BC keys its rows see (under the
 * causal mask none past its last row). */
template <int BR, int BC>
__device__ __forceinline__ void tf_flash_query_block_of(const tf_cuda_flash_params &p, int64_t *b, int64_t *q0,
                                                        int *n_tiles) {
  int64_t qb;
  tf_flash_block_of((p.seq_q + BR - 1) / BR, true, b, &qb);
  *q0 = qb * BR;
  int64_t key_end = p.seq_k;
  if (p.causal && *q0 + BR < key_end) key_end = *q0 + BR;
  *n_tiles = (int)((key_end + BC - 1) / BC);
}

/* The same, with its problem's tensors returned (the mma.sync forward
 * kernel; the dQ kernel reads p.head_dim between the two calls, and its
 * code changes when that read moves). */
template <int BR, int BC>
__device__ __forceinline__ tf_flash_problem tf_flash_query_problem_of(const tf_cuda_flash_params &p, int64_t *b,
                                                                      int64_t *q0, int *n_tiles) {
  tf_flash_query_block_of<BR, BC>(p, b, q0, n_tiles);
  return tf_flash_problem_of(p, *b);
}

/* ... and one over key blocks of BC keys (the backward pass's dK/dV): its
 * problem b and first key k0. */
template <int BC> __device__ __forceinline__ void tf_flash_key_block_of(const tf_cuda_flash_params &p, int64_t *b, int64_t *k0) {
  int64_t kb;
  tf_flash_block_of((p.seq_k + BC - 1) / BC, false, b, &kb);
  *k0 = kb * BC;
}

/* The grid size for batch problems of `blocks` blocks, or an error. */
static inline tf_status tf_flash_grid(int64_t batch, int64_t blocks, unsigned *grid) {
  if (blocks < 1 || batch * blocks > INT32_MAX)
    return tf_fail(TF_ERR_ARG, "flash_attention: %lld problems of %lld blocks are too many for one CUDA grid",
                   (long long)batch, (long long)blocks);
  *grid = (unsigned)(batch * blocks);
  return TF_OK;
}

/* ---- tiles ------------------------------------------------------------------------------- */

/* Rows [row0, row0 + ROWS) of a (nrows, hd) matrix of 16-bit elements
 * (rows ld elements apart; 0: hd) into shared memory rows of LD elements,
 * HD (>= hd) columns, by the block's THREADS threads: 16-byte cp.async per
 * 8 columns, rows past nrows and columns past hd zero-filled (hd is a
 * multiple of 8). Each thread keeps one column chunk and steps down the
 * rows, so its addresses are one base plus constants. Not committed. */
template <int ROWS, int HD, int LD, int THREADS>
__device__ __forceinline__ void tf_flash_load_rows(uint16_t *dst, const uint16_t *src, int64_t row0, int64_t nrows,
                                                   int hd, int64_t ld = 0) {
  const int64_t stride = ld ? ld : hd;
  constexpr int CH = HD / 8, STEP = THREADS / CH; /* STEP rows per pass */
  static_assert(STEP >= 1, "a pass covers at least one row");
  const int r0 = (int)threadIdx.x / CH, ch = (int)threadIdx.x % CH;
  if (THREADS % CH != 0 && r0 >= STEP) return;
  const bool col_ok = ch * 8 < hd;
  const uint16_t *g = src + (row0 + r0) * stride + ch * 8;
  const uint32_t s = tf::smem_addr(dst + r0 * LD + ch * 8);
#pragma unroll
  for (int i = 0; i < (ROWS + STEP - 1) / STEP; i++) {
    if (ROWS % STEP == 0 || r0 + i * STEP < ROWS) {
      const bool ok = col_ok && row0 + r0 + i * STEP < nrows;
      tf::cp_async16(s + (uint32_t)(i * STEP * LD * 2),
                     ok ? g + (int64_t)i * STEP * stride : src, ok);
    }
  }
}

/* The K/V double buffer's step at the top of a key block's iteration:
 * wait until the block has landed and every warp is done with the one
 * before, then start the copy of block `next` (the one after: BC rows
 * into buffer next & 1) where there is one. */
template <int BC, int HD, int LD, int THREADS>
__device__ __forceinline__ void tf_flash_kv_step(const tf_cuda_flash_params &p, uint16_t *sK, uint16_t *sV, const uint16_t *K,
                                                 const uint16_t *V, int next, int n_tiles, int hd) {
  tf::cp_async_wait<0>();
  __syncthreads();
  if (next < n_tiles) {
    const int buf = next & 1;
    tf_flash_load_rows<BC, HD, LD, THREADS>(sK + buf * BC * LD, K, (int64_t)next * BC, p.seq_k, hd);
    tf_flash_load_rows<BC, HD, LD, THREADS>(sV + buf * BC * LD, V, (int64_t)next * BC, p.seq_k, hd);
    tf::cp_async_commit();
  }
}

/* ROWS f32 values of a row statistic (lse, D) from row0, zero past nrows. */
template <int ROWS, int THREADS>
__device__ __forceinline__ void tf_flash_load_stat(float *dst, const float *src, int64_t row0, int64_t nrows) {
#pragma unroll
  for (int i = 0; i < (ROWS + THREADS - 1) / THREADS; i++) {
    const int r = (int)threadIdx.x + i * THREADS;
    if (ROWS % THREADS == 0 || r < ROWS) {
      const bool ok = row0 + r < nrows;
      tf::cp_async4(tf::smem_addr(dst + r), ok ? src + row0 + r : src, ok);
    }
  }
}

/* Copies a warp's `rows` rows of HD columns from shared memory (LD-element
 * rows starting at src) to global rows row0.. of width hd, ld elements
 * apart, 16 bytes a lane, skipping rows past nrows and columns past hd. */
template <int HD, int LD>
__device__ __forceinline__ void tf_flash_store_rows(uint16_t *dst, const uint16_t *src, int rows, int64_t row0,
                                                    int64_t nrows, int hd, int64_t ld) {
  constexpr int CH = HD / 8;
  const int lane = (int)threadIdx.x & 31;
  for (int c = lane; c < rows * CH; c += 32) {
    const int r = c / CH, ch = c % CH;
    if (row0 + r < nrows && ch * 8 < hd)
      *reinterpret_cast<uint4 *>(dst + (row0 + r) * ld + ch * 8) = *reinterpret_cast<const uint4 *>(src + r * LD + ch * 8);
  }
}

/* ---- the tensor-core launchers (f16/bf16, head dims padded to 16, 32, 64, 96 or 128) ---- */

/* The padded head dim the tensor-core kernels use for hd (a multiple of 8
 * up to 128), or 0 when they cannot take it. */
static inline int tf_flash_tc_dim(int64_t hd) {
  if (hd < 8 || hd > 128 || hd % 8 != 0) return 0;
  return hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 96 ? 96 : 128;
}

/* The head dim the Hopper (wgmma) kernels use for hd: 64, 80, 96 or 128
 * (hd rounded up to one of them), or 0 for head dims they do not take
 * (those the tensor-core kernels pad to 16 or 32, and the others). */
static inline int tf_flash_wgmma_dim(int64_t hd) {
  if (tf_flash_tc_dim(hd) < 64) return 0;
  return hd <= 64 ? 64 : hd <= 80 ? 80 : hd <= 96 ? 96 : 128;
}

/* flash_attn_fwd.cu: O and lse. */
tf_status tf_cuda_flash_forward_tc(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_pad);
/* The Hopper kernels (sm90/, built for sm_90a where TF_WITH_SM90A), at
 * head dim hd_w = tf_flash_wgmma_dim(head_dim), warp-specialised (TMA
 * loads, the consumers' products beside their softmax or exponentials):
 * sm90/flash_attn_fwd_ws.cu: O and lse. */
tf_status tf_cuda_flash_forward_ws(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w);
/* sm90/flash_attn_bwd_ws.cu: dK, dV, and dQ into dq_acc (swizzled, by bulk
 * reductions) when atomic_dq. */
tf_status tf_cuda_flash_backward_ws(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w,
                                    bool atomic_dq);
/* sm90/flash_attn_dq_ws.cu: the deterministic dQ; seq_k > 0. It sums D
 * itself (tf_flash_rowdot_part) and writes it to rowdot. */
tf_status tf_cuda_flash_dq_ws(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_w);
/* flash_attn_fwd.cu: whether st's device takes those (compute capability
 * 9.0, and TF_FLASH_WGMMA is not 0; read on every call). */
bool tf_flash_wgmma_here(const tf_cuda_state *st);
/* flash_attn_bwd.cu: whether head dim hd takes them on st's device: the
 * device's and the head dim's (tf_flash_wgmma_dim). */
bool tf_flash_bwd_ws_on(const tf_cuda_state *st, int64_t hd);
/* flash_attn_bwd.cu: dK and dV, and dQ into dq_acc with float atomics when
 * atomic_dq (else dq is computed with no atomics: before, by
 * tf_cuda_flash_dq_ws, which also sums D, where the warp-specialised
 * kernels run; after, by tf_cuda_flash_dq_tc, the mma.sync dQ kernel,
 * elsewhere and where there are no keys). */
tf_status tf_cuda_flash_backward_tc(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_pad,
                                    bool atomic_dq);
tf_status tf_cuda_flash_dq_tc(tf_cuda_state *st, const tf_cuda_flash_params *p, tf_dtype dt, int hd_pad);

#endif
