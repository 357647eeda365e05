/* The CPU twins of the Transformer engine's kernels (model_kernels.h)
 * against plain double-precision references written here from their
 * definitions, on fresh random inputs (TF_TEST_SEED repeats a run), for
 * f32, f16 and bf16: gemm (transposes, batches, padded rows, accumulation,
 * f32 output from low-precision operands), rmsnorm with the fused residual
 * add and its backward, swiglu, rope_heads, heads, causal softmax, the
 * fused loss, the embedding and the index check; FP8's cast of a tensor
 * whose amax overflows the multiplier. The CUDA kernels are
 * compared with these twins by test_model_kernels_cuda.c. */
#include "backend.h"
#include "backends.h"
#include "model_kernels.h"
#include "nnref.h"
#include "cpu_exp.h"
#include "fp8.h"

static tf_device_ctx *ctx;
static const tf_model_kernels *K;
static const tf_dtype DTYPES[3] = {TF_F32, TF_F16, TF_BF16};

/* The error a result rounded once into dtype d may carry. */
static double tol_of(tf_dtype d) { return d == TF_F32 ? 2e-6 : d == TF_F16 ? 2e-3 : 1e-2; }

/* A CPU tensor of n random values (rounded to d) and the values. */
typedef struct {
  tf_tensor *t;
  double *v;
} buf;

static buf buf_randn(int64_t n, tf_dtype d, double scale) {
  buf b;
  b.t = tensor_randn(SHAPE(n), d, scale, &b.v);
  return b;
}

static buf buf_zeros(int64_t n, tf_dtype d) {
  buf b = {NULL, values_alloc(n)};
  b.t = tensor_from(b.v, SHAPE(n), d);
  return b;
}

static void *P(buf b) { return tf_tensor_data(b.t); }
static void buf_free(buf *b) {
  tf_tensor_release(b->t);
  free(b->v);
  b->t = NULL, b->v = NULL;
}

static bool near_ref(const char *what, tf_dtype d, buf b, const double *ref, double tol) {
  char name[96];
  snprintf(name, sizeof name, "%s %s", what, tf_dtype_name(d));
  return check_close(name, b.t, ref, tol);
}

/* ---- gemm -------------------------------------------------------------------------------- */

static void test_gemm(void) {
  const int64_t batch = 3, m = 5, n = 7, k = 6, pad = 3;
  for (int di = 0; di < 3; di++)
    for (int variant = 0; variant < 8; variant++) {
      const tf_dtype d = DTYPES[di];
      const bool ta = variant & 1, tb = variant & 2, acc = variant & 4, c32 = acc || d == TF_F32;
      const tf_dtype cd = c32 ? TF_F32 : d;
      const int64_t arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
      const int64_t lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
      const int64_t sa = arows * lda + 1, sb = brows * ldb + 2, sc = m * ldc + 3;
      buf a = buf_randn(batch * sa, d, 1.0), b = buf_randn(batch * sb, d, 1.0), c = buf_randn(batch * sc, cd, 1.0);
      double *ref = values_alloc(batch * sc);
      memcpy(ref, c.v, sizeof(double) * (size_t)(batch * sc));
      for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++)
              s += a.v[bi * sa + (ta ? p * lda + i : i * lda + p)] * b.v[bi * sb + (tb ? j * ldb + p : p * ldb + j)];
            double *out = &ref[bi * sc + i * ldc + j];
            *out = acc ? *out + s : s;
          }
      tf_gemm_args g = {.a = P(a), .b = P(b), .c = P(c), .ab_dtype = d, .c_dtype = cd, .batch = batch, .m = m,
                        .n = n, .k = k, .trans_a = ta, .trans_b = tb, .lda = lda, .ldb = ldb, .ldc = ldc,
                        .batch_a = sa, .batch_b = sb, .batch_c = sc, .accumulate = acc};
      CHECK_OK(K->gemm(ctx, &g));
      near_ref("gemm", d, c, ref, c32 ? 2e-6 : tol_of(d));
      free(ref);
      buf_free(&a), buf_free(&b), buf_free(&c);
    }
}

/* ---- rmsnorm ----------------------------------------------------------------------------- */

