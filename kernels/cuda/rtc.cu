/* Kernels compiled at run time (host/tensor/rtc.h): NVRTC compiles, the runtime's library API
 * (cudaLibraryLoadData) loads, the driver's cuLaunchKernel launches on the device's stream.
 *
 * NVRTC is opened at run time on the first compile, as cuBLAS is (cublas_load.cu): tfhost starts
 * where it is absent and says where it looked when asked to compile. Compiling needs no GPU.
 * A launch is one driver call on the kernel's function in its device's context (found once, on the
 * first launch): the runtime's cudaLaunchKernel on a library's kernel finds that function again at
 * every launch. The driver's launch calls are what the profiler follows (prof.cu) and what stream
 * capture records, so these kernels are timed, correlated and captured like every other. */
#include "cuda_common.cuh"
#include "cuda_backend.h"
#include "rtc.h"

#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- NVRTC, opened at run time ------------------------------------------------------------------ */

#define TF_NVRTC_FUNCTIONS(X)                                                                             \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) X(nvrtcCompileProgram) \
  X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetCUBINSize)     \
  X(nvrtcGetCUBIN) X(nvrtcAddNameExpression) X(nvrtcGetLoweredName) X(nvrtcGetNumSupportedArchs)             \
  X(nvrtcGetSupportedArchs)

static struct {
#define TF_NVRTC_MEMBER(name) decltype(&::name) name;
  TF_NVRTC_FUNCTIONS(TF_NVRTC_MEMBER)
#undef TF_NVRTC_MEMBER
} tf_nvrtc;

/* libnvrtc.so.<major>: the major version of the toolkit tfhost was built with */
#define TF_NVRTC_NUMBER(n) #n
#define TF_NVRTC_SONAME_OF(n) "libnvrtc.so." TF_NVRTC_NUMBER(n)
#define TF_NVRTC_SONAME TF_NVRTC_SONAME_OF(TF_CUDA_MAJOR)

static pthread_once_t tf_nvrtc_once = PTHREAD_ONCE_INIT;
static char tf_nvrtc_failure[768];

static void tf_nvrtc_open(void) {
  static const char *const where[] = {TF_NVRTC_SONAME, TF_CUDA_LIBDIR "/" TF_NVRTC_SONAME,
                                      "/usr/local/cuda/lib64/" TF_NVRTC_SONAME};
  void *lib = NULL;
  char first[384] = "";
  for (size_t i = 0; i < sizeof where / sizeof where[0] && !lib; i++) {
    lib = dlopen(where[i], RTLD_LAZY | RTLD_LOCAL);
    if (!lib && i == 0) snprintf(first, sizeof first, "%s", dlerror());
  }
  if (!lib) {
    snprintf(tf_nvrtc_failure, sizeof tf_nvrtc_failure,
             "NVRTC, the CUDA run-time compiler, could not be loaded (%s; not in " TF_CUDA_LIBDIR
             " or /usr/local/cuda/lib64 either): install the CUDA Toolkit's NVRTC %d (libnvrtc), or name "
             "its folder in LD_LIBRARY_PATH",
             first, TF_CUDA_MAJOR);
    return;
  }
#define TF_NVRTC_FIND(name)                                                                              \
  tf_nvrtc.name = (decltype(tf_nvrtc.name))dlsym(lib, #name);                                            \
  if (!tf_nvrtc.name && !tf_nvrtc_failure[0])                                                             \
    snprintf(tf_nvrtc_failure, sizeof tf_nvrtc_failure, "found no %s in " TF_NVRTC_SONAME ": it is not the " \
             "NVRTC tfhost was built with (CUDA %d)", #name, TF_CUDA_MAJOR);
  TF_NVRTC_FUNCTIONS(TF_NVRTC_FIND)
#undef TF_NVRTC_FIND
  if (tf_nvrtc_failure[0]) memset(&tf_nvrtc, 0, sizeof tf_nvrtc);
}

static tf_status tf_nvrtc_load(void) {
  pthread_once(&tf_nvrtc_once, tf_nvrtc_open);
  if (tf_nvrtc_failure[0]) return tf_fail(TF_ERR_BACKEND, "%s", tf_nvrtc_failure);
  return TF_OK;
}

#define TF_NVRTC_CHECK(call)                                                                               \
  do {                                                                                                     \
    nvrtcResult tf_nvrtc_res_ = (call);                                                                    \
    if (tf_nvrtc_res_ != NVRTC_SUCCESS) {                                                                  \
      st = tf_fail(TF_ERR_BACKEND, "NVRTC error in %s: %s", #call, tf_nvrtc.nvrtcGetErrorString(tf_nvrtc_res_)); \
      goto done;                                                                                           \
    }                                                                                                      \
  } while (0)

static tf_status tf_rtc_version(int *major, int *minor) {
  tf_status st = tf_nvrtc_load();
  if (st != TF_OK) return st;
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcVersion(major, minor));
done:
  return st;
}

static tf_status tf_rtc_targets(int *out, int n, int *count) {
  tf_status st = tf_nvrtc_load();
  if (st != TF_OK) return st;
  int all[128], k = 0;
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetNumSupportedArchs(&k));
  if (k > 128) k = 128;
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetSupportedArchs(all));
  *count = k < n ? k : n;
  memcpy(out, all, (size_t)*count * sizeof *out);
done:
  return st;
}

