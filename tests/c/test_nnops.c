/* The fused neural-network ops (nnops.h) and the comparison ops on the CPU
 * backend: each op against a plain double-precision reference on random
 * inputs of every float dtype it takes, each backward pass against central
 * differences in f64, AdamW against its formula over several steps, and
 * the argument errors (shapes, dtypes, out-of-range ids and targets). */
#include "backends.h"
#include "nnref.h"

/* Reference tolerance of an output of dtype d: its rounding, with room. */
static double tol_of(tf_dtype d) {
  switch (d) {
    case TF_F64: return 1e-12;
    case TF_F32: return 2e-6;
    case TF_F16: return 2e-3;
    default: return 1e-2;
  }
}

static const double FD_TOL = 1e-6;

/* ---- softmax ----------------------------------------------------------------- */

typedef struct {
  double *x, *r;
  tf_shape s;
  bool log;
} softmax_fd;

static double softmax_loss(void *ud) {
  softmax_fd *f = ud;
  tf_tensor *x = tensor_from(f->x, f->s, TF_F64), *y = NULL;
  CHECK_OK(tf_softmax(x, f->log, &y));
  double l = dot_with(y, f->r);
  tf_tensor_release(x);
  tf_tensor_release(y);
  return l;
}

static void test_softmax(void) {
  const tf_shape shapes[] = {SHAPE(3, 5), SHAPE(2, 3, 17), SHAPE(1, 1), SHAPE(4, 300)};
  for (int di = 0; di < N_FLOAT_DTYPES; di++)
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
      for (int log_ = 0; log_ < 2; log_++) {
        tf_dtype d = FLOAT_DTYPES[di];
        tf_shape s = shapes[si];
        int64_t n = tf_shape_numel(&s), cols = s.dims[s.ndim - 1];
        double *xv, *ref = values_alloc(n);
        tf_tensor *x = tensor_randn(s, d, 3.0, &xv), *y = NULL;
        ref_softmax(xv, n / cols, cols, log_, ref);
        if (CHECK_OK(tf_softmax(x, log_, &y))) {
          CHECK_INT(y->dtype, d);
          char what[64];
          snprintf(what, sizeof what, "%s %s shape %lld", log_ ? "log_softmax" : "softmax", tf_dtype_name(d),
                   (long long)n);
          check_close(what, y, ref, tol_of(d));
        }
        tf_tensor_release(x);
        tf_tensor_release(y);
        free(xv);
        free(ref);
      }

  /* a transposed (strided) input; masked entries; an all -inf row is NaN */
  double xv[12] = {1, 2, 3, 4, -INFINITY, 0.5, -INFINITY, 7, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  tf_tensor *x = tensor_from(xv, SHAPE(4, 3), TF_F32), *xt = NULL, *y = NULL;
  CHECK_OK(tf_transpose(x, 0, 1, &xt));
  if (CHECK_OK(tf_softmax(xt, false, &y))) {
    double t[12], ref[12];
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 3; j++) t[j * 4 + i] = xv[i * 3 + j];
    ref_softmax(t, 3, 4, false, ref);
    double *v = tensor_values(y);
    CHECK(rel_error(v, ref, 12) < 1e-6);
    free(v);
  }
  tf_tensor_release(y);
  if (CHECK_OK(tf_softmax(x, false, &y))) {
    double *v = tensor_values(y);
    CHECK_NEAR(v[3], exp(4 - 4) / (1 + exp(0.5 - 4)), 1e-6);
    CHECK_NEAR(v[4], 0.0, 0.0);
    CHECK_NEAR(v[6], 0.0, 0.0);
    CHECK_NEAR(v[7], 1.0, 0.0);
    CHECK(isnan(v[9]) && isnan(v[10]) && isnan(v[11]));
    free(v);
  }
  tf_tensor_release(y);
  tf_tensor_release(xt);
  tf_tensor_release(x);

  /* an empty tensor gives an empty result */
  tf_tensor *e = NULL, *ey = NULL;
  CHECK_OK(tf_tensor_empty(&SHAPE(0, 5), TF_F32, tf_cpu(), &e));
  if (CHECK_OK(tf_softmax(e, true, &ey))) CHECK_INT(tf_tensor_numel(ey), 0);
  tf_tensor_release(e);
  tf_tensor_release(ey);

  /* backward against central differences */
  for (int log_ = 0; log_ < 2; log_++) {
    softmax_fd f = {.s = SHAPE(3, 7), .log = log_};
    tf_tensor *xx = tensor_randn(f.s, TF_F64, 2.0, &f.x), *rr = tensor_randn(f.s, TF_F64, 1.0, &f.r);
    tf_tensor *yy = NULL, *dx = NULL;
    CHECK_OK(tf_softmax(xx, log_, &yy));
    if (CHECK_OK(tf_softmax_backward(yy, rr, log_, &dx))) {
      double *g = tensor_values(dx);
      double e2 = fd_error(softmax_loss, &f, f.x, 21, g);
      if (!(e2 < FD_TOL)) fprintf(stderr, "softmax (log %d) gradient error %g\n", log_, e2);
      CHECK(e2 < FD_TOL);
      free(g);
    }
    tf_tensor_release(xx), tf_tensor_release(rr), tf_tensor_release(yy), tf_tensor_release(dx);
    free(f.x), free(f.r);
  }
}

/* ---- layer_norm and rms_norm ------------------------------------------------- */

typedef struct {
  double *x, *w, *b, *r;
  int64_t rows, cols;
  bool rms;
} norm_fd;