static void test_rmsnorm(void) {
  const int64_t rows = 6, dim = 24;
  const double eps = 1e-5;
  for (int di = 0; di < 3; di++)
    for (int with_delta = 0; with_delta < 2; with_delta++) {
      const tf_dtype d = DTYPES[di];
      buf x = buf_randn(rows * dim, TF_F32, 1.5), delta = buf_randn(rows * dim, d, 1.0);
      buf g = buf_randn(dim, TF_F32, 1.0), xo = buf_zeros(rows * dim, TF_F32), h = buf_zeros(rows * dim, d);
      buf rstd = buf_zeros(rows, TF_F32);
      double *xin = values_alloc(rows * dim), *href = values_alloc(rows * dim), *rref = values_alloc(rows);
      for (int64_t i = 0; i < rows * dim; i++) xin[i] = (float)(x.v[i] + (with_delta ? delta.v[i] : 0.0));
      ref_rms_norm(xin, rows, dim, g.v, eps, href, rref);
      tf_rmsnorm_args fa = {.rows = rows, .dim = dim, .eps = eps, .dtype = d, .x = P(x),
                            .delta = with_delta ? P(delta) : NULL, .x_out = with_delta ? P(xo) : NULL, .g = P(g),
                            .h = P(h), .rstd = P(rstd)};
      CHECK_OK(K->rmsnorm(ctx, &fa));
      if (with_delta) near_ref("rmsnorm x + delta", d, xo, xin, 1e-7);
      near_ref("rmsnorm h", d, h, href, tol_of(d));
      near_ref("rmsnorm rstd", d, rstd, rref, 1e-6);
      /* again from the kept rstd (the backward pass's recomputed norms), with the same delta: x_out's
       * and h's bits, rstd unchanged; a given rstd is refused without rstd and in the backward pass */
      {
        buf h2 = buf_zeros(rows * dim, d), r2 = buf_zeros(rows, TF_F32), xo2 = buf_zeros(rows * dim, TF_F32);
        memcpy(P(r2), P(rstd), (size_t)rows * sizeof(float));
        tf_rmsnorm_args again = fa;
        again.x_out = with_delta ? P(xo2) : NULL, again.h = P(h2), again.rstd = P(r2), again.rstd_given = true;
        CHECK_OK(K->rmsnorm(ctx, &again));
        CHECK(memcmp(P(h2), P(h), (size_t)(rows * dim) * tf_dtype_size(d)) == 0);
        CHECK(memcmp(P(r2), P(rstd), (size_t)rows * sizeof(float)) == 0);
        if (with_delta) CHECK(memcmp(P(xo2), P(xo), (size_t)(rows * dim) * sizeof(float)) == 0);
        again.rstd = NULL;
        CHECK(K->rmsnorm(ctx, &again) == TF_ERR_ARG);
        tf_rmsnorm_args back = {.backward = true, .rows = rows, .dim = dim, .eps = eps, .dtype = d, .x = P(x),
                                .g = P(g), .rstd = P(r2), .rstd_given = true};
        CHECK(K->rmsnorm(ctx, &back) == TF_ERR_ARG);
        buf_free(&h2), buf_free(&r2), buf_free(&xo2);
      }
      /* backward from the saved rstd, accumulating or not */
      for (int accumulate = 0; accumulate < 2; accumulate++) {
        buf dh = buf_randn(rows * dim, d, 1.0), dres = buf_randn(rows * dim, TF_F32, 1.0);
        buf low = buf_zeros(rows * dim, d), dg = buf_randn(dim, TF_F32, 1.0);
        double *dref = values_alloc(rows * dim), *gref = values_alloc(dim);
        for (int64_t c = 0; c < dim; c++) gref[c] = dg.v[c];
        for (int64_t r = 0; r < rows; r++) {
          const double rs = (float)rref[r];
          double sum = 0;
          for (int64_t c = 0; c < dim; c++) sum += dh.v[r * dim + c] * g.v[c] * xin[r * dim + c] * rs;
          for (int64_t c = 0; c < dim; c++) {
            const int64_t i = r * dim + c;
            double dx = rs * (dh.v[i] * g.v[c] - xin[i] * rs * sum / (double)dim);
            dref[i] = (accumulate ? dres.v[i] : 0.0) + dx;
            gref[c] += dh.v[i] * xin[i] * rs;
          }
        }
        tf_rmsnorm_args ba = {.backward = true, .rows = rows, .dim = dim, .eps = eps, .dtype = d, .x = P(with_delta ? xo : x),
                              .g = P(g), .rstd = P(rstd), .dh = P(dh), .dres = P(dres), .accumulate = accumulate,
                              .dres_low = P(low), .dg = P(dg)};
        CHECK_OK(K->rmsnorm(ctx, &ba));
        near_ref("rmsnorm backward dres", d, dres, dref, 2e-6);
        near_ref("rmsnorm backward dres_low", d, low, dref, tol_of(d));
        near_ref("rmsnorm backward dg", d, dg, gref, 2e-6);
        free(dref), free(gref);
        buf_free(&dh), buf_free(&dres), buf_free(&low), buf_free(&dg);
      }
      /* in place: x_out may be x itself (inference plans) */
      if (with_delta) {
        buf xi = buf_zeros(rows * dim, TF_F32);
        memcpy(P(xi), P(x), (size_t)(rows * dim) * sizeof(float));
        tf_rmsnorm_args ia = fa;
        ia.x = P(xi), ia.x_out = P(xi);
        CHECK_OK(K->rmsnorm(ctx, &ia));
        near_ref("rmsnorm in place", d, xi, xin, 1e-7);
        buf_free(&xi);
      }
      free(xin), free(href), free(rref);
      buf_free(&x), buf_free(&delta), buf_free(&g), buf_free(&xo), buf_free(&h), buf_free(&rstd);
    }
}

