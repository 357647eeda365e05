/* The CPU backend's FlashAttention-2 (kernels/cpu/flash.c) against plain attention
 * written from its definition in double (S = scale Q K^T, the causal mask,
 * softmax, P V; the backward pass analytically), on fresh random inputs
 * each run (the seed is printed; TF_TEST_SEED repeats a run): outputs, lse
 * and dQ, dK, dV within 1e-5 relative error for f32 (1e-12 for f64, 1e-2
 * for f16/bf16), causal or not, at shapes that cross block edges (seq 1,
 * 37, 129, seq_q above and below seq_k, head dims 1 to 128). lse must be the
 * log-sum-exp of the scaled, masked scores; two backward passes must agree
 * bit for bit; the reference's own gradient is checked against central
 * differences first. */
#include "backend.h"
#include "backends.h"
#include "nnref.h"

static tf_device_ctx *cctx;

static double tol_of(tf_dtype d) {
  switch (d) {
    case TF_F64: return 1e-12;
    case TF_F32: return 1e-5;
    default: return 1e-2;
  }
}

/* lse is stored in f32 below f64. */
static double lse_tol_of(tf_dtype d) { return d == TF_F64 ? 1e-12 : 1e-5; }

/* One attention problem set: batch problems of (sq, d) queries and (sk, d) keys. */
typedef struct {
  int64_t batch, sq, sk, d;
  bool causal;
  double scale;
} attn_shape;

static bool visible(const attn_shape *s, int64_t i, int64_t j) { return !s->causal || j <= i; }

/* ---- the reference ------------------------------------------------------------- */

/* o and lse of plain attention in double. */
static void ref_attention(const attn_shape *s, const double *q, const double *k, const double *v, double *o,
                          double *lse) {
  const int64_t d = s->d;
  double *sc = values_alloc(s->sk);
  for (int64_t b = 0; b < s->batch; b++)
    for (int64_t i = 0; i < s->sq; i++) {
      const double *qi = q + (b * s->sq + i) * d;
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < s->sk; j++) {
        double dot = 0;
        for (int64_t c = 0; c < d; c++) dot += qi[c] * k[(b * s->sk + j) * d + c];
        sc[j] = visible(s, i, j) ? s->scale * dot : -INFINITY;
        if (sc[j] > m) m = sc[j];
      }
      for (int64_t j = 0; j < s->sk; j++) sum += exp(sc[j] - m);
      lse[b * s->sq + i] = m + log(sum);
      double *oi = o + (b * s->sq + i) * d;
      for (int64_t c = 0; c < d; c++) oi[c] = 0;
      for (int64_t j = 0; j < s->sk; j++) {
        const double p = exp(sc[j] - lse[b * s->sq + i]);
        for (int64_t c = 0; c < d; c++) oi[c] += p * v[(b * s->sk + j) * d + c];
      }
    }
  free(sc);
}

/* The gradients of sum(dout * o) with P from the exact lse and, as the
 * backend contract has it, D = rowsum(dout * o) from the o it is given. */
static void ref_attention_backward(const attn_shape *s, const double *q, const double *k, const double *v,
                                   const double *o, const double *lse, const double *dout, double *dq, double *dk,
                                   double *dv) {
  const int64_t d = s->d;
  memset(dq, 0, sizeof(double) * (size_t)(s->batch * s->sq * d));
  memset(dk, 0, sizeof(double) * (size_t)(s->batch * s->sk * d));
  memset(dv, 0, sizeof(double) * (size_t)(s->batch * s->sk * d));
  for (int64_t b = 0; b < s->batch; b++)
    for (int64_t i = 0; i < s->sq; i++) {
      const int64_t r = b * s->sq + i;
      const double *qi = q + r * d, *doi = dout + r * d, *oi = o + r * d;
      double D = 0;
      for (int64_t c = 0; c < d; c++) D += doi[c] * oi[c];
      for (int64_t j = 0; j < s->sk; j++) {
        if (!visible(s, i, j)) continue;
        const double *kj = k + (b * s->sk + j) * d, *vj = v + (b * s->sk + j) * d;
        double dot = 0, dp = 0;
        for (int64_t c = 0; c < d; c++) dot += qi[c] * kj[c], dp += doi[c] * vj[c];
        const double p = exp(s->scale * dot - lse[r]), ds = p * (dp - D);
        for (int64_t c = 0; c < d; c++) {
          dq[r * d + c] += s->scale * ds * kj[c];
          dk[(b * s->sk + j) * d + c] += s->scale * ds * qi[c];
          dv[(b * s->sk + j) * d + c] += p * doi[c];
        }
      }
    }
}

