/* The rule that moves OpenBLAS off its generic kernels (kernels/cpu/threads.c):
 * only a generic fallback is replaced, by the best kernels the CPU's vector
 * units allow, and a CPU without AVX2 keeps what OpenBLAS chose. This
 * machine's own case runs end to end in tests/cli/test_cli.py. */
#include <string.h>

#include "check.h"
#include "cpu_threads.h"

static bool is(const char *got, const char *want) { return got && want ? strcmp(got, want) == 0 : got == want; }

int main(void) {
  /* generic fallbacks, whatever their case */
  CHECK(is(tf_cpu_blas_core_for("Prescott", true, true), "SkylakeX"));
  CHECK(is(tf_cpu_blas_core_for("prescott", true, false), "Haswell"));
  CHECK(is(tf_cpu_blas_core_for("Core2", true, false), "Haswell"));
  CHECK(is(tf_cpu_blas_core_for("Unknown", false, true), "SkylakeX"));
  /* no better kernels to be had */
  CHECK(is(tf_cpu_blas_core_for("Prescott", false, false), NULL));
  /* a core OpenBLAS recognised stays, even where another might be faster */
  CHECK(is(tf_cpu_blas_core_for("Haswell", true, true), NULL));
  CHECK(is(tf_cpu_blas_core_for("Cooperlake", true, true), NULL));
  CHECK(is(tf_cpu_blas_core_for("Zen", true, false), NULL));
  CHECK(is(tf_cpu_blas_core_for(NULL, true, true), NULL));
  return tf_check_done();
}
