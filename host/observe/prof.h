/* Ranges and the kernel profiler's collector (Lua-free).
 *
 * Ranges: a process-wide stack of named regions (tf_range_push/pop). Every
 * push makes a range instance with its own id, its parent instance and its
 * host start/end times; in CUDA builds it is also an NVTX range (Nsight
 * tools see it). While the collector records GPU work, every launch (of a
 * kernel, a copy, a memset or a CUDA graph, through the runtime or the
 * driver API, by tfhost or by a library such as cuBLASLt) is tied to the
 * innermost instance open at the call, and through its parents to every
 * enclosing one. A kernel of a CUDA graph replay is tied to the instance
 * open at the replay's launch and, below it, to the ranges that were open
 * inside the capture when its node was recorded (tf_prof_graph_capture_*):
 * each replay gets instances of those ranges of its own (replay: true),
 * spanning their kernels' GPU times. The stack is for
 * the thread that runs Lua (one per process); push/pop cost a clock read and
 * a hash lookup when no collector runs, never an allocation past the first
 * use of a name (names are interned for the life of the process).
 *
 * The collector (one at a time): a session records, until stopped, GPU
 * kernels, memcpys and memsets through CUPTI's activity API, and host-timed
 * op records from backends wrapped by tf_cpu_prof_backend (kernels/cpu/
 * cpu_prof.h). When CUPTI cannot start (no GPU, a build without CUDA,
 * another profiler attached, any CUPTI error) it says why once on stderr
 * and keeps recording host timings. Every time is in nanoseconds of the
 * process's clock (clock.h); CUPTI's timestamps are mapped
 * onto it through clock readings taken at start, at every read and at stop.
 *
 * Hardware counters: a session started with metrics (CUPTI metric names)
 * also counts each kernel launched on the current device through the GPU
 * side's counter hooks (CUPTI's range profiler: kernels serialised and
 * replayed once per pass). The ranges come back at stop, in launch order,
 * and are paired with the kernel records by that order (a device-to-device
 * copy makes a range too: its counters go to the copy's record); kernels
 * beyond max_kernels, on other devices or left unpaired are counted as
 * lost. Replaying a kernel saves and restores the device memory in use
 * around each pass, which costs time in proportion to it; a session
 * counted by passes (by_pass) instead has the caller run the same work
 * once per pass (tf_prof_next_pass), and keeps the records of the first. Where counters cannot be had, starting such a session fails (it
 * does not fall back to times).
 * A session without metrics never touches the counters. */
#ifndef TF_PROF_H
#define TF_PROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "device_id.h"
#include "intern.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { TF_RANGE_MAX_DEPTH = 256 };

/* The bare name of a demangled kernel name, for tables: no return type,
 * namespaces, template arguments or parameters ("void tf::flash_fwd_kernel<
 * 64>(Params)" -> "flash_fwd_kernel"); CUTLASS's generic launchers
 * (Kernel2<Op>, device_kernel<Op>) are named after Op; plain C names
 * (cuBLAS's "sm90_xmma_gemm_...") stay as they are. */
void tf_prof_short_name(const char *full, char *out, size_t n);

/* ---- ranges -------------------------------------------------------------------------- */

/* Opens a range named name (copied); fails past TF_RANGE_MAX_DEPTH or out of memory. */
tf_status tf_range_push(const char *name);
/* Closes the innermost range; fails when none is open. */
tf_status tf_range_pop(void);
/* The innermost open range's instance id (ids start at 1), 0 when none is open. */
uint64_t tf_range_current(void);
/* Number of open ranges. */
int tf_range_depth(void);
/* Up to max names of the open ranges, outermost first (interned: they stay
 * valid); returns how many were written. */
int tf_range_stack(const char **names, int max);
/* Closes range instance id, for scoped closes (Lua's <close>): nothing to do
 * when it is no longer open (closed before). When ranges opened inside it
 * are still open, they are closed with it (the stack stays consistent) and
 * TF_ERR_STATE says which were left open. */
tf_status tf_range_close(uint64_t id);

/* ---- the collector ------------------------------------------------------------------------ */

enum { TF_PROF_COUNTERS_DEFAULT_KERNELS = 1024 };

