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

static tf_status tf_model_step_region(tf_model *m, int64_t off, int64_t end, int mark);

/* Before matrix j of layer l gets its gradient: in the ring, the optimizer
 * must have read what its slot held (the matrix TF_SIDE_MARKS before it);
 * the first matrices of the pass find their slots free. */
static tf_status tf_model_matrix_begin(tf_model *m, int64_t l, int j) {
  const bool first = l == m->cfg.num_layers - 1 && j < TF_SIDE_MARKS;
  if (m->use_ring && m->overlap && !first) return m->k->main_wait(m->ctx, j % TF_SIDE_MARKS);
  return TF_OK;
}

/* After it: the gradient is final (and the pass no longer reads the
 * weight), so the optimizer, or an overlapped sync, may take it. */
static tf_status tf_model_matrix_end(tf_model *m, int64_t l, int j) {
  int64_t begin, end;
  tf_model_matrix_range(m, l, j, &begin, &end);
  return tf_model_step_region(m, begin, end, j % TF_SIDE_MARKS);
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
  /* x_{l+1} = xmid + w2(silu(w1 h2) * w3 h2), h2 = ln2(xmid); h2 and the gate recomputed
   * (and xmid = x_l + output_proj(attention), when not kept, by the forward pass's kernels
   * from the kept projection or the projection's GEMM again) */
  if (a->proj || m->recompute_residual) {
    void *proj = a->proj;
    if (!proj) {
      proj = p->proj;
      TF_TRY(tf_model_layer_linear(m, a->atty, n, d, d, w->out, proj));
    }
    TF_TRY(tf_model_norm_again(m, p->resid[2 * l], proj, p->resid[2 * l + 1], w->ln2, a->h2, a->rstd2));
  } else {
    TF_TRY(tf_model_norm_again(m, p->resid[2 * l + 1], NULL, NULL, w->ln2, a->h2, a->rstd2));
  }
  /* The gate's gradient first, into the gate's buffer (p->dgate is a->gate);
   * then one pass over [a | b] and it writes d[a | b] in place of [a | b]
   * (the layer's last reader of them) and the gate, recomputed, over its
   * gradient; then w2's weight gradient reads the gate. */
  TF_TRY(tf_model_layer_linear_dx(m, dlow, n, f, d, w->w2, p->dgate));
  tf_swiglu_args sw = {.backward = true, .rows = n, .f = f, .dtype = m->dtype, .ab = a->ab, .dy = p->dgate,
                       .dab = a->ab, .y = a->gate};
  TF_TRY(m->k->swiglu(m->ctx, &sw));
  TF_TRY(tf_model_matrix_begin(m, l, TF_MAT_W2));
  TF_TRY(tf_model_layer_linear_backward(m, dlow, a->gate, n, f, d, w->w2, tf_model_gw(m, w->w2), NULL));
  TF_TRY(tf_model_matrix_end(m, l, TF_MAT_W2));
  TF_TRY(tf_model_matrix_begin(m, l, TF_MAT_W13));
  TF_TRY(tf_model_layer_linear_backward(m, a->ab, a->h2, n, d, 2 * f, w->w13, tf_model_gw(m, w->w13), p->proj));
  TF_TRY(tf_model_matrix_end(m, l, TF_MAT_W13));
  TF_TRY(tf_model_norm_backward(m, p->resid[2 * l + 1], w->ln2, a->rstd2, p->proj, true, true));
  /* xmid = x_l + output_proj(attention(h1)), h1 = ln1(x_l) */
  TF_TRY(tf_model_matrix_begin(m, l, TF_MAT_OUT));
  TF_TRY(tf_model_layer_linear_backward(m, dlow, a->atty, n, d, d, w->out, tf_model_gw(m, w->out), p->proj));
  TF_TRY(tf_model_matrix_end(m, l, TF_MAT_OUT));
  TF_RANGED("scaled dot product attention", tf_model_attention_backward(m, a, p->proj, p->qkv));
  TF_TRY(tf_model_norm_again(m, p->resid[2 * l], NULL, NULL, w->ln1, a->h1, a->rstd1)); /* h1 recomputed */
  TF_TRY(tf_model_matrix_begin(m, l, TF_MAT_QKV));
  TF_TRY(tf_model_layer_linear_backward(m, p->qkv, a->h1, n, d, 3 * d, w->qkv, tf_model_gw(m, w->qkv), p->proj));
  TF_TRY(tf_model_matrix_end(m, l, TF_MAT_QKV));
  TF_TRY(tf_model_norm_backward(m, p->resid[2 * l], w->ln1, a->rstd1, p->proj, true, l > 0));
  return TF_OK;
}

