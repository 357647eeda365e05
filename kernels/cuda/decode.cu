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
 * heads alone would leave most multiprocessors idle). Where a head's row
 * is whole 16-byte words (head_dim * dtype size a multiple of 16: every
 * preset), the tiled kernel: the stretch in tiles of 128 keys, a thread a
 * key scoring its whole row at once, the tile's softmax, then threads a
 * word of the rows summing the weighted values; the first tile's cached
 * rows, written by earlier steps, are loaded before the kernel waits for
 * the one ahead (chained launches). Otherwise the general kernel: four
 * warps taking eight keys at a time, a lane an element. Either writes the
 * stretch's partial result (max, sum, weighted values); the stretches
 * merge in order into the output row in the block of the stretch that
 * ends last (done's counters), or else in a second kernel. */
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

enum {
  TF_DECODE_WARPS = 4, TF_DECODE_PER_LANE = 8, TF_DECODE_MAX_HD = 32 * TF_DECODE_PER_LANE, TF_DECODE_GROUP = 8,
  TF_DECODE_MAX_SPLITS = 1024,
  TF_DECODE_TILE = 128,  /* keys a tile, threads a block of the tiled kernel */
  TF_DECODE_KWORDS = 16, /* words of a key's row a thread holds (longer rows: the rest read as scored) */
  TF_DECODE_VKEYS = 8,   /* rows of values a thread loads ahead of the tile's softmax */
};

/* The block's max (MAX) or sum of v, in a fixed order, for every thread;
 * red holds a float a warp. */
template <bool MAX> __device__ float tf_decode_block_fold(float v, float *red) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, u) : v + u;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < (int)(blockDim.x / 32); w++) v = MAX ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

/* The stretches of row-and-head bh merged in order (decode.c's
 * tf_cpu_decode_merge) by the block's threads (a multiple of 32, at most
 * TF_DECODE_TILE): each stretch's weight exp(max_s - max) found once, in
 * parallel, then a thread an element; partial read through L2 (other
 * blocks wrote it). */
template <int DT> __device__ void tf_cuda_decode_merge(const tf_decode_attention_args &a, int64_t bh) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  __shared__ float weight[TF_DECODE_MAX_SPLITS], weighted_sum[TF_DECODE_MAX_SPLITS], red[TF_DECODE_TILE / 32];
  __shared__ float total;
  const int64_t hd = a.head_dim, splits = a.splits, stride = hd + 2;
  const float *part = a.partial + bh * splits * stride;
  float mx = -INFINITY;
  for (int64_t s = threadIdx.x; s < splits; s += blockDim.x) mx = fmaxf(mx, __ldcg(part + s * stride));
  mx = tf_decode_block_fold<true>(mx, red);
  for (int64_t s = threadIdx.x; s < splits; s += blockDim.x) {
    const float sum = __ldcg(part + s * stride + 1), w = sum > 0.0f ? expf(__ldcg(part + s * stride) - mx) : 0.0f;
    weight[s] = w;
    weighted_sum[s] = w * sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int64_t s = 0; s < splits; s++)
      if (weight[s] > 0.0f) sum += weighted_sum[s];
    total = sum;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t s = 0; s < splits; s++)
      if (weight[s] > 0.0f) acc += weight[s] * __ldcg(part + s * stride + 2 + i);
    ((S *)a.out)[bh * hd + i] = D::store(acc / total);
  }
}

/* Whether this block's stretch is the last of bh to end (done's counters:
 * the CUDA samples' threadfence reduction); then it merges them all. */
template <int DT> __device__ void tf_cuda_decode_finish(const tf_decode_attention_args &a, int64_t bh) {
  if (!a.done) return;
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

/* The keys [lo, hi) of stretch s (a fixed cut of max_len). */
__device__ inline void tf_decode_stretch_keys(const tf_decode_attention_args &a, int64_t s, int64_t len, int64_t *lo,
                                              int64_t *hi) {
  const int64_t chunk = (a.max_len + a.splits - 1) / a.splits;
  *lo = s * chunk;
  *hi = *lo + chunk < len ? *lo + chunk : len;
}

/* General kernel, block (s, bh): stretch s of row-and-head bh into its
 * partial result. Each warp takes eight keys at a time (every
 * TF_DECODE_GROUP * warps-th group of the stretch): the eight keys' loads
 * and dot products in flight together, the running values rescaled once a
 * group. */
template <int DT>
__global__ void __launch_bounds__(32 * TF_DECODE_WARPS) tf_cuda_decode_stretch_kernel(tf_decode_attention_args a) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  enum { G = TF_DECODE_GROUP };
  __shared__ float sm_max[TF_DECODE_WARPS], sm_sum[TF_DECODE_WARPS];
  __shared__ float sm_acc[TF_DECODE_WARPS][TF_DECODE_MAX_HD];
  tf_chain_next();
  tf_chain_wait();
  const int64_t hd = a.head_dim, s = blockIdx.x, bh = blockIdx.y;
  int64_t lo, hi;
  tf_decode_stretch_keys(a, s, *a.pos + 1, &lo, &hi);
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
  tf_cuda_decode_finish<DT>(a, bh);
}

