/* Activation memory: one allocation per (batch, seq), carved into the named
 * buffers of model_internal.h's tf_model_plan, made once and reused while
 * the shape stays the same.
 *
 * A training plan keeps per layer what the backward pass reads and would
 * be costly to recompute (2L + 1 f32 residual streams; each layer's norm
 * statistics, q, k, v after RoPE, the heads-merged attention output and the
 * w1/w3 outputs) plus the backward pass's scratch. The norm outputs, the
 * attention probabilities P and the SwiGLU gate are recomputed there, exactly
 * (the same kernels on the same inputs), so each has one buffer for all
 * layers: the plan is about half of what keeping them would take. An inference plan
 * holds one layer's buffers that every layer reuses and a residual stream
 * updated in place: nothing is kept. */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { TF_PLAN_ALIGN = 256 };

/* Hands out aligned ranges of the allocation; a first pass without a base
 * only measures. */
typedef struct tf_carver {
  char *base;
  size_t at;
} tf_carver;

/* The next aligned range of the given size (NULL while measuring). */
static void *tf_carve(tf_carver *c, size_t bytes) {
  size_t off = (c->at + TF_PLAN_ALIGN - 1) / TF_PLAN_ALIGN * TF_PLAN_ALIGN;
  c->at = off + bytes;
  return c->base ? c->base + off : NULL;
}

/* Every buffer of the plan p (whose batch, seq and mode are set). */
static void tf_model_plan_carve(const tf_model *m, tf_model_plan *p, tf_carver *c) {
  const tf_model_config *cfg = &m->cfg;
  const size_t n = (size_t)(p->batch * p->seq), d = (size_t)cfg->d_model, f = (size_t)cfg->d_ff;
  const size_t H = (size_t)cfg->num_heads, hd = d / H, T = (size_t)p->seq, V = (size_t)cfg->vocab_size;
  const size_t es = tf_dtype_size(m->dtype), fs = sizeof(float), act = n * d * es;
  const size_t probs = (size_t)p->batch * H * T * T * es;
  const int64_t L = cfg->num_layers;
  p->ids = tf_carve(c, 2 * n * sizeof(int64_t)); /* ids, then targets: one range check covers both */
  p->targets = p->ids ? p->ids + n : NULL;
  p->rope_cos = tf_carve(c, T * (hd / 2) * fs);
  p->rope_sin = tf_carve(c, T * (hd / 2) * fs);
  const int64_t nresid = p->training ? 2 * L + 1 : 1, nlayers = p->training ? L : 1;
  for (int64_t i = 0; i < nresid; i++) p->resid[i] = tf_carve(c, n * d * fs);
  /* recomputed in the backward pass: one buffer each, shared by the layers */
  void *h1 = tf_carve(c, act), *h2 = tf_carve(c, act), *probs_buf = tf_carve(c, probs);
  void *gate = tf_carve(c, n * f * es);
  for (int64_t l = 0; l < nlayers; l++) {
    tf_model_layer_acts *a = &p->layers[l];
    a->h1 = h1;
    a->rstd1 = tf_carve(c, n * fs);
    a->q = tf_carve(c, act);
    a->k = tf_carve(c, act);
    a->v = tf_carve(c, act);
    a->p = probs_buf;
    a->atty = tf_carve(c, act);
    a->h2 = h2;
    a->rstd2 = tf_carve(c, n * fs);
    a->ab = tf_carve(c, 2 * n * f * es);
    a->gate = gate;
  }
  p->hf = tf_carve(c, act);
  p->rstdf = tf_carve(c, n * fs);
  p->qkv = tf_carve(c, 3 * act);
  p->heads = tf_carve(c, act);
  p->proj = tf_carve(c, act);
  if (!p->training) return;
  p->logits = tf_carve(c, n * V * es);
  p->row_loss = tf_carve(c, n * fs);
  p->dres = tf_carve(c, n * d * fs);
  p->dres_low = m->dtype == TF_F32 ? (void *)p->dres : tf_carve(c, act);
  p->dqkv_heads = tf_carve(c, 3 * act);
  p->dp = tf_carve(c, probs);
  p->dab = tf_carve(c, 2 * n * f * es);
  p->dgate = tf_carve(c, n * f * es);
}

