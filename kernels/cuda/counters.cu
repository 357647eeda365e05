/* Hardware counters for the profiler (host/observe/prof.h's counter hooks):
 * CUPTI's Range Profiling API with automatic ranges, and kernel replay or
 * user replay (by passes). While counting, every kernel launched on the
 * counted device is one range: CUPTI serialises it and, replaying kernels,
 * runs it once per pass its metrics need, saving and restoring the device
 * memory in use around each run (the cost grows with the memory in use:
 * about 0.1 s a kernel with a few GB allocated on an H200). By passes, the
 * caller runs its work once per pass instead (cupti_counters_pass), and
 * the n-th kernel of every pass adds to the n-th range. By passes (asked
 * for with sass = true in Lua, which otherwise leaves them out), CUPTI
 * counts no SASS instruction metrics (sm__sass_*, the CUDA cores' FLOPs:
 * an f32 add of 1M elements read 0 FADD, H200, CUDA 13.0; they are counted
 * by patching the kernels' code, which it does when it replays kernels),
 * so those go to one more pass of the work, after the others, that
 * replays each kernel and counts them alone (the roofline's nine in one
 * replay a kernel, which still cost about 0.2 s a kernel in a process
 * holding a few GB on an H200); the k-th kernel's range
 * of that pass gives its values to the k-th range of the others (there
 * device-to-device copies make ranges of their own: the launches of that
 * pass, noted in order, say which ranges they are). The ranges are read
 * out in one go at stop (one decode, one evaluation per range of every
 * metric at once); nothing is done per kernel on the host meanwhile. The
 * collector pairs the n-th range with the n-th launch (host/observe/prof.c).
 *
 * The images CUPTI works on (the counter availability image, the config
 * image, the counter data image) live in one state for the session, as
 * long as the host object initialised with them: CUPTI keeps pointers into
 * them. The counter data image grows with the number of ranges it can hold
 * (about 0.5 MB a range for some 20 metrics), so its capacity is a
 * session's max_kernels, never more.
 *
 * TF_COUNTERS_DEBUG=1 prints each CUPTI call with its result and time,
 * each range's name and values, and the time of each phase, on stderr,
 * and a crash's stack (a signal handler that prints it, then dies of the
 * signal). */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_target.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "cuda_backend.h"
#include "prof.h"

namespace {

bool debug_on() {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("TF_COUNTERS_DEBUG");
    on = e && *e && strcmp(e, "0") != 0;
  }
  return on == 1;
}

