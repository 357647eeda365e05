/* The op registry and dispatch.
 *
 * Ops come in families (unary elementwise, binary elementwise with
 * broadcasting, reductions, matmul, ...). Each elementwise op is one line of
 * an X-macro list below: its code, its name, the input dtypes it accepts, how
 * its result dtype is derived, and its formula. The CPU backend and the CUDA
 * kernels both expand the same lists, so adding an op is one line here plus
 * nothing else for the elementwise families.
 *
 * The dispatch functions (tf_unary, tf_binary, ...) do every check in one
 * place: device and dtype agreement, type promotion, broadcasting, making
 * strided inputs usable; then they allocate the output and call the device's
 * backend. Backends only ever see inputs of one dtype. */
#ifndef TF_OPS_H
#define TF_OPS_H

#include <stdbool.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How an op's result dtype follows from its (promoted) input dtype. */
typedef enum tf_result_rule {
  TF_RESULT_SAME,  /* the promoted input dtype */
  TF_RESULT_FLOAT, /* integer/bool inputs are computed as f32 (exp, div, ...) */
  TF_RESULT_BOOL   /* bool (0/1 bytes), computed in the promoted input dtype (eq, isnan, ...) */
} tf_result_rule;

/* The kind of an elementwise op:
 *   ARITH: numeric inputs, result in the promoted dtype, integer kernels too;
 *   FLOAT: any input, integer and bool inputs computed in f32, float kernels;
 *   COMPARE: numeric inputs compared (or classified) in the promoted dtype,
 *     a bool result (the formula's truth, stored as 0/1), integer kernels too;
 *     the 8-bit floats too, compared on their f32 values (the only ops that
 *     take them: the others refuse, saying to cast first). */
#define TF_KIND_ARITH_DTYPES TF_DTYPES_NUMERIC
#define TF_KIND_ARITH_RULE TF_RESULT_SAME
#define TF_KIND_FLOAT_DTYPES TF_DTYPES_ALL
#define TF_KIND_FLOAT_RULE TF_RESULT_FLOAT
#define TF_KIND_COMPARE_DTYPES (TF_DTYPES_NUMERIC | TF_DTYPES_FP8)
#define TF_KIND_COMPARE_RULE TF_RESULT_BOOL
/* TF_IF_INTS_<kind>(...) keeps its arguments only for ops with integer kernels. */
#define TF_IF_INTS_ARITH(...) __VA_ARGS__
#define TF_IF_INTS_FLOAT(...)
#define TF_IF_INTS_COMPARE(...) __VA_ARGS__

/* X(CODE, name, kind, formula over x of compute type T) */
#define TF_UNARY_OPS(X)                                                     \
  X(NEG, neg, ARITH, (-x))                                                  \
  X(ABS, abs, ARITH, tf_abs(x))                                             \
  X(RELU, relu, ARITH, (x < (T)0 ? (T)0 : x))                               \
  X(SQUARE, square, ARITH, (x * x))                                         \
  X(SIGN, sign, ARITH, (T)((x > (T)0) - (x < (T)0)))                        \
  X(EXP, exp, FLOAT, tf_exp(x))                                             \
  X(LOG, log, FLOAT, tf_log(x))                                             \
  X(SQRT, sqrt, FLOAT, tf_sqrt(x))                                          \
  X(RSQRT, rsqrt, FLOAT, ((T)1 / tf_sqrt(x)))                               \
  X(SIGMOID, sigmoid, FLOAT, ((T)1 / ((T)1 + tf_exp(-x))))                  \
  X(SILU, silu, FLOAT, (x / ((T)1 + tf_exp(-x))))                           \
  X(GELU, gelu, FLOAT, ((T)0.5 * x * tf_erfc(-x * (T)0.70710678118654752440)))      \
  X(TANH, tanh, FLOAT, tf_tanh(x))                                          \
  X(SIN, sin, FLOAT, tf_sin(x))                                             \
  X(COS, cos, FLOAT, tf_cos(x))                                             \
  X(ERF, erf, FLOAT, tf_erf(x))                                             \
  X(ISNAN, isnan, COMPARE, tf_isnan(x))                                     \
  X(ISFINITE, isfinite, COMPARE, (x - x == (T)0)) /* inf - inf is NaN */

/* X(CODE, name, kind, formula over x, y of compute type T) */
#define TF_BINARY_OPS(X)                                                    \
  X(ADD, add, ARITH, (x + y))                                               \
  X(SUB, sub, ARITH, (x - y))                                               \
  X(MUL, mul, ARITH, (x * y))                                               \
  X(DIV, div, FLOAT, (x / y))                                               \
  X(MAXIMUM, maximum, ARITH, ((x > y || tf_isnan(x)) ? x : y))              \
  X(MINIMUM, minimum, ARITH, ((x < y || tf_isnan(x)) ? x : y))              \
  X(POW, pow, FLOAT, tf_pow(x, y))                                          \
  X(EQ, eq, COMPARE, (x == y))                                              \
  X(NE, ne, COMPARE, (x != y))                                              \
  X(LT, lt, COMPARE, (x < y))                                               \
  X(LE, le, COMPARE, (x <= y))                                              \
  X(GT, gt, COMPARE, (x > y))                                               \
  X(GE, ge, COMPARE, (x >= y))

