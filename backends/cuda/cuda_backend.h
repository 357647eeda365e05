/* The CUDA backend's entry points, for the registration (backends/backends.c)
 * and the tests: plain C, so that C code can call into the .cu files. */
#ifndef TF_CUDA_BACKEND_H
#define TF_CUDA_BACKEND_H

#include "backend.h"
#include "prof.h"

#ifdef __cplusplus
extern "C" {
#endif

const tf_backend *tf_cuda_backend(void);
/* GPUs visible to the CUDA backend (0 without a driver or a GPU). */
int tf_cuda_backend_device_count(void);
/* The profiler's GPU side: CUPTI's activity records (prof_cupti.cu). */
const tf_prof_gpu_source *tf_cuda_prof_source(void);

#ifdef __cplusplus
}
#endif
#endif
