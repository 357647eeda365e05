/* Element types. The order of the enum is part of the op tables (kernels are
 * indexed by dtype), so append only. */
#ifndef TF_DTYPE_H
#define TF_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_dtype {
  TF_F32 = 0,
  TF_F16,
  TF_BF16,
  TF_F64,
  TF_I32,
  TF_I64,
  TF_BOOL,
  TF_NDTYPES
} tf_dtype;

#define TF_DTYPE_BIT(d) (1u << (d))
#define TF_DTYPES_FLOAT (TF_DTYPE_BIT(TF_F32) | TF_DTYPE_BIT(TF_F16) | TF_DTYPE_BIT(TF_BF16) | TF_DTYPE_BIT(TF_F64))
#define TF_DTYPES_INT (TF_DTYPE_BIT(TF_I32) | TF_DTYPE_BIT(TF_I64))
#define TF_DTYPES_NUMERIC (TF_DTYPES_FLOAT | TF_DTYPES_INT)
#define TF_DTYPES_ALL (TF_DTYPES_NUMERIC | TF_DTYPE_BIT(TF_BOOL))

size_t tf_dtype_size(tf_dtype d);
const char *tf_dtype_name(tf_dtype d);
bool tf_dtype_is_float(tf_dtype d);

/* Parses "f32", "float32", "fp32", "bf16", "i64", ... */
tf_status tf_dtype_parse(const char *name, tf_dtype *out);

/* PyTorch's promote_types: bool < ints < floats; f16 with bf16 gives f32. */
tf_dtype tf_dtype_promote(tf_dtype a, tf_dtype b);

/* The dtype of `tensor op scalar` (PyTorch: a Python number does not widen a
 * tensor within its category; a float scalar makes an integer tensor f32). */
tf_dtype tf_dtype_promote_scalar(tf_dtype t, bool scalar_is_float);

#ifdef __cplusplus
}
#endif
#endif
