/* The CUDA kernels of the fused neural-network ops and of the comparison
 * ops against their CPU twins, on the same fresh random inputs (the seed is
 * printed; TF_TEST_SEED repeats a run): f32 within 1e-5 relative error, f64
 * 1e-12, f16/bf16 1e-2; copies, masks and comparisons bit-identical;
 * embedding_backward bit-identical across two GPU runs; out-of-range ids
 * and targets reported on the GPU with the CPU's message, the GPU usable
 * afterwards. Shapes cover every kernel path (vector and scalar loads,
 * misaligned rows, narrow and 1024-thread row groups, few long rows, many
 * short ones). Ends with a table of the worst errors and, unless
 * TF_TEST_SMALL is set (for compute-sanitizer runs), timings at Transformer
 * shapes. Exits 77 without a GPU. */
#include "backends.h"
#include "clock.h"
#include "err_table.h"
#include "gpu_twins.h"

static bool small_run;

static double gpu_tol(tf_dtype d) {
  switch (d) {
    case TF_F64: return 1e-12;
    case TF_F32: return 1e-5;
    default: return 1e-2;
  }
}

/* Column sums over many rows (weight gradients) add in another order on
 * the GPU: f64 gets a little more room. */
static double sum_tol(tf_dtype d) { return d == TF_F64 ? 1e-11 : gpu_tol(d); }

/* ---- the worst error per (op, dtype), printed at the end ------------------------ */


/* ---- tensors on both devices ------------------------------------------------------ */

typedef struct {
  tf_tensor *c, *g;
} pair;

static tf_tensor *to_gpu(const tf_tensor *t) {
  tf_tensor *g = NULL;
  if (!CHECK_OK(tf_to(t, t->dtype, GPU, &g))) exit(1);
  return g;
}

static pair pair_of(tf_tensor *cpu) { return (pair){cpu, to_gpu(cpu)}; }
static pair pair_randn(tf_shape s, tf_dtype d, double scale) { return pair_of(tensor_randn(s, d, scale, NULL)); }

static pair pair_ints(tf_shape s, tf_dtype d, int64_t lo, int64_t hi) {
  int64_t n = tf_shape_numel(&s);
  double *v = values_alloc(n);
  for (int64_t i = 0; i < n; i++) v[i] = (double)rng_int(lo, hi);
  tf_tensor *t = tensor_from(v, s, d);
  free(v);
  return pair_of(t);
}

/* A contiguous view of shape s starting one element into its storage, so
 * that its rows are misaligned for vector loads. */
static pair pair_misaligned(tf_shape s, tf_dtype d, double scale) {
  int64_t n = tf_shape_numel(&s);
  tf_tensor *flat = tensor_randn(SHAPE(n + 1), d, scale, NULL), *tail = NULL, *view = NULL;
  CHECK_OK(tf_narrow(flat, 0, 1, n, &tail));
  CHECK_OK(tf_reshape(tail, &s, &view));
  tf_tensor *g = to_gpu(flat), *gt = NULL, *gv = NULL;
  CHECK_OK(tf_narrow(g, 0, 1, n, &gt));
  CHECK_OK(tf_reshape(gt, &s, &gv));
  tf_tensor_release(flat), tf_tensor_release(tail), tf_tensor_release(g), tf_tensor_release(gt);
  return (pair){view, gv};
}

static void pair_release(pair *p) {
  tf_tensor_release(p->c);
  tf_tensor_release(p->g);
  p->c = p->g = NULL;
}

/* The GPU result against the CPU one: device, shape and dtype, then values
 * within tol (normwise); recorded in the table. */
static bool same(const char *op, const char *shape_note, const tf_tensor *g, const tf_tensor *c, double tol) {
  if (!CHECK(g && c)) return false;
  bool ok = CHECK_INT(g->device.type, TF_DEV_CUDA) && CHECK_INT(g->dtype, c->dtype) && CHECK_INT(g->ndim, c->ndim);
  for (int i = 0; ok && i < c->ndim; i++) ok = CHECK_INT(g->shape[i], c->shape[i]);
  if (!ok) return false;
  double *gv = tensor_values(g), *cv = tensor_values(c);
  double e = rel_error(gv, cv, tf_tensor_numel(c));
  free(gv), free(cv);
  record(op, c->dtype, e, tol);
  if (!(e <= tol)) fprintf(stderr, "FAIL %s %s %s: relative error %.3g > %.3g\n", op, tf_dtype_name(c->dtype),
                           shape_note, e, tol);
  return CHECK(e <= tol);
}

/* Bit-for-bit equality of two tensors' contents (any devices). */
static bool identical(const char *op, const tf_tensor *a, const tf_tensor *b) {
  if (!CHECK(a && b) || !CHECK_INT(a->dtype, b->dtype) || !CHECK_INT(tf_tensor_numel(a), tf_tensor_numel(b)))
    return false;
  tf_tensor *ca = NULL, *cb = NULL;
  CHECK_OK(tf_to(a, a->dtype, tf_cpu(), &ca));
  CHECK_OK(tf_to(b, b->dtype, tf_cpu(), &cb));
  bool eq = tf_tensor_nbytes(ca) == 0 || memcmp(tf_tensor_data(ca), tf_tensor_data(cb), tf_tensor_nbytes(ca)) == 0;
  tf_tensor_release(ca), tf_tensor_release(cb);
  record(op, a->dtype, eq ? 0.0 : INFINITY, 0.0);
  if (!eq) fprintf(stderr, "FAIL %s %s: results differ in their bits\n", op, tf_dtype_name(a->dtype));
  return CHECK(eq);
}

