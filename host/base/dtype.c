#include "dtype.h"

#include <string.h>

static const struct {
  const char *name;
  size_t size;
  bool is_float;
} tf_dtype_info[TF_NDTYPES] = {
    [TF_F32] = {"f32", 4, true},  [TF_F16] = {"f16", 2, true},  [TF_BF16] = {"bf16", 2, true},
    [TF_F64] = {"f64", 8, true},  [TF_I32] = {"i32", 4, false}, [TF_I64] = {"i64", 8, false},
    [TF_BOOL] = {"bool", 1, false},
};

static const struct {
  const char *alias;
  tf_dtype dtype;
} tf_dtype_aliases[] = {
    {"float32", TF_F32}, {"fp32", TF_F32},    {"float", TF_F32},    {"float16", TF_F16},
    {"fp16", TF_F16},    {"half", TF_F16},    {"bfloat16", TF_BF16}, {"float64", TF_F64},
    {"fp64", TF_F64},    {"double", TF_F64},  {"int32", TF_I32},    {"int", TF_I32},
    {"int64", TF_I64},   {"long", TF_I64},
};

size_t tf_dtype_size(tf_dtype d) { return tf_dtype_info[d].size; }
const char *tf_dtype_name(tf_dtype d) { return tf_dtype_info[d].name; }
bool tf_dtype_is_float(tf_dtype d) { return tf_dtype_info[d].is_float; }

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
  return tf_fail(TF_ERR_ARG, "unknown dtype '%s' (expected f32, f16, bf16, f64, i32, i64 or bool)", name);
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
