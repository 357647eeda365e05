/* The CPU twins of the fused neural-network ops (nnops.h): the reference
 * their CUDA kernels are tested against, so each accumulates in double and
 * rounds once, into the dtype of its output. */
#ifndef TF_CPU_NN_H
#define TF_CPU_NN_H

#include <math.h>

#include "backend.h"
#include "cpu_threads.h"
#include "elemio.h"

/* The max of scale * x over a row of n elements of x (dtype d) from base,
 * and log of the sum of exp(scale * x - max): log-sum-exp is max + *log_sum. */
static inline __attribute__((always_inline)) double tf_cpu_row_max_logsum(const void *x, tf_dtype d, int64_t base, int64_t n, double scale,
                                           double *log_sum) {
  double m = -INFINITY, sum = 0;
  for (int64_t c = 0; c < n; c++) {
    double v = scale * tf_elem_get(x, d, base + c);
    if (v > m) m = v;
  }
  for (int64_t c = 0; c < n; c++) sum += exp(scale * tf_elem_get(x, d, base + c) - m);
  *log_sum = log(sum);
  return m;
}

/* Element i of an index tensor (the dispatcher passes i64; any integer works). */
static inline int64_t tf_cpu_index(const tf_tensor *t, int64_t i) {
  return tf_elem_get_int(tf_tensor_data(t), t->dtype, i);
}

/* The first of n indices outside [0, limit), or -1. */
static inline int64_t tf_cpu_first_bad(const tf_tensor *t, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++) {
    int64_t v = tf_cpu_index(t, i);
    if (v < 0 || v >= limit) return i;
  }
  return -1;
}

/* One file per family: each holds the eager op and the engine kernel of
 * its math (cpu_model.h). */
tf_status tf_cpu_softmax(tf_device_ctx *ctx, const tf_softmax_args *args); /* cpu_softmax.c */
/* cpu_norm.c */
tf_status tf_cpu_norm(tf_device_ctx *ctx, const tf_norm_args *args);

tf_status tf_cpu_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *args, int64_t *bad); /* cpu_cross_entropy.c */
tf_status tf_cpu_rope(tf_device_ctx *ctx, const tf_rope_args *args);                                 /* cpu_rope.c */
tf_status tf_cpu_embedding(tf_device_ctx *ctx, const tf_embedding_args *args, int64_t *bad);       /* cpu_embedding.c */
/* cpu_nn.c: masks and the optimizer. */
tf_status tf_cpu_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                             tf_tensor *out);
tf_status tf_cpu_adamw(tf_device_ctx *ctx, const tf_adamw_update *args);

/* cpu_flash.c: FlashAttention-2's tiled algorithm (online softmax forward,
 * recomputing backward), the twin of backends/cuda/flash_attn.cu. It needs no
 * workspace (flash_workspace is 0). */
tf_status tf_cpu_flash_attention(tf_device_ctx *ctx, const tf_flash_args *args);
size_t tf_cpu_flash_workspace(tf_device_ctx *ctx, const tf_flash_args *args);

#endif
