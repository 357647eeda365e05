/* Generation's kernels on the GPU, the twins of kernels/cpu/decode.c.
 *
 * kv_append: one thread per pair (row, token, q|k|v, head, i), the
 * position read from device memory (so a captured decode step serves every
 * position), k and q turned by rope_heads' rule (rope.h) from the cache's
 * tables, k and v stored into the caches.
 *
 * decode_attention: one query a (row, head) over the cached keys
 * 0 .. *pos, a block per (stretch, row and head): the keys are cut into
 * `splits` fixed stretches so that at batch 1 the GPU is filled (a few
 * heads alone would leave most multiprocessors idle). The block's four
 * warps take every fourth key (or group of eight keys: keys_at_once) of
 * the stretch, each lane eight elements of the head at most (head_dim <=
 * 256): the dot product is a warp sum, the softmax online (running max,
 * sum, weighted values) in f32; the warps' results merge in shared memory
 * into the stretch's partial result, and the stretches merge in order
 * into the output row: in the block of the stretch that ends last (done's
 * counters), or else in a second kernel. */
#include "cuda_common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rope.h"

/* ---- kv_append ---------------------------------------------------------------------- */

template <int DT> __global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_kv_append_kernel(tf_kv_append_args a) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  tf_chain_next();
  tf_chain_wait();
  const int64_t H = a.heads, hd = a.head_dim, half = hd / 2, d = H * hd, T = a.seq, pos0 = *a.pos;
  const int64_t total = a.batch * T * 3 * H * half;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, rest = i / half, h = rest % H, rest2 = rest / H;
    const int part = (int)(rest2 % 3);
    const int64_t bt = rest2 / 3, t = bt % T, b = bt / T, pos = pos0 + t;
    S *dst = (S *)(part == 0 ? a.q : part == 1 ? a.k_cache : a.v_cache);
    if (!dst || pos >= a.max_len) continue;
    const S *qkv = (const S *)a.qkv;
    const int64_t row = bt * 3 * d + part * d + h * hd + 2 * k;
    const int64_t at = part == 0 ? ((b * H + h) * T + t) * hd + 2 * k : ((b * H + h) * a.max_len + pos) * hd + 2 * k;
    const float c = part < 2 ? a.cos[pos * half + k] : 1.0f, s = part < 2 ? a.sin[pos * half + k] : 0.0f;
    float y0, y1;
    tf_rope_turn<float>(D::load(qkv[row]), D::load(qkv[row + 1]), c, s, &y0, &y1);
    dst[at] = D::store(y0);
    dst[at + 1] = D::store(y1);
  }
}

template <int DT> static tf_status tf_cuda_kv_append_typed(tf_cuda_state *st, const tf_kv_append_args *a) {
  const int64_t total = a->batch * a->seq * 3 * a->heads * (a->head_dim / 2);
  if (total == 0) return TF_OK;
  tf_cuda_traffic("tf_cuda_kv_append_kernel",
                  (double)total * 2 * 2 * (double)sizeof(typename tf_cuda_dtype<DT>::storage));
  return tf_cuda_launch(st, a->chained, "kv_append kernel", tf_cuda_blocks(st, total), TF_CUDA_THREADS,
                        tf_cuda_kv_append_kernel<DT>, *a);
}

tf_status tf_cuda_kv_append(tf_device_ctx *ctx, const tf_kv_append_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_kv_append_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_kv_append_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_kv_append_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "kv_append: the engine computes in f32, f16 or bf16, not %s", tf_dtype_name(a->dtype));
}

/* ---- decode_attention ------------------------------------------------------------------ */

enum { TF_DECODE_WARPS = 4, TF_DECODE_PER_LANE = 8, TF_DECODE_MAX_HD = 32 * TF_DECODE_PER_LANE };

/* The stretches of row-and-head bh merged in order (decode.c's
 * tf_cpu_decode_merge) by the block's threads; partial read through L2
 * (other blocks wrote it). */