static void tf_rtc_result_free(tf_rtc_result *r) {
  free(r->log);
  free(r->code);
  for (int i = 0; i < r->nlowered; i++) free(r->lowered[i]);
  free(r->lowered);
  memset(r, 0, sizeof *r);
}

static char *tf_rtc_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = (char *)malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static tf_status tf_rtc_compile(const tf_rtc_source *src, tf_rtc_result *out) {
  memset(out, 0, sizeof *out);
  tf_status st = tf_nvrtc_load();
  if (st != TF_OK) return st;
  nvrtcProgram prog = NULL;
  size_t size = 0;
  nvrtcResult compiled;
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcCreateProgram(&prog, src->text, src->name, src->nheaders, src->headers,
                                             src->header_names));
  for (int i = 0; i < src->nexpressions; i++) TF_NVRTC_CHECK(tf_nvrtc.nvrtcAddNameExpression(prog, src->expressions[i]));
  compiled = tf_nvrtc.nvrtcCompileProgram(prog, src->noptions, src->options);
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetProgramLogSize(prog, &size));
  out->log = (char *)calloc(size + 1, 1);
  if (!out->log) {
    st = tf_fail(TF_ERR_OOM, "out of memory: NVRTC's log of %zu bytes", size);
    goto done;
  }
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetProgramLog(prog, out->log));
  if (compiled == NVRTC_ERROR_COMPILATION) goto done; /* ok stays false: the log says why */
  TF_NVRTC_CHECK(compiled);
  /* a real target gives a CUBIN; a virtual one (compute_90) only PTX, for the driver to finish */
  TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetCUBINSize(prog, &size));
  out->is_cubin = size > 0;
  if (!out->is_cubin) TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetPTXSize(prog, &size));
  out->code = malloc(size);
  out->lowered = (char **)calloc((size_t)src->nexpressions + 1, sizeof *out->lowered);
  if (!out->code || !out->lowered) {
    st = tf_fail(TF_ERR_OOM, "out of memory: the compiled code (%zu bytes)", size);
    goto done;
  }
  out->size = size;
  if (out->is_cubin)
    TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetCUBIN(prog, (char *)out->code));
  else
    TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetPTX(prog, (char *)out->code));
  for (int i = 0; i < src->nexpressions; i++) {
    const char *lowered = NULL;
    TF_NVRTC_CHECK(tf_nvrtc.nvrtcGetLoweredName(prog, src->expressions[i], &lowered));
    if (!(out->lowered[i] = tf_rtc_strdup(lowered))) {
      st = tf_fail(TF_ERR_OOM, "out of memory: a kernel's name");
      goto done;
    }
    out->nlowered = i + 1;
  }
  out->ok = true;
