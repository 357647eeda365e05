/* The naive attention's own kernels on the GPU (the GEMMs are gemm.cu's,
 * the causal softmax softmax.cu's), twins of cpu_rope.c's:
 *   rope_heads: the fused q/k/v projection (B, T, 3, H, hd) into heads
 *     (B, H, T, hd) with RoPE on q and k from the plan's cos/sin table (one
 *     thread per pair); backward moves the gradients back, rotated by -angle;
 *   heads: (B, H, T, hd) <-> (B, T, H hd), rows of hd moved in the widest
 *     word the row size and alignment allow. */
#include "cuda_common.cuh"

#include "opmath.h"
#include "nn_common.cuh"

/* ---- rope_heads --------------------------------------------------------------------- */

typedef struct tf_cuda_rope_heads_params {
  const float *cos, *sin;
  void *qkv, *q, *k, *v;
  int64_t batch, seq, heads, head_dim;
  bool backward;
} tf_cuda_rope_heads_params;

/* One thread per pair (b, t, q|k|v, head, i), read and written in layout order. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_rope_heads_kernel(tf_cuda_rope_heads_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  const int64_t H = p.heads, hd = p.head_dim, half = hd / 2, d = H * hd, T = p.seq;
  const int64_t total = p.batch * T * 3 * H * half;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, rest = i / half, h = rest % H, rest2 = rest / H;
    const int part = (int)(rest2 % 3);
    const int64_t bt = rest2 / 3, t = bt % T, b = bt / T;
    const int64_t row = bt * 3 * d + part * d + h * hd + 2 * k, hrow = ((b * H + h) * T + t) * hd + 2 * k;
    S *heads = (S *)(part == 0 ? p.q : part == 1 ? p.k : p.v);
    S *qkv = (S *)p.qkv;
    const float c = part < 2 ? p.cos[t * half + k] : 1.0f, s = part < 2 ? p.sin[t * half + k] : 0.0f;
    if (!p.backward) {
      const float x0 = D::load(qkv[row]), x1 = D::load(qkv[row + 1]);
      heads[hrow] = D::store(x0 * c - x1 * s);
      heads[hrow + 1] = D::store(x0 * s + x1 * c);
    } else {
      const float g0 = D::load(heads[hrow]), g1 = D::load(heads[hrow + 1]);
      qkv[row] = D::store(g0 * c + g1 * s);
      qkv[row + 1] = D::store(g1 * c - g0 * s);
    }
  }
}

/* Arguments by value; one grid-stride kernel. */
template <int DT> static tf_status tf_cuda_rope_heads_typed(tf_cuda_state *st, const tf_rope_heads_args *a) {
  tf_cuda_rope_heads_params p;
  p.cos = a->cos;
  p.sin = a->sin;
  p.qkv = a->qkv;
  p.q = a->q;
  p.k = a->k;
  p.v = a->v;
  p.batch = a->batch;
  p.seq = a->seq;
  p.heads = a->heads;
  p.head_dim = a->head_dim;
  p.backward = a->backward;
  const int64_t total = a->batch * a->seq * 3 * a->heads * (a->head_dim / 2);
  if (total == 0) return TF_OK;
  tf_cuda_rope_heads_kernel<DT><<<tf_cuda_blocks(st, total), TF_CUDA_THREADS, 0, st->stream>>>(p);
  return tf_cuda_launched("rope_heads kernel");
}

/* The backend entry: one kernel per compute dtype. */
tf_status tf_cuda_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_rope_heads_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_rope_heads_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_rope_heads_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "rope_heads: the engine computes in f32, f16 or bf16, not %s", tf_dtype_name(a->dtype));
}

/* ---- heads ---------------------------------------------------------------------------------- */

/* Word w of every row of hd elements: rows are (b, h, t) in heads layout
 * and (b, t, h) in merged layout. */
template <typename W>
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_heads_kernel(const W *src, W *dst, int64_t batch, int64_t seq, int64_t heads, int64_t words, bool split) {
  const int64_t total = batch * seq * heads * words;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t w = i % words, r = i / words;
    /* r enumerates the destination's rows */
    int64_t b, t, h;
    if (split) { /* dst (b, h, t) */
      t = r % seq, h = (r / seq) % heads, b = r / (seq * heads);
    } else { /* dst (b, t, h) */
      h = r % heads, t = (r / heads) % seq, b = r / (heads * seq);
    }
    const int64_t merged = (b * seq + t) * heads + h, split_row = (b * heads + h) * seq + t;
    dst[i] = src[(split ? merged : split_row) * words + w];
  }
}

/* The kernel for word type W (row bytes divisible by its size). */
template <typename W> static tf_status tf_cuda_heads_launch(tf_cuda_state *st, const tf_heads_args *a, size_t row) {
  const int64_t words = (int64_t)(row / sizeof(W)), total = a->batch * a->seq * a->heads * words;
  if (total == 0) return TF_OK;
  tf_cuda_heads_kernel<W><<<tf_cuda_blocks(st, total), TF_CUDA_THREADS, 0, st->stream>>>(
      (const W *)a->src, (W *)a->dst, a->batch, a->seq, a->heads, words, a->split);
  return tf_cuda_launched("heads kernel");
}

/* The widest word that divides a row and both pointers' alignment. */
tf_status tf_cuda_heads(tf_device_ctx *ctx, const tf_heads_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  const size_t row = (size_t)a->head_dim * tf_dtype_size(a->dtype);
  const uintptr_t align = (uintptr_t)a->src | (uintptr_t)a->dst | (uintptr_t)row;
  if (align % 16 == 0) return tf_cuda_heads_launch<uint4>(st, a, row);
  if (align % 8 == 0) return tf_cuda_heads_launch<uint2>(st, a, row);
  if (align % 4 == 0) return tf_cuda_heads_launch<uint32_t>(st, a, row);
  return tf_cuda_heads_launch<uint16_t>(st, a, row);
}
