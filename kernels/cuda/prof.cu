/* The profiler's GPU side (host/observe/prof.h): CUPTI's activity API with
 * CONCURRENT_KERNEL records (never KERNEL, which serialises the kernels it
 * traces), MEMCPY and MEMSET records. Which range a
 * record belongs to comes from CUPTI's callback API, not from API activity
 * records: a callback on entry to every launch call of the driver
 * (kernels, graphs, copies, memsets; found by name, so that variants such
 * as cuLaunchKernelEx, which cuBLASLt calls directly, are covered; the
 * runtime's launches go through them too) hands the call's correlation id,
 * which the record carries, to the collector while the range is still
 * open. Resource callbacks on graph
 * nodes being made (during a stream capture) or cloned (when a graph is
 * instantiated) give the collector the node ids that a replay's records
 * carry. No record is made per API call, which is what kept the driver's
 * API records off by default before.
 *
 * CUPTI hands over records in buffers on its own thread; buffers come from
 * a small pool (no allocation per kernel), and each completed buffer is
 * decoded into core records in one locked batch. A kernel's name is
 * demangled once per distinct name (CUPTI shares the name pointer between
 * records of one kernel). Only one CUPTI subscriber may exist per process:
 * the collector subscribes (a callback that does nothing) while it runs, so
 * that with Nsight Compute or Systems attached it fails to start and steps
 * aside with a message instead of fighting over CUPTI.
 *
 * While the hardware counters run, CUPTI's range profiler delivers no
 * kernel activity records for the kernels it counts (measured on an H200,
 * CUDA 13.0; enabling KERNEL or CONCURRENT_KERNEL records after it fails
 * with CUPTI_ERROR_NOT_COMPATIBLE). The kernel launch calls' callbacks
 * then make the records: the name, grid, block, shared memory and
 * registers from the call, the times of entering and leaving the call
 * (which bracket the kernel and its replays: the profiler serialises
 * them), the end to be replaced by the start plus the counted
 * gpu__time_duration when the collector pairs them with their ranges.
 * Device-to-device copies make counted ranges of their own but no memcpy
 * records either: the copy calls' callbacks make those. */
#include <cuda.h>
#include <cupti.h>
#include <cupti_driver_cbid.h>
#include <cxxabi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_backend.h"
#include "prof.h"

/* The record layouts of this CUPTI; only fields every version has are read. */
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 tf_cupti_kernel_record;
typedef CUpti_ActivityMemcpy6 tf_cupti_memcpy_record;
#else
typedef CUpti_ActivityKernel9 tf_cupti_kernel_record;
typedef CUpti_ActivityMemcpy5 tf_cupti_memcpy_record;
#endif
typedef CUpti_ActivityMemset4 tf_cupti_memset_record;

namespace {

const size_t kBufferBytes = 4u << 20;
const size_t kPoolKeep = 8; /* buffers kept for the next session */

/* Never destroyed: CUPTI may still deliver a buffer while the process
 * exits, after static destructors would have run. */
std::mutex &pool_lock = *new std::mutex;
std::vector<uint8_t *> &pool = *new std::vector<uint8_t *>; /* free buffers */

CUpti_SubscriberHandle subscriber;
bool subscribed = false;
bool callbacks_registered = false;
std::vector<CUpti_ActivityKind> &enabled = *new std::vector<CUpti_ActivityKind>;
std::atomic<bool> launch_records{false}; /* the counters run: kernel records come from the launch calls */

/* cuFuncGetAttribute through the runtime (tfhost does not link libcuda);
 * looked up when the counters start, outside CUPTI's callbacks. */
typedef CUresult (*func_get_attribute_fn)(int *, CUfunction_attribute, CUfunction);
typedef CUresult (*kernel_get_attribute_fn)(int *, CUfunction_attribute, CUkernel, CUdevice);
typedef CUresult (*pointer_get_attribute_fn)(void *, CUpointer_attribute, CUdeviceptr);
func_get_attribute_fn func_get_attribute;
kernel_get_attribute_fn kernel_get_attribute; /* library kernels (cuBLAS's) launch as CUkernel handles */
pointer_get_attribute_fn pointer_get_attribute;
bool debug_launches = false; /* TF_COUNTERS_DEBUG: each launch made a record of, on stderr */
std::atomic<uint64_t> pass_launches{0}; /* kernels and device-to-device copies launched while counting */

/* Names by CUPTI's name pointer (the string is checked too, in case a
 * module was unloaded and its memory reused). Under tf_prof_gpu_lock. */
struct kernel_name {
  std::string raw;
  const char *full, *bare;
};
std::unordered_map<const char *, kernel_name> &names = *new std::unordered_map<const char *, kernel_name>;

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  uint8_t *b = NULL;
  {
    std::lock_guard<std::mutex> hold(pool_lock);
    if (!pool.empty()) {
      b = pool.back();
      pool.pop_back();
    }
  }
  if (!b) b = (uint8_t *)aligned_alloc(8, kBufferBytes);
  *buffer = b;
  *size = b ? kBufferBytes : 0; /* CUPTI drops records (and counts them) without a buffer */
  *max_records = 0;
}

