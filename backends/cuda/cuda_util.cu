/* What every file of the CUDA backend uses: CUDA and cuBLAS errors as
 * tfhost statuses, the launch check, making a device current, and the
 * device count. Kept apart from the backend's table (cuda_backend.cu) so
 * that the kernel files call down into this file and the table calls the
 * kernel files, never the other way round. */
#include "cuda_common.cuh"
#include "cuda_backend.h"

#include <stdio.h>
#include <string.h>

/* Length of the function name at the start of a stringified call. */
static int tf_cuda_call_name_len(const char *call) { return (int)strcspn(call, "("); }

const char *tf_cublas_status(int status) {
  static thread_local char unnamed[32];
  if (tf_cublas.cublasGetStatusString) return tf_cublas.cublasGetStatusString((cublasStatus_t)status);
  snprintf(unnamed, sizeof unnamed, "cuBLAS status %d", status);
  return unnamed;
}

tf_status tf_cuda_error(cudaError_t err, const char *call) {
  int len = tf_cuda_call_name_len(call);
  (void)cudaGetLastError(); /* reported here: later calls must not see it again */
  if (err == cudaErrorMemoryAllocation)
    return tf_fail(TF_ERR_OOM, "out of memory: CUDA error in %.*s: %s", len, call, cudaGetErrorString(err));
  return tf_fail(TF_ERR_BACKEND, "CUDA error in %.*s: %s", len, call, cudaGetErrorString(err));
}

tf_status tf_cublas_error(cublasStatus_t err, const char *call) {
  static const char table[] = "tf_cublas."; /* calls through the loaded table are named as cuBLAS names them */
  if (strncmp(call, table, sizeof table - 1) == 0) call += sizeof table - 1;
  int len = tf_cuda_call_name_len(call);
  if (err == CUBLAS_STATUS_ALLOC_FAILED)
    return tf_fail(TF_ERR_OOM, "out of memory: cuBLAS error in %.*s: %s", len, call, tf_cublas_status(err));
  return tf_fail(TF_ERR_BACKEND, "cuBLAS error in %.*s: %s", len, call, tf_cublas_status(err));
}

void tf_cuda_report(cudaError_t err, const char *call) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError(); /* reported here: later calls must not see it again */
  /* The runtime tearing itself down at process exit already freed everything. */
  if (err == cudaErrorCudartUnloading) return;
  fprintf(stderr, "tfhost: CUDA error in %.*s: %s\n", tf_cuda_call_name_len(call), call, cudaGetErrorString(err));
}

/* Checked after every launch: kernel launches report errors only this way. */
tf_status tf_cuda_launched(const char *kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return tf_cuda_error(err, kernel);
  return TF_OK;
}

/* The device this host thread made current last; -1 before the first. */
static thread_local int tf_cuda_current_device = -1;

/* Skips cudaSetDevice when the device is already current: it is called on
 * every op. */
tf_status tf_cuda_use_device(tf_device_ctx *ctx) {
  int index = ctx->device.index;
  if (index == tf_cuda_current_device) return TF_OK;
  TF_CUDA_CHECK(cudaSetDevice(index));
  tf_cuda_current_device = index;
  return TF_OK;
}

/* Counts GPUs once; a machine without a driver or a GPU simply has none, so
 * that error is cleared rather than reported. At most TF_MAX_CUDA_DEVICES
 * are used (the device table's size). */
extern "C" int tf_cuda_backend_device_count(void) {
  static int cached = -1;
  if (cached >= 0) return cached;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError(); /* "no driver" or "no device" is an answer, not an error */
    count = 0;
  }
  cached = count < TF_MAX_CUDA_DEVICES ? count : TF_MAX_CUDA_DEVICES;
  return cached;
}