static double norm_loss(void *ud) {
  norm_fd *f = ud;
  tf_tensor *x = tensor_from(f->x, SHAPE(f->rows, f->cols), TF_F64);
  tf_tensor *w = tensor_from(f->w, SHAPE(f->cols), TF_F64), *b = tensor_from(f->b, SHAPE(f->cols), TF_F64);
  tf_tensor *y = NULL;
  if (f->rms)
    CHECK_OK(tf_rms_norm(x, w, 1e-5, &y, NULL));
  else
    CHECK_OK(tf_layer_norm(x, w, b, 1e-5, &y, NULL, NULL));
  double l = dot_with(y, f->r);
  tf_tensor_release(x), tf_tensor_release(w), tf_tensor_release(b), tf_tensor_release(y);
  return l;
}

static void test_norms(void) {
  const double eps = 1e-5;
  for (int di = 0; di < N_FLOAT_DTYPES; di++)
    for (int variant = 0; variant < 3; variant++) { /* weights: none, x's dtype, f32 */
      tf_dtype d = FLOAT_DTYPES[di], wd = variant == 2 ? TF_F32 : d;
      int64_t rows = 6, cols = 40;
      double *xv, *wv = NULL, *bv = NULL;
      tf_tensor *x = tensor_randn(SHAPE(2, 3, cols), d, 2.0, &xv), *w = NULL, *b = NULL;
      if (variant > 0) {
        w = tensor_randn(SHAPE(cols), wd, 1.0, &wv);
        b = tensor_randn(SHAPE(cols), wd, 1.0, &bv);
      }
      double *ref = values_alloc(rows * cols), *mref = values_alloc(rows), *rref = values_alloc(rows);
      tf_tensor *y = NULL, *mean = NULL, *rstd = NULL;
      ref_layer_norm(xv, rows, cols, wv, bv, eps, ref, mref, rref);
      if (CHECK_OK(tf_layer_norm(x, w, b, eps, &y, &mean, &rstd))) {
        CHECK_INT(y->dtype, d);
        CHECK_INT(mean->dtype, d == TF_F64 ? TF_F64 : TF_F32);
        CHECK_INT(mean->ndim, 2);
        check_close("layer_norm y", y, ref, tol_of(d));
        check_close("layer_norm mean", mean, mref, d == TF_F64 ? 1e-12 : 1e-6);
        check_close("layer_norm rstd", rstd, rref, d == TF_F64 ? 1e-12 : 1e-6);
      }
      tf_tensor_release(y), tf_tensor_release(mean), tf_tensor_release(rstd);
      y = rstd = NULL;
      ref_rms_norm(xv, rows, cols, wv, eps, ref, rref);
      if (CHECK_OK(tf_rms_norm(x, w, eps, &y, &rstd))) {
        CHECK_INT(y->dtype, d);
        check_close("rms_norm y", y, ref, tol_of(d));
        check_close("rms_norm rstd", rstd, rref, d == TF_F64 ? 1e-12 : 1e-6);
      }
      tf_tensor_release(y), tf_tensor_release(rstd);
      /* the backward passes run for every dtype; dw keeps w's dtype */
      tf_tensor *dy = tensor_randn(SHAPE(2, 3, cols), d, 1.0, NULL), *dx = NULL, *dw = NULL, *db = NULL;
      y = mean = rstd = NULL;
      CHECK_OK(tf_layer_norm(x, w, b, eps, &y, &mean, &rstd));
      if (CHECK_OK(tf_layer_norm_backward(dy, x, w, mean, rstd, &dx, w ? &dw : NULL, &db))) {
        CHECK_INT(dx->dtype, d);
        if (w) CHECK_INT(dw->dtype, wd);
        CHECK_INT(db->ndim, 1);
      }
      tf_tensor_release(dx), tf_tensor_release(dw), tf_tensor_release(db);
      tf_tensor_release(y), tf_tensor_release(mean), tf_tensor_release(rstd);
      tf_tensor_release(dy), tf_tensor_release(x), tf_tensor_release(w), tf_tensor_release(b);
      free(xv), free(wv), free(bv), free(ref), free(mref), free(rref);
    }

  /* gradients of x, w and b against central differences (f64) */
  for (int rms = 0; rms < 2; rms++) {
    norm_fd f = {.rows = 4, .cols = 6, .rms = rms};
    tf_tensor *x = tensor_randn(SHAPE(4, 6), TF_F64, 2.0, &f.x), *w = tensor_randn(SHAPE(6), TF_F64, 1.0, &f.w);
    tf_tensor *b = tensor_randn(SHAPE(6), TF_F64, 1.0, &f.b), *r = tensor_randn(SHAPE(4, 6), TF_F64, 1.0, &f.r);
    for (int i = 0; i < 6; i++) f.x[i] += 3.0; /* a row with a large mean */
    tf_tensor_release(x);
    x = tensor_from(f.x, SHAPE(4, 6), TF_F64);
    tf_tensor *y = NULL, *mean = NULL, *rstd = NULL, *dx = NULL, *dw = NULL, *db = NULL;
    bool ok;
    if (rms)
      ok = CHECK_OK(tf_rms_norm(x, w, eps, &y, &rstd)) &&
           CHECK_OK(tf_rms_norm_backward(r, x, w, rstd, &dx, &dw));
    else
      ok = CHECK_OK(tf_layer_norm(x, w, b, eps, &y, &mean, &rstd)) &&
           CHECK_OK(tf_layer_norm_backward(r, x, w, mean, rstd, &dx, &dw, &db));
    if (ok) {
      double *gx = tensor_values(dx), *gw = tensor_values(dw);
      double ex = fd_error(norm_loss, &f, f.x, 24, gx), ew = fd_error(norm_loss, &f, f.w, 6, gw);
      if (!(ex < FD_TOL && ew < FD_TOL)) fprintf(stderr, "norm (rms %d) gradient errors %g %g\n", rms, ex, ew);
      CHECK(ex < FD_TOL);
      CHECK(ew < FD_TOL);
      if (!rms) {
        double *gb = tensor_values(db);
        double eb = fd_error(norm_loss, &f, f.b, 6, gb);
        if (!(eb < FD_TOL)) fprintf(stderr, "layer_norm db error %g\n", eb);
        CHECK(eb < FD_TOL);
        free(gb);
      }
      free(gx), free(gw);
    }
    tf_tensor *to_free[] = {x, w, b, r, y, mean, rstd, dx, dw, db};
    for (size_t i = 0; i < sizeof to_free / sizeof to_free[0]; i++) tf_tensor_release(to_free[i]);
    free(f.x), free(f.w), free(f.b), free(f.r);
  }

  /* no weights: dx only, db without w, dw without w is an error */
  tf_tensor *x = tensor_randn(SHAPE(3, 8), TF_F32, 1.0, NULL), *dy = tensor_randn(SHAPE(3, 8), TF_F32, 1.0, NULL);
  tf_tensor *y = NULL, *mean = NULL, *rstd = NULL, *dx = NULL, *db = NULL, *dw = NULL;
  CHECK_OK(tf_layer_norm(x, NULL, NULL, eps, &y, &mean, &rstd));
  CHECK_OK(tf_layer_norm_backward(dy, x, NULL, mean, rstd, &dx, NULL, &db));
  CHECK_INT(tf_layer_norm_backward(dy, x, NULL, mean, rstd, NULL, &dw, NULL), TF_ERR_ARG);
  if (db) {
    double *dyv = tensor_values(dy), *dbv = tensor_values(db), want[8] = {0};
    for (int i = 0; i < 24; i++) want[i % 8] += dyv[i];
    CHECK(rel_error(dbv, want, 8) < 1e-6);
    free(dyv), free(dbv);
  }
  tf_tensor *to_free[] = {x, dy, y, mean, rstd, dx, db};
  for (size_t i = 0; i < sizeof to_free / sizeof to_free[0]; i++) tf_tensor_release(to_free[i]);
}

