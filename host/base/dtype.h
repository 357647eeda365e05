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
  TF_F8E4M3, /* OCP E4M3FN: max 448, NaN, no infinity (torch.float8_e4m3fn) */
  TF_F8E5M2, /* OCP E5M2: max 57344, infinities (torch.float8_e5m2) */
  TF_NDTYPES
} tf_dtype;

#define TF_DTYPE_BIT(d) (1u << (d))
#define TF_DTYPES_FLOAT (TF_DTYPE_BIT(TF_F32) | TF_DTYPE_BIT(TF_F16) | TF_DTYPE_BIT(TF_BF16) | TF_DTYPE_BIT(TF_F64))
#define TF_DTYPES_INT (TF_DTYPE_BIT(TF_I32) | TF_DTYPE_BIT(TF_I64))
#define TF_DTYPES_NUMERIC (TF_DTYPES_FLOAT | TF_DTYPES_INT)
#define TF_DTYPES_ALL (TF_DTYPES_NUMERIC | TF_DTYPE_BIT(TF_BOOL))
/* The 8-bit floats are storage types: made, cast, copied, compared, printed
 * and saved, but in none of the masks above, so the ops that compute refuse
 * them (tf_dtype_refusal words the message). */
#define TF_DTYPES_FP8 (TF_DTYPE_BIT(TF_F8E4M3) | TF_DTYPE_BIT(TF_F8E5M2))

size_t tf_dtype_size(tf_dtype d);
const char *tf_dtype_name(tf_dtype d);
bool tf_dtype_is_float(tf_dtype d);
bool tf_dtype_is_fp8(tf_dtype d);

/* What a float dtype can hold, as torch.finfo reports it: bits, the largest
 * finite value, the smallest normal and subnormal, eps (the distance from 1
 * to the next value), the mantissa bits (without the implicit one) and the
 * exponent bits. Fails on a dtype that is not a float. */
typedef struct tf_finfo {
  int bits, mantissa_bits, exponent_bits;
  double max, smallest_normal, smallest_subnormal, eps;
  bool has_inf;
} tf_finfo;
tf_status tf_dtype_finfo(tf_dtype d, tf_finfo *out);

/* The error of an op that does not take dtype d; for the 8-bit floats it
 * says to cast first. */
tf_status tf_dtype_refusal(const char *op, tf_dtype d);

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