done:
  if (prog) tf_nvrtc.nvrtcDestroyProgram(&prog);
  if (st != TF_OK) {
    char *log = out->log;
    out->log = NULL;
    tf_rtc_result_free(out);
    free(log);
  }
  return st;
}

/* ---- loading and launching ---------------------------------------------------------------------- */

static tf_status tf_rtc_load(tf_device_ctx *ctx, const void *code, void **lib) {
  *lib = NULL;
  tf_status st = tf_cuda_use_device(ctx);
  if (st != TF_OK) return st;
  cudaLibrary_t l;
  TF_CUDA_CHECK(cudaLibraryLoadData(&l, code, NULL, NULL, 0, NULL, NULL, 0));
  *lib = l;
  return TF_OK;
}

static void tf_rtc_unload(void *lib) {
  if (lib) tf_cuda_report(cudaLibraryUnload((cudaLibrary_t)lib), "cudaLibraryUnload");
}

static tf_status tf_rtc_kernel(void *lib, const char *name, int declared, bool probe_more, void **kernel,
                               tf_rtc_kernel_info *info) {
  cudaKernel_t k;
  cudaError_t err = cudaLibraryGetKernel(&k, (cudaLibrary_t)lib, name);
  if (err == cudaErrorSymbolNotFound || err == cudaErrorInvalidDeviceFunction) {
    (void)cudaGetLastError();
    return tf_fail(TF_ERR_ARG, "the module has no kernel %s", name);
  }
  TF_CUDA_CHECK(err);
  memset(info, 0, sizeof *info);
  /* the parameter list as the compiled code has it: cudaFuncGetParamInfo fails past the last */
  int n = 0, last = probe_more ? TF_RTC_MAX_PARAMS + 1 : declared;
  size_t spare_offset, spare_size;
  while (n < last && n <= TF_RTC_MAX_PARAMS &&
         cudaFuncGetParamInfo((const void *)k, (size_t)n, n < TF_RTC_MAX_PARAMS ? &info->param_offset[n] : &spare_offset,
                              n < TF_RTC_MAX_PARAMS ? &info->param_size[n] : &spare_size) == cudaSuccess)
    n++;
  if (n < last) (void)cudaGetLastError(); /* the question past the last parameter */
  if (n > TF_RTC_MAX_PARAMS) return tf_fail(TF_ERR_ARG, "kernel %s has more than %d parameters", name, TF_RTC_MAX_PARAMS);
  info->nparams = n;
  cudaFuncAttributes a;
  TF_CUDA_CHECK(cudaFuncGetAttributes(&a, (const void *)k));
  info->max_threads = a.maxThreadsPerBlock;
  info->registers = a.numRegs;
  info->static_shared = a.sharedSizeBytes;
  info->local_bytes = a.localSizeBytes;
  info->max_dynamic_shared = a.maxDynamicSharedSizeBytes;
  info->ptx_version = a.ptxVersion;
  info->binary_version = a.binaryVersion;
  *kernel = (void *)k;
  return TF_OK;
}

static tf_status tf_rtc_device_limits(tf_device_ctx *ctx, tf_rtc_limits *out) {
  int d = ctx->device.index, v;
  static const cudaDeviceAttr grid[3] = {cudaDevAttrMaxGridDimX, cudaDevAttrMaxGridDimY, cudaDevAttrMaxGridDimZ};
  static const cudaDeviceAttr block[3] = {cudaDevAttrMaxBlockDimX, cudaDevAttrMaxBlockDimY, cudaDevAttrMaxBlockDimZ};
  for (int i = 0; i < 3; i++) {
    TF_CUDA_CHECK(cudaDeviceGetAttribute(&v, grid[i], d));
    out->max_grid[i] = (unsigned)v;
    TF_CUDA_CHECK(cudaDeviceGetAttribute(&v, block[i], d));
    out->max_block[i] = (unsigned)v;
  }
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&out->max_threads_block, cudaDevAttrMaxThreadsPerBlock, d));
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&out->max_shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d));
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&out->cc_major, cudaDevAttrComputeCapabilityMajor, d));
  TF_CUDA_CHECK(cudaDeviceGetAttribute(&out->cc_minor, cudaDevAttrComputeCapabilityMinor, d));
  TF_CUDA_CHECK(cudaDriverGetVersion(&out->driver_version));
  return TF_OK;
}

