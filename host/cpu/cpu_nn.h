/* The CPU twins of the fused neural-network ops (nnops.h): the reference
 * their CUDA kernels are tested against, so each accumulates in double and
 * rounds once, into the dtype of its output. */
#ifndef TF_CPU_NN_H
#define TF_CPU_NN_H

#include "../core/backend.h"

/* cpu_norm.c: the row-wise ops. */
tf_status tf_cpu_softmax(tf_device_ctx *ctx, const tf_softmax_args *args);
tf_status tf_cpu_norm(tf_device_ctx *ctx, const tf_norm_args *args);

/* cpu_nn.c: losses, positions, lookups, masks and the optimizer. */
tf_status tf_cpu_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *args, int64_t *bad);
tf_status tf_cpu_rope(tf_device_ctx *ctx, const tf_rope_args *args);
tf_status tf_cpu_embedding(tf_device_ctx *ctx, const tf_embedding_args *args, int64_t *bad);
tf_status tf_cpu_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                             tf_tensor *out);
tf_status tf_cpu_adamw(tf_device_ctx *ctx, const tf_adamw_update *args);

#endif
