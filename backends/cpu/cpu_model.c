/* The Transformer engine's kernels on the CPU (model_kernels.h): the
 * references of backends/cuda/model_*.cu. Row statistics and elementwise
 * formulas in double, rounded once into each output; the embedding's
 * gradient in f32 in position order, as on the GPU (the same bits). Rows
 * run in parallel when there are enough of them; every sum is taken by
 * one thread in a fixed order. */
#include <math.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

enum { TF_CPU_MODEL_PARALLEL_MIN = 1 << 15 };

/* Element i of any dtype as a double (elemio.h: the GPU's conversions). */
static double tf_cpu_get(const void *p, tf_dtype d, int64_t i) { return tf_elem_get(p, d, i); }
/* Rounds once into dtype d. */
static void tf_cpu_set(void *p, tf_dtype d, int64_t i, double v) { tf_elem_set(p, d, i, v); }

/* An index as the kernels read it: a bad one reads as 0 (never out of bounds). */
static int64_t tf_cpu_id(const int64_t *ids, int64_t i, int64_t limit) {
  int64_t v = ids[i];
  return v >= 0 && v < limit ? v : 0;
}

/* The first bad index, as the GPU's atomicMin reports it. */
static tf_status tf_cpu_index_check(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit, int64_t *bad) {
  (void)ctx;
  *bad = -1;
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= limit) {
      *bad = i;
      break;
    }
  return TF_OK;
}

/* ---- embedding -------------------------------------------------------------------- */

/* Forward copies rows; backward adds rows in position order, in f32. */
static tf_status tf_cpu_encoder(tf_device_ctx *ctx, const tf_encoder_args *a) {
  (void)ctx;
  const int64_t dim = a->dim;
  if (!a->backward) {
    for (int64_t i = 0; i < a->n; i++)
      memcpy(a->out + i * dim, a->wte + tf_cpu_id(a->ids, i, a->vocab) * dim, (size_t)dim * sizeof(float));
    return TF_OK;
  }
  for (int64_t i = 0; i < a->n; i++) {
    float *row = a->dwte + tf_cpu_id(a->ids, i, a->vocab) * dim;
    const float *g = a->dout + i * dim;
    for (int64_t c = 0; c < dim; c++) row[c] += g[c];
  }
  return TF_OK;
}

/* ---- rmsnorm ---------------------------------------------------------------------- */

/* x_out = x + delta rounded to f32 first, then normalised from that f32 value. */
static void tf_cpu_rmsnorm_forward(const tf_rmsnorm_args *a) {
  const int64_t dim = a->dim;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * dim > TF_CPU_MODEL_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * dim;
    const float *x = a->x + base;
    if (a->delta) {
      for (int64_t c = 0; c < dim; c++) a->x_out[base + c] = (float)((double)x[c] + tf_cpu_get(a->delta, d, base + c));
      x = a->x_out + base;
    }
    double ss = 0;
    for (int64_t c = 0; c < dim; c++) ss += (double)x[c] * x[c];
    double rstd = 1.0 / sqrt(ss / (double)dim + a->eps);
    for (int64_t c = 0; c < dim; c++) tf_cpu_set(a->h, d, base + c, (double)x[c] * rstd * a->g[c]);
    a->rstd[r] = (float)rstd;
  }
}

/* Rows in parallel; the gain's column sums in row order, one thread. */
static void tf_cpu_rmsnorm_backward(const tf_rmsnorm_args *a) {
  const int64_t dim = a->dim;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * dim > TF_CPU_MODEL_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * dim;
    const double rstd = a->rstd[r];
    double sum = 0;
    for (int64_t c = 0; c < dim; c++) sum += tf_cpu_get(a->dh, d, base + c) * a->g[c] * a->x[base + c] * rstd;
    const double mean = sum / (double)dim;
    for (int64_t c = 0; c < dim; c++) {
      double dx = rstd * (tf_cpu_get(a->dh, d, base + c) * a->g[c] - a->x[base + c] * rstd * mean);
      float v = (float)((a->accumulate ? (double)a->dres[base + c] : 0.0) + dx);
      a->dres[base + c] = v;
      if (a->dres_low) tf_cpu_set(a->dres_low, d, base + c, v);
    }
  }
  for (int64_t c = 0; c < dim; c++) {
    double sum = 0;
    for (int64_t r = 0; r < a->rows; r++)
      sum += tf_cpu_get(a->dh, d, r * dim + c) * a->x[r * dim + c] * (double)a->rstd[r];
    a->dg[c] = (float)((double)a->dg[c] + sum);
  }
}

/* The backend entry of both passes. */
static tf_status tf_cpu_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  (void)ctx;
  if (a->backward)
    tf_cpu_rmsnorm_backward(a);
  else
    tf_cpu_rmsnorm_forward(a);
  return TF_OK;
}

/* ---- swiglu ------------------------------------------------------------------------- */

/* silu(a) b and its two partial derivatives, per element. */
static tf_status tf_cpu_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *a) {
  (void)ctx;
  const int64_t f = a->f;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * f > TF_CPU_MODEL_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++)
    for (int64_t c = 0; c < f; c++) {
      const double x = tf_cpu_get(a->ab, d, r * 2 * f + c), b = tf_cpu_get(a->ab, d, r * 2 * f + f + c);
      const double s = 1.0 / (1.0 + exp(-x)), silu = x * s;
      if (!a->backward) {
        tf_cpu_set(a->y, d, r * f + c, silu * b);
        continue;
      }
      const double g = tf_cpu_get(a->dy, d, r * f + c);
      tf_cpu_set(a->dab, d, r * 2 * f + c, g * b * (s * (1.0 + x * (1.0 - s))));
      tf_cpu_set(a->dab, d, r * 2 * f + f + c, g * silu);
    }
  return TF_OK;
}

