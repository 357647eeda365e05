/* The CPU backend's threads and BLAS (threads.c), for the layers above
 * the backends (through backends.h) and the CPU backend's own files. */
#ifndef TF_CPU_THREADS_H
#define TF_CPU_THREADS_H

#include <stdbool.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The thread count OpenMP and the BLAS use together; setting it (1..TF_CPU_MAX_THREADS);
 * TF_NUM_THREADS applied when set (an error names a bad value; tfhost
 * applies it at start, before --threads). */
enum { TF_CPU_MAX_THREADS = 4096 };
int tf_cpu_threads(void);
tf_status tf_cpu_set_threads(int n);
tf_status tf_cpu_threads_from_env(void);
/* A thread count written as text ("8"): whether it is one, in *n. */
bool tf_cpu_threads_parse(const char *text, int *n);
/* The CPU backend's loops run in parallel (each output by one thread, so
 * results do not depend on the thread count) only past this many elements. */
enum { TF_CPU_PARALLEL_MIN = 1 << 15 };
/* Multiply-adds below which a batched product stays on one thread. */
enum { TF_CPU_GEMM_PARALLEL_MIN = 1 << 18 };

/* The BLAS the CPU backend's products run on, with its build options. */
const char *tf_cpu_blas_name(void);
/* The OPENBLAS_CORETYPE that gives this CPU better kernels than OpenBLAS
 * chose for it, or NULL (another BLAS, a core it recognised, or
 * OPENBLAS_CORETYPE already set): tfhost then starts again with it, since
 * OpenBLAS picks its kernels when it loads. tf_cpu_blas_core_for is the
 * rule, from the core OpenBLAS chose and the CPU's vector units. */
const char *tf_cpu_blas_better_core(void);
const char *tf_cpu_blas_core_for(const char *chosen, bool avx2_fma, bool avx512f);

#ifdef __cplusplus
}
#endif
#endif