/* ---- cross_entropy ------------------------------------------------------------- */

typedef struct {
  double *x;
  int64_t *t;
  int64_t rows, cols;
} ce_fd;

static double ce_loss(void *ud) {
  ce_fd *f = ud;
  tf_tensor *x = tensor_from(f->x, SHAPE(f->rows, f->cols), TF_F64), *t = NULL, *loss = NULL;
  tf_tensor_empty(&SHAPE(f->rows), TF_I64, tf_cpu(), &t);
  memcpy(tf_tensor_data(t), f->t, (size_t)f->rows * sizeof(int64_t));
  CHECK_OK(tf_cross_entropy(x, t, &loss, NULL));
  double *v = tensor_values(loss), l = v[0] * 0.7; /* dloss = 0.7 */
  free(v);
  tf_tensor_release(x), tf_tensor_release(t), tf_tensor_release(loss);
  return l;
}

static tf_tensor *index_tensor(const int64_t *v, tf_shape s, tf_dtype d) {
  int64_t n = tf_shape_numel(&s);
  double *dv = values_alloc(n);
  for (int64_t i = 0; i < n; i++) dv[i] = (double)v[i];
  tf_tensor *t = tensor_from(dv, s, d);
  free(dv);
  return t;
}

static void test_cross_entropy(void) {
  for (int di = 0; di < N_FLOAT_DTYPES; di++)
    for (int ti = 0; ti < 2; ti++) {
      tf_dtype d = FLOAT_DTYPES[di];
      int64_t rows = 6, cols = 33, targets[6];
      for (int i = 0; i < 6; i++) targets[i] = rng_int(0, cols);
      double *xv, lse_ref[6];
      tf_tensor *x = tensor_randn(SHAPE(2, 3, cols), d, 3.0, &xv);
      tf_tensor *t = index_tensor(targets, SHAPE(2, 3), ti ? TF_I64 : TF_I32), *loss = NULL, *lse = NULL;
      double want = ref_cross_entropy(xv, rows, cols, targets, lse_ref);
      if (CHECK_OK(tf_cross_entropy(x, t, &loss, &lse))) {
        CHECK_INT(loss->ndim, 0);
        CHECK_INT(loss->dtype, d);
        check_close("cross_entropy loss", loss, &want, tol_of(d));
        check_close("cross_entropy lse", lse, lse_ref, d == TF_F64 ? 1e-12 : 1e-6);
        /* dlogits = (softmax - onehot) * dloss / N */
        tf_tensor *dloss = NULL, *dx = NULL;
        CHECK_OK(tf_full(&SCALAR, 0.5, TF_F32, tf_cpu(), &dloss));
        if (CHECK_OK(tf_cross_entropy_backward(x, t, lse, dloss, &dx))) {
          double *p = values_alloc(rows * cols);
          ref_softmax(xv, rows, cols, false, p);
          for (int64_t r = 0; r < rows; r++) {
            p[r * cols + targets[r]] -= 1.0;
            for (int64_t c = 0; c < cols; c++) p[r * cols + c] *= 0.5 / (double)rows;
          }
          check_close("cross_entropy dlogits", dx, p, tol_of(d));
          free(p);
        }
        tf_tensor_release(dloss), tf_tensor_release(dx);
      }
      tf_tensor_release(x), tf_tensor_release(t), tf_tensor_release(loss), tf_tensor_release(lse);
      free(xv);
    }

  /* gradient against central differences */
  ce_fd f = {.rows = 4, .cols = 9};
  int64_t tv[4] = {0, 8, 3, 3};
  f.t = tv;
  tf_tensor *x = tensor_randn(SHAPE(4, 9), TF_F64, 2.0, &f.x), *t = index_tensor(tv, SHAPE(4), TF_I64);
  tf_tensor *loss = NULL, *lse = NULL, *dloss = NULL, *dx = NULL;
  CHECK_OK(tf_full(&SCALAR, 0.7, TF_F64, tf_cpu(), &dloss));
  if (CHECK_OK(tf_cross_entropy(x, t, &loss, &lse)) && CHECK_OK(tf_cross_entropy_backward(x, t, lse, dloss, &dx))) {
    double *g = tensor_values(dx);
    double e = fd_error(ce_loss, &f, f.x, 36, g);
    if (!(e < FD_TOL)) fprintf(stderr, "cross_entropy gradient error %g\n", e);
    CHECK(e < FD_TOL);
    free(g);
  }
  tf_tensor_release(x), tf_tensor_release(t), tf_tensor_release(loss), tf_tensor_release(lse);
  tf_tensor_release(dloss), tf_tensor_release(dx);
  free(f.x);

  /* no rows: NaN, as torch */
  tf_tensor *ex = NULL, *et = NULL, *el = NULL;
  CHECK_OK(tf_tensor_empty(&SHAPE(0, 4), TF_F32, tf_cpu(), &ex));
  CHECK_OK(tf_tensor_empty(&SHAPE(0), TF_I64, tf_cpu(), &et));
  if (CHECK_OK(tf_cross_entropy(ex, et, &el, NULL))) CHECK(isnan(((float *)tf_tensor_data(el))[0]));
  tf_tensor_release(ex), tf_tensor_release(et), tf_tensor_release(el);
}