/* ---- the reference's gradient against central differences -------------------------- */

typedef struct {
  attn_shape s;
  double *qkv; /* q, k, v back to back */
  const double *dout;
} attn_fd;

static double attn_loss(void *ud) {
  attn_fd *f = ud;
  const int64_t nq = f->s.batch * f->s.sq * f->s.d, nk = f->s.batch * f->s.sk * f->s.d;
  double *o = values_alloc(nq), *lse = values_alloc(f->s.batch * f->s.sq), l = 0;
  ref_attention(&f->s, f->qkv, f->qkv + nq, f->qkv + nq + nk, o, lse);
  for (int64_t i = 0; i < nq; i++) l += o[i] * f->dout[i];
  free(o), free(lse);
  return l;
}

static void test_reference_gradient(void) {
  for (int causal = 0; causal < 2; causal++) {
    attn_fd f = {{2, 3, 4, 5, causal, 0.7}, NULL, NULL};
    const int64_t nq = 2 * 3 * 5, nk = 2 * 4 * 5;
    f.qkv = random_values(nq + 2 * nk, TF_F64, 1.0);
    double *dout = random_values(nq, TF_F64, 1.0), *o = values_alloc(nq), *lse = values_alloc(6);
    double *grad = values_alloc(nq + 2 * nk);
    f.dout = dout;
    ref_attention(&f.s, f.qkv, f.qkv + nq, f.qkv + nq + nk, o, lse);
    ref_attention_backward(&f.s, f.qkv, f.qkv + nq, f.qkv + nq + nk, o, lse, dout, grad, grad + nq, grad + nq + nk);
    const double e = fd_error(attn_loss, &f, f.qkv, nq + 2 * nk, grad);
    if (!(e < 1e-6)) fprintf(stderr, "reference gradient (causal %d): finite-difference error %.3g\n", causal, e);
    CHECK(e < 1e-6);
    free(f.qkv), free(dout), free(o), free(lse), free(grad);
  }
}

/* ---- one case: forward and backward against the reference ---------------------------- */

static tf_tensor *empty(tf_shape s, tf_dtype d) {
  tf_tensor *t = NULL;
  if (!CHECK_OK(tf_tensor_empty(&s, d, tf_cpu(), &t))) exit(1);
  return t;
}

/* Relative error of a tensor against reference values; reports and checks. */
static double compare(const char *what, const char *note, const tf_tensor *t, const double *ref, double tol) {
  double *v = tensor_values(t);
  const double e = rel_error(v, ref, tf_tensor_numel(t));
  free(v);
  if (!(e <= tol)) fprintf(stderr, "FAIL %s %s: relative error %.3g > %.3g\n", what, note, e, tol);
  CHECK(e <= tol);
  return e;
}

static bool same_bits(const tf_tensor *a, const tf_tensor *b) {
  return tf_tensor_nbytes(a) == tf_tensor_nbytes(b) &&
         memcmp(tf_tensor_data(a), tf_tensor_data(b), tf_tensor_nbytes(a)) == 0;
}

