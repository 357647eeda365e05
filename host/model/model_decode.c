/* Generation with a KV cache: a prefill pass over the prompt, then one
 * decode step a token.
 *
 * The cache and the decode step's buffers are one allocation of their own
 * (tf_model_decode), made for a (batch, max_len) and kept while they stay
 * the same: per layer K (after RoPE) and V as (batch, heads, max_len,
 * head_dim) of the compute dtype, RoPE's tables over max_len positions,
 * and for the step one row a sequence of every activation.
 *
 * Prefill runs the prompt through the inference forward's layers
 * (model_forward.c), which store each layer's keys and values on the way
 * (tf_model_prefill_store, by the arguments set here); its logits are lm_head of the last
 * position of each row only. A decode step reads the batch's new ids and
 * their position from device memory (the step buffer, written before
 * each step), so one captured CUDA graph serves every position: the
 * embedding, then per layer ln1, the qkv GEMM (M = batch), kv_append (RoPE
 * at the position, the new key and value into the cache), decode_attention
 * over the pos + 1 cached keys, the output projection, the residual add
 * fused with ln2, w1|w3, SwiGLU, w2 and the add fused with the next norm;
 * lm_head into (batch, V) logits. On backends with graphs the step's first
 * call runs eagerly, the second is captured and later ones replay it
 * (model_graph.c's rules: eager while the profiler's collector records or
 * replay is off). */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"

enum { TF_DECODE_ALIGN = 256, TF_DECODE_BLOCKS = 256, TF_DECODE_MIN_STRETCH = 32 };

struct tf_model_decode {
  int64_t batch, max_len, splits;
  int64_t pos; /* tokens in the cache */
  tf_tensor *storage;
  void *k_cache, *v_cache; /* (L, batch, heads, max_len, head_dim) each */
  float *cos, *sin;        /* (max_len, head_dim / 2) */
  int64_t *step;           /* (batch + 1,): the step's ids, then its position */
  float *x, *rstd, *partial;
  unsigned *done;          /* (batch, heads): decode attention's counters (tf_decode_attention_args.done), zero */
  void *h, *qkv, *q, *atty, *proj, *ab, *gate, *logits;
  bool tf32;               /* what the captured step was captured with */
  bool chained;            /* the step's launches chained (tf_gemm_args.chained); set by tf_decode_body */
  tf_model_graph graph;
  /* host staging, made with the cache (nothing is allocated a token) */
  int64_t *host_step;   /* batch + 1 */
  uint16_t *host_logits; /* batch x vocab, a low-precision model's logits as copied */
};

static size_t tf_decode_round(size_t b) { return (b + TF_DECODE_ALIGN - 1) / TF_DECODE_ALIGN * TF_DECODE_ALIGN; }

/* The next aligned range of bytes (base NULL: only measures). */
static void *tf_decode_carve(char *base, size_t *at, size_t bytes) {
  size_t off = tf_decode_round(*at);
  *at = off + bytes;
  return base ? base + off : NULL;
}

/* Every buffer of d (batch and max_len set) at base, or only the size. */
static size_t tf_decode_layout(const tf_model *m, tf_model_decode *d, char *base) {
  const tf_model_config *c = &m->cfg;
  const size_t es = tf_dtype_size(m->dtype), B = (size_t)d->batch, dm = (size_t)c->d_model, f = (size_t)c->d_ff;
  const size_t H = (size_t)c->num_heads, hd = dm / H, cache = (size_t)c->num_layers * B * dm * (size_t)d->max_len;
  size_t at = 0;
  d->k_cache = tf_decode_carve(base, &at, cache * es);
  d->v_cache = tf_decode_carve(base, &at, cache * es);
  d->cos = tf_decode_carve(base, &at, (size_t)d->max_len * hd / 2 * sizeof(float));
  d->sin = tf_decode_carve(base, &at, (size_t)d->max_len * hd / 2 * sizeof(float));
  d->step = tf_decode_carve(base, &at, (B + 1) * sizeof(int64_t));
  d->x = tf_decode_carve(base, &at, B * dm * sizeof(float));
  d->rstd = tf_decode_carve(base, &at, B * sizeof(float));
  d->partial = tf_decode_carve(base, &at, B * H * (size_t)d->splits * (hd + 2) * sizeof(float));
  d->done = tf_decode_carve(base, &at, B * H * sizeof(unsigned));
  d->h = tf_decode_carve(base, &at, B * dm * es);
  d->qkv = tf_decode_carve(base, &at, B * 3 * dm * es);
  d->q = tf_decode_carve(base, &at, B * dm * es);
  d->atty = tf_decode_carve(base, &at, B * dm * es);
  d->proj = tf_decode_carve(base, &at, B * dm * es);
  d->ab = tf_decode_carve(base, &at, B * 2 * f * es);
  d->gate = tf_decode_carve(base, &at, B * f * es);
  d->logits = tf_decode_carve(base, &at, B * (size_t)c->vocab_size * es);
  return at;
}

