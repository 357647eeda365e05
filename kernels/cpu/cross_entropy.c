/* Cross-entropy on the CPU, one row routine for the eager op (backend.h:
 * forward, backward) and the engine's loss fused with its gradient
 * (model_kernels.h: lm_loss): the twin of cross_entropy.cu. Rows are read
 * as doubles and run in parallel; the mean of the row losses is taken in
 * row order by one thread. The engine's f32 rows run through a vectorised
 * routine of their own (tf_cpu_ce_row_f32). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_exp.h"
#include "cpu_model.h"
#include "cpu_nn.h"

typedef struct tf_cpu_ce_rows {
  int64_t rows, cols;
  tf_dtype d;            /* of x and dx */
  const void *x;         /* logits (rows, cols) */
  const void *targets;   /* (rows,) of an integer dtype td */
  tf_dtype td;
  bool stats;            /* compute lse (and the row losses) from x; else read lse */
  void *lse;             /* dtype sd: written (stats, unless NULL) or read */
  tf_dtype sd;
  void *row_loss;        /* stats: dtype rd, one per row */
  tf_dtype rd;
  void *dx;              /* the gradient (may be x), or NULL for none */
  double scale;          /* the gradient's scale */
} tf_cpu_ce_rows;

/* lse = max + log(sum), sum = sum(exp(x - max)), the row's loss lse -
 * x[target] (a bad target read as class 0), then dx = (p - onehot) scale
 * with p = exp(x - max) / sum (each exponential once, kept in the thread's
 * scratch row e), the target's logit read before the row is overwritten.
 * Without stats p = exp(x - lse) from the saved lse, and a bad target
 * matches no class (nothing is read through it). */
TF_CPU_INLINE void tf_cpu_ce_row(tf_dtype d, const tf_cpu_ce_rows *a, int64_t r, double *e) {
  const int64_t cols = a->cols, base = r * cols;
  int64_t t = tf_elem_get_int(a->targets, a->td, r);
  double lse, m = 0, sum = 1;
  if (a->stats) {
    if (t < 0 || t >= cols) t = 0;
    m = tf_cpu_row_max_sumexp(a->x, d, base, cols, 1.0, a->dx ? e : NULL, &sum);
    lse = m + log(sum);
    tf_elem_set(a->row_loss, a->rd, r, lse - tf_elem_get(a->x, d, base + t));
    if (a->lse) tf_elem_set(a->lse, a->sd, r, lse);
  } else {
    lse = tf_elem_get(a->lse, a->sd, r);
  }
  if (!a->dx) return;
  if (a->stats && e) { /* a loop without calls, which vectorises */
    for (int64_t c = 0; c < cols; c++) tf_elem_set(a->dx, d, base + c, (e[c] / sum - (c == t ? 1.0 : 0.0)) * a->scale);
    return;
  }
  for (int64_t c = 0; c < cols; c++) {
    double p = a->stats ? tf_cpu_row_exp(e, a->x, d, base, c, 1.0, m) / sum : exp(tf_elem_get(a->x, d, base + c) - lse);
    tf_elem_set(a->dx, d, base + c, (p - (c == t ? 1.0 : 0.0)) * a->scale);
  }
}

/* The engine's common row (lm_loss: f32 logits, the gradient over them in
 * place), built for AVX-512, AVX2 and the baseline with a vectorising exp
 * (cpu_exp.h; the same bits on each): the row's loss lse - x[target] into
 * *loss, then the gradient; each exponential kept in e (or, without it,
 * computed again). The row's max and sum run in 8 lanes, added in a fixed
 * order. With libm's exp, called twice an element, the loss took half a
 * tiny model's step on the CPU. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
tf_cpu_ce_row_f32(float *restrict x, int64_t cols, int64_t t, double scale, double *restrict e, double *loss) {
  const double m = tf_cpu_row_max(x, TF_F32, 0, cols, 1.0);
  int64_t c0;
  /* the exponentials (into e, or into nothing: computed again below), and
   * their sum in 8 lanes too, added in a fixed order (the row's, not the
   * threads') */
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (e) {
    for (int64_t c = 0; c < cols; c++) e[c] = tf_cpu_exp((double)x[c] - m);
    for (c0 = 0; c0 + 8 <= cols; c0 += 8)
      for (int k = 0; k < 8; k++) part[k] += e[c0 + k];
    for (; c0 < cols; c0++) part[0] += e[c0];
  } else {
    for (c0 = 0; c0 + 8 <= cols; c0 += 8)
      for (int k = 0; k < 8; k++) part[k] += tf_cpu_exp((double)x[c0 + k] - m);
    for (; c0 < cols; c0++) part[0] += tf_cpu_exp((double)x[c0] - m);
  }
  double sum = part[0];
  for (int k = 1; k < 8; k++) sum += part[k];
  *loss = m + log(sum) - (double)x[t];
  if (e) {
    for (int64_t c = 0; c < cols; c++) x[c] = (float)((e[c] / sum - (c == t ? 1.0 : 0.0)) * scale);
  } else {
    for (int64_t c = 0; c < cols; c++)
      x[c] = (float)((tf_cpu_exp((double)x[c] - m) / sum - (c == t ? 1.0 : 0.0)) * scale);
  }
}