void give_back(uint8_t *buffer) {
  std::lock_guard<std::mutex> hold(pool_lock);
  pool.push_back(buffer);
}

const kernel_name &name_of(const char *mangled) {
  static const kernel_name unknown = {"", "(unknown kernel)", "(unknown kernel)"};
  if (!mangled) return unknown;
  auto it = names.find(mangled);
  if (it != names.end() && it->second.raw == mangled) return it->second;
  int status = 0;
  char *demangled = abi::__cxa_demangle(mangled, NULL, NULL, &status);
  const char *full = tf_intern(status == 0 && demangled ? demangled : mangled);
  free(demangled);
  if (!full) return unknown;
  char bare[512];
  tf_prof_short_name(full, bare, sizeof bare);
  const char *short_name = tf_intern(bare);
  kernel_name entry = {mangled, full, short_name ? short_name : full};
  return names[mangled] = entry;
}

const char *copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "unknown";
  }
}

tf_device cuda_device(uint32_t id) {
  tf_device d;
  d.type = TF_DEV_CUDA;
  d.index = (int)id;
  return d;
}

void decode(const CUpti_Activity *rec) {
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const tf_cupti_kernel_record *r = (const tf_cupti_kernel_record *)rec;
      const kernel_name &n = name_of(r->name);
      tf_prof_kernel k;
      memset(&k, 0, sizeof k);
      k.name = n.full;
      k.short_name = n.bare;
      k.start_ns = (int64_t)r->start;
      k.end_ns = (int64_t)r->end;
      k.correlation = r->correlationId;
      k.stream = r->streamId;
      k.graph_node = r->graphNodeId;
      k.device = cuda_device(r->deviceId);
      k.grid[0] = r->gridX, k.grid[1] = r->gridY, k.grid[2] = r->gridZ;
      k.block[0] = r->blockX, k.block[1] = r->blockY, k.block[2] = r->blockZ;
      k.registers = r->registersPerThread;
      k.static_shared = r->staticSharedMemory;
      k.dynamic_shared = r->dynamicSharedMemory;
      tf_prof_gpu_kernel(&k);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const tf_cupti_memcpy_record *r = (const tf_cupti_memcpy_record *)rec;
      tf_prof_transfer t;
      memset(&t, 0, sizeof t);
      t.kind = copy_kind(r->copyKind);
      t.bytes = r->bytes;
      t.start_ns = (int64_t)r->start;
      t.end_ns = (int64_t)r->end;
      t.correlation = r->correlationId;
      t.runtime_correlation = r->runtimeCorrelationId;
      t.stream = r->streamId;
      t.graph_node = r->graphNodeId;
      t.device = cuda_device(r->deviceId);
      tf_prof_gpu_transfer(&t);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const tf_cupti_memset_record *r = (const tf_cupti_memset_record *)rec;
      tf_prof_transfer t;
      memset(&t, 0, sizeof t);
      t.memset = true;
      t.kind = "memset";
      t.bytes = r->bytes;
      t.start_ns = (int64_t)r->start;
      t.end_ns = (int64_t)r->end;
      t.correlation = r->correlationId;
      t.stream = r->streamId;
      t.graph_node = r->graphNodeId;
      t.device = cuda_device(r->deviceId);
      tf_prof_gpu_transfer(&t);
      break;
    }
    default:
      break;
  }
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)size;
  tf_prof_gpu_lock();
  CUpti_Activity *rec = NULL;
  while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) decode(rec);
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    tf_prof_gpu_dropped(dropped);
  tf_prof_gpu_unlock();
  if (buffer) give_back(buffer);
}

bool is_kernel_launch(CUpti_CallbackId cbid) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: return true;
    default: return false;
  }
}