/* Everything d holds, and d (parts not made yet are NULL). */
static void tf_decode_free(tf_model *m, tf_model_decode *d) {
  if (d->graph.exec) m->k->graph_destroy(m->ctx, d->graph.exec);
  tf_tensor_release(d->storage);
  free(d->host_step);
  free(d->host_logits);
  free(d);
}

void tf_model_decode_release(tf_model *m) {
  if (!m->decode) return;
  tf_decode_free(m, m->decode);
  m->decode = NULL;
}

/* Stretches of the keys for decode_attention: enough blocks to fill a GPU
 * at small batches, none shorter than TF_DECODE_MIN_STRETCH keys. */
static int64_t tf_decode_splits(const tf_model *m, int64_t batch, int64_t max_len) {
  const int64_t rows = batch * m->cfg.num_heads;
  int64_t s = (TF_DECODE_BLOCKS + rows - 1) / rows, most = (max_len + TF_DECODE_MIN_STRETCH - 1) / TF_DECODE_MIN_STRETCH;
  if (s > most) s = most;
  return s < 1 ? 1 : s;
}

/* The cache for (batch, at least max_len): kept when it fits (with its
 * captured step), else made anew (the old one freed first), its RoPE
 * tables filled. */
static tf_status tf_decode_ensure(tf_model *m, int64_t batch, int64_t max_len) {
  if (m->decode && m->decode->batch == batch && m->decode->max_len >= max_len) return TF_OK;
  tf_model_decode_release(m);
  tf_model_decode *d = calloc(1, sizeof *d);
  if (!d) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the KV cache");
  d->batch = batch;
  d->max_len = max_len;
  d->splits = tf_decode_splits(m, batch, max_len);
  d->host_step = malloc((size_t)(batch + 1) * sizeof *d->host_step);
  d->host_logits = m->dtype == TF_F32 ? NULL : malloc((size_t)(batch * m->cfg.vocab_size) * sizeof *d->host_logits);
  if (!d->host_step || (m->dtype != TF_F32 && !d->host_logits)) {
    tf_decode_free(m, d);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the decode step's staging");
  }
  const size_t bytes = tf_decode_layout(m, d, NULL);
  tf_status st = tf_model_alloc(m, (int64_t)bytes, TF_BOOL, TF_TAG_ACTIVATION, "model KV cache", &d->storage);
  if (st != TF_OK) {
    tf_decode_free(m, d);
    return st;
  }
  tf_decode_layout(m, d, tf_tensor_data(d->storage));
  m->decode = d;
  m->decode_release = tf_model_decode_release;
  st = tf_model_rope_tables(m, max_len, d->cos, d->sin);
  const size_t counters = (size_t)(batch * m->cfg.num_heads) * sizeof(unsigned);
  unsigned *zeros = st == TF_OK ? calloc(1, counters) : NULL;
  if (st == TF_OK && !zeros) st = tf_fail(TF_ERR_OOM, "out of memory: no host memory for the decode step's counters");
  if (st == TF_OK) st = m->ctx->backend->copy(m->ctx, d->done, zeros, counters, TF_COPY_H2D);
  free(zeros);
  if (st != TF_OK) tf_model_decode_release(m);
  return st;
}

/* Writes the step buffer: ids (batch values, or none) and the position,
 * in one copy. */
static tf_status tf_decode_set_step(tf_model *m, const int64_t *ids, int64_t pos) {
  tf_model_decode *d = m->decode;
  const tf_backend *be = m->ctx->backend;
  if (!ids) return be->copy(m->ctx, d->step + d->batch, &pos, sizeof pos, TF_COPY_H2D);
  int64_t *step = d->host_step;
  memcpy(step, ids, (size_t)d->batch * sizeof *step);
  step[d->batch] = pos;
  return be->copy(m->ctx, d->step, step, (size_t)(d->batch + 1) * sizeof *step, TF_COPY_H2D);
}