/* ---- rope ------------------------------------------------------------------------ */

typedef struct {
  double *x, *r;
  tf_shape s;
} rope_fd;

static double rope_loss(void *ud) {
  rope_fd *f = ud;
  tf_tensor *x = tensor_from(f->x, f->s, TF_F64), *y = NULL;
  CHECK_OK(tf_rope(x, NULL, 10000.0, false, &y));
  double l = dot_with(y, f->r);
  tf_tensor_release(x), tf_tensor_release(y);
  return l;
}

static void test_rope(void) {
  const int64_t B = 2, H = 3, T = 5, D = 8;
  for (int di = 0; di < N_FLOAT_DTYPES; di++)
    for (int mode = 0; mode < 3; mode++) { /* default positions; positions (T) broadcast; inverse */
      tf_dtype d = FLOAT_DTYPES[di];
      int64_t rows = B * H * T, pos_rows[2 * 3 * 5], pos_t[5] = {7, 0, 3, 1000, 12345};
      for (int64_t r = 0; r < rows; r++) pos_rows[r] = mode == 1 ? pos_t[r % T] : r % T;
      double *xv, *ref = values_alloc(rows * D);
      tf_tensor *x = tensor_randn(SHAPE(B, H, T, D), d, 1.0, &xv), *pos = NULL, *y = NULL;
      if (mode == 1) pos = index_tensor(pos_t, SHAPE(T), TF_I32);
      ref_rope(xv, rows, D, pos_rows, T, 10000.0, mode == 2, ref);
      if (CHECK_OK(tf_rope(x, pos, 10000.0, mode == 2, &y))) {
        CHECK_INT(y->dtype, d);
        check_close("rope", y, ref, d == TF_F64 ? 1e-12 : d == TF_F32 ? 1e-6 : tol_of(d));
      }
      tf_tensor_release(x), tf_tensor_release(pos), tf_tensor_release(y);
      free(xv), free(ref);
    }

  /* positions of shape (B, 1, T) broadcast over heads; the inverse undoes the rotation */
  int64_t pv[2 * 5];
  for (int i = 0; i < 10; i++) pv[i] = rng_int(0, 4096);
  tf_tensor *x = tensor_randn(SHAPE(B, H, T, D), TF_F64, 1.0, NULL), *pos = index_tensor(pv, SHAPE(B, 1, T), TF_I64);
  tf_tensor *y = NULL, *back = NULL;
  if (CHECK_OK(tf_rope(x, pos, 500.0, false, &y)) && CHECK_OK(tf_rope(y, pos, 500.0, true, &back))) {
    double *a = tensor_values(x), *b = tensor_values(back);
    CHECK(rel_error(b, a, B * H * T * D) < 1e-13);
    free(a), free(b);
  }
  tf_tensor_release(x), tf_tensor_release(pos), tf_tensor_release(y), tf_tensor_release(back);

  /* the backward pass (the inverse rotation of dy) against central differences */
  rope_fd f = {.s = SHAPE(3, 6)};
  tf_tensor *xx = tensor_randn(f.s, TF_F64, 1.0, &f.x), *rr = tensor_randn(f.s, TF_F64, 1.0, &f.r), *dx = NULL;
  if (CHECK_OK(tf_rope(rr, NULL, 10000.0, true, &dx))) {
    double *g = tensor_values(dx);
    double e = fd_error(rope_loss, &f, f.x, 18, g);
    if (!(e < FD_TOL)) fprintf(stderr, "rope gradient error %g\n", e);
    CHECK(e < FD_TOL);
    free(g);
  }
  tf_tensor_release(xx), tf_tensor_release(rr), tf_tensor_release(dx);
  free(f.x), free(f.r);
}

/* ---- embedding ------------------------------------------------------------------ */