static void flash_case(attn_shape s, tf_dtype dt) {
  char note[128];
  snprintf(note, sizeof note, "%-4s %s B=%lld Sq=%lld Sk=%lld d=%lld", tf_dtype_name(dt),
           s.causal ? "causal" : "full  ", (long long)s.batch, (long long)s.sq, (long long)s.sk, (long long)s.d);
  const tf_dtype sd = dt == TF_F64 ? TF_F64 : TF_F32;
  const tf_shape qs = SHAPE(s.batch, s.sq, s.d), ks = SHAPE(s.batch, s.sk, s.d), ls = SHAPE(s.batch, s.sq);
  const int64_t nq = s.batch * s.sq * s.d, nk = s.batch * s.sk * s.d;
  double *qv, *kv, *vv, *dov;
  tf_tensor *q = tensor_randn(qs, dt, 1.0, &qv), *k = tensor_randn(ks, dt, 1.0, &kv);
  tf_tensor *v = tensor_randn(ks, dt, 1.0, &vv), *dout = tensor_randn(qs, dt, 1.0, &dov);
  tf_tensor *o = empty(qs, dt), *lse = empty(ls, sd);
  double *oref = values_alloc(nq), *lref = values_alloc(s.batch * s.sq);
  ref_attention(&s, qv, kv, vv, oref, lref);

  tf_flash_args a = {.causal = s.causal, .dtype = dt, .batch = s.batch, .seq_q = s.sq, .seq_k = s.sk,
                     .head_dim = s.d, .scale = s.scale, .q = tf_tensor_data(q), .k = tf_tensor_data(k),
                     .v = tf_tensor_data(v), .o = tf_tensor_data(o), .lse = tf_tensor_data(lse)};
  CHECK_INT(cctx->backend->flash_workspace(cctx, &a), 0);
  double e[5] = {0};
  if (CHECK_OK(cctx->backend->flash_attention(cctx, &a))) {
    e[0] = compare("o", note, o, oref, tol_of(dt));
    e[1] = compare("lse", note, lse, lref, lse_tol_of(dt));
  }

  /* backward from the o and lse just computed; D comes from that o */
  double *ov = tensor_values(o);
  double *dqr = values_alloc(nq), *dkr = values_alloc(nk), *dvr = values_alloc(nk);
  ref_attention_backward(&s, qv, kv, vv, ov, lref, dov, dqr, dkr, dvr);
  tf_tensor *g[2][3];
  for (int run = 0; run < 2; run++) {
    g[run][0] = empty(qs, dt), g[run][1] = empty(ks, dt), g[run][2] = empty(ks, dt);
    tf_flash_args b = a;
    b.backward = true;
    b.deterministic = run == 1;
    b.dout = tf_tensor_data(dout);
    b.dq = tf_tensor_data(g[run][0]), b.dk = tf_tensor_data(g[run][1]), b.dv = tf_tensor_data(g[run][2]);
    CHECK_INT(cctx->backend->flash_workspace(cctx, &b), 0);
    CHECK_OK(cctx->backend->flash_attention(cctx, &b));
  }
  e[2] = compare("dq", note, g[0][0], dqr, tol_of(dt));
  e[3] = compare("dk", note, g[0][1], dkr, tol_of(dt));
  e[4] = compare("dv", note, g[0][2], dvr, tol_of(dt));
  for (int i = 0; i < 3; i++)
    if (!CHECK(same_bits(g[0][i], g[1][i]))) fprintf(stderr, "FAIL %s: two backward passes differ\n", note);
  printf("%-44s o %8.2e  lse %8.2e  dq %8.2e  dk %8.2e  dv %8.2e\n", note, e[0], e[1], e[2], e[3], e[4]);

  for (int run = 0; run < 2; run++)
    for (int i = 0; i < 3; i++) tf_tensor_release(g[run][i]);
  tf_tensor *ts[] = {q, k, v, dout, o, lse};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tf_tensor_release(ts[i]);
  free(qv), free(kv), free(vv), free(dov), free(oref), free(lref), free(ov), free(dqr), free(dkr), free(dvr);
}

