/* The forward pass and the loss: inputs checked and copied into the plan,
 * then one short list of kernel calls per layer, run as the phases that
 * model.c replays as CUDA graphs. */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>

/* ---- inputs ------------------------------------------------------------------------ */

/* t's shape as text, for messages. */
static const char *tf_model_shape_text(const tf_tensor *t, char *buf, size_t n) {
  tf_shape s = tf_tensor_shape(t);
  return tf_shape_format(&s, buf, n);
}

/* Token ids (or targets): a 2-D (batch, seq) integer tensor on the model's
 * device or the CPU, seq within the context. */
static tf_status tf_model_check_ids(const tf_model *m, const char *op, const char *what, const tf_tensor *t) {
  char buf[128];
  if (t->dtype != TF_I32 && t->dtype != TF_I64)
    return tf_fail(TF_ERR_ARG, "%s: %s must be i32 or i64 token ids, not %s", op, what, tf_dtype_name(t->dtype));
  if (t->ndim != 2)
    return tf_fail(TF_ERR_ARG, "%s: %s must be 2-D (batch, seq), not of shape %s", op, what,
                   tf_model_shape_text(t, buf, sizeof buf));
  if (t->shape[0] < 1 || t->shape[1] < 1)
    return tf_fail(TF_ERR_ARG, "%s: %s must not be empty (shape %s)", op, what, tf_model_shape_text(t, buf, sizeof buf));
  if (t->shape[1] > m->cfg.context_length)
    return tf_fail(TF_ERR_ARG, "%s: the sequence length %lld of %s is longer than the context length %lld", op,
                   (long long)t->shape[1], what, (long long)m->cfg.context_length);
  if (!tf_device_eq(t->device, m->device) && t->device.type != TF_DEV_CPU) {
    char dt[16], dm[16];
    tf_device_format(t->device, dt, sizeof dt);
    tf_device_format(m->device, dm, sizeof dm);
    return tf_fail(TF_ERR_DEVICE, "%s: %s are on %s but the model is on %s", op, what, dt, dm);
  }
  return TF_OK;
}

/* t's values as i64 into plan memory at dst (from the CPU when needed). */
static tf_status tf_model_copy_ids(tf_model *m, int64_t *dst, const tf_tensor *t) {
  tf_shape s = tf_tensor_shape(t);
  tf_tensor *view = NULL, *moved = NULL;
  tf_status st = tf_model_plan_view(m, dst, TF_I64, &s, &view);
  if (st == TF_OK && !tf_device_eq(t->device, m->device)) st = tf_to(t, TF_I64, m->device, &moved);
  if (st == TF_OK) st = tf_copy_into(view, moved ? moved : t);
  tf_tensor_release(view);
  tf_tensor_release(moved);
  return st;
}

/* Checks ids (and targets), plans for their shape and copies them in;
 * every id and target is range-checked on the device (one wait). */
static tf_status tf_model_take_inputs(tf_model *m, const char *op, const tf_tensor *ids, const tf_tensor *targets,
                                      bool training) {
  TF_TRY(tf_model_check_ids(m, op, "ids", ids));
  if (targets) {
    TF_TRY(tf_model_check_ids(m, op, "targets", targets));
    if (targets->shape[0] != ids->shape[0] || targets->shape[1] != ids->shape[1]) {
      char a[128], b[128];
      return tf_fail(TF_ERR_ARG, "%s: targets must have the shape of ids %s, not %s", op,
                     tf_model_shape_text(ids, a, sizeof a), tf_model_shape_text(targets, b, sizeof b));
    }
  }
  m->loss_ready = false;
  const int64_t B = ids->shape[0], T = ids->shape[1], n = B * T, V = m->cfg.vocab_size;
  TF_TRY(tf_model_plan_ensure(m, B, T, training));
  TF_TRY(tf_model_copy_ids(m, m->plan.ids, ids));
  if (targets) TF_TRY(tf_model_copy_ids(m, m->plan.targets, targets));
  int64_t bad = -1;
  TF_TRY(m->k->index_check(m->ctx, m->plan.ids, targets ? 2 * n : n, V, &bad));
  if (bad < 0) return TF_OK;
  int64_t value = 0;
  TF_TRY(m->ctx->backend->copy(m->ctx, &value, m->plan.ids + bad, sizeof value, TF_COPY_D2H));
  const int64_t i = bad % n;
  return tf_fail(TF_ERR_ARG, "%s: %s %lld at position [%lld, %lld] is out of range [0, %lld) (the vocabulary size)",
                 op, bad < n ? "token id" : "target", (long long)value, (long long)(i / T), (long long)(i % T),
                 (long long)V);
}

/* ---- the pass ------------------------------------------------------------------------- */

