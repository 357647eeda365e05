/* Rotary position embeddings on the CPU: the eager op (nnops.h: rope) and
 * the engine's split of qkv into heads with RoPE on q and k, and the heads'
 * layout moves (model_kernels.h). The references of backends/cuda/rope.cu
 * and model_attention.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* ---- rope ------------------------------------------------------------------ */

/* Pair k of a row at position pos turns by pos * theta^(-2k/d): the
 * frequency from pow and the angle from one multiply, in double, exactly as
 * backends/cuda/rope.cu takes them (its host computes the same frequencies), so
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
      double inv_freq = pow(a->theta, -(double)(2 * k) / (double)cols);
      double angle = (double)pos * inv_freq;
      double cs = cos(angle), sn = sin(angle);
      if (!wide) cs = (float)cs, sn = (float)sn;
      if (a->inverse) sn = -sn;
      double x0 = tf_elem_get(x, d, base + 2 * k), x1 = tf_elem_get(x, d, base + 2 * k + 1);
      tf_elem_set(y, d, base + 2 * k, x0 * cs - x1 * sn);
      tf_elem_set(y, d, base + 2 * k + 1, x0 * sn + x1 * cs);
    }
  }
  return TF_OK;
}

/* ---- attention's layout kernels ----------------------------------------------------- */

/* Pair i of head h of q, k or v (part) at (b, t): rotated by +angle
 * forward (q, k), -angle backward; v is only moved. */
tf_status tf_cpu_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a) {
  (void)ctx;
  const int64_t B = a->batch, T = a->seq, H = a->heads, hd = a->head_dim, half = hd / 2, d = H * hd;
  const tf_dtype dt = a->dtype;
#pragma omp parallel for schedule(static) if (B * T * 3 * d > TF_CPU_PARALLEL_MIN)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t b = bt / T, t = bt % T;
    for (int part = 0; part < 3; part++) {
      void *heads = part == 0 ? a->q : part == 1 ? a->k : a->v;
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < half; i++) {
          const int64_t row = bt * 3 * d + part * d + h * hd + 2 * i, hrow = ((b * H + h) * T + t) * hd + 2 * i;
          const double cs = part < 2 ? a->cos[t * half + i] : 1.0, sn = part < 2 ? a->sin[t * half + i] : 0.0;
          if (!a->backward) {
            const double x0 = tf_elem_get(a->qkv, dt, row), x1 = tf_elem_get(a->qkv, dt, row + 1);
            tf_elem_set(heads, dt, hrow, x0 * cs - x1 * sn);
            tf_elem_set(heads, dt, hrow + 1, x0 * sn + x1 * cs);
          } else {
            const double g0 = tf_elem_get(heads, dt, hrow), g1 = tf_elem_get(heads, dt, hrow + 1);
            tf_elem_set(a->qkv, dt, row, g0 * cs + g1 * sn);
            tf_elem_set(a->qkv, dt, row + 1, -g0 * sn + g1 * cs);
          }
        }
    }
  }
  return TF_OK;
}

/* Rows of head_dim elements moved between the two layouts. */
tf_status tf_cpu_heads(tf_device_ctx *ctx, const tf_heads_args *a) {
  (void)ctx;
  const int64_t B = a->batch, T = a->seq, H = a->heads, hd = a->head_dim;
  const size_t es = tf_dtype_size(a->dtype), row = (size_t)hd * es;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) {
        const int64_t merged = ((b * T + t) * H + h) * hd, split = ((b * H + h) * T + t) * hd;
        const int64_t from = a->split ? merged : split, to = a->split ? split : merged;
        memcpy((char *)a->dst + (size_t)to * es, (const char *)a->src + (size_t)from * es, row);
      }
  return TF_OK;
}

