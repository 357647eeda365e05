/* f16 and bf16 conversions: round to nearest even, exhaustively checked
 * against the nearest representable value computed in double, plus the
 * compiler's own _Float16 where the compiler has it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "half.h"

/* The conversion h of x is correct when no neighbour of h is nearer to x,
 * and on a tie h is even. */
static bool nearest_even(float x, uint16_t h, float (*to_f32)(uint16_t)) {
  if (isnan(x)) return isnan(to_f32(h));
  double v = to_f32(h), d = fabs((double)x - v);
  if (isinf(v)) {
    /* overflow: x must be at least halfway past the largest finite value */
    uint16_t maxfin = (uint16_t)((h & 0x8000) | ((to_f32 == tf_f16_to_f32) ? 0x7bff : 0x7f7f));
    double m = to_f32(maxfin), next = m + (m - (double)to_f32((uint16_t)(maxfin - 1)));
    return fabs((double)x) >= (fabs(m) + fabs(next)) / 2 || isinf(x);
  }
  uint16_t neighbours[2] = {(uint16_t)(h + 1), (uint16_t)(h - 1)};
  if ((h & 0x7fff) == 0) neighbours[1] = (uint16_t)((h ^ 0x8000) + 1); /* across zero */
  for (int i = 0; i < 2; i++) {
    double w = to_f32(neighbours[i]);
    if (isnan(w)) continue;
    double dw = fabs((double)x - w);
    if (dw < d) return false;
    if (dw == d && (h & 1)) return false; /* tie must go to even */
  }
  return true;
}

static float random_float(void) {
  uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
  return tf_f32_from_bits(u);
}

int main(void) {
  /* every f16 and bf16 value survives the round trip through f32 */
  int f16_bad = 0, bf16_bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tf_f16_to_f32((uint16_t)h);
    if (!isnan(f) && tf_f32_to_f16(f) != h) f16_bad++;
    float g = tf_bf16_to_f32((uint16_t)h);
    if (!isnan(g) && tf_f32_to_bf16(g) != h) bf16_bad++;
  }
  CHECK_INT(f16_bad, 0);
  CHECK_INT(bf16_bad, 0);

  /* known values */
  CHECK_INT(tf_f32_to_f16(1.0f), 0x3c00);
  CHECK_INT(tf_f32_to_f16(65504.0f), 0x7bff);
  CHECK_INT(tf_f32_to_f16(65520.0f), 0x7c00);           /* tie past the max goes to inf */
  CHECK_INT(tf_f32_to_f16(65519.996f), 0x7bff);
  CHECK_INT(tf_f32_to_f16(5.9604644775390625e-08f), 1); /* smallest subnormal */
  CHECK_INT(tf_f32_to_f16(2.98023223876953125e-08f), 0); /* exactly half of it: tie to even (0) */
  CHECK_INT(tf_f32_to_f16(-0.0f), 0x8000);
  CHECK(isnan(tf_f16_to_f32(tf_f32_to_f16(NAN))));
  CHECK_INT(tf_f32_to_bf16(1.0f), 0x3f80);
  CHECK_INT(tf_f32_to_bf16(tf_f32_from_bits(0x3f808000u)), 0x3f80); /* tie to even, down */
  CHECK_INT(tf_f32_to_bf16(tf_f32_from_bits(0x3f818000u)), 0x3f82); /* tie to even, up */
  CHECK(isnan(tf_bf16_to_f32(tf_f32_to_bf16(NAN))));
  CHECK_INT(tf_f32_to_bf16(INFINITY), 0x7f80);

  /* random floats (every exponent) and values near the rounding boundaries */
  srand(42);
  int f16_wrong = 0, bf16_wrong = 0, vs_compiler = 0;
  for (int i = 0; i < 2000000; i++) {
    float x = i % 2 ? random_float() : (float)((rand() / (double)RAND_MAX - 0.5) * 1e5);
    if (i % 5 == 0) x = tf_f16_to_f32((uint16_t)rand()) + tf_f32_from_bits(0x33800000u) * ((rand() % 3) - 1.0f);
    if (!nearest_even(x, tf_f32_to_f16(x), tf_f16_to_f32)) f16_wrong++;
    if (!nearest_even(x, tf_f32_to_bf16(x), tf_bf16_to_f32)) {
      bf16_wrong++;
      fprintf(stderr, "bf16 %a -> %04x\n", (double)x, tf_f32_to_bf16(x));
    }
#ifdef __FLT16_MAX__
    _Float16 ref = (_Float16)x;
    uint16_t rb;
    memcpy(&rb, &ref, sizeof rb);
    if (!isnan(x) && rb != tf_f32_to_f16(x)) vs_compiler++;
#endif
  }
  CHECK_INT(f16_wrong, 0);
  CHECK_INT(bf16_wrong, 0);
  CHECK_INT(vs_compiler, 0);
  return tf_check_done();
}
