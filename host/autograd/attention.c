/* tf.attention: argument checks shared by both implementations, the naive
 * one composed of differentiable ops, and the FlashAttention-2 op (dispatch
 * to backend.h's flash_attention plus its autograd node). */
#include "attention.h"

#include <math.h>
#include <stdio.h>

#include "autocast.h"
#include "autograd.h"
#include "backend.h"
#include "grad_ops.h"
#include "nnops.h"
#include "temps.h"

#define TF_ATTN_OP "attention"

/* ---- checks ------------------------------------------------------------- */

static const char *tf_attn_shape(const tf_tensor *t, char *buf, size_t n) {
  tf_shape s = tf_tensor_shape(t);
  return tf_shape_format(&s, buf, n);
}

/* The leading dims of t (all but seq and head_dim), as a shape for messages. */
static tf_shape tf_attn_lead(const tf_tensor *t) {
  tf_shape s = tf_tensor_shape(t);
  s.ndim = t->ndim >= 2 ? t->ndim - 2 : 0;
  return s;
}

static int64_t tf_attn_head_dim(const tf_tensor *t) { return t->shape[t->ndim - 1]; }
static int64_t tf_attn_seq(const tf_tensor *t) { return t->shape[t->ndim - 2]; }

/* Everything but the dtypes' agreement, which autocast may still change:
 * float tensors of at least 2 dims on one device, the same leading dims, k
 * and v of one shape, q's head dim, non-empty sequences and head dims. */
static tf_status tf_attn_check_shapes(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v) {
  const tf_tensor *ts[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  char a[128], b[128];
  for (int i = 0; i < 3; i++) {
    if (tf_dtype_is_fp8(ts[i]->dtype)) return tf_dtype_refusal(TF_ATTN_OP, ts[i]->dtype);
    if (!tf_dtype_is_float(ts[i]->dtype))
      return tf_fail(TF_ERR_ARG, "%s: %s must have a floating dtype (f32, f16, bf16 or f64), not %s", TF_ATTN_OP,
                     names[i], tf_dtype_name(ts[i]->dtype));
    if (ts[i]->ndim < 2)
      return tf_fail(TF_ERR_ARG, "%s: %s must have at least 2 dims (..., seq, head_dim), not shape %s", TF_ATTN_OP,
                     names[i], tf_attn_shape(ts[i], a, sizeof a));
  }
  for (int i = 1; i < 3; i++) {
    if (tf_device_eq(ts[i]->device, q->device)) continue;
    tf_device_format(ts[i]->device, a, sizeof a);
    tf_device_format(q->device, b, sizeof b);
    return tf_fail(TF_ERR_DEVICE, "%s: %s is on %s but q is on %s; move one with :to()", TF_ATTN_OP, names[i], a, b);
  }
  tf_shape lq = tf_attn_lead(q), lk = tf_attn_lead(k);
  bool same_lead = lq.ndim == lk.ndim;
  for (int i = 0; same_lead && i < lq.ndim; i++) same_lead = lq.dims[i] == lk.dims[i];
  if (!same_lead) {
    char c[128], d[128];
    return tf_fail(TF_ERR_ARG,
                   "%s: k must have q's leading dims %s (all but seq and head_dim), not %s (q is %s, k is %s)",
                   TF_ATTN_OP, tf_shape_format(&lq, a, sizeof a), tf_shape_format(&lk, b, sizeof b),
                   tf_attn_shape(q, c, sizeof c), tf_attn_shape(k, d, sizeof d));
  }
  if (tf_attn_head_dim(k) != tf_attn_head_dim(q))
    return tf_fail(TF_ERR_ARG, "%s: k must have q's head dim %lld (the last dim), not %lld (q is %s, k is %s)",
                   TF_ATTN_OP, (long long)tf_attn_head_dim(q), (long long)tf_attn_head_dim(k),
                   tf_attn_shape(q, a, sizeof a), tf_attn_shape(k, b, sizeof b));
  bool same_kv = v->ndim == k->ndim;
  for (int i = 0; same_kv && i < k->ndim; i++) same_kv = v->shape[i] == k->shape[i];
  if (!same_kv)
    return tf_fail(TF_ERR_ARG, "%s: v must have k's shape %s (one value row per key), not %s", TF_ATTN_OP,
                   tf_attn_shape(k, a, sizeof a), tf_attn_shape(v, b, sizeof b));
  if (tf_attn_seq(q) < 1 || tf_attn_seq(k) < 1)
    return tf_fail(TF_ERR_ARG, "%s: %s has an empty sequence (shape %s); seq_q and seq_k must be >= 1", TF_ATTN_OP,
                   tf_attn_seq(q) < 1 ? "q" : "k", tf_attn_shape(tf_attn_seq(q) < 1 ? q : k, a, sizeof a));
  if (tf_attn_head_dim(q) < 1)
    return tf_fail(TF_ERR_ARG, "%s: the head dim (the last dim of q, k and v) must be >= 1, not 0", TF_ATTN_OP);
  return TF_OK;
}

static tf_status tf_attn_check_dtypes(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v) {
  if (k->dtype == q->dtype && v->dtype == q->dtype) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: q, k and v must have one dtype, not q %s, k %s, v %s (convert with :to())",
                 TF_ATTN_OP, tf_dtype_name(q->dtype), tf_dtype_name(k->dtype), tf_dtype_name(v->dtype));
}