static void test_embedding(void) {
  const int64_t V = 7, D = 5;
  int64_t ids[2 * 4] = {3, 1, 3, 3, 0, 1, 6, 3}; /* 2, 4 and 5 unused; 3 four times */
  for (int wi = 0; wi < 3; wi++) {
    tf_dtype wd = wi == 0 ? TF_F32 : wi == 1 ? TF_BF16 : TF_I64;
    double *wv;
    tf_tensor *w = tensor_randn(SHAPE(V, D), wd, 10.0, &wv), *idt = index_tensor(ids, SHAPE(2, 4), TF_I32);
    tf_tensor *out = NULL;
    if (CHECK_OK(tf_embedding(w, idt, &out))) {
      CHECK_INT(out->ndim, 3);
      CHECK_INT(out->shape[2], D);
      CHECK_INT(out->dtype, wd);
      double *ref = values_alloc(8 * D);
      for (int i = 0; i < 8; i++)
        for (int c = 0; c < D; c++) ref[i * D + c] = wv[ids[i] * D + c];
      check_close("embedding", out, ref, 0.0);
      free(ref);
    }
    tf_tensor_release(w), tf_tensor_release(idt), tf_tensor_release(out);
    free(wv);
  }

  /* backward: sums per id in position order; unused rows zero; any float dtype out */
  for (int di = 0; di < N_FLOAT_DTYPES; di++) {
    tf_dtype d = FLOAT_DTYPES[di];
    double *gv;
    tf_tensor *g = tensor_randn(SHAPE(2, 4, D), d, 1.0, &gv), *idt = index_tensor(ids, SHAPE(2, 4), TF_I64);
    tf_tensor *dw = NULL;
    if (CHECK_OK(tf_embedding_backward(g, idt, V, d, &dw))) {
      CHECK_INT(dw->dtype, d);
      CHECK_INT(dw->shape[0], V);
      double *ref = values_alloc(V * D);
      for (int i = 0; i < 8; i++)
        for (int c = 0; c < D; c++) ref[ids[i] * D + c] += gv[i * D + c];
      check_close("embedding_backward", dw, ref, tol_of(d));
      double *v = tensor_values(dw);
      for (int c = 0; c < D; c++) CHECK(v[2 * D + c] == 0 && v[4 * D + c] == 0 && v[5 * D + c] == 0);
      free(v), free(ref);
    }
    tf_tensor_release(g), tf_tensor_release(idt), tf_tensor_release(dw);
    free(gv);
  }
}

/* ---- masked_fill ------------------------------------------------------------------ */

static void test_masked_fill(void) {
  const tf_dtype dtypes[] = {TF_F32, TF_BF16, TF_I32, TF_BOOL, TF_F64};
  double mv[4] = {1, 0, 0, 1};
  tf_tensor *mask = tensor_from(mv, SHAPE(4, 1), TF_BOOL); /* broadcast along the last dim */
  for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
    tf_dtype d = dtypes[di];
    double *xv;
    tf_tensor *x = tensor_randn(SHAPE(3, 4, 5), d, 4.0, &xv), *out = NULL;
    double value = d == TF_BOOL ? 1.0 : d == TF_I32 ? -7.9 : -INFINITY;
    double filled = d == TF_BOOL ? 1.0 : d == TF_I32 ? -7.0 : -INFINITY;
    if (CHECK_OK(tf_masked_fill(x, mask, value, &out))) {
      CHECK_INT(out->dtype, d);
      double *v = tensor_values(out);
      int bad = 0;
      for (int i = 0; i < 60; i++) {
        bool m = mv[(i / 5) % 4] != 0;
        bad += m ? v[i] != filled : v[i] != xv[i];
      }
      CHECK_INT(bad, 0);
      free(v);
    }
    tf_tensor_release(x), tf_tensor_release(out);
    free(xv);
  }
  /* a transposed x */
  double *xv;
  tf_tensor *x = tensor_randn(SHAPE(4, 4), TF_F32, 1.0, &xv), *xt = NULL, *out = NULL;
  CHECK_OK(tf_transpose(x, 0, 1, &xt));
  if (CHECK_OK(tf_masked_fill(xt, mask, 2.5, &out))) {
    double *v = tensor_values(out);
    int bad = 0;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) bad += v[i * 4 + j] != (mv[i] != 0 ? 2.5 : xv[j * 4 + i]);
    CHECK_INT(bad, 0);
    free(v);
  }
  tf_tensor_release(x), tf_tensor_release(xt), tf_tensor_release(out), tf_tensor_release(mask);
  free(xv);
}

/* ---- adamw ----------------------------------------------------------------------- */

/* With the low-precision copy: p, m, v as the plain step gives them, and the
 * copy bit for bit what converting the new p's prefix gives. */
static void test_adamw_with_low(void) {
  const int64_t n = 41, nl = 29, one = 1;
  tf_adamw_args a = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = 3};
  for (int li = 0; li < 2; li++) {
    const tf_dtype ld = li ? TF_F16 : TF_BF16;
    double *pv, *gv;
    tf_tensor *p = tensor_randn(SHAPE(n), TF_F32, 1.0, &pv), *g = tensor_randn(SHAPE(n), TF_F32, 1.0, &gv);
    tf_tensor *p2 = NULL, *m = NULL, *v = NULL, *m2 = NULL, *v2 = NULL, *low = NULL, *conv = NULL, *prefix = NULL;
    CHECK_OK(tf_full(&SHAPE(n), 0.0, TF_F32, tf_cpu(), &p2));
    CHECK_OK(tf_copy_into(p2, p));
    CHECK_OK(tf_full(&SHAPE(n), 0.1, TF_F32, tf_cpu(), &m));
    CHECK_OK(tf_full(&SHAPE(n), 0.2, TF_F32, tf_cpu(), &v));
    CHECK_OK(tf_full(&SHAPE(n), 0.1, TF_F32, tf_cpu(), &m2));
    CHECK_OK(tf_full(&SHAPE(n), 0.2, TF_F32, tf_cpu(), &v2));
    CHECK_OK(tf_full(&SHAPE(nl), 0.0, ld, tf_cpu(), &low));
    CHECK_OK(tf_adamw_step_with_low(p, g, m, v, low, &a));
    CHECK_OK(tf_adamw_step(p2, g, m2, v2, &a));
    float x[41], y[41];
    CHECK_OK(tf_tensor_read(p, x, sizeof x));
    CHECK_OK(tf_tensor_read(p2, y, sizeof y));
    CHECK(memcmp(x, y, sizeof x) == 0);
    tf_shape s = {1, {nl}};
    CHECK_OK(tf_tensor_view(p, &s, &one, 0, &prefix));
    CHECK_OK(tf_full(&s, 0.0, ld, tf_cpu(), &conv));
    CHECK_OK(tf_copy_into(conv, prefix));
    uint16_t lb[29], cb[29];
    CHECK_OK(tf_tensor_read(low, lb, sizeof lb));
    CHECK_OK(tf_tensor_read(conv, cb, sizeof cb));
    CHECK(memcmp(lb, cb, sizeof lb) == 0);
    CHECK(tf_adamw_step_with_low(p, g, m, v, m2, &a) == TF_ERR_ARG); /* an f32 copy */
    tf_tensor *released[] = {p, g, p2, m, v, m2, v2, low, conv, prefix};
    for (size_t i = 0; i < sizeof released / sizeof released[0]; i++) tf_tensor_release(released[i]);
    free(pv), free(gv);
  }
}