static const char *shape_note(tf_shape s, char *buf, size_t n) { return tf_shape_format(&s, buf, n); }

/* Row shapes (rows, cols) that reach every path of the row kernels. */
typedef struct {
  int64_t rows, cols;
  bool big; /* skipped when TF_TEST_SMALL is set */
} row_case;

static const row_case ROW_CASES[] = {
    {1, 1, false},      {3, 7, false},     {5, 64, false},   {300, 768, false}, {64, 1000, false},
    {257, 1001, false}, {2, 10000, false}, {1, 65536, true}, {4096, 768, true}, {1024, 1024, true},
    {130, 4099, true},
};
enum { N_ROW_CASES = sizeof ROW_CASES / sizeof ROW_CASES[0] };

/* ---- softmax ----------------------------------------------------------------------- */

static void softmax_case(tf_shape s, tf_dtype d, bool misaligned) {
  char note[96];
  shape_note(s, note, sizeof note);
  if (misaligned) strncat(note, " misaligned", sizeof note - strlen(note) - 1);
  pair x = misaligned ? pair_misaligned(s, d, 3.0) : pair_randn(s, d, 3.0);
  pair dy = misaligned ? pair_misaligned(s, d, 1.0) : pair_randn(s, d, 1.0);
  for (int log_ = 0; log_ < 2; log_++) {
    tf_tensor *yc = NULL, *yg = NULL, *dc = NULL, *dg = NULL;
    const char *op = log_ ? "log_softmax" : "softmax";
    if (CHECK_OK(tf_softmax(x.c, log_, &yc)) && CHECK_OK(tf_softmax(x.g, log_, &yg))) {
      same(op, note, yg, yc, gpu_tol(d));
      /* the backward pass from the same y on both devices */
      tf_tensor *yg_from_c = to_gpu(yc);
      if (CHECK_OK(tf_softmax_backward(yc, dy.c, log_, &dc)) &&
          CHECK_OK(tf_softmax_backward(yg_from_c, dy.g, log_, &dg)))
        same(log_ ? "log_softmax_backward" : "softmax_backward", note, dg, dc, gpu_tol(d));
      tf_tensor_release(yg_from_c);
    }
    tf_tensor_release(yc), tf_tensor_release(yg), tf_tensor_release(dc), tf_tensor_release(dg);
  }
  pair_release(&x), pair_release(&dy);
}

static void test_softmax(void) {
  for (int di = 0; di < N_FLOAT_DTYPES; di++) {
    for (int i = 0; i < N_ROW_CASES; i++)
      if (!(small_run && ROW_CASES[i].big))
        softmax_case(SHAPE(ROW_CASES[i].rows, ROW_CASES[i].cols), FLOAT_DTYPES[di], false);
    softmax_case(SHAPE(2, 3, 64), FLOAT_DTYPES[di], true);
    softmax_case(SHAPE(33, 1000), FLOAT_DTYPES[di], true);
  }
  /* masked rows: some entries -inf, one row all -inf (NaN on both) */
  double v[2 * 8] = {1, -INFINITY, 2, 3, -INFINITY, 0, 0, 1};
  for (int i = 8; i < 16; i++) v[i] = -INFINITY;
  v[0] = -INFINITY;
  pair x = pair_of(tensor_from(v, SHAPE(2, 8), TF_F32));
  tf_tensor *yc = NULL, *yg = NULL;
  if (CHECK_OK(tf_softmax(x.c, false, &yc)) && CHECK_OK(tf_softmax(x.g, false, &yg)))
    same("softmax", "masked", yg, yc, 1e-6);
  tf_tensor_release(yc), tf_tensor_release(yg);
  pair_release(&x);
}

/* ---- layer_norm and rms_norm --------------------------------------------------------- */