/* ---- swiglu ------------------------------------------------------------------------------- */

static void test_swiglu(void) {
  const int64_t rows = 5, f = 12;
  for (int di = 0; di < 3; di++) {
    const tf_dtype d = DTYPES[di];
    buf ab = buf_randn(rows * 2 * f, d, 2.0), y = buf_zeros(rows * f, d), dy = buf_randn(rows * f, d, 1.0);
    buf dab = buf_zeros(rows * 2 * f, d);
    double *yref = values_alloc(rows * f), *dref = values_alloc(rows * 2 * f);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < f; c++) {
        const double a = ab.v[r * 2 * f + c], b = ab.v[r * 2 * f + f + c], g = dy.v[r * f + c];
        const double s = 1 / (1 + exp(-a));
        yref[r * f + c] = a * s * b;
        dref[r * 2 * f + c] = g * b * (s + a * s * (1 - s));
        dref[r * 2 * f + f + c] = g * a * s;
      }
    tf_swiglu_args fa = {.rows = rows, .f = f, .dtype = d, .ab = P(ab), .y = P(y)};
    CHECK_OK(K->swiglu(ctx, &fa));
    near_ref("swiglu", d, y, yref, tol_of(d));
    tf_swiglu_args ba = {.backward = true, .rows = rows, .f = f, .dtype = d, .ab = P(ab), .dy = P(dy), .dab = P(dab)};
    CHECK_OK(K->swiglu(ctx, &ba));
    near_ref("swiglu backward", d, dab, dref, tol_of(d));
    /* with y again, in place as the engine runs it: y over dy, d[a | b] over [a | b] */
    buf io = buf_zeros(rows * 2 * f, d), yio = buf_zeros(rows * f, d);
    memcpy(P(io), P(ab), (size_t)(rows * 2 * f) * tf_dtype_size(d));
    memcpy(P(yio), P(dy), (size_t)(rows * f) * tf_dtype_size(d));
    tf_swiglu_args wa = {.backward = true, .rows = rows, .f = f, .dtype = d, .ab = P(io), .dy = P(yio),
                         .dab = P(io), .y = P(yio)};
    CHECK_OK(K->swiglu(ctx, &wa));
    CHECK(memcmp(P(io), P(dab), (size_t)(rows * 2 * f) * tf_dtype_size(d)) == 0);
    CHECK(memcmp(P(yio), P(y), (size_t)(rows * f) * tf_dtype_size(d)) == 0);
    buf_free(&io), buf_free(&yio);
    free(yref), free(dref);
    buf_free(&ab), buf_free(&y), buf_free(&dy), buf_free(&dab);
  }
}

/* ---- FP8 training's casts ------------------------------------------------------------------ */

/* Current scaling of a tensor whose amax is so small that max / amax overflows f32 (bf16 holds
 * 1e-37): the multiplier is the largest finite float, not infinity, so zeros stay zeros (0 x inf
 * would be NaN), no code is a NaN, and each code times the scale is its value within the format's
 * half step. The GPU twin gives the same bytes (test_model_kernels_cuda). */
