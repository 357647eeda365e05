/* What the nnops tests share: a seeded generator (TF_TEST_SEED repeats a
 * run), CPU tensors made from doubles and read back as doubles from any
 * device, an error norm, and the plain double-precision references of the
 * fused ops (written from their definitions, independently of the backends). */
#ifndef TF_TEST_NNREF_H
#define TF_TEST_NNREF_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "elemio.h"
#include "nnops.h"

#define SHAPE(...) ((tf_shape){(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}})
static const tf_shape SCALAR = {0, {0}}; /* 0-dim */

static const tf_dtype FLOAT_DTYPES[] = {TF_F32, TF_F64, TF_F16, TF_BF16};
enum { N_FLOAT_DTYPES = 4 };

/* ---- random numbers (splitmix64) -------------------------------------------- */

static uint64_t rng_state;

static inline uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline double rng_uniform(void) { return (double)(rng_next() >> 11) * 0x1p-53; }

static inline double rng_normal(void) {
  double u = rng_uniform(), v = rng_uniform();
  return sqrt(-2.0 * log(u > 0 ? u : 0x1p-53)) * cos(6.283185307179586 * v);
}

static inline int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo)); }

/* TF_TEST_SEED, or a fresh seed; printed so a failing run can be repeated. */
static inline uint64_t test_seed(void) {
  const char *env = getenv("TF_TEST_SEED");
  uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
  printf("seed %llu (TF_TEST_SEED=%llu repeats this run)\n", (unsigned long long)seed, (unsigned long long)seed);
  rng_state = seed;
  return seed;
}

/* ---- tensors ------------------------------------------------------------------ */

/* A CPU tensor of dtype d holding v (rounded as a conversion rounds). */
static inline tf_tensor *tensor_from(const double *v, tf_shape s, tf_dtype d) {
  tf_tensor *t = NULL;
  if (!CHECK_OK(tf_tensor_empty(&s, d, tf_cpu(), &t))) exit(1);
  int64_t n = tf_shape_numel(&s);
  for (int64_t i = 0; i < n; i++) tf_elem_set(tf_tensor_data(t), d, i, v[i]);
  return t;
}

static inline double *values_alloc(int64_t n) {
  double *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
  if (!v) exit(1);
  return v;
}

/* n normal values times scale, rounded to dtype d (so references see exactly
 * what the tensors hold). */
static inline double *random_values(int64_t n, tf_dtype d, double scale) {
  double *v = values_alloc(n);
  for (int64_t i = 0; i < n; i++) {
    double x = rng_normal() * scale;
    uint64_t buf = 0;
    tf_elem_set(&buf, d, 0, x);
    v[i] = tf_elem_get(&buf, d, 0);
  }
  return v;
}

static inline tf_tensor *tensor_randn(tf_shape s, tf_dtype d, double scale, double **values) {
  double *v = random_values(tf_shape_numel(&s), d, scale);
  tf_tensor *t = tensor_from(v, s, d);
  if (values)
    *values = v;
  else
    free(v);
  return t;
}

/* The values of any tensor, on any device, as doubles (malloc'd). */
static inline double *tensor_values(const tf_tensor *t) {
  tf_tensor *c = NULL;
  if (!CHECK_OK(tf_to(t, TF_F64, tf_cpu(), &c))) exit(1);
  int64_t n = tf_tensor_numel(c);
  double *v = values_alloc(n);
  if (n > 0) memcpy(v, tf_tensor_data(c), (size_t)n * sizeof *v);
  tf_tensor_release(c);
  return v;
}

/* max |a - b| / max |b| (normwise relative error; NaNs must match). */
static inline double rel_error(const double *a, const double *b, int64_t n) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) || isnan(b[i])) {
      if (isnan(a[i]) != isnan(b[i])) return INFINITY;
      continue;
    }
    if (isinf(a[i]) || isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    double d = fabs(a[i] - b[i]);
    if (d > worst) worst = d;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return worst / (scale > 0 ? scale : 1e-300);
}

/* Checks a tensor against reference values; prints the error when too big. */
static inline bool check_close(const char *what, const tf_tensor *t, const double *ref, double tol) {
  double *v = tensor_values(t);
  double e = rel_error(v, ref, tf_tensor_numel(t));
  free(v);
  if (!(e <= tol)) fprintf(stderr, "%s: relative error %.3g > %.3g\n", what, e, tol);
  return CHECK(e <= tol);
}