template <int DT> __device__ void tf_cuda_decode_merge(const tf_decode_attention_args &a, int64_t bh) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  const int64_t hd = a.head_dim;
  const float *part = a.partial + bh * a.splits * (hd + 2);
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t s = 0; s < a.splits; s++) mx = fmaxf(mx, __ldcg(part + s * (hd + 2)));
  for (int64_t s = 0; s < a.splits; s++)
    if (__ldcg(part + s * (hd + 2) + 1) > 0.0f) sum += expf(__ldcg(part + s * (hd + 2)) - mx) * __ldcg(part + s * (hd + 2) + 1);
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < a.splits; s++)
      if (__ldcg(part + s * (hd + 2) + 1) > 0.0f)
        acc += expf(__ldcg(part + s * (hd + 2)) - mx) * __ldcg(part + s * (hd + 2) + 2 + i);
    ((S *)a.out)[bh * hd + i] = D::store(acc / sum);
  }
}

/* Block (s, bh): stretch s of row-and-head bh into its partial result
 * (max, sum, weighted values). Each warp takes G keys at a time (every
 * G * warps-th group of the stretch): with G = 1 a key's score, then its
 * softmax update, one key after the other; with G = 8 the eight keys'
 * loads and dot products are in flight together and the running values
 * are rescaled once a group (a batch-1 decode step is bound by these
 * kernels' latency, not their bytes). */
template <int DT, int G>
__global__ void __launch_bounds__(32 * TF_DECODE_WARPS) tf_cuda_decode_stretch_kernel(tf_decode_attention_args a) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  __shared__ float sm_max[TF_DECODE_WARPS], sm_sum[TF_DECODE_WARPS];
  __shared__ float sm_acc[TF_DECODE_WARPS][TF_DECODE_MAX_HD];
  tf_chain_next();
  tf_chain_wait();
  const int64_t hd = a.head_dim, s = blockIdx.x, bh = blockIdx.y, len = *a.pos + 1;
  const int64_t chunk = (a.max_len + a.splits - 1) / a.splits, lo = s * chunk;
  const int64_t hi = lo + chunk < len ? lo + chunk : len;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const S *q = (const S *)a.q + bh * hd;
  const S *kc = (const S *)a.k_cache + bh * a.max_len * hd, *vc = (const S *)a.v_cache + bh * a.max_len * hd;
  float qr[TF_DECODE_PER_LANE], acc[TF_DECODE_PER_LANE];
#pragma unroll
  for (int e = 0; e < TF_DECODE_PER_LANE; e++) {
    const int64_t i = lane + 32 * e;
    qr[e] = i < hd ? D::load(q[i]) : 0.0f;
    acc[e] = 0.0f;
  }
  const float scale = (float)a.scale;
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t base = lo + (int64_t)warp * G; base < hi; base += (int64_t)G * TF_DECODE_WARPS) {
    float score[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
      const int64_t j = base + g;
      float dot = 0.0f;
      if (j < hi) {
#pragma unroll
        for (int e = 0; e < TF_DECODE_PER_LANE; e++) {
          const int64_t i = lane + 32 * e;
          if (i < hd) dot += qr[e] * D::load(kc[j * hd + i]);
        }
      }
      score[g] = dot;
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
      for (int o = 16; o > 0; o /= 2) score[g] += __shfl_xor_sync(0xffffffffu, score[g], o);
      score[g] *= scale;
    }
    float next = mx;
#pragma unroll
    for (int g = 0; g < G; g++)
      if (base + g < hi) next = fmaxf(next, score[g]);
    const float old = expf(mx - next);
    sum = sum * old;
#pragma unroll
    for (int e = 0; e < TF_DECODE_PER_LANE; e++) acc[e] = acc[e] * old;
#pragma unroll
    for (int g = 0; g < G; g++) {
      const int64_t j = base + g;
      if (j >= hi) continue;
      const float w = expf(score[g] - next);
      sum += w;
#pragma unroll
      for (int e = 0; e < TF_DECODE_PER_LANE; e++) {
        const int64_t i = lane + 32 * e;
        if (i < hd) acc[e] += w * D::load(vc[j * hd + i]);
      }
    }
    mx = next;
  }
  if (lane == 0) {
    sm_max[warp] = mx;
    sm_sum[warp] = sum;
  }