static void test_fp8_tiny_amax(void) {
  const int64_t n = 64;
  buf x = buf_randn(n, TF_BF16, 1e-37);
  for (int64_t i = 0; i < n; i += 7) x.v[i] = 0.0, ((uint16_t *)P(x))[i] = i % 2 ? 0x8000u : 0u;
  float amax = 0.0f, scale = 0.0f;
  tf_fp8_amax_args aa = {.count = n, .dtype = TF_BF16, .x = P(x), .amax = &amax};
  CHECK_OK(K->fp8_amax(ctx, &aa));
  CHECK(amax > 0.0f && amax < 1e-36f);
  for (int f = 0; f < 2; f++) {
    const tf_dtype fmt = f ? TF_F8E5M2 : TF_F8E4M3;
    uint8_t out[64], out_t[64];
    tf_fp8_quantize_args q = {.rows = 8, .cols = 8, .dtype = TF_BF16, .fp8 = fmt, .x = P(x), .amax = &amax,
                              .scale = &scale, .out = out, .out_t = out_t};
    CHECK_OK(K->fp8_quantize(ctx, &q));
    CHECK(scale > 0.0f && isfinite(scale));
    for (int64_t i = 0; i < n; i++) {
      const double back = (f ? tf_f8e5m2_to_f32(out[i]) : tf_f8e4m3_to_f32(out[i])) * (double)scale;
      /* half a step: relative for normal codes, half the smallest subnormal's step below them */
      const double tol = (f ? 0.125 : 0.0625) * fabs(x.v[i]) + (f ? 0x1p-17 : 0x1p-10) * (double)scale;
      if (!CHECK(back == back && fabs(back - x.v[i]) <= tol)) break;
      CHECK(out_t[(i % 8) * 8 + i / 8] == out[i]);
    }
  }
  buf_free(&x);
}

/* ---- attention's layout kernels ----------------------------------------------------------- */

/* The plan's RoPE table: cos and sin of t theta^(-2i / hd), rounded to f32. */
static void rope_table(int64_t T, int64_t hd, double theta, buf *cs, buf *sn) {
  const int64_t half = hd / 2;
  *cs = buf_zeros(T * half, TF_F32);
  *sn = buf_zeros(T * half, TF_F32);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      double angle = (double)t * pow(theta, -(double)(2 * i) / (double)hd);
      cs->v[t * half + i] = (float)cos(angle);
      sn->v[t * half + i] = (float)sin(angle);
      ((float *)P(*cs))[t * half + i] = (float)cs->v[t * half + i];
      ((float *)P(*sn))[t * half + i] = (float)sn->v[t * half + i];
    }
}

static void test_rope_heads(void) {
  const int64_t B = 2, T = 5, H = 3, hd = 8, d = H * hd, n = B * T * d, half = hd / 2;
  buf cs, sn;
  rope_table(T, hd, 10000.0, &cs, &sn);
  for (int di = 0; di < 3; di++) {
    const tf_dtype dt = DTYPES[di];
    buf qkv = buf_randn(3 * n, dt, 1.0), q = buf_zeros(n, dt), k = buf_zeros(n, dt), v = buf_zeros(n, dt);
    double *ref[3] = {values_alloc(n), values_alloc(n), values_alloc(n)};
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < T; t++)
        for (int part = 0; part < 3; part++)
          for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < half; i++) {
              const double x0 = qkv.v[((b * T + t) * 3 + part) * d + h * hd + 2 * i];
              const double x1 = qkv.v[((b * T + t) * 3 + part) * d + h * hd + 2 * i + 1];
              const double c = part < 2 ? cs.v[t * half + i] : 1, s = part < 2 ? sn.v[t * half + i] : 0;
              const int64_t at = ((b * H + h) * T + t) * hd + 2 * i;
              ref[part][at] = x0 * c - x1 * s;
              ref[part][at + 1] = x0 * s + x1 * c;
            }
    tf_rope_heads_args fa = {.batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = dt, .cos = P(cs),
                             .sin = P(sn), .qkv = P(qkv), .q = P(q), .k = P(k), .v = P(v)};
    CHECK_OK(K->rope_heads(ctx, &fa));
    near_ref("rope_heads q", dt, q, ref[0], tol_of(dt));
    near_ref("rope_heads k", dt, k, ref[1], tol_of(dt));
    near_ref("rope_heads v", dt, v, ref[2], 0);
    /* backward of the rounded outputs rotates them back to the inputs */
    buf back = buf_zeros(3 * n, dt);
    tf_rope_heads_args ba = fa;
    ba.backward = true, ba.qkv = P(back);
    CHECK_OK(K->rope_heads(ctx, &ba));
    near_ref("rope_heads backward", dt, back, qkv.v, 3 * tol_of(dt));
    for (int i = 0; i < 3; i++) free(ref[i]);
    buf_free(&qkv), buf_free(&q), buf_free(&k), buf_free(&v), buf_free(&back);
  }
  buf_free(&cs), buf_free(&sn);
}