static void *tf_decode_layer_cache(const tf_model *m, void *cache, int64_t l) {
  const tf_model_decode *d = m->decode;
  return tf_model_at(m, cache, l * d->batch * m->cfg.d_model * d->max_len);
}

/* The append of the step's token of layer l from its fused projection qkv
 * into the cache at the step's position, the turned queries into q. */
static tf_kv_append_args tf_decode_append_args(const tf_model *m, int64_t l, const void *qkv, void *q) {
  const tf_model_decode *d = m->decode;
  const int64_t H = m->cfg.num_heads;
  return (tf_kv_append_args){.batch = d->batch, .seq = 1, .heads = H, .head_dim = m->cfg.d_model / H,
                             .max_len = d->max_len, .dtype = m->dtype, .cos = d->cos, .sin = d->sin,
                             .pos = d->step + d->batch, .qkv = qkv, .q = q,
                             .k_cache = tf_decode_layer_cache(m, d->k_cache, l),
                             .v_cache = tf_decode_layer_cache(m, d->v_cache, l), .chained = d->chained};
}

/* RMSNorm of the step's batch rows (model_forward.c's tf_model_norm over the plan's). */
static tf_status tf_decode_norm(tf_model *m, const void *delta, int64_t gain, void *h) {
  tf_model_decode *d = m->decode;
  tf_rmsnorm_args a = {.rows = d->batch, .dim = m->cfg.d_model, .eps = TF_MODEL_NORM_EPS, .dtype = m->dtype,
                       .x = d->x, .delta = delta, .x_out = delta ? d->x : NULL, .g = tf_model_pw(m, gain), .h = h,
                       .rstd = d->rstd, .chained = d->chained};
  return m->k->rmsnorm(m->ctx, &a);
}

/* y (batch, out) = x W^T for the step's rows: tf_model_linear, marked as
 * a product of few rows (the backend's bandwidth-bound kernel where it has
 * one and the batch is small). */
static tf_status tf_decode_linear_then(tf_model *m, const void *x, int64_t in, int64_t out, const void *w, void *y,
                                       const tf_swiglu_args *sw, const tf_kv_append_args *kv) {
  const int64_t rows = m->decode->batch;
  tf_gemm_args g = {.a = x, .b = w, .c = y, .ab_dtype = m->dtype, .c_dtype = m->dtype, .batch = 1, .m = rows,
                    .n = out, .k = in, .trans_b = true, .lda = in, .ldb = in, .ldc = out,
                    .allow_tf32 = m->ctx->allow_tf32, .few_rows = rows <= TF_GEMM_FEW_ROWS,
                    .chained = m->decode->chained, .then_swiglu = sw, .then_append = kv};
  return m->k->gemm(m->ctx, &g);
}

static tf_status tf_decode_linear(tf_model *m, const void *x, int64_t in, int64_t out, const void *w, void *y) {
  return tf_decode_linear_then(m, x, in, out, w, y, NULL, NULL);
}

/* Layer l of the decode step: the residual stream d->x, ln1's output in d->h. */
static tf_status tf_decode_layer(tf_model *m, int64_t l) {
  tf_model_decode *d = m->decode;
  const tf_model_config *c = &m->cfg;
  const int64_t B = d->batch, dm = c->d_model, f = c->d_ff, H = c->num_heads, hd = dm / H;
  const tf_model_layer_weights *w = &m->layers[l];
  /* the products followed by the cache's append and by SwiGLU's gate, which the backend may do in one kernel */
  const tf_kv_append_args kv = tf_decode_append_args(m, l, d->qkv, d->q);
  TF_TRY(tf_decode_linear_then(m, d->h, dm, 3 * dm, tf_model_mw(m, w->qkv), d->qkv, NULL, &kv));
  tf_decode_attention_args at = {.batch = B, .heads = H, .head_dim = hd, .max_len = d->max_len, .splits = d->splits,
                                 .scale = 1.0 / sqrt((double)hd), .dtype = m->dtype, .pos = d->step + B, .q = d->q,
                                 .k_cache = tf_decode_layer_cache(m, d->k_cache, l),
                                 .v_cache = tf_decode_layer_cache(m, d->v_cache, l), .out = d->atty,
                                 .partial = d->partial, .chained = d->chained, .done = d->done};
  TF_RANGED("decode attention", m->k->decode_attention(m->ctx, &at));
  TF_TRY(tf_decode_linear(m, d->atty, dm, dm, tf_model_mw(m, w->out), d->proj));
  TF_TRY(tf_decode_norm(m, d->proj, w->ln2, d->h));
  const tf_swiglu_args sw = {.rows = B, .f = f, .dtype = m->dtype, .ab = d->ab, .y = d->gate, .chained = d->chained};
  TF_TRY(tf_decode_linear_then(m, d->h, dm, 2 * f, tf_model_mw(m, w->w13), d->ab, &sw, NULL));
  TF_TRY(tf_decode_linear(m, d->gate, f, dm, tf_model_mw(m, w->w2), d->proj));
  const int64_t next = l + 1 < c->num_layers ? m->layers[l + 1].ln1 : m->lnf;
  return tf_decode_norm(m, d->proj, next, d->h);
}

