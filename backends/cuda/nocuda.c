/* Stands in for the CUDA backend in builds without the CUDA Toolkit. */
#include "backend.h"

const tf_backend *tf_cuda_backend(void) { return NULL; }
int tf_cuda_backend_device_count(void) { return 0; }
