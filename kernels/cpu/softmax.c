/* Row softmax on the CPU, one routine for the eager softmax / log_softmax
 * (backend.h) and the engine's causal softmax over attention scores
 * (model_kernels.h): the twin of softmax.cu. Rows are read as doubles
 * (elemio.h), reduced in column order and rounded once; rows run in
 * parallel, each by one thread. The causal form scales the scores first
 * and sees, in row r, only columns 0..r % cols, writing zeros past them; it
 * runs in place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

typedef struct tf_cpu_softmax_rows {
  int64_t rows, cols;
  tf_dtype d;
  bool log, causal;
  double scale;   /* causal: the scores' scale (else 1) */
  const void *x;  /* forward: x; backward: y */
  const void *dy; /* backward, or NULL for the forward pass */
  void *out;      /* y or dx; may be x or dy */
} tf_cpu_softmax_rows;

/* Max first, so that exp never overflows; softmax is exp(v - max) / sum,
 * as PyTorch computes it (each exponential once, kept in the thread's
 * scratch row e), log_softmax v - max - log(sum); an all -inf row gives
 * NaN, as in PyTorch. Each element of the row is read before it is
 * written. Row r. */
TF_CPU_INLINE void tf_cpu_softmax_row_forward(tf_dtype d, const tf_cpu_softmax_rows *a, int64_t r, double *e) {
  const int64_t cols = a->cols, base = r * cols, visible = a->causal ? r % cols + 1 : cols;
  double sum, m = tf_cpu_row_max_sumexp(a->x, d, base, visible, a->scale, a->log ? NULL : e, &sum);
  const double lsum = log(sum);
  for (int64_t c = 0; c < cols; c++) {
    double y = 0.0;
    if (c < visible)
      y = a->log ? a->scale * tf_elem_get(a->x, d, base + c) - m - lsum
                 : tf_cpu_row_exp(e, a->x, d, base, c, a->scale, m) / sum;
    tf_elem_set(a->out, d, base + c, y);
  }
}

static void tf_cpu_softmax_forward(const tf_cpu_softmax_rows *a) {
#pragma omp parallel if (a->rows * a->cols > TF_CPU_PARALLEL_MIN)
  {
    double *e = tf_cpu_exp_scratch(a->cols);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a->rows; r++) TF_CPU_WITH_DTYPE(a->d, tf_cpu_softmax_row_forward, a, r, e);
    free(e);
  }
}

/* softmax: dx = scale y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy). Row r. */
TF_CPU_INLINE void tf_cpu_softmax_row_backward(tf_dtype d, const tf_cpu_softmax_rows *a, int64_t r) {
  const int64_t cols = a->cols, base = r * cols, visible = a->causal ? r % cols + 1 : cols;
  double dot = 0;
  for (int64_t c = 0; c < visible; c++)
    dot += tf_elem_get(a->dy, d, base + c) * (a->log ? 1.0 : tf_elem_get(a->x, d, base + c));
  for (int64_t c = 0; c < cols; c++) {
    double dx = 0.0;
    if (c < visible) {
      double yv = tf_elem_get(a->x, d, base + c), g = tf_elem_get(a->dy, d, base + c);
      dx = a->log ? g - exp(yv) * dot : a->scale * yv * (g - dot);
    }
    tf_elem_set(a->out, d, base + c, dx);
  }
}

static void tf_cpu_softmax_backward(const tf_cpu_softmax_rows *a) {
#pragma omp parallel for schedule(static) if (a->rows * a->cols > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) TF_CPU_WITH_DTYPE(a->d, tf_cpu_softmax_row_backward, a, r);
}

/* The eager ops' entry (backend.h): dy says which pass. */
tf_status tf_cpu_softmax(tf_device_ctx *ctx, const tf_softmax_args *a) {
  (void)ctx;
  const tf_cpu_softmax_rows s = {.rows = a->rows, .cols = a->cols, .d = a->x->dtype, .log = a->log, .scale = 1.0,
                                 .x = tf_tensor_data(a->x), .dy = a->dy ? tf_tensor_data(a->dy) : NULL,
                                 .out = tf_tensor_data(a->out)};
  if (s.dy)
    tf_cpu_softmax_backward(&s);
  else
    tf_cpu_softmax_forward(&s);
  return TF_OK;
}

/* The engine's entry (model_kernels.h): in place over (batch seq, seq)
 * score rows; backward, s holds dp and becomes ds, p read beside it. */
tf_status tf_cpu_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *a) {
  (void)ctx;
  const tf_cpu_softmax_rows s = {.rows = a->batch * a->seq, .cols = a->seq, .d = a->dtype, .causal = true,
                                 .scale = a->scale, .x = a->backward ? a->p : a->s,
                                 .dy = a->backward ? a->s : NULL, .out = a->s};
  if (a->seq == 0) return TF_OK;
  if (a->backward)
    tf_cpu_softmax_backward(&s);
  else
    tf_cpu_softmax_forward(&s);
  return TF_OK;
}