/* The decode step's kernels over its buffers, the step buffer's ids to
 * its logits: a phase body (model_internal.h), captured as one graph. */
static tf_status tf_decode_body(tf_model *m, bool keep) {
  (void)keep;
  tf_model_decode *d = m->decode;
  /* Chained launches (model_kernels.h) unless TF_DECODE_CHAIN=0, and never
   * while the profiler collects GPU work: chained kernels start early and
   * wait inside, so their times would overlap and hold the waits. */
  static int off = -1;
  if (off < 0) off = getenv("TF_DECODE_CHAIN") && strcmp(getenv("TF_DECODE_CHAIN"), "0") == 0;
  d->chained = !off && !tf_prof_collecting_gpu();
  const tf_model_config *c = &m->cfg;
  tf_encoder_args enc = {.n = d->batch, .dim = c->d_model, .vocab = c->vocab_size, .ids = d->step,
                         .wte = tf_model_pw(m, m->wte), .out = d->x};
  TF_TRY(m->k->encoder(m->ctx, &enc));
  TF_TRY(tf_decode_norm(m, NULL, m->layers[0].ln1, d->h));
  for (int64_t l = 0; l < c->num_layers; l++) TF_TRY(tf_decode_layer(m, l));
  return tf_decode_linear(m, d->h, c->d_model, c->vocab_size, tf_model_mw(m, m->lm_head), d->logits);
}

/* A new (batch, V) tensor of the compute dtype holding the step's logits. */
static tf_status tf_decode_logits_out(tf_model *m, tf_tensor **out) {
  tf_model_decode *d = m->decode;
  tf_shape s = {2, {d->batch, m->cfg.vocab_size}};
  tf_tensor *t = NULL;
  TF_TRY(tf_tensor_empty(&s, m->dtype, m->device, &t));
  tf_status st = m->ctx->backend->copy(m->ctx, tf_tensor_data(t), d->logits,
                                       (size_t)(d->batch * m->cfg.vocab_size) * tf_dtype_size(m->dtype), TF_COPY_D2D);
  if (st != TF_OK) {
    tf_tensor_release(t);
    return st;
  }
  *out = t;
  return TF_OK;
}

tf_status tf_model_prefill(tf_model *m, const tf_tensor *ids, int64_t max_len, tf_tensor **logits) {
  if (!m->k->kv_append || !m->k->decode_attention)
    return tf_fail(TF_ERR_BACKEND, "model prefill: the %s backend has no decode kernels", m->ctx->backend->name);
  if (ids->ndim != 2)
    return tf_fail(TF_ERR_ARG, "model prefill: ids must be 2-D (batch, seq), not %d-D", ids->ndim);
  const int64_t B = ids->shape[0], T = ids->shape[1];
  if (max_len < T || max_len > m->cfg.context_length)
    return tf_fail(TF_ERR_ARG, "model prefill: the cache length %lld must be within [%lld, %lld] (the prompt's "
                   "length and the context length)", (long long)max_len, (long long)T,
                   (long long)m->cfg.context_length);
  if (B < 1) return tf_fail(TF_ERR_ARG, "model prefill: ids must not be empty");
  TF_TRY(tf_decode_ensure(m, B, max_len));
  tf_model_decode *d = m->decode;
  d->pos = 0;
  TF_TRY(tf_decode_set_step(m, NULL, 0));
  const int64_t H = m->cfg.num_heads;
  m->prefill_kv = (tf_kv_append_args){.batch = B, .heads = H, .head_dim = m->cfg.d_model / H, .max_len = max_len,
                                      .dtype = m->dtype, .cos = d->cos, .sin = d->sin, .pos = d->step + B};
  m->prefill_k0 = d->k_cache;
  m->prefill_v0 = d->v_cache;
  m->prefill_layer_elems = B * m->cfg.d_model * max_len;
  m->prefilling = true;
  tf_status st = tf_model_prefill_layers(m, ids);
  m->prefilling = false;
  TF_TRY(st);
  /* lm_head of each row's last position: rows T - 1, 2T - 1, ... of hf */
  const int64_t dm = m->cfg.d_model, V = m->cfg.vocab_size;
  tf_gemm_args g = {.a = tf_model_at(m, m->plan.hf, (T - 1) * dm), .b = tf_model_mw(m, m->lm_head),
                    .c = d->logits, .ab_dtype = m->dtype, .c_dtype = m->dtype, .batch = 1, .m = B, .n = V,
                    .k = dm, .trans_b = true, .lda = T * dm, .ldb = dm, .ldc = V,
                    .allow_tf32 = m->ctx->allow_tf32};
  TF_RANGED("lm_head", m->k->gemm(m->ctx, &g));
  d->pos = T;
  return logits ? tf_decode_logits_out(m, logits) : TF_OK;
}

