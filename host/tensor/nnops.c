/* Dispatch of the fused neural-network ops (nnops.h): every argument
 * checked here with a message naming the op and the argument, inputs made
 * contiguous (norm weights and statistics in the statistics dtype, f32 or
 * f64), outputs allocated, then the device's backend. Gradients of a
 * different float dtype than the forward output are converted rather than
 * refused: autocast regions may hand them over that way. */
#include "nnops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "model_kernels.h"
#include "temps.h"

/* ---- helpers ----------------------------------------------------------- */

/* Hands res to *out on success; releases it on failure. Temps go either way. */
static tf_status tf_nn_finish(tf_temps *tt, tf_status st, tf_tensor *res, tf_tensor **out) {
  tf_temps_drop(tt);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

/* Statistics and norm weights: f64 for f64 inputs, f32 for the others. */
static tf_dtype tf_nn_stat_dtype(tf_dtype d) { return d == TF_F64 ? TF_F64 : TF_F32; }

/* t's shape as text, for messages. */
static const char *tf_nn_shape_of(const tf_tensor *t, char *buf, size_t n) {
  tf_shape s = tf_tensor_shape(t);
  return tf_shape_format(&s, buf, n);
}

/* The checks every op repeats, each naming the op and the argument. */
static tf_status tf_nn_need_float(const char *op, const char *arg, const tf_tensor *t) {
  if (tf_dtype_is_fp8(t->dtype)) return tf_dtype_refusal(op, t->dtype);
  if (tf_dtype_is_float(t->dtype)) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: %s must have a floating dtype (f32, f16, bf16 or f64), not %s", op, arg,
                 tf_dtype_name(t->dtype));
}

static tf_status tf_nn_need_index(const char *op, const char *arg, const tf_tensor *t) {
  if (t->dtype == TF_I32 || t->dtype == TF_I64) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: %s must have an integer dtype (i32 or i64), not %s", op, arg,
                 tf_dtype_name(t->dtype));
}

static tf_status tf_nn_same_device(const char *op, const char *arg, const tf_tensor *t, const char *ref_arg,
                                   const tf_tensor *ref) {
  if (tf_device_eq(t->device, ref->device)) return TF_OK;
  char dt[16], dr[16];
  tf_device_format(t->device, dt, sizeof dt);
  tf_device_format(ref->device, dr, sizeof dr);
  return tf_fail(TF_ERR_DEVICE, "%s: %s is on %s but %s is on %s; move one with :to()", op, arg, dt, ref_arg, dr);
}

static bool tf_nn_shape_is(const tf_tensor *t, const tf_shape *s) {
  if (t->ndim != s->ndim) return false;
  for (int i = 0; i < s->ndim; i++)
    if (t->shape[i] != s->dims[i]) return false;
  return true;
}

/* "op: arg must have shape (768,) (why), not (512,)" unless t has shape s. */
static tf_status tf_nn_need_shape(const char *op, const char *arg, const tf_tensor *t, const tf_shape *s,
                                  const char *why) {
  if (tf_nn_shape_is(t, s)) return TF_OK;
  char want[128], have[128];
  return tf_fail(TF_ERR_ARG, "%s: %s must have shape %s (%s), not %s", op, arg, tf_shape_format(s, want, sizeof want),
                 why, tf_nn_shape_of(t, have, sizeof have));
}

/* x as (rows, cols): cols is the last dim; rows_shape is x's shape without it. */
static tf_status tf_nn_rows(const char *op, const char *arg, const tf_tensor *x, int64_t *rows, int64_t *cols,
                            tf_shape *rows_shape) {
  if (x->ndim < 1) return tf_fail(TF_ERR_ARG, "%s: %s must have at least 1 dimension", op, arg);
  *cols = x->shape[x->ndim - 1];
  tf_shape s = {.ndim = x->ndim - 1};
  int64_t r = 1;
  for (int i = 0; i < s.ndim; i++) r *= (s.dims[i] = x->shape[i]);
  *rows = r;
  if (rows_shape) *rows_shape = s;
  return TF_OK;
}

static tf_status tf_nn_need_eps(const char *op, double eps) {
  if (eps > 0 && isfinite(eps)) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: eps must be a finite number > 0, not %g", op, eps);
}

/* A contiguous tensor of dtype d with t's values (t itself, retained, when
 * it already is one), kept in tt. */
static tf_status tf_nn_prepare(tf_temps *tt, const tf_tensor *t, tf_dtype d, const tf_tensor **out) {
  tf_tensor *r;
  if (t->dtype == d && tf_tensor_is_contiguous(t))
    r = tf_tensor_retain((tf_tensor *)t);
  else
    TF_TRY(tf_to(t, d, t->device, &r));
  *out = tf_temps_keep(tt, r);
  return TF_OK;
}

/* A norm weight (w, b or g): NULL, or a float vector of the row length on x's device. */
static tf_status tf_nn_check_weight(const char *op, const char *arg, const tf_tensor *w, const tf_tensor *x,
                                    int64_t cols) {
  if (!w) return TF_OK;
  TF_TRY(tf_nn_need_float(op, arg, w));
  TF_TRY(tf_nn_same_device(op, arg, w, "x", x));
  tf_shape s = {1, {cols}};
  return tf_nn_need_shape(op, arg, w, &s, "the last dim of x");
}

