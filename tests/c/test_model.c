/* The fused Transformer engine (model.h) on the CPU against an independent,
 * straightforward double-precision implementation of the same model
 * written here with plain loops (forward and a hand-derived backward):
 * logits, loss and every gradient within 1e-5 relative error, two AdamW
 * steps against torch.optim.AdamW's formula; plus the engine's behaviour:
 * names, shapes and counts, seeded initialisation, input errors, one
 * backward per loss, gradient accumulation, inference vs training passes,
 * activation plans (made once per shape), the low-precision weight copy
 * following parameter writes, and a bf16 model near the f32 one.
 * TF_TEST_SEED repeats a run. */
#include "backend.h"
#include "backends.h"
#include "model.h"
#include "nnref.h"

enum { B = 2, T = 8, V = 64, CTX = 16, C = 32, L = 2, H = 4, F = 64, HD = C / H, N = B * T };
static const double THETA = 10000.0, EPS = 1e-5;
static const tf_model_config CFG = {V, CTX, C, L, H, F, 10000.0};

/* ---- the reference model, in double -------------------------------------------------- */

typedef struct {
  double *ln1, *wq, *wk, *wv, *wo, *ln2, *w1, *w2, *w3;
} ref_layer_w;

typedef struct {
  double *wte, *lnf, *lm;
  ref_layer_w l[L];
} ref_weights;

typedef struct {
  double x[N * C], r1[N], h1[N * C], q[N * C], k[N * C], v[N * C], p[B * H * T * T], o[N * C];
  double xm[N * C], r2[N], h2[N * C], a[N * F], b[N * F], gate[N * F];
} ref_layer_acts;

typedef struct {
  ref_layer_acts l[L];
  double x[N * C], rf[N], hf[N * C], logits[N * V], loss;
} ref_acts;

static double *param_values(tf_model *m, const char *name) {
  int i = tf_model_find(m, name);
  if (!CHECK(i >= 0)) exit(1);
  return tensor_values(tf_model_param(m, i));
}

static ref_weights ref_load(tf_model *m) {
  ref_weights w;
  char name[64];
  w.wte = param_values(m, "token_embeddings.weight");
  w.lnf = param_values(m, "ln_final.weight");
  w.lm = param_values(m, "lm_head.weight");
  for (int l = 0; l < L; l++) {
    double **slot[9] = {&w.l[l].ln1, &w.l[l].wq, &w.l[l].wk, &w.l[l].wv, &w.l[l].wo,
                        &w.l[l].ln2, &w.l[l].w1, &w.l[l].w2, &w.l[l].w3};
    const char *suffix[9] = {"ln1", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj",
                             "ln2", "ffn.w1",      "ffn.w2",      "ffn.w3"};
    for (int j = 0; j < 9; j++) {
      snprintf(name, sizeof name, "layers.%d.%s.weight", l, suffix[j]);
      *slot[j] = param_values(m, name);
    }
  }
  return w;
}

static void ref_free(ref_weights *w) {
  free(w->wte), free(w->lnf), free(w->lm);
  for (int l = 0; l < L; l++) {
    ref_layer_w *x = &w->l[l];
    free(x->ln1), free(x->wq), free(x->wk), free(x->wv), free(x->wo), free(x->ln2), free(x->w1), free(x->w2),
        free(x->w3);
  }
}

/* y (rows, out) = x (rows, in) W^T, W (out, in) */
static void linear(const double *x, const double *w, int rows, int in, int out, double *y) {
  for (int r = 0; r < rows; r++)
    for (int o = 0; o < out; o++) {
      double s = 0;
      for (int i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
}

/* dx (+)= dy W; dw += dy^T x */
static void linear_back(const double *dy, const double *x, const double *w, int rows, int in, int out, double *dx,
                        double *dw, bool add) {
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < in; i++) {
      double s = 0;
      for (int o = 0; o < out; o++) s += dy[r * out + o] * w[o * in + i];
      dx[r * in + i] = (add ? dx[r * in + i] : 0) + s;
    }
  for (int o = 0; o < out; o++)
    for (int i = 0; i < in; i++)
      for (int r = 0; r < N; r++) dw[o * in + i] += dy[r * out + o] * x[r * in + i];
}

static void rms(const double *x, const double *g, double *y, double *rs) {
  for (int r = 0; r < N; r++) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += x[r * C + c] * x[r * C + c];
    rs[r] = 1 / sqrt(ss / C + EPS);
    for (int c = 0; c < C; c++) y[r * C + c] = x[r * C + c] * rs[r] * g[c];
  }
}

