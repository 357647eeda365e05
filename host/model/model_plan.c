/* Activation memory: one allocation per (batch, seq), carved into the named
 * buffers of model_internal.h's tf_model_plan, made once and reused while
 * the shape stays the same.
 *
 * A training plan keeps per layer what the backward pass reads and would
 * be costly to recompute (the f32 residual stream x_l before each layer;
 * each layer's norm statistics, q, k, v after RoPE, the heads-merged
 * attention output, the output projection's result and the w1/w3 outputs)
 * plus the backward pass's scratch. What is recomputed there exactly (the
 * same kernels on the same inputs) has one buffer for all layers: the norm
 * outputs (h1 and h2 share it: each is read before the other is written),
 * the attention probabilities P, the SwiGLU gate, and the residual stream
 * after attention, x_l + output_proj(attention), which the fused add and
 * norm rebuilds from x_l and the kept projection (in a low-precision model
 * that projection takes half the bytes of the f32 stream it stands for; an
 * f32 model keeps the stream itself, 2L + 1 buffers). With
 * recompute_residual the projection is not kept either: the backward pass
 * runs the output projection's GEMM again. Scratch that the backward pass
 * uses at different times shares one range: the gate and its gradient
 * (dead once SwiGLU's backward has read it) with the attention backward's
 * heads-layout buffers and workspace. An inference plan holds one layer's
 * buffers that every layer reuses and a residual stream updated in place:
 * nothing is kept. */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rope.h"

enum { TF_PLAN_ALIGN = 256 };

/* Bytes rounded up to the plan's alignment (ranges carved inside one range). */
static size_t tf_plan_round(size_t bytes) { return (bytes + TF_PLAN_ALIGN - 1) / TF_PLAN_ALIGN * TF_PLAN_ALIGN; }

/* Hands out aligned ranges of the allocation; a first pass without a base
 * only measures. The second also names each range (for memory snapshots). */
typedef struct tf_carver {
  char *base;
  size_t at;
  tf_mem_region *regions; /* room for one per range, or NULL */
  char (*names)[64];
  int n;
} tf_carver;

/* The next aligned range of the given size (NULL while measuring), named
 * name (printf-style, with the layer index) and tagged. */
static void *tf_carve(tf_carver *c, size_t bytes, int tag, const char *name, int64_t layer) {
  size_t off = tf_plan_round(c->at);
  c->at = off + bytes;
  if (c->regions) {
    snprintf(c->names[c->n], sizeof c->names[c->n], name, (long long)layer);
    c->regions[c->n] = (tf_mem_region){c->names[c->n], tag, off, bytes};
  }
  c->n++;
  return c->base ? c->base + off : NULL;
}

enum { TF_ACT = TF_TAG_ACTIVATION, TF_WS = TF_TAG_WORKSPACE };

/* The scratch of the backward kernels that need some (the embedding's
 * sort, the norm gains' partial sums): they run one at a time, so one
 * buffer of the larger size serves both. Planned, a step allocates nothing
 * and can be captured into a CUDA graph. */
static size_t tf_model_backward_workspace(const tf_model *m, const tf_model_plan *p) {
  const int64_t n = p->batch * p->seq;
  tf_encoder_args enc = {.backward = true, .n = n, .dim = m->cfg.d_model, .vocab = m->cfg.vocab_size};
  tf_rmsnorm_args norm = {.backward = true, .rows = n, .dim = m->cfg.d_model, .dtype = m->dtype};
  size_t a = m->k->encoder_workspace ? m->k->encoder_workspace(m->ctx, &enc) : 0;
  size_t b = m->k->rmsnorm_workspace ? m->k->rmsnorm_workspace(m->ctx, &norm) : 0;
  return a > b ? a : b;
}