void on_crash(int sig) {
  static const char msg[] = "tf.counters: crashed; the stack:\n";
  if (write(2, msg, sizeof msg - 1) < 0) _exit(128 + sig);
  void *frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Under TF_COUNTERS_DEBUG: a crash prints its stack. */
void debug_crashes() {
  static bool installed = false;
  if (installed || !debug_on()) return;
  installed = true;
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  signal(SIGABRT, on_crash);
}

void debug(const char *fmt, ...) {
  if (!debug_on()) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("tf.counters: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

const char *result_text(CUptiResult r) {
  const char *text = NULL;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || !text) text = "unknown CUPTI error";
  return text;
}

/* Runs one CUPTI call (printed under TF_COUNTERS_DEBUG); on failure writes
 * why into reason, in words where the cause is a known one. */
template <typename Params>
bool call(const char *name, CUptiResult (*fn)(Params *), Params *params, char *reason, size_t n) {
  int64_t t0 = tf_clock_ns();
  CUptiResult r = fn(params);
  debug("%s -> %s (%.3f ms)", name, r == CUPTI_SUCCESS ? "ok" : result_text(r), (tf_clock_ns() - t0) / 1e6);
  if (r == CUPTI_SUCCESS) return true;
  if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
    snprintf(reason, n, "%s: %s (the driver lets only administrators read GPU counters: run as root, or load "
             "nvidia with NVreg_RestrictProfilingToAdminUsers=0)", name, result_text(r));
  else if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED || r == CUPTI_ERROR_HARDWARE_BUSY)
    snprintf(reason, n, "%s: %s (another CUDA profiler holds the GPU's counters: Nsight Compute or Systems, "
             "compute-sanitizer, DCGM?)", name, result_text(r));
  else
    snprintf(reason, n, "%s: %s", name, result_text(r));
  return false;
}
#define CUPTI_CALL(fn, params) call(#fn, fn, &(params), reason, reason_size)

/* A CUPTI parameter struct, zeroed, with its size set. */
template <typename Params>
Params make_params(size_t size) {
  Params p;
  memset(&p, 0, sizeof p);
  p.structSize = size;
  return p;
}
#define PARAMS(type) make_params<type>(type##_STRUCT_SIZE)

/* The names of one chip's metrics, for checking names (no GPU needed):
 * kept for the life of the process, as the names point into its host
 * object. */
struct catalog {
  std::string chip;
  CUpti_Profiler_Host_Object *host = NULL;
  std::vector<const char *> bases;
  std::vector<CUpti_MetricType> types;
  std::vector<const char *> subs; /* of the last base asked for */
};
std::vector<catalog *> &catalogs = *new std::vector<catalog *>;

/* CUPTI's profiler initialised, once a process: before any other call of
 * its profiling API (cuptiDeviceGetChipName without it crashed on the H200). */
bool profiler_initialized(char *reason, size_t reason_size) {
  static bool initialized = false;
  if (!initialized) {
    auto p = PARAMS(CUpti_Profiler_Initialize_Params);
    if (!CUPTI_CALL(cuptiProfilerInitialize, p)) return false;
    initialized = true;
  }
  return true;
}

/* The chip of CUDA device `device` ("GH100"). */
bool chip_of(int device, std::string *chip, char *reason, size_t reason_size) {
  if (!profiler_initialized(reason, reason_size)) return false;
  auto p = PARAMS(CUpti_Device_GetChipName_Params);
  p.deviceIndex = (size_t)device;
  if (!CUPTI_CALL(cuptiDeviceGetChipName, p)) return false;
  *chip = p.pChipName;
  return true;
}

catalog *catalog_of(const char *chip_name, char *reason, size_t reason_size) {
  std::string chip;
  if (chip_name) {
    chip = chip_name;
  } else {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      snprintf(reason, reason_size, "no CUDA device to read the counters of");
      return NULL;
    }
    if (!chip_of(device, &chip, reason, reason_size)) return NULL;
  }
  for (catalog *c : catalogs)
    if (c->chip == chip) return c;
  catalog *c = new catalog;
  c->chip = chip;
  auto ip = PARAMS(CUpti_Profiler_Host_Initialize_Params);
  ip.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
  ip.pChipName = c->chip.c_str();
  if (!CUPTI_CALL(cuptiProfilerHostInitialize, ip)) {
    snprintf(reason, reason_size, "no counters are known for chip '%s'", chip.c_str());
    delete c;
    return NULL;
  }
  c->host = ip.pHostObject;
  for (int t = 0; t < CUPTI_METRIC_TYPE__COUNT; t++) {
    auto bp = PARAMS(CUpti_Profiler_Host_GetBaseMetrics_Params);
    bp.pHostObject = c->host;
    bp.metricType = (CUpti_MetricType)t;
    if (!CUPTI_CALL(cuptiProfilerHostGetBaseMetrics, bp)) continue;
    for (size_t i = 0; i < bp.numMetrics; i++) {
      c->bases.push_back(bp.ppMetricNames[i]);
      c->types.push_back((CUpti_MetricType)t);
    }
  }
  catalogs.push_back(c);
  return c;
}

bool cupti_counter_names(const char *chip, const char *base, const char *const **names, size_t *n, char *reason,
                         size_t reason_size) {
  catalog *c = catalog_of(chip, reason, reason_size);
  if (!c) return false;
  if (!base) {
    *names = c->bases.data();
    *n = c->bases.size();
    return true;
  }
  for (size_t i = 0; i < c->bases.size(); i++) {
    if (strcmp(c->bases[i], base) != 0) continue;
    auto sp = PARAMS(CUpti_Profiler_Host_GetSubMetrics_Params);
    sp.pHostObject = c->host;
    sp.metricType = c->types[i];
    sp.pMetricName = c->bases[i];
    if (!CUPTI_CALL(cuptiProfilerHostGetSubMetrics, sp)) return false;
    c->subs.assign(sp.ppSubMetrics, sp.ppSubMetrics + sp.numOfSubmetrics);
    *names = c->subs.data();
    *n = c->subs.size();
    return true;
  }
  snprintf(reason, reason_size, "chip %s has no metric '%s'", c->chip.c_str(), base);
  return false;
}

