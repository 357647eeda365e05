/* float <-> the two OCP 8-bit formats, the same code on the host and the GPU.
 *
 *   f8e4m3 (E4M3FN): bias 7, 3 mantissa bits, no infinity; 0x7f and 0xff are
 *     the only NaNs; largest finite 448 (0x7e).
 *   f8e5m2: bias 15, 2 mantissa bits, IEEE-like: 0x7c is infinity, 0x7d..0x7f
 *     NaN; largest finite 57344 (0x7b).
 *
 * Encoding rounds to nearest even, once, straight from the float (as
 * PyTorch's torch.float8_e4m3fn / torch.float8_e5m2 casts do; e5m2 is not
 * rounded through f16 first). A magnitude that rounds past the largest
 * finite value gives NaN in e4m3 (PyTorch's cast does not saturate: that is
 * the _sat forms) and infinity in e5m2. NaN keeps its sign. Decoding is
 * exact; a NaN decodes to the float PyTorch's CPU decoding gives: 0x7ff00000
 * for e4m3, the f16 NaN's payload quieted for e5m2, with the sign. Only
 * integer operations: no dependence on the float unit's rounding or
 * flush-to-zero modes. */
#ifndef TF_FP8_H
#define TF_FP8_H

#include "hd.h"

/* v >> s rounded to nearest, ties to even (1 <= s <= 31). */
TF_HD uint32_t tf_shift_rne(uint32_t v, uint32_t s) {
  uint32_t q = v >> s, rest = v & ((1u << s) - 1u), half = 1u << (s - 1u);
  return q + (rest > half || (rest == half && (q & 1u)));
}

/* The magnitude of an 8-bit code with m mantissa bits, from |f| as float bits
 * ax (finite and below the format's overflow threshold). emin_biased is the
 * float's biased exponent of the format's smallest normal. */
TF_HD uint32_t tf_f8_magnitude(uint32_t ax, uint32_t m, uint32_t emin_biased) {
  uint32_t e = ax >> 23;
  if (e >= emin_biased) /* normal: rebias the exponent, round the mantissa */
    return tf_shift_rne(ax - ((emin_biased - 1u) << 23), 23u - m);
  /* subnormal: |f| in units of the smallest subnormal, 2^(emin - m); below
   * half a unit (a shift past 24 bits) it is zero */
  uint32_t shift = emin_biased - e + 23u - m; /* >= 24 - m */
  if (shift > 24u) return 0;
  return tf_shift_rne((ax & 0x7fffffu) | 0x800000u, shift);
}

TF_HD uint8_t tf_f32_to_f8e4m3(float f) {
  uint32_t x = tf_f32_bits(f), ax = x & 0x7fffffffu;
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  if (ax >= 0x43f00000u) return (uint8_t)(sign | 0x7fu); /* >= 480, inf, NaN: NaN */
  return (uint8_t)(sign | tf_f8_magnitude(ax, 3u, 121u)); /* > 464 rounds to 0x7f, NaN */
}

TF_HD uint8_t tf_f32_to_f8e5m2(float f) {
  uint32_t x = tf_f32_bits(f), ax = x & 0x7fffffffu;
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);  /* NaN */
  if (ax >= 0x47800000u) return (uint8_t)(sign | 0x7cu); /* >= 65536, inf: inf */
  return (uint8_t)(sign | tf_f8_magnitude(ax, 2u, 113u)); /* >= 61440 rounds to 0x7c, inf */
}

/* The saturating casts of scaled training: a magnitude beyond the largest
 * finite value (infinity included) gives that value with its sign; NaN
 * stays NaN. */
TF_HD uint8_t tf_f32_to_f8e4m3_sat(float f) {
  uint32_t x = tf_f32_bits(f), ax = x & 0x7fffffffu;
  if (ax <= 0x7f800000u && ax > 0x43e00000u) return (uint8_t)(((x >> 24) & 0x80u) | 0x7eu);
  return tf_f32_to_f8e4m3(f);
}

TF_HD uint8_t tf_f32_to_f8e5m2_sat(float f) {
  uint32_t x = tf_f32_bits(f), ax = x & 0x7fffffffu;
  if (ax <= 0x7f800000u && ax > 0x47600000u) return (uint8_t)(((x >> 24) & 0x80u) | 0x7bu);
  return tf_f32_to_f8e5m2(f);
}

TF_HD float tf_f8e4m3_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
  if ((c & 0x7fu) == 0x7fu) return tf_f32_from_bits(sign | 0x7ff00000u);
  if (e == 0) return tf_f32_from_bits(tf_f32_bits((float)m * 0.001953125f) | sign); /* m * 2^-9 */
  return tf_f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

TF_HD float tf_f8e5m2_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 2) & 0x1fu, m = c & 3u;
  if (e == 31u) return tf_f32_from_bits(sign | 0x7f800000u | (m ? 0x400000u | (m << 21) : 0u));
  if (e == 0) return tf_f32_from_bits(tf_f32_bits((float)m * 1.52587890625e-05f) | sign); /* m * 2^-16 */
  return tf_f32_from_bits(sign | ((e + 112u) << 23) | (m << 21));
}

/* Current scaling's multiplier (FP8 training, model_kernels.h): the
 * format's max over the tensor's amax, 1 when amax is 0 or not finite (NaN
 * included), so a tensor of zeros or one already overflowed is cast as it
 * is; the largest finite float where the quotient overflows (an amax under
 * max / FLT_MAX, some 1e-36: an infinite multiplier would make its zeros
 * NaN). One f32 division, the same on the CPU and the GPU. */
TF_HD float tf_fp8_multiplier(float amax, float max) {
  if (!(amax > 0.0f && amax <= 3.40282347e38f)) return 1.0f;
  const float q = max / amax;
  return q <= 3.40282347e38f ? q : 3.40282347e38f;
}

#endif