/* The last user kernel launched, for the message of a fault that shows up later (faults are
 * asynchronous: the call that sees one is rarely the launch that caused it). The texts are copied
 * when their pointers change; a loop launching one kernel from one line copies nothing. */
static struct {
  const char *name_seen, *file_seen;
  char name[160], file[256];
  int line;
} tf_rtc_last;

static void tf_rtc_note_launch(const tf_rtc_launch *l) {
  if (l->name != tf_rtc_last.name_seen) {
    snprintf(tf_rtc_last.name, sizeof tf_rtc_last.name, "%s", l->name);
    tf_rtc_last.name_seen = l->name;
  }
  if (l->site_file != tf_rtc_last.file_seen) {
    snprintf(tf_rtc_last.file, sizeof tf_rtc_last.file, "%s", l->site_file ? l->site_file : "?");
    tf_rtc_last.file_seen = l->site_file;
  }
  tf_rtc_last.line = l->site_line;
}

/* The driver's calls a launch makes, found through the runtime (tfhost does not link libcuda). */
static struct {
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void **, void **);
  CUresult (*function)(CUfunction *, CUkernel);
  CUresult (*set_attribute)(CUfunction, CUfunction_attribute, int);
} tf_cu;
static pthread_once_t tf_cu_once = PTHREAD_ONCE_INIT;

static void tf_cu_open(void) {
  void *p[3] = {NULL, NULL, NULL};
  static const char *const names[3] = {"cuLaunchKernel", "cuKernelGetFunction", "cuFuncSetAttribute"};
  for (int i = 0; i < 3; i++) p[i] = tf_cuda_driver_function(names[i]);
  if (!p[0] || !p[1] || !p[2]) return; /* launches go through the runtime then */
  tf_cu.launch = (decltype(tf_cu.launch))p[0];
  tf_cu.function = (decltype(tf_cu.function))p[1];
  tf_cu.set_attribute = (decltype(tf_cu.set_attribute))p[2];
}

/* The kernel's function in the current context, once; NULL where the driver's calls are not there. */
static CUfunction tf_rtc_function(void *kernel, void **slot) {
  if (*slot) return (CUfunction)*slot;
  pthread_once(&tf_cu_once, tf_cu_open);
  CUfunction f = NULL;
  if (tf_cu.function && tf_cu.function(&f, (CUkernel)kernel) == CUDA_SUCCESS) *slot = (void *)f;
  return (CUfunction)*slot;
}

static tf_status tf_rtc_launch_kernel(tf_device_ctx *ctx, void *kernel, const tf_rtc_launch *l) {
  tf_status st = tf_cuda_use_device(ctx);
  if (st != TF_OK) return st;
  CUfunction f = tf_rtc_function(kernel, l->function);
  if (l->shared > *l->shared_allowed && l->shared > 48 * 1024) {
    TF_CUDA_CHECK(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)l->shared));
    if (f && tf_cu.set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)l->shared) != CUDA_SUCCESS)
      f = NULL; /* the runtime's launch below, which has the limit */
    *l->shared_allowed = l->shared;
  }
  tf_rtc_note_launch(l);
  cudaStream_t stream = tf_cuda_state_of(ctx)->stream;
  bool launched = f && tf_cu.launch(f, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2],
                                    (unsigned)l->shared, (CUstream)stream, l->args, NULL) == CUDA_SUCCESS;
  if (!launched) { /* the runtime's launch: a failure then comes with the runtime's error, and a fault is noted */
    dim3 grid(l->grid[0], l->grid[1], l->grid[2]), block(l->block[0], l->block[1], l->block[2]);
    cudaError_t err = cudaLaunchKernel((const void *)kernel, grid, block, l->args, l->shared, stream);
    if (err != cudaSuccess) return tf_cuda_error(err, l->name);
  }
  if (tf_cuda_launch_blocking()) return tf_cuda_launched(l->name);
  return TF_OK;
}

