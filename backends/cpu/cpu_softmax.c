/* Softmax on the CPU: the eager softmax / log_softmax (nnops.h) and the
 * engine's causal softmax over attention scores (model_kernels.h). Rows are
 * read as doubles (elemio.h), reduced in column order and rounded once; rows
 * run in parallel, each by one thread. The references of
 * backends/cuda/softmax.cu and model_attention.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* Max first, so that exp never overflows; an all -inf row gives NaN, as in PyTorch. */
static tf_status tf_cpu_softmax_forward(const tf_softmax_args *a) {
  const void *x = tf_tensor_data(a->x);
  void *y = tf_tensor_data(a->out);
  tf_dtype d = a->x->dtype;
  const int64_t cols = a->cols;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
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
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
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

/* ---- causal softmax --------------------------------------------------------------------- */

/* Rows read only up to the diagonal; zeros written past it. */
tf_status tf_cpu_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *a) {
  (void)ctx;
  const int64_t T = a->seq, rows = a->batch * T;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (rows * T > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = r % T, base = r * T;
    if (!a->backward) {
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; j++) m = fmax(m, a->scale * tf_elem_get(a->s, d, base + j));
      for (int64_t j = 0; j <= t; j++) sum += exp(a->scale * tf_elem_get(a->s, d, base + j) - m);
      for (int64_t j = 0; j < T; j++)
        tf_elem_set(a->s, d, base + j, j <= t ? exp(a->scale * tf_elem_get(a->s, d, base + j) - m) / sum : 0.0);
      continue;
    }
    double dot = 0;
    for (int64_t j = 0; j <= t; j++) dot += tf_elem_get(a->p, d, base + j) * tf_elem_get(a->s, d, base + j);
    for (int64_t j = 0; j < T; j++) {
      double ds = j <= t ? a->scale * tf_elem_get(a->p, d, base + j) * (tf_elem_get(a->s, d, base + j) - dot) : 0.0;
      tf_elem_set(a->s, d, base + j, ds);
    }
  }
  return TF_OK;
}