/* What only the flash implementation needs: a backend that has it, its
 * dtypes (f64 on the CPU only) and head dims up to 128. */
static tf_status tf_attn_check_flash(const tf_tensor *q, const tf_device_ctx *ctx) {
  char dev[32];
  tf_device_format(q->device, dev, sizeof dev);
  if (!ctx->backend->flash_attention)
    return tf_fail(TF_ERR_DEVICE, "%s: impl = \"flash\" is not available on %s in this build (use impl = \"naive\")",
                   TF_ATTN_OP, dev);
  int64_t d = tf_attn_head_dim(q);
  if (d > TF_FLASH_MAX_HEAD_DIM)
    return tf_fail(TF_ERR_ARG, "%s: impl = \"flash\" supports head dims 1..%d, not %lld (use impl = \"naive\")",
                   TF_ATTN_OP, TF_FLASH_MAX_HEAD_DIM, (long long)d);
  bool ok = q->dtype == TF_F32 || q->dtype == TF_F16 || q->dtype == TF_BF16 ||
            (q->dtype == TF_F64 && q->device.type == TF_DEV_CPU);
  if (!ok)
    return tf_fail(TF_ERR_ARG, "%s: impl = \"flash\" on %s takes f32, f16 or bf16%s, not %s (use impl = \"naive\")",
                   TF_ATTN_OP, dev, q->device.type == TF_DEV_CPU ? " or f64" : "", tf_dtype_name(q->dtype));
  return TF_OK;
}

static tf_status tf_attn_check_scale(double scale) {
  if (isfinite(scale)) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: scale must be a finite number, not %g", TF_ATTN_OP, scale);
}

/* ---- flash: dispatch -------------------------------------------------------- */

/* Backends take head dims 16..128 (backend.h); smaller ones are padded to
 * 16 with zeros, which add nothing to q.k and leave extra output and
 * gradient columns of zeros that are cut off again. */
static int64_t tf_attn_padded_dim(int64_t d) { return d < 16 ? 16 : d; }

/* t as a contiguous tensor of dtype dt with its last dim widened to dpad
 * by zeros (t itself, retained, when it already is one), kept in tt. */
static tf_status tf_attn_prepare(tf_temps *tt, const tf_tensor *t, tf_dtype dt, int64_t dpad, const tf_tensor **out) {
  int last = t->ndim - 1;
  tf_tensor *r = NULL;
  if (t->shape[last] == dpad) {
    if (t->dtype == dt && tf_tensor_is_contiguous(t))
      r = tf_tensor_retain((tf_tensor *)t);
    else
      TF_TRY(tf_to(t, dt, t->device, &r));
  } else {
    tf_shape s = tf_tensor_shape(t);
    s.dims[last] = dpad;
    TF_TRY(tf_full(&s, 0.0, dt, t->device, &r));
    tf_tensor *cols = NULL;
    tf_status st = tf_narrow(r, last, 0, t->shape[last], &cols);
    if (st == TF_OK) st = tf_copy_into(cols, t);
    tf_tensor_release(cols);
    if (st != TF_OK) {
      tf_tensor_release(r);
      return st;
    }
  }
  *out = tf_temps_keep(tt, r);
  return TF_OK;
}