/* The step as a graph where it can be (the first call eager, the second
 * captured, later ones replayed), else eagerly. */
static tf_status tf_decode_run(tf_model *m) {
  tf_model_decode *d = m->decode;
  if (!m->graphs) return tf_decode_body(m, false);
  if (d->graph.exec && d->tf32 != m->ctx->allow_tf32) {
    m->k->graph_destroy(m->ctx, d->graph.exec);
    d->graph = (tf_model_graph){0};
  }
  d->graph.key.batch = d->batch;
  d->graph.key.seq = d->max_len;
  d->tf32 = m->ctx->allow_tf32;
  return tf_model_run_graph(m, &d->graph, "decode step graph", false, tf_decode_body);
}

tf_status tf_model_decode_step(tf_model *m, const int64_t *ids, tf_tensor **logits) {
  tf_model_decode *d = m->decode;
  if (!d || d->pos == 0) return tf_fail(TF_ERR_STATE, "model decode: no prompt was prefilled");
  if (d->pos >= d->max_len)
    return tf_fail(TF_ERR_ARG, "model decode: the cache of %lld positions is full", (long long)d->max_len);
  for (int64_t b = 0; b < d->batch; b++)
    if (ids[b] < 0 || ids[b] >= m->cfg.vocab_size)
      return tf_fail(TF_ERR_ARG, "model decode: token id %lld of row %lld is out of range [0, %lld) (the vocabulary "
                     "size)", (long long)ids[b], (long long)b, (long long)m->cfg.vocab_size);
  TF_TRY(tf_model_sync_weights(m)); /* eager: a conversion must never be baked into a graph */
  TF_TRY(tf_decode_set_step(m, ids, d->pos));
  TF_RANGED("decode step", tf_decode_run(m));
  d->pos++;
  return logits ? tf_decode_logits_out(m, logits) : TF_OK;
}

int64_t tf_model_decode_position(const tf_model *m) { return m->decode ? m->decode->pos : 0; }
int64_t tf_model_decode_batch(const tf_model *m) { return m->decode ? m->decode->batch : 0; }

tf_status tf_model_decode_logits_host(tf_model *m, float *out) {
  tf_model_decode *d = m->decode;
  if (!d) return tf_fail(TF_ERR_STATE, "model decode: no prompt was prefilled");
  const int64_t n = d->batch * m->cfg.vocab_size;
  if (m->dtype == TF_F32)
    return m->ctx->backend->copy(m->ctx, out, d->logits, (size_t)n * sizeof *out, TF_COPY_D2H);
  uint16_t *raw = d->host_logits;
  tf_status st = m->ctx->backend->copy(m->ctx, raw, d->logits, (size_t)n * sizeof *raw, TF_COPY_D2H);
  for (int64_t i = 0; st == TF_OK && i < n; i++)
    out[i] = m->dtype == TF_BF16 ? tf_bf16_to_f32(raw[i]) : tf_f16_to_f32(raw[i]);
  return st;
}

size_t tf_model_decode_bytes(const tf_model *m) { return m->decode ? tf_tensor_nbytes(m->decode->storage) : 0; }
