/* Random tensors on the CPU: the values tf_det_random_block gives
 * (host/base/philox.h), the very bits the GPU computes, on every core. The
 * normal kinds run TF_RNG_LANES draws side by side (tf_cpu_normal2_lanes):
 * one draw's series is a chain of dependent divisions that leaves the core
 * waiting, while independent draws overlap (and vectorise). This file is
 * built with -ffp-contract=off, as philox.h's arithmetic must be. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "philox.h"
#include "elemio.h"
#include "cpu.h"

enum { TF_RNG_LANES = 8 };

/* tf_det_normal2 on TF_RNG_LANES pairs of words at once: its operations lane
 * by lane, in its order (tf_det_log, then tf_det_sincos_turns), so the same
 * bits; the selects stand for its branches. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
tf_cpu_normal2_lanes(const uint32_t *w0, const uint32_t *w1, double *z0, double *z1) {
  enum { L = TF_RNG_LANES };
  double u1[L], m[L], e[L], sl[L], s2[L], series[L], r[L];
  uint64_t bits[L];
  /* log(u1), u1 in (0, 1] */
  for (int l = 0; l < L; l++) u1[l] = ((double)w0[l] + 1.0) * 2.3283064365386962890625e-10;
  memcpy(bits, u1, sizeof bits);
  for (int l = 0; l < L; l++) {
    e[l] = (double)((int)((bits[l] >> 52) & 0x7ff) - 1022);
    bits[l] = (bits[l] & 0x000fffffffffffffull) | (1022ull << 52);
  }
  memcpy(m, bits, sizeof m);
  for (int l = 0; l < L; l++) {
    const bool low = m[l] < 0.70710678118654752440;
    m[l] = low ? m[l] * 2.0 : m[l];
    e[l] = low ? e[l] - 1.0 : e[l];
    sl[l] = (m[l] - 1.0) / (m[l] + 1.0);
    s2[l] = sl[l] * sl[l];
    series[l] = 1.0 / 23.0;
  }
  for (int k = 21; k >= 1; k -= 2)
    for (int l = 0; l < L; l++) series[l] = series[l] * s2[l] + 1.0 / (double)k;
  for (int l = 0; l < L; l++) r[l] = sqrt(-2.0 * (e[l] * 0.69314718055994530942 + 2.0 * sl[l] * series[l]));
  /* cos and sin of 2 pi u2 */
  double t[L], t2[L], sn[L], cs[L];
  int quadrant[L];
  for (int l = 0; l < L; l++) {
    const double q = tf_det_uniform(w1[l]) * 4.0;
    quadrant[l] = (int)q;
    t[l] = (q - (double)quadrant[l]) * 1.57079632679489661923;
    t2[l] = t[l] * t[l];
    sn[l] = 1.0, cs[l] = 1.0;
  }
  for (int n = 22; n >= 2; n -= 2) {
    const double dsin = (double)(n * (n + 1)), dcos = (double)(n * (n - 1));
#pragma omp simd
    for (int l = 0; l < L; l++) sn[l] = 1.0 - sn[l] * t2[l] / dsin;
#pragma omp simd
    for (int l = 0; l < L; l++) cs[l] = 1.0 - cs[l] * t2[l] / dcos;
  }
  for (int l = 0; l < L; l++) {
    const double s = sn[l] * t[l], c = cs[l];
    const int k = quadrant[l] & 3;
    const double cos_ = k == 0 ? c : k == 1 ? -s : k == 2 ? -c : s;
    const double sin_ = k == 0 ? s : k == 1 ? c : k == 2 ? -s : -c;
    z0[l] = r[l] * cos_;
    z1[l] = r[l] * sin_;
  }
}

/* Values per chunk: TF_RNG_LANES normal pairs (4 Philox blocks of the
 * normal kind), or 2 x TF_RNG_LANES truncated normals (one pair each). */
enum { TF_RNG_CHUNK = 2 * TF_RNG_LANES };

/* Elements first .. first + TF_RNG_CHUNK - 1 of a random tensor (those past
 * its end are computed and not stored). */
static void tf_cpu_random_chunk(const tf_random_args *g, int64_t first, double *v) {
  uint32_t w0[TF_RNG_LANES], w1[TF_RNG_LANES];
  double z0[TF_RNG_LANES], z1[TF_RNG_LANES];
  if (g->kind == TF_RANDOM_NORMAL) {
    /* element 4 b + p and 4 b + p + 1 from words p and p + 1 of block b */
    for (int l = 0; l < TF_RNG_LANES; l += 2) {
      tf_philox_block b = tf_philox(g->seed, g->offset + (uint64_t)(first / 4 + l / 2));
      w0[l] = b.w[0], w1[l] = b.w[1], w0[l + 1] = b.w[2], w1[l + 1] = b.w[3];
    }
    tf_cpu_normal2_lanes(w0, w1, z0, z1);
    for (int l = 0; l < TF_RNG_LANES; l++) v[2 * l] = g->a + g->b * z0[l], v[2 * l + 1] = g->a + g->b * z1[l];
    return;
  }
  if (g->kind == TF_RANDOM_TRUNC_NORMAL) {
    /* element i: the first normal of blocks offset + 4 i .. within the cut;
     * nearly always one of the first block's first pair, else the scalar
     * path draws on (from that same pair, so with the same bits) */
    for (int half = 0; half < 2; half++) {
      const int64_t base = first + half * TF_RNG_LANES;
      for (int l = 0; l < TF_RNG_LANES; l++) {
        tf_philox_block b = tf_philox(g->seed, g->offset + 4 * (uint64_t)(base + l));
        w0[l] = b.w[0], w1[l] = b.w[1];
      }
      tf_cpu_normal2_lanes(w0, w1, z0, z1);
      for (int l = 0; l < TF_RNG_LANES; l++) {
        double *out = &v[half * TF_RNG_LANES + l];
        if ((z0[l] < 0 ? -z0[l] : z0[l]) <= g->b) *out = g->a * z0[l];
        else if ((z1[l] < 0 ? -z1[l] : z1[l]) <= g->b) *out = g->a * z1[l];
        else *out = tf_det_trunc_normal(g->seed, g->offset, (uint64_t)(base + l), g->a, g->b);
      }
    }
    return;
  }
  for (int b = 0; b < TF_RNG_CHUNK / 4; b++)
    tf_det_random_block(g->seed, g->offset, (uint64_t)(first / 4 + b), (int)g->kind, g->a, g->b, &v[4 * b]);
}

tf_status tf_cpu_random(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args) {
  (void)ctx;
  const int64_t n = tf_tensor_numel(out), chunks = (n + TF_RNG_CHUNK - 1) / TF_RNG_CHUNK;
  void *data = tf_tensor_data(out);
  /* every element from its own Philox counter: the same values on any number of threads */
#pragma omp parallel for schedule(static) if (n > TF_CPU_PARALLEL_MIN)
  for (int64_t c = 0; c < chunks; c++) {
    double v[TF_RNG_CHUNK];
    const int64_t first = c * TF_RNG_CHUNK;
    tf_cpu_random_chunk(args, first, v);
    for (int j = 0; j < TF_RNG_CHUNK && first + j < n; j++) tf_elem_set(data, out->dtype, first + j, v[j]);
  }
  return TF_OK;
}
