/* The CUDA backend: device setup, memory, copies, timing and the table that
 * ties the kernel files together. Each device context owns one non-blocking
 * stream and a cuBLAS handle bound to it; everything a device does is queued
 * on that stream, so ops need no synchronisation among themselves and the
 * host waits only where it reads results (copy, synchronize, timers). */
#include "cuda_common.cuh"
#include "cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tf_event {
  cudaEvent_t event;
};

/* Releases whatever part of a state init managed to create. */
static void tf_cuda_state_release(tf_cuda_state *st) {
  tf_cuda_gemm_release(st);
  tf_cuda_side_release(st);
  if (st->blas) {
    cublasStatus_t err = tf_cublas.cublasDestroy_v2(st->blas);
    if (err != CUBLAS_STATUS_SUCCESS)
      fprintf(stderr, "tfhost: cuBLAS error in cublasDestroy: %s\n", tf_cublas_status(err));
  }
  if (st->comm) tf_cuda_report(cudaStreamDestroy(st->comm), "cudaStreamDestroy");
  if (st->stream) tf_cuda_report(cudaStreamDestroy(st->stream), "cudaStreamDestroy");
  free(st);
}

/* f32 products stay true f32 unless a call asks for TF32 through its
 * compute type, and mixed-precision (f16/bf16) products reduce in f32 like
 * the CPU twin, never in the output type. */
static const cublasMath_t tf_cuda_math_mode =
    (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

/* The steps of init that can fail, each checked; init releases the rest. */
static tf_status tf_cuda_state_create(tf_device_ctx *ctx, tf_cuda_state *st) {
  TF_TRY(tf_cuda_use_device(ctx));
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&st->multiprocessors, cudaDevAttrMultiProcessorCount, ctx->device.index));
  if (st->multiprocessors < 1) st->multiprocessors = 1;
  int major = 0, minor = 0;
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device.index));
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx->device.index));
  st->cc = major * 10 + minor;
  /* The device's stream at the highest priority: work on the side stream
   * (the optimizer beside the backward pass, model_graph.cu) takes the
   * multiprocessors the main stream's kernels leave free. */
  int least = 0, greatest = 0;
  TF_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TF_CUDA_CHECK(cudaStreamCreateWithPriority(&st->stream, cudaStreamNonBlocking, greatest));
  TF_TRY(tf_cublas_load());
  TF_CUBLAS_CHECK(tf_cublas.cublasCreate_v2(&st->blas));
  TF_CUBLAS_CHECK(tf_cublas.cublasSetStream_v2(st->blas, st->stream));
  TF_CUBLAS_CHECK(tf_cublas.cublasSetMathMode(st->blas, tf_cuda_math_mode));
  return TF_OK;
}

/* Creates the device's stream and cuBLAS handle on first use of the device. */
static tf_status tf_cuda_init(tf_device_ctx *ctx) {
  tf_cuda_state *st = (tf_cuda_state *)calloc(1, sizeof *st);
  if (!st) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the CUDA device state");
  tf_status s = tf_cuda_state_create(ctx, st);
  if (s != TF_OK) {
    tf_cuda_state_release(st);
    return s;
  }
  ctx->backend_state = st;
  return TF_OK;
}

/* Waits for queued work, then releases the stream and cuBLAS handle (the
 * allocator has already returned its segments). */
static void tf_cuda_shutdown(tf_device_ctx *ctx) {
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (!st) return;
  if (tf_cuda_use_device(ctx) != TF_OK) fprintf(stderr, "tfhost: %s\n", tf_last_error());
  tf_cuda_report(cudaStreamSynchronize(st->stream), "cudaStreamSynchronize");
  tf_cuda_state_release(st);
  ctx->backend_state = NULL;
}

/* Static facts for results files: what ran, and with which driver and libraries. */
static tf_status tf_cuda_info(tf_device_ctx *ctx, tf_device_info *info) {
  TF_TRY(tf_cuda_use_device(ctx));
  cudaDeviceProp prop;
  TF_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx->device.index));
  snprintf(info->name, sizeof info->name, "%.*s", (int)sizeof info->name - 1, prop.name);
  info->total_memory = prop.totalGlobalMem;
  info->multiprocessors = prop.multiProcessorCount;
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  TF_CUDA_CHECK(cudaDriverGetVersion(&info->driver_version));
  TF_CUDA_CHECK(cudaRuntimeGetVersion(&info->runtime_version));
  TF_CUBLAS_CHECK(tf_cublas.cublasGetVersion_v2(tf_cuda_state_of(ctx)->blas, &info->blas_version));
  return TF_OK;
}

