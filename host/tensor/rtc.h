/* Kernels compiled at run time: the interface between tf.cuda.compile's binding and the CUDA backend
 * (kernels/cuda/rtc.cu), which registers it (kernels/backends.c) as it registers its backend table.
 * A build without the CUDA backend has none: tf_rtc() is NULL.
 *
 * Compiling needs no GPU (NVRTC, opened at run time on the first compile); loading and launching
 * need one. A library is loaded on one device; its kernels are launched on that device's stream, so
 * they are ordered with every other kernel of the device, timed by the profiler and captured in CUDA
 * graphs like them. */
#ifndef TF_RTC_H
#define TF_RTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { TF_RTC_MAX_PARAMS = 64 };

/* One compile. Every string is the caller's and is only read during the call. */
typedef struct tf_rtc_source {
  const char *text;
  const char *name;                 /* the file name NVRTC's log and lineinfo use */
  const char *const *options;       /* NVRTC options, "--gpu-architecture=sm_90a", ... */
  int noptions;
  const char *const *headers;       /* headers handed to NVRTC by name (#include <name>) */
  const char *const *header_names;
  int nheaders;
  const char *const *expressions;   /* name expressions: "row_softmax<256, float>" */
  int nexpressions;
} tf_rtc_source;

/* What a compile gives; free with tf_rtc_result_free. On a failed compile, ok is false, log holds
 * NVRTC's messages and code is NULL. */
typedef struct tf_rtc_result {
  bool ok;
  char *log;      /* NVRTC's log ("" when it has nothing to say) */
  void *code;     /* CUBIN for a real target (sm_90a), PTX (NUL-ended) for a virtual one (compute_90) */
  size_t size;
  bool is_cubin;
  char **lowered; /* the mangled name of each expression, in order */
  int nlowered;
} tf_rtc_result;

/* What the driver says of a kernel once its library is loaded. */
typedef struct tf_rtc_kernel_info {
  int nparams;
  size_t param_offset[TF_RTC_MAX_PARAMS], param_size[TF_RTC_MAX_PARAMS];
  int max_threads;           /* threads a block at most, given the kernel's registers */
  int registers;             /* a thread */
  size_t static_shared;      /* bytes a block */
  size_t local_bytes;        /* a thread: spills and stack */
  int max_dynamic_shared;    /* bytes a block may ask for, with the opt-in (the device's limit less static) */
  int ptx_version, binary_version;
} tf_rtc_kernel_info;

typedef struct tf_rtc_launch {
  unsigned grid[3], block[3];
  size_t shared; /* dynamic shared memory, bytes */
  void **args;   /* one pointer a parameter, as cudaLaunchKernel takes them */
  size_t *shared_allowed; /* the kernel's dynamic shared-memory limit as last set (0: the default 48 KiB) */
  void **function;        /* the kernel as its device's context has it, found on the first launch (NULL before) */
  /* the kernel, and the script line that launched it, for the message of a fault seen later: kept
   * as pointers and copied only when they change, so that a loop of launches copies nothing */
  const char *name;
  const char *site_file;
  int site_line;
} tf_rtc_launch;

/* A tiled TMA tensor map (cuTensorMapEncodeTiled's CUtensorMap) of device memory, its dimensions
 * innermost first, checked already by lua/tf/cuda.lua (tf.cuda.tensor_map) against the driver's
 * rules; the encoder says what the driver refuses all the same. */
enum { TF_RTC_TENSOR_MAP_BYTES = 128, TF_RTC_TENSOR_MAP_MAX_RANK = 5 };
typedef struct tf_rtc_tensor_map_spec {
  tf_dtype dtype; /* f8 types are encoded as bytes */
  int rank;       /* 1 to 5 */
  void *address;  /* 16-byte aligned */
  uint64_t dims[TF_RTC_TENSOR_MAP_MAX_RANK];        /* elements */
  uint64_t strides[TF_RTC_TENSOR_MAP_MAX_RANK - 1]; /* bytes, of dimensions 1 .. rank - 1 */
  uint32_t box[TF_RTC_TENSOR_MAP_MAX_RANK];         /* elements */
  uint32_t element_strides[TF_RTC_TENSOR_MAP_MAX_RANK];
  int swizzle;      /* bytes: 0 (none), 32, 64 or 128 */
  int l2_promotion; /* bytes: 0 (none), 64, 128 or 256 */
  bool oob_nan;     /* out-of-bounds elements read as NaN (else zero) */
} tf_rtc_tensor_map_spec;

/* Device limits a launch is checked against before it is made. */
typedef struct tf_rtc_limits {
  unsigned max_grid[3], max_block[3];
  int max_threads_block;
  int max_shared_optin; /* bytes a block, with the opt-in */
  int cc_major, cc_minor;
  int driver_version; /* cudaDriverGetVersion's: 13000 for CUDA 13.0 */
} tf_rtc_limits;

typedef struct tf_rtc_api {
  /* The CUDA Toolkit's include folder found at build time (cuda_fp16.h, cccl/), searched after the
   * script's own folders and before /usr/local/cuda/include. */
  const char *cuda_include;
  /* NVRTC's version (opens the library on first use: TF_ERR_BACKEND saying where it was looked for). */
  tf_status (*version)(int *major, int *minor);
  /* The real targets NVRTC can compile for, as numbers (90 for sm_90), at most n; returns how many. */
  tf_status (*targets)(int *out, int n, int *count);
  tf_status (*compile)(const tf_rtc_source *src, tf_rtc_result *out);
  void (*result_free)(tf_rtc_result *r);
  /* Loads a compiled image (CUBIN or PTX) on the context's device; *lib is freed by unload. */
  tf_status (*load)(tf_device_ctx *ctx, const void *code, void **lib);
  void (*unload)(void *lib);
  /* A kernel of a loaded library by its (lowered) name; TF_ERR_ARG naming it when it is not there.
   * Its parameters are asked for up to the declared count (info->nparams comes back smaller when
   * the code has fewer), or, when probe_more, until the driver says there is none (it has no count
   * to ask for, and that failing question shows up in compute-sanitizer's report as an API error). */
  tf_status (*kernel)(void *lib, const char *name, int declared, bool probe_more, void **kernel,
                      tf_rtc_kernel_info *info);
  tf_status (*limits)(tf_device_ctx *ctx, tf_rtc_limits *out);
  /* Launches on the context's stream; raises the kernel's dynamic shared-memory limit first when the
   * launch asks for more than *l->shared_allowed (the opt-in above 48 KiB). */
  tf_status (*launch)(tf_device_ctx *ctx, void *kernel, const tf_rtc_launch *l);
  /* Whether a fault (illegal address, trap, failed assert) made the CUDA context unusable; what
   * tfhost knows of it then, in why (the last user kernel launched and where). */
  bool (*context_lost)(char *why, size_t n);
  /* Encodes a tensor map into out (TF_RTC_TENSOR_MAP_BYTES, 64-byte aligned); TF_ERR_DEVICE where the
   * driver has no encoder, TF_ERR_ARG with the driver's refusal. */
  tf_status (*tensor_map)(const tf_rtc_tensor_map_spec *spec, void *out);
} tf_rtc_api;

/* Registered by kernels/backends.c when the build has the CUDA backend. */
void tf_rtc_register(const tf_rtc_api *api);
/* NULL in a build without the CUDA backend. */
const tf_rtc_api *tf_rtc(void);

#ifdef __cplusplus
}
#endif
#endif
