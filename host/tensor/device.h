/* Devices and their per-device state.
 *
 * Every device (the CPU and each CUDA GPU) has its own context: backend,
 * caching allocator, random generator and backend state (stream, cuBLAS
 * handle). Nothing device-specific lives in a process-wide global, so one
 * process can later drive one GPU of several (data-parallel ranks). */
#ifndef TF_DEVICE_H
#define TF_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "device_id.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tf_backend tf_backend;

typedef struct tf_device_ctx {
  tf_device device;
  const tf_backend *backend;
  tf_allocator alloc;
  uint64_t rng_seed;   /* Philox key */
  uint64_t rng_offset; /* Philox counter consumed so far */
  bool allow_tf32;     /* f32 matmuls may use TF32 tensor cores */
  void *backend_state; /* stream, cuBLAS handle, ... (CUDA) */
  bool ready;
} tf_device_ctx;

/* Static facts about a device, for results files and tf.device(). */
typedef struct tf_device_info {
  char name[128];
  size_t total_memory;
  int multiprocessors;
  int cc_major, cc_minor;
  int driver_version;  /* e.g. 13000 */
  int runtime_version; /* CUDA runtime the binary was linked with */
  int blas_version;    /* cuBLAS */
} tf_device_info;

/* "cpu", "cuda", "cuda:N", "gpu" */
tf_status tf_device_parse(const char *s, tf_device *out);
/* "cpu" or "cuda:N" */
void tf_device_format(tf_device d, char *buf, size_t n);

/* Whether this build has the CUDA backend, and how many GPUs it sees. */
bool tf_cuda_compiled(void);
int tf_cuda_device_count(void);

/* The context of a device, initialised on first use. Fails with a clear
 * message for a GPU when there is none, or an index out of range. */
tf_status tf_device_ctx_get(tf_device d, tf_device_ctx **out);

/* Called with each device context as it becomes ready (before anything
 * is allocated on it), and at once with those that already are: how the
 * host caps the memory of a device a script first uses late (tfhost
 * --memory-limit, --safe). NULL: none. */
void tf_device_set_ready_hook(void (*hook)(tf_device_ctx *ctx));

/* The device tensors go to when a script names none: cuda:0 when a GPU is
 * present, else the CPU, unless changed (--device). */
tf_device tf_default_device(void);
tf_status tf_set_default_device(tf_device d);

tf_status tf_device_info_get(tf_device d, tf_device_info *info);

/* Waits for all work queued on the device. */
tf_status tf_device_sync(tf_device d);
/* A host buffer for copies to and from device d: page-locked where the
 * backend has such memory (CUDA), else plain; free it with the same d. */
tf_status tf_device_host_alloc(tf_device d, size_t bytes, void **out);
void tf_device_host_free(tf_device d, void *p);
/* Waits for every device in use; the first failure is returned. */
tf_status tf_devices_sync_all(void);

/* Reseeds every device's generator (and those created later). */
void tf_seed_all(uint64_t seed);
uint64_t tf_current_seed(void);

/* Whether the environment variable `name` is set to exactly `value` (the
 * switches that turn a kernel path off, such as TF_CUBLASLT=0). */
bool tf_env_is(const char *name, const char *value);

/* Releases every device context (at exit). */
void tf_devices_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
