/* Norms on the CPU: the eager layer / rms norm (nnops.h) and the engine's
 * RMSNorm with the residual add in front (model_kernels.h), forward and
 * backward. Every row is read as doubles (elemio.h), reduced in
 * double in column order and rounded once into its output's dtype; rows run
 * in parallel (each by one thread, so results do not depend on the thread
 * count). Weight gradients are column sums over rows taken in row order. */
#include <math.h>
#include <stdlib.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"



/* Element c of an optional weight vector (absent: 1, or 0 for a bias). */
static double tf_cpu_weight(const tf_tensor *w, int64_t c, double absent) {
  return w ? tf_elem_get(tf_tensor_data(w), w->dtype, c) : absent;
}

/* layer_norm: y = (x - mean) rstd w + b with the biased variance;
 * rms_norm: y = (x rstd) g with rstd = 1 / sqrt(mean(x^2) + eps). */
static tf_status tf_cpu_norm_forward(const tf_norm_args *a) {
  const void *x = tf_tensor_data(a->x);
  void *y = tf_tensor_data(a->y);
  tf_dtype d = a->x->dtype;
  const int64_t cols = a->cols;
  const bool layer = a->kind == TF_NORM_LAYER;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols;
    double mean = 0, sq = 0;
    if (layer) {
      for (int64_t c = 0; c < cols; c++) mean += tf_elem_get(x, d, base + c);
      mean /= (double)cols;
    }
    for (int64_t c = 0; c < cols; c++) {
      double v = tf_elem_get(x, d, base + c) - mean;
      sq += v * v;
    }
    double rstd = 1.0 / sqrt(sq / (double)cols + a->eps);
    for (int64_t c = 0; c < cols; c++) {
      double v = tf_elem_get(x, d, base + c);
      double out = layer ? (v - mean) * rstd * tf_cpu_weight(a->w, c, 1.0) + tf_cpu_weight(a->b, c, 0.0)
                         : (v * rstd) * tf_cpu_weight(a->w, c, 1.0);
      tf_elem_set(y, d, base + c, out);
    }
    if (a->mean) tf_elem_set(tf_tensor_data(a->mean), a->mean->dtype, r, mean);
    if (a->rstd) tf_elem_set(tf_tensor_data(a->rstd), a->rstd->dtype, r, rstd);
  }
  return TF_OK;
}

/* With xhat = (x - mean) rstd (layer) or x rstd (rms) and gw = dy w:
 *   layer: dx = rstd (gw - mean(gw) - xhat mean(gw xhat))
 *   rms:   dx = rstd (gw - xhat mean(gw xhat))
 * dw = sum over rows of dy xhat, db = sum over rows of dy. The saved mean
 * and rstd are used as given (as on the GPU). */