/* "[2, 17]": the position of flat element i in a tensor of shape s. */
static const char *tf_nn_index_format(const tf_shape *s, int64_t flat, char *buf, size_t n) {
  int64_t idx[TF_MAX_DIMS];
  for (int d = s->ndim - 1; d >= 0; d--) {
    int64_t size = s->dims[d] > 0 ? s->dims[d] : 1;
    idx[d] = flat % size;
    flat /= size;
  }
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < s->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)idx[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

/* Element i of a contiguous i32/i64 tensor, read back from its device. */
static tf_status tf_nn_read_index(tf_device_ctx *ctx, const tf_tensor *t, int64_t i, int64_t *value) {
  size_t es = tf_dtype_size(t->dtype);
  int32_t v32 = 0;
  int64_t v64 = 0;
  void *dst = t->dtype == TF_I32 ? (void *)&v32 : (void *)&v64;
  TF_TRY(ctx->backend->copy(ctx, dst, (const char *)tf_tensor_data(t) + i * (int64_t)es, es, TF_COPY_D2H));
  *value = t->dtype == TF_I32 ? v32 : v64;
  return TF_OK;
}

/* The error for element `bad` of index tensor t (of shape s, the caller's
 * view of it), which lies outside [0, limit): "embedding: id 10005 at
 * position [3, 17] is out of range [0, 10000) (the vocabulary size)". */
static tf_status tf_nn_bad_index(tf_device_ctx *ctx, const char *op, const char *what, const tf_tensor *t,
                                 const tf_shape *s, int64_t bad, int64_t limit, const char *limit_name) {
  int64_t value = 0;
  TF_TRY(tf_nn_read_index(ctx, t, bad, &value));
  char pos[160];
  return tf_fail(TF_ERR_ARG, "%s: %s %lld at position %s is out of range [0, %lld) (%s)", op, what,
                 (long long)value, tf_nn_index_format(s, bad, pos, sizeof pos), (long long)limit, limit_name);
}

/* Converts a backend result of the statistics dtype to dtype d in place of *t. */
static tf_status tf_nn_to_dtype(tf_tensor **t, tf_dtype d) {
  if ((*t)->dtype == d) return TF_OK;
  tf_tensor *c;
  TF_TRY(tf_to(*t, d, (*t)->device, &c));
  tf_tensor_release(*t);
  *t = c;
  return TF_OK;
}

/* Sums over no rows. */
static tf_status tf_nn_zeros(const tf_shape *s, tf_dtype d, tf_device dev, tf_tensor **out) {
  return tf_full(s, 0.0, d, dev, out);
}

/* ---- softmax --------------------------------------------------------------- */

tf_status tf_softmax(const tf_tensor *x, bool log, tf_tensor **y) {
  const char *op = log ? "log_softmax" : "softmax";
  int64_t rows = 0, cols = 0;
  TF_TRY(tf_nn_need_float(op, "x", x));
  TF_TRY(tf_nn_rows(op, "x", x, &rows, &cols, NULL));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(x->device, &ctx));
  tf_temps tt = {0};
  tf_tensor *res = NULL;
  const tf_tensor *cx = NULL;
  tf_shape s = tf_tensor_shape(x);
  tf_status st = tf_nn_prepare(&tt, x, x->dtype, &cx);
  if (st == TF_OK) st = tf_tensor_empty(&s, x->dtype, x->device, &res);
  if (st == TF_OK && rows * cols > 0) {
    tf_softmax_args a = {.rows = rows, .cols = cols, .log = log, .x = cx, .out = res};
    st = ctx->backend->softmax(ctx, &a);
  }
  return tf_nn_finish(&tt, st, res, y);
}

tf_status tf_softmax_backward(const tf_tensor *y, const tf_tensor *dy, bool log, tf_tensor **dx) {
  const char *op = log ? "log_softmax_backward" : "softmax_backward";
  int64_t rows = 0, cols = 0;
  TF_TRY(tf_nn_need_float(op, "y", y));
  TF_TRY(tf_nn_need_float(op, "dy", dy));
  TF_TRY(tf_nn_same_device(op, "dy", dy, "y", y));
  TF_TRY(tf_nn_rows(op, "y", y, &rows, &cols, NULL));
  tf_shape s = tf_tensor_shape(y);
  TF_TRY(tf_nn_need_shape(op, "dy", dy, &s, "the shape of y"));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(y->device, &ctx));
  tf_temps tt = {0};
  tf_tensor *res = NULL;
  const tf_tensor *cy, *cdy;
  tf_status st = tf_nn_prepare(&tt, y, y->dtype, &cy);
  if (st == TF_OK) st = tf_nn_prepare(&tt, dy, y->dtype, &cdy);
  if (st == TF_OK) st = tf_tensor_empty(&s, y->dtype, y->device, &res);
  if (st == TF_OK && rows * cols > 0) {
    tf_softmax_args a = {.rows = rows, .cols = cols, .log = log, .x = cy, .dy = cdy, .out = res};
    st = ctx->backend->softmax(ctx, &a);
  }
  return tf_nn_finish(&tt, st, res, dx);
}

/* ---- layer_norm and rms_norm ----------------------------------------------- */

/* The checks both norms' forward passes share. */
static tf_status tf_nn_norm_input(const char *op, const tf_tensor *x, double eps, int64_t *rows, int64_t *cols,
                                  tf_shape *rows_shape) {
  TF_TRY(tf_nn_need_float(op, "x", x));
  TF_TRY(tf_nn_rows(op, "x", x, rows, cols, rows_shape));
  if (*cols == 0) return tf_fail(TF_ERR_ARG, "%s: the last dim of x (the normalised one) is empty", op);
  return tf_nn_need_eps(op, eps);
}