static void test_heads(void) {
  const int64_t B = 2, T = 3, H = 4, hd = 6, n = B * T * H * hd;
  for (int di = 0; di < 3; di++) {
    const tf_dtype dt = DTYPES[di];
    buf src = buf_randn(n, dt, 1.0), merged = buf_zeros(n, dt), back = buf_zeros(n, dt);
    double *ref = values_alloc(n);
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++)
          for (int64_t e = 0; e < hd; e++) ref[((b * T + t) * H + h) * hd + e] = src.v[((b * H + h) * T + t) * hd + e];
    tf_heads_args m = {.batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = dt, .src = P(src), .dst = P(merged)};
    CHECK_OK(K->heads(ctx, &m));
    near_ref("heads merge", dt, merged, ref, 0);
    tf_heads_args s = m;
    s.split = true, s.src = P(merged), s.dst = P(back);
    CHECK_OK(K->heads(ctx, &s));
    near_ref("heads split", dt, back, src.v, 0);
    free(ref);
    buf_free(&src), buf_free(&merged), buf_free(&back);
  }
}

static void test_causal_softmax(void) {
  const int64_t batch = 3, T = 7;
  const double scale = 0.35;
  for (int di = 0; di < 3; di++) {
    const tf_dtype dt = DTYPES[di];
    buf s = buf_randn(batch * T * T, dt, 3.0), dp = buf_randn(batch * T * T, dt, 1.0);
    double *pref = values_alloc(batch * T * T), *dref = values_alloc(batch * T * T);
    for (int64_t r = 0; r < batch * T; r++) {
      const int64_t t = r % T;
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; j++) m = fmax(m, scale * s.v[r * T + j]);
      for (int64_t j = 0; j <= t; j++) sum += exp(scale * s.v[r * T + j] - m);
      for (int64_t j = 0; j < T; j++) pref[r * T + j] = j <= t ? exp(scale * s.v[r * T + j] - m) / sum : 0;
    }
    tf_causal_softmax_args fa = {.batch = batch, .seq = T, .scale = scale, .dtype = dt, .s = P(s)};
    CHECK_OK(K->causal_softmax(ctx, &fa));
    near_ref("causal_softmax", dt, s, pref, tol_of(dt));
    /* backward from the rounded probabilities */
    double *p = tensor_values(s.t);
    for (int64_t r = 0; r < batch * T; r++) {
      double dot = 0;
      for (int64_t j = 0; j < T; j++) dot += p[r * T + j] * dp.v[r * T + j];
      for (int64_t j = 0; j < T; j++)
        dref[r * T + j] = j <= r % T ? scale * p[r * T + j] * (dp.v[r * T + j] - dot) : 0;
    }
    tf_causal_softmax_args ba = {.backward = true, .batch = batch, .seq = T, .scale = scale, .dtype = dt,
                                 .s = P(dp), .p = P(s)};
    CHECK_OK(K->causal_softmax(ctx, &ba));
    near_ref("causal_softmax backward", dt, dp, dref, tol_of(dt));
    free(p), free(pref), free(dref);
    buf_free(&s), buf_free(&dp);
  }
}

/* ---- the loss, the embedding, the index check ------------------------------------------ */

/* The f32 loss's exp (cpu_exp.h) against libm's: within 1 unit in the
 * last place at fresh random points of its range, 0 below it, inf above,
 * NaN for NaN, exact at 0. */
static void test_exp(void) {
  double worst = 0;
  for (int i = 0; i < 200000; i++) {
    const double x = i % 2 ? -708.0 + 1417.7 * rng_uniform() : -40.0 * rng_uniform(), want = exp(x);
    const double ulps = fabs(tf_cpu_exp(x) - want) / (nextafter(want, INFINITY) - want);
    if (ulps > worst) worst = ulps;
  }
  CHECK(worst <= 1.0);
  CHECK(tf_cpu_exp(0.0) == 1.0 && tf_cpu_exp(-INFINITY) == 0.0 && tf_cpu_exp(-800.0) == 0.0);
  CHECK(isinf(tf_cpu_exp(800.0)) && isinf(tf_cpu_exp(INFINITY)) && isnan(tf_cpu_exp(NAN)));
}

