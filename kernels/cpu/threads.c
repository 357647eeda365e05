/* The CPU backend's thread count, one number for OpenMP (elementwise ops,
 * reductions, norms, the CPU engine) and the BLAS (gemm.c): set by
 * tfhost --threads N, else TF_NUM_THREADS, else OpenMP's default (every
 * core, or OMP_NUM_THREADS). The BLAS itself runs each call on one
 * thread: gemm.c hands it tiles, one a thread. Results never depend on
 * the count: every parallel loop gives each output to one thread, and
 * reductions over one output add fixed chunks in a fixed order. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include TF_CBLAS_HEADER
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_threads.h"
#include "cpu.h"

int tf_cpu_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

tf_status tf_cpu_set_threads(int n) {
  if (n < 1 || n > TF_CPU_MAX_THREADS)
    return tf_fail(TF_ERR_ARG, "threads: need a count in 1..%d, not %d", TF_CPU_MAX_THREADS, n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#else
  if (n != 1) return tf_fail(TF_ERR_ARG, "threads: this build has no OpenMP: it runs on one thread");
#endif
  return TF_OK;
}

bool tf_cpu_threads_parse(const char *text, int *n) {
  if (!text || !*text) return false;
  char *end = NULL;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (*end != '\0' || errno == ERANGE || v < 1 || v > TF_CPU_MAX_THREADS) return false;
  *n = (int)v;
  return true;
}

tf_status tf_cpu_threads_from_env(void) {
  const char *env = getenv("TF_NUM_THREADS");
  if (!env || !*env) return TF_OK;
  int n;
  if (!tf_cpu_threads_parse(env, &n))
    return tf_fail(TF_ERR_ARG, "TF_NUM_THREADS must be a count in 1..%d, not '%s'", TF_CPU_MAX_THREADS, env);
  return tf_cpu_set_threads(n);
}

/* OpenBLAS's build for every x86 CPU (DYNAMIC_ARCH) falls back to generic
 * SSE3 kernels ("Prescott") on a CPU it does not recognise: Debian 12's
 * 0.3.21 does so on some virtual Xeons, where those kernels run a product
 * several times slower than its AVX-512 ones. */
const char *tf_cpu_blas_core_for(const char *chosen, bool avx2_fma, bool avx512f) {
  static const char *const generic[] = {"Prescott", "Core2", "Katmai", "Coppermine", "Northwood", "Banias", "Unknown"};
  bool fallback = false;
  for (size_t i = 0; chosen && i < sizeof generic / sizeof generic[0]; i++)
    if (strcasecmp(chosen, generic[i]) == 0) fallback = true;
  if (!fallback) return NULL;
  if (avx512f) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return NULL;
}

const char *tf_cpu_blas_better_core(void) {
#if defined(TF_BLAS_OPENBLAS) && (defined(__x86_64__) || defined(__i386__))
  if (getenv("OPENBLAS_CORETYPE")) return NULL; /* whoever set it chose */
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return tf_cpu_blas_core_for(openblas_get_corename(), avx2_fma, __builtin_cpu_supports("avx512f"));
#else
  return NULL;
#endif
}

const char *tf_cpu_blas_name(void) {
#ifdef TF_BLAS_OPENBLAS
  static char name[160];
  if (!name[0]) snprintf(name, sizeof name, "%s", openblas_get_config());
  return name;
#else
  return TF_BLAS_NAME;
#endif
}