/* Runs a norm's forward pass: y always, mean (layer_norm) and rstd when asked. */
static tf_status tf_nn_norm_forward(tf_norm_kind kind, const tf_tensor *x, const tf_tensor *w, const tf_tensor *b,
                                    double eps, tf_tensor **y, tf_tensor **mean, tf_tensor **rstd) {
  const char *op = kind == TF_NORM_LAYER ? "layer_norm" : "rms_norm";
  int64_t rows = 0, cols = 0;
  tf_shape rs;
  TF_TRY(tf_nn_norm_input(op, x, eps, &rows, &cols, &rs));
  TF_TRY(tf_nn_check_weight(op, kind == TF_NORM_LAYER ? "w" : "g", w, x, cols));
  TF_TRY(tf_nn_check_weight(op, "b", b, x, cols));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(x->device, &ctx));
  tf_dtype sd = tf_nn_stat_dtype(x->dtype);
  tf_temps tt = {0};
  tf_tensor *res = NULL, *m = NULL, *r = NULL;
  const tf_tensor *cx = NULL, *cw = NULL, *cb = NULL;
  tf_shape s = tf_tensor_shape(x);
  tf_status st = tf_nn_prepare(&tt, x, x->dtype, &cx);
  if (st == TF_OK && w) st = tf_nn_prepare(&tt, w, sd, &cw);
  if (st == TF_OK && b) st = tf_nn_prepare(&tt, b, sd, &cb);
  if (st == TF_OK) st = tf_tensor_empty(&s, x->dtype, x->device, &res);
  if (st == TF_OK && mean) st = tf_tensor_empty(&rs, sd, x->device, &m);
  if (st == TF_OK && rstd) st = tf_tensor_empty(&rs, sd, x->device, &r);
  if (st == TF_OK && rows > 0) {
    tf_norm_args a = {.kind = kind, .rows = rows, .cols = cols, .eps = eps, .x = cx, .w = cw, .b = cb,
                      .y = res, .mean = m, .rstd = r};
    st = ctx->backend->norm(ctx, &a);
  }
  if (st != TF_OK) {
    tf_tensor_release(m);
    tf_tensor_release(r);
  } else {
    if (mean) *mean = m;
    if (rstd) *rstd = r;
  }
  return tf_nn_finish(&tt, st, res, y);
}

tf_status tf_layer_norm(const tf_tensor *x, const tf_tensor *w, const tf_tensor *b, double eps, tf_tensor **y,
                        tf_tensor **mean, tf_tensor **rstd) {
  return tf_nn_norm_forward(TF_NORM_LAYER, x, w, b, eps, y, mean, rstd);
}

tf_status tf_rms_norm(const tf_tensor *x, const tf_tensor *g, double eps, tf_tensor **y, tf_tensor **rstd) {
  return tf_nn_norm_forward(TF_NORM_RMS, x, g, NULL, eps, y, NULL, rstd);
}

/* A saved statistic (mean or rstd): one value per row of x. */
static tf_status tf_nn_check_stat(const char *op, const char *arg, const tf_tensor *t, const tf_tensor *x,
                                  const tf_shape *rows_shape) {
  if (!t) return tf_fail(TF_ERR_ARG, "%s: %s is required (the forward pass returns it)", op, arg);
  TF_TRY(tf_nn_need_float(op, arg, t));
  TF_TRY(tf_nn_same_device(op, arg, t, "x", x));
  return tf_nn_need_shape(op, arg, t, rows_shape, "one value per row of x");
}

/* A norm's backward pass; w is layer_norm's w or rms_norm's g, dw its gradient. */
static tf_status tf_nn_norm_backward(tf_norm_kind kind, const tf_tensor *dy, const tf_tensor *x, const tf_tensor *w,
                                     const tf_tensor *mean, const tf_tensor *rstd, tf_tensor **dx, tf_tensor **dw,
                                     tf_tensor **db) {
  const char *op = kind == TF_NORM_LAYER ? "layer_norm_backward" : "rms_norm_backward";
  const char *wname = kind == TF_NORM_LAYER ? "w" : "g";
  int64_t rows = 0, cols = 0;
  tf_shape rs;
  TF_TRY(tf_nn_need_float(op, "x", x));
  TF_TRY(tf_nn_rows(op, "x", x, &rows, &cols, &rs));
  if (cols == 0) return tf_fail(TF_ERR_ARG, "%s: the last dim of x (the normalised one) is empty", op);
  TF_TRY(tf_nn_need_float(op, "dy", dy));
  TF_TRY(tf_nn_same_device(op, "dy", dy, "x", x));
  tf_shape s = tf_tensor_shape(x);
  TF_TRY(tf_nn_need_shape(op, "dy", dy, &s, "the shape of x"));
  TF_TRY(tf_nn_check_weight(op, wname, w, x, cols));
  if (kind == TF_NORM_LAYER) TF_TRY(tf_nn_check_stat(op, "mean", mean, x, &rs));
  TF_TRY(tf_nn_check_stat(op, "rstd", rstd, x, &rs));
  if (dw && !w)
    return tf_fail(TF_ERR_ARG, "%s: the gradient of %s was asked for, but %s is NULL", op, wname, wname);
  if (!dx && !dw && !db) return TF_OK;
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(x->device, &ctx));
  tf_dtype sd = tf_nn_stat_dtype(x->dtype);
  tf_dtype wd = w ? w->dtype : sd;
  tf_shape ws = {1, {cols}};
  tf_temps tt = {0};
  tf_tensor *gx = NULL, *gw = NULL, *gb = NULL;
  const tf_tensor *cx = NULL, *cdy = NULL, *cw = NULL, *cmean = NULL, *crstd = NULL;
  tf_status st = tf_nn_prepare(&tt, x, x->dtype, &cx);
  if (st == TF_OK) st = tf_nn_prepare(&tt, dy, x->dtype, &cdy);
  if (st == TF_OK && w) st = tf_nn_prepare(&tt, w, sd, &cw);
  if (st == TF_OK && mean && kind == TF_NORM_LAYER) st = tf_nn_prepare(&tt, mean, sd, &cmean);
  if (st == TF_OK) st = tf_nn_prepare(&tt, rstd, sd, &crstd);
  if (st == TF_OK && dx) st = tf_tensor_empty(&s, x->dtype, x->device, &gx);
  /* No rows: the weight gradients are sums of nothing. */
  if (st == TF_OK && dw)
    st = rows > 0 ? tf_tensor_empty(&ws, sd, x->device, &gw) : tf_nn_zeros(&ws, sd, x->device, &gw);
  if (st == TF_OK && db)
    st = rows > 0 ? tf_tensor_empty(&ws, sd, x->device, &gb) : tf_nn_zeros(&ws, sd, x->device, &gb);
  if (st == TF_OK && rows > 0) {
    tf_norm_args a = {.kind = kind, .backward = true, .rows = rows, .cols = cols, .x = cx, .w = cw,
                      .mean = (tf_tensor *)cmean, .rstd = (tf_tensor *)crstd, .dy = cdy, .dx = gx, .dw = gw, .db = gb};
    st = ctx->backend->norm(ctx, &a);
  }
  if (st == TF_OK && gw) st = tf_nn_to_dtype(&gw, wd);
  if (st == TF_OK && gb) st = tf_nn_to_dtype(&gb, wd);
  tf_temps_drop(&tt);
  if (st != TF_OK) {
    tf_tensor_release(gx);
    tf_tensor_release(gw);
    tf_tensor_release(gb);
    return st;
  }
  if (dx) *dx = gx;
  if (dw) *dw = gw;
  if (db) *db = gb;
  return TF_OK;
}