typedef struct tf_prof_options {
  bool kernels;  /* GPU kernel records (CUPTI) */
  bool memcpy;   /* GPU memcpy and memset records (CUPTI) */
  bool host_ops; /* host-timed op records from wrapped backends (the CPU's ops) */
  /* Hardware counters of each kernel (see "hardware counters" below):
   * CUPTI metric names ("dram__bytes_read.sum"), none for time only. The
   * names are copied at start. */
  const char *const *metrics;
  size_t num_metrics;
  size_t max_kernels; /* kernels that can be counted; 0: TF_PROF_COUNTERS_DEFAULT_KERNELS */
  bool by_pass;       /* counters by passes of the caller's work (tf_prof_next_pass), not by kernel replay */
} tf_prof_options;

/* A kernel: a GPU kernel from CUPTI, or an op timed on the host (host:
 * true; on the CPU device these stand for kernels). */
typedef struct tf_prof_kernel {
  const char *name;       /* demangled name, or the op's name ("matmul", "unary:exp") */
  const char *short_name; /* without return type, namespaces, template arguments, parameters */
  int64_t start_ns, end_ns;
  uint64_t range;         /* innermost range instance open at launch, 0 for none */
  uint32_t correlation;   /* CUPTI correlation id; 0 for host-timed ops */
  uint32_t stream;        /* CUPTI stream id; 0 for host-timed ops */
  uint64_t graph_node;    /* CUPTI's id of the CUDA graph node it ran as, 0 outside graphs */
  tf_device device;
  bool host;
  int32_t grid[3], block[3];
  int32_t registers;                     /* per thread */
  int32_t static_shared, dynamic_shared; /* bytes per block */
  uint32_t counter_row;                  /* 1 + its row of tf_prof_view.counter_values; 0: not counted */
  bool from_launch; /* made from its launch call while counting: the times bracket the call, replays
                       included, until pairing puts the counted gpu__time_duration in */
} tf_prof_kernel;

/* A memcpy or memset on a GPU. */
typedef struct tf_prof_transfer {
  bool memset;
  const char *kind; /* "HtoD", "DtoH", "DtoD", "HtoH", "PtoP", ... or "memset" */
  uint64_t bytes;
  int64_t start_ns, end_ns;
  uint64_t range;
  uint32_t correlation;         /* driver API correlation id */
  uint32_t runtime_correlation; /* runtime API correlation id (memcpy), 0 when unknown */
  uint32_t stream;
  uint64_t graph_node; /* as for kernels */
  tf_device device;
  uint32_t counter_row; /* as for kernels: a device-to-device copy makes a counted range */
  bool from_launch;     /* made from its copy call while counting (times bracket the call) */
} tf_prof_transfer;

/* A range instance that was open while the session ran. */
typedef struct tf_prof_range {
  uint64_t id, parent; /* parent 0: outermost */
  const char *name;
  int depth;           /* 0 for an outermost range */
  int64_t start_ns, end_ns;
  bool open;           /* still open: end_ns is the time of the read (or of stop) */
  bool replay;         /* a range captured in a CUDA graph, for one replay: its times are
                          the GPU span of its kernels */
} tf_prof_range;

/* The limits of a device that decide how many blocks of a kernel fit on
 * one SM (its occupancy), for the counters' occupancy limiter. */
typedef struct tf_prof_device_limits {
  int sm_count, warp_size;
  int max_threads_per_sm, max_blocks_per_sm, max_threads_per_block;
  int regs_per_sm, regs_per_block;
  int64_t shared_per_sm, shared_per_block_optin, reserved_shared_per_block; /* bytes */
} tf_prof_device_limits;

/* How a session's hardware counters went (tf_prof_view.counters). */
typedef struct tf_prof_counter_info {
  int device;          /* the CUDA device index counted */
  char chip[32];       /* CUPTI's chip name ("GH100") */
  size_t passes;       /* passes the metrics need (replays of each kernel, or runs of the work by_pass) */
  bool by_pass;        /* counted by passes of the work rather than by kernel replay */
  uint64_t launches;   /* by_pass: the launches (kernels, device-to-device copies) of the first pass */
  size_t max_kernels;  /* the counter data's capacity in kernels */
  uint64_t ranges;     /* ranges (counted launches) CUPTI returned */
  uint64_t dropped;    /* ranges CUPTI dropped (past max_kernels) */
  uint64_t counted;    /* kernel records given counters */
  uint64_t lost;       /* GPU kernel records without counters: past max_kernels, on another device, unpaired */
  uint64_t copies;     /* ranges that were device-to-device copies (counted on the copy's record) */
  uint64_t mismatched; /* pairs whose gpu__time_duration disagrees with the record's duration */
  uint64_t unpaired;   /* ranges with no launch left to pair with */
  char sass_left_out[192]; /* by passes with SASS metrics: why their pass's values were left out ("" if kept) */
  int64_t start_ns, stop_ns; /* host time the counters took to set up and to read out */
  tf_prof_device_limits limits;
} tf_prof_counter_info;