/* Every buffer of the plan p (whose batch, seq and mode are set). */
static void tf_model_plan_carve(const tf_model *m, tf_model_plan *p, tf_carver *c) {
  const tf_model_config *cfg = &m->cfg;
  const size_t n = (size_t)(p->batch * p->seq), d = (size_t)cfg->d_model, f = (size_t)cfg->d_ff;
  const size_t H = (size_t)cfg->num_heads, hd = d / H, T = (size_t)p->seq, V = (size_t)cfg->vocab_size;
  const size_t es = tf_dtype_size(m->dtype), fs = sizeof(float), act = n * d * es;
  const size_t probs = (size_t)p->batch * H * T * T * es;
  const int64_t L = cfg->num_layers;
  p->ids = tf_carve(c, 2 * n * sizeof(int64_t), TF_WS, "ids and targets", 0); /* ids, then targets: one range check covers both */
  p->targets = p->ids ? p->ids + n : NULL;
  p->rope_cos = tf_carve(c, T * (hd / 2) * fs, TF_WS, "rope cos", 0);
  p->rope_sin = tf_carve(c, T * (hd / 2) * fs, TF_WS, "rope sin", 0);
  const int64_t nresid = p->training ? 2 * L + 1 : 1, nlayers = p->training ? L : 1;
  /* the stream after attention: kept per layer, or rebuilt in one shared buffer */
  const bool shared_mid = p->training && (m->recompute_residual || tf_model_keeps_projection(m));
  float *mid = shared_mid ? tf_carve(c, n * d * fs, TF_WS, "residual mid (shared)", 0) : NULL;
  for (int64_t i = 0; i < nresid; i++)
    p->resid[i] = shared_mid && i % 2 == 1 ? mid : tf_carve(c, n * d * fs, TF_ACT, "residual.%lld", i);
  /* recomputed in the backward pass: one buffer each, shared by the layers */
  void *hn = tf_carve(c, act, TF_WS, "norm out (shared)", 0);
  void *probs_buf = m->flash ? NULL : tf_carve(c, probs, TF_WS, "attention probs (shared)", 0);
  /* the gate (and in training its gradient, then the attention backward's
   * scratch: dq|dk|dv in heads layout, and with flash attention the output
   * in heads layout and the kernel's workspace) */
  size_t flash_ws = 0, attn_ws = 0;
  if (p->training) {
    attn_ws = 3 * act;
    if (m->flash) {
      tf_flash_args fa = tf_model_flash_args(m, p->batch, p->seq);
      fa.backward = true;
      flash_ws = m->ctx->backend->flash_workspace ? m->ctx->backend->flash_workspace(m->ctx, &fa) : 0;
      attn_ws = tf_plan_round(3 * act) + flash_ws;
    }
  }
  const size_t gate_bytes = n * f * es;
  char *gate = tf_carve(c, gate_bytes > attn_ws ? gate_bytes : attn_ws, TF_WS,
                        p->training ? "swiglu gate, its gradient, attention backward scratch (shared)"
                                    : "swiglu gate (shared)", 0);
  for (int64_t l = 0; l < nlayers; l++) {
    tf_model_layer_acts *a = &p->layers[l];
    a->h1 = hn;
    a->rstd1 = tf_carve(c, n * fs, TF_ACT, "layers.%lld.rstd1", l);
    a->q = tf_carve(c, act, TF_ACT, "layers.%lld.q", l);
    a->k = tf_carve(c, act, TF_ACT, "layers.%lld.k", l);
    a->v = tf_carve(c, act, TF_ACT, "layers.%lld.v", l);
    a->p = probs_buf;
    a->lse = m->flash ? tf_carve(c, (size_t)p->batch * H * T * fs, TF_ACT, "layers.%lld.lse", l) : NULL;
    a->atty = tf_carve(c, act, TF_ACT, "layers.%lld.attn_out", l);
    a->proj = p->training && tf_model_keeps_projection(m) && !m->recompute_residual
                  ? tf_carve(c, act, TF_ACT, "layers.%lld.attn_proj_out", l)
                  : NULL;
    a->h2 = hn;
    a->rstd2 = tf_carve(c, n * fs, TF_ACT, "layers.%lld.rstd2", l);
    a->ab = tf_carve(c, 2 * n * f * es, TF_ACT, "layers.%lld.w1_w3_out", l);
    a->gate = gate;
  }
  p->hf = tf_carve(c, act, TF_ACT, "final norm out", 0);
  p->rstdf = tf_carve(c, n * fs, TF_ACT, "final norm rstd", 0);
  p->qkv = tf_carve(c, 3 * act, TF_WS, "qkv scratch", 0);
  p->heads = m->flash ? NULL : tf_carve(c, act, TF_WS, "heads scratch", 0); /* the naive path's P V and dO */
  p->proj = tf_carve(c, act, TF_WS, "projection scratch", 0);
  if (m->fp8) { /* the 8-bit operands of one product: the widest is w1|w3's gradient or qkv's */
    const size_t widest = n * (3 * d > 2 * f ? 3 * d : 2 * f);
    p->fp8_x = tf_carve(c, widest, TF_WS, "fp8 input", 0);
    if (p->training) {
      p->fp8_xt = tf_carve(c, widest, TF_WS, "fp8 input (transposed)", 0);
      p->fp8_dy = tf_carve(c, widest, TF_WS, "fp8 gradient", 0);
      p->fp8_dyt = tf_carve(c, widest, TF_WS, "fp8 gradient (transposed)", 0);
    }
  }
  if (!p->training) return;
  p->logits = tf_carve(c, n * V * es, TF_ACT, "logits", 0);
  p->row_loss = tf_carve(c, n * fs, TF_ACT, "row losses", 0);
  p->loss = tf_carve(c, fs, TF_ACT, "loss", 0);
  p->dres = tf_carve(c, n * d * fs, TF_WS, "d residual", 0);
  p->dres_low = m->dtype == TF_F32 ? (void *)p->dres : tf_carve(c, act, TF_WS, "d residual (low)", 0);
  /* in the gate's range: SwiGLU's backward reads the gate's gradient before
   * the attention backward writes any of these */
  p->dgate = gate;
  p->dqkv_heads = gate;
  if (m->flash) {
    p->flash_ws = gate && flash_ws ? gate + tf_plan_round(3 * act) : NULL;
  } else {
    p->dp = tf_carve(c, probs, TF_WS, "d attention probs", 0);
  }
  size_t ws = tf_model_backward_workspace(m, p);
  p->backward_ws = ws ? tf_carve(c, ws, TF_WS, "encoder and norm backward workspace", 0) : NULL;
}

