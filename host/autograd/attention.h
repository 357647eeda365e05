/* Scaled dot-product attention: tf.attention.
 *
 *   O = softmax(scale * Q K^T, masked) V     per problem of the leading dims
 *
 * q is (..., seq_q, d), k and v are (..., seq_k, d) with the same leading
 * dims (any number, none included); one float dtype, one device. With
 * causal, key j is visible to query i iff j <= i (top-left aligned, as
 * torch's is_causal), so no row is ever fully masked.
 *
 * Two implementations with one set of argument checks:
 *   naive: CS336's reference built from differentiable ops (matmul, a
 *          multiplication by scale, masked_fill with -inf, softmax,
 *          matmul), so autograd keeps the probabilities P (B * seq_q *
 *          seq_k values) for the backward pass, as PyTorch eager does;
 *   flash: FlashAttention-2 (backend.h's flash_attention), which keeps only
 *          O and the log-sum-exp of each row (lse) and recomputes P block by
 *          block in the backward pass. */
#ifndef TF_ATTENTION_H
#define TF_ATTENTION_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_attention_impl { TF_ATTENTION_FLASH, TF_ATTENTION_NAIVE } tf_attention_impl;

enum { TF_FLASH_MAX_HEAD_DIM = 128 };

typedef struct tf_attention_opts {
  tf_attention_impl impl;
  bool causal;
  bool deterministic; /* flash: the same bits every run (no float atomics) */
  bool has_scale;     /* else scale = 1 / sqrt(head_dim) */
  double scale;
} tf_attention_opts;

/* The flash forward pass without autograd: o (q's shape and dtype) and lse
 * (q's shape without its last dim; f32, f64 for f64 inputs). */
tf_status tf_flash_attention(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v, bool causal, double scale,
                             bool deterministic, tf_tensor **o, tf_tensor **lse);
/* Its backward pass: dq, dk, dv (the inputs' shapes and dtype) from the
 * saved q, k, v, o, lse and the gradient of o (any float dtype). */
tf_status tf_flash_attention_backward(const tf_tensor *q, const tf_tensor *k, const tf_tensor *v, const tf_tensor *o,
                                      const tf_tensor *lse, const tf_tensor *dout, bool causal, double scale,
                                      bool deterministic, tf_tensor **dq, tf_tensor **dk, tf_tensor **dv);

/* Differentiable and autocast-aware (lower-precision list, like torch's
 * scaled_dot_product_attention): the output, and when lse is not NULL the
 * log-sum-exp of each row of scaled, masked scores (no gradient flows
 * through it). */
tf_status tf_ag_attention(tf_tensor *q, tf_tensor *k, tf_tensor *v, const tf_attention_opts *opts, tf_tensor **out,
                          tf_tensor **lse);

#ifdef __cplusplus
}
#endif
#endif