static void norm_case(tf_shape s, tf_dtype d, int weights, bool misaligned) {
  char note[96];
  shape_note(s, note, sizeof note);
  snprintf(note + strlen(note), sizeof note - strlen(note), " weights %d%s", weights, misaligned ? " misaligned" : "");
  int64_t cols = s.dims[s.ndim - 1];
  tf_dtype wd = weights == 1 ? TF_F32 : d; /* 1: f32 weights (autocast style), 2: x's dtype */
  pair x = misaligned ? pair_misaligned(s, d, 2.0) : pair_randn(s, d, 2.0);
  pair dy = pair_randn(s, d, 1.0);
  pair w = {0}, b = {0};
  if (weights) {
    w = pair_randn(SHAPE(cols), wd, 1.0);
    b = pair_randn(SHAPE(cols), wd, 1.0);
  }
  const double eps = 1e-5;
  double tol = gpu_tol(d), stol = d == TF_F64 ? 1e-12 : 1e-5;
  tf_tensor *yc = NULL, *yg = NULL, *mc = NULL, *mg = NULL, *rc = NULL, *rg = NULL;
  if (CHECK_OK(tf_layer_norm(x.c, w.c, b.c, eps, &yc, &mc, &rc)) &&
      CHECK_OK(tf_layer_norm(x.g, w.g, b.g, eps, &yg, &mg, &rg))) {
    same("layer_norm", note, yg, yc, tol);
    /* a row's mean is a sum of many terms near zero (about 1/sqrt(cols) here): a sum's tolerance */
    same("layer_norm mean", note, mg, mc, d == TF_F64 ? sum_tol(d) : stol);
    same("layer_norm rstd", note, rg, rc, stol);
    /* backward from the CPU's statistics on both devices */
    tf_tensor *mcg = to_gpu(mc), *rcg = to_gpu(rc);
    tf_tensor *dxc = NULL, *dxg = NULL, *dwc = NULL, *dwg = NULL, *dbc = NULL, *dbg = NULL;
    if (CHECK_OK(tf_layer_norm_backward(dy.c, x.c, w.c, mc, rc, &dxc, weights ? &dwc : NULL, &dbc)) &&
        CHECK_OK(tf_layer_norm_backward(dy.g, x.g, w.g, mcg, rcg, &dxg, weights ? &dwg : NULL, &dbg))) {
      /* one column: dx is exactly zero on the CPU and rounding noise on the GPU */
      if (cols > 1) same("layer_norm_backward dx", note, dxg, dxc, tol);
      if (weights) same("layer_norm_backward dw", note, dwg, dwc, sum_tol(dwc->dtype));
      same("layer_norm_backward db", note, dbg, dbc, sum_tol(dbc->dtype));
    }
    tf_tensor *ts[] = {mcg, rcg, dxc, dxg, dwc, dwg, dbc, dbg};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tf_tensor_release(ts[i]);
  }
  tf_tensor *ts1[] = {yc, yg, mc, mg, rc, rg};
  for (size_t i = 0; i < sizeof ts1 / sizeof ts1[0]; i++) tf_tensor_release(ts1[i]);
  yc = yg = rc = rg = NULL;
  if (CHECK_OK(tf_rms_norm(x.c, w.c, eps, &yc, &rc)) && CHECK_OK(tf_rms_norm(x.g, w.g, eps, &yg, &rg))) {
    same("rms_norm", note, yg, yc, tol);
    same("rms_norm rstd", note, rg, rc, stol);
    tf_tensor *rcg = to_gpu(rc), *dxc = NULL, *dxg = NULL, *dgc = NULL, *dgg = NULL;
    if (CHECK_OK(tf_rms_norm_backward(dy.c, x.c, w.c, rc, &dxc, weights ? &dgc : NULL)) &&
        CHECK_OK(tf_rms_norm_backward(dy.g, x.g, w.g, rcg, &dxg, weights ? &dgg : NULL))) {
      /* one column: dx = rstd g dy eps / (x^2 + eps) is all cancellation */
      if (cols > 1) same("rms_norm_backward dx", note, dxg, dxc, tol);
      if (weights) same("rms_norm_backward dg", note, dgg, dgc, sum_tol(dgc->dtype));
    }
    tf_tensor *ts[] = {rcg, dxc, dxg, dgc, dgg};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tf_tensor_release(ts[i]);
  }
  tf_tensor_release(yc), tf_tensor_release(yg), tf_tensor_release(rc), tf_tensor_release(rg);
  pair_release(&x), pair_release(&dy), pair_release(&w), pair_release(&b);
}

static void test_norms(void) {
  for (int di = 0; di < N_FLOAT_DTYPES; di++) {
    tf_dtype d = FLOAT_DTYPES[di];
    for (int i = 0; i < N_ROW_CASES; i++) {
      if (small_run && ROW_CASES[i].big) continue;
      tf_shape s = SHAPE(ROW_CASES[i].rows, ROW_CASES[i].cols);
      for (int weights = 0; weights < 3; weights++) norm_case(s, d, weights, false);
    }
    norm_case(SHAPE(4, 5, 768), d, 1, true);
    norm_case(SHAPE(7, 2560), d, 2, true);
  }
}

/* ---- cross_entropy ------------------------------------------------------------------ */

static void ce_case(int64_t rows, int64_t cols, tf_dtype d, tf_dtype td, bool misaligned) {
  char note[96];
  snprintf(note, sizeof note, "(%lld, %lld) targets %s%s", (long long)rows, (long long)cols, tf_dtype_name(td),
           misaligned ? " misaligned" : "");
  pair x = misaligned ? pair_misaligned(SHAPE(rows, cols), d, 3.0) : pair_randn(SHAPE(rows, cols), d, 3.0);
  pair t = pair_ints(SHAPE(rows), td, 0, cols);
  pair dloss = pair_of(tensor_from((double[]){1.3}, SCALAR, TF_F32));
  tf_tensor *lc = NULL, *lg = NULL, *sc = NULL, *sg = NULL;
  if (CHECK_OK(tf_cross_entropy(x.c, t.c, &lc, &sc)) && CHECK_OK(tf_cross_entropy(x.g, t.g, &lg, &sg))) {
    same("cross_entropy loss", note, lg, lc, gpu_tol(d));
    same("cross_entropy lse", note, sg, sc, d == TF_F64 ? 1e-12 : 1e-5);
    tf_tensor *scg = to_gpu(sc), *dc = NULL, *dg = NULL;
    if (CHECK_OK(tf_cross_entropy_backward(x.c, t.c, sc, dloss.c, &dc)) &&
        CHECK_OK(tf_cross_entropy_backward(x.g, t.g, scg, dloss.g, &dg)))
      same("cross_entropy_backward", note, dg, dc, gpu_tol(d));
    tf_tensor_release(scg), tf_tensor_release(dc), tf_tensor_release(dg);
  }
  tf_tensor_release(lc), tf_tensor_release(lg), tf_tensor_release(sc), tf_tensor_release(sg);
  pair_release(&x), pair_release(&t), pair_release(&dloss);
}

/* A bad index is an error on both devices with the very same message, and
 * the GPU goes on working. */