/* dx += rms's input gradient; dg += its gain's */
static void rms_back(const double *dy, const double *x, const double *g, const double *rs, double *dx, double *dg) {
  for (int r = 0; r < N; r++) {
    double s = 0;
    for (int c = 0; c < C; c++) s += dy[r * C + c] * g[c] * x[r * C + c] * rs[r];
    for (int c = 0; c < C; c++) {
      double xh = x[r * C + c] * rs[r];
      dx[r * C + c] += rs[r] * (dy[r * C + c] * g[c] - xh * s / C);
      dg[c] += dy[r * C + c] * xh;
    }
  }
}

/* Rotates each head's pairs of rows (b, t) by sign * t theta^(-2i / hd). */
static void rope(double *x, double sign) {
  for (int r = 0; r < N; r++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < HD / 2; i++) {
        double ang = sign * (r % T) * pow(THETA, -2.0 * i / HD), c = cos(ang), s = sin(ang);
        double *p = &x[r * C + h * HD + 2 * i], x0 = p[0], x1 = p[1];
        p[0] = x0 * c - x1 * s;
        p[1] = x0 * s + x1 * c;
      }
}

static void ref_forward(const ref_weights *w, const int64_t *ids, const int64_t *targets, ref_acts *a) {
  double x[N * C];
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) x[i * C + c] = w->wte[ids[i] * C + c];
  for (int l = 0; l < L; l++) {
    ref_layer_acts *s = &a->l[l];
    const ref_layer_w *lw = &w->l[l];
    memcpy(s->x, x, sizeof x);
    rms(x, lw->ln1, s->h1, s->r1);
    linear(s->h1, lw->wq, N, C, C, s->q);
    linear(s->h1, lw->wk, N, C, C, s->k);
    linear(s->h1, lw->wv, N, C, C, s->v);
    rope(s->q, 1), rope(s->k, 1);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
          double *p = &s->p[((b * H + h) * T + t) * T], m = -INFINITY, sum = 0;
          for (int j = 0; j < T; j++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += s->q[(b * T + t) * C + h * HD + e] * s->k[(b * T + j) * C + h * HD + e];
            p[j] = d / sqrt(HD);
            if (j <= t && p[j] > m) m = p[j];
          }
          for (int j = 0; j < T; j++) sum += j <= t ? exp(p[j] - m) : 0;
          for (int j = 0; j < T; j++) p[j] = j <= t ? exp(p[j] - m) / sum : 0;
          for (int e = 0; e < HD; e++) {
            double o = 0;
            for (int j = 0; j < T; j++) o += p[j] * s->v[(b * T + j) * C + h * HD + e];
            s->o[(b * T + t) * C + h * HD + e] = o;
          }
        }
    double att[N * C];
    linear(s->o, lw->wo, N, C, C, att);
    for (int i = 0; i < N * C; i++) s->xm[i] = x[i] + att[i];
    rms(s->xm, lw->ln2, s->h2, s->r2);
    linear(s->h2, lw->w1, N, C, F, s->a);
    linear(s->h2, lw->w3, N, C, F, s->b);
    for (int i = 0; i < N * F; i++) s->gate[i] = s->a[i] / (1 + exp(-s->a[i])) * s->b[i];
    double ffn[N * C];
    linear(s->gate, lw->w2, N, F, C, ffn);
    for (int i = 0; i < N * C; i++) x[i] = s->xm[i] + ffn[i];
  }
  memcpy(a->x, x, sizeof x);
  rms(x, w->lnf, a->hf, a->rf);
  linear(a->hf, w->lm, N, C, V, a->logits);
  a->loss = ref_cross_entropy(a->logits, N, V, targets, NULL);
}

