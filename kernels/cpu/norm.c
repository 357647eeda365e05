/* Row norms on the CPU, one routine for the eager layer_norm and rms_norm
 * (backend.h) and the engine's RMSNorm with the residual add in front
 * (model_kernels.h), forward and backward: the twin of norm.cu. As there,
 * x (and the residual's gradient dx) has dtype xd and y, dy, delta and dx's
 * low-precision copy have yd: the eager ops use one dtype, the engine an
 * f32 residual stream and its compute dtype. Every row is read as doubles
 * (elemio.h), reduced in double in column order and rounded once into each
 * output; rows run in parallel (each by one thread, so results do not
 * depend on the thread count). Weight gradients are column sums over rows
 * taken in row order. */
#include <math.h>
#include <stdlib.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

typedef struct tf_cpu_norm_rows {
  bool layer;
  int64_t rows, cols;
  double eps;
  tf_dtype xd, yd, wd, sd;  /* x and dx; y, dy, delta and dx_low; w, b, dw, db; mean and rstd */
  const void *x;
  const void *delta;        /* forward: added into x first (x_out = x + delta), or NULL */
  void *x_out;
  const void *w, *b;        /* (cols,) or NULL */
  void *y;                  /* forward */
  void *mean, *rstd;        /* written forward unless NULL, read backward */
  bool rstd_given;          /* forward (RMSNorm): rstd read, not computed */
  bool round_rstd;          /* forward: y from rstd rounded to f32 (the engine's statistics) */
  const void *dy;           /* backward */
  void *dx, *dx_low;        /* backward: either may be NULL */
  bool accumulate;          /* dx += (else dx =) */
  void *dw, *db;            /* backward: either may be NULL */
  bool add_w;               /* dw, db += (else =) */
} tf_cpu_norm_rows;

/* Element c of an optional weight vector (absent: 1, or 0 for a bias). */
TF_CPU_INLINE double tf_cpu_weight(const void *w, tf_dtype d, int64_t c, double absent) {
  return w ? tf_elem_get(w, d, c) : absent;
}

/* Calls fn(xd, yd, wd, sd, ...) with the four dtypes compile-time constants
 * for the engine's (an f32 stream, f32 gains and statistics, y in f32, bf16
 * or f16) and the eager ops' (one float dtype) combinations, as
 * TF_CPU_WITH_DTYPE does for one. */
#define TF_CPU_NORM_DTYPES(a, fn, ...)                                                            \
  do {                                                                                            \
    if ((a)->xd == TF_F32 && (a)->wd == TF_F32 && (a)->sd == TF_F32 && (a)->yd == TF_F32)         \
      fn(TF_F32, TF_F32, TF_F32, TF_F32, __VA_ARGS__);                                             \
    else if ((a)->xd == TF_F32 && (a)->wd == TF_F32 && (a)->sd == TF_F32 && (a)->yd == TF_BF16)   \
      fn(TF_F32, TF_BF16, TF_F32, TF_F32, __VA_ARGS__);                                            \
    else if ((a)->xd == TF_F32 && (a)->wd == TF_F32 && (a)->sd == TF_F32 && (a)->yd == TF_F16)    \
      fn(TF_F32, TF_F16, TF_F32, TF_F32, __VA_ARGS__);                                             \
    else if ((a)->xd == TF_BF16 && (a)->yd == TF_BF16 && (a)->wd == TF_BF16 && (a)->sd == TF_BF16) \
      fn(TF_BF16, TF_BF16, TF_BF16, TF_BF16, __VA_ARGS__);                                         \
    else if ((a)->xd == TF_F16 && (a)->yd == TF_F16 && (a)->wd == TF_F16 && (a)->sd == TF_F16)     \
      fn(TF_F16, TF_F16, TF_F16, TF_F16, __VA_ARGS__);                                             \
    else if ((a)->xd == TF_F64 && (a)->yd == TF_F64 && (a)->wd == TF_F64 && (a)->sd == TF_F64)     \
      fn(TF_F64, TF_F64, TF_F64, TF_F64, __VA_ARGS__);                                             \
    else                                                                                          \
      fn((a)->xd, (a)->yd, (a)->wd, (a)->sd, __VA_ARGS__);                                         \
  } while (0)

/* layer_norm: y = (x - mean) rstd w + b with the biased variance;
 * RMSNorm: y = (x rstd) w with rstd = 1 / sqrt(mean(x^2) + eps), x being
 * x + delta rounded to x's dtype when there is a delta. With round_rstd
 * (the engine's f32 statistics) y takes rstd rounded to f32, as stored and
 * as the GPU computes it, so that a pass given it (rstd_given) repeats y's
 * bits; the eager ops keep it in double. Row r. */
