/* Causal self-attention of one layer. Heads are split out of the fused
 * q/k/v projection with RoPE in one kernel, so the attention itself sees
 * (batch * heads) contiguous (seq, hd) matrices; FlashAttention writes its
 * output with the heads merged (o_row_stride) and its backward pass reads
 * that output and its gradient so, the naive path merges and splits them
 * in kernels of their own.
 *
 * Flash (the default): the backend's FlashAttention-2 kernels; per layer
 * only the log-sum-exp of each row is kept beside q, k, v, and the
 * backward pass recomputes P tile by tile.
 *
 * Naive: S = Q K^T, P = causal softmax(S / sqrt(hd)) in f32 statistics,
 * O = P V through batched GEMMs. P (the compute dtype, as it feeds the P V
 * GEMM) is not kept per layer: the backward pass recomputes it from the
 * saved Q and K with the same kernels, so it gets the same bits while the
 * plan holds one P buffer instead of L. */
#include "model_internal.h"

#include <math.h>

/* A GEMM over the batch * heads matrices of one layer's attention. */
static tf_status tf_model_heads_gemm(tf_model *m, const void *a, bool ta, int64_t lda, int64_t sa, const void *b,
                                     bool tb, int64_t ldb, int64_t sb, void *c, int64_t ldc, int64_t sc, int64_t rows,
                                     int64_t cols, int64_t inner) {
  const tf_model_plan *p = &m->plan;
  tf_gemm_args g = {.a = a, .b = b, .c = c, .ab_dtype = m->dtype, .c_dtype = m->dtype,
                    .batch = p->batch * m->cfg.num_heads, .m = rows, .n = cols, .k = inner, .trans_a = ta,
                    .trans_b = tb, .lda = lda, .ldb = ldb, .ldc = ldc, .batch_a = sa, .batch_b = sb, .batch_c = sc,
                    .allow_tf32 = m->ctx->allow_tf32};
  return m->k->gemm(m->ctx, &g);
}

/* softmax(Q K^T / sqrt(hd)): the scale the softmax kernel applies. */
static double tf_model_attention_scale(const tf_model *m) {
  return 1.0 / sqrt((double)(m->cfg.d_model / m->cfg.num_heads));
}

/* S = Q K^T, then P = causal softmax in place, into a->p (in the ranges
 * CS336's annotated attention uses). */
static tf_status tf_model_attention_probs(tf_model *m, const tf_model_layer_acts *a) {
  const tf_model_plan *p = &m->plan;
  const int64_t B = p->batch, T = p->seq, H = m->cfg.num_heads, hd = m->cfg.d_model / H;
  TF_RANGED("computing attention scores", tf_model_heads_gemm(m, a->q, false, hd, T * hd, a->k, true, hd, T * hd,
                                                              a->p, T, T * T, T, T, hd));
  tf_causal_softmax_args sm = {.batch = B * H, .seq = T, .scale = tf_model_attention_scale(m), .dtype = m->dtype,
                               .s = a->p};
  TF_RANGED("computing softmax", m->k->causal_softmax(m->ctx, &sm));
  return TF_OK;
}

tf_flash_args tf_model_flash_args(const tf_model *m, int64_t batch, int64_t seq) {
  const int64_t H = m->cfg.num_heads;
  return (tf_flash_args){.causal = true, .deterministic = true, .dtype = m->dtype, .batch = batch * H,
                         .seq_q = seq, .seq_k = seq, .head_dim = m->cfg.d_model / H,
                         .scale = tf_model_attention_scale(m), .o_row_stride = m->cfg.d_model};
}

static tf_status tf_model_flash(tf_model *m, tf_flash_args *fa) {
  const tf_backend *be = m->ctx->backend;
  if (!be->flash_attention) return tf_fail(TF_ERR_BACKEND, "flash attention is not available on %s", be->name);
  return be->flash_attention(m->ctx, fa);
}

/* RoPE and head split, attention, heads merged (by the flash kernels' own
 * stores, or a pass after the naive path's P V). */