/* A segment for the caching allocator. Running out of device memory is an
 * ordinary outcome the allocator recovers from (it frees its cache and
 * retries), so it is TF_ERR_OOM and leaves no CUDA error behind. */
static tf_status tf_cuda_raw_alloc(void *owner, size_t bytes, void **ptr) {
  tf_device_ctx *ctx = (tf_device_ctx *)owner;
  TF_TRY(tf_cuda_use_device(ctx));
  cudaError_t err = cudaMalloc(ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError(); /* clear it: the allocator will retry */
    *ptr = NULL;
    return tf_fail(TF_ERR_OOM, "out of memory: cudaMalloc of %zu bytes failed on cuda:%d", bytes, ctx->device.index);
  }
  if (err != cudaSuccess) return tf_cuda_error(err, "cudaMalloc");
  return TF_OK;
}

/* Returns a segment; cudaFree waits for the device, so no kernel still uses it. */
static void tf_cuda_raw_free(void *owner, void *ptr) {
  tf_device_ctx *ctx = (tf_device_ctx *)owner;
  if (tf_cuda_use_device(ctx) != TF_OK) fprintf(stderr, "tfhost: %s\n", tf_last_error());
  tf_cuda_report(cudaFree(ptr), "cudaFree");
}

/* Host buffers may be pageable and released as soon as this returns, so
 * every copy completes before returning, whatever its direction. */
static tf_status tf_cuda_copy(tf_device_ctx *ctx, void *dst, const void *src, size_t bytes, tf_copy_dir dir) {
  if (bytes == 0) return TF_OK;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (dir == TF_COPY_H2D || dir == TF_COPY_D2H)
    TF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, dir == TF_COPY_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                  st->stream));
  else
    TF_TRY(tf_cuda_device_copy(st, dst, src, bytes));
  TF_CUDA_CHECK(cudaStreamSynchronize(st->stream));
  return TF_OK;
}

static tf_status tf_cuda_host_alloc(tf_device_ctx *ctx, size_t bytes, void **ptr) {
  TF_TRY(tf_cuda_use_device(ctx));
  cudaError_t err = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    *ptr = NULL;
    return tf_fail(TF_ERR_OOM, "out of memory: cudaHostAlloc of %zu bytes failed", bytes);
  }
  if (err != cudaSuccess) return tf_cuda_error(err, "cudaHostAlloc");
  return TF_OK;
}

static void tf_cuda_host_free(tf_device_ctx *ctx, void *ptr) {
  (void)ctx;
  tf_cuda_report(cudaFreeHost(ptr), "cudaFreeHost");
}

/* NCCL's stream (backend.h): after what the device's stream has queued. */
static tf_status tf_cuda_comm_begin(tf_device_ctx *ctx, void **stream) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (!st->comm) TF_CUDA_CHECK(cudaStreamCreateWithFlags(&st->comm, cudaStreamNonBlocking));
  cudaEvent_t ready;
  TF_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(ready, st->stream);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(st->comm, ready, 0);
  tf_cuda_report(cudaEventDestroy(ready), "cudaEventDestroy"); /* freed once reached */
  TF_CUDA_CHECK(err);
  *stream = (void *)st->comm;
  return TF_OK;
}

static tf_status tf_cuda_comm_end(tf_device_ctx *ctx, void **event) {
  cudaEvent_t done;
  TF_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(done, tf_cuda_state_of(ctx)->comm);
  if (err != cudaSuccess) {
    tf_cuda_report(cudaEventDestroy(done), "cudaEventDestroy");
    return tf_cuda_error(err, "cudaEventRecord");
  }
  *event = (void *)done;
  return TF_OK;
}

static bool tf_cuda_comm_done(tf_device_ctx *ctx, void *event) {
  (void)ctx;
  return cudaEventQuery((cudaEvent_t)event) != cudaErrorNotReady;
}

static tf_status tf_cuda_comm_join(tf_device_ctx *ctx, void *event) {
  TF_TRY(tf_cuda_use_device(ctx));
  cudaError_t err = cudaStreamWaitEvent(tf_cuda_state_of(ctx)->stream, (cudaEvent_t)event, 0);
  tf_cuda_report(cudaEventDestroy((cudaEvent_t)event), "cudaEventDestroy");
  TF_CUDA_CHECK(err);
  return TF_OK;
}

