/* Cross-entropy on the CPU: the eager op (nnops.h) and the engine's fused
 * loss and gradient (model_kernels.h: lm_loss). The references of
 * backends/cuda/cross_entropy.cu and model_loss.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* ---- cross_entropy ------------------------------------------------------- */

/* loss = mean over rows of lse(row) - row[target], lse = max + log(sum(exp(x - max))). */
static tf_status tf_cpu_cross_entropy_forward(const tf_cross_entropy_args *a, int64_t *bad) {
  *bad = tf_cpu_first_bad(a->targets, a->rows, a->cols);
  if (*bad >= 0) return TF_OK;
  double *row_loss = malloc((size_t)a->rows * sizeof *row_loss);
  if (!row_loss) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for cross_entropy's row losses");
  const void *x = tf_tensor_data(a->logits);
  tf_dtype d = a->logits->dtype;
  const int64_t cols = a->cols;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols;
    double log_sum, m = tf_cpu_row_max_logsum(x, d, base, cols, &log_sum);
    double lse = m + log_sum;
    row_loss[r] = lse - tf_elem_get(x, d, base + tf_cpu_index(a->targets, r));
    if (a->lse) tf_elem_set(tf_tensor_data(a->lse), a->lse->dtype, r, lse);
  }
  double total = 0;
  for (int64_t r = 0; r < a->rows; r++) total += row_loss[r];
  free(row_loss);
  tf_elem_set(tf_tensor_data(a->loss), a->loss->dtype, 0, total / (double)a->rows);
  return TF_OK;
}

/* dlogits = (exp(x - lse) - onehot(target)) dloss / rows. A target out of
 * range matches no class (nothing is read through it). */
static tf_status tf_cpu_cross_entropy_backward(const tf_cross_entropy_args *a) {
  const void *x = tf_tensor_data(a->logits), *lse = tf_tensor_data(a->lse);
  void *dx = tf_tensor_data(a->dlogits);
  tf_dtype d = a->logits->dtype, sd = a->lse->dtype;
  const int64_t cols = a->cols;
  double scale = tf_elem_get(tf_tensor_data(a->dloss), a->dloss->dtype, 0) / (double)a->rows;
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    int64_t base = r * cols, t = tf_cpu_index(a->targets, r);
    double l = tf_elem_get(lse, sd, r);
    for (int64_t c = 0; c < cols; c++) {
      double p = exp(tf_elem_get(x, d, base + c) - l);
      tf_elem_set(dx, d, base + c, (p - (c == t ? 1.0 : 0.0)) * scale);
    }
  }
  return TF_OK;
}

/* The backend entry; only the forward pass checks targets (the backward
 * pass reads nothing through them). */
tf_status tf_cpu_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *a, int64_t *bad) {
  (void)ctx;
  *bad = -1;
  return a->backward ? tf_cpu_cross_entropy_backward(a) : tf_cpu_cross_entropy_forward(a, bad);
}

/* ---- the loss --------------------------------------------------------------------------- */

/* The target's logit is read before the row is overwritten by its gradient. */
tf_status tf_cpu_lm_loss(tf_device_ctx *ctx, const tf_lm_loss_args *a) {
  (void)ctx;
  const int64_t V = a->vocab;
  const tf_dtype d = a->dtype;
#pragma omp parallel for schedule(static) if (a->rows * V > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * V, target = tf_cpu_id(a->targets, r, V);
    double log_sum, m = tf_cpu_row_max_logsum(a->logits, d, base, V, &log_sum);
    const double lse = m + log_sum;
    a->row_loss[r] = (float)(lse - tf_elem_get(a->logits, d, base + target));
    if (!a->grad) continue;
    for (int64_t c = 0; c < V; c++) {
      double p = exp(tf_elem_get(a->logits, d, base + c) - lse);
      tf_elem_set(a->logits, d, base + c, (p - (c == target ? 1.0 : 0.0)) / (double)a->rows);
    }
  }
  double total = 0;
  for (int64_t r = 0; r < a->rows; r++) total += a->row_loss[r];
  *a->loss = (float)(total / (double)a->rows);
  return TF_OK;
}

