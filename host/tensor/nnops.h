/* Fused neural-network ops and their backward passes: the dispatch layer.
 *
 * Like ops.h's functions these check their arguments, allocate outputs and
 * call the device's backend; they know nothing about autograd (autograd.c
 * records them and calls the *_backward functions). Every op computes in
 * f32 for f16/bf16 inputs (f64 for f64) and has a CPU twin that is the
 * reference for its CUDA kernel. Shapes: "rows" are all dims but the last,
 * flattened. */
#ifndef TF_NNOPS_H
#define TF_NNOPS_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* softmax / log_softmax over the last dim; y has x's dtype and shape. */
tf_status tf_softmax(const tf_tensor *x, bool log, tf_tensor **y);
/* From the forward output y and the gradient dy (both of y's shape/dtype):
 * softmax:     dx = y * (dy - sum(dy * y))
 * log_softmax: dx = dy - exp(y) * sum(dy)      (sums over the last dim) */
tf_status tf_softmax_backward(const tf_tensor *y, const tf_tensor *dy, bool log, tf_tensor **dx);

/* layer_norm over the last dim: y = (x - mean) * rstd * w + b, with w and b
 * optional (NULL) of shape (D,). mean and rstd (f32, f64 for f64 x; shape =
 * x's rows) are returned for the backward pass (pass NULL to skip them). y
 * has x's dtype. */
tf_status tf_layer_norm(const tf_tensor *x, const tf_tensor *w, const tf_tensor *b, double eps, tf_tensor **y,
                        tf_tensor **mean, tf_tensor **rstd);
/* dx (x's dtype), dw and db (w's dtype, NULL pointers skip them). */
tf_status tf_layer_norm_backward(const tf_tensor *dy, const tf_tensor *x, const tf_tensor *w, const tf_tensor *mean,
                                 const tf_tensor *rstd, tf_tensor **dx, tf_tensor **dw, tf_tensor **db);

/* rms_norm over the last dim: y = x * rstd * g with rstd = 1/sqrt(mean(x^2) + eps)
 * computed in f32 (CS336's RMSNorm); g optional, shape (D,); y has x's dtype. */
tf_status tf_rms_norm(const tf_tensor *x, const tf_tensor *g, double eps, tf_tensor **y, tf_tensor **rstd);
tf_status tf_rms_norm_backward(const tf_tensor *dy, const tf_tensor *x, const tf_tensor *g, const tf_tensor *rstd,
                               tf_tensor **dx, tf_tensor **dg);

/* Mean cross-entropy of logits (N, V) (any leading dims, flattened to rows)
 * against integer targets (N) in [0, V): a 0-dim tensor of logits' dtype.
 * lse (f32, N) is returned for the backward pass. Targets out of range are
 * an error (TF_ERR_ARG naming the first bad one); the GPU never reads out of
 * bounds. */
tf_status tf_cross_entropy(const tf_tensor *logits, const tf_tensor *targets, tf_tensor **loss, tf_tensor **lse);
/* dlogits = (softmax(logits) - onehot(targets)) * dloss / N, dloss a 0-dim tensor. */
tf_status tf_cross_entropy_backward(const tf_tensor *logits, const tf_tensor *targets, const tf_tensor *lse,
                                    const tf_tensor *dloss, tf_tensor **dlogits);

/* Rotary embedding on interleaved pairs (x[..., 2k], x[..., 2k+1]) of the
 * last dim d (even): angle = pos * theta^(-2k/d). positions is an integer
 * tensor broadcastable to x's shape without its last dim, or NULL for
 * 0..seq-1 along the second-to-last dim. inverse rotates by -angle (the
 * backward pass). */
tf_status tf_rope(const tf_tensor *x, const tf_tensor *positions, double theta, bool inverse, tf_tensor **y);

/* Embedding lookup: weight (V, D), ids any shape of i32/i64 in [0, V);
 * out (ids..., D) of weight's dtype. Ids out of range are an error. */
tf_status tf_embedding(const tf_tensor *weight, const tf_tensor *ids, tf_tensor **out);
/* dweight (V, D), f32 (f64 for f64): the sum of dout's rows per id,
 * deterministic (the same bits every run) on every backend. */
tf_status tf_embedding_backward(const tf_tensor *dout, const tf_tensor *ids, int64_t vocab, tf_dtype dtype,
                                tf_tensor **dweight);

/* out = mask ? value : x, mask a bool tensor broadcastable to x. */
tf_status tf_masked_fill(const tf_tensor *x, const tf_tensor *mask, double value, tf_tensor **out);

/* One AdamW step for one parameter tensor, in place (torch.optim.AdamW):
 *   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 * p, m, v f32 (or f64), g of p's shape in any float dtype; step counts from 1. */
typedef struct tf_adamw_args {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
} tf_adamw_args;
tf_status tf_adamw_step(tf_tensor *p, const tf_tensor *g, tf_tensor *m, tf_tensor *v, const tf_adamw_args *args);
/* The same, also writing the first numel(low) elements of the new p into
 * low (contiguous, f16 or bf16, p's device; p f32), rounded as
 * tf_copy_into(low, p's prefix) would round them: a mixed-precision
 * model's low-precision weights refreshed in the same pass over p. */
tf_status tf_adamw_step_with_low(tf_tensor *p, const tf_tensor *g, tf_tensor *m, tf_tensor *v, tf_tensor *low,
                                 const tf_adamw_args *args);
/* Checks args (op names the caller in messages) and works out a step's
 * constants into u's scalar fields (decay, beta1, beta2, step_size,
 * bias2_sqrt, eps), as tf_adamw_step does. */
struct tf_adamw_update;
tf_status tf_adamw_constants(const char *op, const tf_adamw_args *args, struct tf_adamw_update *u);

/* FP8 products (tf.scaled_matmul): C = scale_a scale_b (a b) on cuBLASLt,
 * a (m, k) row-major and b (k, n) column-major (b = w:t(), w (n, k)
 * row-major), f8e4m3 or f8e5m2 (not both e5m2), k and n multiples of 16.
 * The scales are f32 tensors on the operands' device: one value each
 * (tensorwise), or m values for a and n for b (rowwise: C[i][j] =
 * scale_a[i] scale_b[j] (a b)[i][j]). C is out_dtype (bf16, f16, f32);
 * amax (not NULL) receives a 0-dim f32 tensor, max |C| (NaN if C has one).
 * The CPU computes from the decoded values in f32: the GPU's twin. */
typedef struct tf_scaled_matmul_opts {
  const tf_tensor *scale_a, *scale_b;
  tf_dtype out_dtype;
  bool fast_accum; /* the tensor cores' narrower accumulation (faster, less exact) */
} tf_scaled_matmul_opts;
tf_status tf_scaled_matmul(const tf_tensor *a, const tf_tensor *b, const tf_scaled_matmul_opts *o, tf_tensor **out,
                           tf_tensor **amax);

#ifdef __cplusplus
}
#endif
#endif