/* Cuts the last dim of *t back to d columns (a contiguous copy), if padded. */
static tf_status tf_attn_unpad(tf_tensor **t, int64_t d) {
  int last = (*t)->ndim - 1;
  if ((*t)->shape[last] == d) return TF_OK;
  tf_tensor *cols, *c;
  TF_TRY(tf_narrow(*t, last, 0, d, &cols));
  tf_status st = tf_contiguous(cols, &c);
  tf_tensor_release(cols);
  if (st != TF_OK) return st;
  tf_tensor_release(*t);
  *t = c;
  return TF_OK;
}

/* The problem as the backend sees it: leading dims folded into batch. */
static tf_flash_args tf_attn_args(const tf_tensor *q, const tf_tensor *k, int64_t dpad, bool causal, double scale,
                                  bool deterministic) {
  int64_t batch = 1;
  for (int i = 0; i < q->ndim - 2; i++) batch *= q->shape[i];
  return (tf_flash_args){.causal = causal, .deterministic = deterministic, .dtype = q->dtype, .batch = batch,
                         .seq_q = tf_attn_seq(q), .seq_k = tf_attn_seq(k), .head_dim = dpad, .scale = scale};
}

static tf_dtype tf_attn_stat_dtype(tf_dtype d) { return d == TF_F64 ? TF_F64 : TF_F32; }

/* The checks of both flash passes; *ctx is the inputs' device. */
static tf_status tf_attn_flash_inputs(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v, double scale,
                                      tf_device_ctx **ctx) {
  TF_TRY(tf_attn_check_shapes(q, k, v));
  TF_TRY(tf_attn_check_dtypes(q, k, v));
  TF_TRY(tf_attn_check_scale(scale));
  TF_TRY(tf_device_ctx_get(q->device, ctx));
  return tf_attn_check_flash(q, *ctx);
}

tf_status tf_flash_attention(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v, bool causal, double scale,
                             bool deterministic, tf_tensor **o, tf_tensor **lse) {
  tf_device_ctx *ctx;
  TF_TRY(tf_attn_flash_inputs(q, k, v, scale, &ctx));
  int64_t d = tf_attn_head_dim(q), dpad = tf_attn_padded_dim(d);
  tf_shape os = tf_tensor_shape(q), ls = os;
  os.dims[os.ndim - 1] = dpad;
  ls.ndim--;
  tf_temps tt = {0};
  tf_tensor *out = NULL, *l = NULL;
  const tf_tensor *cq, *ck, *cv;
  tf_status st = tf_attn_prepare(&tt, q, q->dtype, dpad, &cq);
  if (st == TF_OK) st = tf_attn_prepare(&tt, k, q->dtype, dpad, &ck);
  if (st == TF_OK) st = tf_attn_prepare(&tt, v, q->dtype, dpad, &cv);
  if (st == TF_OK) st = tf_tensor_empty(&os, q->dtype, q->device, &out);
  if (st == TF_OK) st = tf_tensor_empty(&ls, tf_attn_stat_dtype(q->dtype), q->device, &l);
  tf_flash_args a = tf_attn_args(q, k, dpad, causal, scale, deterministic);
  if (st == TF_OK && a.batch > 0) {
    a.q = tf_tensor_data(cq);
    a.k = tf_tensor_data(ck);
    a.v = tf_tensor_data(cv);
    a.o = tf_tensor_data(out);
    a.lse = tf_tensor_data(l);
    st = ctx->backend->flash_attention(ctx, &a);
  }
  tf_temps_drop(&tt);
  if (st == TF_OK) st = tf_attn_unpad(&out, d);
  if (st != TF_OK) {
    tf_tensor_release(out);
    tf_tensor_release(l);
    return st;
  }
  *o = out;
  *lse = l;
  return TF_OK;
}

/* A saved tensor of the backward pass: o and dout of q's shape, lse of q's
 * shape without its last dim. */