/* ---- references ---------------------------------------------------------------- */

static inline void ref_softmax(const double *x, int64_t rows, int64_t cols, bool log_, double *y) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * cols;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; c++) s += exp(xr[c] - m);
    for (int64_t c = 0; c < cols; c++) y[r * cols + c] = log_ ? xr[c] - m - log(s) : exp(xr[c] - m) / s;
  }
}

/* torch.nn.functional.layer_norm (biased variance); w, b may be NULL. */
static inline void ref_layer_norm(const double *x, int64_t rows, int64_t cols, const double *w, const double *b,
                                  double eps, double *y, double *mean, double *rstd) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * cols;
    double m = 0, v = 0;
    for (int64_t c = 0; c < cols; c++) m += xr[c];
    m /= (double)cols;
    for (int64_t c = 0; c < cols; c++) v += (xr[c] - m) * (xr[c] - m);
    double rs = 1.0 / sqrt(v / (double)cols + eps);
    for (int64_t c = 0; c < cols; c++) y[r * cols + c] = (xr[c] - m) * rs * (w ? w[c] : 1.0) + (b ? b[c] : 0.0);
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}

/* CS336's RMSNorm: x / sqrt(mean(x^2) + eps) * g. */
static inline void ref_rms_norm(const double *x, int64_t rows, int64_t cols, const double *g, double eps, double *y,
                         double *rstd) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * cols;
    double ss = 0;
    for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
    double rs = 1.0 / sqrt(ss / (double)cols + eps);
    for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * rs * (g ? g[c] : 1.0);
    if (rstd) rstd[r] = rs;
  }
}

/* Mean over rows of logsumexp(row) - row[target]. */
static inline double ref_cross_entropy(const double *x, int64_t rows, int64_t cols, const int64_t *targets,
                                       double *lse) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * cols;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; c++) s += exp(xr[c] - m);
    double l = m + log(s);
    if (lse) lse[r] = l;
    total += l - xr[targets[r]];
  }
  return total / (double)rows;
}

/* Interleaved pairs turned by pos * theta^(-2k/d) (minus that when inverse). */
static inline void ref_rope(const double *x, int64_t rows, int64_t cols, const int64_t *pos, int64_t seq, double theta,
                     bool inverse, double *y) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols / 2; k++) {
      double p = (double)(pos ? pos[r] : r % seq);
      double a = p * pow(theta, -2.0 * (double)k / (double)cols) * (inverse ? -1.0 : 1.0);
      double x0 = x[r * cols + 2 * k], x1 = x[r * cols + 2 * k + 1];
      y[r * cols + 2 * k] = x0 * cos(a) - x1 * sin(a);
      y[r * cols + 2 * k + 1] = x0 * sin(a) + x1 * cos(a);
    }
}

/* ---- finite differences -------------------------------------------------------- */

typedef double (*fd_loss_fn)(void *ud);

/* Central differences of loss() with respect to each of the n parameters
 * p[j] (which loss reads through ud), against the analytic gradient:
 * max |fd - grad| / max |grad|. */
static inline double fd_error(fd_loss_fn loss, void *ud, double *p, int64_t n, const double *grad) {
  double worst = 0, scale = 0;
  for (int64_t j = 0; j < n; j++) {
    double keep = p[j], h = 1e-6 * (fabs(keep) > 1 ? fabs(keep) : 1.0);
    p[j] = keep + h;
    double up = loss(ud);
    p[j] = keep - h;
    double down = loss(ud);
    p[j] = keep;
    double fd = (up - down) / (2 * h);
    if (fabs(fd - grad[j]) > worst) worst = fabs(fd - grad[j]);
    if (fabs(grad[j]) > scale) scale = fabs(grad[j]);
  }
  return worst / (scale > 0 ? scale : 1e-300);
}

/* sum(r * y), the scalar the gradient checks differentiate. */
static inline double dot_with(const tf_tensor *y, const double *r) {
  double *v = tensor_values(y);
  double s = 0;
  for (int64_t i = 0; i < tf_tensor_numel(y); i++) s += v[i] * r[i];
  free(v);
  return s;
}

#endif
