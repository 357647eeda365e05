/* The CPU twins of the fused neural-network ops (nnops.h): the reference
 * their CUDA kernels are tested against, so each accumulates in double and
 * rounds once, into the dtype of its output. */
#ifndef TF_CPU_NN_H
#define TF_CPU_NN_H

#include <math.h>
#include <stdlib.h>

#include "backend.h"
#include "cpu_threads.h"
#include "elemio.h"

/* The max of scale * x over a row of n elements of x (dtype d) from base,
 * in 8 lanes (it is the same whatever the order; the lanes let the loop
 * vectorise). */
static inline __attribute__((always_inline)) double tf_cpu_row_max(const void *x, tf_dtype d, int64_t base, int64_t n,
                                                                    double scale) {
  double lane[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t c0 = 0;
  for (; c0 + 8 <= n; c0 += 8)
    for (int k = 0; k < 8; k++) {
      const double v = scale * tf_elem_get(x, d, base + c0 + k);
      lane[k] = v > lane[k] ? v : lane[k];
    }
  for (; c0 < n; c0++) {
    const double v = scale * tf_elem_get(x, d, base + c0);
    lane[0] = v > lane[0] ? v : lane[0];
  }
  double m = lane[0];
  for (int k = 1; k < 8; k++) m = lane[k] > m ? lane[k] : m;
  return m;
}

/* The max m of scale * x over a row of n elements of x (dtype d) from
 * base, and the sum of exp(scale * x - m) into *sum; each exponential also
 * into e[c] where e is not NULL (a thread's scratch row), so that the
 * row's next pass reads it back instead of computing it again
 * (tf_cpu_row_exp: the same bits either way). */
static inline __attribute__((always_inline)) double tf_cpu_row_max_sumexp(const void *x, tf_dtype d, int64_t base,
                                                                           int64_t n, double scale, double *e,
                                                                           double *sum) {
  const double m = tf_cpu_row_max(x, d, base, n, scale);
  double s = 0;
  if (e) {
    for (int64_t c = 0; c < n; c++) {
      e[c] = exp(scale * tf_elem_get(x, d, base + c) - m);
      s += e[c];
    }
  } else {
    for (int64_t c = 0; c < n; c++) s += exp(scale * tf_elem_get(x, d, base + c) - m);
  }
  *sum = s;
  return m;
}

/* exp(scale * x - m) of column c, as tf_cpu_row_max_sumexp computed it. */
static inline __attribute__((always_inline)) double tf_cpu_row_exp(const double *e, const void *x, tf_dtype d,
                                                                    int64_t base, int64_t c, double scale, double m) {
  return e ? e[c] : exp(scale * tf_elem_get(x, d, base + c) - m);
}

/* A thread's scratch row of n doubles for those exponentials, or NULL
 * (then they are computed twice, to the same bits). */
static inline double *tf_cpu_exp_scratch(int64_t n) { return n > 0 ? (double *)malloc((size_t)n * sizeof(double)) : NULL; }

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
tf_status tf_cpu_softmax(tf_device_ctx *ctx, const tf_softmax_args *args); /* softmax.c */
/* norm.c */
tf_status tf_cpu_norm(tf_device_ctx *ctx, const tf_norm_args *args);

tf_status tf_cpu_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *args, int64_t *bad); /* cross_entropy.c */
tf_status tf_cpu_rope(tf_device_ctx *ctx, const tf_rope_args *args);                                 /* rope.c */
tf_status tf_cpu_embedding(tf_device_ctx *ctx, const tf_embedding_args *args, int64_t *bad);       /* embedding.c */
/* masked_fill.c and adamw.c. */
tf_status tf_cpu_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                             tf_tensor *out);
tf_status tf_cpu_adamw(tf_device_ctx *ctx, const tf_adamw_update *args);

/* flash.c: FlashAttention-2's tiled algorithm (online softmax forward,
 * recomputing backward), the twin of kernels/cuda/flash/flash_attn.cu. It needs no
 * workspace (flash_workspace is 0). */
tf_status tf_cpu_flash_attention(tf_device_ctx *ctx, const tf_flash_args *args);
size_t tf_cpu_flash_workspace(tf_device_ctx *ctx, const tf_flash_args *args);

#endif