#define TF_OP_CODE(CODE, name, kind, formula) TF_OP_##CODE,
typedef enum tf_unary_op { TF_UNARY_OPS(TF_OP_CODE) TF_UNARY_COUNT } tf_unary_op;
typedef enum tf_binary_op { TF_BINARY_OPS(TF_OP_CODE) TF_BINARY_COUNT } tf_binary_op;
#undef TF_OP_CODE

typedef enum tf_reduce_op { TF_REDUCE_SUM, TF_REDUCE_MEAN, TF_REDUCE_MAX, TF_REDUCE_MIN, TF_REDUCE_COUNT } tf_reduce_op;

typedef enum tf_op_family {
  TF_FAMILY_UNARY,
  TF_FAMILY_BINARY,
  TF_FAMILY_REDUCE,
  TF_FAMILY_MATMUL,
  TF_FAMILY_OTHER
} tf_op_family;

/* One entry per op: what the Lua bindings iterate to expose tf.<name>. */
typedef struct tf_op_info {
  const char *name;
  tf_op_family family;
  int code;
  unsigned dtypes;
  tf_result_rule rule;
} tf_op_info;

const tf_op_info *tf_op_registry(int *count);
const tf_op_info *tf_op_find(const char *name);
/* The name of op `code` of a family ("exp", "add", ...). */
const char *tf_op_name(tf_op_family family, int code);

/* Where the scalar goes in a tensor-scalar binary op. */
typedef enum tf_scalar_side { TF_SCALAR_NONE, TF_SCALAR_RIGHT, TF_SCALAR_LEFT } tf_scalar_side;

/* A Lua number as an operand: integer-ness decides promotion. */
typedef struct tf_scalar {
  double value;
  bool is_float;
} tf_scalar;

tf_status tf_unary(tf_unary_op op, const tf_tensor *a, tf_tensor **out);
tf_status tf_binary(tf_binary_op op, const tf_tensor *a, const tf_tensor *b, tf_tensor **out);
/* a op s (side RIGHT) or s op a (side LEFT). */
tf_status tf_binary_scalar(tf_binary_op op, const tf_tensor *a, tf_scalar s, tf_scalar_side side, tf_tensor **out);

/* Reduces over dim (negative counts from the end) or over all dims when
 * all is true. Sums of integers and bools give i64; mean needs floats. */
tf_status tf_reduce(tf_reduce_op op, const tf_tensor *a, int dim, bool all, bool keepdim, tf_tensor **out);

/* a @ b: 1-D, 2-D or batched (..., m, k) @ (..., k, n) with broadcasting of
 * batch dims; transposed views are passed to BLAS without a copy. */
tf_status tf_matmul(const tf_tensor *a, const tf_tensor *b, tf_tensor **out);

/* Copies into a new contiguous tensor of dtype on device. */
tf_status tf_to(const tf_tensor *a, tf_dtype dtype, tf_device device, tf_tensor **out);
tf_status tf_contiguous(const tf_tensor *a, tf_tensor **out);
/* a cast into an 8-bit float dtype, saturating: magnitudes beyond the
 * largest finite value (infinities too) become it, NaN stays NaN; a new
 * contiguous tensor on a's device. */
tf_status tf_to_saturated(const tf_tensor *a, tf_dtype dtype, tf_tensor **out);
/* Copies src into dst (same shape; any dtypes; same device). */
tf_status tf_copy_into(tf_tensor *dst, const tf_tensor *src);

/* Views: no data is copied when the strides allow it. */
tf_status tf_reshape(const tf_tensor *a, const tf_shape *shape, tf_tensor **out);
tf_status tf_transpose(const tf_tensor *a, int dim0, int dim1, tf_tensor **out);
/* Broadcast view of a with the given shape (stride 0 on expanded dims). */
tf_status tf_expand(const tf_tensor *a, const tf_shape *shape, tf_tensor **out);
/* Elements start..stop-1 (step 1) of dim. */
tf_status tf_narrow(const tf_tensor *a, int dim, int64_t start, int64_t length, tf_tensor **out);
/* Removes dim `dim` by taking index i along it. */
tf_status tf_select(const tf_tensor *a, int dim, int64_t index, tf_tensor **out);

/* Creation. */
tf_status tf_full(const tf_shape *shape, double value, tf_dtype dtype, tf_device device, tf_tensor **out);
tf_status tf_arange(double start, double stop, double step, tf_dtype dtype, tf_device device, tf_tensor **out);

typedef enum tf_random_kind { TF_RANDOM_UNIFORM, TF_RANDOM_NORMAL, TF_RANDOM_INT, TF_RANDOM_TRUNC_NORMAL } tf_random_kind;
/* Uniform in [a, b), normal with mean a and std b, integers in [a, b), or a
 * normal with mean 0 and std a truncated to [-b a, b a] (PyTorch's
 * trunc_normal_ with a cut at b standard deviations). */
tf_status tf_random(tf_random_kind kind, const tf_shape *shape, double a, double b, tf_dtype dtype,
                    tf_device device, tf_tensor **out);

/* Normalises a possibly negative dim against ndim; fails with a message. */
tf_status tf_wrap_dim(int dim, int ndim, int *out);

#ifdef __cplusplus
}
#endif
#endif
