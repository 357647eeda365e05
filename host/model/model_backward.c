/* The backward pass: the forward's kernel list in reverse, from the logits'
 * gradient that the fused loss left in the plan. The gradient of the
 * residual stream (dres) stays f32; each norm's backward adds into it and
 * rounds a copy to the compute dtype (dres_low) for the GEMMs that read
 * it. Weight gradients are added into the f32 gradient buffer. */
#include "model_internal.h"

#include <stdio.h>

/* RMSNorm's backward: dres (+)= d x, dres_low refreshed (when wanted), d gain added. */
static tf_status tf_model_norm_backward(tf_model *m, const float *x, int64_t gain, const float *rstd, const void *dh,
                                        bool accumulate, bool want_low) {
  tf_model_plan *p = &m->plan;
  tf_rmsnorm_args a = {.backward = true, .rows = p->batch * p->seq, .dim = m->cfg.d_model,
                       .eps = TF_MODEL_NORM_EPS, .dtype = m->dtype, .x = x, .g = tf_model_pw(m, gain),
                       .rstd = (float *)rstd, .dh = dh, .dres = p->dres, .accumulate = accumulate,
                       .dres_low = want_low && m->dtype != TF_F32 ? p->dres_low : NULL,
                       .dg = tf_model_gw(m, gain), .workspace = p->backward_ws};
  return m->k->rmsnorm(m->ctx, &a);
}

/* Layer l in reverse: the SwiGLU half, then the attention half; dres
 * holds the gradient of x_{l+1} on entry and of x_l on exit. */
static tf_status tf_model_layer_backward(tf_model *m, int64_t l) {
  const tf_model_config *c = &m->cfg;
  tf_model_plan *p = &m->plan;
  const int64_t n = p->batch * p->seq, d = c->d_model, f = c->d_ff;
  const void *dlow = p->dres_low; /* the residual gradient as the GEMMs read it */
  const tf_model_layer_weights *w = &m->layers[l];
  const tf_model_layer_acts *a = &p->layers[l];
  /* x_{l+1} = xmid + w2(silu(w1 h2) * w3 h2), h2 = ln2(xmid); h2 and the gate recomputed */
  TF_TRY(tf_model_norm(m, p->resid[2 * l + 1], NULL, NULL, w->ln2, a->h2, a->rstd2));
  TF_TRY(tf_model_swiglu(m, a));
  TF_TRY(tf_model_linear_backward(m, dlow, a->gate, n, f, d, tf_model_mw(m, w->w2), tf_model_gw(m, w->w2),
                                  p->dgate));
  tf_swiglu_args sw = {.backward = true, .rows = n, .f = f, .dtype = m->dtype, .ab = a->ab, .dy = p->dgate,
                       .dab = p->dab};
  TF_TRY(m->k->swiglu(m->ctx, &sw));
  TF_TRY(tf_model_linear_backward(m, p->dab, a->h2, n, d, 2 * f, tf_model_mw(m, w->w13), tf_model_gw(m, w->w13),
                                  p->proj));
  TF_TRY(tf_model_norm_backward(m, p->resid[2 * l + 1], w->ln2, a->rstd2, p->proj, true, true));
  /* xmid = x_l + output_proj(attention(h1)), h1 = ln1(x_l) */
  TF_TRY(tf_model_linear_backward(m, dlow, a->atty, n, d, d, tf_model_mw(m, w->out), tf_model_gw(m, w->out),
                                  p->proj));
  TF_RANGED("scaled dot product attention", tf_model_attention_backward(m, a, p->proj, p->qkv));
  TF_TRY(tf_model_norm(m, p->resid[2 * l], NULL, NULL, w->ln1, a->h1, a->rstd1)); /* h1 recomputed */
  TF_TRY(tf_model_linear_backward(m, p->qkv, a->h1, n, d, 3 * d, tf_model_mw(m, w->qkv), tf_model_gw(m, w->qkv),
                                  p->proj));
  TF_TRY(tf_model_norm_backward(m, p->resid[2 * l], w->ln1, a->rstd1, p->proj, true, l > 0));
  return TF_OK;
}

/* The logits' gradient (left by the fused loss) is the starting point;
 * the body of the "backward" phase (keep is always true here). */
static tf_status tf_model_backward_pass(tf_model *m, bool keep) {
  (void)keep;
  const tf_model_config *c = &m->cfg;
  tf_model_plan *p = &m->plan;
  const int64_t n = p->batch * p->seq, d = c->d_model, L = c->num_layers;
  /* logits = lm_head(ln_final(x_L)) */
  TF_TRY(tf_model_linear_backward(m, p->logits, p->hf, n, d, c->vocab_size, tf_model_mw(m, m->lm_head),
                                  tf_model_gw(m, m->lm_head), p->proj));
  TF_TRY(tf_model_norm_backward(m, p->resid[2 * L], m->lnf, p->rstdf, p->proj, false, true));
  for (int64_t l = L - 1; l >= 0; l--) {
    char name[32];
    snprintf(name, sizeof name, "layer %lld", (long long)l);
    TF_RANGED(name, tf_model_layer_backward(m, l));
  }
  tf_encoder_args enc = {.backward = true, .n = n, .dim = d, .vocab = c->vocab_size, .ids = p->ids,
                         .dout = p->dres, .dwte = tf_model_gw(m, m->wte), .workspace = p->backward_ws};
  return m->k->encoder(m->ctx, &enc);
}

/* Consumes the loss: the plan's activations are read. */
tf_status tf_model_backward(tf_model *m) {
  if (!m->loss_ready)
    return tf_fail(TF_ERR_STATE, "model backward: no loss to differentiate: call loss() first (one backward per loss)");
  m->loss_ready = false;
  TF_RANGED("backward", tf_model_run_phase(m, TF_MODEL_PHASE_BACKWARD, true, tf_model_backward_pass));
  return TF_OK;
}