static tf_status tf_attn_check_saved(const char *arg, const tf_tensor *t, const tf_tensor *q, bool rows) {
  tf_shape want = tf_tensor_shape(q);
  if (rows) want.ndim--;
  bool ok = t->ndim == want.ndim && tf_device_eq(t->device, q->device) && tf_dtype_is_float(t->dtype) &&
            !tf_dtype_is_fp8(t->dtype);
  for (int i = 0; ok && i < want.ndim; i++) ok = t->shape[i] == want.dims[i];
  if (ok) return TF_OK;
  char a[128], b[128];
  return tf_fail(TF_ERR_ARG, "%s_backward: %s must be a float tensor of shape %s on q's device, not %s %s",
                 TF_ATTN_OP, arg, tf_shape_format(&want, a, sizeof a), tf_dtype_name(t->dtype),
                 tf_attn_shape(t, b, sizeof b));
}

tf_status tf_flash_attention_backward(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v, const tf_tensor *o,
                                      const tf_tensor *lse, const tf_tensor *dout, bool causal, double scale,
                                      bool deterministic, tf_tensor **dq, tf_tensor **dk, tf_tensor **dv) {
  tf_device_ctx *ctx;
  TF_TRY(tf_attn_flash_inputs(q, k, v, scale, &ctx));
  TF_TRY(tf_attn_check_saved("o", o, q, false));
  TF_TRY(tf_attn_check_saved("lse", lse, q, true));
  TF_TRY(tf_attn_check_saved("dout", dout, q, false));
  tf_dtype dt = q->dtype;
  int64_t d = tf_attn_head_dim(q), dpad = tf_attn_padded_dim(d);
  tf_shape qs = tf_tensor_shape(q), ks = tf_tensor_shape(k);
  qs.dims[qs.ndim - 1] = ks.dims[ks.ndim - 1] = dpad;
  tf_temps tt = {0};
  tf_tensor *g[3] = {NULL, NULL, NULL};
  const tf_tensor *cq, *ck, *cv, *co, *cl, *cd;
  tf_status st = tf_attn_prepare(&tt, q, dt, dpad, &cq);
  if (st == TF_OK) st = tf_attn_prepare(&tt, k, dt, dpad, &ck);
  if (st == TF_OK) st = tf_attn_prepare(&tt, v, dt, dpad, &cv);
  if (st == TF_OK) st = tf_attn_prepare(&tt, o, dt, dpad, &co);
  if (st == TF_OK) st = tf_attn_prepare(&tt, dout, dt, dpad, &cd);
  if (st == TF_OK) st = tf_attn_prepare(&tt, lse, tf_attn_stat_dtype(dt), lse->shape[lse->ndim - 1], &cl);
  if (st == TF_OK) st = tf_tensor_empty(&qs, dt, q->device, &g[0]);
  if (st == TF_OK) st = tf_tensor_empty(&ks, dt, q->device, &g[1]);
  if (st == TF_OK) st = tf_tensor_empty(&ks, dt, q->device, &g[2]);
  tf_flash_args a = tf_attn_args(q, k, dpad, causal, scale, deterministic);
  a.backward = true;
  if (st == TF_OK && a.batch > 0) {
    a.q = tf_tensor_data(cq);
    a.k = tf_tensor_data(ck);
    a.v = tf_tensor_data(cv);
    a.o = tf_tensor_data(co);
    a.lse = tf_tensor_data(cl);
    a.dout = tf_tensor_data(cd);
    a.dq = tf_tensor_data(g[0]);
    a.dk = tf_tensor_data(g[1]);
    a.dv = tf_tensor_data(g[2]);
    /* Scratch from the caching allocator, returned as soon as the pass is
     * queued (work on the device's stream runs in order). */
    size_t bytes = ctx->backend->flash_workspace ? ctx->backend->flash_workspace(ctx, &a) : 0;
    tf_block *ws = NULL;
    if (bytes > 0) st = tf_alloc(&ctx->alloc, bytes, &ws);
    if (st == TF_OK) {
      a.workspace = ws ? ws->ptr : NULL;
      st = ctx->backend->flash_attention(ctx, &a);
    }
    if (ws) tf_alloc_free(&ctx->alloc, ws);
  }
  tf_temps_drop(&tt);
  for (int i = 0; i < 3 && st == TF_OK; i++) st = tf_attn_unpad(&g[i], d);
  if (st != TF_OK) {
    for (int i = 0; i < 3; i++) tf_tensor_release(g[i]);
    return st;
  }
  *dq = g[0];
  *dk = g[1];
  *dv = g[2];
  return TF_OK;
}