/* A launch's shape from cuLaunchKernel's parameters (its cooperative and
 * per-thread-stream variants share the leading fields). */
template <typename Params>
void launch_shape(const void *params, tf_prof_kernel *k, CUfunction *f, CUstream *stream) {
  const Params *p = (const Params *)params;
  k->grid[0] = (int32_t)p->gridDimX, k->grid[1] = (int32_t)p->gridDimY, k->grid[2] = (int32_t)p->gridDimZ;
  k->block[0] = (int32_t)p->blockDimX, k->block[1] = (int32_t)p->blockDimY, k->block[2] = (int32_t)p->blockDimZ;
  k->dynamic_shared = (int32_t)p->sharedMemBytes;
  *f = p->f;
  *stream = p->hStream;
}

/* The same from cuLaunchKernelEx's launch configuration. */
template <typename Params>
void launch_shape_ex(const void *params, tf_prof_kernel *k, CUfunction *f, CUstream *stream) {
  const Params *p = (const Params *)params;
  const CUlaunchConfig *c = p->config;
  *f = p->f;
  if (!c) return;
  k->grid[0] = (int32_t)c->gridDimX, k->grid[1] = (int32_t)c->gridDimY, k->grid[2] = (int32_t)c->gridDimZ;
  k->block[0] = (int32_t)c->blockDimX, k->block[1] = (int32_t)c->blockDimY, k->block[2] = (int32_t)c->blockDimZ;
  k->dynamic_shared = (int32_t)c->sharedMemBytes;
  *stream = c->hStream;
}

/* A function attribute of f (a CUfunction, or a CUkernel cast to one). */
bool attribute_of(CUfunction f, CUfunction_attribute a, uint32_t device, int *value) {
  if (!f) return false;
  if (func_get_attribute && func_get_attribute(value, a, f) == CUDA_SUCCESS) return true;
  return kernel_get_attribute && kernel_get_attribute(value, a, (CUkernel)f, (CUdevice)device) == CUDA_SUCCESS;
}

/* Whether p is device memory (copies between two such make counted ranges). */
bool device_memory(CUdeviceptr p) {
  unsigned int type = 0;
  return pointer_get_attribute && pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS &&
         type == CU_MEMORYTYPE_DEVICE;
}

/* The copy calls whose copies may run device to device: their parameters
 * all begin (dst, src, ByteCount[, hStream]). */
enum copy_call { NOT_A_COPY, DEVICE_COPY, ANY_COPY };
copy_call copy_call_of(CUpti_CallbackId cbid) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz: return DEVICE_COPY;
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz: return ANY_COPY;
    default: return NOT_A_COPY;
  }
}

/* What a launch or copy call's record takes from the call, on leaving it:
 * the CUPTI times of entering (kept in correlationData) and of now (both 0
 * where either is missing: the collector counts the record as untimed),
 * its correlation id and its device. */
template <typename Record>
void from_call(const CUpti_CallbackData *cb, Record *r) {
  uint64_t end = 0;
  if (cuptiGetTimestamp(&end) != CUPTI_SUCCESS) end = 0;
  r->start_ns = (int64_t)*cb->correlationData;
  r->end_ns = (int64_t)end;
  if (!r->start_ns || !r->end_ns) r->start_ns = r->end_ns = 0;
  r->correlation = cb->correlationId;
  r->from_launch = true;
  uint32_t device = 0;
  if (cuptiGetDeviceId(cb->context, &device) != CUPTI_SUCCESS) device = 0;
  r->device = cuda_device(device);
}

/* A device-to-device copy's record made from its call, on leaving it. */
void record_copy(copy_call kind, const CUpti_CallbackData *cb) {
  if (cb->functionReturnValue && *(const CUresult *)cb->functionReturnValue != CUDA_SUCCESS) return;
  const cuMemcpy_params *p = (const cuMemcpy_params *)cb->functionParams;
  if (kind == ANY_COPY && !(device_memory(p->dst) && device_memory(p->src))) return;
  pass_launches.fetch_add(1, std::memory_order_relaxed);
  tf_cuda_counters_launched(1);
  if (debug_launches)
    fprintf(stderr, "tf.counters: copy of %zu bytes (correlation %u)\n", p->ByteCount, cb->correlationId);
  tf_prof_transfer t;
  memset(&t, 0, sizeof t);
  from_call(cb, &t);
  t.kind = "DtoD";
  t.bytes = p->ByteCount;
  tf_prof_gpu_lock();
  tf_prof_gpu_transfer(&t);
  tf_prof_gpu_unlock();
}