/* With tf_model_backward_adamw: AdamW over the parameters [off, off + n)
 * on the side stream, after everything queued so far (their gradients are
 * final, and the pass no longer reads them); the matmul weights' low copy
 * refreshed as it goes. */
static tf_status tf_model_step_region(tf_model *m, int64_t off, int64_t end, int mark) {
  if (m->grad_sync != TF_GRAD_SYNC_NONE && !m->step_in_backward) return tf_model_grads_ready(m, off, end);
  if (!m->step_in_backward || m->clip_in_step || end <= off) return TF_OK; /* clipped: after the whole pass */
  const tf_model_kernels *k = m->k;
  tf_model_adamw_args a = {.p = tf_model_pw(m, off), .m = (float *)tf_tensor_data(m->adam_m) + off,
                           .v = (float *)tf_tensor_data(m->adam_v) + off, .g = tf_model_gw(m, off), .n = end - off,
                           .consts = tf_tensor_data(m->adam_consts),
                           .zero_g = m->use_ring && off >= m->matmul_total};
  if (m->low && off < m->matmul_total) {
    a.low = tf_model_at(m, tf_tensor_data(m->low), off);
    a.low_dtype = m->dtype;
    a.n_low = (end < m->matmul_total ? end : m->matmul_total) - off;
  }
  if (!m->overlap) {
    TF_RANGED("optimizer", k->adamw(m->ctx, &a));
    return TF_OK;
  }
  TF_TRY(k->side_enter(m->ctx));
  const bool ranged = tf_range_push("optimizer") == TF_OK;
  tf_status st = k->adamw(m->ctx, &a);
  if (st == TF_OK && m->use_ring && mark >= 0) st = k->side_mark(m->ctx, mark); /* the slot may be used again */
  if (ranged) (void)tf_range_pop();
  (void)k->side_leave(m->ctx);
  return st;
}

/* The backward pass's body, without the join of the side stream. */
static tf_status tf_model_backward_steps(tf_model *m) {
  const tf_model_config *c = &m->cfg;
  tf_model_plan *p = &m->plan;
  const int64_t n = p->batch * p->seq, d = c->d_model, L = c->num_layers;
  /* logits = lm_head(ln_final(x_L)) */
  TF_TRY(tf_model_linear_backward(m, p->logits, p->hf, n, d, c->vocab_size, tf_model_mw(m, m->lm_head),
                                  tf_model_gw(m, m->lm_head), p->proj));
  TF_TRY(tf_model_step_region(m, m->lm_head, m->matmul_total, -1));
  TF_TRY(tf_model_norm_backward(m, p->resid[2 * L], m->lnf, p->rstdf, p->proj, false, true));
  for (int64_t l = L - 1; l >= 0; l--) {
    char name[32];
    snprintf(name, sizeof name, "layer %lld", (long long)l);
    TF_RANGED(name, tf_model_layer_backward(m, l)); /* each matrix stepped as its gradient is done */
  }
  tf_encoder_args enc = {.backward = true, .n = n, .dim = d, .vocab = c->vocab_size, .ids = p->ids,
                         .dout = p->dres, .dwte = tf_model_gw(m, m->wte), .workspace = p->backward_ws};
  TF_TRY(m->k->encoder(m->ctx, &enc));
  return tf_model_step_region(m, m->matmul_total, m->total, -1); /* embedding, norms */
}

/* The logits' gradient (left by the fused loss) is the starting point;
 * the body of the "backward" phase (keep is always true here). The side
 * stream is joined however the pass ends, so that a capture ends whole. */
static tf_status tf_model_backward_pass(tf_model *m, bool keep) {
  (void)keep;
  tf_status st = tf_model_backward_steps(m);
  if (m->clip_in_step) return st == TF_OK ? tf_model_clip_update(m, true, true) : st;
  if (m->step_in_backward && m->overlap) {
    char why[256];
    snprintf(why, sizeof why, "%s", tf_last_error());
    tf_status joined = m->k->side_join(m->ctx);
    if (st == TF_OK) return joined;
    (void)tf_fail(st, "%s", why); /* the pass's own failure is the one to report */
  }
  return st;
}

/* A loss that no backward pass has consumed yet. */
static tf_status tf_model_need_loss(const tf_model *m) {
  if (m->loss_ready) return TF_OK;
  return tf_fail(TF_ERR_STATE, "model backward: no loss to differentiate: call loss() first (one backward per loss)");
}

/* Whether this backend, in this state, can step the optimizer beside the
 * backward pass: a side stream, and a low copy in step with the weights
 * (a stale one is converted whole after the step instead). */
