/* Random numbers: Philox known answers (Random123's test vectors), the
 * deterministic log and sin/cos against libm, the distributions, and the
 * CPU backend's fill (draws side by side, on every core) against them. */
#include <math.h>
#include <string.h>

#include "backends.h"
#include "check.h"
#include "cpu.h"
#include "philox.h"
#include "tensor.h"

static void check_block(tf_philox_block b, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  CHECK_INT(b.w[0], w0);
  CHECK_INT(b.w[1], w1);
  CHECK_INT(b.w[2], w2);
  CHECK_INT(b.w[3], w3);
}

int main(void) {
  uint32_t zero_ctr[4] = {0, 0, 0, 0}, zero_key[2] = {0, 0};
  check_block(tf_philox4x32(zero_ctr, zero_key), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  uint32_t ones_ctr[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, ones_key[2] = {0xffffffffu, 0xffffffffu};
  check_block(tf_philox4x32(ones_ctr, ones_key), 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  uint32_t pi_ctr[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, pi_key[2] = {0xa4093822u, 0x299f31d0u};
  check_block(tf_philox4x32(pi_ctr, pi_key), 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
  check_block(tf_philox(0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);

  double worst_log = 0, worst_trig = 0;
  for (int i = 1; i <= 100000; i++) {
    double x = (double)i / 100000.0 * (i % 7 == 0 ? 1e-9 : 1.0);
    double err = fabs(tf_det_log(x) - log(x)) / fabs(log(x) == 0 ? 1 : log(x));
    if (err > worst_log) worst_log = err;
    double u = (double)(i - 1) / 100000.0, c, s;
    tf_det_sincos_turns(u, &c, &s);
    double e2 = fmax(fabs(c - cos(6.283185307179586476925 * u)), fabs(s - sin(6.283185307179586476925 * u)));
    if (e2 > worst_trig) worst_trig = e2;
  }
  CHECK(worst_log < 1e-14);
  CHECK(worst_trig < 1e-14);
  CHECK_NEAR(tf_det_log(1.0), 0.0, 0.0);

  /* a whole block at once gives the very same bits as element by element */
  int block_mismatch = 0;
  for (uint64_t c = 0; c < 10000; c++)
    for (int kind = 0; kind < 3; kind++) {
      tf_philox_block b = tf_philox(99, c);
      double v[4];
      tf_det_random_block(99, 0, c, kind, -2.0, 5.0, v);
      for (int j = 0; j < 4; j++) block_mismatch += v[j] != tf_det_random_value(b, j, kind, -2.0, 5.0);
    }
  CHECK_INT(block_mismatch, 0);

  /* truncated normals stay within the cut and keep the truncated moments */
  double tsum2 = 0, tmax = 0;
  for (uint64_t i = 0; i < 200000; i++) {
    double z = tf_det_trunc_normal(5, 0, i, 2.0, 1.5);
    tsum2 += z * z;
    tmax = fmax(tmax, fabs(z));
  }
  CHECK(tmax <= 3.0);
  /* variance of a standard normal truncated at 1.5: 1 - 2 * 1.5 * phi(1.5) / (2 Phi(1.5) - 1) = 0.5518 */
  CHECK_NEAR(tsum2 / 200000 / 4.0, 0.5518, 0.01);

  /* moments of 4M normals and uniforms; integers stay in range */
  const int n = 1 << 22;
  double sum = 0, sum2 = 0, usum = 0, umin = 1, umax = 0;
  int int_out_of_range = 0, int_counts[10] = {0};
  for (int i = 0; i < n; i++) {
    tf_philox_block b = tf_philox(7, (uint64_t)i / 4);
    double z = tf_det_random_value(b, i % 4, 1, 0.0, 1.0);
    sum += z, sum2 += z * z;
    double u = tf_det_random_value(b, i % 4, 0, 0.0, 1.0);
    usum += u;
    umin = fmin(umin, u), umax = fmax(umax, u);
    double r = tf_det_random_value(b, i % 4, 2, -3.0, 7.0);
    if (r < -3 || r >= 7 || r != floor(r)) int_out_of_range++;
    else int_counts[(int)r + 3]++;
  }
  CHECK_NEAR(sum / n, 0.0, 3e-3);
  CHECK_NEAR(sqrt(sum2 / n), 1.0, 3e-3);
  CHECK_NEAR(usum / n, 0.5, 2e-3);
  CHECK(umin >= 0 && umax < 1);
  CHECK_INT(int_out_of_range, 0);
  for (int k = 0; k < 10; k++) CHECK_NEAR(int_counts[k] / (double)n, 0.1, 2e-3);

  /* the CPU backend's fill gives tf_det_random_block's very bits: every kind, lengths that end
   * inside a chunk of draws, one past the parallel threshold, and a cut so narrow (0.2) that
   * most truncated normals miss it with their first pair and take the scalar path */
  static const struct {
    tf_random_kind kind;
    double a, b;
  } kinds[] = {{TF_RANDOM_UNIFORM, -2.0, 5.0}, {TF_RANDOM_NORMAL, 0.5, 2.0}, {TF_RANDOM_INT, -3.0, 7.0},
               {TF_RANDOM_TRUNC_NORMAL, 2.0, 3.0}, {TF_RANDOM_TRUNC_NORMAL, 1.0, 0.2}};
  static const int64_t lengths[] = {1, 3, 4, 15, 16, 17, 67, 100003};
  static const uint64_t seeds[] = {1, 0xdeadbeef12345ull};
  long fill_mismatch = 0, fill_values = 0;
  tf_backends_init();
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
      for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++) {
        const int64_t len = lengths[li];
        tf_shape shape = {1, {len}};
        tf_tensor *t = NULL;
        if (!CHECK_OK(tf_tensor_empty(&shape, TF_F64, tf_cpu(), &t))) return tf_check_done();
        const tf_random_args g = {kinds[k].kind, kinds[k].a, kinds[k].b, seeds[si], 17};
        if (!CHECK_OK(tf_cpu_random(NULL, t, &g))) return tf_check_done();
        const double *got = tf_tensor_data(t);
        for (int64_t i = 0; i < len; i++) {
          double v[4];
          tf_det_random_block(seeds[si], 17, (uint64_t)i / 4, (int)kinds[k].kind, kinds[k].a, kinds[k].b, v);
          fill_mismatch += memcmp(&got[i], &v[i % 4], sizeof v[0]) != 0;
          fill_values++;
        }
        tf_tensor_release(t);
      }
  CHECK_INT(fill_mismatch, 0);
  CHECK_INT(fill_values, 2 * 5 * (1 + 3 + 4 + 15 + 16 + 17 + 67 + 100003));
  return tf_check_done();
}