/* One engine RMSNorm call: rstd written, or (given) read as kept. */
static tf_status tf_model_norm_call(tf_model *m, const float *x, const void *delta, float *x_out, int64_t gain,
                                    void *h, float *rstd, bool given) {
  const tf_model_plan *p = &m->plan;
  tf_rmsnorm_args a = {.rows = p->batch * p->seq, .dim = m->cfg.d_model, .eps = TF_MODEL_NORM_EPS,
                       .dtype = m->dtype, .x = x, .delta = delta, .x_out = x_out, .g = tf_model_pw(m, gain),
                       .h = h, .rstd = rstd, .rstd_given = given};
  return m->k->rmsnorm(m->ctx, &a);
}

/* RMSNorm of x (after adding delta into x_out, when delta is given). */
tf_status tf_model_norm(tf_model *m, const float *x, const void *delta, float *x_out, int64_t gain, void *h,
                        float *rstd) {
  return tf_model_norm_call(m, x, delta, x_out, gain, h, rstd, false);
}

/* tf_model_norm again, from the rstd it kept: the same x_out (when delta is
 * given) and h bits, without the rows' sums (the backward pass's
 * recomputed norms). */
tf_status tf_model_norm_again(tf_model *m, const float *x, const void *delta, float *x_out, int64_t gain, void *h,
                              float *rstd) {
  return tf_model_norm_call(m, x, delta, x_out, gain, h, rstd, true);
}

/* The SwiGLU gate silu(a) * b of one layer from its w1|w3 output. */
tf_status tf_model_swiglu(tf_model *m, const tf_model_layer_acts *a) {
  const tf_model_plan *p = &m->plan;
  tf_swiglu_args sw = {.rows = p->batch * p->seq, .f = m->cfg.d_ff, .dtype = m->dtype, .ab = a->ab, .y = a->gate};
  return m->k->swiglu(m->ctx, &sw);
}

/* Layer l: x + attention(ln1(x)), then + w2(silu(w1 ln2(x)) * w3 ln2(x)). */
static tf_status tf_model_layer_forward(tf_model *m, int64_t l, bool keep) {
  const tf_model_config *c = &m->cfg;
  tf_model_plan *p = &m->plan;
  const int64_t n = p->batch * p->seq, d = c->d_model, f = c->d_ff, L = c->num_layers;
  const tf_model_layer_weights *w = &m->layers[l];
  tf_model_layer_acts *a = &p->layers[keep ? l : 0];
  float *x = p->resid[keep ? 2 * l : 0], *xmid = p->resid[keep ? 2 * l + 1 : 0];
  float *xnext = p->resid[keep ? 2 * l + 2 : 0];
  /* x + attention(ln1(x)) */
  TF_TRY(tf_model_layer_linear(m, a->h1, n, d, 3 * d, w->qkv, p->qkv));
  if (m->prefilling) TF_TRY(tf_model_prefill_store(m, l, p->qkv));
  TF_RANGED("scaled dot product attention", tf_model_attention_forward(m, a, p->qkv));
  void *proj = a->proj ? a->proj : p->proj; /* kept for the backward pass, or scratch */
  TF_TRY(tf_model_layer_linear(m, a->atty, n, d, d, w->out, proj));
  TF_TRY(tf_model_norm(m, x, proj, xmid, w->ln2, a->h2, a->rstd2));
  /* + w2(silu(w1 ln2(x)) * w3 ln2(x)) */
  TF_TRY(tf_model_layer_linear(m, a->h2, n, d, 2 * f, w->w13, a->ab));
  TF_TRY(tf_model_swiglu(m, a));
  TF_TRY(tf_model_layer_linear(m, a->gate, n, f, d, w->w2, p->proj));
  /* the residual add, fused with the next norm (ln1 of the next layer, or ln_final) */
  if (l + 1 < L) {
    tf_model_layer_acts *next = &p->layers[keep ? l + 1 : 0];
    TF_TRY(tf_model_norm(m, xmid, p->proj, xnext, m->layers[l + 1].ln1, next->h1, next->rstd1));
  } else {
    TF_TRY(tf_model_norm(m, xmid, p->proj, xnext, m->lnf, p->hf, p->rstdf));
  }
  return TF_OK;
}

/* encoder, ln1; per layer: qkv GEMM, attention, output_proj, residual add +
 * ln2, w1|w3 GEMM, SwiGLU, w2, residual add + the next norm (ln_final after
 * the last): the plan's ids to its hf. A phase body (model_internal.h): the
 * caller has refreshed the low-precision weights. */
static tf_status tf_model_layers_pass(tf_model *m, bool keep) {
  const tf_model_config *c = &m->cfg;
  tf_model_plan *p = &m->plan;
  const int64_t n = p->batch * p->seq, d = c->d_model, L = c->num_layers;
  tf_encoder_args enc = {.n = n, .dim = d, .vocab = c->vocab_size, .ids = p->ids, .wte = tf_model_pw(m, m->wte),
                         .out = p->resid[0]};
  TF_TRY(m->k->encoder(m->ctx, &enc));
  tf_model_layer_acts *a0 = &p->layers[0];
  TF_TRY(tf_model_norm(m, p->resid[0], NULL, NULL, m->layers[0].ln1, a0->h1, a0->rstd1));
  for (int64_t l = 0; l < L; l++) {
    char name[32];
    snprintf(name, sizeof name, "layer %lld", (long long)l);
    TF_RANGED(name, tf_model_layer_forward(m, l, keep));
  }
  return TF_OK;
}

