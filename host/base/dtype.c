#include "dtype.h"

#include <math.h>
#include <string.h>

static const struct {
  const char *name;
  size_t size;
  bool is_float;
} tf_dtype_info[TF_NDTYPES] = {
    [TF_F32] = {"f32", 4, true},  [TF_F16] = {"f16", 2, true},  [TF_BF16] = {"bf16", 2, true},
    [TF_F64] = {"f64", 8, true},  [TF_I32] = {"i32", 4, false}, [TF_I64] = {"i64", 8, false},
    [TF_BOOL] = {"bool", 1, false},
    [TF_F8E4M3] = {"f8e4m3", 1, true}, [TF_F8E5M2] = {"f8e5m2", 1, true},
};

static const struct {
  const char *alias;
  tf_dtype dtype;
} tf_dtype_aliases[] = {
    {"float32", TF_F32}, {"fp32", TF_F32},    {"float", TF_F32},    {"float16", TF_F16},
    {"fp16", TF_F16},    {"half", TF_F16},    {"bfloat16", TF_BF16}, {"float64", TF_F64},
    {"fp64", TF_F64},    {"double", TF_F64},  {"int32", TF_I32},    {"int", TF_I32},
    {"int64", TF_I64},   {"long", TF_I64},    {"float8_e4m3fn", TF_F8E4M3}, {"f8e4m3fn", TF_F8E4M3},
    {"float8_e5m2", TF_F8E5M2},
};

size_t tf_dtype_size(tf_dtype d) { return tf_dtype_info[d].size; }
const char *tf_dtype_name(tf_dtype d) { return tf_dtype_info[d].name; }
bool tf_dtype_is_float(tf_dtype d) { return tf_dtype_info[d].is_float; }
bool tf_dtype_is_fp8(tf_dtype d) { return d == TF_F8E4M3 || d == TF_F8E5M2; }

/* Each float format by its field widths; the values follow from them (an
 * IEEE-like format with bias 2^(e-1) - 1), except e4m3's largest finite
 * value: E4M3FN spends only the all-ones codes on NaN and has no infinity, so
 * its top exponent holds seven finite values (256 to 448). */
tf_status tf_dtype_finfo(tf_dtype d, tf_finfo *out) {
  static const struct {
    tf_dtype d;
    int bits, exponent_bits, mantissa_bits;
  } formats[] = {
      {TF_F64, 64, 11, 52}, {TF_F32, 32, 8, 23}, {TF_F16, 16, 5, 10},
      {TF_BF16, 16, 8, 7},  {TF_F8E4M3, 8, 4, 3}, {TF_F8E5M2, 8, 5, 2},
  };
  for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
    if (formats[i].d != d) continue;
    int e = formats[i].exponent_bits, m = formats[i].mantissa_bits;
    int emax = (1 << (e - 1)) - 1, emin = 1 - emax;
    *out = (tf_finfo){.bits = formats[i].bits, .mantissa_bits = m, .exponent_bits = e, .has_inf = d != TF_F8E4M3};
    out->eps = ldexp(1.0, -m);
    out->smallest_normal = ldexp(1.0, emin);
    out->smallest_subnormal = ldexp(1.0, emin - m);
    out->max = d == TF_F8E4M3 ? 448.0 : ldexp(2.0 - out->eps, emax);
    return TF_OK;
  }
  return tf_fail(TF_ERR_ARG, "finfo: %s is not a float dtype (f64, f32, f16, bf16, f8e4m3, f8e5m2)",
                 tf_dtype_name(d));
}

tf_status tf_dtype_refusal(const char *op, tf_dtype d) {
  if (tf_dtype_is_fp8(d))
    return tf_fail(TF_ERR_ARG, "%s does not take %s tensors: cast first (x:to(\"bf16\") or x:to(\"f32\"))", op,
                   tf_dtype_name(d));
  return tf_fail(TF_ERR_ARG, "%s does not support dtype %s", op, tf_dtype_name(d));
}

tf_status tf_dtype_parse(const char *name, tf_dtype *out) {
  for (int d = 0; d < TF_NDTYPES; d++)
    if (strcmp(name, tf_dtype_info[d].name) == 0) {
      *out = (tf_dtype)d;
      return TF_OK;
    }
  for (size_t i = 0; i < sizeof tf_dtype_aliases / sizeof tf_dtype_aliases[0]; i++)
    if (strcmp(name, tf_dtype_aliases[i].alias) == 0) {
      *out = tf_dtype_aliases[i].dtype;
      return TF_OK;
    }
  return tf_fail(TF_ERR_ARG, "unknown dtype '%s' (expected f32, f16, bf16, f64, i32, i64, bool, f8e4m3 or f8e5m2)", name);
}

/* Rank within a category: bool 0, ints 1, floats 2. */
static int tf_dtype_category(tf_dtype d) {
  if (d == TF_BOOL) return 0;
  return tf_dtype_info[d].is_float ? 2 : 1;
}

tf_dtype tf_dtype_promote(tf_dtype a, tf_dtype b) {
  if (a == b) return a;
  int ca = tf_dtype_category(a), cb = tf_dtype_category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 1) return TF_I64; /* i32 with i64 */
  if (a == TF_F64 || b == TF_F64) return TF_F64;
  return TF_F32; /* f16/bf16 with each other or with f32 */
}

tf_dtype tf_dtype_promote_scalar(tf_dtype t, bool scalar_is_float) {
  if (tf_dtype_is_float(t)) return t;
  if (scalar_is_float) return TF_F32;
  return t == TF_BOOL ? TF_I64 : t;
}
