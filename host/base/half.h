/* float <-> f16 / bf16 conversions, round to nearest even. NaN stays NaN
 * (quiet, its sign and top payload bits kept), overflow goes to infinity,
 * f16 subnormals are handled exactly. The CUDA kernels convert with the
 * hardware's instructions instead (cuda_common.cuh), which give the same
 * bits for every number and the canonical NaN. */
#ifndef TF_HALF_H
#define TF_HALF_H

#include "hd.h"

TF_HD uint16_t tf_f32_to_bf16(float f) {
  uint32_t u = tf_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

TF_HD float tf_bf16_to_f32(uint16_t h) { return tf_f32_from_bits((uint32_t)h << 16); }

TF_HD uint16_t tf_f32_to_f16(float f) {
  uint32_t x = tf_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (ax < 0x38800000u) {                                   /* f16 subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = (ax >> 13) - (112u << 10);
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

TF_HD float tf_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float f = (float)m * 5.9604644775390625e-08f; /* m * 2^-24, exact */
    return tf_f32_from_bits(tf_f32_bits(f) | sign);
  }
  if (e == 31) return tf_f32_from_bits(sign | 0x7f800000u | (m << 13));
  return tf_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