/* Whether a launch is CUPTI's own: counting by passes, CUPTI launches a
 * kernel named WaitNs between the work's kernels (seen on an H200, CUDA
 * 13.0), which makes no counted range. */
bool cupti_own(const char *symbol) {
  if (!symbol) return false;
  const char *at = strstr(symbol, "WaitNs");
  return at && (at == symbol || (at > symbol && at[-1] >= '0' && at[-1] <= '9'));
}

/* A kernel record made from a kernel launch call on leaving it (see the
 * top of this file); a call that failed launched nothing. */
void record_launch(CUpti_CallbackId cbid, const CUpti_CallbackData *cb) {
  if (cb->functionReturnValue && *(const CUresult *)cb->functionReturnValue != CUDA_SUCCESS) return;
  if (cupti_own(cb->symbolName)) {
    if (debug_launches) fprintf(stderr, "tf.counters: CUPTI's launch %s left out\n", cb->symbolName);
    return;
  }
  /* the kernel a memset runs as while kernels are replayed: not work a pass is checked by (memsets are
   * not counted); the kernel a copy runs as in the SASS pass: the copy, counted as one */
  const bool memset_kernel = cb->symbolName && strstr(cb->symbolName, TF_CUDA_MEMSET_KERNEL);
  const bool copy_kernel = cb->symbolName && strstr(cb->symbolName, TF_CUDA_COPY_KERNEL);
  if (!memset_kernel) pass_launches.fetch_add(1, std::memory_order_relaxed);
  tf_cuda_counters_launched(memset_kernel || copy_kernel ? 2 : 0);
  tf_prof_kernel k;
  memset(&k, 0, sizeof k);
  from_call(cb, &k);
  const uint32_t device = (uint32_t)k.device.index;
  CUfunction f = NULL;
  CUstream stream = NULL;
  const void *params = cb->functionParams;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: launch_shape<cuLaunchKernel_params>(params, &k, &f, &stream); break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
      launch_shape<cuLaunchKernel_ptsz_params>(params, &k, &f, &stream);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
      launch_shape<cuLaunchCooperativeKernel_params>(params, &k, &f, &stream);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
      launch_shape<cuLaunchCooperativeKernel_ptsz_params>(params, &k, &f, &stream);
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
      launch_shape_ex<cuLaunchKernelEx_params>(params, &k, &f, &stream);
      break;
    default: launch_shape_ex<cuLaunchKernelEx_ptsz_params>(params, &k, &f, &stream); break;
  }
  if (cuptiGetStreamId(cb->context, stream, &k.stream) != CUPTI_SUCCESS) k.stream = 0;
  int value = 0;
  if (attribute_of(f, CU_FUNC_ATTRIBUTE_NUM_REGS, device, &value)) k.registers = value;
  if (attribute_of(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, device, &value)) k.static_shared = value;
  if (debug_launches)
    fprintf(stderr, "tf.counters: launch %s (correlation %u, call %d, grid %d x %d x %d)\n",
            cb->symbolName ? cb->symbolName : "?", cb->correlationId, (int)cbid, k.grid[0], k.grid[1], k.grid[2]);
  tf_prof_gpu_lock();
  const kernel_name &n = name_of(cb->symbolName);
  k.name = n.full;
  k.short_name = n.bare;
  tf_prof_gpu_kernel(&k);
  tf_prof_gpu_unlock();
}

/* Launch calls tie their correlation id to the open range; graph nodes
 * made or cloned tie their ids to the capture's ranges. */
void CUPTIAPI on_callback(void *, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    const bool counting = launch_records.load(std::memory_order_relaxed);
    const bool kernel = counting && is_kernel_launch(cbid);
    const copy_call copy = counting ? copy_call_of(cbid) : NOT_A_COPY;
    if (cb->callbackSite == CUPTI_API_ENTER) {
      tf_prof_gpu_launch(cb->correlationId);
      if ((kernel || copy != NOT_A_COPY) && cuptiGetTimestamp(cb->correlationData) != CUPTI_SUCCESS)
        *cb->correlationData = 0;
    } else if (kernel) {
      record_launch(cbid, cb);
    } else if (copy != NOT_A_COPY) {
      record_copy(copy, cb);
    }
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
  if (cbid != CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED && cbid != CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) return;
  const CUpti_GraphData *g = (const CUpti_GraphData *)((const CUpti_ResourceData *)data)->resourceDescriptor;
  uint64_t node = 0, original = 0;
  if (!g || !g->node || cuptiGetGraphNodeId(g->node, &node) != CUPTI_SUCCESS) return;
  if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED &&
      (!g->originalNode || cuptiGetGraphNodeId(g->originalNode, &original) != CUPTI_SUCCESS || !original))
    return;
  tf_prof_gpu_graph_node(node, original);
}