static void check_same_error(const char *op, tf_status sc, tf_status sg, const char *msg_cpu) {
  CHECK_INT(sc, TF_ERR_ARG);
  CHECK_INT(sg, TF_ERR_ARG);
  if (!CHECK(strcmp(msg_cpu, tf_last_error()) == 0))
    fprintf(stderr, "%s: CPU says \"%s\", GPU says \"%s\"\n", op, msg_cpu, tf_last_error());
  pair x = pair_randn(SHAPE(3, 5), TF_F32, 1.0);
  tf_tensor *yg = NULL;
  CHECK_OK(tf_softmax(x.g, false, &yg));
  CHECK_OK(tf_device_sync(GPU));
  tf_tensor_release(yg);
  pair_release(&x);
}

static void test_cross_entropy(void) {
  for (int di = 0; di < N_FLOAT_DTYPES; di++) {
    tf_dtype d = FLOAT_DTYPES[di];
    ce_case(1, 1, d, TF_I64, false);
    ce_case(5, 7, d, TF_I32, false);
    ce_case(300, 1000, d, TF_I64, false);
    ce_case(17, 1000, d, TF_I32, true);
    ce_case(17, 1001, d, TF_I32, false);
    if (!small_run) {
      ce_case(2048, 10000, d, TF_I64, false);
      ce_case(16, 50257, d, TF_I32, false);
      ce_case(3, 100000, d, TF_I64, false);
    }
  }
  /* targets out of range: the first bad one named, on the GPU too */
  pair x = pair_randn(SHAPE(2, 3, 10), TF_F32, 1.0);
  pair t = pair_of(tensor_from((double[]){1, 2, 9, 40, -3, 0}, SHAPE(2, 3), TF_I32));
  tf_tensor *lc = NULL, *lg = NULL;
  tf_status sc = tf_cross_entropy(x.c, t.c, &lc, NULL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", tf_last_error());
  tf_status sg = tf_cross_entropy(x.g, t.g, &lg, NULL);
  check_same_error("cross_entropy", sc, sg, msg);
  CHECK(strstr(msg, "target 40") && strstr(msg, "[1, 0]"));
  pair_release(&x), pair_release(&t);
}

/* ---- rope ------------------------------------------------------------------------------ */

static void rope_case(tf_shape s, tf_dtype d, int mode, double tol) {
  char note[96];
  shape_note(s, note, sizeof note);
  snprintf(note + strlen(note), sizeof note - strlen(note), " positions %d", mode);
  int64_t T = s.dims[s.ndim - 2];
  pair x = pair_randn(s, d, 1.0), pos = {0};
  if (mode == 1) pos = pair_ints(SHAPE(T), TF_I32, 0, 100000); /* broadcast over batch and heads */
  if (mode == 2) pos = pair_ints(SHAPE(s.dims[0], 1, T), TF_I64, 0, 8192);
  for (int inverse = 0; inverse < 2; inverse++) {
    tf_tensor *yc = NULL, *yg = NULL;
    if (CHECK_OK(tf_rope(x.c, pos.c, 10000.0, inverse, &yc)) && CHECK_OK(tf_rope(x.g, pos.g, 10000.0, inverse, &yg)))
      same(inverse ? "rope inverse" : "rope", note, yg, yc, tol);
    tf_tensor_release(yc), tf_tensor_release(yg);
  }
  pair_release(&x), pair_release(&pos);
}

static void test_rope(void) {
  for (int di = 0; di < N_FLOAT_DTYPES; di++)
    for (int mode = 0; mode < 3; mode++) {
      tf_dtype d = FLOAT_DTYPES[di];
      rope_case(SHAPE(2, 3, 17, 64), d, mode, gpu_tol(d));
      rope_case(SHAPE(1, 2, 5, 2), d, mode, gpu_tol(d));
      rope_case(SHAPE(1, 1, 3, 512), d, mode, gpu_tol(d)); /* the largest row with host frequencies */
      if (!small_run) rope_case(SHAPE(4, 12, 256, 64), d, mode, gpu_tol(d));
      /* longer rows take the device's pow: angles up to 1e5 may differ by an
       * ulp, about 1e-11 of a turn, which only f64 results can see */
      rope_case(SHAPE(1, 2, 9, 1026), d, mode, d == TF_F64 ? 1e-9 : gpu_tol(d));
    }
}

/* ---- embedding ------------------------------------------------------------------------- */

static void embedding_case(int64_t vocab, int64_t dim, tf_dtype wd, tf_shape ids_shape, tf_dtype idt, int64_t id_hi) {
  char note[96];
  snprintf(note, sizeof note, "vocab %lld dim %lld ids %lld (< %lld)", (long long)vocab, (long long)dim,
           (long long)tf_shape_numel(&ids_shape), (long long)id_hi);
  pair w = pair_randn(SHAPE(vocab, dim), wd, 5.0), ids = pair_ints(ids_shape, idt, 0, id_hi);
  tf_tensor *oc = NULL, *og = NULL;
  if (CHECK_OK(tf_embedding(w.c, ids.c, &oc)) && CHECK_OK(tf_embedding(w.g, ids.g, &og))) {
    CHECK_INT(og->device.type, TF_DEV_CUDA);
    identical("embedding", og, oc);
  }
  tf_tensor_release(oc), tf_tensor_release(og);
  if (tf_dtype_is_float(wd)) {
    tf_shape os = ids_shape;
    os.dims[os.ndim++] = dim;
    for (int gi = 0; gi < N_FLOAT_DTYPES; gi++) {
      tf_dtype gd = FLOAT_DTYPES[gi];
      if (gd != wd && gd != TF_F32) continue; /* dout in the weight's dtype, or f32 */
      pair dout = pair_randn(os, gd, 1.0);
      tf_tensor *dc = NULL, *dg1 = NULL, *dg2 = NULL;
      if (CHECK_OK(tf_embedding_backward(dout.c, ids.c, vocab, wd, &dc)) &&
          CHECK_OK(tf_embedding_backward(dout.g, ids.g, vocab, wd, &dg1)) &&
          CHECK_OK(tf_embedding_backward(dout.g, ids.g, vocab, wd, &dg2))) {
        same("embedding_backward", note, dg1, dc, sum_tol(wd));
        identical("embedding_backward twice", dg1, dg2);
      }
      tf_tensor_release(dc), tf_tensor_release(dg1), tf_tensor_release(dg2);
      pair_release(&dout);
    }
  }
  pair_release(&w), pair_release(&ids);
}

static void test_embedding(void) {
  const tf_dtype wdts[] = {TF_F32, TF_BF16, TF_F64, TF_F16, TF_I64};
  for (size_t i = 0; i < sizeof wdts / sizeof wdts[0]; i++) {
    embedding_case(100, 768, wdts[i], SHAPE(4, 33), TF_I32, 100); /* 16-byte words */
    embedding_case(50, 3, wdts[i], SHAPE(77), TF_I64, 50);        /* odd rows */
    embedding_case(9, 1, wdts[i], SHAPE(2, 2, 5), TF_I64, 9);
    embedding_case(1000, 64, wdts[i], SHAPE(5000), TF_I32, 4); /* four ids repeated ~1250 times each */
    if (!small_run) embedding_case(10000, 768, wdts[i], SHAPE(4, 1024), TF_I64, 10000);
  }
  /* ids out of range, forward and backward */
  pair w = pair_randn(SHAPE(10, 4), TF_F32, 1.0);
  pair ids = pair_of(tensor_from((double[]){0, 9, 3, 10, 2, -1}, SHAPE(3, 2), TF_I64));
  tf_tensor *oc = NULL, *og = NULL;
  char msg[512];
  tf_status sc = tf_embedding(w.c, ids.c, &oc);
  snprintf(msg, sizeof msg, "%s", tf_last_error());
  tf_status sg = tf_embedding(w.g, ids.g, &og);
  check_same_error("embedding", sc, sg, msg);
  CHECK(strstr(msg, "id 10") && strstr(msg, "[1, 1]"));
  pair dout = pair_randn(SHAPE(3, 2, 4), TF_F32, 1.0);
  sc = tf_embedding_backward(dout.c, ids.c, 10, TF_F32, &oc);
  snprintf(msg, sizeof msg, "%s", tf_last_error());
  sg = tf_embedding_backward(dout.g, ids.g, 10, TF_F32, &og);
  check_same_error("embedding_backward", sc, sg, msg);
  pair_release(&w), pair_release(&ids), pair_release(&dout);
}

/* ---- masked_fill --------------------------------------------------------------------------- */

static void test_masked_fill(void) {
  const tf_dtype dts[] = {TF_F32, TF_BF16, TF_F16, TF_F64, TF_I64, TF_I32, TF_BOOL};
  int64_t T = small_run ? 33 : 257;
  /* a causal mask (T, T) broadcast over (B, H, T, T), and a (B, 1, 1, T) padding mask */
  double *cm = values_alloc(T * T), *pm = values_alloc(2 * T);
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = 0; j < T; j++) cm[i * T + j] = j > i;
  for (int64_t i = 0; i < 2 * T; i++) pm[i] = rng_uniform() < 0.3;
  pair causal = pair_of(tensor_from(cm, SHAPE(T, T), TF_BOOL)),
       pad = pair_of(tensor_from(pm, SHAPE(2, 1, 1, T), TF_BOOL));
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    pair x = pair_randn(SHAPE(2, 3, T, T), dts[i], 4.0);
    tf_tensor *xtc = NULL, *xtg = NULL;
    CHECK_OK(tf_transpose(x.c, 2, 3, &xtc));
    CHECK_OK(tf_transpose(x.g, 2, 3, &xtg));
    const pair *masks[2] = {&causal, &pad};
    for (int m = 0; m < 2; m++)
      for (int strided = 0; strided < 2; strided++) {
        tf_tensor *oc = NULL, *og = NULL;
        double value = m ? 7.75 : -INFINITY;
        if (CHECK_OK(tf_masked_fill(strided ? xtc : x.c, masks[m]->c, value, &oc)) &&
            CHECK_OK(tf_masked_fill(strided ? xtg : x.g, masks[m]->g, value, &og)))
          identical("masked_fill", og, oc);
        tf_tensor_release(oc), tf_tensor_release(og);
      }
    tf_tensor_release(xtc), tf_tensor_release(xtg);
    pair_release(&x);
  }
  pair_release(&causal), pair_release(&pad);
  free(cm), free(pm);
}