/* The loss at a short vocabulary, and at one that is not a multiple of the
 * f32 row's 8 lanes with logits spread wide enough (scale 60) that most
 * exponentials underflow far below f32's range. */
static void test_lm_loss(void) {
  const int64_t rows = 6;
  static const int64_t vocabs[2] = {11, 1003};
  static const double spreads[2] = {2.0, 60.0};
  for (int k = 0; k < 12; k++) { /* vocab, dtype, with and without the gradient */
    const int vi = k / 6, grad = k % 2;
    const tf_dtype dt = DTYPES[(k / 2) % 3];
    const int64_t V = vocabs[vi];
    buf x = buf_randn(rows * V, dt, spreads[vi]), rl = buf_zeros(rows, TF_F32), loss = buf_zeros(1, TF_F32);
    int64_t targets[6];
    for (int64_t r = 0; r < rows; r++) targets[r] = rng_int(0, V);
    double lse[6], *dref = values_alloc(rows * V), lref = ref_cross_entropy(x.v, rows, V, targets, lse);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < V; c++)
        dref[r * V + c] = grad ? (exp(x.v[r * V + c] - lse[r]) - (c == targets[r])) / (double)rows : x.v[r * V + c];
    tf_lm_loss_args a = {.rows = rows, .vocab = V, .dtype = dt, .logits = P(x), .targets = targets,
                         .row_loss = P(rl), .loss = P(loss), .grad = grad};
    CHECK_OK(K->lm_loss(ctx, &a));
    near_ref("lm_loss", dt, loss, &lref, 1e-6);
    near_ref(grad ? "lm_loss gradient" : "lm_loss keeps the logits", dt, x, dref, grad ? tol_of(dt) : 0);
    free(dref);
    buf_free(&x), buf_free(&rl), buf_free(&loss);
  }
}

static void test_encoder(void) {
  const int64_t n = 9, dim = 5, V = 4;
  int64_t ids[9];
  for (int64_t i = 0; i < n; i++) ids[i] = rng_int(0, V);
  ids[3] = ids[7] = 2; /* repeats */
  buf wte = buf_randn(V * dim, TF_F32, 1.0), out = buf_zeros(n * dim, TF_F32);
  buf dout = buf_randn(n * dim, TF_F32, 1.0), dwte = buf_randn(V * dim, TF_F32, 1.0);
  double *ref = values_alloc(n * dim), *dref = values_alloc(V * dim);
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < dim; c++) ref[i * dim + c] = wte.v[ids[i] * dim + c];
  memcpy(dref, dwte.v, sizeof(double) * (size_t)(V * dim));
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < dim; c++) dref[ids[i] * dim + c] += dout.v[i * dim + c];
  tf_encoder_args fa = {.n = n, .dim = dim, .vocab = V, .ids = ids, .wte = P(wte), .out = P(out)};
  CHECK_OK(K->encoder(ctx, &fa));
  near_ref("encoder", TF_F32, out, ref, 0);
  tf_encoder_args ba = {.backward = true, .n = n, .dim = dim, .vocab = V, .ids = ids, .dout = P(dout),
                        .dwte = P(dwte)};
  CHECK_OK(K->encoder(ctx, &ba));
  near_ref("encoder backward", TF_F32, dwte, dref, 1e-6);
  free(ref), free(dref);
  buf_free(&wte), buf_free(&out), buf_free(&dout), buf_free(&dwte);
}

static void test_index_check(void) {
  int64_t idx[6] = {0, 3, 9, -1, 10, 2}, bad = 0;
  CHECK_OK(K->index_check(ctx, idx, 6, 10, &bad));
  CHECK_INT(bad, 3);
  CHECK_OK(K->index_check(ctx, idx, 3, 10, &bad));
  CHECK_INT(bad, -1);
  CHECK_OK(K->index_check(ctx, idx, 6, 1, &bad));
  CHECK_INT(bad, 1);
}

int main(void) {
  tf_backends_init();
  test_seed();
  if (!CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx))) return 1;
  K = ctx->backend->model;
  if (!CHECK(K != NULL)) return tf_check_done();
  test_gemm();
  test_rmsnorm();
  test_swiglu();
  test_fp8_tiny_amax();
  test_rope_heads();
  test_heads();
  test_causal_softmax();
  test_exp();
  test_lm_loss();
  test_encoder();
  test_index_check();
  CHECK_INT(ctx->alloc.stats.active_blocks, 0);
  return tf_check_done();
}