void CUPTIAPI ignore_callback(void *, CUpti_CallbackDomain, CUpti_CallbackId, const void *) {}

/* Whether an API function (by CUPTI's name for it) launches work that
 * makes records: kernels, graphs, copies, memsets. */
bool is_launch(const char *name) {
  static const char *const prefixes[] = {"cuLaunch", "cuGraphLaunch", "cuMemcpy", "cuMemset", NULL};
  while (*name == '_') name++;
  if (strstr(name, "HostFunc")) return false;
  for (int i = 0; prefixes[i]; i++)
    if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true;
  return false;
}

/* Turns on the callbacks on_callback handles. */
CUptiResult enable_callbacks(const char **failed_call) {
  /* The driver's launch calls are called back for the runtime's launches
   * too (the runtime makes them), with the correlation id the record
   * carries: the driver's callbacks alone give every kernel its range, the
   * runtime's launches and cuBLASLt's GEMMs alike, at less cost than with
   * the runtime's as well. Found by name once. */
  static std::vector<CUpti_CallbackId> &launch_calls = *new std::vector<CUpti_CallbackId>;
  if (launch_calls.empty()) {
    for (uint32_t cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE; cbid++) {
      const char *name = NULL;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, cbid, &name) == CUPTI_SUCCESS && name && is_launch(name))
        launch_calls.push_back(cbid);
    }
  }
  if (launch_calls.empty()) {
    *failed_call = "cuptiGetCallbackName (no launch call found)";
    return CUPTI_ERROR_UNKNOWN;
  }
  for (CUpti_CallbackId cbid : launch_calls) {
    CUptiResult r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, cbid);
    if (r != CUPTI_SUCCESS) {
      *failed_call = "cuptiEnableCallback";
      return r;
    }
  }
  for (CUpti_CallbackId cbid : {CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED}) {
    CUptiResult r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, cbid);
    if (r != CUPTI_SUCCESS) {
      *failed_call = "cuptiEnableCallback(RESOURCE)";
      return r;
    }
  }
  return CUPTI_SUCCESS;
}

bool failed(CUptiResult r, const char *call, char *reason, size_t n) {
  const char *text = NULL;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || !text) text = "unknown CUPTI error";
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    snprintf(reason, n, "another CUDA profiler or debugger holds CUPTI (Nsight Compute/Systems, compute-sanitizer, "
             "cuda-gdb?): %s: %s", call, text);
  else
    snprintf(reason, n, "%s: %s", call, text);
  return false;
}

const char *kind_name(CUpti_ActivityKind k) {
  switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return "cuptiActivityEnable(CONCURRENT_KERNEL)";
    case CUPTI_ACTIVITY_KIND_MEMCPY: return "cuptiActivityEnable(MEMCPY)";
    case CUPTI_ACTIVITY_KIND_MEMSET: return "cuptiActivityEnable(MEMSET)";
    default: return "cuptiActivityEnable";
  }
}

void disable_all() {
  for (size_t i = enabled.size(); i-- > 0;) (void)cuptiActivityDisable(enabled[i]);
  enabled.clear();
}

void unsubscribe() {
  if (subscribed) (void)cuptiUnsubscribe(subscriber);
  subscribed = false;
}

/* Frees the pool beyond what the next session will want. */
void trim_pool() {
  std::lock_guard<std::mutex> hold(pool_lock);
  while (pool.size() > kPoolKeep) {
    free(pool.back());
    pool.pop_back();
  }
}

__global__ void tf_prof_warmup_kernel(int *sink) {
  if (sink) *sink = 0;
}

/* One traced launch and a wait on a stream of its own, then a flush (see
 * tf_prof_gpu_source.start): best effort, errors are cleared. */