/* What a session holds, as of tf_prof_view. Ranges are in order of id. */
typedef struct tf_prof_view {
  const tf_prof_kernel *kernels;
  size_t num_kernels;
  const tf_prof_transfer *transfers;
  size_t num_transfers;
  const tf_prof_range *ranges;
  size_t num_ranges;
  bool running;
  bool gpu;               /* GPU records are (were) being collected */
  const char *gpu_reason; /* why not, when !gpu (and GPU records were asked for) */
  int64_t start_ns, stop_ns; /* stop_ns 0 while running */
  uint64_t dropped;       /* records CUPTI reported dropped (or lost for want of host memory) */
  uint64_t untimed;       /* GPU records without timestamps (work unfinished at a flush), left out */
  int64_t clock_drift_ns; /* change of the CUPTI-to-host clock offset from start to the last reading */
  tf_prof_options options;
  /* Hardware counters (when options.num_metrics > 0; values once stopped):
   * row r - 1 of counter_values (num_metrics values, in the order of
   * options.metrics) belongs to the kernel whose counter_row is r. */
  const double *counter_values;
  size_t counter_rows;
  tf_prof_counter_info counters;
} tf_prof_view;

typedef struct tf_prof_session tf_prof_session;

/* Starts the collector; TF_ERR_STATE when one is already running. */
tf_status tf_prof_start(const tf_prof_options *opts, tf_prof_session **out);
/* Waits for the devices, collects what is pending and stops; harmless when stopped. */
tf_status tf_prof_stop(tf_prof_session *s);
/* Ends a pass of a session counted by passes (options.by_pass): *more is
 * true while the metrics need the work run again. The records of the
 * first pass are kept; the later passes must launch the same kernels
 * (TF_ERR_STATE, and the counters are given up, where they do not). */
tf_status tf_prof_next_pass(tf_prof_session *s, bool *more);
/* The session's records; while it runs, first waits for the devices and
 * collects what CUPTI holds. The arrays stay valid until the next call on
 * this session (or its release). */
tf_status tf_prof_view_get(tf_prof_session *s, tf_prof_view *out);
bool tf_prof_running(const tf_prof_session *s);
/* Whether any collector is running now (on the ranges' thread). */
bool tf_prof_collecting(void);
/* Whether a running collector records GPU work (CUPTI started). */
bool tf_prof_collecting_gpu(void);

/* Around a stream capture into a CUDA graph (the fused engine's phases):
 * the ranges opened between begin and end are kept as each captured
 * node's range path, relative to the ranges open at begin, so that a
 * replay's kernels land in them (see the top of this file). Nodes are
 * only seen while a collector records GPU work: a graph captured without
 * one replays into the range around its launch alone, so the engine
 * captures again when a collector has started since. */
void tf_prof_graph_capture_begin(void);
void tf_prof_graph_capture_end(void);
/* Whether s collects (collected) GPU records; when not, *reason says why. */
bool tf_prof_session_gpu(const tf_prof_session *s, const char **reason);
/* Whether a running collector counts hardware counters: kernels are then
 * serialised and replayed, one counted range per launch, so the fused
 * engine launches its phases eagerly instead of replaying CUDA graphs. */
bool tf_prof_counting(void);
/* The metric names of a chip's counters (chip NULL: the current GPU's),
 * for checking names before a start: base NULL lists the base metrics
 * ("dram__bytes_read"), else base's submetrics (".sum",
 * ".avg.pct_of_peak_sustained_active", ...). The names stay valid for the
 * life of the process. TF_ERR_DEVICE when this build or this machine has
 * no hardware counters, TF_ERR_ARG for an unknown chip or base. */
tf_status tf_prof_counter_names(const char *chip, const char *base, const char *const **names, size_t *n);
/* Stops it if running and frees it. NULL is fine. */
void tf_prof_session_free(tf_prof_session *s);
/* Whether GPU records can be collected now; when not, *reason says why. */
bool tf_prof_gpu_available(const char **reason);

/* ---- busy time ---------------------------------------------------------------------- */

/* A kernel's interval on its device, for tf_prof_busy_ns. */
typedef struct tf_prof_span {
  int64_t start_ns, end_ns;
  tf_device device;
} tf_prof_span;

/* How long the devices were busy with the n spans: on each device the
 * length of the union of its spans, summed over the devices. Kernels can
 * run at the same time (on two streams: the fused engine's optimizer
 * beside its backward pass), so their summed durations can exceed the wall
 * time they ran in; their union cannot, and it is never more than that
 * sum. A span with end_ns <= start_ns covers nothing. Sorts spans in place
 * (by device, then start). */