tf_status tf_layer_norm_backward(const tf_tensor *dy, const tf_tensor *x, const tf_tensor *w, const tf_tensor *mean,
                                 const tf_tensor *rstd, tf_tensor **dx, tf_tensor **dw, tf_tensor **db) {
  return tf_nn_norm_backward(TF_NORM_LAYER, dy, x, w, mean, rstd, dx, dw, db);
}

tf_status tf_rms_norm_backward(const tf_tensor *dy, const tf_tensor *x, const tf_tensor *g, const tf_tensor *rstd,
                               tf_tensor **dx, tf_tensor **dg) {
  return tf_nn_norm_backward(TF_NORM_RMS, dy, x, g, NULL, rstd, dx, dg, NULL);
}

/* ---- cross_entropy --------------------------------------------------------- */

/* Logits (..., V) and targets of shape (...) or (N,): rows and V. */
static tf_status tf_nn_ce_inputs(const char *op, const tf_tensor *logits, const tf_tensor *targets, int64_t *rows,
                                 int64_t *cols) {
  TF_TRY(tf_nn_need_float(op, "logits", logits));
  tf_shape rs;
  TF_TRY(tf_nn_rows(op, "logits", logits, rows, cols, &rs));
  TF_TRY(tf_nn_need_index(op, "targets", targets));
  TF_TRY(tf_nn_same_device(op, "targets", targets, "logits", logits));
  tf_shape flat = {1, {*rows}};
  if (tf_nn_shape_is(targets, &rs) || tf_nn_shape_is(targets, &flat)) return TF_OK;
  char want[128], have[128];
  return tf_fail(TF_ERR_ARG, "%s: targets must have shape %s (logits' shape without the class dim), not %s", op,
                 tf_shape_format(&rs, want, sizeof want), tf_nn_shape_of(targets, have, sizeof have));
}

tf_status tf_cross_entropy(const tf_tensor *logits, const tf_tensor *targets, tf_tensor **loss, tf_tensor **lse) {
  const char *op = "cross_entropy";
  int64_t rows = 0, cols = 0;
  TF_TRY(tf_nn_ce_inputs(op, logits, targets, &rows, &cols));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(logits->device, &ctx));
  tf_dtype sd = tf_nn_stat_dtype(logits->dtype);
  tf_shape ls = {1, {rows}}, scalar = {0, {0}}, ts = tf_tensor_shape(targets);
  tf_temps tt = {0};
  tf_tensor *res = NULL, *l = NULL;
  const tf_tensor *cx = NULL, *ct = NULL;
  tf_status st = tf_nn_prepare(&tt, logits, logits->dtype, &cx);
  if (st == TF_OK) st = tf_nn_prepare(&tt, targets, TF_I64, &ct);
  if (st == TF_OK && lse) st = tf_tensor_empty(&ls, sd, logits->device, &l);
  if (st == TF_OK) {
    if (rows == 0) /* the mean of no losses, as torch: NaN */
      st = tf_full(&scalar, NAN, logits->dtype, logits->device, &res);
    else
      st = tf_tensor_empty(&scalar, logits->dtype, logits->device, &res);
  }
  if (st == TF_OK && rows > 0 && cols == 0)
    st = tf_nn_bad_index(ctx, op, "target", ct, &ts, 0, cols, "the number of classes");
  if (st == TF_OK && rows > 0) {
    tf_cross_entropy_args a = {.rows = rows, .cols = cols, .logits = cx, .targets = ct, .lse = l, .loss = res};
    int64_t bad = -1;
    st = ctx->backend->cross_entropy(ctx, &a, &bad);
    if (st == TF_OK && bad >= 0) st = tf_nn_bad_index(ctx, op, "target", ct, &ts, bad, cols, "the number of classes");
  }
  if (st != TF_OK) tf_tensor_release(l);
  else if (lse) *lse = l;
  return tf_nn_finish(&tt, st, res, loss);
}

