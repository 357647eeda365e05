/* The one place that knows which backends this build has: the device
 * layer and the profiler sit below the backends and learn of them here,
 * so that nothing below calls up into backend code. */
#include "backends.h"

#include "backend.h"
#include "cpu.h"
#include "prof.h"
#include "rtc.h"
#ifdef TF_WITH_CUDA
#include "cuda_backend.h"
#endif

void tf_backends_init(void) {
  tf_device_register_backend(TF_DEV_CPU, tf_cpu_backend());
#ifdef TF_WITH_CUDA
  tf_device_register_backend(TF_DEV_CUDA, tf_cuda_backend());
  tf_prof_set_gpu_source(tf_cuda_prof_source());
  tf_rtc_register(tf_cuda_rtc());
#endif
}
