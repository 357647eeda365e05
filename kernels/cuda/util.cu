/* What every file of the CUDA backend uses: CUDA and cuBLAS errors as
 * tfhost statuses, the launch check, making a device current, and the
 * device count. Kept apart from the backend's table (backend.cu) so
 * that the kernel files call down into this file and the table calls the
 * kernel files, never the other way round. */
#include "cuda_common.cuh"
#include "cuda_backend.h"

#include <mutex>
#include <stdlib.h>
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

/* A fault in a kernel (an illegal address, a trap, a failed device assert) leaves the CUDA context
 * unusable: every later call of the process fails with it. The first one seen is kept. */
static std::atomic<bool> tf_cuda_faulted{false};
static char tf_cuda_fault_text[256];

static bool tf_cuda_sticky(cudaError_t err) {
  switch (err) {
  case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorAssert: case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace: case cudaErrorInvalidPc:
  case cudaErrorHardwareStackError: case cudaErrorLaunchTimeout: case cudaErrorECCUncorrectable:
    return true;
  default:
    return false;
  }
}

const char *tf_cuda_fault(void) { return tf_cuda_faulted.load() ? tf_cuda_fault_text : NULL; }

bool tf_cuda_launch_blocking(void) {
  static int on = -1;
  if (on < 0) {
    const char *v = getenv("CUDA_LAUNCH_BLOCKING");
    on = v && strcmp(v, "1") == 0;
  }
  return on != 0;
}

tf_status tf_cuda_error(cudaError_t err, const char *call) {
  int len = tf_cuda_call_name_len(call);
  (void)cudaGetLastError(); /* reported here: later calls must not see it again */
  if (tf_cuda_sticky(err) && !tf_cuda_faulted.load()) {
    snprintf(tf_cuda_fault_text, sizeof tf_cuda_fault_text, "%s (seen in %.*s)", cudaGetErrorString(err), len, call);
    tf_cuda_faulted.store(true);
  }
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

/* While CUPTI's range profiler replays kernels (counters.cu), a memset on
 * the stream makes CUPTI crash on its own thread when the counters stop
 * (seen on an H200, CUDA 13.0: a cudaMemsetAsync and a kernel counted
 * that way); tfhost's memsets are then this kernel, which the counters
 * count as one (prof.cu leaves it out of a pass's launches). */
std::atomic<bool> tf_cuda_memsets_as_kernels{false};

extern "C" void tf_cuda_set_memsets_as_kernels(bool on) { tf_cuda_memsets_as_kernels.store(on); }

__global__ void tf_cuda_memset_kernel(unsigned char *data, unsigned char value, size_t bytes) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
    data[i] = value;
}

tf_status tf_cuda_memset(tf_cuda_state *st, void *data, int value, size_t bytes) {
  if (bytes == 0) return TF_OK;
  if (!tf_cuda_memsets_as_kernels.load(std::memory_order_relaxed)) {
    TF_CUDA_CHECK(cudaMemsetAsync(data, value, bytes, st->stream));
    return TF_OK;
  }
  tf_cuda_memset_kernel<<<tf_cuda_blocks(st, (int64_t)bytes), TF_CUDA_THREADS, 0, st->stream>>>(
      (unsigned char *)data, (unsigned char)value, bytes);
  return tf_cuda_launched(TF_CUDA_MEMSET_KERNEL);
}

/* In the pass that replays kernels for the SASS metrics alone (counters.cu), some device-to-device
 * copies make a counted range and others none (seen on an H200, CUDA 13.0: of a fused step's three,
 * one did), so that the pass's ranges could not be told apart; tfhost's copies are then this kernel,
 * which always makes one. */
std::atomic<bool> tf_cuda_copies_as_kernels{false};

extern "C" void tf_cuda_set_copies_as_kernels(bool on) { tf_cuda_copies_as_kernels.store(on); }

__global__ void tf_cuda_copy_kernel(unsigned char *dst, const unsigned char *src, size_t bytes) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

tf_status tf_cuda_device_copy(tf_cuda_state *st, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return TF_OK;
  if (!tf_cuda_copies_as_kernels.load(std::memory_order_relaxed)) {
    TF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return TF_OK;
  }
  tf_cuda_copy_kernel<<<tf_cuda_blocks(st, (int64_t)bytes), TF_CUDA_THREADS, 0, st->stream>>>(
      (unsigned char *)dst, (const unsigned char *)src, bytes);
  return tf_cuda_launched(TF_CUDA_COPY_KERNEL);
}

/* The traffic count: one for the process, under a lock (launches may come
 * from several host threads; tf_cuda_traffic_on changes under it too);
 * kernels past TF_TRAFFIC_KERNELS names are not counted, which the count's
 * n then shows. */
std::atomic<bool> tf_cuda_traffic_on{false};
static tf_traffic tf_cuda_traffic_state;
static std::mutex tf_cuda_traffic_lock;

void tf_cuda_traffic_add(const char *kernel, double bytes) {
  std::lock_guard<std::mutex> hold(tf_cuda_traffic_lock);
  tf_traffic *t = &tf_cuda_traffic_state;
  if (!tf_cuda_traffic_on) return;
  int i = 0;
  while (i < t->n && strcmp(t->kernels[i].kernel, kernel) != 0) i++;
  if (i == TF_TRAFFIC_KERNELS) return;
  if (i == t->n) {
    t->kernels[i].kernel = kernel, t->kernels[i].calls = 0, t->kernels[i].bytes = 0;
    t->n++;
  }
  t->kernels[i].calls++;
  t->kernels[i].bytes += bytes;
}

/* A capture that fails is run again eagerly, and its launches would count
 * twice: the count as it stood at the capture's start is held and put back
 * when the capture yields no graph (if it was counting then and still is). */
static tf_traffic tf_cuda_traffic_held;
static bool tf_cuda_traffic_held_on;

void tf_cuda_traffic_hold(void) {
  std::lock_guard<std::mutex> hold(tf_cuda_traffic_lock);
  tf_cuda_traffic_held = tf_cuda_traffic_state;
  tf_cuda_traffic_held_on = tf_cuda_traffic_on;
}

void tf_cuda_traffic_restore(void) {
  std::lock_guard<std::mutex> hold(tf_cuda_traffic_lock);
  if (tf_cuda_traffic_on && tf_cuda_traffic_held_on) tf_cuda_traffic_state = tf_cuda_traffic_held;
}

void tf_cuda_traffic_count(tf_device_ctx *ctx, bool start, tf_traffic *out) {
  (void)ctx;
  std::lock_guard<std::mutex> hold(tf_cuda_traffic_lock);
  if (out) *out = tf_cuda_traffic_state;
  if (start) memset(&tf_cuda_traffic_state, 0, sizeof tf_cuda_traffic_state);
  tf_cuda_traffic_on = start;
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