/* ---- adamw -------------------------------------------------------------------------------- */

/* low holds exactly what converting p's prefix gives, on p's device. */
static void check_low_is_conversion(tf_tensor *p, tf_tensor *low, const char *where) {
  const int64_t nl = tf_tensor_numel(low), one = 1;
  tf_shape s = {1, {nl}};
  tf_tensor *prefix = NULL, *conv = NULL;
  CHECK_OK(tf_tensor_view(p, &s, &one, 0, &prefix));
  CHECK_OK(tf_full(&s, 0.0, low->dtype, p->device, &conv));
  CHECK_OK(tf_copy_into(conv, prefix));
  uint16_t *a = malloc((size_t)nl * 2), *b = malloc((size_t)nl * 2);
  CHECK_OK(tf_tensor_read(low, a, (size_t)nl * 2));
  CHECK_OK(tf_tensor_read(conv, b, (size_t)nl * 2));
  if (!CHECK(memcmp(a, b, (size_t)nl * 2) == 0)) fprintf(stderr, "  %s: low copy differs from the conversion\n", where);
  free(a), free(b);
  tf_tensor_release(prefix), tf_tensor_release(conv);
}

/* The step that also writes the low-precision copy of p's prefix: the same
 * p, m, v as the plain step, and the copy a conversion would make. */