TF_CPU_INLINE void tf_cpu_norm_row_forward(tf_dtype xd, tf_dtype yd, tf_dtype wd, tf_dtype sd,
                                           const tf_cpu_norm_rows *a, int64_t r) {
  const int64_t cols = a->cols, base = r * cols;
  const void *x = a->x;
  if (a->delta) {
    for (int64_t c = 0; c < cols; c++)
      tf_elem_set(a->x_out, xd, base + c, tf_elem_get(x, xd, base + c) + tf_elem_get(a->delta, yd, base + c));
    x = a->x_out;
  }
  double mean = 0, sq = 0, rstd;
  if (a->rstd_given) {
    rstd = tf_elem_get(a->rstd, sd, r);
  } else {
    if (a->layer) {
      for (int64_t c = 0; c < cols; c++) mean += tf_elem_get(x, xd, base + c);
      mean /= (double)cols;
    }
    for (int64_t c = 0; c < cols; c++) {
      double v = tf_elem_get(x, xd, base + c) - mean;
      sq += v * v;
    }
    rstd = 1.0 / sqrt(sq / (double)cols + a->eps);
    if (a->round_rstd) rstd = (float)rstd;
  }
  for (int64_t c = 0; c < cols; c++) {
    double v = tf_elem_get(x, xd, base + c);
    double out = a->layer ? (v - mean) * rstd * tf_cpu_weight(a->w, wd, c, 1.0) + tf_cpu_weight(a->b, wd, c, 0.0)
                          : (v * rstd) * tf_cpu_weight(a->w, wd, c, 1.0);
    tf_elem_set(a->y, yd, base + c, out);
  }
  if (a->mean) tf_elem_set(a->mean, sd, r, mean);
  if (a->rstd && !a->rstd_given) tf_elem_set(a->rstd, sd, r, rstd);
}

static void tf_cpu_norm_rows_forward(const tf_cpu_norm_rows *a) {
#pragma omp parallel for schedule(static) if (a->rows * a->cols > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) TF_CPU_NORM_DTYPES(a, tf_cpu_norm_row_forward, a, r);
}

/* With xhat = (x - mean) rstd (layer) or x rstd (RMSNorm) and g = dy w:
 *   layer:   dx = rstd (g - mean(g) - xhat mean(g xhat))
 *   RMSNorm: dx = rstd (g - xhat mean(g xhat))
 * dw = sum over rows of dy xhat, db = sum over rows of dy. The saved mean
 * and rstd are used as given (as on the GPU); dx_low is dx as stored,
 * rounded again (as the GPU rounds its f32 value). dx of row r here. */
TF_CPU_INLINE void tf_cpu_norm_row_backward(tf_dtype xd, tf_dtype yd, tf_dtype wd, tf_dtype sd,
                                            const tf_cpu_norm_rows *a, int64_t r) {
  const int64_t cols = a->cols, base = r * cols;
  const double mean = a->layer ? tf_elem_get(a->mean, sd, r) : 0.0, rstd = tf_elem_get(a->rstd, sd, r);
  double sum_g = 0, sum_gx = 0;
  for (int64_t c = 0; c < cols; c++) {
    double g = tf_elem_get(a->dy, yd, base + c) * tf_cpu_weight(a->w, wd, c, 1.0);
    double xhat = (tf_elem_get(a->x, xd, base + c) - mean) * rstd;
    sum_g += g;
    sum_gx += g * xhat;
  }
  const double mg = a->layer ? sum_g / (double)cols : 0.0, mgx = sum_gx / (double)cols;
  for (int64_t c = 0; c < cols; c++) {
    double g = tf_elem_get(a->dy, yd, base + c) * tf_cpu_weight(a->w, wd, c, 1.0);
    double xhat = (tf_elem_get(a->x, xd, base + c) - mean) * rstd;
    double dx = rstd * (g - mg - xhat * mgx);
    if (a->accumulate) dx += tf_elem_get(a->dx, xd, base + c);
    tf_elem_set(a->dx, xd, base + c, dx);
    if (a->dx_low) tf_elem_set(a->dx_low, yd, base + c, tf_elem_get(a->dx, xd, base + c));
  }
}

/* Columns c0..c1 - 1 of the weight gradients' sums over the rows, in row order. */
TF_CPU_INLINE void tf_cpu_norm_cols_backward(tf_dtype xd, tf_dtype yd, tf_dtype wd, tf_dtype sd,
                                             const tf_cpu_norm_rows *a, int64_t c0, int64_t c1, double *aw,
                                             double *ab) {
  (void)wd;
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t base = r * a->cols;
    const double mean = a->layer ? tf_elem_get(a->mean, sd, r) : 0.0, rstd = tf_elem_get(a->rstd, sd, r);
    for (int64_t c = c0; c < c1; c++) {
      double g = tf_elem_get(a->dy, yd, base + c);
      aw[c] += g * (tf_elem_get(a->x, xd, base + c) - mean) * rstd;
      ab[c] += g;
    }
  }
}