static bool tf_model_can_overlap(const tf_model *m) {
  const tf_model_kernels *k = m->k;
  if (m->grad_sync != TF_GRAD_SYNC_NONE) return false; /* the gradients are averaged before any update */
  return k->side_enter && k->side_leave && k->side_join && k->side_mark && k->main_wait && k->adamw &&
         k->adamw_constants && (!m->low || m->low_version == m->params->storage->version);
}

/* The clipped step in one phase (one graph on a GPU): the backward pass
 * into the flat gradients, then their norm, then AdamW over every
 * parameter reading the factor from the device, the gradients zeroed as
 * they are read. */
static tf_status tf_model_backward_clipped(tf_model *m, const tf_adamw_update *u) {
  TF_TRY(tf_model_ensure_moments(m));
  TF_TRY(tf_model_ensure_grads(m));
  TF_TRY(tf_model_ensure_clip(m));
  TF_TRY(m->k->adamw_constants(m->ctx, tf_tensor_data(m->adam_consts), u));
  m->loss_ready = false;
  m->grads_dirty = true; /* until the update has zeroed them */
  m->step_in_backward = m->clip_in_step = true;
  m->use_ring = false;
  const bool ranged = tf_range_push("backward") == TF_OK;
  tf_status st = tf_model_run_phase(m, TF_MODEL_PHASE_BACKWARD, true, tf_model_backward_pass);
  if (ranged) (void)tf_range_pop();
  m->step_in_backward = m->clip_in_step = false;
  TF_TRY(st);
  m->grads_dirty = false;
  m->params->storage->version++; /* an in-place write, as autograd counts them */
  if (m->low) m->low_version = m->params->storage->version;
  return TF_OK;
}

tf_status tf_model_backward_adamw(tf_model *m, const tf_adamw_args *args) {
  TF_TRY(tf_model_need_loss(m));
  tf_adamw_update u = {0};
  TF_TRY(tf_adamw_constants("model:backward_adamw", args, &u));
  if (m->max_grad_norm > 0) {
    /* data parallel, the gradients are averaged after the pass; a stale low copy is converted whole */
    if (m->zero1 || m->grad_sync != TF_GRAD_SYNC_NONE || (m->low && m->low_version != m->params->storage->version)) {
      TF_TRY(tf_model_adamw_step_check(m));
      TF_TRY(tf_model_backward(m));
      return tf_model_adamw_step(m, args);
    }
    return tf_model_backward_clipped(m, &u);
  }
  if (!tf_model_can_overlap(m)) {
    TF_TRY(tf_model_backward(m));
    return tf_model_adamw_step(m, args);
  }
  TF_TRY(tf_model_ensure_moments(m));
  if (!m->adam_consts)
    TF_TRY(tf_model_alloc(m, TF_ADAMW_CONSTS, TF_F32, TF_TAG_OPTIMIZER, "model AdamW constants", &m->adam_consts));
  /* Gradients accumulated by earlier backward passes are added to in place;
   * else they go through the ring and the flat buffer is never needed. */
  const bool ring = !m->grads || !m->grads_dirty;
  if (ring) TF_TRY(tf_model_ensure_ring(m));
  TF_TRY(m->k->adamw_constants(m->ctx, tf_tensor_data(m->adam_consts), &u));
  m->loss_ready = false;
  m->step_in_backward = true;
  m->use_ring = ring;
  const bool ranged = tf_range_push("backward") == TF_OK;
  tf_status st = tf_model_run_phase(m, TF_MODEL_PHASE_BACKWARD, true, tf_model_backward_pass);
  if (ranged) (void)tf_range_pop();
  m->step_in_backward = m->use_ring = false;
  TF_TRY(st);
  m->params->storage->version++; /* an in-place write, as autograd counts them */
  if (m->low) m->low_version = m->params->storage->version;
  return TF_OK;
}

/* Consumes the loss: the plan's activations are read. Data parallel, the
 * gradients are averaged over the ranks before it returns (started during
 * the pass by the overlapped syncs, model_parallel.c). */
tf_status tf_model_backward(tf_model *m) {
  TF_TRY(tf_model_need_loss(m));
  TF_TRY(tf_model_ensure_grads(m));
  m->loss_ready = false;
  m->grads_dirty = true;
  const bool ranged = tf_range_push("backward") == TF_OK;
  tf_status st = tf_model_run_phase(m, TF_MODEL_PHASE_BACKWARD, true, tf_model_backward_pass);
  if (ranged) (void)tf_range_pop();
  if (st != TF_OK) {
    tf_model_drop_works(m); /* collectives the pass started: finished (waited for) and forgotten */
    return st;
  }
  if (m->grad_sync != TF_GRAD_SYNC_NONE) TF_RANGED("gradient all-reduce", tf_model_sync_grads(m));
  return TF_OK;
}