static void tf_cpu_ce_rows_run(const tf_cpu_ce_rows *a) {
#pragma omp parallel if (a->rows * a->cols > TF_CPU_PARALLEL_MIN)
  {
    double *e = a->stats && a->dx ? tf_cpu_exp_scratch(a->cols) : NULL;
    /* the engine's f32 loss with its gradient in place: the vectorised row */
    const bool f32_row = a->d == TF_F32 && a->stats && a->dx == a->x && !a->lse && a->rd == TF_F32;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a->rows; r++) {
      if (f32_row) {
        int64_t t = tf_elem_get_int(a->targets, a->td, r);
        double loss;
        tf_cpu_ce_row_f32((float *)a->dx + r * a->cols, a->cols, t < 0 || t >= a->cols ? 0 : t, a->scale, e, &loss);
        ((float *)a->row_loss)[r] = (float)loss;
      } else {
        TF_CPU_WITH_DTYPE(a->d, tf_cpu_ce_row, a, r, e);
      }
    }
    free(e);
  }
}

/* The mean of the row losses, added in row order, stored into loss (dtype ld). */
static void tf_cpu_ce_mean(const tf_cpu_ce_rows *a, void *loss, tf_dtype ld) {
  double total = 0;
  for (int64_t r = 0; r < a->rows; r++) total += tf_elem_get(a->row_loss, a->rd, r);
  tf_elem_set(loss, ld, 0, total / (double)a->rows);
}

/* The eager op's entry (backend.h). Forward: the targets checked first,
 * then the row losses and their mean; backward: dlogits from the saved
 * lse, scaled by dloss / rows. */
tf_status tf_cpu_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *a, int64_t *bad) {
  (void)ctx;
  *bad = -1;
  tf_cpu_ce_rows ce = {.rows = a->rows, .cols = a->cols, .d = a->logits->dtype, .x = tf_tensor_data(a->logits),
                       .targets = tf_tensor_data(a->targets), .td = a->targets->dtype,
                       .lse = a->lse ? tf_tensor_data(a->lse) : NULL, .sd = a->lse ? a->lse->dtype : TF_F64};
  if (a->backward) {
    ce.dx = tf_tensor_data(a->dlogits);
    ce.scale = tf_elem_get(tf_tensor_data(a->dloss), a->dloss->dtype, 0) / (double)a->rows;
    tf_cpu_ce_rows_run(&ce);
    return TF_OK;
  }
  *bad = tf_cpu_first_bad(a->targets, a->rows, a->cols);
  if (*bad >= 0) return TF_OK;
  ce.stats = true;
  ce.rd = TF_F64;
  ce.row_loss = malloc((size_t)a->rows * sizeof(double));
  if (!ce.row_loss) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for cross_entropy's row losses");
  tf_cpu_ce_rows_run(&ce);
  tf_cpu_ce_mean(&ce, tf_tensor_data(a->loss), a->loss->dtype);
  free(ce.row_loss);
  return TF_OK;
}

/* The engine's entry (model_kernels.h): f32 row losses and mean, the
 * gradient (scaled by 1 / rows) over the logits in place when asked. */
tf_status tf_cpu_lm_loss(tf_device_ctx *ctx, const tf_lm_loss_args *a) {
  (void)ctx;
  const tf_cpu_ce_rows ce = {.rows = a->rows, .cols = a->vocab, .d = a->dtype, .x = a->logits, .targets = a->targets,
                             .td = TF_I64, .stats = true, .row_loss = a->row_loss, .rd = TF_F32,
                             .dx = a->grad ? a->logits : NULL, .scale = 1.0 / (double)a->rows};
  tf_cpu_ce_rows_run(&ce);
  tf_cpu_ce_mean(&ce, a->loss, TF_F32);
  return TF_OK;
}