static void test_adamw_with_low(void) {
  const int64_t n = small_run ? 1001 : 1000003, nl = n / 2 + 3;
  for (int li = 0; li < 2; li++) {
    const tf_dtype ld = li ? TF_F16 : TF_BF16;
    pair p = pair_randn(SHAPE(n), TF_F32, 1.0), g = pair_randn(SHAPE(n), TF_F32, 1.0);
    tf_tensor *zm = NULL, *zv = NULL, *zl = NULL;
    CHECK_OK(tf_full(&SHAPE(n), 0.0, TF_F32, tf_cpu(), &zm));
    CHECK_OK(tf_full(&SHAPE(n), 0.0, TF_F32, tf_cpu(), &zv));
    CHECK_OK(tf_full(&SHAPE(nl), 0.0, ld, tf_cpu(), &zl));
    pair m = pair_of(zm), v = pair_of(zv), low = pair_of(zl);
    tf_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = 1};
    CHECK_OK(tf_adamw_step_with_low(p.c, g.c, m.c, v.c, low.c, &a));
    CHECK_OK(tf_adamw_step_with_low(p.g, g.g, m.g, v.g, low.g, &a));
    same("adamw with low p", tf_dtype_name(ld), p.g, p.c, 1e-5);
    same("adamw with low m", tf_dtype_name(ld), m.g, m.c, 1e-5);
    same("adamw with low copy", tf_dtype_name(ld), low.g, low.c, 1e-2);
    check_low_is_conversion(p.c, low.c, "cpu");
    check_low_is_conversion(p.g, low.g, "cuda");
    /* Bad copies: f32, or longer than p. */
    tf_tensor *f32 = NULL, *longer = NULL;
    CHECK_OK(tf_full(&SHAPE(4), 0.0, TF_F32, tf_cpu(), &f32));
    CHECK_OK(tf_full(&SHAPE(n + 1), 0.0, TF_BF16, tf_cpu(), &longer));
    CHECK(tf_adamw_step_with_low(p.c, g.c, m.c, v.c, f32, &a) == TF_ERR_ARG);
    CHECK(tf_adamw_step_with_low(p.c, g.c, m.c, v.c, longer, &a) == TF_ERR_ARG);
    tf_tensor_release(f32), tf_tensor_release(longer);
    pair_release(&p), pair_release(&g), pair_release(&m), pair_release(&v), pair_release(&low);
  }
}

static void test_adamw(void) {
  const int64_t n = small_run ? 1001 : 1000003;
  const tf_dtype cases[][2] = {
      {TF_F32, TF_F32}, {TF_F32, TF_BF16}, {TF_F32, TF_F16}, {TF_F64, TF_F64}, {TF_F64, TF_F32}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    tf_dtype pd = cases[k][0], gd = cases[k][1];
    pair p = pair_randn(SHAPE(n), pd, 1.0);
    tf_tensor *zm = NULL, *zv = NULL;
    CHECK_OK(tf_full(&SHAPE(n), 0.0, pd, tf_cpu(), &zm));
    CHECK_OK(tf_full(&SHAPE(n), 0.0, pd, tf_cpu(), &zv));
    pair m = pair_of(zm), v = pair_of(zv);
    for (int64_t step = 1; step <= 5; step++) {
      pair g = pair_randn(SHAPE(n), gd, step == 3 ? 1e-3 : 1.0);
      tf_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = step};
      CHECK_OK(tf_adamw_step(p.c, g.c, m.c, v.c, &a));
      CHECK_OK(tf_adamw_step(p.g, g.g, m.g, v.g, &a));
      pair_release(&g);
    }
    double tol = pd == TF_F64 ? 1e-12 : 1e-5;
    char note[64];
    snprintf(note, sizeof note, "grad %s", tf_dtype_name(gd));
    same("adamw p", note, p.g, p.c, tol);
    same("adamw m", note, m.g, m.c, tol);
    same("adamw v", note, v.g, v.c, tol);
    pair_release(&p), pair_release(&m), pair_release(&v);
  }
}

/* ---- comparisons and classification -------------------------------------------------------- */