/* ---- attention's layout kernels ----------------------------------------------------- */

/* Pair i of head h of q, k or v (part) at (b, t): rotated by +angle
 * forward (q, k), -angle backward; v is only moved. */
static tf_status tf_cpu_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a) {
  (void)ctx;
  const int64_t B = a->batch, T = a->seq, H = a->heads, hd = a->head_dim, half = hd / 2, d = H * hd;
  const tf_dtype dt = a->dtype;
#pragma omp parallel for schedule(static) if (B * T * 3 * d > TF_CPU_MODEL_PARALLEL_MIN)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t b = bt / T, t = bt % T;
    for (int part = 0; part < 3; part++) {
      void *heads = part == 0 ? a->q : part == 1 ? a->k : a->v;
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < half; i++) {
          const int64_t row = bt * 3 * d + part * d + h * hd + 2 * i, hrow = ((b * H + h) * T + t) * hd + 2 * i;
          const double cs = part < 2 ? a->cos[t * half + i] : 1.0, sn = part < 2 ? a->sin[t * half + i] : 0.0;
          if (!a->backward) {
            const double x0 = tf_cpu_get(a->qkv, dt, row), x1 = tf_cpu_get(a->qkv, dt, row + 1);
            tf_cpu_set(heads, dt, hrow, x0 * cs - x1 * sn);
            tf_cpu_set(heads, dt, hrow + 1, x0 * sn + x1 * cs);
          } else {
            const double g0 = tf_cpu_get(heads, dt, hrow), g1 = tf_cpu_get(heads, dt, hrow + 1);
            tf_cpu_set(a->qkv, dt, row, g0 * cs + g1 * sn);
            tf_cpu_set(a->qkv, dt, row + 1, -g0 * sn + g1 * cs);
          }
        }
    }
  }
  return TF_OK;
}

/* Rows of head_dim elements moved between the two layouts. */
static tf_status tf_cpu_heads(tf_device_ctx *ctx, const tf_heads_args *a) {
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

/* ---- causal softmax --------------------------------------------------------------------- */

/* Rows read only up to the diagonal; zeros written past it. */
static tf_status tf_cpu_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *a) {
  (void)ctx;
  const int64_t T = a->seq, rows = a->batch * T;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (rows * T > TF_CPU_MODEL_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = r % T, base = r * T;
    if (!a->backward) {
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; j++) m = fmax(m, a->scale * tf_cpu_get(a->s, d, base + j));
      for (int64_t j = 0; j <= t; j++) sum += exp(a->scale * tf_cpu_get(a->s, d, base + j) - m);
      for (int64_t j = 0; j < T; j++)
        tf_cpu_set(a->s, d, base + j, j <= t ? exp(a->scale * tf_cpu_get(a->s, d, base + j) - m) / sum : 0.0);
      continue;
    }
    double dot = 0;
    for (int64_t j = 0; j <= t; j++) dot += tf_cpu_get(a->p, d, base + j) * tf_cpu_get(a->s, d, base + j);
    for (int64_t j = 0; j < T; j++) {
      double ds = j <= t ? a->scale * tf_cpu_get(a->p, d, base + j) * (tf_cpu_get(a->s, d, base + j) - dot) : 0.0;
      tf_cpu_set(a->s, d, base + j, ds);
    }
  }
  return TF_OK;
}

/* ---- the loss --------------------------------------------------------------------------- */

/* The target's logit is read before the row is overwritten by its gradient. */
static tf_status tf_cpu_lm_loss(tf_device_ctx *ctx, const tf_lm_loss_args *a) {
  (void)ctx;
  const int64_t V = a->vocab;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * V > TF_CPU_MODEL_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * V, target = tf_cpu_id(a->targets, r, V);
    double log_sum, m = tf_cpu_row_max_logsum(a->logits, d, base, V, &log_sum);
    const double lse = m + log_sum;
    a->row_loss[r] = (float)(lse - tf_cpu_get(a->logits, d, base + target));
    if (!a->grad) continue;
    for (int64_t c = 0; c < V; c++) {
      double p = exp(tf_cpu_get(a->logits, d, base + c) - lse);
      tf_cpu_set(a->logits, d, base + c, (p - (c == target ? 1.0 : 0.0)) / (double)a->rows);
    }
  }
  double total = 0;
  for (int64_t r = 0; r < a->rows; r++) total += a->row_loss[r];
  *a->loss = (float)(total / (double)a->rows);
  return TF_OK;
}

const tf_model_kernels tf_cpu_model_kernels = {
    .gemm = tf_cpu_gemm,
    .index_check = tf_cpu_index_check,
    .encoder = tf_cpu_encoder,
    .rmsnorm = tf_cpu_rmsnorm,
    .swiglu = tf_cpu_swiglu,
    .rope_heads = tf_cpu_rope_heads,
    .heads = tf_cpu_heads,
    .causal_softmax = tf_cpu_causal_softmax,
    .lm_loss = tf_cpu_lm_loss,
    .gemm_use_lt = NULL,
};