/* ---- flash: autograd ----------------------------------------------------------- */

/* Saved: q, k, v, o and lse; never the probabilities. */
static tf_status tf_bw_flash_attention(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *s[5];
  for (int i = 0; i < 5; i++) TF_TRY(tf_node_saved(n, i, &s[i]));
  tf_tensor *d[3] = {NULL, NULL, NULL};
  TF_TRY(tf_flash_attention_backward(s[0], s[1], s[2], s[3], s[4], g, n->param[0] != 0, n->scalar[0],
                                     n->param[1] != 0, &d[0], &d[1], &d[2]));
  for (int i = 0; i < 3; i++) {
    if (tf_node_wants(n, i))
      gin[i] = d[i];
    else
      tf_tensor_release(d[i]);
  }
  return TF_OK;
}

static tf_status tf_attn_flash_ag(tf_tensor *const *c, const tf_attention_opts *opts, double scale, tf_tensor **out,
                                  tf_tensor **lse) {
  tf_tensor *o = NULL, *l = NULL;
  tf_node *node = NULL;
  tf_status st = tf_flash_attention(c[0], c[1], c[2], opts->causal, scale, opts->deterministic, &o, &l);
  if (st == TF_OK) st = tf_node_begin("flash_attention", tf_bw_flash_attention, c, 3, &node);
  if (st == TF_OK && node) {
    node->param[0] = opts->causal;
    node->param[1] = opts->deterministic;
    node->scalar[0] = scale;
    const tf_tensor *saves[5] = {c[0], c[1], c[2], o, l};
    st = tf_node_save_all(node, saves, 5);
  }
  if (st == TF_OK && lse)
    *lse = l;
  else
    tf_tensor_release(l);
  return tf_node_complete(st, node, o, out);
}

/* ---- naive ---------------------------------------------------------------------- */

/* *cur = *next (a step's result, read after the step ran), the previous
 * *cur released: each intermediate lives only until the next exists, as in
 * the PyTorch code this mirrors. */
static tf_status tf_attn_advance(tf_status st, tf_tensor **cur, tf_tensor **next) {
  if (st != TF_OK) return st;
  tf_tensor_release(*cur);
  *cur = *next;
  *next = NULL;
  return TF_OK;
}

/* The bool (seq_q, seq_k) mask of hidden keys: j > i. */
static tf_status tf_attn_causal_hidden(tf_device dev, int64_t seq_q, int64_t seq_k, tf_tensor **out) {
  tf_tensor *i = NULL, *j = NULL, *ic = NULL, *jr = NULL;
  tf_shape col = {2, {seq_q, 1}}, row = {2, {1, seq_k}};
  tf_status st = tf_arange(0, (double)seq_q, 1, TF_I64, dev, &i);
  if (st == TF_OK) st = tf_arange(0, (double)seq_k, 1, TF_I64, dev, &j);
  if (st == TF_OK) st = tf_reshape(i, &col, &ic);
  if (st == TF_OK) st = tf_reshape(j, &row, &jr);
  if (st == TF_OK) st = tf_binary(TF_OP_LT, ic, jr, out);
  tf_tensor_release(i);
  tf_tensor_release(j);
  tf_tensor_release(ic);
  tf_tensor_release(jr);
  return st;
}