tf_status tf_model_attention_forward(tf_model *m, tf_model_layer_acts *a, const void *qkv) {
  const tf_model_plan *p = &m->plan;
  const int64_t B = p->batch, T = p->seq, H = m->cfg.num_heads, hd = m->cfg.d_model / H;
  tf_rope_heads_args rope = {.batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = m->dtype,
                             .cos = p->rope_cos, .sin = p->rope_sin, .qkv = (void *)qkv, .q = a->q, .k = a->k,
                             .v = a->v};
  TF_TRY(m->k->rope_heads(m->ctx, &rope));
  if (m->flash) {
    tf_flash_args fa = tf_model_flash_args(m, B, T);
    fa.q = a->q;
    fa.k = a->k;
    fa.v = a->v;
    fa.o = a->atty;
    fa.lse = a->lse;
    TF_RANGED("flash attention", tf_model_flash(m, &fa));
    return TF_OK;
  }
  tf_heads_args merge = {.batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = m->dtype, .src = p->heads,
                         .dst = a->atty};
  TF_TRY(tf_model_attention_probs(m, a));
  /* O = P V, heads merged into (n, d) */
  TF_RANGED("final matmul",
            tf_model_heads_gemm(m, a->p, false, T, T * T, a->v, false, hd, T * hd, p->heads, hd, T * hd, T, hd, T));
  return m->k->heads(m->ctx, &merge);
}

/* The forward in reverse: P recomputed, dO split into heads (flash reads
 * O and dO merged), dP and dV, dS in place of dP, dQ and dK, then back
 * through RoPE into dqkv. */
tf_status tf_model_attention_backward(tf_model *m, const tf_model_layer_acts *a, const void *datty, void *dqkv) {
  const tf_model_plan *p = &m->plan;
  const int64_t B = p->batch, T = p->seq, H = m->cfg.num_heads, hd = m->cfg.d_model / H, n = B * T;
  void *dq = p->dqkv_heads, *dk = tf_model_at(m, p->dqkv_heads, n * m->cfg.d_model),
       *dv = tf_model_at(m, p->dqkv_heads, 2 * n * m->cfg.d_model);
  tf_rope_heads_args rope = {.backward = true, .batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = m->dtype,
                             .cos = p->rope_cos, .sin = p->rope_sin, .qkv = dqkv, .q = dq, .k = dk, .v = dv};
  if (m->flash) {
    tf_flash_args fa = tf_model_flash_args(m, B, T);
    fa.backward = true;
    fa.q = a->q;
    fa.k = a->k;
    fa.v = a->v;
    fa.o = a->atty;
    fa.dout = datty;
    fa.lse = a->lse;
    fa.dq = dq;
    fa.dk = dk;
    fa.dv = dv;
    fa.workspace = p->flash_ws;
    TF_RANGED("flash attention", tf_model_flash(m, &fa));
    return m->k->rope_heads(m->ctx, &rope);
  }
  void *dout = p->heads;
  tf_heads_args split = {.split = true, .batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = m->dtype,
                         .src = datty, .dst = dout};
  TF_TRY(m->k->heads(m->ctx, &split));
  TF_TRY(tf_model_attention_probs(m, a));
  /* dP = dO V^T; dV = P^T dO */
  TF_TRY(tf_model_heads_gemm(m, dout, false, hd, T * hd, a->v, true, hd, T * hd, p->dp, T, T * T, T, T, hd));
  TF_TRY(tf_model_heads_gemm(m, a->p, true, T, T * T, dout, false, hd, T * hd, dv, hd, T * hd, T, hd, T));
  /* dS (scaled), in place of dP */
  tf_causal_softmax_args sm = {.backward = true, .batch = B * H, .seq = T, .scale = tf_model_attention_scale(m),
                               .dtype = m->dtype, .s = p->dp, .p = a->p};
  TF_TRY(m->k->causal_softmax(m->ctx, &sm));
  /* dQ = dS K; dK = dS^T Q */
  TF_TRY(tf_model_heads_gemm(m, p->dp, false, T, T * T, a->k, false, hd, T * hd, dq, hd, T * hd, T, hd, T));
  TF_TRY(tf_model_heads_gemm(m, p->dp, true, T, T * T, a->q, false, hd, T * hd, dk, hd, T * hd, T, hd, T));
  return m->k->rope_heads(m->ctx, &rope);
}