/* Tiled kernel, block (s, bh) of TF_DECODE_TILE threads: stretch s of
 * row-and-head bh into its partial result, a tile of keys at a time.
 * Thread t scores key base + t from the words of its row it holds (loaded
 * at once: a tile's latency, not a key's); the tile's max and sum of
 * exponentials fold over the block in a fixed order; then thread (r, w)
 * of the key lanes adds word w of the rows r, r + lanes, ... weighted,
 * the lanes' sums fold in order into the running values. The rows of the
 * first tile before the current position were written by earlier steps,
 * so they are read before the kernel waits for the one ahead; the
 * position's own row (kv_append's, the kernel ahead) and q after. */
template <int DT> __global__ void __launch_bounds__(TF_DECODE_TILE) tf_cuda_decode_tiled_kernel(tf_decode_attention_args a) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  enum { E = 16 / sizeof(S) };
  union word {
    uint4 raw;
    S v[E];
  };
  __shared__ float q_sh[TF_DECODE_MAX_HD], acc_sh[TF_DECODE_MAX_HD], p_sh[TF_DECODE_TILE];
  __shared__ float lane_sum[TF_DECODE_TILE * E], red_max[TF_DECODE_TILE / 32], red_sum[TF_DECODE_TILE / 32];
  const int t = threadIdx.x;
  const int64_t hd = a.head_dim, s = blockIdx.x, bh = blockIdx.y, pos = *a.pos;
  int64_t lo, hi;
  tf_decode_stretch_keys(a, s, pos + 1, &lo, &hi);
  const int W = (int)(hd / E), lanes = TF_DECODE_TILE / W, r = t / W, wi = t % W;
  const uint4 *kc = (const uint4 *)((const S *)a.k_cache + bh * a.max_len * hd);
  const uint4 *vc = (const uint4 *)((const S *)a.v_cache + bh * a.max_len * hd);
  word kw[TF_DECODE_KWORDS], vw[TF_DECODE_VKEYS];
  /* the rows of tile base: which 0 those before pos, 1 pos's alone, 2 all */
  auto load = [&](int64_t base, int which) {
    const int64_t j = base + t;
    if (j < hi && (which == 2 || (which == 0) == (j < pos))) {
#pragma unroll
      for (int u = 0; u < TF_DECODE_KWORDS; u++)
        if (u < W) kw[u].raw = __ldcs(kc + j * W + u);
    }
#pragma unroll
    for (int m = 0; m < TF_DECODE_VKEYS; m++) {
      const int64_t jv = base + r + (int64_t)m * lanes;
      if (r < lanes && jv < hi && (which == 2 || (which == 0) == (jv < pos))) vw[m].raw = __ldcs(vc + jv * W + wi);
    }
  };
  load(lo, 0);
  tf_chain_next();
  tf_chain_wait();
  load(lo, 1);
  const S *q = (const S *)a.q + bh * hd;
  for (int64_t i = t; i < hd; i += TF_DECODE_TILE) {
    q_sh[i] = D::load(q[i]);
    acc_sh[i] = 0.0f;
  }
  __syncthreads();
  const float scale = (float)a.scale;
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t base = lo; base < hi; base += TF_DECODE_TILE) {
    const int n = hi - base < TF_DECODE_TILE ? (int)(hi - base) : TF_DECODE_TILE;
    if (base != lo) load(base, 2);
    float score = -INFINITY;
    if (t < n) {
      float dot = 0.0f;
#pragma unroll
      for (int u = 0; u < TF_DECODE_KWORDS; u++)
        if (u < W)
#pragma unroll
          for (int e = 0; e < E; e++) dot += q_sh[u * E + e] * D::load(kw[u].v[e]);
      for (int u = TF_DECODE_KWORDS; u < W; u++) {
        word k;
        k.raw = __ldcs(kc + (base + t) * W + u);
#pragma unroll
        for (int e = 0; e < E; e++) dot += q_sh[u * E + e] * D::load(k.v[e]);
      }
      score = dot * scale;
    }
    const float next = fmaxf(mx, tf_decode_block_fold<true>(score, red_max));
    const float p = t < n ? expf(score - next) : 0.0f, old = expf(mx - next);
    p_sh[t] = p;
    sum = sum * old + tf_decode_block_fold<false>(p, red_sum); /* its barrier also publishes p_sh */
    mx = next;
    if (r < lanes) {
      float v[E];
#pragma unroll
      for (int e = 0; e < E; e++) v[e] = 0.0f;
#pragma unroll
      for (int m = 0; m < TF_DECODE_VKEYS; m++) {
        const int j = r + m * lanes;
        if (j < n)
#pragma unroll
          for (int e = 0; e < E; e++) v[e] += p_sh[j] * D::load(vw[m].v[e]);
      }
      for (int j = r + TF_DECODE_VKEYS * lanes; j < n; j += lanes) {
        word x;
        x.raw = __ldcs(vc + (base + j) * W + wi);
#pragma unroll
        for (int e = 0; e < E; e++) v[e] += p_sh[j] * D::load(x.v[e]);
      }
#pragma unroll
      for (int e = 0; e < E; e++) lane_sum[(r * W + wi) * E + e] = v[e];
    }
    __syncthreads();
    for (int64_t i = t; i < hd; i += TF_DECODE_TILE) {
      float v = 0.0f;
      for (int l = 0; l < lanes; l++) v += lane_sum[l * W * E + i];
      acc_sh[i] = acc_sh[i] * old + v;
    }
  }
  float *part = a.partial + (bh * a.splits + s) * (hd + 2);
  for (int64_t i = t; i < hd; i += TF_DECODE_TILE) part[2 + i] = acc_sh[i];
  if (t == 0) {
    part[0] = mx;
    part[1] = sum;
  }
  tf_cuda_decode_finish<DT>(a, bh);
}