tf_status tf_cross_entropy_backward(const tf_tensor *logits, const tf_tensor *targets, const tf_tensor *lse,
                                    const tf_tensor *dloss, tf_tensor **dlogits) {
  const char *op = "cross_entropy_backward";
  int64_t rows = 0, cols = 0;
  TF_TRY(tf_nn_ce_inputs(op, logits, targets, &rows, &cols));
  tf_shape ls = {1, {rows}};
  if (!lse) return tf_fail(TF_ERR_ARG, "%s: lse is required (the forward pass returns it)", op);
  TF_TRY(tf_nn_need_float(op, "lse", lse));
  TF_TRY(tf_nn_same_device(op, "lse", lse, "logits", logits));
  TF_TRY(tf_nn_need_shape(op, "lse", lse, &ls, "one value per row of logits"));
  TF_TRY(tf_nn_need_float(op, "dloss", dloss));
  TF_TRY(tf_nn_same_device(op, "dloss", dloss, "logits", logits));
  if (tf_tensor_numel(dloss) != 1) {
    char have[128];
    return tf_fail(TF_ERR_ARG, "%s: dloss must be a single value (0-dim), not of shape %s", op,
                   tf_nn_shape_of(dloss, have, sizeof have));
  }
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(logits->device, &ctx));
  tf_dtype sd = tf_nn_stat_dtype(logits->dtype);
  tf_shape s = tf_tensor_shape(logits);
  tf_temps tt = {0};
  tf_tensor *res = NULL;
  const tf_tensor *cx = NULL, *ct = NULL, *cl = NULL, *cd = NULL;
  tf_status st = tf_nn_prepare(&tt, logits, logits->dtype, &cx);
  if (st == TF_OK) st = tf_nn_prepare(&tt, targets, TF_I64, &ct);
  if (st == TF_OK) st = tf_nn_prepare(&tt, lse, sd, &cl);
  if (st == TF_OK) st = tf_nn_prepare(&tt, dloss, sd, &cd);
  if (st == TF_OK) st = tf_tensor_empty(&s, logits->dtype, logits->device, &res);
  if (st == TF_OK && rows * cols > 0) {
    tf_cross_entropy_args a = {.backward = true, .rows = rows, .cols = cols, .logits = cx, .targets = ct,
                               .lse = (tf_tensor *)cl, .dloss = cd, .dlogits = res};
    int64_t bad = -1;
    st = ctx->backend->cross_entropy(ctx, &a, &bad);
  }
  return tf_nn_finish(&tt, st, res, dlogits);
}

/* ---- rope -------------------------------------------------------------------- */

tf_status tf_rope(const tf_tensor *x, const tf_tensor *positions, double theta, bool inverse, tf_tensor **y) {
  const char *op = "rope";
  int64_t rows = 0, cols = 0;
  tf_shape rs;
  TF_TRY(tf_nn_need_float(op, "x", x));
  TF_TRY(tf_nn_rows(op, "x", x, &rows, &cols, &rs));
  if (cols % 2 != 0)
    return tf_fail(TF_ERR_ARG, "%s: the last dim of x must be even (it holds pairs), not %lld", op, (long long)cols);
  if (!(theta > 0) || !isfinite(theta))
    return tf_fail(TF_ERR_ARG, "%s: theta must be a finite number > 0, not %g", op, theta);
  int64_t seq = 1;
  if (positions) {
    TF_TRY(tf_nn_need_index(op, "positions", positions));
    TF_TRY(tf_nn_same_device(op, "positions", positions, "x", x));
  } else {
    if (x->ndim < 2)
      return tf_fail(TF_ERR_ARG, "%s: without positions x needs a sequence dim (at least 2 dims), not %d", op,
                     x->ndim);
    seq = x->shape[x->ndim - 2];
  }
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(x->device, &ctx));
  tf_temps tt = {0};
  tf_tensor *res = NULL;
  const tf_tensor *cx = NULL, *cp = NULL;
  tf_shape s = tf_tensor_shape(x);
  tf_status st = tf_nn_prepare(&tt, x, x->dtype, &cx);
  if (st == TF_OK && positions) {
    tf_tensor *ep;
    st = tf_expand(positions, &rs, &ep);
    if (st != TF_OK) {
      char xs[128];
      tf_fail_context("%s: positions must broadcast to %s (x's shape without its last dim)", op,
                      tf_shape_format(&rs, xs, sizeof xs));
    } else {
      tf_temps_keep(&tt, ep);
      st = tf_nn_prepare(&tt, ep, TF_I64, &cp);
    }
  }
  if (st == TF_OK) st = tf_tensor_empty(&s, x->dtype, x->device, &res);
  if (st == TF_OK && rows * cols > 0) {
    tf_rope_args a = {.rows = rows, .cols = cols, .seq = seq > 0 ? seq : 1, .theta = theta, .inverse = inverse,
                      .x = cx, .positions = cp, .y = res};
    st = ctx->backend->rope(ctx, &a);
  }
  return tf_nn_finish(&tt, st, res, y);
}

/* The embedding kernel, either pass, over n > 0 ids (i64, of shape is): an id
 * outside [0, vocab) (every id, when vocab is 0) is reported by position. */
static tf_status tf_nn_embedding_kernel(tf_device_ctx *ctx, const char *op, const tf_embedding_args *a,
                                        const tf_tensor *ids, const tf_shape *is) {
  int64_t bad = 0;
  if (a->vocab > 0) {
    bad = -1;
    TF_TRY(ctx->backend->embedding(ctx, a, &bad));
  }
  if (bad >= 0) return tf_nn_bad_index(ctx, op, "id", ids, is, bad, a->vocab, "the vocabulary size");
  return TF_OK;
}

/* ---- embedding ----------------------------------------------------------------- */

