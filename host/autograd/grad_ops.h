/* Differentiable ops: what the Lua bindings call. Each applies the autocast
 * policy to its inputs (autocast.h), runs the op (ops.h / nnops.h), and, in
 * grad mode with an input that needs grad, records an autograd node whose
 * backward computes the inputs' gradients (autograd.h). Outputs are new
 * references owned by the caller. */
#ifndef TF_GRAD_OPS_H
#define TF_GRAD_OPS_H

#include "autocast.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

tf_status tf_ag_unary(tf_unary_op op, tf_tensor *a, tf_tensor **out);
tf_status tf_ag_binary(tf_binary_op op, tf_tensor *a, tf_tensor *b, tf_tensor **out);
tf_status tf_ag_binary_scalar(tf_binary_op op, tf_tensor *a, tf_scalar s, tf_scalar_side side, tf_tensor **out);
tf_status tf_ag_reduce(tf_reduce_op op, tf_tensor *a, int dim, bool all, bool keepdim, tf_tensor **out);
tf_status tf_ag_matmul(tf_tensor *a, tf_tensor *b, tf_tensor **out);
/* x @ w^T + b with w (out, in) and b (out) or NULL. */
tf_status tf_ag_linear(tf_tensor *x, tf_tensor *w, tf_tensor *b, tf_tensor **out);

/* Conversion and views. */
tf_status tf_ag_to(tf_tensor *a, tf_dtype dtype, tf_device device, tf_tensor **out);

/* The tensor an op should see for input t under autocast's policy
 * (autocast.h): t itself (retained) or a differentiable cast of it, made
 * once per region for a parameter. */
tf_status tf_autocast_input(tf_cast_policy policy, tf_tensor *t, tf_tensor **out);
tf_status tf_ag_contiguous(tf_tensor *a, tf_tensor **out);
tf_status tf_ag_reshape(tf_tensor *a, const tf_shape *shape, tf_tensor **out);
/* A view with the same elements in the same order (unsqueeze, squeeze). */
tf_status tf_ag_alias(tf_tensor *a, const tf_shape *shape, const int64_t *strides, tf_tensor **out);
tf_status tf_ag_transpose(tf_tensor *a, int dim0, int dim1, tf_tensor **out);
tf_status tf_ag_expand(tf_tensor *a, const tf_shape *shape, tf_tensor **out);
tf_status tf_ag_narrow(tf_tensor *a, int dim, int64_t start, int64_t length, tf_tensor **out);
tf_status tf_ag_select(tf_tensor *a, int dim, int64_t index, tf_tensor **out);

/* Neural-network ops (nnops.h). */
tf_status tf_ag_softmax(tf_tensor *x, bool log, tf_tensor **out);
tf_status tf_ag_layer_norm(tf_tensor *x, tf_tensor *w, tf_tensor *b, double eps, tf_tensor **out);
tf_status tf_ag_rms_norm(tf_tensor *x, tf_tensor *g, double eps, tf_tensor **out);
tf_status tf_ag_cross_entropy(tf_tensor *logits, tf_tensor *targets, tf_tensor **out);
tf_status tf_ag_rope(tf_tensor *x, tf_tensor *positions, double theta, tf_tensor **out);
tf_status tf_ag_embedding(tf_tensor *weight, tf_tensor *ids, tf_tensor **out);
tf_status tf_ag_masked_fill(tf_tensor *x, tf_tensor *mask, double value, tf_tensor **out);

/* Gradient helper: g summed down to shape (undoing broadcasting). */
tf_status tf_sum_to(const tf_tensor *g, const tf_shape *shape, tf_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