/* cos and sin of t * theta^(-2i / hd), in double as nnops' rope takes them
 * (the same angles on every backend), rounded to f32, copied to the device. */
static tf_status tf_model_plan_rope(tf_model *m) {
  const int64_t T = m->plan.seq, half = m->cfg.d_model / m->cfg.num_heads / 2, n = T * half;
  float *tab = malloc((size_t)n * 2 * sizeof *tab);
  if (!tab) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the RoPE table");
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      double inv_freq = pow(m->cfg.rope_theta, -(double)(2 * i) / (double)(2 * half));
      double angle = (double)t * inv_freq;
      tab[t * half + i] = (float)cos(angle);
      tab[n + t * half + i] = (float)sin(angle);
    }
  const tf_backend *be = m->ctx->backend;
  tf_status st = be->copy(m->ctx, m->plan.rope_cos, tab, (size_t)n * sizeof *tab, TF_COPY_H2D);
  if (st == TF_OK) st = be->copy(m->ctx, m->plan.rope_sin, tab + n, (size_t)n * sizeof *tab, TF_COPY_H2D);
  free(tab);
  return st;
}

/* Drops the allocation: what it held (and any pending loss) is gone. */
void tf_model_plan_release(tf_model *m) {
  tf_model_plan *p = &m->plan;
  tf_tensor_release(p->storage);
  free(p->resid);
  free(p->layers);
  memset(p, 0, sizeof *p);
  m->loss_ready = false;
}

/* Measures, allocates once, carves, and fills the RoPE table. */
static tf_status tf_model_plan_make(tf_model *m, int64_t batch, int64_t seq, bool training) {
  tf_model_plan *p = &m->plan;
  p->batch = batch;
  p->seq = seq;
  p->training = training;
  const int64_t L = m->cfg.num_layers;
  p->resid = calloc((size_t)(training ? 2 * L + 1 : 1), sizeof *p->resid);
  p->layers = calloc((size_t)(training ? L : 1), sizeof *p->layers);
  if (!p->resid || !p->layers) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the activation plan");
  tf_carver measure = {NULL, 0};
  tf_model_plan_carve(m, p, &measure);
  p->bytes = measure.at;
  tf_shape s = {1, {(int64_t)p->bytes}};
  TF_TRY(tf_tensor_empty(&s, TF_BOOL, m->device, &p->storage));
  tf_carver carve = {tf_tensor_data(p->storage), 0};
  tf_model_plan_carve(m, p, &carve);
  return tf_model_plan_rope(m);
}

/* Re-plans only on a new shape, or when training needs what an inference plan lacks. */
tf_status tf_model_plan_ensure(tf_model *m, int64_t batch, int64_t seq, bool training) {
  tf_model_plan *p = &m->plan;
  if (p->storage && p->batch == batch && p->seq == seq && (p->training || !training)) return TF_OK;
  tf_model_plan_release(m); /* before the new one: the old memory is reusable */
  tf_status st = tf_model_plan_make(m, batch, seq, training);
  if (st != TF_OK) tf_model_plan_release(m);
  return st;
}

/* Views are byte-addressed into the BOOL storage, then retyped: the plan's
 * ranges are 256-byte aligned, so every offset is whole in any dtype. */
tf_status tf_model_plan_view(const tf_model *m, void *ptr, tf_dtype dtype, const tf_shape *shape, tf_tensor **out) {
  const tf_tensor *base = m->plan.storage;
  size_t es = tf_dtype_size(dtype);
  int64_t bytes = (char *)ptr - (char *)tf_tensor_data(base);
  int64_t strides[TF_MAX_DIMS];
  tf_contiguous_strides(shape, strides);
  TF_TRY(tf_tensor_view(base, shape, strides, 0, out));
  (*out)->dtype = dtype;
  (*out)->offset = (base->offset + bytes) / (int64_t)es;
  return TF_OK;
}