/* Waits for everything queued on the device's stream (tf.sync, timers). */
static tf_status tf_cuda_synchronize(tf_device_ctx *ctx) {
  TF_TRY(tf_cuda_use_device(ctx));
  TF_CUDA_CHECK(cudaStreamSynchronize(tf_cuda_state_of(ctx)->stream));
  return TF_OK;
}

/* A timestamp in the device's stream, so timers measure GPU time of the
 * work queued between two of them. */
static tf_status tf_cuda_event_record(tf_device_ctx *ctx, tf_event **out) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_event *ev = (tf_event *)malloc(sizeof *ev);
  if (!ev) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a timer event");
  cudaError_t err = cudaEventCreate(&ev->event);
  if (err != cudaSuccess) {
    free(ev);
    return tf_cuda_error(err, "cudaEventCreate");
  }
  err = cudaEventRecord(ev->event, tf_cuda_state_of(ctx)->stream);
  if (err != cudaSuccess) {
    tf_status s = tf_cuda_error(err, "cudaEventRecord");
    tf_cuda_report(cudaEventDestroy(ev->event), "cudaEventDestroy");
    free(ev);
    return s;
  }
  *out = ev;
  return TF_OK;
}

/* Milliseconds between two recorded events, once the later one has happened. */
static tf_status tf_cuda_event_elapsed(tf_device_ctx *ctx, tf_event *start, tf_event *end, double *ms) {
  TF_TRY(tf_cuda_use_device(ctx));
  float elapsed = 0.0f;
  TF_CUDA_CHECK(cudaEventSynchronize(end->event));
  TF_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start->event, end->event));
  *ms = elapsed;
  return TF_OK;
}

/* Releases an event; harmless to call after a failed record returned NULL. */
static void tf_cuda_event_destroy(tf_device_ctx *ctx, tf_event *ev) {
  if (!ev) return;
  if (tf_cuda_use_device(ctx) != TF_OK) fprintf(stderr, "tfhost: %s\n", tf_last_error());
  tf_cuda_report(cudaEventDestroy(ev->event), "cudaEventDestroy");
  free(ev);
}

/* C++ has no designated initialisers before C++20: the table is filled by
 * name here, once. */
static tf_backend tf_cuda_make_table(void) {
  tf_backend b;
  memset(&b, 0, sizeof b);
  b.name = "cuda";
  b.device_count = tf_cuda_backend_device_count;
  b.init = tf_cuda_init;
  b.shutdown = tf_cuda_shutdown;
  b.info = tf_cuda_info;
  b.raw_alloc = tf_cuda_raw_alloc;
  b.raw_free = tf_cuda_raw_free;
  b.copy = tf_cuda_copy;
  b.host_alloc = tf_cuda_host_alloc;
  b.host_free = tf_cuda_host_free;
  b.synchronize = tf_cuda_synchronize;
  b.comm_begin = tf_cuda_comm_begin;
  b.comm_end = tf_cuda_comm_end;
  b.comm_done = tf_cuda_comm_done;
  b.comm_join = tf_cuda_comm_join;
  b.event_record = tf_cuda_event_record;
  b.event_elapsed_ms = tf_cuda_event_elapsed;
  b.event_destroy = tf_cuda_event_destroy;
  b.fill = tf_cuda_fill;
  b.arange = tf_cuda_arange;
  b.random = tf_cuda_random;
  b.convert = tf_cuda_convert;
  b.convert_saturate = tf_cuda_convert_saturate;
  b.unary = tf_cuda_unary;
  b.binary = tf_cuda_binary;
  b.reduce = tf_cuda_reduce;
  b.matmul = tf_cuda_matmul;
  b.softmax = tf_cuda_softmax;
  b.norm = tf_cuda_norm;
  b.cross_entropy = tf_cuda_cross_entropy;
  b.rope = tf_cuda_rope;
  b.embedding = tf_cuda_embedding;
  b.masked_fill = tf_cuda_masked_fill;
  b.adamw = tf_cuda_adamw;
  b.flash_attention = tf_cuda_flash_attention;
  b.flash_workspace = tf_cuda_flash_workspace;
  b.model = tf_cuda_model_kernels();
  return b;
}

extern "C" void *tf_cuda_driver_function(const char *name) {
  void *p = NULL;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    p = NULL;
  (void)cudaGetLastError();
  return p;
}

/* The backend table, built once (thread-safe static initialisation). */
extern "C" const tf_backend *tf_cuda_backend(void) {
  static const tf_backend table = tf_cuda_make_table();
  return &table;
}
