/* The one-row product of the decode step at batch 1 (gemm.cu's tf_cuda_gemm
 * launches it), in a header of its own so that tests/gpu/decode_gemv_study.cu
 * times this kernel and not a copy. */
#ifndef TF_CUDA_GEMV_CUH
#define TF_CUDA_GEMV_CUH

#include "cuda_common.cuh"
#include "model_kernels.h"
#include "rope.h"

/* c (1, n) = a (1, k) B^T with B (n, k) row-major: a block of eight warps
 * takes 8 / SPLIT output columns, SPLIT warps a column, each warp a
 * stretch of whole rounds of the row (a round: 32 16-byte words, one a
 * lane). A warp asks for all the words of its stretch (TF_GEMV_ROUNDS at
 * most at once: 16 measured slower than 8) before it uses any, so each warp waits about one memory
 * latency and the blocks are short and many: a column a warp, its row in
 * order (the kernel before this one), left the last blocks of a product of
 * few columns and long rows (the 2.7B model's w2: 320 blocks of 20 KB
 * rows on 132 multiprocessors) running alone for a fifth of its time. The
 * weights are no kernel's output, so a chained launch loads its first
 * words before it waits for a. The warps' sums of a column add in shared
 * memory in a fixed order: the same bits on every run. Only one row comes
 * here: from two rows on, cuBLASLt's tensor-core kernels are faster (the
 * 2.7B decode step on an H200: 4.0 against 6.0 ms at batch 4, 4.9 against
 * 15.8 at 16, where f32 FMAs a weight become the bound). */
enum { TF_GEMV_WARPS = 8, TF_GEMV_ROUNDS = 8 };

/* What the one-row kernel does with its sums: store them (TF_GEMV_STORE),
 * or, from their rounded values, SwiGLU's gate (TF_GEMV_GATE: the block's
 * first half of columns a, its second half the b of the same gate columns,
 * f apart) or the KV cache's append of one token (TF_GEMV_APPEND: adjacent
 * columns are RoPE's pairs), as kernels/cuda/swiglu.cu's and decode.cu's
 * kernels compute them. */
enum { TF_GEMV_STORE, TF_GEMV_GATE, TF_GEMV_APPEND };
typedef struct tf_gemv_then {
  void *gate;  /* TF_GEMV_GATE: (f,) */
  int64_t f;
  tf_kv_append_args kv; /* TF_GEMV_APPEND: batch and seq 1 */
} tf_gemv_then;

