/* Internals shared by the CPU backend's files. */
#ifndef TF_CPU_H
#define TF_CPU_H

#include "backend.h"
#include "cpu_threads.h"
#include "half.h"

/* The CPU backend's table (host-timed by the profiler's wrapper), which
 * tf_backends_init registers for the CPU. */
const tf_backend *tf_cpu_backend(void);

#define TF_LOAD_ID(v) (v)
#define TF_STORE_ID(v) (v)

/* Y(suffix, DTYPE, storage type, compute type, load, store, ...) for each
 * dtype that elementwise kernels are instantiated for. i32 computes in
 * int64 so that intermediate results never overflow. */
#define TF_CPU_FLOAT_TYPES(Y, ...)                                           \
  Y(f32, TF_F32, float, float, TF_LOAD_ID, TF_STORE_ID, __VA_ARGS__)         \
  Y(f16, TF_F16, uint16_t, float, tf_f16_to_f32, tf_f32_to_f16, __VA_ARGS__) \
  Y(bf16, TF_BF16, uint16_t, float, tf_bf16_to_f32, tf_f32_to_bf16, __VA_ARGS__) \
  Y(f64, TF_F64, double, double, TF_LOAD_ID, TF_STORE_ID, __VA_ARGS__)
#define TF_CPU_INT_TYPES(Y, ...)                                             \
  Y(i32, TF_I32, int32_t, int64_t, TF_LOAD_ID, (int32_t), __VA_ARGS__)       \
  Y(i64, TF_I64, int64_t, int64_t, TF_LOAD_ID, TF_STORE_ID, __VA_ARGS__)

/* Calls fn(D, ...) with D the dtype d as a compile-time constant for the
 * float dtypes (any other d passed as it is), so that an always-inlined fn
 * has the element loads and stores of elemio.h folded into plain typed ones
 * (the switch over the dtype gone from the inner loops, which can then be
 * vectorised): the same arithmetic, so the same bits, several times faster. */
#define TF_CPU_WITH_DTYPE(d, fn, ...)              \
  do {                                             \
    switch (d) {                                   \
      case TF_F32: fn(TF_F32, __VA_ARGS__); break;   \
      case TF_BF16: fn(TF_BF16, __VA_ARGS__); break; \
      case TF_F16: fn(TF_F16, __VA_ARGS__); break;   \
      case TF_F64: fn(TF_F64, __VA_ARGS__); break;   \
      default: fn(d, __VA_ARGS__); break;            \
    }                                              \
  } while (0)
#define TF_CPU_INLINE static inline __attribute__((always_inline))

/* Visits an iteration space row by row: shape is the output's shape (the
 * output is contiguous), st0/st1 the element strides of up to two inputs
 * over it (NULL when absent). Dims are collapsed where every operand allows,
 * so rows are as long as possible. */
typedef void (*tf_cpu_row_fn)(void *ud, int64_t out_off, int64_t off0, int64_t off1, int64_t n, int64_t s0,
                              int64_t s1);
void tf_cpu_for_rows(const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1, tf_cpu_row_fn fn, void *ud);

tf_status tf_cpu_unary(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out);
tf_status tf_cpu_binary(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, double scalar,
                        tf_scalar_side side, tf_tensor *out);
tf_status tf_cpu_convert(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
tf_status tf_cpu_convert_saturate(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
tf_status tf_cpu_reduce(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                        int64_t inner, tf_tensor *out);
tf_status tf_cpu_matmul(tf_device_ctx *ctx, const tf_matmul_args *args); /* gemm.c, with the engine's GEMM */
tf_status tf_cpu_fill(tf_device_ctx *ctx, tf_tensor *out, double value);
tf_status tf_cpu_arange(tf_device_ctx *ctx, tf_tensor *out, double start, double step);
tf_status tf_cpu_random(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args);

#endif