tf_status tf_embedding(const tf_tensor *weight, const tf_tensor *ids, tf_tensor **out) {
  const char *op = "embedding";
  if (weight->ndim != 2) {
    char have[128];
    return tf_fail(TF_ERR_ARG, "%s: weight must be 2-D (vocab, dim), not of shape %s", op,
                   tf_nn_shape_of(weight, have, sizeof have));
  }
  TF_TRY(tf_nn_need_index(op, "ids", ids));
  TF_TRY(tf_nn_same_device(op, "ids", ids, "weight", weight));
  if (ids->ndim >= TF_MAX_DIMS)
    return tf_fail(TF_ERR_ARG, "%s: ids have %d dims; the output would have more than %d", op, ids->ndim,
                   TF_MAX_DIMS);
  int64_t vocab = weight->shape[0], dim = weight->shape[1], n = tf_tensor_numel(ids);
  tf_shape is = tf_tensor_shape(ids), os = is;
  os.dims[os.ndim++] = dim;
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(weight->device, &ctx));
  tf_temps tt = {0};
  tf_tensor *res = NULL;
  const tf_tensor *cw, *ci;
  tf_status st = tf_nn_prepare(&tt, weight, weight->dtype, &cw);
  if (st == TF_OK) st = tf_nn_prepare(&tt, ids, TF_I64, &ci);
  if (st == TF_OK) st = tf_tensor_empty(&os, weight->dtype, weight->device, &res);
  if (st == TF_OK && n > 0) {
    tf_embedding_args a = {.n = n, .dim = dim, .vocab = vocab, .ids = ci, .weight = cw, .out = res};
    st = tf_nn_embedding_kernel(ctx, op, &a, ci, &is);
  }
  return tf_nn_finish(&tt, st, res, out);
}

tf_status tf_embedding_backward(const tf_tensor *dout, const tf_tensor *ids, int64_t vocab, tf_dtype dtype,
                                tf_tensor **dweight) {
  const char *op = "embedding_backward";
  TF_TRY(tf_nn_need_float(op, "dout", dout));
  TF_TRY(tf_nn_need_index(op, "ids", ids));
  TF_TRY(tf_nn_same_device(op, "ids", ids, "dout", dout));
  if (vocab < 0) return tf_fail(TF_ERR_ARG, "%s: vocab must be >= 0, not %lld", op, (long long)vocab);
  if ((unsigned)dtype >= TF_NDTYPES || !tf_dtype_is_float(dtype) || tf_dtype_is_fp8(dtype))
    return tf_fail(TF_ERR_ARG, "%s: the gradient's dtype must be a floating one (f32, f16, bf16 or f64)", op);
  tf_shape is = tf_tensor_shape(ids);
  bool fits = dout->ndim == ids->ndim + 1;
  for (int i = 0; fits && i < ids->ndim; i++) fits = dout->shape[i] == ids->shape[i];
  if (!fits) {
    char have[128], want[128];
    return tf_fail(TF_ERR_ARG, "%s: dout must have shape %s plus a last dim (the ids' shape, then dim), not %s", op,
                   tf_shape_format(&is, want, sizeof want), tf_nn_shape_of(dout, have, sizeof have));
  }
  int64_t dim = dout->shape[dout->ndim - 1], n = tf_tensor_numel(ids);
  tf_dtype sd = tf_nn_stat_dtype(dtype);
  tf_shape ws = {2, {vocab, dim}};
  TF_TRY(tf_shape_check(&ws));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(dout->device, &ctx));
  tf_temps tt = {0};
  tf_tensor *res = NULL;
  const tf_tensor *cd, *ci;
  tf_status st = tf_nn_prepare(&tt, dout, dout->dtype, &cd);
  if (st == TF_OK) st = tf_nn_prepare(&tt, ids, TF_I64, &ci);
  if (st == TF_OK) st = n > 0 ? tf_tensor_empty(&ws, sd, dout->device, &res) : tf_nn_zeros(&ws, sd, dout->device, &res);
  if (st == TF_OK && n > 0) {
    tf_embedding_args a = {.backward = true, .n = n, .dim = dim, .vocab = vocab, .ids = ci, .dout = cd,
                           .dweight = res};
    st = tf_nn_embedding_kernel(ctx, op, &a, ci, &is);
  }
  if (st == TF_OK) st = tf_nn_to_dtype(&res, dtype);
  return tf_nn_finish(&tt, st, res, dweight);
}

/* ---- masked_fill ------------------------------------------------------------------ */

tf_status tf_masked_fill(const tf_tensor *x, const tf_tensor *mask, double value, tf_tensor **out) {
  const char *op = "masked_fill";
  if (mask->dtype != TF_BOOL)
    return tf_fail(TF_ERR_ARG, "%s: mask must be bool, not %s (compare to get one: x:eq(0))", op,
                   tf_dtype_name(mask->dtype));
  TF_TRY(tf_nn_same_device(op, "mask", mask, "x", x));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(x->device, &ctx));
  tf_shape s = tf_tensor_shape(x);
  tf_tensor *em = NULL, *res = NULL;
  tf_status st = tf_expand(mask, &s, &em);
  if (st != TF_OK) {
    char xs[128];
    tf_fail_context("%s: mask must broadcast to x's shape %s", op, tf_shape_format(&s, xs, sizeof xs));
    return st;
  }
  st = tf_tensor_empty(&s, x->dtype, x->device, &res);
  if (st == TF_OK && tf_tensor_numel(res) > 0) st = ctx->backend->masked_fill(ctx, x, em, value, res);
  tf_tensor_release(em);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

/* ---- adamw ------------------------------------------------------------------------- */

/* A state tensor (m or v) or the gradient: p's shape and device. */
static tf_status tf_nn_adamw_like(const char *arg, const tf_tensor *t, const tf_tensor *p) {
  const char *op = "adamw_step";
  TF_TRY(tf_nn_same_device(op, arg, t, "p", p));
  tf_shape s = tf_tensor_shape(p);
  return tf_nn_need_shape(op, arg, t, &s, "the shape of p");
}

tf_status tf_adamw_step(tf_tensor *p, const tf_tensor *g, tf_tensor *m, tf_tensor *v, const tf_adamw_args *args) {
  return tf_adamw_step_with_low(p, g, m, v, NULL, args);
}

