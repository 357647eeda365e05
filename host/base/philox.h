/* Counter-based random numbers (Philox4x32-10) and the arithmetic that turns
 * them into uniform, normal and integer values.
 *
 * Element i of a random tensor takes word i % 4 of block offset + i / 4, so a
 * tensor's values depend only on (seed, offset, i): the CPU and the GPU
 * compute the very same bits. The normal transform (Box-Muller) uses our own
 * log and sin/cos written with + - * / and sqrt only, evaluated in double
 * without fused multiply-adds (the CUDA file that includes this is compiled
 * with --fmad=false), because library transcendentals differ between the C
 * library and CUDA in the last bit. */
#ifndef TF_PHILOX_H
#define TF_PHILOX_H

#include "hd.h"

typedef struct tf_philox_block {
  uint32_t w[4];
} tf_philox_block;

/* Philox4x32 with 10 rounds on a 128-bit counter and a 64-bit key. */
TF_HD tf_philox_block tf_philox4x32(const uint32_t ctr[4], const uint32_t key[2]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  tf_philox_block b = {{c0, c1, c2, c3}};
  return b;
}

/* Block `counter` of the stream of `seed`. */
TF_HD tf_philox_block tf_philox(uint64_t seed, uint64_t counter) {
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  return tf_philox4x32(ctr, key);
}

/* log(x) for x in (0, 1], from a series in s = (m - 1) / (m + 1). */
TF_HD double tf_det_log(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int e = (int)((bits >> 52) & 0x7ff) - 1022;
  bits = (bits & 0x000fffffffffffffull) | (1022ull << 52);
  double m;
  memcpy(&m, &bits, sizeof m); /* x = m * 2^e, m in [0.5, 1) */
  if (m < 0.70710678118654752440) {
    m = m * 2.0;
    e = e - 1;
  }
  double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  double series = 1.0 / 23.0;
  for (int k = 21; k >= 1; k -= 2) series = series * s2 + 1.0 / (double)k;
  return (double)e * 0.69314718055994530942 + 2.0 * s * series;
}

/* cos and sin of 2*pi*u for u in [0, 1), by quadrant and Taylor series. */
TF_HD void tf_det_sincos_turns(double u, double *c, double *s) {
  double q = u * 4.0;
  int k = (int)q;
  double t = (q - (double)k) * 1.57079632679489661923, t2 = t * t;
  double sn = 1.0, cs = 1.0;
  for (int n = 22; n >= 2; n -= 2) {
    sn = 1.0 - sn * t2 / (double)(n * (n + 1));
    cs = 1.0 - cs * t2 / (double)(n * (n - 1));
  }
  sn = sn * t;
  switch (k & 3) {
    case 0: *c = cs, *s = sn; break;
    case 1: *c = -sn, *s = cs; break;
    case 2: *c = -cs, *s = -sn; break;
    default: *c = sn, *s = -cs; break;
  }
}

/* Uniform double in [0, 1) from one 32-bit word. */
TF_HD double tf_det_uniform(uint32_t w) { return (double)w * 2.3283064365386962890625e-10; }

/* Standard normal pair from two words (Box-Muller). */
TF_HD void tf_det_normal2(uint32_t w0, uint32_t w1, double *z0, double *z1) {
  double u1 = ((double)w0 + 1.0) * 2.3283064365386962890625e-10; /* (0, 1] */
  double r = sqrt(-2.0 * tf_det_log(u1));
  double c, s;
  tf_det_sincos_turns(tf_det_uniform(w1), &c, &s);
  *z0 = r * c;
  *z1 = r * s;
}

/* The value of element j (0..3) of a block, as a double, for one kind:
 * 0 uniform in [a, b), 1 normal(mean a, std b), 2 integer in [a, b). */
TF_HD double tf_det_random_value(tf_philox_block blk, int j, int kind, double a, double b) {
  if (kind == 0) return a + (b - a) * tf_det_uniform(blk.w[j]);
  if (kind == 1) {
    double z0, z1;
    int p = j & 2;
    tf_det_normal2(blk.w[p], blk.w[p + 1], &z0, &z1);
    return a + b * ((j & 1) ? z1 : z0);
  }
  uint64_t range = (uint64_t)(b - a);
  return a + (double)(((uint64_t)blk.w[j] * range) >> 32);
}

/* Element i of a truncated normal tensor: std * z for the first of the 16
 * normals drawn from blocks offset + 4i .. offset + 4i + 3 with |z| <= cut
 * (the chance that none is, for cut = 3, is below 1e-40). */
TF_HD double tf_det_trunc_normal(uint64_t seed, uint64_t offset, uint64_t i, double std, double cut) {
  for (uint64_t k = 0; k < 4; k++) {
    tf_philox_block b = tf_philox(seed, offset + 4 * i + k);
    for (int p = 0; p < 4; p += 2) {
      double z0, z1;
      tf_det_normal2(b.w[p], b.w[p + 1], &z0, &z1);
      if ((z0 < 0 ? -z0 : z0) <= cut) return std * z0;
      if ((z1 < 0 ? -z1 : z1) <= cut) return std * z1;
    }
  }
  return 0.0;
}

/* The values of elements 4 blk .. 4 blk + 3 of a random tensor of this kind
 * (0 uniform, 1 normal, 2 integer, 3 truncated normal), as
 * tf_det_random_value gives them one by one, with each normal pair computed
 * once. offset is the tensor's first Philox block. */
TF_HD void tf_det_random_block(uint64_t seed, uint64_t offset, uint64_t blk, int kind, double a, double b,
                               double v[4]) {
  if (kind == 3) {
    for (int j = 0; j < 4; j++) v[j] = tf_det_trunc_normal(seed, offset, 4 * blk + (uint64_t)j, a, b);
    return;
  }
  tf_philox_block block = tf_philox(seed, offset + blk);
  if (kind == 1) {
    for (int p = 0; p < 4; p += 2) {
      double z0, z1;
      tf_det_normal2(block.w[p], block.w[p + 1], &z0, &z1);
      v[p] = a + b * z0;
      v[p + 1] = a + b * z1;
    }
    return;
  }
  for (int j = 0; j < 4; j++) v[j] = tf_det_random_value(block, j, kind, a, b);
}

#endif