template <int DT, int SPLIT, int THEN>
__global__ void __launch_bounds__(32 * TF_GEMV_WARPS) tf_cuda_gemv_kernel(const uint16_t *__restrict__ a,
                                                                          const uint16_t *__restrict__ b,
                                                                          uint16_t *__restrict__ c, int n, int k,
                                                                          int64_t ldb, tf_gemv_then then) {
  typedef tf_cuda_dtype<DT> D;
  enum { COLS = TF_GEMV_WARPS / SPLIT, HALF = COLS > 1 ? COLS / 2 : 1 };
  __shared__ float sums[TF_GEMV_WARPS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % SPLIT, slot = warp / SPLIT;
  /* the gate's blocks: HALF gate columns from g0, their a then their b (f further) */
  const int64_t g0 = (int64_t)blockIdx.x * HALF, gc = g0 + slot % HALF;
  int col = blockIdx.x * COLS + slot;
  if (THEN == TF_GEMV_GATE) col = gc < then.f ? (int)(gc + (slot < HALF ? 0 : then.f)) : n;
  const int words = k / 8, rounds = (words + 31) / 32, per = (rounds + SPLIT - 1) / SPLIT;
  const int r0 = part * per, r1 = r0 + per < rounds ? r0 + per : rounds;
  const uint4 *w = (const uint4 *)(b + (int64_t)(col < n ? col : 0) * ldb);
  union word8 {
    uint4 word;
    uint16_t v[8];
  };
  enum { ROUNDS = TF_GEMV_ROUNDS };
  word8 wv[ROUNDS];
  auto fetch = [&](int r) {
#pragma unroll
    for (int u = 0; u < ROUNDS; u++) {
      const int at = (r + u) * 32 + lane;
      if (col < n && r + u < r1 && at < words) wv[u].word = __ldcs(w + at);
    }
  };
  fetch(r0);
  tf_chain_next();
  tf_chain_wait();
  float acc = 0.0f;
  for (int r = r0; r < r1; r += ROUNDS) {
    if (r != r0) fetch(r);
#pragma unroll
    for (int u = 0; u < ROUNDS; u++) {
      const int at = (r + u) * 32 + lane;
      if (col >= n || r + u >= r1 || at >= words) continue;
      word8 xv;
      xv.word = *((const uint4 *)a + at);
#pragma unroll
      for (int j = 0; j < 8; j++) acc += D::load(xv.v[j]) * D::load(wv[u].v[j]);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (SPLIT == 1 && THEN == TF_GEMV_STORE) {
    if (lane == 0 && col < n) c[col] = D::store(acc);
    return;
  }
  if (lane == 0) sums[warp] = acc;
  __syncthreads();
  /* slot j's column: its warps' sums in order, rounded as a stored value is */
  auto sum_of = [&](int j) {
    float v = sums[j * SPLIT];
#pragma unroll
    for (int p = 1; p < SPLIT; p++) v += sums[j * SPLIT + p];
    return v;
  };
  if (THEN == TF_GEMV_STORE) {
    if (part == 0 && lane == 0 && col < n) c[col] = D::store(sum_of(slot));
    return;
  }
  const int j = threadIdx.x;
  if (COLS < 2 || j >= HALF) return;
  const float x0 = D::load(D::store(sum_of(THEN == TF_GEMV_GATE ? j : 2 * j)));
  const float x1 = D::load(D::store(sum_of(THEN == TF_GEMV_GATE ? j + HALF : 2 * j + 1)));
  if (THEN == TF_GEMV_GATE) {
    if (g0 + j >= then.f) return;
    const float sg = __fdividef(1.0f, 1.0f + __expf(-x0)); /* swiglu.cu's forward */
    ((uint16_t *)then.gate)[g0 + j] = D::store(x0 * sg * x1);
    return;
  }
  const int64_t c0 = (int64_t)blockIdx.x * COLS + 2 * j;
  if (c0 >= n) return;
  const tf_kv_append_args &kv = then.kv;
  const int64_t hd = kv.head_dim, half = hd / 2, d = kv.heads * hd, pos = *kv.pos;
  const int64_t which = c0 / d, h = (c0 % d) / hd, i = c0 % hd; /* decode.cu's kv_append at batch and seq 1 */
  uint16_t *dst = (uint16_t *)(which == 0 ? kv.q : which == 1 ? kv.k_cache : kv.v_cache);
  if (!dst || pos >= kv.max_len) return;
  const int64_t at = which == 0 ? h * hd + i : (h * kv.max_len + pos) * hd + i;
  const float cs = which < 2 ? kv.cos[pos * half + i / 2] : 1.0f, sn = which < 2 ? kv.sin[pos * half + i / 2] : 0.0f;
  float y0, y1;
  tf_rope_turn<float>(x0, x1, cs, sn, &y0, &y1);
  dst[at] = D::store(y0);
  dst[at + 1] = D::store(y1);
}

/* The fewest warps a column (1, 2, 4 or 8) whose stretches are TF_GEMV_ROUNDS rounds or fewer (8 for
 * longer rows, whose warps then take their stretch in turns). */
static inline int tf_gemv_split(int64_t k) {
  const int64_t rounds = (k / 8 + 31) / 32;
  int split = 1;
  while (split < TF_GEMV_WARPS && (rounds + split - 1) / split > TF_GEMV_ROUNDS) split *= 2;
  return split;
}

typedef void (*tf_gemv_kernel_fn)(const uint16_t *, const uint16_t *, uint16_t *, int, int, int64_t, tf_gemv_then);

/* The kernel of split warps a column (an ending needs two columns a block: split 8 is never asked
 * for one, which takes 4). */
template <int DT, int THEN> static inline tf_gemv_kernel_fn tf_gemv_kernel_of(int split) {
  return split == 1 ? tf_cuda_gemv_kernel<DT, 1, THEN>
         : split == 2 ? tf_cuda_gemv_kernel<DT, 2, THEN>
         : split == 4 || THEN != TF_GEMV_STORE ? tf_cuda_gemv_kernel<DT, 4, THEN>
                                               : tf_cuda_gemv_kernel<DT, 8, THEN>;
}

#endif