static void test_adamw(void) {
  const tf_adamw_args base = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  const tf_dtype pdts[] = {TF_F32, TF_F64}, gdts[] = {TF_F32, TF_BF16, TF_F64};
  for (int pi = 0; pi < 2; pi++)
    for (int gi = 0; gi < 3; gi++) {
      tf_dtype pd = pdts[pi], gd = gdts[gi];
      const int64_t n = 37;
      double *pv, *mv = values_alloc(n), *vv = values_alloc(n);
      tf_tensor *p = tensor_randn(SHAPE(n), pd, 1.0, &pv), *m = NULL, *v = NULL;
      CHECK_OK(tf_full(&SHAPE(n), 0.0, pd, tf_cpu(), &m));
      CHECK_OK(tf_full(&SHAPE(n), 0.0, pd, tf_cpu(), &v));
      for (int64_t step = 1; step <= 5; step++) {
        double *gv;
        tf_tensor *g = tensor_randn(SHAPE(n), gd, 1.0, &gv);
        tf_adamw_args a = base;
        a.step = step;
        CHECK_OK(tf_adamw_step(p, g, m, v, &a));
        for (int64_t i = 0; i < n; i++) { /* torch.optim.AdamW, written out */
          pv[i] -= a.lr * a.weight_decay * pv[i];
          mv[i] = a.beta1 * mv[i] + (1 - a.beta1) * gv[i];
          vv[i] = a.beta2 * vv[i] + (1 - a.beta2) * gv[i] * gv[i];
          double mhat = mv[i] / (1 - pow(a.beta1, (double)step)), vhat = vv[i] / (1 - pow(a.beta2, (double)step));
          pv[i] -= a.lr * mhat / (sqrt(vhat) + a.eps);
        }
        tf_tensor_release(g);
        free(gv);
      }
      double tol = pd == TF_F64 ? 1e-12 : 2e-6;
      check_close("adamw p", p, pv, tol);
      check_close("adamw m", m, mv, tol);
      check_close("adamw v", v, vv, tol);
      tf_tensor_release(p), tf_tensor_release(m), tf_tensor_release(v);
      free(pv), free(mv), free(vv);
    }
}

/* ---- comparisons and classification ----------------------------------------------- */

static void test_compare(void) {
  double av[6] = {1, 2, NAN, -INFINITY, 5, 0}, bv[6] = {1, 3, NAN, -INFINITY, 4, -0.0};
  tf_tensor *a = tensor_from(av, SHAPE(6), TF_F32), *b = tensor_from(bv, SHAPE(6), TF_F32);
  const tf_binary_op ops[] = {TF_OP_EQ, TF_OP_NE, TF_OP_LT, TF_OP_LE, TF_OP_GT, TF_OP_GE};
  const int want[6][6] = {{1, 0, 0, 1, 0, 1}, {0, 1, 1, 0, 1, 0}, {0, 1, 0, 0, 0, 0},
                          {1, 1, 0, 1, 0, 1}, {0, 0, 0, 0, 1, 0}, {1, 0, 0, 1, 1, 1}};
  for (int k = 0; k < 6; k++) {
    tf_tensor *out = NULL;
    if (CHECK_OK(tf_binary(ops[k], a, b, &out))) {
      CHECK_INT(out->dtype, TF_BOOL);
      const uint8_t *o = tf_tensor_data(out);
      for (int i = 0; i < 6; i++) CHECK_INT(o[i], want[k][i]);
    }
    tf_tensor_release(out);
  }
  /* promotion: i32 against f64, and a broadcast row; scalars on either side */
  double iv[3] = {1, 2, 3}, fv[6] = {1.5, 2, 2.5, 0, 3, 9};
  tf_tensor *ia = tensor_from(iv, SHAPE(3), TF_I32), *fb = tensor_from(fv, SHAPE(2, 3), TF_F64), *out = NULL;
  if (CHECK_OK(tf_binary(TF_OP_LT, ia, fb, &out))) {
    CHECK_INT(out->ndim, 2);
    const uint8_t *o = tf_tensor_data(out);
    const int w[6] = {1, 0, 0, 0, 1, 1};
    for (int i = 0; i < 6; i++) CHECK_INT(o[i], w[i]);
  }
  tf_tensor_release(out);
  out = NULL;
  if (CHECK_OK(tf_binary_scalar(TF_OP_GE, ia, (tf_scalar){2.5, true}, TF_SCALAR_RIGHT, &out))) {
    const uint8_t *o = tf_tensor_data(out);
    CHECK(o[0] == 0 && o[1] == 0 && o[2] == 1);
  }
  tf_tensor_release(out);
  out = NULL;
  if (CHECK_OK(tf_binary_scalar(TF_OP_GT, ia, (tf_scalar){2, false}, TF_SCALAR_LEFT, &out))) {
    const uint8_t *o = tf_tensor_data(out); /* 2 > x */
    CHECK(o[0] == 1 && o[1] == 0 && o[2] == 0);
  }
  tf_tensor_release(out);
  out = NULL;
  /* isnan / isfinite on floats and integers; bool inputs are refused */
  for (int di = 0; di < N_FLOAT_DTYPES; di++) {
    tf_tensor *x = tensor_from(av, SHAPE(6), FLOAT_DTYPES[di]), *isn = NULL, *isf = NULL;
    if (CHECK_OK(tf_unary(TF_OP_ISNAN, x, &isn)) && CHECK_OK(tf_unary(TF_OP_ISFINITE, x, &isf))) {
      CHECK_INT(isn->dtype, TF_BOOL);
      const uint8_t *n = tf_tensor_data(isn), *f = tf_tensor_data(isf);
      for (int i = 0; i < 6; i++) {
        CHECK_INT(n[i], isnan(av[i]) ? 1 : 0);
        CHECK_INT(f[i], isfinite(av[i]) ? 1 : 0);
      }
    }
    tf_tensor_release(x), tf_tensor_release(isn), tf_tensor_release(isf);
  }
  tf_tensor *isn = NULL, *isf = NULL;
  if (CHECK_OK(tf_unary(TF_OP_ISNAN, ia, &isn)) && CHECK_OK(tf_unary(TF_OP_ISFINITE, ia, &isf))) {
    const uint8_t *n = tf_tensor_data(isn), *f = tf_tensor_data(isf);
    for (int i = 0; i < 3; i++) CHECK(n[i] == 0 && f[i] == 1);
  }
  tf_tensor_release(isn), tf_tensor_release(isf);
  tf_tensor *bools = tensor_from(iv, SHAPE(3), TF_BOOL);
  CHECK_INT(tf_binary(TF_OP_EQ, bools, bools, &out), TF_ERR_ARG);
  CHECK(tf_op_find("isfinite") != NULL && tf_op_find("isfinite")->rule == TF_RESULT_BOOL);
  tf_tensor_release(bools);
  tf_tensor_release(a), tf_tensor_release(b), tf_tensor_release(ia), tf_tensor_release(fb);
}