static void test_compare(void) {
  const tf_dtype dts[] = {TF_F32, TF_BF16, TF_F16, TF_F64, TF_I32, TF_I64};
  const tf_binary_op ops[] = {TF_OP_EQ, TF_OP_NE, TF_OP_LT, TF_OP_LE, TF_OP_GT, TF_OP_GE};
  const char *names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    tf_dtype d = dts[i];
    /* small integers so that equal values are common; NaN and infinities among floats */
    int64_t n = 5 * 1000;
    double *av = values_alloc(n), *bv = values_alloc(1000);
    for (int64_t k = 0; k < n; k++) av[k] = (double)rng_int(-3, 4);
    for (int64_t k = 0; k < 1000; k++) bv[k] = (double)rng_int(-3, 4);
    if (tf_dtype_is_float(d)) av[1] = NAN, av[2] = INFINITY, av[3] = -INFINITY, bv[1] = NAN, bv[5] = INFINITY;
    pair a = pair_of(tensor_from(av, SHAPE(5, 1000), d)), b = pair_of(tensor_from(bv, SHAPE(1000), d));
    pair bt = pair_of(tensor_from(bv, SHAPE(1000), d == TF_I32 ? TF_F32 : TF_I32)); /* mixed dtypes promote */
    for (int k = 0; k < 6; k++) {
      tf_tensor *oc = NULL, *og = NULL;
      if (CHECK_OK(tf_binary(ops[k], a.c, b.c, &oc)) && CHECK_OK(tf_binary(ops[k], a.g, b.g, &og))) {
        CHECK_INT(og->dtype, TF_BOOL);
        identical(names[k], og, oc);
      }
      tf_tensor_release(oc), tf_tensor_release(og);
      oc = og = NULL;
      if (CHECK_OK(tf_binary(ops[k], a.c, bt.c, &oc)) && CHECK_OK(tf_binary(ops[k], a.g, bt.g, &og)))
        identical(names[k], og, oc);
      tf_tensor_release(oc), tf_tensor_release(og);
      oc = og = NULL;
      tf_scalar s = {1.5, true};
      tf_scalar_side side = k % 2 ? TF_SCALAR_LEFT : TF_SCALAR_RIGHT;
      if (CHECK_OK(tf_binary_scalar(ops[k], a.c, s, side, &oc)) &&
          CHECK_OK(tf_binary_scalar(ops[k], a.g, s, side, &og)))
        identical(names[k], og, oc);
      tf_tensor_release(oc), tf_tensor_release(og);
    }
    const tf_unary_op uops[2] = {TF_OP_ISNAN, TF_OP_ISFINITE};
    for (int k = 0; k < 2; k++) {
      tf_tensor *oc = NULL, *og = NULL, *at = NULL;
      CHECK_OK(tf_transpose(a.g, 0, 1, &at)); /* strided input */
      if (CHECK_OK(tf_unary(uops[k], a.c, &oc)) && CHECK_OK(tf_unary(uops[k], a.g, &og))) {
        CHECK_INT(og->dtype, TF_BOOL);
        identical(k ? "isfinite" : "isnan", og, oc);
      }
      tf_tensor_release(og);
      og = NULL;
      if (CHECK_OK(tf_unary(uops[k], at, &og))) {
        tf_tensor *back = NULL, *bc = NULL;
        CHECK_OK(tf_transpose(og, 0, 1, &back));
        CHECK_OK(tf_contiguous(back, &bc));
        identical(k ? "isfinite" : "isnan", bc, oc);
        tf_tensor_release(back), tf_tensor_release(bc);
      }
      tf_tensor_release(oc), tf_tensor_release(og), tf_tensor_release(at);
    }
    pair_release(&a), pair_release(&b), pair_release(&bt);
    free(av), free(bv);
  }
}

/* ---- device errors ------------------------------------------------------------------------- */

static void test_device_errors(void) {
  pair x = pair_randn(SHAPE(4, 8), TF_F32, 1.0), w = pair_randn(SHAPE(8), TF_F32, 1.0);
  tf_tensor *y = NULL;
  CHECK_INT(tf_layer_norm(x.g, w.c, NULL, 1e-5, &y, NULL, NULL), TF_ERR_DEVICE);
  CHECK_INT(tf_rms_norm(x.c, w.g, 1e-5, &y, NULL), TF_ERR_DEVICE);
  CHECK(strstr(tf_last_error(), "rms_norm") && strstr(tf_last_error(), "cuda:0"));
  pair_release(&x), pair_release(&w);
}

/* ---- timings at Transformer shapes ------------------------------------------------------------ */

static double now_ms(void) { return (double)tf_clock_ns() * 1e-6; }

/* Runs body (which releases what it makes) a few times, then reports the
 * mean time per call and the bandwidth of `bytes` moved per call. */
#define BENCH(label, bytes, ...)                                                                         \
  do {                                                                                                   \
    for (int w_ = 0; w_ < 3; w_++) __VA_ARGS__                                                           \
    CHECK_OK(tf_device_sync(GPU));                                                                       \
    const int iters_ = 20;                                                                               \
    double t0_ = now_ms();                                                                               \
    for (int i_ = 0; i_ < iters_; i_++) __VA_ARGS__                                                      \
    CHECK_OK(tf_device_sync(GPU));                                                                       \
    double ms_ = (now_ms() - t0_) / iters_;                                                              \
    printf("%-44s %9.3f ms %8.1f GB/s\n", label, ms_, (double)(bytes) / (ms_ * 1e-3) / 1e9);             \
  } while (0)