static bool tf_rtc_context_lost(char *why, size_t n) {
  const char *fault = tf_cuda_fault();
  if (!fault) return false;
  if (tf_rtc_last.name[0])
    snprintf(why, n, "%s; the last kernel of a script launched before it was seen: %s, launched at %s:%d", fault,
             tf_rtc_last.name, tf_rtc_last.file, tf_rtc_last.line);
  else
    snprintf(why, n, "%s", fault);
  return true;
}

/* ---- tensor maps ---- */

static CUtensorMapDataType tf_rtc_map_type(tf_dtype d) {
  switch (d) {
  case TF_F32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  case TF_F16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  case TF_BF16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  case TF_F64: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
  case TF_I32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
  case TF_I64: return CU_TENSOR_MAP_DATA_TYPE_INT64;
  default: return CU_TENSOR_MAP_DATA_TYPE_UINT8; /* bool and the f8 types: bytes */
  }
}

static tf_status tf_rtc_tensor_map(const tf_rtc_tensor_map_spec *spec, void *out) {
  typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static encode_fn encode;
  if (!encode) {
    encode = (encode_fn)tf_cuda_driver_function("cuTensorMapEncodeTiled");
    if (!encode)
      return tf_fail(TF_ERR_DEVICE, "tensor maps need a CUDA driver with cuTensorMapEncodeTiled (CUDA 12 or later)");
  }
  const CUtensorMapSwizzle swizzle = spec->swizzle == 32    ? CU_TENSOR_MAP_SWIZZLE_32B
                                     : spec->swizzle == 64  ? CU_TENSOR_MAP_SWIZZLE_64B
                                     : spec->swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                                            : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUtensorMapL2promotion l2 = spec->l2_promotion == 64    ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                    : spec->l2_promotion == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                    : spec->l2_promotion == 256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                                                : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  cuuint64_t dims[TF_RTC_TENSOR_MAP_MAX_RANK], strides[TF_RTC_TENSOR_MAP_MAX_RANK];
  cuuint32_t box[TF_RTC_TENSOR_MAP_MAX_RANK], estrides[TF_RTC_TENSOR_MAP_MAX_RANK];
  for (int i = 0; i < spec->rank; i++) {
    dims[i] = spec->dims[i];
    box[i] = spec->box[i];
    estrides[i] = spec->element_strides[i];
    if (i + 1 < spec->rank) strides[i] = spec->strides[i];
  }
  CUresult r = encode((CUtensorMap *)out, tf_rtc_map_type(spec->dtype), (cuuint32_t)spec->rank, spec->address, dims,
                      strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2,
                      spec->oob_nan ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                                    : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return tf_fail(TF_ERR_ARG, "cuTensorMapEncodeTiled refused the map (CUresult %d): rank %d, box and strides as "
                   "tf.cuda.tensor_map checked them",
                   (int)r, spec->rank);
  return TF_OK;
}

static const tf_rtc_api tf_cuda_rtc_table = {
    TF_CUDA_INCDIR,
    tf_rtc_version, tf_rtc_targets, tf_rtc_compile, tf_rtc_result_free, tf_rtc_load,
    tf_rtc_unload,  tf_rtc_kernel,  tf_rtc_device_limits,  tf_rtc_launch_kernel, tf_rtc_context_lost,
    tf_rtc_tensor_map,
};

extern "C" const tf_rtc_api *tf_cuda_rtc(void) { return &tf_cuda_rtc_table; }