/* Gradients of the mean loss, named as the engine's tensors (indices of m). */
static void ref_backward(tf_model *m, const ref_weights *w, const int64_t *ids, const int64_t *targets,
                         const ref_acts *a, double **grads) {
  char name[64];
#define G(nm) grads[tf_model_find(m, nm)]
  static double dlogits[N * V], dh[N * C], dx[N * C], dgate[N * F], da[N * F], db[N * F], datt[N * C];
  static double dq[N * C], dk[N * C], dv[N * C];
  double lse[N];
  ref_cross_entropy(a->logits, N, V, targets, lse);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < V; c++) dlogits[r * V + c] = (exp(a->logits[r * V + c] - lse[r]) - (c == targets[r])) / N;
  linear_back(dlogits, a->hf, w->lm, N, C, V, dh, G("lm_head.weight"), false);
  memset(dx, 0, sizeof dx);
  rms_back(dh, a->x, w->lnf, a->rf, dx, G("ln_final.weight"));
  for (int l = L - 1; l >= 0; l--) {
    const ref_layer_acts *s = &a->l[l];
    const ref_layer_w *lw = &w->l[l];
#define LG(sfx) (snprintf(name, sizeof name, "layers.%d.%s.weight", l, sfx), G(name))
    linear_back(dx, s->gate, lw->w2, N, F, C, dgate, LG("ffn.w2"), false);
    for (int i = 0; i < N * F; i++) {
      double sg = 1 / (1 + exp(-s->a[i]));
      da[i] = dgate[i] * s->b[i] * (sg + s->a[i] * sg * (1 - sg));
      db[i] = dgate[i] * s->a[i] * sg;
    }
    linear_back(da, s->h2, lw->w1, N, C, F, dh, LG("ffn.w1"), false);
    linear_back(db, s->h2, lw->w3, N, C, F, dh, LG("ffn.w3"), true);
    rms_back(dh, s->xm, lw->ln2, s->r2, dx, LG("ln2"));
    linear_back(dx, s->o, lw->wo, N, C, C, datt, LG("attn.output_proj"), false);
    memset(dq, 0, sizeof dq), memset(dk, 0, sizeof dk), memset(dv, 0, sizeof dv);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
          const double *p = &s->p[((b * H + h) * T + t) * T];
          double dp[T], dot = 0;
          for (int j = 0; j < T; j++) {
            dp[j] = 0;
            for (int e = 0; e < HD; e++) dp[j] += datt[(b * T + t) * C + h * HD + e] * s->v[(b * T + j) * C + h * HD + e];
            dot += p[j] * dp[j];
          }
          for (int j = 0; j < T; j++) {
            double ds = p[j] * (dp[j] - dot) / sqrt(HD);
            for (int e = 0; e < HD; e++) {
              dv[(b * T + j) * C + h * HD + e] += p[j] * datt[(b * T + t) * C + h * HD + e];
              dq[(b * T + t) * C + h * HD + e] += ds * s->k[(b * T + j) * C + h * HD + e];
              dk[(b * T + j) * C + h * HD + e] += ds * s->q[(b * T + t) * C + h * HD + e];
            }
          }
        }
    rope(dq, -1), rope(dk, -1);
    linear_back(dq, s->h1, lw->wq, N, C, C, dh, LG("attn.q_proj"), false);
    linear_back(dk, s->h1, lw->wk, N, C, C, dh, LG("attn.k_proj"), true);
    linear_back(dv, s->h1, lw->wv, N, C, C, dh, LG("attn.v_proj"), true);
    rms_back(dh, s->x, lw->ln1, s->r1, dx, LG("ln1"));
#undef LG
  }
  double *dwte = G("token_embeddings.weight");
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) dwte[ids[i] * C + c] += dx[i * C + c];
#undef G
}

/* ---- helpers ----------------------------------------------------------------------------- */

static tf_tensor *ids_tensor(const int64_t *v, int64_t b, int64_t t, tf_dtype d) {
  double vals[64];
  for (int64_t i = 0; i < b * t; i++) vals[i] = (double)v[i];
  return tensor_from(vals, SHAPE(b, t), d);
}

static tf_model *make(tf_dtype precision, uint64_t seed) {
  tf_seed_all(seed);
  tf_model *m = NULL;
  if (!CHECK_OK(tf_model_create(&CFG, tf_cpu(), precision, &m))) exit(1);
  return m;
}

