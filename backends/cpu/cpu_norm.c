/* Row-wise ops on the CPU: softmax / log_softmax and layer / rms norm,
 * forward and backward. Every row is read as doubles (elemio.h), reduced in
 * double in column order and rounded once into its output's dtype; rows run
 * in parallel (each by one thread, so results do not depend on the thread
 * count). Weight gradients are column sums over rows taken in row order. */
#include <math.h>
#include <stdlib.h>

#include "elemio.h"
#include "cpu_nn.h"

/* Parallel rows only when there is enough work to pay for the threads. */
enum { TF_CPU_NN_PARALLEL_MIN = 1 << 15 };

/* Max first, so that exp never overflows; an all -inf row gives NaN, as in PyTorch. */
static tf_status tf_cpu_softmax_forward(const tf_softmax_args *a) {
  const void *x = tf_tensor_data(a->x);
  void *y = tf_tensor_data(a->out);
  tf_dtype d = a->x->dtype;
  const int64_t cols = a->cols;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols;
    double lsum, m = tf_cpu_row_max_logsum(x, d, base, cols, &lsum);
    for (int64_t c = 0; c < cols; c++) {
      double v = tf_elem_get(x, d, base + c) - m;
      tf_elem_set(y, d, base + c, a->log ? v - lsum : exp(v - lsum));
    }
  }
  return TF_OK;
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy). */
static tf_status tf_cpu_softmax_backward(const tf_softmax_args *a) {
  const void *y = tf_tensor_data(a->x), *dy = tf_tensor_data(a->dy);
  void *dx = tf_tensor_data(a->out);
  tf_dtype d = a->x->dtype;
  const int64_t cols = a->cols;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols;
    double dot = 0;
    for (int64_t c = 0; c < cols; c++)
      dot += tf_elem_get(dy, d, base + c) * (a->log ? 1.0 : tf_elem_get(y, d, base + c));
    for (int64_t c = 0; c < cols; c++) {
      double yv = tf_elem_get(y, d, base + c), g = tf_elem_get(dy, d, base + c);
      tf_elem_set(dx, d, base + c, a->log ? g - exp(yv) * dot : yv * (g - dot));
    }
  }
  return TF_OK;
}

/* The backend entry: dy says which pass. */
tf_status tf_cpu_softmax(tf_device_ctx *ctx, const tf_softmax_args *a) {
  (void)ctx;
  return a->dy ? tf_cpu_softmax_backward(a) : tf_cpu_softmax_forward(a);
}

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
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
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
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
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
