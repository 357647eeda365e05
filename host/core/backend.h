/* The backend interface: what a device must implement.
 *
 * The dispatch layer (ops.c) has already checked devices, dtypes and shapes
 * and allocated outputs; a backend only runs the computation. Inputs of the
 * elementwise families may be strided views (broadcast dims have stride 0);
 * outputs are always contiguous and of the same shape as the iteration
 * space. Both backends expand the op lists of ops.h. */
#ifndef TF_BACKEND_H
#define TF_BACKEND_H

#include "ops.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_copy_dir { TF_COPY_H2D, TF_COPY_D2H, TF_COPY_D2D } tf_copy_dir;

typedef struct tf_matmul_args {
  const void *a, *b;
  void *c;
  tf_dtype dtype;
  int64_t batch, m, n, k;
  /* Row-major operands: A is (m, k), or (k, m) stored when trans_a. */
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;                /* leading dimensions (row strides) */
  int64_t batch_a, batch_b, batch_c;    /* element strides between batches (0 = broadcast) */
  bool allow_tf32;
} tf_matmul_args;

typedef struct tf_random_args {
  tf_random_kind kind;
  double a, b;
  uint64_t seed, offset; /* Philox key and first counter */
} tf_random_args;

/* An opaque timestamp for tf.timer: a CUDA event or a host clock reading. */
typedef struct tf_event tf_event;

struct tf_backend {
  const char *name;
  tf_status (*init)(tf_device_ctx *ctx);
  void (*shutdown)(tf_device_ctx *ctx);
  tf_status (*info)(tf_device_ctx *ctx, tf_device_info *info);

  /* Memory, used through the caching allocator. */
  tf_status (*raw_alloc)(void *ctx, size_t bytes, void **ptr);
  void (*raw_free)(void *ctx, void *ptr);
  tf_status (*copy)(tf_device_ctx *ctx, void *dst, const void *src, size_t bytes, tf_copy_dir dir);
  tf_status (*synchronize)(tf_device_ctx *ctx);

  /* Timing. */
  tf_status (*event_record)(tf_device_ctx *ctx, tf_event **ev);
  tf_status (*event_elapsed_ms)(tf_device_ctx *ctx, tf_event *start, tf_event *end, double *ms);
  void (*event_destroy)(tf_device_ctx *ctx, tf_event *ev);

  /* Ops. */
  tf_status (*fill)(tf_device_ctx *ctx, tf_tensor *out, double value);
  tf_status (*arange)(tf_device_ctx *ctx, tf_tensor *out, double start, double step);
  tf_status (*random)(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args);
  /* Strided src of any dtype into strided dst of any dtype, same shape. */
  tf_status (*convert)(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
  tf_status (*unary)(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out);
  /* b is NULL for a scalar operand on the given side. */
  tf_status (*binary)(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, double scalar,
                      tf_scalar_side side, tf_tensor *out);
  /* a is contiguous, viewed as (outer, r, inner); out is (outer, inner). */
  tf_status (*reduce)(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                      int64_t inner, tf_tensor *out);
  tf_status (*matmul)(tf_device_ctx *ctx, const tf_matmul_args *args);
};

const tf_backend *tf_cpu_backend(void);
/* NULL when this build has no CUDA backend. */
const tf_backend *tf_cuda_backend(void);
/* GPUs visible to the CUDA backend (0 without one). */
int tf_cuda_backend_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