static tf_status tf_cpu_norm_backward(const tf_norm_args *a) {
  const void *x = tf_tensor_data(a->x), *dy = tf_tensor_data(a->dy);
  tf_dtype d = a->x->dtype;
  const int64_t cols = a->cols;
  const bool layer = a->kind == TF_NORM_LAYER;
  const void *meanp = layer ? tf_tensor_data(a->mean) : NULL, *rstdp = tf_tensor_data(a->rstd);
  tf_dtype sd = a->rstd->dtype;
  if (a->dx) {
    void *dx = tf_tensor_data(a->dx);
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
    for (int64_t r = 0; r < a->rows; r++) {
      int64_t base = r * cols;
      double mean = layer ? tf_elem_get(meanp, sd, r) : 0.0, rstd = tf_elem_get(rstdp, sd, r);
      double sum_g = 0, sum_gx = 0;
      for (int64_t c = 0; c < cols; c++) {
        double g = tf_elem_get(dy, d, base + c) * tf_cpu_weight(a->w, c, 1.0);
        double xhat = (tf_elem_get(x, d, base + c) - mean) * rstd;
        sum_g += g;
        sum_gx += g * xhat;
      }
      double mg = layer ? sum_g / (double)cols : 0.0, mgx = sum_gx / (double)cols;
      for (int64_t c = 0; c < cols; c++) {
        double g = tf_elem_get(dy, d, base + c) * tf_cpu_weight(a->w, c, 1.0);
        double xhat = (tf_elem_get(x, d, base + c) - mean) * rstd;
        tf_elem_set(dx, d, base + c, rstd * (g - mg - xhat * mgx));
      }
    }
  }
  if (!a->dw && !a->db) return TF_OK;
  double *acc = calloc((size_t)cols * 2, sizeof *acc);
  if (!acc) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a norm's weight gradients");
  double *aw = acc, *ab = acc + cols;
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols;
    double mean = layer ? tf_elem_get(meanp, sd, r) : 0.0, rstd = tf_elem_get(rstdp, sd, r);
    for (int64_t c = 0; c < cols; c++) {
      double g = tf_elem_get(dy, d, base + c);
      aw[c] += g * (tf_elem_get(x, d, base + c) - mean) * rstd;
      ab[c] += g;
    }
  }
  for (int64_t c = 0; c < cols; c++) {
    if (a->dw) tf_elem_set(tf_tensor_data(a->dw), a->dw->dtype, c, aw[c]);
    if (a->db) tf_elem_set(tf_tensor_data(a->db), a->db->dtype, c, ab[c]);
  }
  free(acc);
  return TF_OK;
}

/* The backend entry of both norms, both passes. */
tf_status tf_cpu_norm(tf_device_ctx *ctx, const tf_norm_args *a) {
  (void)ctx;
  return a->backward ? tf_cpu_norm_backward(a) : tf_cpu_norm_forward(a);
}

/* ---- rmsnorm ---------------------------------------------------------------------- */

/* x_out = x + delta rounded to f32 first, then normalised from that f32 value. */
static void tf_cpu_rmsnorm_forward(const tf_rmsnorm_args *a) {
  const int64_t dim = a->dim;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * dim > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * dim;
    const float *x = a->x + base;
    if (a->delta) {
      for (int64_t c = 0; c < dim; c++) a->x_out[base + c] = (float)((double)x[c] + tf_elem_get(a->delta, d, base + c));
      x = a->x_out + base;
    }
    double ss = 0;
    for (int64_t c = 0; c < dim; c++) ss += (double)x[c] * x[c];
    double rstd = 1.0 / sqrt(ss / (double)dim + a->eps);
    for (int64_t c = 0; c < dim; c++) tf_elem_set(a->h, d, base + c, (double)x[c] * rstd * a->g[c]);
    a->rstd[r] = (float)rstd;
  }
}

/* Rows in parallel; the gain's column sums in row order, one thread. */
static void tf_cpu_rmsnorm_backward(const tf_rmsnorm_args *a) {
  const int64_t dim = a->dim;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * dim > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * dim;
    const double rstd = a->rstd[r];
    double sum = 0;
    for (int64_t c = 0; c < dim; c++) sum += tf_elem_get(a->dh, d, base + c) * a->g[c] * a->x[base + c] * rstd;
    const double mean = sum / (double)dim;
    for (int64_t c = 0; c < dim; c++) {
      double dx = rstd * (tf_elem_get(a->dh, d, base + c) * a->g[c] - a->x[base + c] * rstd * mean);
      float v = (float)((a->accumulate ? (double)a->dres[base + c] : 0.0) + dx);
      a->dres[base + c] = v;
      if (a->dres_low) tf_elem_set(a->dres_low, d, base + c, v);
    }
  }
  for (int64_t c = 0; c < dim; c++) {
    double sum = 0;
    for (int64_t r = 0; r < a->rows; r++)
      sum += tf_elem_get(a->dh, d, r * dim + c) * a->x[r * dim + c] * (double)a->rstd[r];
    a->dg[c] = (float)((double)a->dg[c] + sum);
  }
}

/* The backend entry of both passes. */
tf_status tf_cpu_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  (void)ctx;
  if (a->backward)
    tf_cpu_rmsnorm_backward(a);
  else
    tf_cpu_rmsnorm_forward(a);
  return TF_OK;
}

