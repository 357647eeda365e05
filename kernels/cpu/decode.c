/* Generation's kernels on the CPU, the twins of decode.cu: the KV cache's
 * append (RoPE on the new keys by rope_heads' rule, rope.h) and the
 * attention of one query over the cached keys, cut into the same fixed
 * stretches as the GPU's so that both merge the same partial results. */
#include <math.h>
#include <string.h>

#include "elemio.h"
#include "rope.h"
#include "cpu.h"
#include "cpu_model.h"

/* Token t of row b: q and k turned at position pos0 + t, k and v into the caches. */
TF_CPU_INLINE void tf_cpu_kv_append_token(tf_dtype dt, const tf_kv_append_args *a, int64_t pos0, int64_t bt) {
  const int64_t T = a->seq, H = a->heads, hd = a->head_dim, half = hd / 2, d = H * hd;
  const int64_t b = bt / T, t = bt % T, pos = pos0 + t;
  for (int part = 0; part < 3; part++) {
    void *dst = part == 0 ? a->q : part == 1 ? a->k_cache : a->v_cache;
    if (!dst) continue;
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < half; i++) {
        const int64_t row = bt * 3 * d + part * d + h * hd + 2 * i;
        const int64_t at = part == 0 ? ((b * H + h) * T + t) * hd + 2 * i : ((b * H + h) * a->max_len + pos) * hd + 2 * i;
        const double cs = part < 2 ? a->cos[pos * half + i] : 1.0, sn = part < 2 ? a->sin[pos * half + i] : 0.0;
        double y0, y1;
        tf_rope_turn(tf_elem_get(a->qkv, dt, row), tf_elem_get(a->qkv, dt, row + 1), cs, sn, &y0, &y1);
        tf_elem_set(dst, dt, at, y0);
        tf_elem_set(dst, dt, at + 1, y1);
      }
  }
}

tf_status tf_cpu_kv_append(tf_device_ctx *ctx, const tf_kv_append_args *a) {
  (void)ctx;
  const int64_t pos0 = *a->pos, tokens = a->batch * a->seq;
  if (pos0 < 0 || pos0 + a->seq > a->max_len)
    return tf_fail(TF_ERR_ARG, "kv_append: positions %lld..%lld outside the cache of %lld", (long long)pos0,
                   (long long)(pos0 + a->seq - 1), (long long)a->max_len);
#pragma omp parallel for schedule(static) if (tokens * 3 * a->heads * a->head_dim > TF_CPU_PARALLEL_MIN)
  for (int64_t bt = 0; bt < tokens; bt++) TF_CPU_WITH_DTYPE(a->dtype, tf_cpu_kv_append_token, a, pos0, bt);
  return TF_OK;
}

/* Stretch s of row-and-head bh: the max of its scaled scores, the sum of
 * their exponentials and the values they weight (f32 sums in key order;
 * the GPU's blocks add in other orders, tiles of keys or the warps' shares,
 * so the two backends agree to rounding). */
TF_CPU_INLINE void tf_cpu_decode_stretch(tf_dtype dt, const tf_decode_attention_args *a, int64_t len, int64_t bh,
                                         int64_t s) {
  const int64_t hd = a->head_dim, chunk = (a->max_len + a->splits - 1) / a->splits;
  const int64_t lo = s * chunk, hi = lo + chunk < len ? lo + chunk : len;
  float *part = a->partial + (bh * a->splits + s) * (hd + 2);
  float mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < hd; i++) part[2 + i] = 0;
  for (int64_t j = lo; j < hi; j++) {
    float dot = 0;
    for (int64_t i = 0; i < hd; i++)
      dot += (float)tf_elem_get(a->q, dt, bh * hd + i) * (float)tf_elem_get(a->k_cache, dt, (bh * a->max_len + j) * hd + i);
    const float score = dot * (float)a->scale, next = score > mx ? score : mx;
    const float old = expf(mx - next), w = expf(score - next);
    sum = sum * old + w;
    for (int64_t i = 0; i < hd; i++)
      part[2 + i] = part[2 + i] * old + w * (float)tf_elem_get(a->v_cache, dt, (bh * a->max_len + j) * hd + i);
    mx = next;
  }
  part[0] = mx;
  part[1] = sum;
}

/* The stretches of bh merged in order into its output row. */
TF_CPU_INLINE void tf_cpu_decode_merge(tf_dtype dt, const tf_decode_attention_args *a, int64_t bh) {
  const int64_t hd = a->head_dim;
  const float *part = a->partial + bh * a->splits * (hd + 2);
  float mx = -INFINITY;
  for (int64_t s = 0; s < a->splits; s++) mx = part[s * (hd + 2)] > mx ? part[s * (hd + 2)] : mx;
  float sum = 0;
  for (int64_t s = 0; s < a->splits; s++)
    if (part[s * (hd + 2) + 1] > 0) sum += expf(part[s * (hd + 2)] - mx) * part[s * (hd + 2) + 1];
  for (int64_t i = 0; i < hd; i++) {
    float acc = 0;
    for (int64_t s = 0; s < a->splits; s++)
      if (part[s * (hd + 2) + 1] > 0) acc += expf(part[s * (hd + 2)] - mx) * part[s * (hd + 2) + 2 + i];
    tf_elem_set(a->out, dt, bh * hd + i, acc / sum);
  }
}

tf_status tf_cpu_decode_attention(tf_device_ctx *ctx, const tf_decode_attention_args *a) {
  (void)ctx;
  const int64_t len = *a->pos + 1, rows = a->batch * a->heads;
  if (len < 1 || len > a->max_len)
    return tf_fail(TF_ERR_ARG, "decode_attention: %lld keys outside the cache of %lld", (long long)len,
                   (long long)a->max_len);
#pragma omp parallel for schedule(static) if (rows * len * a->head_dim > TF_CPU_PARALLEL_MIN)
  for (int64_t bh = 0; bh < rows; bh++) {
    for (int64_t s = 0; s < a->splits; s++) TF_CPU_WITH_DTYPE(a->dtype, tf_cpu_decode_stretch, a, len, bh, s);
    TF_CPU_WITH_DTYPE(a->dtype, tf_cpu_decode_merge, a, bh);
  }
  return TF_OK;
}
