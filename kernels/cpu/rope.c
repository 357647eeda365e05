/* Rotary position embeddings on the CPU, the twin of rope.cu: the eager op
 * (backend.h: rope) and the engine's split of qkv into heads with RoPE on q
 * and k, and the heads' layout moves (model_kernels.h), the pairs of both
 * turned by one rule (rope.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "rope.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* ---- rope ------------------------------------------------------------------ */

/* Pair k of a row at position pos turns by pos * theta^(-2k/d): the
 * frequency from pow and the angle from one multiply, in double (rope.h), as
 * rope.cu takes them (its host computes the same frequencies), so
 * both backends turn by the same angles; the cosine and sine are rounded
 * to the compute type (f32 below f64), the rotated pair to x's dtype. */
tf_status tf_cpu_rope(tf_device_ctx *ctx, const tf_rope_args *a) {
  (void)ctx;
  const void *x = tf_tensor_data(a->x);
  void *y = tf_tensor_data(a->y);
  tf_dtype d = a->x->dtype;
  const int64_t cols = a->cols, half = cols / 2;
  const bool wide = d == TF_F64;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols;
    int64_t pos = a->positions ? tf_cpu_index(a->positions, r) : r % a->seq;
    for (int64_t k = 0; k < half; k++) {
      double angle = (double)pos * tf_rope_inv_freq(a->theta, k, cols);
      double cs = cos(angle), sn = sin(angle), y0, y1;
      if (!wide) cs = (float)cs, sn = (float)sn;
      if (a->inverse) sn = -sn;
      tf_rope_turn(tf_elem_get(x, d, base + 2 * k), tf_elem_get(x, d, base + 2 * k + 1), cs, sn, &y0, &y1);
      tf_elem_set(y, d, base + 2 * k, y0);
      tf_elem_set(y, d, base + 2 * k + 1, y1);
    }
  }
  return TF_OK;
}

/* ---- attention's layout kernels ----------------------------------------------------- */

/* Pair i of head h of q, k or v (part) at (b, t): rotated by +angle
 * forward (q, k), -angle backward; v is only moved. Token bt = b T + t. */
TF_CPU_INLINE void tf_cpu_rope_heads_token(tf_dtype dt, const tf_rope_heads_args *a, int64_t bt) {
  const int64_t T = a->seq, H = a->heads, hd = a->head_dim, half = hd / 2, d = H * hd;
  const int64_t b = bt / T, t = bt % T;
  for (int part = 0; part < 3; part++) {
    void *heads = part == 0 ? a->q : part == 1 ? a->k : a->v;
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < half; i++) {
        const int64_t row = bt * 3 * d + part * d + h * hd + 2 * i, hrow = ((b * H + h) * T + t) * hd + 2 * i;
        const double cs = part < 2 ? a->cos[t * half + i] : 1.0, sn = part < 2 ? a->sin[t * half + i] : 0.0;
        double y0, y1;
        if (!a->backward) {
          tf_rope_turn(tf_elem_get(a->qkv, dt, row), tf_elem_get(a->qkv, dt, row + 1), cs, sn, &y0, &y1);
          tf_elem_set(heads, dt, hrow, y0);
          tf_elem_set(heads, dt, hrow + 1, y1);
        } else {
          tf_rope_turn(tf_elem_get(heads, dt, hrow), tf_elem_get(heads, dt, hrow + 1), cs, -sn, &y0, &y1);
          tf_elem_set(a->qkv, dt, row, y0);
          tf_elem_set(a->qkv, dt, row + 1, y1);
        }
      }
  }
}

tf_status tf_cpu_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a) {
  (void)ctx;
  const int64_t tokens = a->batch * a->seq;
#pragma omp parallel for schedule(static) if (tokens * 3 * a->heads * a->head_dim > TF_CPU_PARALLEL_MIN)
  for (int64_t bt = 0; bt < tokens; bt++) TF_CPU_WITH_DTYPE(a->dtype, tf_cpu_rope_heads_token, a, bt);
  return TF_OK;
}

/* Rows of head_dim elements moved between the two layouts, a token's
 * heads a step, tokens spread over the cores. */
tf_status tf_cpu_heads(tf_device_ctx *ctx, const tf_heads_args *a) {
  (void)ctx;
  const int64_t B = a->batch, T = a->seq, H = a->heads, hd = a->head_dim;
  const size_t es = tf_dtype_size(a->dtype), row = (size_t)hd * es;
#pragma omp parallel for schedule(static) if (B * T * H * hd > TF_CPU_PARALLEL_MIN)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t b = bt / T, t = bt % T;
    for (int64_t h = 0; h < H; h++) {
      const int64_t merged = ((b * T + t) * H + h) * hd, split = ((b * H + h) * T + t) * hd;
      const int64_t from = a->split ? merged : split, to = a->split ? split : merged;
      memcpy((char *)a->dst + (size_t)to * es, (const char *)a->src + (size_t)from * es, row);
    }
  }
  return TF_OK;
}
