/* Scalar math used by the elementwise op formulas (ops.h), spelled the same
 * way for the C backend (C11 _Generic) and the CUDA kernels (overloads), so
 * each formula is written once. Half types are computed in float. */
#ifndef TF_OPMATH_H
#define TF_OPMATH_H

#include <math.h>
#include <stdint.h>

#include "hd.h"

#ifdef __CUDACC__
#define TF_MATH1(name, ffn, dfn)                        \
  TF_HD float name(float x) { return ffn(x); }          \
  TF_HD double name(double x) { return dfn(x); }
TF_MATH1(tf_exp, expf, exp)
TF_MATH1(tf_log, logf, log)
TF_MATH1(tf_sqrt, sqrtf, sqrt)
TF_MATH1(tf_tanh, tanhf, tanh)
TF_MATH1(tf_erf, erff, erf)
TF_MATH1(tf_erfc, erfcf, erfc)
TF_MATH1(tf_sin, sinf, sin)
TF_MATH1(tf_cos, cosf, cos)
TF_MATH1(tf_fabs, fabsf, fabs)
#undef TF_MATH1
TF_HD float tf_pow(float x, float y) { return powf(x, y); }
TF_HD double tf_pow(double x, double y) { return pow(x, y); }
template <typename T> TF_HD bool tf_isnan(T) { return false; }
TF_HD bool tf_isnan(float x) { return isnan(x); }
TF_HD bool tf_isnan(double x) { return isnan(x); }
template <typename T> TF_HD T tf_abs(T x) { return x < 0 ? -x : x; }
TF_HD float tf_abs(float x) { return fabsf(x); }
TF_HD double tf_abs(double x) { return fabs(x); }
#else
#define TF_GENERIC1(x, ffn, dfn) _Generic((x), float: ffn, double: dfn)(x)
#define tf_exp(x) TF_GENERIC1(x, expf, exp)
#define tf_log(x) TF_GENERIC1(x, logf, log)
#define tf_sqrt(x) TF_GENERIC1(x, sqrtf, sqrt)
#define tf_tanh(x) TF_GENERIC1(x, tanhf, tanh)
#define tf_erf(x) TF_GENERIC1(x, erff, erf)
#define tf_erfc(x) TF_GENERIC1(x, erfcf, erfc)
#define tf_sin(x) TF_GENERIC1(x, sinf, sin)
#define tf_cos(x) TF_GENERIC1(x, cosf, cos)
#define tf_pow(x, y) _Generic((x), float: powf, double: pow)(x, y)
static inline int32_t tf_iabs32(int32_t x) { return x < 0 ? -x : x; }
static inline int64_t tf_iabs64(int64_t x) { return x < 0 ? -x : x; }
static inline int tf_isnan_f(float x) { return isnan(x); }
static inline int tf_isnan_d(double x) { return isnan(x); }
static inline int tf_isnan_i32(int32_t x) { (void)x; return 0; }
static inline int tf_isnan_i64(int64_t x) { (void)x; return 0; }
#define tf_isnan(x) _Generic((x), float: tf_isnan_f, double: tf_isnan_d, int32_t: tf_isnan_i32, int64_t: tf_isnan_i64)(x)
#define tf_abs(x) _Generic((x), float: fabsf, double: fabs, int32_t: tf_iabs32, int64_t: tf_iabs64)(x)
#endif

#endif
