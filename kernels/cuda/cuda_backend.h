/* The CUDA backend's entry points, for the registration (kernels/backends.c)
 * and the tests: plain C, so that C code can call into the .cu files. */
#ifndef TF_CUDA_BACKEND_H
#define TF_CUDA_BACKEND_H

#include "backend.h"
#include "prof.h"
#include "rtc.h"

#ifdef __cplusplus
extern "C" {
#endif

const tf_backend *tf_cuda_backend(void);
/* GPUs visible to the CUDA backend (0 without a driver or a GPU). */
int tf_cuda_backend_device_count(void);
/* A driver function by name, of the CUDA 12 ABI, through the runtime (tfhost
 * does not link libcuda); NULL where this driver lacks it (the error cleared). */
void *tf_cuda_driver_function(const char *name);
/* Opens cuBLAS and cuBLASLt and looks up every function the backend calls
 * (cublas_load.cu), once per process; later calls return the first call's
 * outcome. A device does this on its first use; no GPU is needed for it.
 * TF_ERR_BACKEND, naming the library and where it was looked for, when the
 * library or one of its functions is missing. */
tf_status tf_cublas_load(void);
/* cuBLAS's name for a cublasStatus_t ("cuBLAS status N" before the library is loaded). */
const char *tf_cublas_status(int status);
/* Kernels compiled at run time: NVRTC, loading and launching (rtc.cu). */
const tf_rtc_api *tf_cuda_rtc(void);
/* The profiler's GPU side: CUPTI's activity records (prof.cu). */
const tf_prof_gpu_source *tf_cuda_prof_source(void);
/* Its hardware counters: CUPTI's range profiler (counters.cu), behind the
 * counters_start, counters_pass, counters_stop and counter_names hooks of
 * that source (counters_pass's launches are counted in prof.cu). */
bool tf_cuda_counters_start(const char *const *metrics, size_t num_metrics, size_t max_kernels, bool by_pass,
                            tf_prof_counter_info *info, char *reason, size_t reason_size);
bool tf_cuda_counters_pass(bool *done, char *reason, size_t reason_size);
bool tf_cuda_counters_stop(double **values, size_t *ranges, tf_prof_counter_info *info, char *reason,
                           size_t reason_size);
/* A launch while counting (prof.cu's launch callbacks): a kernel (0), a device-to-device copy (1), or the
 * kernel that stands for a memset or a copy while kernels are replayed (2, util.cu). */
void tf_cuda_counters_launched(int kind);
/* Whether tfhost's memsets run as a kernel (while the counters replay kernels: util.cu says why). */
void tf_cuda_set_memsets_as_kernels(bool on);
/* Whether tfhost's device-to-device copies run as a kernel (in the SASS metrics' pass: util.cu says why). */
void tf_cuda_set_copies_as_kernels(bool on);
/* Those kernels' names (util.cu's), by which prof.cu knows them. */
#define TF_CUDA_MEMSET_KERNEL "tf_cuda_memset_kernel"
#define TF_CUDA_COPY_KERNEL "tf_cuda_copy_kernel"
bool tf_cuda_counter_names(const char *chip, const char *base, const char *const **names, size_t *n, char *reason,
                           size_t reason_size);

#ifdef __cplusplus
}
#endif
#endif