/* One configuration of the range profiler: its metrics (and their columns in the session's list), the host
 * object and the images CUPTI works on with them, how its passes are made. */
struct counting {
  std::vector<const char *> metrics;
  std::vector<size_t> columns;
  CUpti_Profiler_Host_Object *host = NULL;
  std::vector<uint8_t> config;
  std::vector<uint8_t> counter_data;
  CUpti_ProfilerReplayMode replay = CUPTI_KernelReplay;
  size_t max_ranges = 0, passes = 0;
  size_t dropped = 0;
  bool decoded = false;
};

/* One counting session's state: every image CUPTI was handed lives here
 * until the session ends (see the top of this file). Counting by passes,
 * `main` holds the metrics the passes count and `sass` the SASS metrics,
 * counted in one more pass that replays each kernel; `kinds` is that
 * pass's launches in order: 0 a kernel, 1 a copy, 2 the kernel a memset
 * or a copy of tfhost's is in that pass (util.cu); copies and those
 * kernels make ranges of their own there and none by passes. */
struct session {
  CUcontext ctx = NULL;
  int device = 0;
  std::string chip;
  std::vector<uint8_t> availability;
  counting main, sass;
  counting *active = NULL; /* the one the range profiler runs */
  CUpti_RangeProfiler_Object *profiler = NULL;
  bool started = false;
  std::vector<std::string> names;
  size_t max_kernels = 0;
  bool by_pass = false;
  size_t passes = 0, passes_done = 0;
  std::vector<uint8_t> kinds;
};
/* The session counting, if any; launches (from any host thread) read it, and what it notes, under
 * current_lock, which its start and stop take to set it. */
session *current;
std::mutex current_lock;

/* cuCtxGetCurrent through the runtime (tfhost does not link libcuda). */
bool current_context(CUcontext *ctx, char *reason, size_t reason_size) {
  typedef CUresult (*get_current_fn)(CUcontext *);
  static get_current_fn get_current;
  if (!get_current) {
    get_current = (get_current_fn)tf_cuda_driver_function("cuCtxGetCurrent");
    if (!get_current) {
      snprintf(reason, reason_size, "the driver has no cuCtxGetCurrent");
      return false;
    }
  }
  if (cudaFree(0) != cudaSuccess || get_current(ctx) != CUDA_SUCCESS || !*ctx) {
    (void)cudaGetLastError();
    snprintf(reason, reason_size, "no CUDA context on the current device");
    return false;
  }
  return true;
}

void device_limits(int device, tf_prof_device_limits *l) {
  auto attr = [device](cudaDeviceAttr a) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, device) != cudaSuccess) (void)cudaGetLastError();
    return v;
  };
  memset(l, 0, sizeof *l);
  l->sm_count = attr(cudaDevAttrMultiProcessorCount);
  l->warp_size = attr(cudaDevAttrWarpSize);
  l->max_threads_per_sm = attr(cudaDevAttrMaxThreadsPerMultiProcessor);
  l->max_blocks_per_sm = attr(cudaDevAttrMaxBlocksPerMultiprocessor);
  l->max_threads_per_block = attr(cudaDevAttrMaxThreadsPerBlock);
  l->regs_per_sm = attr(cudaDevAttrMaxRegistersPerMultiprocessor);
  l->regs_per_block = attr(cudaDevAttrMaxRegistersPerBlock);
  l->shared_per_sm = attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  l->shared_per_block_optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  l->reserved_shared_per_block = attr(cudaDevAttrReservedSharedMemoryPerBlock);
}

/* Frees c's host object, where it has one. */
void deinit_host(counting *c) {
  char reason[256];
  const size_t reason_size = sizeof reason;
  if (!c->host) return;
  auto p = PARAMS(CUpti_Profiler_Host_Deinitialize_Params);
  p.pHostObject = c->host;
  (void)CUPTI_CALL(cuptiProfilerHostDeinitialize, p);
  c->host = NULL;
}