/* cos and sin of t * theta^(-2i / hd), in double by the rule the rope op
 * uses (rope.h: the same angles on every backend), rounded to f32, copied
 * to the device. */
tf_status tf_model_rope_tables(tf_model *m, int64_t T, float *cos_out, float *sin_out) {
  const int64_t half = m->cfg.d_model / m->cfg.num_heads / 2, n = T * half;
  float *tab = malloc((size_t)n * 2 * sizeof *tab);
  if (!tab) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the RoPE table");
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      double angle = (double)t * tf_rope_inv_freq(m->cfg.rope_theta, i, 2 * half);
      tab[t * half + i] = (float)cos(angle);
      tab[n + t * half + i] = (float)sin(angle);
    }
  const tf_backend *be = m->ctx->backend;
  tf_status st = be->copy(m->ctx, cos_out, tab, (size_t)n * sizeof *tab, TF_COPY_H2D);
  if (st == TF_OK) st = be->copy(m->ctx, sin_out, tab + n, (size_t)n * sizeof *tab, TF_COPY_H2D);
  free(tab);
  return st;
}

static tf_status tf_model_plan_rope(tf_model *m) {
  return tf_model_rope_tables(m, m->plan.seq, m->plan.rope_cos, m->plan.rope_sin);
}

/* Drops the allocation: what it held (and any pending loss) is gone, and
 * so are the graphs captured over it. */
void tf_model_plan_release(tf_model *m) {
  tf_model_plan *p = &m->plan;
  tf_model_graphs_drop(m);
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
  tf_carver measure = {0};
  tf_model_plan_carve(m, p, &measure);
  p->bytes = measure.at;
  tf_shape s = {1, {(int64_t)p->bytes}};
  tf_mem_scope outer = tf_mem_scope_enter(TF_TAG_ACTIVATION, "model plan");
  tf_status st = tf_tensor_empty(&s, TF_BOOL, m->device, &p->storage);
  tf_mem_scope_leave(outer);
  TF_TRY(st);
  tf_carver carve = {.base = tf_tensor_data(p->storage)};
  carve.regions = calloc((size_t)measure.n, sizeof *carve.regions);
  carve.names = calloc((size_t)measure.n, sizeof *carve.names);
  if (!carve.regions || !carve.names) {
    free(carve.regions);
    free(carve.names);
    carve.regions = NULL;
    carve.names = NULL;
  }
  tf_model_plan_carve(m, p, &carve);
  st = carve.regions ? tf_alloc_describe(&m->ctx->alloc, carve.base, carve.n, carve.regions) : TF_OK;
  free(carve.regions);
  free(carve.names);
  TF_TRY(st);
  return tf_model_plan_rope(m);
}

/* Re-plans only on a new shape, or when training needs what an inference plan lacks. */
tf_status tf_model_plan_ensure(tf_model *m, int64_t batch, int64_t seq, bool training) {
  tf_model_plan *p = &m->plan;
  if (m->fp8 && training && batch * seq % 16 != 0)
    return tf_fail(TF_ERR_ARG, "model: fp8 needs batch * seq a multiple of 16 (the weight gradients' products sum "
                   "over the rows in 16-byte words), not %lld x %lld", (long long)batch, (long long)seq);
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