/* logits (n, V) of the compute dtype = lm_head(hf). */
static tf_status tf_model_lm_head(tf_model *m, void *logits) {
  const tf_model_plan *p = &m->plan;
  return tf_model_linear(m, p->hf, p->batch * p->seq, m->cfg.d_model, m->cfg.vocab_size, tf_model_mw(m, m->lm_head),
                         logits);
}

/* The layers, then lm_head into logits. */
static tf_status tf_model_forward_pass(tf_model *m, bool keep, void *logits) {
  TF_TRY(tf_model_layers_pass(m, keep));
  return tf_model_lm_head(m, logits);
}

/* The training forward into the plan's logits, in the "forward" range. */
static tf_status tf_model_loss_forward(tf_model *m, bool keep) {
  TF_RANGED("forward", tf_model_forward_pass(m, keep, m->plan.logits));
  return TF_OK;
}

/* The training forward (its FP8 casts by the recipe), then the fused loss,
 * which leaves the logits' gradient in their place for backward and the
 * mean in the plan's loss slot: the body of the "forward and loss" phase. */
static tf_status tf_model_loss_pass(tf_model *m, bool keep) {
  tf_model_plan *p = &m->plan;
  TF_TRY(tf_model_fp8_pass_begin(m));
  const tf_status forward = tf_model_loss_forward(m, keep);
  tf_model_fp8_pass_end(m);
  TF_TRY(forward);
  tf_lm_loss_args a = {.rows = p->batch * p->seq, .vocab = m->cfg.vocab_size, .dtype = m->dtype,
                       .logits = p->logits, .targets = p->targets, .row_loss = p->row_loss, .loss = p->loss,
                       .grad = true};
  TF_RANGED("loss", m->k->lm_loss(m->ctx, &a));
  return TF_OK;
}

/* The layers as the "forward" phase (replayed once captured), then
 * lm_head into logits: a new tensor each call, so outside the graph. */
static tf_status tf_model_forward_replayed(tf_model *m, bool keep, void *logits) {
  TF_TRY(tf_model_run_phase(m, TF_MODEL_PHASE_FORWARD, keep, tf_model_layers_pass));
  return tf_model_lm_head(m, logits);
}

/* tf_model_forward's pass, in the "forward" range. */
static tf_status tf_model_run_forward(tf_model *m, bool keep, void *logits) {
  TF_RANGED("forward", tf_model_forward_replayed(m, keep, logits));
  return TF_OK;
}

/* Logits land in a new tensor, so they stay valid whatever the engine does next. */
tf_status tf_model_forward(tf_model *m, const tf_tensor *ids, bool training, tf_tensor **logits) {
  TF_TRY(tf_model_take_inputs(m, "model forward", ids, NULL, training));
  TF_TRY(tf_model_sync_weights(m)); /* eager: a conversion must never be baked into a graph */
  tf_shape s = {3, {ids->shape[0], ids->shape[1], m->cfg.vocab_size}};
  tf_tensor *out = NULL;
  TF_TRY(tf_tensor_empty(&s, m->dtype, m->device, &out));
  tf_status st = tf_model_run_forward(m, training, tf_tensor_data(out));
  if (st != TF_OK) {
    tf_tensor_release(out);
    return st;
  }
  *logits = out;
  return TF_OK;
}

/* The "forward and loss" phase, then the mean copied out of the plan into
 * a new 0-dim tensor (a device-side copy: nothing waits). */
tf_status tf_model_loss(tf_model *m, const tf_tensor *ids, const tf_tensor *targets, tf_tensor **loss) {
  TF_TRY(tf_model_take_inputs(m, "model loss", ids, targets, true));
  TF_TRY(tf_model_sync_weights(m)); /* eager: a conversion must never be baked into a graph */
  tf_shape scalar = {0, {0}};
  tf_tensor *out = NULL, *slot = NULL;
  TF_TRY(tf_tensor_empty(&scalar, TF_F32, m->device, &out));
  tf_status st = tf_model_run_phase(m, TF_MODEL_PHASE_LOSS, true, tf_model_loss_pass);
  if (st == TF_OK) st = tf_model_plan_view(m, m->plan.loss, TF_F32, &scalar, &slot);
  if (st == TF_OK) st = tf_copy_into(out, slot);
  tf_tensor_release(slot);
  if (st != TF_OK) {
    tf_tensor_release(out);
    return st;
  }
  m->loss_ready = true;
  *loss = out;
  return TF_OK;
}

/* ---- generation's prefill ------------------------------------------------------------ */

tf_status tf_model_prefill_layers(tf_model *m, const tf_tensor *ids) {
  TF_TRY(tf_model_take_inputs(m, "model prefill", ids, NULL, false));
  TF_TRY(tf_model_sync_weights(m));
  TF_RANGED("prefill", tf_model_layers_pass(m, false));
  return TF_OK;
}
