/* Mixed precision by autocast, with PyTorch's CUDA autocast policy.
 *
 * Inside an autocast region (tf.autocast("bf16")), a differentiable op asks
 * for its inputs under its policy:
 *   LOW:  matmul, linear (and later attention): f32 inputs are cast to the
 *         region's dtype, so the op runs in bf16/f16 (accumulating in f32);
 *   F32:  exp, log, pow, rsqrt, sum, softmax, log_softmax, layer_norm,
 *         cross_entropy: f16/bf16 inputs are cast to f32;
 *   NONE: every other op runs on its inputs as they are, with normal type
 *         promotion (relu of an f16 tensor is f16).
 * f64 tensors and integer tensors are never cast. The casts are ordinary
 * differentiable ops, so gradients flow back to f32 parameters in f32. A
 * leaf that requires grad (a parameter) is cast once per region and the
 * cast reused (the cast cache), cleared when the outermost region ends. The
 * policy is applied on every device (PyTorch's CUDA lists), so the CPU
 * backend shows the same dtypes as a GPU. */
#ifndef TF_AUTOCAST_H
#define TF_AUTOCAST_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_cast_policy { TF_CAST_NONE, TF_CAST_LOW, TF_CAST_F32 } tf_cast_policy;

/* The region's dtype (TF_F16 or TF_BF16), or -1 outside autocast or inside
 * a region that disables it. */
int tf_autocast_dtype(void);

/* Enters a region with dtype TF_F16 / TF_BF16, or -1 to disable autocast
 * within it; *depth identifies the region for tf_autocast_exit. */
tf_status tf_autocast_enter(int dtype, int *depth);
/* Leaves the region entered at depth (and any left open inside it). */
void tf_autocast_exit(int depth);

/* The cast cache of the outermost region: a parameter's cast to dtype made
 * earlier in it and still valid (not retained; NULL when none), and
 * remembering a new one (both retained until the region ends). */
tf_tensor *tf_autocast_cached(tf_tensor *t, tf_dtype dtype);
void tf_autocast_remember(tf_tensor *src, tf_tensor *dst);

/* tf_autocast_input (grad_ops.h) gives an op its inputs under a policy. */

#ifdef __cplusplus
}
#endif
#endif