#pragma unroll
  for (int e = 0; e < TF_DECODE_PER_LANE; e++) {
    const int64_t i = lane + 32 * e;
    if (i < hd) sm_acc[warp][i] = acc[e];
  }
  __syncthreads();
  float bmax = -INFINITY;
  for (int w = 0; w < TF_DECODE_WARPS; w++) bmax = fmaxf(bmax, sm_max[w]);
  float *part = a.partial + (bh * a.splits + s) * (hd + 2);
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < TF_DECODE_WARPS; w++)
      if (sm_sum[w] > 0.0f) v += expf(sm_max[w] - bmax) * sm_acc[w][i];
    part[2 + i] = v;
  }
  if (threadIdx.x == 0) {
    float bsum = 0.0f;
    for (int w = 0; w < TF_DECODE_WARPS; w++)
      if (sm_sum[w] > 0.0f) bsum += expf(sm_max[w] - bmax) * sm_sum[w];
    part[0] = bmax;
    part[1] = bsum;
  }
  if (!a.done) return;
  /* the last stretch of bh to end merges them all (the CUDA samples' threadfence reduction) */
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(a.done + bh, 1u) == (unsigned)a.splits - 1;
    if (last) a.done[bh] = 0; /* every other stretch has counted: the next call starts from zero */
  }
  __syncthreads();
  if (last) tf_cuda_decode_merge<DT>(a, bh);
}

/* Block bh: the stretches merged (without done's counters). */
template <int DT> __global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_decode_merge_kernel(tf_decode_attention_args a) {
  tf_chain_next();
  tf_chain_wait();
  tf_cuda_decode_merge<DT>(a, blockIdx.x);
}

template <int DT> static tf_status tf_cuda_decode_attention_typed(tf_cuda_state *st, const tf_decode_attention_args *a) {
  const int64_t rows = a->batch * a->heads;
  if (rows == 0) return TF_OK;
  const dim3 grid((unsigned)a->splits, (unsigned)rows);
  /* keys_at_once 0: the environment's TF_DECODE_KEYS (1, or else 8: the 2.7B batch-1 step on an H200,
   * 3.29 against 3.43 ms) */
  static const bool one = getenv("TF_DECODE_KEYS") && strcmp(getenv("TF_DECODE_KEYS"), "1") == 0;
  const bool g8 = a->keys_at_once == 8 || (a->keys_at_once == 0 && !one);
  TF_TRY(tf_cuda_launch(st, a->chained, "decode attention kernel", grid, 32 * TF_DECODE_WARPS,
                        g8 ? tf_cuda_decode_stretch_kernel<DT, 8> : tf_cuda_decode_stretch_kernel<DT, 1>, *a));
  if (a->done) return TF_OK;
  return tf_cuda_launch(st, a->chained, "decode attention merge kernel", (unsigned)rows, 128,
                        tf_cuda_decode_merge_kernel<DT>, *a);
}

tf_status tf_cuda_decode_attention(tf_device_ctx *ctx, const tf_decode_attention_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  if (a->head_dim > TF_DECODE_MAX_HD)
    return tf_fail(TF_ERR_ARG, "decode_attention: head_dim %lld is above the kernel's %d", (long long)a->head_dim,
                   TF_DECODE_MAX_HD);
  if (a->keys_at_once != 0 && a->keys_at_once != 1 && a->keys_at_once != 8)
    return tf_fail(TF_ERR_ARG, "decode_attention: keys_at_once is 1 or 8, not %d", a->keys_at_once);
  if (a->splits < 1 || a->splits > 65535 || a->batch * a->heads > 65535)
    return tf_fail(TF_ERR_ARG, "decode_attention: %lld stretches of %lld rows and heads do not fit the grid",
                   (long long)a->splits, (long long)(a->batch * a->heads));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_decode_attention_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_decode_attention_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_decode_attention_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "decode_attention: the engine computes in f32, f16 or bf16, not %s",
                 tf_dtype_name(a->dtype));
}