int64_t tf_prof_busy_ns(tf_prof_span *spans, size_t n);

/* ---- for backends --------------------------------------------------------------------- */

/* Whether host-timed op records are wanted now (one relaxed load). */
bool tf_prof_host_ops_on(void);
/* Records an op timed on the host: name is a string literal (or interned);
 * range is tf_range_current() taken before the op ran. */
void tf_prof_record_host_op(const char *name, tf_device device, int64_t start_ns, int64_t end_ns, uint64_t range);

/* The GPU side: what a backend that can record GPU work (the CUDA
 * backend's CUPTI collector, kernels/cuda/prof.cu) gives the
 * collector, registered from above by tf_backends_init (none: GPU records
 * are unavailable, "this tfhost was built without CUDA"). Records arrive
 * through tf_prof_gpu_* below from CUPTI's thread, with raw CUPTI
 * timestamps. */
typedef struct tf_prof_gpu_source {
  /* Why GPU records cannot be had now (no GPU present), before trying; NULL when they may. */
  const char *(*unavailable)(void);
  bool (*probe)(char *reason, size_t reason_size);
  /* Starts recording and pays what the first launches after it would
   * (CUPTI sets itself up on the first kernel it traces, longest in a
   * process's first session), by
   * running a little work of its own and waiting for it, so that the
   * first region profiled is not longer for being profiled. Records of
   * that work reach no session. */
  bool (*start)(const tf_prof_options *opts, char *reason, size_t reason_size);
  void (*flush)(void);
  void (*stop)(void);
  /* A CUPTI timestamp and the host clock read at the same moment (the
   * tightest of a few tries). */
  void (*clock_pair)(int64_t *host_ns, uint64_t *cupti_ns);
  /* Hardware counters (NULL when the source has none), started after
   * start and stopped before stop, on the current device: every kernel
   * launched in between is one counted range, in launch order
   * (kernels/cuda/counters.cu). counters_start fills info's device, chip,
   * passes, max_kernels and limits. counters_stop reads the ranges out:
   * *values (malloc'd, the caller frees it) holds num_metrics values for
   * each of *ranges ranges, in launch order; it tears the counters down
   * even when it fails. */
  bool (*counters_start)(const char *const *metrics, size_t num_metrics, size_t max_kernels, bool by_pass,
                         tf_prof_counter_info *info, char *reason, size_t reason_size);
  /* By passes: ends the pass now running (the devices have finished it),
   * saying in *done whether every pass the metrics need has run, and
   * starts the next one if not; *launches: the kernels and device-to-
   * device copies launched in the pass that ended. */
  bool (*counters_pass)(bool *done, uint64_t *launches, char *reason, size_t reason_size);
  bool (*counters_stop)(double **values, size_t *ranges, tf_prof_counter_info *info, char *reason,
                        size_t reason_size);
  /* As tf_prof_counter_names; false with the reason. */
  bool (*counter_names)(const char *chip, const char *base, const char *const **names, size_t *n, char *reason,
                        size_t reason_size);
} tf_prof_gpu_source;
void tf_prof_set_gpu_source(const tf_prof_gpu_source *src);

/* Waits for every device in use, so that the work launched so far has
 * finished and its records can be collected; registered by the device
 * layer when it makes its first device context. */
void tf_prof_set_device_sync(tf_status (*sync_all)(void));

/* Called by the CUPTI side with a batch of records; they are kept only
 * while a session runs. Locking: tf_prof_gpu_lock around each batch. */
void tf_prof_gpu_lock(void);
void tf_prof_gpu_unlock(void);
void tf_prof_gpu_kernel(const tf_prof_kernel *k);      /* raw CUPTI times, range 0 */
void tf_prof_gpu_transfer(const tf_prof_transfer *t); /* raw CUPTI times, range 0 */
void tf_prof_gpu_dropped(uint64_t n);
/* Called by the GPU side on the launching thread, as a launch API call
 * (kernel, copy, memset, graph) starts, without tf_prof_gpu_lock: ties the
 * call's correlation id to the innermost open range. */
void tf_prof_gpu_launch(uint32_t correlation);
/* Called as a graph node is made (original 0; during a stream capture,
 * with the capture's ranges open) or cloned from node original (when a
 * graph is instantiated or cloned), on the calling thread. */
void tf_prof_gpu_graph_node(uint64_t node, uint64_t original);

#ifdef __cplusplus
}
#endif
#endif