/* Stops and disables the range profiler, where it runs. */
void disable(session *s) {
  char reason[256];
  const size_t reason_size = sizeof reason;
  if (!s->profiler) return;
  if (s->started) {
    auto p = PARAMS(CUpti_RangeProfiler_Stop_Params);
    p.pRangeProfilerObject = s->profiler;
    (void)CUPTI_CALL(cuptiRangeProfilerStop, p);
    s->started = false;
  }
  auto p = PARAMS(CUpti_RangeProfiler_Disable_Params);
  p.pRangeProfilerObject = s->profiler;
  (void)CUPTI_CALL(cuptiRangeProfilerDisable, p);
  s->profiler = NULL;
  tf_cuda_set_memsets_as_kernels(false);
  tf_cuda_set_copies_as_kernels(false);
}

/* Takes the session down as far as it got; harmless on a partial one. */
void teardown(session *s) {
  disable(s);
  deinit_host(&s->main);
  deinit_host(&s->sass);
  delete s;
}

/* Whether the device can be counted at all, and if not why, in words. */
bool device_supported(int device, char *reason, size_t reason_size) {
  auto p = PARAMS(CUpti_Profiler_DeviceSupported_Params);
  p.cuDevice = device;
  p.api = CUPTI_PROFILER_RANGE_PROFILING;
  if (!CUPTI_CALL(cuptiProfilerDeviceSupported, p)) return false;
  if (p.isSupported == CUPTI_PROFILER_CONFIGURATION_SUPPORTED) return true;
  const char *why = p.architecture != CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "its architecture (compute capability < 7.0)"
                    : p.vGpu != CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "a virtual GPU without profiling enabled"
                    : p.confidentialCompute != CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "confidential computing"
                    : p.sli != CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "SLI"
                    : p.cmp != CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "a crypto-mining processor"
                    : p.wsl != CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "WSL"
                    : "an unknown reason";
  snprintf(reason, reason_size, "CUDA device %d cannot be counted: %s", device, why);
  return false;
}

/* c's host object and config image for its metrics, and how many passes they need. */
bool configure(session *s, counting *c, char *reason, size_t reason_size) {
  auto ip = PARAMS(CUpti_Profiler_Host_Initialize_Params);
  ip.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
  ip.pChipName = s->chip.c_str();
  ip.pCounterAvailabilityImage = s->availability.data();
  if (!CUPTI_CALL(cuptiProfilerHostInitialize, ip)) return false;
  c->host = ip.pHostObject;
  auto am = PARAMS(CUpti_Profiler_Host_ConfigAddMetrics_Params);
  am.pHostObject = c->host;
  am.ppMetricNames = c->metrics.data();
  am.numMetrics = c->metrics.size();
  if (!CUPTI_CALL(cuptiProfilerHostConfigAddMetrics, am)) {
    snprintf(reason + strlen(reason), reason_size - strlen(reason),
             " (a metric this device cannot count now: the counters in use by another tool?)");
    return false;
  }
  auto cs = PARAMS(CUpti_Profiler_Host_GetConfigImageSize_Params);
  cs.pHostObject = c->host;
  if (!CUPTI_CALL(cuptiProfilerHostGetConfigImageSize, cs)) return false;
  c->config.resize(cs.configImageSize);
  auto ci = PARAMS(CUpti_Profiler_Host_GetConfigImage_Params);
  ci.pHostObject = c->host;
  ci.configImageSize = c->config.size();
  ci.pConfigImage = c->config.data();
  if (!CUPTI_CALL(cuptiProfilerHostGetConfigImage, ci)) return false;
  auto np = PARAMS(CUpti_Profiler_Host_GetNumOfPasses_Params);
  np.configImageSize = c->config.size();
  np.pConfigImage = c->config.data();
  if (!CUPTI_CALL(cuptiProfilerHostGetNumOfPasses, np)) return false;
  c->passes = np.numOfPasses;
  return true;
}

