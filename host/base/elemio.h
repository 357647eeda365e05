/* Reading and writing one element of any dtype as a double (or an int64
 * for integer-to-integer copies). Shared by the CPU backend and the CUDA
 * kernels so both convert identically: float to integer truncates toward
 * zero with NaN giving 0 and out-of-range values clamped (where C would be
 * undefined), anything to bool is "!= 0", f64 to f16/bf16/f8 goes through
 * f32 (as PyTorch does), the 8-bit floats convert by fp8.h. The saturating
 * form (tf.cast(x, dtype, {saturate = true})) clamps an 8-bit float
 * destination's out-of-range values to its largest finite value. */
#ifndef TF_ELEMIO_H
#define TF_ELEMIO_H

#include "dtype.h"
#include "fp8.h"
#include "half.h"

TF_HD int64_t tf_double_to_i64(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

TF_HD double tf_elem_get(const void *data, int d, int64_t i) {
  switch (d) {
    case TF_F32: return ((const float *)data)[i];
    case TF_F16: return tf_f16_to_f32(((const uint16_t *)data)[i]);
    case TF_BF16: return tf_bf16_to_f32(((const uint16_t *)data)[i]);
    case TF_F64: return ((const double *)data)[i];
    case TF_I32: return ((const int32_t *)data)[i];
    case TF_I64: return (double)((const int64_t *)data)[i];
    case TF_F8E4M3: return tf_f8e4m3_to_f32(((const uint8_t *)data)[i]);
    case TF_F8E5M2: return tf_f8e5m2_to_f32(((const uint8_t *)data)[i]);
    default: return ((const uint8_t *)data)[i] ? 1.0 : 0.0;
  }
}

TF_HD void tf_elem_set(void *data, int d, int64_t i, double v) {
  switch (d) {
    case TF_F32: ((float *)data)[i] = (float)v; break;
    case TF_F16: ((uint16_t *)data)[i] = tf_f32_to_f16((float)v); break;
    case TF_BF16: ((uint16_t *)data)[i] = tf_f32_to_bf16((float)v); break;
    case TF_F64: ((double *)data)[i] = v; break;
    case TF_I32: ((int32_t *)data)[i] = (int32_t)tf_double_to_i64(v, -2147483648.0, 2147483647.0); break;
    case TF_I64: ((int64_t *)data)[i] = tf_double_to_i64(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case TF_F8E4M3: ((uint8_t *)data)[i] = tf_f32_to_f8e4m3((float)v); break;
    case TF_F8E5M2: ((uint8_t *)data)[i] = tf_f32_to_f8e5m2((float)v); break;
    default: ((uint8_t *)data)[i] = v != 0.0; break;
  }
}

TF_HD int64_t tf_elem_get_int(const void *data, int d, int64_t i) {
  switch (d) {
    case TF_I32: return ((const int32_t *)data)[i];
    case TF_I64: return ((const int64_t *)data)[i];
    default: return ((const uint8_t *)data)[i] != 0;
  }
}

TF_HD void tf_elem_set_int(void *data, int d, int64_t i, int64_t v) {
  switch (d) {
    case TF_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case TF_I64: ((int64_t *)data)[i] = v; break;
    default: ((uint8_t *)data)[i] = v != 0; break;
  }
}

/* tf_elem_set into an 8-bit float with out-of-range values (infinities
 * too) stored as the largest finite value of their sign, NaN staying NaN;
 * any other dtype as tf_elem_set. */
TF_HD void tf_elem_set_saturated(void *data, int d, int64_t i, double v) {
  if (d == TF_F8E4M3)
    ((uint8_t *)data)[i] = tf_f32_to_f8e4m3_sat((float)v);
  else if (d == TF_F8E5M2)
    ((uint8_t *)data)[i] = tf_f32_to_f8e5m2_sat((float)v);
  else
    tf_elem_set(data, d, i, v);
}

/* Copies element si of src (dtype sd) to element di of dst (dtype dd). */
TF_HD void tf_elem_convert(void *dst, int dd, int64_t di, const void *src, int sd, int64_t si) {
  bool src_int = sd == TF_I32 || sd == TF_I64 || sd == TF_BOOL;
  bool dst_int = dd == TF_I32 || dd == TF_I64 || dd == TF_BOOL;
  if (src_int && dst_int)
    tf_elem_set_int(dst, dd, di, tf_elem_get_int(src, sd, si));
  else
    tf_elem_set(dst, dd, di, tf_elem_get(src, sd, si));
}

/* tf_elem_convert, saturating (tf_elem_set_saturated) into an 8-bit float. */
TF_HD void tf_elem_convert_saturated(void *dst, int dd, int64_t di, const void *src, int sd, int64_t si) {
  if (dd == TF_F8E4M3 || dd == TF_F8E5M2)
    tf_elem_set_saturated(dst, dd, di, tf_elem_get(src, sd, si));
  else
    tf_elem_convert(dst, dd, di, src, sd, si);
}

#endif