/* A causal row 0 sees key 0 alone: o is v's row 0 and lse is its one score. */
static void test_first_row(void) {
  attn_shape s = {1, 3, 5, 16, true, 0.25};
  double *qv, *kv, *vv;
  tf_tensor *q = tensor_randn(SHAPE(1, 3, 16), TF_F64, 1.0, &qv), *k = tensor_randn(SHAPE(1, 5, 16), TF_F64, 1.0, &kv);
  tf_tensor *v = tensor_randn(SHAPE(1, 5, 16), TF_F64, 1.0, &vv);
  tf_tensor *o = empty(SHAPE(1, 3, 16), TF_F64), *lse = empty(SHAPE(1, 3), TF_F64);
  tf_flash_args a = {.causal = true, .dtype = TF_F64, .batch = 1, .seq_q = 3, .seq_k = 5, .head_dim = 16,
                     .scale = s.scale, .q = tf_tensor_data(q), .k = tf_tensor_data(k), .v = tf_tensor_data(v),
                     .o = tf_tensor_data(o), .lse = tf_tensor_data(lse)};
  if (CHECK_OK(cctx->backend->flash_attention(cctx, &a))) {
    double dot = 0;
    for (int c = 0; c < 16; c++) dot += qv[c] * kv[c];
    CHECK_NEAR(((double *)tf_tensor_data(lse))[0], 0.25 * dot, 1e-14);
    for (int c = 0; c < 16; c++) CHECK_NEAR(((double *)tf_tensor_data(o))[c], vv[c], 1e-14);
  }
  tf_tensor *ts[] = {q, k, v, o, lse};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tf_tensor_release(ts[i]);
  free(qv), free(kv), free(vv);
}

/* A copy of the plain (B, T, d) tensor x in the merged layout (B / h, T,
 * h, d): problem b's row t at ((b / h) T + t) h + b % h. */
static tf_tensor *merged_copy(const tf_tensor *x, int64_t B, int64_t T, int64_t d, int64_t h) {
  const tf_dtype dt = x->dtype;
  const size_t es = tf_dtype_size(dt);
  tf_tensor *m = empty(SHAPE(B / h, T, h, d), dt);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      memcpy((char *)tf_tensor_data(m) + (size_t)((((b / h) * T + t) * h + b % h) * d) * es,
             (const char *)tf_tensor_data(x) + (size_t)((b * T + t) * d) * es, (size_t)d * es);
  return m;
}

/* The backward pass with O and dout in the merged layout (o_row_stride h d)
 * gives the plain layout's dq, dk and dv, bit for bit. */
static void backward_merged(const tf_flash_args *fwd, tf_tensor *o, int64_t h) {
  const int64_t B = fwd->batch, T = fwd->seq_q, d = fwd->head_dim;
  const tf_dtype dt = fwd->dtype;
  tf_tensor *dout = tensor_randn(SHAPE(B, T, d), dt, 1.0, NULL);
  tf_tensor *om = merged_copy(o, B, T, d, h), *dm = merged_copy(dout, B, T, d, h);
  tf_tensor *g[2][3];
  for (int run = 0; run < 2; run++)
    for (int i = 0; i < 3; i++) g[run][i] = empty(SHAPE(B, T, d), dt);
  bool ok = true;
  for (int run = 0; run < 2; run++) {
    tf_flash_args b = *fwd;
    b.backward = true;
    b.o = tf_tensor_data(run ? om : o), b.dout = tf_tensor_data(run ? dm : dout), b.o_row_stride = run ? h * d : 0;
    b.dq = tf_tensor_data(g[run][0]), b.dk = tf_tensor_data(g[run][1]), b.dv = tf_tensor_data(g[run][2]);
    ok = CHECK_OK(cctx->backend->flash_attention(cctx, &b)) && ok;
  }
  for (int i = 0; i < 3 && ok; i++)
    if (!CHECK(memcmp(tf_tensor_data(g[0][i]), tf_tensor_data(g[1][i]), tf_tensor_nbytes(g[0][i])) == 0))
      fprintf(stderr, "FAIL backward with O and dout merged (%lld heads a row, %s): %s differs\n", (long long)h,
              tf_dtype_name(dt), (const char *[]){"dq", "dk", "dv"}[i]);
  for (int run = 0; run < 2; run++)
    for (int i = 0; i < 3; i++) tf_tensor_release(g[run][i]);
  tf_tensor_release(dout), tf_tensor_release(om), tf_tensor_release(dm);
}

/* o_row_stride: O written with 2 and then 6 problems side by side in each
 * row (the merged (batch / h, seq, h, head_dim) layout) has O's bits, moved,
 * and the backward pass reading O and dout so gives the plain layout's
 * gradients; strides the layout cannot have are errors. */