static void bench(void) {
  printf("\n%-44s %12s %13s\n", "timing (mean of 20, includes launch and the dispatcher)", "", "");
  const int64_t B = 4, T = 1024, C = 768, H = 12, V = 10000;
  tf_tensor *x = NULL, *dy = NULL, *g = NULL, *y = NULL, *r = NULL, *tmp = NULL;
  /* rms_norm, bf16 activations with an f32 gain */
  pair px = pair_randn(SHAPE(B, T, C), TF_BF16, 1.0), pg = pair_randn(SHAPE(C), TF_F32, 1.0);
  x = px.g, g = pg.g;
  CHECK_OK(tf_rms_norm(x, g, 1e-5, &y, &r));
  dy = to_gpu(px.c);
  BENCH("rms_norm bf16 (4, 1024, 768)", B * T * C * 4, {
    tf_tensor *o = NULL, *s = NULL;
    tf_rms_norm(x, g, 1e-5, &o, &s);
    tf_tensor_release(o), tf_tensor_release(s);
  });
  BENCH("rms_norm_backward bf16 dx + dg", B * T * C * 6, {
    tf_tensor *a = NULL, *b = NULL;
    tf_rms_norm_backward(dy, x, g, r, &a, &b);
    tf_tensor_release(a), tf_tensor_release(b);
  });
  BENCH("layer_norm bf16 (4, 1024, 768) w, b", B * T * C * 4, {
    tf_tensor *o = NULL;
    tf_layer_norm(x, g, g, 1e-5, &o, NULL, NULL);
    tf_tensor_release(o);
  });
  tf_tensor_release(y), tf_tensor_release(r), tf_tensor_release(dy);
  pair_release(&px), pair_release(&pg);
  /* attention-sized softmax and masking */
  pair ps = pair_randn(SHAPE(1, H, T, T), TF_BF16, 1.0);
  tf_tensor *scores = NULL, *mask = NULL;
  CHECK_OK(tf_expand(ps.g, &SHAPE(B, H, T, T), &tmp));
  CHECK_OK(tf_contiguous(tmp, &scores));
  tf_tensor_release(tmp);
  CHECK_OK(tf_full(&SHAPE(T, T), 1.0, TF_BOOL, GPU, &mask));
  BENCH("softmax bf16 (4, 12, 1024, 1024)", B * H * T * T * 4, {
    tf_tensor *o = NULL;
    tf_softmax(scores, false, &o);
    tf_tensor_release(o);
  });
  BENCH("masked_fill bf16 (4, 12, 1024, 1024), (T, T) mask", B * H * T * T * 4, {
    tf_tensor *o = NULL;
    tf_masked_fill(scores, mask, -INFINITY, &o);
    tf_tensor_release(o);
  });
  pair_release(&ps);
  tf_tensor_release(scores), tf_tensor_release(mask);
  /* rope on q */
  pair pq = pair_randn(SHAPE(B, H, T, 64), TF_BF16, 1.0);
  BENCH("rope bf16 (4, 12, 1024, 64)", B * H * T * 64 * 4, {
    tf_tensor *o = NULL;
    tf_rope(pq.g, NULL, 10000.0, false, &o);
    tf_tensor_release(o);
  });
  pair_release(&pq);
  /* the loss */
  pair pl = pair_randn(SHAPE(B, T, V), TF_F32, 2.0), pt = pair_ints(SHAPE(B, T), TF_I64, 0, V);
  pair one = pair_of(tensor_from((double[]){1.0}, SCALAR, TF_F32));
  tf_tensor *lse = NULL, *loss = NULL;
  CHECK_OK(tf_cross_entropy(pl.g, pt.g, &loss, &lse));
  BENCH("cross_entropy f32 (4096, 10000), syncs", B * T * V * 4, {
    tf_tensor *o = NULL, *s = NULL;
    tf_cross_entropy(pl.g, pt.g, &o, &s);
    tf_tensor_release(o), tf_tensor_release(s);
  });
  BENCH("cross_entropy_backward f32 (4096, 10000)", B * T * V * 8, {
    tf_tensor *o = NULL;
    tf_cross_entropy_backward(pl.g, pt.g, lse, one.g, &o);
    tf_tensor_release(o);
  });
  tf_tensor_release(lse), tf_tensor_release(loss);
  pair_release(&pl), pair_release(&one);
  /* embedding, forward and backward */
  pair pw = pair_randn(SHAPE(V, C), TF_F32, 1.0), pd = pair_randn(SHAPE(B, T, C), TF_F32, 1.0);
  BENCH("embedding f32 (4, 1024) of (10000, 768), syncs", B * T * C * 8, {
    tf_tensor *o = NULL;
    tf_embedding(pw.g, pt.g, &o);
    tf_tensor_release(o);
  });
  BENCH("embedding_backward f32, deterministic, syncs", (B * T * C + V * C) * 4, {
    tf_tensor *o = NULL;
    tf_embedding_backward(pd.g, pt.g, V, TF_F32, &o);
    tf_tensor_release(o);
  });
  pair_release(&pw), pair_release(&pd), pair_release(&pt);
  /* one optimizer step over 32M parameters */
  const int64_t N = 32 << 20;
  tf_tensor *p = NULL, *m = NULL, *v = NULL, *grad = NULL;
  CHECK_OK(tf_full(&SHAPE(N), 0.5, TF_F32, GPU, &p));
  CHECK_OK(tf_full(&SHAPE(N), 0.0, TF_F32, GPU, &m));
  CHECK_OK(tf_full(&SHAPE(N), 0.0, TF_F32, GPU, &v));
  CHECK_OK(tf_full(&SHAPE(N), 0.01, TF_F32, GPU, &grad));
  tf_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = 1};
  BENCH("adamw f32, 32M parameters", N * 4 * 7, { tf_adamw_step(p, grad, m, v, &a); });
  tf_tensor_release(p), tf_tensor_release(m), tf_tensor_release(v), tf_tensor_release(grad);
}

int main(void) {
  tf_backends_init();
  small_run = gpu_test_begin();
  test_softmax();
  test_norms();
  test_cross_entropy();
  test_rope();
  test_embedding();
  test_masked_fill();
  test_adamw();
  test_adamw_with_low();
  test_compare();
  test_device_errors();
  CHECK_OK(tf_device_sync(GPU));
  print_table();
  if (!small_run) bench();
  /* nothing left behind on the GPU */
  tf_device_ctx *ctx = NULL;
  if (CHECK_OK(tf_device_ctx_get(GPU, &ctx))) CHECK_INT(ctx->alloc.stats.active_blocks, 0);
  return tf_check_done();
}
