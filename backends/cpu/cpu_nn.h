/* The CPU twins of the fused neural-network ops (nnops.h): the reference
 * their CUDA kernels are tested against, so each accumulates in double and
 * rounds once, into the dtype of its output. */
#ifndef TF_CPU_NN_H
#define TF_CPU_NN_H

#include <math.h>

#include "backend.h"
#include "elemio.h"

/* The max of a row of n elements of x (dtype d) from base, and log of the
 * sum of exp(x - max): log-sum-exp is max + *log_sum. */
static inline double tf_cpu_row_max_logsum(const void *x, tf_dtype d, int64_t base, int64_t n, double *log_sum) {
  double m = -INFINITY, sum = 0;
  for (int64_t c = 0; c < n; c++) {
    double v = tf_elem_get(x, d, base + c);
    if (v > m) m = v;
  }
  for (int64_t c = 0; c < n; c++) sum += exp(tf_elem_get(x, d, base + c) - m);
  *log_sum = log(sum);
  return m;
}

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

/* cpu_flash.c: FlashAttention-2's tiled algorithm (online softmax forward,
 * recomputing backward), the twin of backends/cuda/flash_attn.cu. It needs no
 * workspace (flash_workspace is 0). */
tf_status tf_cpu_flash_attention(tf_device_ctx *ctx, const tf_flash_args *args);
size_t tf_cpu_flash_workspace(tf_device_ctx *ctx, const tf_flash_args *args);

#endif