tf_status tf_adamw_step_with_low(tf_tensor *p, const tf_tensor *g, tf_tensor *m, tf_tensor *v, tf_tensor *low,
                                 const tf_adamw_args *args) {
  const char *op = "adamw_step";
  if (p->dtype != TF_F32 && p->dtype != TF_F64)
    return tf_fail(TF_ERR_ARG, "%s: p must be f32 or f64 (keep a full-precision master copy), not %s", op,
                   tf_dtype_name(p->dtype));
  const tf_tensor *state[2] = {m, v};
  const char *names[2] = {"m", "v"};
  for (int i = 0; i < 2; i++) {
    if (state[i]->dtype != p->dtype)
      return tf_fail(TF_ERR_ARG, "%s: %s must have p's dtype %s, not %s", op, names[i], tf_dtype_name(p->dtype),
                     tf_dtype_name(state[i]->dtype));
    TF_TRY(tf_nn_adamw_like(names[i], state[i], p));
  }
  TF_TRY(tf_nn_need_float(op, "g", g));
  TF_TRY(tf_nn_adamw_like("g", g, p));
  const tf_tensor *inplace[3] = {p, m, v};
  const char *inames[3] = {"p", "m", "v"};
  for (int i = 0; i < 3; i++)
    if (!tf_tensor_is_contiguous(inplace[i]))
      return tf_fail(TF_ERR_ARG, "%s: %s is updated in place and must be contiguous", op, inames[i]);
  if (low) {
    if (p->dtype != TF_F32 || (low->dtype != TF_BF16 && low->dtype != TF_F16))
      return tf_fail(TF_ERR_ARG, "%s: the low-precision copy is bf16 or f16 of f32 parameters, not %s of %s", op,
                     tf_dtype_name(low->dtype), tf_dtype_name(p->dtype));
    TF_TRY(tf_nn_same_device(op, "low", low, "p", p));
    if (!tf_tensor_is_contiguous(low) || tf_tensor_numel(low) > tf_tensor_numel(p))
      return tf_fail(TF_ERR_ARG, "%s: the low-precision copy must be contiguous and no longer than p", op);
  }
  tf_adamw_update u = {.p = p, .m = m, .v = v, .low = low};
  TF_TRY(tf_adamw_constants(op, args, &u));
  if (tf_tensor_numel(p) == 0) return TF_OK;
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(p->device, &ctx));
  tf_temps tt = {0};
  const tf_tensor *cg;
  tf_status st = tf_nn_prepare(&tt, g, g->dtype, &cg);
  if (st == TF_OK) {
    u.g = cg;
    st = ctx->backend->adamw(ctx, &u);
  }
  tf_temps_drop(&tt);
  return st;
}

tf_status tf_adamw_constants(const char *op, const tf_adamw_args *args, tf_adamw_update *u) {
  const tf_adamw_args *a = args;
  if (a->step < 1) return tf_fail(TF_ERR_ARG, "%s: step counts from 1, not %lld", op, (long long)a->step);
  if (!(a->lr >= 0) || !isfinite(a->lr))
    return tf_fail(TF_ERR_ARG, "%s: lr must be a finite number >= 0, not %g", op, a->lr);
  if (!(a->beta1 >= 0 && a->beta1 < 1)) return tf_fail(TF_ERR_ARG, "%s: beta1 must be in [0, 1), not %g", op, a->beta1);
  if (!(a->beta2 >= 0 && a->beta2 < 1)) return tf_fail(TF_ERR_ARG, "%s: beta2 must be in [0, 1), not %g", op, a->beta2);
  if (!(a->eps >= 0) || !isfinite(a->eps))
    return tf_fail(TF_ERR_ARG, "%s: eps must be a finite number >= 0, not %g", op, a->eps);
  if (!(a->weight_decay >= 0) || !isfinite(a->weight_decay))
    return tf_fail(TF_ERR_ARG, "%s: weight_decay must be a finite number >= 0, not %g", op, a->weight_decay);
  const double steps = (double)a->step;
  u->decay = 1.0 - a->lr * a->weight_decay;
  u->beta1 = a->beta1;
  u->beta2 = a->beta2;
  u->step_size = a->lr / (1.0 - pow(a->beta1, steps));
  u->bias2_sqrt = sqrt(1.0 - pow(a->beta2, steps));
  u->eps = a->eps;
  return TF_OK;
}

/* ---- FP8 products ------------------------------------------------------ */

/* A scale of scaled_matmul: f32, contiguous, on the operands' device, of
 * one value (tensorwise) or of count values (rowwise: (count,), (count, 1)
 * for a, (1, count) for b). */
static tf_status tf_nn_scale_check(const char *op, const char *arg, const tf_tensor *s, const tf_tensor *a,
                                   bool rowwise, int64_t count) {
  TF_TRY(tf_nn_same_device(op, arg, s, "a", a));
  if (s->dtype != TF_F32) return tf_fail(TF_ERR_ARG, "%s: %s must be f32, not %s", op, arg, tf_dtype_name(s->dtype));
  if (!tf_tensor_is_contiguous(s)) return tf_fail(TF_ERR_ARG, "%s: %s must be contiguous", op, arg);
  if (s->device.type == TF_DEV_CUDA && ((uintptr_t)tf_tensor_data(s) & 15) != 0) /* cuBLASLt refuses them at launch */
    return tf_fail(TF_ERR_ARG, "%s: %s's data must start on a 16-byte boundary on a GPU (a view into another "
                   "tensor may not): pass %s:clone()", op, arg, arg);
  const int64_t want = rowwise ? count : 1;
  if (tf_tensor_numel(s) == want) return TF_OK;
  char have[128];
  return tf_fail(TF_ERR_ARG, "%s: %s has shape %s; %s scales have %lld value%s (%s)", op, arg,
                 tf_nn_shape_of(s, have, sizeof have), rowwise ? "rowwise" : "tensorwise", (long long)want,
                 want == 1 ? "" : "s",
                 rowwise ? (strcmp(arg, "scale_a") == 0 ? "one for each row of a" : "one for each column of b")
                         : "one for the whole operand");
}