/* dx by rows, then dw and db by slices of columns. */
static tf_status tf_cpu_norm_rows_backward(const tf_cpu_norm_rows *a) {
  const int64_t cols = a->cols;
  if (a->dx) {
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
    for (int64_t r = 0; r < a->rows; r++) TF_CPU_NORM_DTYPES(a, tf_cpu_norm_row_backward, a, r);
  }
  if (!a->dw && !a->db) return TF_OK;
  double *acc = calloc((size_t)cols * 2, sizeof *acc);
  if (!acc) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a norm's weight gradients");
  double *aw = acc, *ab = acc + cols;
  /* each column's sum over the rows in row order, a slice of columns a
   * thread: the bits of one thread (on one core this loop held back the
   * norms of a many-core machine) */
  enum { SLICE = 64 };
#pragma omp parallel for schedule(static) if (a->rows * cols > TF_CPU_PARALLEL_MIN)
  for (int64_t c0 = 0; c0 < cols; c0 += SLICE) {
    const int64_t c1 = c0 + SLICE < cols ? c0 + SLICE : cols;
    TF_CPU_NORM_DTYPES(a, tf_cpu_norm_cols_backward, a, c0, c1, aw, ab);
  }
  for (int64_t c = 0; c < cols; c++) {
    if (a->dw) tf_elem_set(a->dw, a->wd, c, (a->add_w ? tf_elem_get(a->dw, a->wd, c) : 0.0) + aw[c]);
    if (a->db) tf_elem_set(a->db, a->wd, c, (a->add_w ? tf_elem_get(a->db, a->wd, c) : 0.0) + ab[c]);
  }
  free(acc);
  return TF_OK;
}

/* The eager ops' entry (backend.h): both norms, both passes, one dtype. */
tf_status tf_cpu_norm(tf_device_ctx *ctx, const tf_norm_args *a) {
  (void)ctx;
  const tf_tensor *stat = a->rstd ? a->rstd : a->mean;
  tf_cpu_norm_rows n = {
      .layer = a->kind == TF_NORM_LAYER, .rows = a->rows, .cols = a->cols, .eps = a->eps,
      .xd = a->x->dtype, .yd = a->x->dtype,
      .wd = a->w ? a->w->dtype : a->dw ? a->dw->dtype : a->db ? a->db->dtype : a->x->dtype,
      .sd = stat ? stat->dtype : a->x->dtype,
      .x = tf_tensor_data(a->x),
      .w = a->w ? tf_tensor_data(a->w) : NULL, .b = a->b ? tf_tensor_data(a->b) : NULL,
      .mean = a->mean ? tf_tensor_data(a->mean) : NULL, .rstd = a->rstd ? tf_tensor_data(a->rstd) : NULL};
  if (!a->backward) {
    n.y = tf_tensor_data(a->y);
    tf_cpu_norm_rows_forward(&n);
    return TF_OK;
  }
  n.dy = tf_tensor_data(a->dy);
  n.dx = a->dx ? tf_tensor_data(a->dx) : NULL;
  n.dw = a->dw ? tf_tensor_data(a->dw) : NULL;
  n.db = a->db ? tf_tensor_data(a->db) : NULL;
  return tf_cpu_norm_rows_backward(&n);
}

/* The engine's entry (model_kernels.h): an f32 residual stream, h in the
 * compute dtype, the gain's gradient added to. */
tf_status tf_cpu_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  (void)ctx;
  tf_cpu_norm_rows n = {.rows = a->rows, .cols = a->dim, .eps = a->eps, .xd = TF_F32, .yd = a->dtype,
                        .wd = TF_F32, .sd = TF_F32, .x = a->x, .w = a->g, .rstd = a->rstd};
  if (!a->backward) {
    if (a->rstd_given && !a->rstd) return tf_fail(TF_ERR_ARG, "rmsnorm: rstd_given without rstd");
    n.delta = a->delta;
    n.x_out = a->x_out;
    n.y = a->h;
    n.rstd_given = a->rstd_given;
    n.round_rstd = a->rstd != NULL;
    tf_cpu_norm_rows_forward(&n);
    return TF_OK;
  }
  if (a->rstd_given) return tf_fail(TF_ERR_ARG, "rmsnorm: rstd_given is for the forward pass");
  n.dy = a->dh;
  n.dx = a->dres;
  n.dx_low = a->dres_low;
  n.accumulate = a->accumulate;
  n.dw = a->dg;
  n.add_w = true;
  return tf_cpu_norm_rows_backward(&n);
}
