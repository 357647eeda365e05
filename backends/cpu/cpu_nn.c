/* Losses, rotary positions, lookups, masks and the optimizer step on the
 * CPU: the references of backends/cuda/cross_entropy.cu, rope.cu, embedding.cu,
 * masked_fill.cu and adamw.cu. Index tensors are checked before anything
 * is read through them; sums run in double in a fixed order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_nn.h"

enum { TF_CPU_NN_PARALLEL_MIN = 1 << 15 };

/* Element i of an index tensor (the dispatcher passes i64; any integer works). */
static int64_t tf_cpu_index(const tf_tensor *t, int64_t i) { return tf_elem_get_int(tf_tensor_data(t), t->dtype, i); }

/* The first of n indices outside [0, limit), or -1. */
static int64_t tf_cpu_first_bad(const tf_tensor *t, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++) {
    int64_t v = tf_cpu_index(t, i);
    if (v < 0 || v >= limit) return i;
  }
  return -1;
}

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
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
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
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
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
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_NN_PARALLEL_MIN)
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

/* ---- embedding --------------------------------------------------------------- */

/* out[i] = weight[ids[i]]: rows copied bit for bit. */
static tf_status tf_cpu_embedding_forward(const tf_embedding_args *a, int64_t *bad) {
  *bad = tf_cpu_first_bad(a->ids, a->n, a->vocab);
  if (*bad >= 0) return TF_OK;
  size_t row = (size_t)a->dim * tf_dtype_size(a->weight->dtype);
  const char *w = tf_tensor_data(a->weight);
  char *out = tf_tensor_data(a->out);
  if (row == 0) return TF_OK;
  for (int64_t i = 0; i < a->n; i++) memcpy(out + (size_t)i * row, w + (size_t)tf_cpu_index(a->ids, i) * row, row);
  return TF_OK;
}

/* dweight[v] = sum of dout[i] over the positions i with ids[i] == v, in
 * position order: a stable counting sort of the positions by id, then one
 * double accumulator row per id. Rows of unused ids are zero. */
static tf_status tf_cpu_embedding_backward(const tf_embedding_args *a, int64_t *bad) {
  *bad = tf_cpu_first_bad(a->ids, a->n, a->vocab);
  if (*bad >= 0) return TF_OK;
  const int64_t n = a->n, dim = a->dim, vocab = a->vocab;
  int64_t *start = calloc((size_t)vocab + 1, sizeof *start), *order = malloc((size_t)n * sizeof *order);
  double *acc = malloc((size_t)(dim > 0 ? dim : 1) * sizeof *acc);
  if (!start || !order || !acc) {
    free(start), free(order), free(acc);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for embedding_backward's sort");
  }
  for (int64_t i = 0; i < n; i++) start[tf_cpu_index(a->ids, i) + 1]++;
  for (int64_t v = 0; v < vocab; v++) start[v + 1] += start[v];
  int64_t *fill = malloc((size_t)vocab * sizeof *fill);
  if (!fill && vocab > 0) {
    free(start), free(order), free(acc);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for embedding_backward's sort");
  }
  if (vocab > 0) memcpy(fill, start, (size_t)vocab * sizeof *fill);
  for (int64_t i = 0; i < n; i++) order[fill[tf_cpu_index(a->ids, i)]++] = i;
  free(fill);
  const void *dout = tf_tensor_data(a->dout);
  void *dw = tf_tensor_data(a->dweight);
  tf_dtype dd = a->dout->dtype, wd = a->dweight->dtype;
  for (int64_t v = 0; v < vocab; v++) {
    for (int64_t c = 0; c < dim; c++) acc[c] = 0;
    for (int64_t j = start[v]; j < start[v + 1]; j++) {
      int64_t base = order[j] * dim;
      for (int64_t c = 0; c < dim; c++) acc[c] += tf_elem_get(dout, dd, base + c);
    }
    for (int64_t c = 0; c < dim; c++) tf_elem_set(dw, wd, v * dim + c, acc[c]);
  }
  free(start), free(order), free(acc);
  return TF_OK;
}

/* The backend entry of both passes; each checks every id before using any. */
tf_status tf_cpu_embedding(tf_device_ctx *ctx, const tf_embedding_args *a, int64_t *bad) {
  (void)ctx;
  return a->backward ? tf_cpu_embedding_backward(a, bad) : tf_cpu_embedding_forward(a, bad);
}

/* ---- masked_fill ----------------------------------------------------------------- */

typedef struct {
  const char *x, *mask;
  char *out;
  size_t elsize;
  uint64_t fill; /* the value in x's dtype, in its low bytes */
} tf_cpu_masked_fill_job;

/* One row of the iteration space: operand 0 is x, operand 1 the mask. */
static void tf_cpu_masked_fill_rows(void *ud, int64_t oo, int64_t o0, int64_t o1, int64_t n, int64_t s0,
                                    int64_t s1) {
  tf_cpu_masked_fill_job *j = ud;
  size_t es = j->elsize;
  for (int64_t i = 0; i < n; i++) {
    char *dst = j->out + (size_t)(oo + i) * es;
    if (j->mask[o1 + i * s1])
      memcpy(dst, &j->fill, es);
    else
      memcpy(dst, j->x + (size_t)(o0 + i * s0) * es, es);
  }
}

/* Elements move as bytes, so NaN payloads and -0 survive, as on the GPU. */
tf_status tf_cpu_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                             tf_tensor *out) {
  (void)ctx;
  tf_cpu_masked_fill_job job = {x->storage->data, mask->storage->data, out->storage->data,
                                tf_dtype_size(x->dtype), 0};
  tf_elem_set(&job.fill, x->dtype, 0, value);
  tf_cpu_for_rows(out, x, mask, tf_cpu_masked_fill_rows, &job);
  return TF_OK;
}

/* ---- adamw ------------------------------------------------------------------------- */

/* torch.optim.AdamW's update, element by element, in double. */
tf_status tf_cpu_adamw(tf_device_ctx *ctx, const tf_adamw_update *a) {
  (void)ctx;
  void *p = tf_tensor_data(a->p), *m = tf_tensor_data(a->m), *v = tf_tensor_data(a->v);
  const void *g = tf_tensor_data(a->g);
  tf_dtype pd = a->p->dtype, gd = a->g->dtype;
  int64_t n = tf_tensor_numel(a->p);
#pragma omp parallel for schedule(static) if (n > TF_CPU_NN_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) {
    double gv = tf_elem_get(g, gd, i);
    double pv = tf_elem_get(p, pd, i) * a->decay;
    double mv = a->beta1 * tf_elem_get(m, pd, i) + (1.0 - a->beta1) * gv;
    double vv = a->beta2 * tf_elem_get(v, pd, i) + (1.0 - a->beta2) * gv * gv;
    pv -= a->step_size * mv / (sqrt(vv) / a->bias2_sqrt + a->eps);
    tf_elem_set(p, pd, i, pv);
    tf_elem_set(m, pd, i, mv);
    tf_elem_set(v, pd, i, vv);
  }
  return TF_OK;
}