/* ---- argument errors ---------------------------------------------------------------- */

/* The call fails with code and its message contains each of the fragments. */
#define CHECK_FAILS(call, code, ...)                                                          \
  do {                                                                                        \
    CHECK_INT((call), (code));                                                                \
    const char *frags_[] = {__VA_ARGS__};                                                     \
    for (size_t k_ = 0; k_ < sizeof frags_ / sizeof frags_[0]; k_++)                          \
      if (!CHECK(strstr(tf_last_error(), frags_[k_]) != NULL))                                \
        fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", tf_last_error(), frags_[k_]);      \
  } while (0)

static void test_errors(void) {
  tf_tensor *out = NULL, *out2 = NULL, *out3 = NULL;
  tf_tensor *x = tensor_randn(SHAPE(2, 3, 4), TF_F32, 1.0, NULL), *ints = NULL, *w5 = NULL, *x1 = NULL;
  tf_tensor *dy_bad = tensor_randn(SHAPE(2, 3, 5), TF_F32, 1.0, NULL),
            *odd = tensor_randn(SHAPE(2, 5), TF_F32, 1.0, NULL);
  CHECK_OK(tf_full(&SHAPE(2, 3), 1.0, TF_I64, tf_cpu(), &ints));
  CHECK_OK(tf_full(&SHAPE(5), 1.0, TF_F32, tf_cpu(), &w5));
  CHECK_OK(tf_full(&SHAPE(4), 1.0, TF_F32, tf_cpu(), &x1));

  CHECK_FAILS(tf_softmax(ints, false, &out), TF_ERR_ARG, "softmax", "x", "i64");
  CHECK_FAILS(tf_softmax_backward(x, dy_bad, false, &out), TF_ERR_ARG, "softmax_backward", "dy", "(2, 3, 4)");
  CHECK_FAILS(tf_layer_norm(x, w5, NULL, 1e-5, &out, NULL, NULL), TF_ERR_ARG, "layer_norm", "w", "(4,)", "(5,)");
  CHECK_FAILS(tf_layer_norm(x, NULL, w5, 1e-5, &out, NULL, NULL), TF_ERR_ARG, "layer_norm", "b");
  CHECK_FAILS(tf_layer_norm(x, NULL, NULL, 0.0, &out, NULL, NULL), TF_ERR_ARG, "layer_norm", "eps");
  CHECK_FAILS(tf_rms_norm(x, NULL, -1.0, &out, NULL), TF_ERR_ARG, "rms_norm", "eps");
  CHECK_FAILS(tf_rms_norm(x, w5, 1e-5, &out, NULL), TF_ERR_ARG, "rms_norm", "g");
  CHECK_FAILS(tf_rms_norm(ints, NULL, 1e-5, &out, NULL), TF_ERR_ARG, "rms_norm", "x", "i64");
  CHECK_FAILS(tf_layer_norm_backward(x, x, NULL, NULL, x1, &out, NULL, NULL), TF_ERR_ARG, "layer_norm_backward",
              "mean");
  CHECK_FAILS(tf_rms_norm_backward(x, x, NULL, x1, &out, NULL), TF_ERR_ARG, "rms_norm_backward", "rstd", "(2, 3)");

  /* cross_entropy: target dtype and shape, out-of-range targets named with their position */
  tf_tensor *logits = tensor_randn(SHAPE(2, 3, 10), TF_F32, 1.0, NULL);
  int64_t tv[6] = {1, 2, 3, 4, 10, -1};
  tf_tensor *t = index_tensor(tv, SHAPE(2, 3), TF_I64), *tf = NULL, *t1 = index_tensor(tv, SHAPE(6), TF_I32);
  CHECK_OK(tf_full(&SHAPE(2, 3), 1.0, TF_F32, tf_cpu(), &tf));
  CHECK_FAILS(tf_cross_entropy(logits, tf, &out, NULL), TF_ERR_ARG, "cross_entropy", "targets", "f32");
  CHECK_OK(tf_cross_entropy(logits, ints, &out, NULL));
  tf_tensor_release(out);
  out = NULL;
  CHECK_FAILS(tf_cross_entropy(logits, x1, &out, NULL), TF_ERR_ARG, "cross_entropy", "targets");
  CHECK_FAILS(tf_cross_entropy(logits, t, &out, NULL), TF_ERR_ARG, "cross_entropy", "target 10",
              "position [1, 1]", "[0, 10)");
  CHECK_FAILS(tf_cross_entropy(logits, t1, &out, NULL), TF_ERR_ARG, "target 10", "position [4]");
  CHECK_FAILS(tf_cross_entropy(x, t, &out, NULL), TF_ERR_ARG, "target 4", "position [1, 0]", "[0, 4)");

  /* embedding: ids dtype, weight shape, out-of-range ids (negative too) */
  tf_tensor *emb = tensor_randn(SHAPE(10, 3), TF_F32, 1.0, NULL);
  int64_t iv[4] = {0, 9, 12, 3}, nv[3] = {1, -2, 0};
  tf_tensor *ids = index_tensor(iv, SHAPE(2, 2), TF_I32), *neg = index_tensor(nv, SHAPE(3), TF_I64);
  CHECK_FAILS(tf_embedding(emb, ids, &out), TF_ERR_ARG, "embedding", "id 12", "position [1, 0]", "[0, 10)");
  CHECK_FAILS(tf_embedding(emb, neg, &out), TF_ERR_ARG, "id -2", "position [1]");
  CHECK_FAILS(tf_embedding(x1, neg, &out), TF_ERR_ARG, "embedding", "weight", "2-D");
  CHECK_FAILS(tf_embedding(emb, x1, &out), TF_ERR_ARG, "embedding", "ids", "f32");
  tf_tensor *g = tensor_randn(SHAPE(2, 2, 3), TF_F32, 1.0, NULL),
            *g_bad = tensor_randn(SHAPE(2, 3, 3), TF_F32, 1.0, NULL);
  CHECK_FAILS(tf_embedding_backward(g, ids, 10, TF_F32, &out), TF_ERR_ARG, "embedding_backward", "id 12");
  CHECK_FAILS(tf_embedding_backward(g_bad, ids, 10, TF_F32, &out), TF_ERR_ARG, "embedding_backward", "dout");
  CHECK_FAILS(tf_embedding_backward(g, ids, 20, TF_I32, &out), TF_ERR_ARG, "embedding_backward", "dtype");

  /* rope: odd last dim, no sequence dim, bad positions, theta */
  CHECK_FAILS(tf_rope(odd, NULL, 10000.0, false, &out), TF_ERR_ARG, "rope", "even", "5");
  CHECK_FAILS(tf_rope(x1, NULL, 10000.0, false, &out), TF_ERR_ARG, "rope", "positions");
  CHECK_FAILS(tf_rope(x, x1, 10000.0, false, &out), TF_ERR_ARG, "rope", "positions", "f32");
  CHECK_FAILS(tf_rope(x, ids, 10000.0, false, &out), TF_ERR_ARG, "rope", "positions", "broadcast");
  CHECK_FAILS(tf_rope(x, NULL, 0.0, false, &out), TF_ERR_ARG, "rope", "theta");

  /* masked_fill */
  CHECK_FAILS(tf_masked_fill(x, x, 0.0, &out), TF_ERR_ARG, "masked_fill", "bool");
  tf_tensor *mask = NULL;
  CHECK_OK(tf_full(&SHAPE(3, 3), 1.0, TF_BOOL, tf_cpu(), &mask));
  CHECK_FAILS(tf_masked_fill(x, mask, 0.0, &out), TF_ERR_ARG, "masked_fill", "broadcast");

  /* adamw */
  tf_tensor *p = NULL, *m = NULL, *v = NULL, *ph = NULL, *pt = NULL, *big = NULL;
  CHECK_OK(tf_full(&SHAPE(4), 1.0, TF_F32, tf_cpu(), &p));
  CHECK_OK(tf_full(&SHAPE(4), 0.0, TF_F32, tf_cpu(), &m));
  CHECK_OK(tf_full(&SHAPE(4), 0.0, TF_F32, tf_cpu(), &v));
  CHECK_OK(tf_full(&SHAPE(4), 1.0, TF_F16, tf_cpu(), &ph));
  CHECK_OK(tf_full(&SHAPE(2, 2), 1.0, TF_F32, tf_cpu(), &big));
  CHECK_OK(tf_transpose(big, 0, 1, &pt));
  tf_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = 1};
  CHECK_FAILS(tf_adamw_step(ph, p, m, v, &a), TF_ERR_ARG, "adamw_step", "p", "f16");
  CHECK_FAILS(tf_adamw_step(p, p, m, w5, &a), TF_ERR_ARG, "adamw_step", "v", "(4,)");
  CHECK_FAILS(tf_adamw_step(p, ints, m, v, &a), TF_ERR_ARG, "adamw_step", "g");
  CHECK_FAILS(tf_adamw_step(pt, pt, pt, pt, &a), TF_ERR_ARG, "adamw_step", "contiguous");
  a.step = 0;
  CHECK_FAILS(tf_adamw_step(p, p, m, v, &a), TF_ERR_ARG, "adamw_step", "step");
  a.step = 1, a.beta1 = 1.0;
  CHECK_FAILS(tf_adamw_step(p, p, m, v, &a), TF_ERR_ARG, "adamw_step", "beta1");

  tf_tensor *to_free[] = {x, ints, w5, x1, dy_bad, odd, logits, t, tf, t1, emb, ids, neg, g, g_bad,
                          mask, p, m, v, ph, pt, big, out, out2, out3};
  for (size_t i = 0; i < sizeof to_free / sizeof to_free[0]; i++) tf_tensor_release(to_free[i]);
}

int main(void) {
  tf_backends_init();
  test_seed();
  test_softmax();
  test_norms();
  test_cross_entropy();
  test_rope();
  test_embedding();
  test_masked_fill();
  test_adamw();
  test_adamw_with_low();
  test_compare();
  test_errors();
  /* every tensor went back to the allocator */
  tf_device_ctx *ctx = NULL;
  if (CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx))) CHECK_INT(ctx->alloc.stats.active_blocks, 0);
  return tf_check_done();
}