static double item(const tf_tensor *t) {
  double *v = tensor_values(t), x = v[0];
  free(v);
  return x;
}

/* The last error contains want. */
static bool error_says(tf_status st, tf_status code, const char *want) {
  bool ok = CHECK_INT(st, code) && CHECK(strstr(tf_last_error(), want) != NULL);
  if (!ok) fprintf(stderr, "  expected '%s' in: %s\n", want, tf_last_error());
  return ok;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static int64_t ids_v[N], targets_v[N];

static void test_against_reference(void) {
  tf_model *m = make(TF_F32, rng_next());
  tf_tensor *ids = ids_tensor(ids_v, B, T, TF_I64), *targets = ids_tensor(targets_v, B, T, TF_I32);
  ref_weights w = ref_load(m);
  static ref_acts ra;
  ref_forward(&w, ids_v, targets_v, &ra);
  tf_tensor *logits = NULL, *loss = NULL;
  CHECK_OK(tf_model_forward(m, ids, false, &logits));
  check_close("inference logits", logits, ra.logits, 1e-5);
  tf_tensor_release(logits);
  CHECK_OK(tf_model_forward(m, ids, true, &logits));
  check_close("training-pass logits", logits, ra.logits, 1e-5);
  tf_tensor_release(logits);
  CHECK_OK(tf_model_loss(m, ids, targets, &loss));
  CHECK_INT(loss->ndim, 0);
  CHECK_INT(loss->dtype, TF_F32);
  check_close("loss", loss, &ra.loss, 1e-5);
  CHECK_OK(tf_model_backward(m));
  int nt = tf_model_num_tensors(m);
  double **grads = calloc((size_t)nt, sizeof *grads);
  for (int i = 0; i < nt; i++) grads[i] = values_alloc(tf_tensor_numel(tf_model_grad(m, i)));
  ref_backward(m, &w, ids_v, targets_v, &ra, grads);
  double worst = 0;
  for (int i = 0; i < nt; i++) {
    double *g = tensor_values(tf_model_grad(m, i));
    double e = rel_error(g, grads[i], tf_tensor_numel(tf_model_grad(m, i)));
    if (!(e <= 1e-5)) fprintf(stderr, "gradient of %s: relative error %.3g\n", tf_model_tensor_name(m, i), e);
    CHECK(e <= 1e-5);
    if (e > worst) worst = e;
    free(g);
  }
  printf("f32 engine vs double reference: loss %.9f (reference %.9f), worst gradient error %.3g\n", item(loss),
         ra.loss, worst);
  /* two AdamW steps from these gradients against torch.optim.AdamW's formula */
  const tf_adamw_args args = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  for (int i = 0; i < nt; i++) {
    free(grads[i]);
    grads[i] = tensor_values(tf_model_grad(m, i));
  }
  double **p = calloc((size_t)nt, sizeof *p), **mom = calloc((size_t)nt, sizeof *mom), **vel = calloc((size_t)nt, sizeof *vel);
  for (int i = 0; i < nt; i++) {
    int64_t n = tf_tensor_numel(tf_model_param(m, i));
    p[i] = tensor_values(tf_model_param(m, i));
    mom[i] = values_alloc(n), vel[i] = values_alloc(n);
  }
  for (int step = 1; step <= 2; step++) {
    tf_adamw_args a = args;
    a.step = step;
    CHECK_OK(tf_model_adamw_step(m, &a));
    double bc1 = 1 - pow(a.beta1, step), bc2 = 1 - pow(a.beta2, step), diff = 0;
    for (int i = 0; i < nt; i++) {
      int64_t n = tf_tensor_numel(tf_model_param(m, i));
      double *got = tensor_values(tf_model_param(m, i));
      for (int64_t j = 0; j < n; j++) {
        double g = grads[i][j];
        mom[i][j] = a.beta1 * mom[i][j] + (1 - a.beta1) * g;
        vel[i][j] = a.beta2 * vel[i][j] + (1 - a.beta2) * g * g;
        p[i][j] = p[i][j] * (1 - a.lr * a.weight_decay) -
                  a.lr * (mom[i][j] / bc1) / (sqrt(vel[i][j] / bc2) + a.eps);
        if (fabs(got[j] - p[i][j]) > diff) diff = fabs(got[j] - p[i][j]);
      }
      free(got);
    }
    if (!(diff <= 1e-6)) fprintf(stderr, "AdamW step %d: worst difference %.3g\n", step, diff);
    CHECK(diff <= 1e-6);
  }
  for (int i = 0; i < nt; i++) free(grads[i]), free(p[i]), free(mom[i]), free(vel[i]);
  free(grads), free(p), free(mom), free(vel);
  ref_free(&w);
  tf_tensor_release(loss), tf_tensor_release(ids), tf_tensor_release(targets);
  tf_model_free(m);
}

static void test_layout_and_init(void) {
  tf_model *m = make(TF_F32, 42), *same = make(TF_F32, 42), *other = make(TF_F32, 43);
  CHECK_INT(tf_model_num_tensors(m), 1 + 9 * L + 2);
  const char *expect[] = {"token_embeddings.weight", "layers.0.ln1.weight", "layers.0.attn.q_proj.weight",
                          "layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight",
                          "layers.0.attn.output_proj.weight", "layers.0.ln2.weight", "layers.0.ffn.w1.weight",
                          "layers.0.ffn.w2.weight", "layers.0.ffn.w3.weight", "layers.1.ln1.weight"};
  for (int i = 0; i < (int)(sizeof expect / sizeof expect[0]); i++) CHECK(strcmp(tf_model_tensor_name(m, i), expect[i]) == 0);
  CHECK(strcmp(tf_model_tensor_name(m, tf_model_num_tensors(m) - 1), "lm_head.weight") == 0);
  CHECK(strcmp(tf_model_tensor_name(m, tf_model_num_tensors(m) - 2), "ln_final.weight") == 0);
  CHECK(tf_model_tensor_name(m, tf_model_num_tensors(m)) == NULL);
  int64_t total = 0;
  bool same_bits = true, differs = false;
  for (int i = 0; i < tf_model_num_tensors(m); i++) {
    tf_tensor *p = tf_model_param(m, i);
    total += tf_tensor_numel(p);
    CHECK_INT(p->dtype, TF_F32);
    double *a = tensor_values(p), *b = tensor_values(tf_model_param(same, i)), *c = tensor_values(tf_model_param(other, i));
    const char *name = tf_model_tensor_name(m, i);
    double std = 0, lim = 0;
    int64_t n = tf_tensor_numel(p);
    bool norm = strstr(name, "ln") != NULL;
    if (norm) {
      for (int64_t j = 0; j < n; j++) CHECK(a[j] == 1.0);
    } else {
      int64_t rows = p->shape[0], cols = p->shape[1];
      double want = strstr(name, "token_embeddings") ? 1.0 : sqrt(2.0 / (double)(rows + cols));
      for (int64_t j = 0; j < n; j++) std += a[j] * a[j], lim = fmax(lim, fabs(a[j]));
      std = sqrt(std / (double)n);
      /* a normal cut at 3 std has std 0.986 std */
      if (!CHECK(fabs(std / want - 0.986) < 0.2 && lim <= 3 * want * (1 + 1e-6)))
        fprintf(stderr, "%s: std %.4g (want about %.4g), max |w| %.4g\n", name, std, 0.986 * want, lim);
      for (int64_t j = 0; j < n; j++) differs |= a[j] != c[j];
    }
    for (int64_t j = 0; j < n; j++) same_bits &= a[j] == b[j];
    free(a), free(b), free(c);
  }
  CHECK(same_bits);
  CHECK(differs);
  CHECK_INT(total, tf_model_config_parameters(&CFG));
  CHECK_INT(tf_model_find(m, "ln_final.weight"), tf_model_num_tensors(m) - 2);
  CHECK_INT(tf_model_find(m, "nope"), -1);
  tf_model_memory u = tf_model_memory_use(m);
  /* no optimizer state until the first AdamW step; gradients made by the first pass that needs them */
  CHECK(u.params >= (size_t)total * 4 && u.optimizer == 0);
  CHECK(u.grads == 0 || u.grads == u.params);
  tf_adamw_args first = {.lr = 0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0, .step = 1};
  CHECK_OK(tf_model_adamw_step(m, &first));
  u = tf_model_memory_use(m);
  CHECK(u.optimizer == 2 * u.params && u.grads == u.params);
  CHECK(u.low_precision == 0 && u.activations == 0);
  /* the presets' parameter counts (DESIGN.md, vocab 10000) */
  tf_model_config small = {10000, 256, 768, 12, 12, 3072, 10000.0}, xl = {10000, 256, 1600, 48, 25, 6400, 10000.0};
  tf_model_config big = {10000, 256, 2560, 32, 32, 10240, 10000.0};
  CHECK_INT(tf_model_config_parameters(&small), 128625408);
  CHECK_OK(tf_model_config_check(&xl));
  CHECK_INT(tf_model_config_parameters(&big), 3406809600); /* the "2.7B" name is nominal */
  tf_model_free(m), tf_model_free(same), tf_model_free(other);
}

static void test_config_errors(void) {
  tf_model *m = NULL;
  tf_model_config c = CFG;
  c.num_heads = 5;
  error_says(tf_model_create(&c, tf_cpu(), TF_F32, &m), TF_ERR_ARG, "d_model (32) must be divisible by num_heads (5)");
  c = CFG, c.num_heads = 32; /* head dim 1 */
  error_says(tf_model_create(&c, tf_cpu(), TF_F32, &m), TF_ERR_ARG, "must be even");
  c = CFG, c.d_ff = 0;
  error_says(tf_model_create(&c, tf_cpu(), TF_F32, &m), TF_ERR_ARG, "d_ff must be a positive integer, not 0");
  c = CFG, c.vocab_size = -3;
  error_says(tf_model_create(&c, tf_cpu(), TF_F32, &m), TF_ERR_ARG, "vocab_size");
  c = CFG, c.rope_theta = 0;
  error_says(tf_model_create(&c, tf_cpu(), TF_F32, &m), TF_ERR_ARG, "rope_theta");
  error_says(tf_model_create(&CFG, tf_cpu(), TF_F64, &m), TF_ERR_ARG, "precision must be f32, bf16 or f16");
  CHECK(m == NULL);
}

static void test_input_errors(void) {
  tf_model *m = make(TF_F32, 5);
  tf_tensor *ids = ids_tensor(ids_v, B, T, TF_I64), *targets = ids_tensor(targets_v, B, T, TF_I64), *out = NULL;
  error_says(tf_model_backward(m), TF_ERR_STATE, "call loss() first");
  int64_t longer[2 * (CTX + 1)] = {0};
  tf_tensor *t = ids_tensor(longer, 1, CTX + 1, TF_I64);
  error_says(tf_model_forward(m, t, false, &out), TF_ERR_ARG, "sequence length 17 of ids is longer than the context length 16");
  tf_tensor_release(t);
  int64_t bad[B * T];
  memcpy(bad, ids_v, sizeof bad);
  bad[T + 3] = V;
  t = ids_tensor(bad, B, T, TF_I32);
  error_says(tf_model_forward(m, t, false, &out), TF_ERR_ARG, "token id 64 at position [1, 3] is out of range [0, 64)");
  error_says(tf_model_loss(m, ids, t, &out), TF_ERR_ARG, "target 64 at position [1, 3] is out of range");
  tf_tensor_release(t);
  bad[T + 3] = -1;
  t = ids_tensor(bad, B, T, TF_I64);
  error_says(tf_model_loss(m, t, targets, &out), TF_ERR_ARG, "token id -1 at position [1, 3]");
  tf_tensor_release(t);
  t = ids_tensor(ids_v, B * T, 1, TF_I64);
  error_says(tf_model_loss(m, ids, t, &out), TF_ERR_ARG, "targets must have the shape of ids (2, 8), not (16, 1)");
  tf_tensor_release(t);
  t = tensor_randn(SHAPE(B, T), TF_F32, 1.0, NULL);
  error_says(tf_model_forward(m, t, false, &out), TF_ERR_ARG, "ids must be i32 or i64 token ids, not f32");
  tf_tensor_release(t);
  t = ids_tensor(ids_v, 1, B * T, TF_I64);
  tf_tensor *flat = NULL;
  CHECK_OK(tf_reshape(t, &SHAPE(B * T), &flat));
  error_says(tf_model_forward(m, flat, false, &out), TF_ERR_ARG, "ids must be 2-D (batch, seq), not of shape (16,)");
  tf_tensor_release(t), tf_tensor_release(flat);
  /* the engine works after errors; one backward per loss */
  CHECK_OK(tf_model_loss(m, ids, targets, &out));
  tf_tensor_release(out);
  CHECK_OK(tf_model_backward(m));
  error_says(tf_model_backward(m), TF_ERR_STATE, "one backward per loss");
  CHECK_OK(tf_model_loss(m, ids, targets, &out));
  tf_tensor_release(out);
  CHECK_OK(tf_model_forward(m, ids, false, &out)); /* overwrites what backward needs */
  tf_tensor_release(out);
  error_says(tf_model_backward(m), TF_ERR_STATE, "call loss() first");
  tf_tensor_release(ids), tf_tensor_release(targets);
  tf_model_free(m);
}

/* Gradients accumulate; zero_grad clears them; passes agree bit for bit. */
static void test_accumulation_and_passes(void) {
  tf_model *m = make(TF_F32, 11);
  tf_tensor *ids = ids_tensor(ids_v, B, T, TF_I64), *targets = ids_tensor(targets_v, B, T, TF_I64), *l1 = NULL,
            *l2 = NULL, *a = NULL, *b = NULL;
  CHECK_OK(tf_model_loss(m, ids, targets, &l1));
  CHECK_OK(tf_model_backward(m));
  int nt = tf_model_num_tensors(m);
  double **once = calloc((size_t)nt, sizeof *once);
  for (int i = 0; i < nt; i++) once[i] = tensor_values(tf_model_grad(m, i));
  CHECK_OK(tf_model_loss(m, ids, targets, &l2));
  CHECK(item(l1) == item(l2));
  CHECK_OK(tf_model_backward(m));
  for (int i = 0; i < nt; i++) {
    int64_t n = tf_tensor_numel(tf_model_grad(m, i));
    double *twice = tensor_values(tf_model_grad(m, i));
    for (int64_t j = 0; j < n; j++) once[i][j] *= 2;
    check_close("accumulated gradient", tf_model_grad(m, i), once[i], 1e-6);
    free(twice), free(once[i]);
  }
  free(once);
  CHECK_OK(tf_model_zero_grad(m));
  double *z = tensor_values(tf_model_grad(m, 0));
  CHECK(z[0] == 0 && z[tf_tensor_numel(tf_model_grad(m, 0)) - 1] == 0);
  free(z);
  /* inference over a training plan, and over its own plan, give the same bits */
  CHECK_OK(tf_model_forward(m, ids, false, &a));
  CHECK_OK(tf_model_forward(m, ids, true, &b));
  double *va = tensor_values(a), *vb = tensor_values(b);
  CHECK(memcmp(va, vb, sizeof(double) * (size_t)(N * V)) == 0);
  free(va), free(vb);
  tf_tensor_release(a), tf_tensor_release(b);
  /* the fused loss is cross_entropy of the logits */
  CHECK_OK(tf_model_forward(m, ids, false, &a));
  tf_tensor *ce = NULL;
  CHECK_OK(tf_cross_entropy(a, targets, &ce, NULL));
  CHECK_NEAR(item(l1), item(ce), 1e-6);
  tf_tensor_release(a), tf_tensor_release(ce), tf_tensor_release(l1), tf_tensor_release(l2);
  tf_tensor_release(ids), tf_tensor_release(targets);
  tf_model_free(m);
}

/* One allocation per shape: the same shape reuses it, a new one replaces it. */
static void test_plans(void) {
  tf_device_ctx *ctx = NULL;
  CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx));
  tf_model *m = make(TF_BF16, 3);
  tf_tensor *ids = ids_tensor(ids_v, B, T, TF_I64), *targets = ids_tensor(targets_v, B, T, TF_I64), *loss = NULL;
  tf_model_memory before = tf_model_memory_use(m);
  CHECK(before.low_precision > 0 && before.activations == 0);
  size_t allocated[4];
  const tf_adamw_args args = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  double first = 0, last = 0;
  for (int step = 0; step < 4; step++) {
    CHECK_OK(tf_model_loss(m, ids, targets, &loss));
    CHECK_OK(tf_model_backward(m));
    tf_adamw_args a = args;
    a.step = step + 1;
    CHECK_OK(tf_model_adamw_step(m, &a));
    CHECK_OK(tf_model_zero_grad(m));
    if (step == 0) first = item(loss);
    last = item(loss);
    tf_tensor_release(loss);
    allocated[step] = ctx->alloc.stats.allocated;
  }
  CHECK(last < first);
  CHECK(allocated[1] == allocated[0] && allocated[3] == allocated[0]);
  size_t planned = tf_model_memory_use(m).activations;
  CHECK(planned > 0);
  /* inference at the same shape uses the training plan */
  tf_tensor *logits = NULL;
  CHECK_OK(tf_model_forward(m, ids, false, &logits));
  CHECK_INT(logits->dtype, TF_BF16);
  CHECK_INT(tf_model_memory_use(m).activations, planned);
  tf_tensor_release(logits);
  /* another shape: a new plan; an inference plan is smaller */
  tf_tensor *one = ids_tensor(ids_v, 1, T, TF_I64);
  CHECK_OK(tf_model_forward(m, one, false, &logits));
  CHECK_INT(logits->shape[0], 1);
  size_t small = tf_model_memory_use(m).activations;
  CHECK(small > 0 && small < planned / 2);
  tf_tensor_release(logits), tf_tensor_release(one);
  CHECK_OK(tf_model_loss(m, ids, targets, &loss));
  CHECK_INT(tf_model_memory_use(m).activations, planned);
  tf_tensor_release(loss);
  tf_tensor_release(ids), tf_tensor_release(targets);
  tf_model_free(m);
  CHECK_INT(ctx->alloc.stats.active_blocks, 0);
}