/* log(sum(exp(s))) over the last dim, in the statistics dtype, no history. */
static tf_status tf_attn_logsumexp(const tf_tensor *s, tf_tensor **out) {
  tf_tensor *x = NULL, *mk = NULL, *m = NULL, *z = NULL, *e = NULL, *sum = NULL, *logsum = NULL;
  tf_status st = tf_to(s, tf_attn_stat_dtype(s->dtype), s->device, &x);
  if (st == TF_OK) st = tf_reduce(TF_REDUCE_MAX, x, -1, false, true, &mk);
  if (st == TF_OK) st = tf_reduce(TF_REDUCE_MAX, x, -1, false, false, &m);
  if (st == TF_OK) st = tf_binary(TF_OP_SUB, x, mk, &z);
  if (st == TF_OK) st = tf_unary(TF_OP_EXP, z, &e);
  if (st == TF_OK) st = tf_reduce(TF_REDUCE_SUM, e, -1, false, false, &sum);
  if (st == TF_OK) st = tf_unary(TF_OP_LOG, sum, &logsum);
  if (st == TF_OK) st = tf_binary(TF_OP_ADD, logsum, m, out);
  tf_tensor *temps[7] = {x, mk, m, z, e, sum, logsum};
  for (int i = 0; i < 7; i++) tf_tensor_release(temps[i]);
  return st;
}

/* CS336's reference: S = q k^T * scale, hidden keys -inf, P = softmax(S),
 * O = P v, every step a differentiable op (autocast applies to each). */
static tf_status tf_attn_naive(tf_tensor *q, tf_tensor *k, tf_tensor *v, bool causal, double scale, tf_tensor **out,
                               tf_tensor **lse) {
  tf_tensor *kt = NULL, *s = NULL, *next = NULL, *hidden = NULL;
  tf_status st = tf_ag_transpose(k, -2, -1, &kt);
  if (st == TF_OK) st = tf_ag_matmul(q, kt, &s);
  tf_tensor_release(kt);
  if (st == TF_OK) {
    tf_scalar by = {scale, true};
    st = tf_attn_advance(tf_ag_binary_scalar(TF_OP_MUL, s, by, TF_SCALAR_RIGHT, &next), &s, &next);
  }
  if (st == TF_OK && causal) {
    st = tf_attn_causal_hidden(q->device, tf_attn_seq(q), tf_attn_seq(k), &hidden);
    if (st == TF_OK) st = tf_attn_advance(tf_ag_masked_fill(s, hidden, -INFINITY, &next), &s, &next);
    tf_tensor_release(hidden);
  }
  tf_tensor *l = NULL;
  if (st == TF_OK && lse) st = tf_attn_logsumexp(s, &l);
  if (st == TF_OK) st = tf_attn_advance(tf_ag_softmax(s, false, &next), &s, &next);
  if (st == TF_OK) st = tf_ag_matmul(s, v, out);
  tf_tensor_release(s);
  if (st == TF_OK && lse)
    *lse = l;
  else
    tf_tensor_release(l);
  return st;
}

/* ---- tf.attention ---------------------------------------------------------------- */

tf_status tf_ag_attention(tf_tensor *q, tf_tensor *k, tf_tensor *v, const tf_attention_opts *opts, tf_tensor **out,
                          tf_tensor **lse) {
  TF_TRY(tf_attn_check_shapes(q, k, v));
  if (opts->has_scale) TF_TRY(tf_attn_check_scale(opts->scale));
  if (opts->impl == TF_ATTENTION_FLASH && tf_attn_head_dim(q) > TF_FLASH_MAX_HEAD_DIM) {
    tf_device_ctx *ctx;
    TF_TRY(tf_device_ctx_get(q->device, &ctx));
    TF_TRY(tf_attn_check_flash(q, ctx)); /* before any cast: the message names the head dim */
  }
  double scale = opts->has_scale ? opts->scale : 1.0 / sqrt((double)tf_attn_head_dim(q));
  tf_tensor *in[3] = {q, k, v}, *c[3] = {NULL, NULL, NULL};
  tf_status st = TF_OK;
  for (int i = 0; i < 3 && st == TF_OK; i++) st = tf_autocast_input(TF_CAST_LOW, in[i], &c[i]);
  if (st == TF_OK) st = tf_attn_check_dtypes(c[0], c[1], c[2]);
  if (st == TF_OK) {
    if (opts->impl == TF_ATTENTION_NAIVE)
      st = tf_attn_naive(c[0], c[1], c[2], opts->causal, scale, out, lse);
    else
      st = tf_attn_flash_ag(c, opts, scale, out, lse);
  }
  for (int i = 0; i < 3; i++) tf_tensor_release(c[i]);
  return st;
}