/* Enables the range profiler on the session's context with c's configuration, and starts it. */
bool enable(session *s, counting *c, char *reason, size_t reason_size) {
  auto en = PARAMS(CUpti_RangeProfiler_Enable_Params);
  en.ctx = s->ctx;
  if (!CUPTI_CALL(cuptiRangeProfilerEnable, en)) return false;
  s->profiler = en.pRangeProfilerObject;
  tf_cuda_set_memsets_as_kernels(c->replay == CUPTI_KernelReplay);
  tf_cuda_set_copies_as_kernels(c == &s->sass && !s->main.metrics.empty());
  auto ds = PARAMS(CUpti_RangeProfiler_GetCounterDataSize_Params);
  ds.pRangeProfilerObject = s->profiler;
  ds.pMetricNames = c->metrics.data();
  ds.numMetrics = c->metrics.size();
  ds.maxNumOfRanges = c->max_ranges;
  ds.maxNumRangeTreeNodes = (uint32_t)c->max_ranges;
  if (!CUPTI_CALL(cuptiRangeProfilerGetCounterDataSize, ds)) return false;
  c->counter_data.resize(ds.counterDataSize);
  auto di = PARAMS(CUpti_RangeProfiler_CounterDataImage_Initialize_Params);
  di.pRangeProfilerObject = s->profiler;
  di.counterDataSize = c->counter_data.size();
  di.pCounterData = c->counter_data.data();
  if (!CUPTI_CALL(cuptiRangeProfilerCounterDataImageInitialize, di)) return false;
  auto sc = PARAMS(CUpti_RangeProfiler_SetConfig_Params);
  sc.pRangeProfilerObject = s->profiler;
  sc.configSize = c->config.size();
  sc.pConfig = c->config.data();
  sc.counterDataImageSize = c->counter_data.size();
  sc.pCounterDataImage = c->counter_data.data();
  sc.range = CUPTI_AutoRange;
  sc.replayMode = c->replay;
  sc.maxRangesPerPass = c->max_ranges;
  sc.numNestingLevels = 1;
  sc.minNestingLevel = 1;
  sc.passIndex = 0;
  sc.targetNestingLevel = 1;
  if (!CUPTI_CALL(cuptiRangeProfilerSetConfig, sc)) return false;
  auto st = PARAMS(CUpti_RangeProfiler_Start_Params);
  st.pRangeProfilerObject = s->profiler;
  if (!CUPTI_CALL(cuptiRangeProfilerStart, st)) return false;
  s->active = c;
  s->started = true;
  debug("counting %zu metrics, %zu passes %s, room for %zu ranges (counter data %.1f MB)", c->metrics.size(),
        c->passes, c->replay == CUPTI_UserReplay ? "of the work" : "a kernel", c->max_ranges,
        c->counter_data.size() / 1e6);
  return true;
}

/* Sets s up and starts counting, as far as it gets; the caller tears a
 * failed one down. */