/* bf16 / f16 models: the same f32 weights, logits near the f32 model's; a
 * write into a parameter view reaches the low-precision copy. */
static void test_mixed_precision(void) {
  tf_model *f = make(TF_F32, 9), *h = make(TF_BF16, 9), *g = make(TF_F16, 9);
  tf_tensor *ids = ids_tensor(ids_v, B, T, TF_I64), *lf = NULL, *lh = NULL, *lg = NULL;
  CHECK_OK(tf_model_forward(f, ids, false, &lf));
  CHECK_OK(tf_model_forward(h, ids, false, &lh));
  CHECK_OK(tf_model_forward(g, ids, false, &lg));
  double *vf = tensor_values(lf);
  CHECK_INT(lh->dtype, TF_BF16);
  CHECK_INT(lg->dtype, TF_F16);
  check_close("bf16 logits vs f32", lh, vf, 2e-2);
  check_close("f16 logits vs f32", lg, vf, 5e-3);
  free(vf);
  tf_tensor_release(lh);
  /* zero lm_head through its view: the logits become 0 */
  tf_tensor *head = tf_model_param(h, tf_model_find(h, "lm_head.weight")), *zeros = NULL;
  tf_shape hs = tf_tensor_shape(head);
  CHECK_OK(tf_full(&hs, 0.0, TF_F32, tf_cpu(), &zeros));
  CHECK_OK(tf_copy_into(head, zeros));
  head->storage->version++; /* as copy_ and every in-place write do */
  CHECK_OK(tf_model_forward(h, ids, false, &lh));
  double *vh = tensor_values(lh), mx = 0;
  for (int64_t i = 0; i < N * V; i++) mx = fmax(mx, fabs(vh[i]));
  CHECK(mx == 0);
  free(vh);
  tf_tensor_release(zeros), tf_tensor_release(lf), tf_tensor_release(lh), tf_tensor_release(lg);
  tf_tensor_release(ids);
  tf_model_free(f), tf_model_free(h), tf_model_free(g);
}

int main(void) {
  tf_backends_init();
  test_seed();
  for (int i = 0; i < N; i++) ids_v[i] = rng_int(0, V), targets_v[i] = rng_int(0, V);
  test_against_reference();
  test_layout_and_init();
  test_config_errors();
  test_input_errors();
  test_accumulation_and_passes();
  test_plans();
  test_mixed_precision();
  tf_device_ctx *ctx = NULL;
  if (CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx))) CHECK_INT(ctx->alloc.stats.active_blocks, 0);
  return tf_check_done();
}