static void test_o_row_stride(void) {
  const int64_t B = 6, T = 37, d = 24;
  for (int di = 0; di < N_FLOAT_DTYPES; di++) {
    const tf_dtype dt = FLOAT_DTYPES[di], sd = dt == TF_F64 ? TF_F64 : TF_F32;
    tf_tensor *q = tensor_randn(SHAPE(B, T, d), dt, 1.0, NULL), *k = tensor_randn(SHAPE(B, T, d), dt, 1.0, NULL);
    tf_tensor *v = tensor_randn(SHAPE(B, T, d), dt, 1.0, NULL), *o = empty(SHAPE(B, T, d), dt);
    tf_tensor *lse = empty(SHAPE(B, T), sd);
    tf_flash_args a = {.causal = true, .dtype = dt, .batch = B, .seq_q = T, .seq_k = T, .head_dim = d,
                       .scale = 0.2, .q = tf_tensor_data(q), .k = tf_tensor_data(k), .v = tf_tensor_data(v),
                       .o = tf_tensor_data(o), .lse = tf_tensor_data(lse)};
    CHECK_OK(cctx->backend->flash_attention(cctx, &a));
    const size_t es = tf_dtype_size(dt);
    static const int64_t groups[2] = {2, 6};
    for (int gi = 0; gi < 2; gi++) {
      const int64_t h = groups[gi];
      tf_tensor *om = empty(SHAPE(B / h, T, h, d), dt);
      tf_flash_args m = a;
      m.o = tf_tensor_data(om), m.o_row_stride = h * d;
      if (CHECK_OK(cctx->backend->flash_attention(cctx, &m))) {
        bool eq = true;
        for (int64_t b = 0; b < B; b++)
          for (int64_t t = 0; t < T; t++) {
            const char *plain = (const char *)tf_tensor_data(o) + (size_t)((b * T + t) * d) * es;
            const char *merged = (const char *)tf_tensor_data(om) + (size_t)((((b / h) * T + t) * h + b % h) * d) * es;
            eq = eq && memcmp(plain, merged, (size_t)d * es) == 0;
          }
        if (!CHECK(eq)) fprintf(stderr, "FAIL o_row_stride %lld (%s): O's rows differ\n", (long long)(h * d),
                                tf_dtype_name(dt));
      }
      tf_tensor_release(om);
      backward_merged(&a, o, h);
    }
    /* not a multiple of d, a group that does not divide the batch; forward and backward */
    const int64_t bad[3] = {d + 1, 4 * d, d / 2};
    for (int i = 0; i < 6; i++) {
      tf_flash_args m = a;
      m.o_row_stride = bad[i % 3];
      m.backward = i >= 3;
      m.dout = m.dq = m.dk = m.dv = tf_tensor_data(o); /* never reached */
      CHECK_INT(cctx->backend->flash_attention(cctx, &m), TF_ERR_ARG);
      CHECK(strstr(tf_last_error(), "row stride") != NULL);
    }
    tf_tensor *ts[] = {q, k, v, o, lse};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tf_tensor_release(ts[i]);
  }
}

int main(void) {
  tf_backends_init();
  test_seed();
  if (!CHECK_OK(tf_device_ctx_get(tf_cpu(), &cctx)) || !CHECK(cctx->backend->flash_attention)) return tf_check_done();
  test_reference_gradient();
  test_first_row();
  test_o_row_stride();
  /* (batch, seq_q, seq_k, head_dim): block edges at 32 queries and 32 keys */
  static const int64_t shapes[][4] = {
      {1, 1, 1, 16},   {2, 1, 37, 32},  {2, 37, 1, 32},   {3, 37, 37, 24},  {2, 129, 129, 64}, {1, 37, 129, 128},
      {1, 129, 37, 16}, {2, 64, 64, 32}, {1, 100, 70, 128}, {2, 33, 95, 7}, {1, 50, 50, 1},
  };
  for (int di = 0; di < N_FLOAT_DTYPES; di++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      for (int causal = 0; causal < 2; causal++) {
        const int64_t d = shapes[i][3];
        /* scale: 1/sqrt(d), or a sharper softmax that makes the running max move */
        const double scale = (rng_uniform() < 0.5 ? 1.0 : 3.0) / sqrt((double)d);
        attn_shape s = {shapes[i][0], shapes[i][1], shapes[i][2], d, causal, scale};
        flash_case(s, FLOAT_DTYPES[di]);
      }
  return tf_check_done();
}