bool setup(session *s, size_t *passes, char *reason, size_t reason_size) {
  const int64_t t0 = tf_clock_ns();
  if (cudaGetDevice(&s->device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(reason, reason_size, "no current CUDA device");
    return false;
  }
  if (!current_context(&s->ctx, reason, reason_size)) return false;
  if (!profiler_initialized(reason, reason_size)) return false;
  if (!device_supported(s->device, reason, reason_size) || !chip_of(s->device, &s->chip, reason, reason_size))
    return false;
  /* The availability image: its size, then the image (before the range
   * profiler is enabled on the context). */
  auto av = PARAMS(CUpti_Profiler_GetCounterAvailability_Params);
  av.ctx = s->ctx;
  if (!CUPTI_CALL(cuptiProfilerGetCounterAvailability, av)) return false;
  s->availability.resize(av.counterAvailabilityImageSize);
  av.pCounterAvailabilityImage = s->availability.data();
  if (!CUPTI_CALL(cuptiProfilerGetCounterAvailability, av)) return false;
  /* By passes, the SASS metrics go to a pass of their own that replays
   * kernels: counted by passes they read 0 (the top of this file). */
  for (size_t i = 0; i < s->names.size(); i++) {
    counting *c = s->by_pass && strstr(s->names[i].c_str(), "__sass_") ? &s->sass : &s->main;
    c->metrics.push_back(s->names[i].c_str());
    c->columns.push_back(i);
  }
  s->main.replay = s->by_pass ? CUPTI_UserReplay : CUPTI_KernelReplay;
  s->main.max_ranges = s->max_kernels;
  s->sass.replay = CUPTI_KernelReplay;
  s->sass.max_ranges = 2 * s->max_kernels; /* the copies make ranges there too */
  for (counting *c : {&s->main, &s->sass})
    if (!c->metrics.empty() && !configure(s, c, reason, reason_size)) return false;
  *passes = s->passes = (s->main.metrics.empty() ? 0 : s->main.passes) + (s->sass.metrics.empty() ? 0 : 1);
  const int64_t t_host = tf_clock_ns();
  if (!enable(s, s->main.metrics.empty() ? &s->sass : &s->main, reason, reason_size)) return false;
  debug("start: %zu metrics on %s (cuda:%d), %zu passes%s; host setup %.1f ms, device setup %.1f ms",
        s->names.size(), s->chip.c_str(), s->device, s->passes,
        s->sass.metrics.empty() || s->main.metrics.empty() ? "" : " (the last for the SASS metrics, replaying kernels)",
        (t_host - t0) / 1e6, (tf_clock_ns() - t_host) / 1e6);
  return true;
}

bool cupti_counters_start(const char *const *metrics, size_t num_metrics, size_t max_kernels, bool by_pass,
                          tf_prof_counter_info *info, char *reason, size_t reason_size) {
  debug_crashes();
  if (current) {
    snprintf(reason, reason_size, "hardware counters are already running");
    return false;
  }
  session *s = new session;
  s->max_kernels = max_kernels;
  s->by_pass = by_pass;
  for (size_t i = 0; i < num_metrics; i++) s->names.push_back(metrics[i]);
  size_t passes = 0;
  if (!setup(s, &passes, reason, reason_size)) {
    teardown(s);
    return false;
  }
  {
    std::lock_guard<std::mutex> hold(current_lock);
    current = s;
  }
  info->device = s->device;
  snprintf(info->chip, sizeof info->chip, "%s", s->chip.c_str());
  info->passes = passes;
  info->max_kernels = max_kernels;
  device_limits(s->device, &info->limits);
  return true;
}

/* Stops the range profiler, ending the pass that runs (s->started); *all:
 * whether every pass of the active configuration has been submitted. */
bool end_pass(session *s, bool *all, char *reason, size_t reason_size) {
  auto sp = PARAMS(CUpti_RangeProfiler_Stop_Params);
  sp.pRangeProfilerObject = s->profiler;
  const bool ok = CUPTI_CALL(cuptiRangeProfilerStop, sp);
  s->started = false;
  if (!ok) return false;
  s->passes_done++;
  *all = sp.isAllPassSubmitted;
  debug("pass %zu of %zu ended%s", s->passes_done, s->passes, *all ? ": all submitted" : "");
  return true;
}

/* Decodes the active configuration's counter data (its passes have all run). */
bool decode(session *s, char *reason, size_t reason_size) {
  counting *c = s->active;
  if (!c || c->decoded) return true;
  auto dd = PARAMS(CUpti_RangeProfiler_DecodeData_Params);
  dd.pRangeProfilerObject = s->profiler;
  if (!CUPTI_CALL(cuptiRangeProfilerDecodeData, dd)) return false;
  c->decoded = true;
  c->dropped = dd.numOfRangeDropped;
  if (c->dropped) debug("%zu ranges dropped (past max_kernels = %zu)", c->dropped, s->max_kernels);
  return true;
}

/* Ends the pass running; starts the next while passes are left: the
 * configuration's next, or the SASS metrics' pass after the last. */
bool cupti_counters_pass(bool *done, char *reason, size_t reason_size) {
  session *s = current;
  *done = true;
  if (!s || !s->by_pass) {
    snprintf(reason, reason_size, "hardware counters are not counting by passes");
    return false;
  }
  if (!s->started) return true; /* every pass has run */
  bool all = false;
  if (!end_pass(s, &all, reason, reason_size)) return false;
  *done = false;
  if (!all) {
    auto st = PARAMS(CUpti_RangeProfiler_Start_Params);
    st.pRangeProfilerObject = s->profiler;
    if (!CUPTI_CALL(cuptiRangeProfilerStart, st)) return false;
    s->started = true;
    return true;
  }
  if (s->active == &s->main && !s->sass.metrics.empty()) {
    if (!decode(s, reason, reason_size)) return false;
    disable(s);
    return enable(s, &s->sass, reason, reason_size);
  }
  *done = true;
  return true;
}

/* The counter values of c's ranges, range by range, every metric of c at
 * once (printed per range under TF_COUNTERS_DEBUG). */
bool evaluate(counting *c, const char *what, std::vector<double> *values, size_t *ranges, char *reason,
              size_t reason_size) {
  auto gi = PARAMS(CUpti_RangeProfiler_GetCounterDataInfo_Params);
  gi.pCounterDataImage = c->counter_data.data();
  gi.counterDataImageSize = c->counter_data.size();
  if (!CUPTI_CALL(cuptiRangeProfilerGetCounterDataInfo, gi)) return false;
  const size_t n = c->metrics.size();
  *ranges = gi.numTotalRanges;
  values->assign(*ranges * n, 0.0);
  const bool dbg = debug_on();
  for (size_t r = 0; r < *ranges; r++) {
    auto ev = PARAMS(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
    ev.pHostObject = c->host;
    ev.pCounterDataImage = c->counter_data.data();
    ev.counterDataImageSize = c->counter_data.size();
    ev.rangeIndex = r;
    ev.ppMetricNames = c->metrics.data();
    ev.numMetrics = n;
    ev.pMetricValues = values->data() + r * n;
    CUptiResult res = cuptiProfilerHostEvaluateToGpuValues(&ev);
    if (res != CUPTI_SUCCESS) {
      snprintf(reason, reason_size, "cuptiProfilerHostEvaluateToGpuValues (range %zu): %s", r, result_text(res));
      return false;
    }
    if (dbg) {
      fprintf(stderr, "tf.counters: %s range %zu:", what, r);
      for (size_t m = 0; m < n; m++) fprintf(stderr, " %s=%.6g", c->metrics[m], (*values)[r * n + m]);
      fputc('\n', stderr);
    }
  }
  return true;
}

/* The session's values, ranges x metrics, into *out (malloc'd): the main
 * configuration's ranges, each with the SASS pass's values of the same
 * kernel (its k-th kernel range for the main's k-th range; its copies'
 * ranges skipped). Where only the SASS metrics were asked for, its ranges
 * as they are (copies included, as replaying kernels makes them). */
bool collect(session *s, double **out, size_t *ranges, char *left_out, size_t left_out_size, char *reason,
             size_t reason_size) {
  const size_t n = s->names.size();
  std::vector<double> main_v, sass_v;
  size_t main_r = 0, sass_r = 0;
  const bool has_main = !s->main.metrics.empty(), has_sass = !s->sass.metrics.empty();
  if (has_main && !evaluate(&s->main, has_sass ? "main" : "", &main_v, &main_r, reason, reason_size)) return false;
  if (has_sass && !evaluate(&s->sass, "SASS", &sass_v, &sass_r, reason, reason_size)) return false;
  *ranges = has_main ? main_r : sass_r;
  *out = NULL;
  if (*ranges == 0) return true;
  double *v = (double *)calloc(*ranges * n, sizeof *v);
  if (!v) {
    snprintf(reason, reason_size, "out of host memory for %zu ranges' counters", *ranges);
    return false;
  }
  /* range `from` of c's values (NULL: NaN, not counted) into row `to` of v, at c's columns */
  auto put = [&](const counting &c, const double *values, size_t from, size_t to) {
    const size_t k = c.metrics.size();
    for (size_t m = 0; m < k; m++) v[to * n + c.columns[m]] = values ? values[from * k + m] : __builtin_nan("");
  };
  for (size_t r = 0; r < main_r; r++) put(s->main, main_v.data(), r, r);
  if (has_sass && !has_main)
    for (size_t r = 0; r < sass_r; r++) put(s->sass, sass_v.data(), r, r);
  if (has_sass && has_main) {
    size_t kernel = 0, r2 = 0;
    for (uint8_t kind : s->kinds) { /* 0 a kernel; a copy, or a memset's or copy's kernel: a range of this pass only */
      if (r2 >= sass_r) break;
      if (kind == 0 && kernel < main_r) put(s->sass, sass_v.data(), r2, kernel++);
      r2++;
    }
    if (kernel != main_r || r2 != sass_r) {
      /* the passes did not see the same kernels: no SASS value is trusted */
      size_t by_kind[3] = {0, 0, 0};
      for (uint8_t kind : s->kinds) by_kind[kind < 3 ? kind : 0]++;
      snprintf(left_out, left_out_size,
               "the SASS metrics' pass made %zu ranges for %zu launches (%zu kernels, %zu copies, %zu memset or copy kernels) "
               "where the other passes counted %zu kernels",
               sass_r, s->kinds.size(), by_kind[0], by_kind[1], by_kind[2], main_r);
      debug("%s: SASS metrics left out", left_out);
      for (size_t r = 0; r < main_r; r++) put(s->sass, NULL, 0, r);
    }
  }
  *out = v;
  return true;
}

bool cupti_counters_stop(double **values, size_t *ranges, tf_prof_counter_info *info, char *reason,
                         size_t reason_size) {
  *values = NULL;
  *ranges = 0;
  session *s;
  {
    std::lock_guard<std::mutex> hold(current_lock);
    s = current;
  }
  if (!s) {
    snprintf(reason, reason_size, "hardware counters are not running");
    return false;
  }
  const int64_t t0 = tf_clock_ns();
  bool ok = true, all = true;
  if (s->started) ok = end_pass(s, &all, reason, reason_size);
  /* the last pass ended (a launch until then is still noted in it): no launch sees the session from here */
  {
    std::lock_guard<std::mutex> hold(current_lock);
    current = NULL;
  }
  if (ok && (!all || (s->active == &s->main && !s->sass.metrics.empty()))) {
    snprintf(reason, reason_size, "stopped after pass %zu of the %zu the metrics need (run the work once a pass: "
             "tf.prof.count)", s->passes_done, s->passes);
    ok = false;
  }
  ok = ok && decode(s, reason, reason_size);
  const int64_t t_decode = tf_clock_ns();
  info->sass_left_out[0] = '\0';
  ok = ok && collect(s, values, ranges, info->sass_left_out, sizeof info->sass_left_out, reason, reason_size);
  const int64_t t_eval = tf_clock_ns();
  info->ranges = ok ? *ranges : 0;
  info->dropped = s->main.metrics.empty() ? s->sass.dropped : s->main.dropped;
  teardown(s);
  debug("stop: stop and decode %.1f ms, %zu ranges evaluated in %.1f ms, teardown %.1f ms", (t_decode - t0) / 1e6,
        (size_t)info->ranges, (t_eval - t_decode) / 1e6, (tf_clock_ns() - t_eval) / 1e6);
  if (!ok) {
    free(*values);
    *values = NULL;
    *ranges = 0;
  }
  return ok;
}

/* A launch while counting (prof.cu): in the SASS metrics' pass, noted in order. */
void cupti_counters_launched(int kind) {
  std::lock_guard<std::mutex> hold(current_lock);
  session *s = current;
  if (!s || s->active != &s->sass || !s->started || s->main.metrics.empty()) return;
  s->kinds.push_back((uint8_t)kind);
}

}  // namespace

extern "C" bool tf_cuda_counters_start(const char *const *metrics, size_t num_metrics, size_t max_kernels,
                                       bool by_pass, tf_prof_counter_info *info, char *reason, size_t reason_size) {
  return cupti_counters_start(metrics, num_metrics, max_kernels, by_pass, info, reason, reason_size);
}

extern "C" bool tf_cuda_counters_pass(bool *done, char *reason, size_t reason_size) {
  return cupti_counters_pass(done, reason, reason_size);
}

extern "C" bool tf_cuda_counters_stop(double **values, size_t *ranges, tf_prof_counter_info *info, char *reason,
                                      size_t reason_size) {
  return cupti_counters_stop(values, ranges, info, reason, reason_size);
}

extern "C" void tf_cuda_counters_launched(int kind) { cupti_counters_launched(kind); }

extern "C" bool tf_cuda_counter_names(const char *chip, const char *base, const char *const **names, size_t *n,
                                      char *reason, size_t reason_size) {
  return cupti_counter_names(chip, base, names, n, reason, reason_size);
}