/* Whether a's device has FP8 tensor cores (compute capability 8.9 or newer); the CPU computes FP8 products too. */
static tf_status tf_nn_fp8_device(const char *op, const tf_tensor *a) {
  if (a->device.type != TF_DEV_CUDA) return TF_OK;
  tf_device_info info;
  TF_TRY(tf_device_info_get(a->device, &info));
  if (info.cc_major * 10 + info.cc_minor >= 89) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: %s (compute capability %d.%d) has no FP8 tensor cores; they need 8.9 or newer "
                 "(Ada, Hopper); the CPU computes FP8 products too", op, info.name, info.cc_major, info.cc_minor);
}

tf_status tf_scaled_matmul(const tf_tensor *a, const tf_tensor *b, const tf_scaled_matmul_opts *o, tf_tensor **out,
                           tf_tensor **amax) {
  const char *op = "scaled_matmul";
  char sa[128], sb[128];
  if (!tf_dtype_is_fp8(a->dtype) || !tf_dtype_is_fp8(b->dtype))
    return tf_fail(TF_ERR_ARG, "%s: a and b must be f8e4m3 or f8e5m2 (tf.cast them, with {saturate = true} for "
                   "scaled values), not %s and %s", op, tf_dtype_name(a->dtype), tf_dtype_name(b->dtype));
  if (a->dtype == TF_F8E5M2 && b->dtype == TF_F8E5M2)
    return tf_fail(TF_ERR_ARG, "%s: a and b cannot both be f8e5m2 (the tensor cores take e4m3 x e4m3, e4m3 x e5m2 "
                   "and e5m2 x e4m3)", op);
  TF_TRY(tf_nn_same_device(op, "b", b, "a", a));
  if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0])
    return tf_fail(TF_ERR_ARG, "%s: a must be (m, k) and b (k, n), not %s and %s", op, tf_nn_shape_of(a, sa, sizeof sa),
                   tf_nn_shape_of(b, sb, sizeof sb));
  const int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
  if (k % 16 != 0 || n % 16 != 0)
    return tf_fail(TF_ERR_ARG, "%s: k and n must be multiples of 16 (FP8 rows are read in 16-byte words), not k=%lld, "
                   "n=%lld", op, (long long)k, (long long)n);
  /* a row-major (m, k) and b the transpose of a row-major (n, k): each operand's rows along k */
  const bool a_rows = a->strides[1] == 1 && (m <= 1 || a->strides[0] >= k),
             b_cols = b->strides[0] == 1 && (n <= 1 || b->strides[1] >= k);
  if (!a_rows || !b_cols)
    return tf_fail(TF_ERR_ARG, "%s: a must be row-major and b column-major (b = w:t() of a row-major (n, k) w), the "
                   "one layout FP8 tensor cores take; %s has strides (%lld, %lld)%s", op, !a_rows ? "a" : "b",
                   (long long)(!a_rows ? a->strides[0] : b->strides[0]),
                   (long long)(!a_rows ? a->strides[1] : b->strides[1]),
                   !a_rows ? ": use a:contiguous()" : ": use b:t():contiguous():t()");
  const int64_t lda = m <= 1 ? k : a->strides[0], ldb = n <= 1 ? k : b->strides[1];
  const uint8_t *pa = (const uint8_t *)tf_tensor_data(a), *pb = (const uint8_t *)tf_tensor_data(b);
  if (lda % 16 != 0 || ldb % 16 != 0 || ((uintptr_t)pa & 15) != 0 || ((uintptr_t)pb & 15) != 0)
    return tf_fail(TF_ERR_ARG, "%s: a's and b's data and row strides must be whole 16-byte words (a view at an odd "
                   "offset is not); use :contiguous()", op);
  const tf_dtype od = o->out_dtype;
  if (od != TF_F32 && od != TF_BF16 && od != TF_F16)
    return tf_fail(TF_ERR_ARG, "%s: out_dtype must be bf16, f16 or f32, not %s", op, tf_dtype_name(od));
  if (!o->scale_a || !o->scale_b) return tf_fail(TF_ERR_ARG, "%s: scale_a and scale_b are needed", op);
  const bool rowwise = tf_tensor_numel(o->scale_a) != 1 || tf_tensor_numel(o->scale_b) != 1;
  TF_TRY(tf_nn_scale_check(op, "scale_a", o->scale_a, a, rowwise, m));
  TF_TRY(tf_nn_scale_check(op, "scale_b", o->scale_b, a, rowwise, n));
  TF_TRY(tf_nn_fp8_device(op, a));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(a->device, &ctx));
  tf_tensor *res = NULL, *top = NULL;
  const tf_shape os = {2, {m, n}}, scalar = {0, {0}};
  tf_status st = tf_tensor_empty(&os, od, a->device, &res);
  if (st == TF_OK && amax) st = tf_full(&scalar, 0.0, TF_F32, a->device, &top);
  if (st == TF_OK && m > 0 && n > 0) {
    const tf_gemm_scaled x = {.a_dtype = a->dtype, .b_dtype = b->dtype,
                              .scale_a = (const float *)tf_tensor_data(o->scale_a),
                              .scale_b = (const float *)tf_tensor_data(o->scale_b), .rowwise = rowwise,
                              .fast_accum = o->fast_accum, .amax = top ? (float *)tf_tensor_data(top) : NULL};
    const tf_gemm_args g = {.a = pa, .b = pb, .c = tf_tensor_data(res), .ab_dtype = a->dtype, .c_dtype = od,
                            .batch = 1, .m = m, .n = n, .k = k, .trans_b = true, .lda = lda, .ldb = ldb, .ldc = n,
                            .scaled = &x};
    st = ctx->backend->model->gemm(ctx, &g);
  }
  if (st != TF_OK) {
    tf_tensor_release(res);
    tf_tensor_release(top);
    return st;
  }
  *out = res;
  if (amax) *amax = top;
  return TF_OK;
}