void warm_up() {
  cudaStream_t stream = NULL;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess) {
    tf_prof_warmup_kernel<<<1, 1, 0, stream>>>(NULL);
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  (void)cudaGetLastError();
  (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

bool cupti_probe(char *reason, size_t reason_size) {
  if (subscribed) return true;
  CUptiResult r = cuptiSubscribe(&subscriber, ignore_callback, NULL);
  if (r != CUPTI_SUCCESS) return failed(r, "cuptiSubscribe", reason, reason_size);
  (void)cuptiUnsubscribe(subscriber);
  return true;
}

bool cupti_start(const tf_prof_options *opts, char *reason, size_t reason_size) {
  CUptiResult r = cuptiSubscribe(&subscriber, on_callback, NULL);
  if (r != CUPTI_SUCCESS) return failed(r, "cuptiSubscribe", reason, reason_size);
  subscribed = true;
  const char *call = NULL;
  r = enable_callbacks(&call);
  if (r != CUPTI_SUCCESS) {
    unsubscribe();
    return failed(r, call, reason, reason_size);
  }
  if (!callbacks_registered) {
    r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
      unsubscribe();
      return failed(r, "cuptiActivityRegisterCallbacks", reason, reason_size);
    }
    callbacks_registered = true;
  }
  std::vector<CUpti_ActivityKind> kinds;
  if (opts->kernels) kinds.push_back(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (opts->memcpy) {
    kinds.push_back(CUPTI_ACTIVITY_KIND_MEMCPY);
    kinds.push_back(CUPTI_ACTIVITY_KIND_MEMSET);
  }
  for (CUpti_ActivityKind k : kinds) {
    r = cuptiActivityEnable(k);
    if (r != CUPTI_SUCCESS) {
      disable_all();
      unsubscribe();
      return failed(r, kind_name(k), reason, reason_size);
    }
    enabled.push_back(k);
  }
  warm_up();
  return true;
}

void cupti_flush(void) { (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); }

void cupti_stop(void) {
  (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  disable_all();
  (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  unsubscribe();
  trim_pool();
}

void cupti_clock_pair(int64_t *host_ns, uint64_t *cupti_ns) {
  int64_t best = -1;
  for (int i = 0; i < 7; i++) {
    uint64_t c = 0;
    int64_t before = tf_clock_ns();
    if (cuptiGetTimestamp(&c) != CUPTI_SUCCESS) c = 0;
    int64_t after = tf_clock_ns();
    if (c && (best < 0 || after - before < best)) {
      best = after - before;
      *host_ns = before + (after - before) / 2;
      *cupti_ns = c;
    }
  }
  if (best < 0) { /* no CUPTI clock: the host's, unmapped */
    *host_ns = tf_clock_ns();
    *cupti_ns = (uint64_t)*host_ns;
  }
}

const char *cupti_unavailable(void) {
  return tf_cuda_backend_device_count() == 0 ? "no CUDA device is present" : NULL;
}

/* The counters (kernels/cuda/counters.cu), with the kernel records made
 * from the launch calls while they run. */
bool counters_start(const char *const *metrics, size_t num_metrics, size_t max_kernels, bool by_pass,
                    tf_prof_counter_info *info, char *reason, size_t reason_size) {
  if (!func_get_attribute) {
    func_get_attribute = (func_get_attribute_fn)tf_cuda_driver_function("cuFuncGetAttribute");
    kernel_get_attribute = (kernel_get_attribute_fn)tf_cuda_driver_function("cuKernelGetAttribute");
    pointer_get_attribute = (pointer_get_attribute_fn)tf_cuda_driver_function("cuPointerGetAttribute");
  }
  if (!tf_cuda_counters_start(metrics, num_metrics, max_kernels, by_pass, info, reason, reason_size)) return false;
  const char *e = getenv("TF_COUNTERS_DEBUG");
  debug_launches = e && *e && strcmp(e, "0") != 0;
  pass_launches.store(0);
  launch_records.store(true);
  return true;
}

bool counters_pass(bool *done, uint64_t *launches, char *reason, size_t reason_size) {
  *launches = pass_launches.exchange(0);
  return tf_cuda_counters_pass(done, reason, reason_size);
}

bool counters_stop(double **values, size_t *ranges, tf_prof_counter_info *info, char *reason, size_t reason_size) {
  launch_records.store(false);
  return tf_cuda_counters_stop(values, ranges, info, reason, reason_size);
}

const tf_prof_gpu_source cupti_source = {cupti_unavailable, cupti_probe,   cupti_start,    cupti_flush,
                                         cupti_stop,        cupti_clock_pair, counters_start, counters_pass,
                                         counters_stop,     tf_cuda_counter_names};

}  // namespace

extern "C" const tf_prof_gpu_source *tf_cuda_prof_source(void) { return &cupti_source; }
