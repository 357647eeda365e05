/* exp(x) in double without a call, so that loops over it vectorise (the
 * cross-entropy's f32 rows, cross_entropy.c): within 2 units in the
 * last place of libm's exp over [-708, 709.78], 0 below -708 (where exp is
 * under 2^-1021, far below what an f32 result can hold), inf above, NaN
 * for NaN. Branch-free: x = k ln 2 + r with k = round(x / ln 2) (by adding
 * and subtracting 1.5 2^52, which rounds to nearest), ln 2 in two parts so
 * that r is exact to about 2^-60, |r| <= 0.35; e^r by its Taylor series to
 * r^13 in Horner form (truncation under 5e-18); then 2 e^r (exact) times
 * 2^(k - 1), built in the exponent bits (k - 1 stays in the normal range
 * where k itself would reach 1024). Built without contraction into FMA
 * (CMakeLists.txt), so every instruction set gives the same bits. */
#ifndef TF_CPU_EXP_H
#define TF_CPU_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) double tf_cpu_exp(double x) {
  const double shifter = 6755399441055744.0; /* 1.5 * 2^52 */
  const double xc = !(x >= -708.0) ? -708.0 : x > 709.78 ? 709.78 : x; /* NaN too: its result is chosen below */
  const double kd = xc * 1.4426950408889634 + shifter, k = kd - shifter;
  const double r = (xc - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0; /* 1 / 13! */
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  uint64_t kbits, scale_bits;
  memcpy(&kbits, &kd, sizeof kbits);
  scale_bits = (kbits - 0x4338000000000000ULL + 1022) << 52; /* (k - 1) + 1023 in the exponent field */
  double scale;
  memcpy(&scale, &scale_bits, sizeof scale);
  const double y = (p * 2.0) * scale;
  return x != x ? x : x < -708.0 ? 0.0 : x > 709.78 ? INFINITY : y;
}

#endif