/* Block bh: the stretches merged (without done's counters). */
template <int DT> __global__ void __launch_bounds__(TF_DECODE_TILE) tf_cuda_decode_merge_kernel(tf_decode_attention_args a) {
  tf_chain_next();
  tf_chain_wait();
  tf_cuda_decode_merge<DT>(a, blockIdx.x);
}

template <int DT> static tf_status tf_cuda_decode_attention_typed(tf_cuda_state *st, const tf_decode_attention_args *a) {
  const int64_t rows = a->batch * a->heads;
  if (rows == 0) return TF_OK;
  const dim3 grid((unsigned)a->splits, (unsigned)rows);
  const bool words = a->head_dim * (int64_t)sizeof(typename tf_cuda_dtype<DT>::storage) % 16 == 0 &&
                     (((uintptr_t)a->q | (uintptr_t)a->k_cache | (uintptr_t)a->v_cache) & 15) == 0;
  if (words && !a->general)
    TF_TRY(tf_cuda_launch(st, a->chained, "decode attention kernel", grid, TF_DECODE_TILE,
                          tf_cuda_decode_tiled_kernel<DT>, *a));
  else
    TF_TRY(tf_cuda_launch(st, a->chained, "decode attention kernel", grid, 32 * TF_DECODE_WARPS,
                          tf_cuda_decode_stretch_kernel<DT>, *a));
  if (a->done) return TF_OK;
  return tf_cuda_launch(st, a->chained, "decode attention merge kernel", (unsigned)rows, TF_DECODE_TILE,
                        tf_cuda_decode_merge_kernel<DT>, *a);
}

tf_status tf_cuda_decode_attention(tf_device_ctx *ctx, const tf_decode_attention_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  if (a->head_dim > TF_DECODE_MAX_HD)
    return tf_fail(TF_ERR_ARG, "decode_attention: head_dim %lld is above the kernel's %d", (long long)a->head_dim,
                   TF_DECODE_MAX_HD);
  if (a->splits < 1 || a->splits > TF_DECODE_MAX_SPLITS || a->batch * a->heads > 65535)
    return tf_fail(TF_ERR_ARG, "decode_attention: %lld stretches of %lld rows and heads do not fit the grid (1 to %d "
                   "stretches, 65535 rows and heads at most)",
                   (long long)a->splits, (long long)(a->batch * a->heads), TF_DECODE_MAX_SPLITS);
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
