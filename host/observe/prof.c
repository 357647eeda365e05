/* Ranges and the profiler's collector (prof.h). The GPU half, CUPTI, lives
 * in kernels/cuda/prof.cu; this file owns the records.
 *
 * Records reach a session three ways. Range instances are written by the
 * thread that pushes ranges, straight into the session. Launch calls tie
 * their correlation id to the open range on the launching thread, as they
 * are made, under the launch lock. Kernels, copies and host-timed ops
 * arrive from other threads (CUPTI delivers its buffers on its own thread)
 * into "incoming" arrays under the record lock; reading a session or
 * stopping it first waits for the devices and has CUPTI flush, then moves
 * the incoming records into the settled arrays, converting CUPTI's clock to
 * the host's and resolving each correlation id to its range instance (and,
 * for a graph replay's kernel, its node to the ranges of the capture). */
#include "prof.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#ifdef TF_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif


/* Registered from above (prof.h): the GPU side, and the wait for the devices. */
static const tf_prof_gpu_source *tf_gpu_source;
static tf_status (*tf_device_sync_all)(void);

void tf_prof_set_gpu_source(const tf_prof_gpu_source *src) { tf_gpu_source = src; }
void tf_prof_set_device_sync(tf_status (*sync_all)(void)) { tf_device_sync_all = sync_all; }

/* ---- growable arrays ------------------------------------------------------------------- */

typedef struct tf_vec {
  void *data;
  size_t len, cap;
} tf_vec;

/* Appends one element of size elem; false when out of host memory. */
static bool tf_vec_push(tf_vec *v, size_t elem, const void *item) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 256;
    void *data = realloc(v->data, cap * elem);
    if (!data) return false;
    v->data = data;
    v->cap = cap;
  }
  memcpy((char *)v->data + v->len * elem, item, elem);
  v->len++;
  return true;
}

static void tf_vec_free(tf_vec *v) {
  free(v->data);
  *v = (tf_vec){0};
}

/* ---- kernel names ----------------------------------------------------------------------- */

/* Where the last scope of the qualified name [s, end) starts: after its
 * last "::" outside <...> and (...). */
static const char *tf_name_last_scope(const char *s, const char *end) {
  const char *last = s;
  int depth = 0;
  for (const char *p = s; p < end; p++) {
    if (*p == '<' || *p == '(') depth++;
    else if ((*p == '>' || *p == ')') && depth > 0) depth--;
    else if (depth == 0 && p[0] == ':' && p + 1 < end && p[1] == ':') last = p + 2;
  }
  return last;
}

/* The bare name of the qualified name [s, end) ("ns::f<T>" -> "f") in
 * [name, name_end), and its template arguments in [targs, targs_end)
 * (empty when it has none). */
static void tf_name_bare(const char *s, const char *end, const char **name, const char **name_end,
                         const char **targs, const char **targs_end) {
  const char *last = tf_name_last_scope(s, end);
  const char *lt = last;
  while (lt < end && *lt != '<') lt++;
  *name = last;
  *name_end = lt;
  *targs = *targs_end = lt;
  if (lt < end) {
    int depth = 0;
    const char *p = lt;
    for (; p < end; p++) {
      if (*p == '<') depth++;
      else if (*p == '>' && --depth == 0) break;
    }
    *targs = lt + 1;
    *targs_end = p;
  }
}

void tf_prof_short_name(const char *full, char *out, size_t n) {
  if (n == 0) return;
  static const char anon[] = "(anonymous namespace)::";
  char buf[1024];
  size_t used = 0;
  for (const char *p = full; *p && used + 1 < sizeof buf;) {
    if (strncmp(p, anon, sizeof anon - 1) == 0) {
      p += sizeof anon - 1;
      continue;
    }
    buf[used++] = *p++;
  }
  buf[used] = '\0';
  /* The parameter list: the first '(' outside template arguments. */
  const char *end = buf + used;
  int depth = 0;
  for (const char *p = buf; p < buf + used; p++) {
    if (*p == '<') depth++;
    else if (*p == '>' && depth > 0) depth--;
    else if (*p == '(' && depth == 0 && p > buf) {
      end = p;
      break;
    }
  }
  /* The return type: up to the last space outside template arguments. */
  const char *start = buf;
  depth = 0;
  for (const char *p = buf; p < end; p++) {
    if (*p == '<') depth++;
    else if (*p == '>' && depth > 0) depth--;
    else if (*p == ' ' && depth == 0) start = p + 1;
  }
  const char *name, *name_end, *targs, *targs_end;
  tf_name_bare(start, end, &name, &name_end, &targs, &targs_end);
  /* Generic launchers (CUTLASS's Kernel2<Op>, device_kernel<Op>) are named
   * after their first template argument. */
  static const char *const wrappers[] = {"Kernel", "Kernel2", "device_kernel", "kernel", NULL};
  for (int i = 0; wrappers[i] && targs < targs_end; i++) {
    size_t len = strlen(wrappers[i]);
    if ((size_t)(name_end - name) != len || strncmp(name, wrappers[i], len) != 0) continue;
    const char *arg_end = targs;
    depth = 0;
    for (; arg_end < targs_end; arg_end++) {
      if (*arg_end == '<' || *arg_end == '(') depth++;
      else if ((*arg_end == '>' || *arg_end == ')') && depth > 0) depth--;
      else if (*arg_end == ',' && depth == 0) break;
    }
    while (targs < arg_end && *targs == ' ') targs++;
    const char *n2, *n2_end, *t2, *t2_end;
    tf_name_bare(targs, arg_end, &n2, &n2_end, &t2, &t2_end);
    if (n2_end > n2) name = n2, name_end = n2_end;
    break;
  }
  if (name_end <= name) {
    snprintf(out, n, "%s", full);
    return;
  }
  snprintf(out, n, "%.*s", (int)(name_end - name), name);
}

/* ---- busy time ---------------------------------------------------------------------- */

static int tf_span_order(const void *pa, const void *pb) {
  const tf_prof_span *a = pa, *b = pb;
  if (a->device.type != b->device.type) return a->device.type < b->device.type ? -1 : 1;
  if (a->device.index != b->device.index) return a->device.index < b->device.index ? -1 : 1;
  if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns ? -1 : 1;
  return 0;
}

int64_t tf_prof_busy_ns(tf_prof_span *spans, size_t n) {
  if (n == 0) return 0;
  qsort(spans, n, sizeof *spans, tf_span_order);
  int64_t busy = 0;
  bool open = false; /* [start, end) is the run of overlapping spans being merged */
  int64_t start = 0, end = 0;
  tf_device device = spans[0].device;
  for (size_t i = 0; i < n; i++) {
    const tf_prof_span *sp = &spans[i];
    if (sp->end_ns <= sp->start_ns) continue;
    if (open && tf_device_eq(sp->device, device) && sp->start_ns <= end) {
      if (sp->end_ns > end) end = sp->end_ns;
      continue;
    }
    if (open) busy += end - start;
    open = true;
    device = sp->device;
    start = sp->start_ns;
    end = sp->end_ns;
  }
  if (open) busy += end - start;
  return busy;
}

/* ---- uint64 -> uint64 maps ------------------------------------------------------------ */

/* Open addressing; key 0 is the empty slot (no correlation, node or range
 * id is 0). Used for correlation id -> range instance, graph node -> range
 * path and (replay, path) -> replay range. */
typedef struct tf_u64_map {
  uint64_t *keys;
  uint64_t *values;
  size_t cap, count;
} tf_u64_map;

static size_t tf_map_slot(const tf_u64_map *m, uint64_t key) {
  size_t j = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (m->cap - 1);
  while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
  return j;
}

static bool tf_map_put(tf_u64_map *m, uint64_t key, uint64_t value) {
  if (key == 0) return true;
  if ((m->count + 1) * 2 > m->cap) {
    tf_u64_map bigger = {0};
    bigger.cap = m->cap ? m->cap * 2 : 1024;
    bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
    bigger.values = malloc(bigger.cap * sizeof *bigger.values);
    if (!bigger.keys || !bigger.values) {
      free(bigger.keys);
      free(bigger.values);
      return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = tf_map_slot(&bigger, m->keys[i]);
      bigger.keys[j] = m->keys[i];
      bigger.values[j] = m->values[i];
      bigger.count++;
    }
    free(m->keys);
    free(m->values);
    *m = bigger;
  }
  size_t j = tf_map_slot(m, key);
  if (!m->keys[j]) m->count++;
  m->keys[j] = key;
  m->values[j] = value;
  return true;
}

static uint64_t tf_map_get(const tf_u64_map *m, uint64_t key) {
  if (key == 0 || m->cap == 0) return 0;
  size_t j = tf_map_slot(m, key);
  return m->keys[j] ? m->values[j] : 0;
}

static void tf_map_free(tf_u64_map *m) {
  free(m->keys);
  free(m->values);
  *m = (tf_u64_map){0};
}

/* ---- sessions ------------------------------------------------------------------------- */

/* A CUPTI timestamp and the host clock at the same moment. */
typedef struct tf_clock_point {
  int64_t host_ns;
  uint64_t cupti_ns;
} tf_clock_point;

struct tf_prof_session {
  tf_prof_options opts;
  bool running, gpu;
  char reason[256];
  int64_t start_ns, stop_ns;
  tf_vec kernels, transfers, ranges; /* settled: tf_prof_kernel, tf_prof_transfer, tf_prof_range */
  tf_vec clock;                      /* tf_clock_point, in time order */
  tf_u64_map replays;                /* (launch range, path index) -> index + 1 in ranges */
  /* Under tf_launch_lock: */
  tf_u64_map corr; /* correlation id -> range instance */
  uint64_t lost_launches;
  /* Under tf_record_lock: */
  tf_vec in_kernels, in_transfers;
  uint64_t dropped; /* CUPTI's, and records lost for want of host memory */
  uint64_t lost;    /* range instances and clock readings lost (the ranges' thread) */
  uint64_t untimed; /* GPU records CUPTI delivered without timestamps (left out) */
  /* Hardware counters (opts.num_metrics > 0): */
  const char **metrics;   /* interned copies of the names, opts.metrics points here */
  bool counting;          /* the GPU side's counters run */
  double *counter_values; /* num_metrics per range, in launch order, once stopped */
  size_t counter_ranges;
  tf_prof_counter_info counters;
  /* Counted by passes (opts.by_pass): after the first pass, nothing more is
   * recorded (muted: ranges, host ops, launches, and GPU records starting
   * at CUPTI time mute_after or later, which settling leaves out; by time,
   * as correlation ids need not grow from one pass to the next). */
  size_t passes_run;
  bool muted;
  uint64_t mute_after;
};

static pthread_mutex_t tf_record_lock = PTHREAD_MUTEX_INITIALIZER;
static tf_prof_session *tf_record_target; /* under tf_record_lock: where records go */
static pthread_mutex_t tf_launch_lock = PTHREAD_MUTEX_INITIALIZER;
static tf_prof_session *tf_launch_target; /* under tf_launch_lock: where launches go */
static tf_prof_session *tf_running;       /* the ranges' thread's view of the same */
static atomic_bool tf_host_ops_flag;

bool tf_prof_host_ops_on(void) { return atomic_load_explicit(&tf_host_ops_flag, memory_order_relaxed); }

void tf_prof_gpu_lock(void) { pthread_mutex_lock(&tf_record_lock); }
void tf_prof_gpu_unlock(void) { pthread_mutex_unlock(&tf_record_lock); }

void tf_prof_gpu_kernel(const tf_prof_kernel *k) {
  tf_prof_session *s = tf_record_target;
  if (s && !tf_vec_push(&s->in_kernels, sizeof *k, k)) s->dropped++;
}

void tf_prof_gpu_transfer(const tf_prof_transfer *t) {
  tf_prof_session *s = tf_record_target;
  if (s && !tf_vec_push(&s->in_transfers, sizeof *t, t)) s->dropped++;
}

void tf_prof_gpu_dropped(uint64_t n) {
  if (tf_record_target) tf_record_target->dropped += n;
}

void tf_prof_record_host_op(const char *name, tf_device device, int64_t start_ns, int64_t end_ns, uint64_t range) {
  tf_prof_kernel k = {0};
  k.name = k.short_name = name;
  k.start_ns = start_ns;
  k.end_ns = end_ns;
  k.range = range;
  k.device = device;
  k.host = true;
  pthread_mutex_lock(&tf_record_lock);
  if (!tf_record_target || !tf_record_target->muted) tf_prof_gpu_kernel(&k);
  pthread_mutex_unlock(&tf_record_lock);
}

/* ---- the range stack ---------------------------------------------------------------------- */

typedef struct tf_range_entry {
  uint64_t id;
  const char *name;
  int64_t start_ns;
  ptrdiff_t recorded; /* index in the running session's ranges, or -1 */
} tf_range_entry;

static tf_range_entry tf_ranges[TF_RANGE_MAX_DEPTH];
static int tf_range_count;
static uint64_t tf_range_next_id = 1;

/* Adds the open range at stack position i to session s (when it starts,
 * or when the range opens while s runs). */
static void tf_range_record(tf_prof_session *s, int i) {
  tf_range_entry *e = &tf_ranges[i];
  if (s->muted) {
    e->recorded = -1;
    return;
  }
  tf_prof_range r = {e->id, i > 0 ? tf_ranges[i - 1].id : 0, e->name, i, e->start_ns, 0, true, false};
  e->recorded = tf_vec_push(&s->ranges, sizeof r, &r) ? (ptrdiff_t)s->ranges.len - 1 : -1;
  if (e->recorded < 0) s->lost++;
}

tf_status tf_range_push(const char *name) {
  if (!name) return tf_fail(TF_ERR_ARG, "a range needs a name");
  if (tf_range_count >= TF_RANGE_MAX_DEPTH)
    return tf_fail(TF_ERR_STATE, "ranges nested deeper than %d (a range left open in a loop?)", TF_RANGE_MAX_DEPTH);
  const char *interned = tf_intern(name);
  if (!interned) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a range name");
  int i = tf_range_count++;
  tf_ranges[i] = (tf_range_entry){tf_range_next_id++, interned, tf_clock_ns(), -1};
#ifdef TF_WITH_CUDA
  nvtxRangePushA(interned);
#endif
  if (tf_running) tf_range_record(tf_running, i);
  return TF_OK;
}

/* Closes the innermost range at time now. */
static void tf_range_pop_top(int64_t now) {
  tf_range_entry *e = &tf_ranges[--tf_range_count];
  if (e->recorded >= 0 && tf_running) {
    tf_prof_range *r = (tf_prof_range *)tf_running->ranges.data + e->recorded;
    r->end_ns = now;
    r->open = false;
  }
#ifdef TF_WITH_CUDA
  nvtxRangePop();
#endif
}

tf_status tf_range_pop(void) {
  if (tf_range_count == 0) return tf_fail(TF_ERR_STATE, "no range is open");
  tf_range_pop_top(tf_clock_ns());
  return TF_OK;
}

uint64_t tf_range_current(void) { return tf_range_count ? tf_ranges[tf_range_count - 1].id : 0; }

int tf_range_depth(void) { return tf_range_count; }

int tf_range_stack(const char **names, int max) {
  int n = tf_range_count < max ? tf_range_count : max;
  for (int i = 0; i < n; i++) names[i] = tf_ranges[i].name;
  return n < 0 ? 0 : n;
}

tf_status tf_range_close(uint64_t id) {
  int at = tf_range_count - 1;
  while (at >= 0 && tf_ranges[at].id != id) at--;
  if (at < 0) return TF_OK; /* closed already */
  int64_t now = tf_clock_ns();
  if (at == tf_range_count - 1) {
    tf_range_pop_top(now);
    return TF_OK;
  }
  char left[256] = "";
  size_t used = 0;
  for (int i = at + 1; i < tf_range_count && used + 1 < sizeof left; i++) {
    int n = snprintf(left + used, sizeof left - used, "%s'%s'", i > at + 1 ? ", " : "", tf_ranges[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
  const char *name = tf_ranges[at].name;
  int inner = tf_range_count - 1 - at;
  while (tf_range_count > at) tf_range_pop_top(now);
  return tf_fail(TF_ERR_STATE, "range '%s' closed while %s opened inside it %s still open (closed now too)", name,
                 left, inner == 1 ? "was" : "were");
}

/* ---- launches and graph nodes --------------------------------------------------------------- */

void tf_prof_gpu_launch(uint32_t correlation) {
  uint64_t range = tf_range_current();
  if (!range) return;
  pthread_mutex_lock(&tf_launch_lock);
  tf_prof_session *s = tf_launch_target;
  if (s && !s->muted && !tf_map_put(&s->corr, correlation, range)) s->lost_launches++;
  pthread_mutex_unlock(&tf_launch_lock);
}

/* A range path of a graph capture: the names of the ranges open inside
 * the capture, outermost first, as a chain to its parent path. Paths are
 * made once per distinct chain and kept for the life of the process, as
 * the nodes that refer to them are. */
typedef struct tf_range_path {
  const struct tf_range_path *parent;
  const char *name;  /* interned */
  int depth;         /* 1 for a range opened right inside the capture */
  uint32_t index;    /* 1, 2, ... in order of making */
} tf_range_path;

enum { TF_PATH_INDEX_BITS = 20 };

/* Under tf_launch_lock. */
static tf_vec tf_paths;              /* tf_range_path *, by index - 1 */
static tf_u64_map tf_node_paths;     /* CUPTI graph node id -> tf_range_path * */
static int tf_capture_base = -1;     /* range depth at the start of the capture, -1: none */

/* The path (parent, name), made when new; NULL when out of memory. */
static const tf_range_path *tf_path_get(const tf_range_path *parent, const char *name) {
  tf_range_path *const *paths = tf_paths.data;
  for (size_t i = 0; i < tf_paths.len; i++)
    if (paths[i]->parent == parent && paths[i]->name == name) return paths[i];
  if (tf_paths.len + 1 >= ((size_t)1 << TF_PATH_INDEX_BITS)) return NULL;
  tf_range_path *p = malloc(sizeof *p);
  if (!p) return NULL;
  *p = (tf_range_path){parent, name, parent ? parent->depth + 1 : 1, (uint32_t)tf_paths.len + 1};
  if (!tf_vec_push(&tf_paths, sizeof p, &p)) {
    free(p);
    return NULL;
  }
  return p;
}

void tf_prof_graph_capture_begin(void) {
  pthread_mutex_lock(&tf_launch_lock);
  tf_capture_base = tf_range_count;
  pthread_mutex_unlock(&tf_launch_lock);
}

void tf_prof_graph_capture_end(void) {
  pthread_mutex_lock(&tf_launch_lock);
  tf_capture_base = -1;
  pthread_mutex_unlock(&tf_launch_lock);
}

void tf_prof_gpu_graph_node(uint64_t node, uint64_t original) {
  pthread_mutex_lock(&tf_launch_lock);
  uint64_t path = 0;
  if (original) {
    path = tf_map_get(&tf_node_paths, original);
  } else if (tf_capture_base >= 0) {
    const tf_range_path *p = NULL;
    for (int i = tf_capture_base; i < tf_range_count; i++) {
      p = tf_path_get(p, tf_ranges[i].name);
      if (!p) break;
    }
    path = (uint64_t)(uintptr_t)p;
  }
  if (path) (void)tf_map_put(&tf_node_paths, node, path); /* out of memory: the node lands in the launch's range */
  pthread_mutex_unlock(&tf_launch_lock);
}

/* The index in s's ranges of instance id, -1 when s has none (ranges are
 * in order of id). */
static ptrdiff_t tf_prof_range_index(const tf_prof_session *s, uint64_t id) {
  const tf_prof_range *r = s->ranges.data;
  size_t lo = 0, hi = s->ranges.len;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (r[mid].id < id) lo = mid + 1; else hi = mid;
  }
  return lo < s->ranges.len && r[lo].id == id ? (ptrdiff_t)lo : -1;
}

/* The index in s's ranges of the instance of path for the replay launched
 * in range instance launch (made, with its parents, for the first record
 * of that replay), widened to cover [start_ns, end_ns]; -1 when it cannot
 * be made. */
static ptrdiff_t tf_prof_replay_range(tf_prof_session *s, uint64_t launch, const tf_range_path *path,
                                      int64_t start_ns, int64_t end_ns) {
  ptrdiff_t parent = path->parent ? tf_prof_replay_range(s, launch, path->parent, start_ns, end_ns)
                                  : tf_prof_range_index(s, launch);
  if (path->parent && parent < 0) return -1;
  if (launch >> (64 - TF_PATH_INDEX_BITS)) return -1;
  const uint64_t key = launch << TF_PATH_INDEX_BITS | path->index;
  uint64_t at = tf_map_get(&s->replays, key);
  if (at) {
    tf_prof_range *r = (tf_prof_range *)s->ranges.data + (at - 1);
    if (start_ns < r->start_ns) r->start_ns = start_ns;
    if (end_ns > r->end_ns) r->end_ns = end_ns;
    return (ptrdiff_t)at - 1;
  }
  const tf_prof_range *p = parent >= 0 ? (const tf_prof_range *)s->ranges.data + parent : NULL;
  tf_prof_range r = {tf_range_next_id++, p ? p->id : 0, path->name, p ? p->depth + 1 : 0, start_ns, end_ns, false,
                     true};
  if (!tf_vec_push(&s->ranges, sizeof r, &r) || !tf_map_put(&s->replays, key, s->ranges.len)) {
    s->lost++;
    return -1;
  }
  return (ptrdiff_t)s->ranges.len - 1;
}

/* The range instance of a record launched in range instance launch: for a
 * graph node captured inside ranges, this replay's instance of them. */
static uint64_t tf_prof_record_range(tf_prof_session *s, uint64_t launch, uint64_t node, int64_t start_ns,
                                     int64_t end_ns) {
  if (!node) return launch;
  pthread_mutex_lock(&tf_launch_lock);
  const tf_range_path *path = (const tf_range_path *)(uintptr_t)tf_map_get(&tf_node_paths, node);
  pthread_mutex_unlock(&tf_launch_lock);
  if (!path) return launch;
  ptrdiff_t at = tf_prof_replay_range(s, launch, path, start_ns, end_ns);
  return at >= 0 ? ((const tf_prof_range *)s->ranges.data)[at].id : launch;
}

/* ---- the clock mapping -------------------------------------------------------------------- */

static void tf_prof_clock_point(tf_prof_session *s) {
  tf_clock_point p;
  tf_gpu_source->clock_pair(&p.host_ns, &p.cupti_ns);
  if (!tf_vec_push(&s->clock, sizeof p, &p)) s->lost++;
}

/* A CUPTI timestamp on the host clock: the offset between the clocks is
 * interpolated between the readings around it (held flat outside them). */
static int64_t tf_prof_host_time(const tf_prof_session *s, uint64_t t) {
  const tf_clock_point *p = s->clock.data;
  size_t n = s->clock.len;
  if (n == 0 || t == 0) return (int64_t)t;
  if (t <= p[0].cupti_ns) return p[0].host_ns + (int64_t)(t - p[0].cupti_ns);
  if (t >= p[n - 1].cupti_ns) return p[n - 1].host_ns + (int64_t)(t - p[n - 1].cupti_ns);
  size_t lo = 0, hi = n - 1; /* p[lo] <= t < p[hi] */
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (p[mid].cupti_ns <= t) lo = mid; else hi = mid;
  }
  double off_lo = (double)(p[lo].host_ns - (int64_t)p[lo].cupti_ns);
  double off_hi = (double)(p[hi].host_ns - (int64_t)p[hi].cupti_ns);
  double f = (double)(t - p[lo].cupti_ns) / (double)(p[hi].cupti_ns - p[lo].cupti_ns);
  return (int64_t)t + (int64_t)(off_lo + f * (off_hi - off_lo));
}

/* Waits for every device in use, so that all the work launched so far has
 * finished and CUPTI can hand over its records. */
static tf_status tf_prof_sync_devices(void) { return tf_device_sync_all ? tf_device_sync_all() : TF_OK; }

static bool tf_counters_debug(void);

/* Moves the incoming records into the settled arrays. */
static void tf_prof_settle(tf_prof_session *s) {
  pthread_mutex_lock(&tf_launch_lock);
  tf_u64_map corr = s->corr; /* settling follows a wait for the devices and a forced flush: every
                                launch so far has delivered its records, so the map has done its work */
  s->corr = (tf_u64_map){0};
  pthread_mutex_unlock(&tf_launch_lock);
  pthread_mutex_lock(&tf_record_lock);
  const uint64_t mute_after = s->mute_after;
  tf_prof_kernel *ks = s->in_kernels.data;
  size_t muted = 0;
  for (size_t i = 0; i < s->in_kernels.len; i++) {
    tf_prof_kernel k = ks[i];
    if (!k.host && mute_after && (uint64_t)k.start_ns >= mute_after) { /* a later pass's */
      muted++;
      continue;
    }
    /* Counting, the records are made from the launch calls (prof.cu); the activity records CUPTI
     * delivers all the same when counting by passes are their duplicates, and CUPTI's own kernels. */
    if (!k.host && !k.from_launch && s->opts.num_metrics > 0) continue;
    if (!k.host && k.start_ns == 0 && k.end_ns == 0) {
      s->untimed++;
      continue;
    }
    if (!k.host) {
      k.start_ns = tf_prof_host_time(s, (uint64_t)k.start_ns);
      k.end_ns = tf_prof_host_time(s, (uint64_t)k.end_ns);
      k.range = tf_prof_record_range(s, tf_map_get(&corr, k.correlation), k.graph_node, k.start_ns, k.end_ns);
    }
    if (!tf_vec_push(&s->kernels, sizeof k, &k)) s->dropped++;
  }
  tf_prof_transfer *ts = s->in_transfers.data;
  for (size_t i = 0; i < s->in_transfers.len; i++) {
    tf_prof_transfer t = ts[i];
    if (mute_after && (uint64_t)t.start_ns >= mute_after) continue;
    if (!t.from_launch && !t.memset && s->opts.num_metrics > 0 && strcmp(t.kind, "DtoD") == 0) continue;
    if (t.start_ns == 0 && t.end_ns == 0) {
      s->untimed++;
      continue;
    }
    t.start_ns = tf_prof_host_time(s, (uint64_t)t.start_ns);
    t.end_ns = tf_prof_host_time(s, (uint64_t)t.end_ns);
    uint64_t launch = tf_map_get(&corr, t.correlation);
    if (!launch) launch = tf_map_get(&corr, t.runtime_correlation);
    t.range = tf_prof_record_range(s, launch, t.graph_node, t.start_ns, t.end_ns);
    if (!tf_vec_push(&s->transfers, sizeof t, &t)) s->dropped++;
  }
  if (mute_after && tf_counters_debug())
    fprintf(stderr, "tf.counters: settled %zu kernel records, %zu of them a later pass's\n", s->in_kernels.len, muted);
  s->in_kernels.len = s->in_transfers.len = 0;
  pthread_mutex_unlock(&tf_record_lock);
  tf_map_free(&corr);
}

/* Sets the end of the session's open ranges to now. */
static void tf_prof_mark_open(tf_prof_session *s, int64_t now) {
  for (int i = 0; i < tf_range_count; i++) {
    ptrdiff_t at = tf_ranges[i].recorded;
    if (at >= 0) ((tf_prof_range *)s->ranges.data)[at].end_ns = now;
  }
}

/* ---- hardware counters ------------------------------------------------------------------- */

/* TF_COUNTERS_DEBUG=1: each pairing of a counted range with a launch on stderr. */
static bool tf_counters_debug(void) {
  const char *e = getenv("TF_COUNTERS_DEBUG");
  return e && *e && strcmp(e, "0") != 0;
}

static const char *tf_prof_gpu_precheck(void);

/* Copies the metric names into s (interned) and the capacity, after
 * checking that this build and machine can count. */
static tf_status tf_prof_counters_prepare(tf_prof_session *s, const tf_prof_options *opts) {
  if (!tf_gpu_source || !tf_gpu_source->counters_start)
    return tf_fail(TF_ERR_DEVICE, "this tfhost was built without CUDA: it has no hardware counters (metrics)");
  const char *pre = tf_prof_gpu_precheck();
  if (pre) return tf_fail(TF_ERR_DEVICE, "%s: no hardware counters (metrics) can be read", pre);
  s->metrics = calloc(opts->num_metrics, sizeof *s->metrics);
  if (!s->metrics) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the metric names");
  for (size_t i = 0; i < opts->num_metrics; i++) {
    if (!opts->metrics[i] || !opts->metrics[i][0]) return tf_fail(TF_ERR_ARG, "metric %zu has no name", i + 1);
    s->metrics[i] = tf_intern(opts->metrics[i]);
    if (!s->metrics[i]) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the metric names");
  }
  s->opts.metrics = s->metrics;
  s->opts.num_metrics = opts->num_metrics;
  s->opts.max_kernels = opts->max_kernels ? opts->max_kernels : TF_PROF_COUNTERS_DEFAULT_KERNELS;
  if (opts->by_pass && !tf_gpu_source->counters_pass)
    return tf_fail(TF_ERR_DEVICE, "this tfhost's GPU side cannot count by passes");
  return TF_OK;
}

/* Starts the activity records (always: the counters are paired with their
 * kernel records), then the counters; either failing is an error, not a
 * session with host timings only, since counters were asked for. */
static tf_status tf_prof_counters_start(tf_prof_session *s) {
  /* Kernel and copy records both: a device-to-device copy makes a counted
   * range, and pairing by order needs every launch that made one. */
  s->opts.kernels = s->opts.memcpy = true;
  if (!tf_gpu_source->start(&s->opts, s->reason, sizeof s->reason))
    return tf_fail(TF_ERR_DEVICE, "hardware counters unavailable: %s", s->reason);
  s->gpu = true;
  int64_t t0 = tf_clock_ns();
  char why[512] = "";
  if (!tf_gpu_source->counters_start(s->opts.metrics, s->opts.num_metrics, s->opts.max_kernels, s->opts.by_pass,
                                     &s->counters, why, sizeof why)) {
    tf_gpu_source->stop();
    s->gpu = false;
    return tf_fail(TF_ERR_DEVICE, "hardware counters unavailable: %s", why);
  }
  s->counters.start_ns = tf_clock_ns() - t0;
  s->counters.by_pass = s->opts.by_pass;
  s->counting = true;
  return TF_OK;
}

tf_status tf_prof_next_pass(tf_prof_session *s, bool *more) {
  *more = false;
  if (!s || !s->running) return tf_fail(TF_ERR_STATE, "the profile has stopped: it has no passes left");
  if (!s->opts.by_pass || !s->counting)
    return tf_fail(TF_ERR_STATE, "this profile does not count by passes (tf.prof.start{metrics = ..., by_pass = "
                   "true} does)");
  tf_status st = tf_prof_sync_devices();
  if (st != TF_OK) return st;
  char why[512] = "";
  bool done = false;
  uint64_t launches = 0;
  if (!tf_gpu_source->counters_pass(&done, &launches, why, sizeof why))
    return tf_fail(TF_ERR_BACKEND, "ending counting pass %zu failed: %s", s->passes_run + 1, why);
  s->passes_run++;
  if (s->passes_run == 1) {
    s->counters.launches = launches;
    /* Nothing after the first pass is recorded: the devices have finished
     * it, so whatever starts from now on is a later pass's. */
    int64_t host_ns = 0;
    uint64_t now = 0;
    tf_gpu_source->clock_pair(&host_ns, &now);
    pthread_mutex_lock(&tf_launch_lock);
    pthread_mutex_lock(&tf_record_lock);
    s->muted = true;
    s->mute_after = now ? now : 1;
    const size_t held = s->in_kernels.len;
    pthread_mutex_unlock(&tf_record_lock);
    pthread_mutex_unlock(&tf_launch_lock);
    if (tf_counters_debug())
      fprintf(stderr, "tf.counters: pass 1 ended: %llu launches, %zu kernel records held; records from CUPTI time "
              "%llu on are a later pass's\n", (unsigned long long)launches, held, (unsigned long long)s->mute_after);
  } else if (launches != s->counters.launches) {
    double *values = NULL;
    size_t ranges = 0;
    s->counting = false;
    (void)tf_gpu_source->counters_stop(&values, &ranges, &s->counters, why, sizeof why);
    free(values);
    return tf_fail(TF_ERR_STATE, "counting by passes needs the same work in every pass: pass 1 launched %llu "
                   "kernels and copies, pass %zu %llu (the counters are given up)",
                   (unsigned long long)s->counters.launches, s->passes_run, (unsigned long long)launches);
  }
  *more = !done;
  return TF_OK;
}

/* Reads the counted ranges out (the devices have finished). */
static tf_status tf_prof_counters_stop(tf_prof_session *s) {
  s->counting = false;
  int64_t t0 = tf_clock_ns();
  char why[512] = "";
  bool ok = tf_gpu_source->counters_stop(&s->counter_values, &s->counter_ranges, &s->counters, why, sizeof why);
  s->counters.stop_ns = tf_clock_ns() - t0;
  if (!ok) {
    free(s->counter_values);
    s->counter_values = NULL;
    s->counter_ranges = 0;
    return tf_fail(TF_ERR_BACKEND, "reading the hardware counters failed: %s", why);
  }
  return TF_OK;
}

/* A launch that made a counted range: a kernel, or a device-to-device copy
 * (which the driver runs as a kernel of its own; memsets make none). */
typedef struct tf_counted_launch {
  uint32_t correlation;
  int64_t start_ns;
  bool copy;
  size_t index; /* in s->kernels or s->transfers */
} tf_counted_launch;

static int tf_counted_launch_order(const void *pa, const void *pb) {
  const tf_counted_launch *a = pa, *b = pb;
  if (a->correlation != b->correlation) return a->correlation < b->correlation ? -1 : 1;
  return a->start_ns < b->start_ns ? -1 : a->start_ns > b->start_ns;
}

/* Gives each kernel record its counters. CUPTI's automatic ranges are
 * named by index alone, so the n-th range is paired with the n-th launch
 * on the counted device (in correlation id order, the order of the launch
 * calls). Device-to-device copies take part where the ranges made (those
 * read out and those dropped) outnumber the kernels by them: a range paired
 * with a copy goes to the copy's record (it does not count as a kernel).
 * A kernel record made from its launch call (kernels/cuda/prof.cu) takes
 * its end from the counted gpu__time_duration. Where that was counted, a
 * pair whose counted time does not fit the record (a launch's record: the
 * call that ran it and its replays; an activity record: its duration,
 * within a quarter and 5 us) is counted as mismatched: pairing by order
 * being off by one shows as many of those. */
static void tf_prof_pair_counters(tf_prof_session *s) {
  const bool debug = tf_counters_debug();
  tf_prof_kernel *ks = s->kernels.data;
  tf_prof_transfer *ts = s->transfers.data;
  tf_counted_launch *launches = malloc((s->kernels.len + s->transfers.len + 1) * sizeof *launches);
  size_t n = 0, kernel_launches = 0, copies = 0;
  uint64_t gpu_kernels = 0;
  for (size_t i = 0; i < s->kernels.len; i++) {
    if (ks[i].host) continue;
    gpu_kernels++;
    if (launches && ks[i].device.type == TF_DEV_CUDA && ks[i].device.index == s->counters.device)
      launches[n++] = (tf_counted_launch){ks[i].correlation, ks[i].start_ns, false, i};
  }
  kernel_launches = n;
  for (size_t i = 0; launches && i < s->transfers.len; i++)
    if (!ts[i].memset && strcmp(ts[i].kind, "DtoD") == 0 && ts[i].device.type == TF_DEV_CUDA &&
        ts[i].device.index == s->counters.device) {
      launches[n++] = (tf_counted_launch){ts[i].correlation, ts[i].start_ns, true, i};
      copies++;
    }
  const size_t made = s->counter_ranges + (size_t)s->counters.dropped;
  const bool copies_counted = copies > 0 && made != kernel_launches;
  if (!copies_counted) n = kernel_launches;
  qsort(launches, n, sizeof *launches, tf_counted_launch_order);
  ptrdiff_t duration = -1;
  for (size_t m = 0; m < s->opts.num_metrics; m++)
    if (strcmp(s->metrics[m], "gpu__time_duration.sum") == 0) duration = (ptrdiff_t)m;
  size_t r = 0; /* the next range */
  for (size_t i = 0; i < n && r < s->counter_ranges; i++) {
    const tf_counted_launch *l = &launches[i];
    /* One launch, one range: a second record of a launch (none is
     * expected while counting: graphs run eagerly) gets none and is lost. */
    if (i > 0 && launches[i - 1].correlation == l->correlation) {
      if (debug)
        fprintf(stderr, "tf.counters: launch %u has another record (%s): no range of its own\n", l->correlation,
                l->copy ? "a copy" : ks[l->index].short_name);
      continue;
    }
    if (l->copy) {
      s->counters.copies++;
      ts[l->index].counter_row = (uint32_t)r + 1;
      if (debug)
        fprintf(stderr, "tf.counters: range %zu -> DtoD copy (correlation %u, %llu bytes): a copy, not a kernel\n",
                r, l->correlation, (unsigned long long)ts[l->index].bytes);
      r++;
      continue;
    }
    tf_prof_kernel *k = &ks[l->index];
    k->counter_row = (uint32_t)r + 1;
    s->counters.counted++;
    double recorded = (double)(k->end_ns - k->start_ns);
    double counted = duration >= 0 ? s->counter_values[r * s->opts.num_metrics + (size_t)duration] : -1;
    bool mismatch = false;
    if (duration >= 0 && k->from_launch) {
      mismatch = counted > recorded + 5000;
      k->end_ns = k->start_ns + (int64_t)counted;
    } else if (duration >= 0) {
      double diff = counted > recorded ? counted - recorded : recorded - counted;
      double big = counted > recorded ? counted : recorded;
      mismatch = diff > 5000 && diff > 0.25 * big;
    }
    if (mismatch) s->counters.mismatched++;
    if (debug) {
      fprintf(stderr, "tf.counters: range %zu -> kernel %s (correlation %u): %s %.1f us", r, k->short_name,
              k->correlation, k->from_launch ? "launch call" : "recorded", recorded / 1e3);
      if (duration >= 0) fprintf(stderr, ", counted %.1f us%s", counted / 1e3, mismatch ? " MISMATCH" : "");
      fprintf(stderr, "\n");
    }
    r++;
  }
  if (r < s->counter_ranges) s->counters.unpaired = s->counter_ranges - r;
  s->counters.lost = gpu_kernels - s->counters.counted;
  if (debug)
    fprintf(stderr, "tf.counters: %zu ranges (%llu dropped), %zu kernel launches and %zu DtoD copies on cuda:%d "
            "(copies %s): %llu kernels counted, %llu copies, %llu ranges unpaired, %llu kernels lost, "
            "%llu mismatched\n", s->counter_ranges, (unsigned long long)s->counters.dropped, kernel_launches, copies,
            s->counters.device, copies_counted ? "made ranges" : "made none", (unsigned long long)s->counters.counted,
            (unsigned long long)s->counters.copies, (unsigned long long)s->counters.unpaired,
            (unsigned long long)s->counters.lost, (unsigned long long)s->counters.mismatched);
  if (s->counters.lost)
    fprintf(stderr, "tf.prof: %llu kernels were not counted (lost: past max_kernels = %zu, or on another device)\n",
            (unsigned long long)s->counters.lost, s->opts.max_kernels);
  if (s->counters.sass_left_out[0])
    fprintf(stderr, "tf.prof: the SASS metrics (the CUDA cores' FLOPs) were left out: %s\n", s->counters.sass_left_out);
  free(launches);
}

/* ---- starting and stopping ---------------------------------------------------------------- */

/* Why GPU records cannot be had, before trying CUPTI; NULL when they may. */
static const char *tf_prof_gpu_precheck(void) {
  if (!tf_gpu_source) return "this tfhost was built without CUDA";
  const char *why = tf_gpu_source->unavailable();
  if (why) return why;
  const char *force = getenv("TF_PROF_FORCE_NO_CUPTI");
  if (force && *force && strcmp(force, "0") != 0) return "TF_PROF_FORCE_NO_CUPTI is set";
  return NULL;
}

/* Says once per reason (not once per start) that GPU records are missing. */
static void tf_prof_warn(const char *reason) {
  static char last[256];
  if (strcmp(last, reason) == 0) return;
  snprintf(last, sizeof last, "%s", reason);
  fprintf(stderr, "tf.prof: GPU kernel records unavailable (%s); recording host timings only\n", reason);
  fflush(stderr);
}

bool tf_prof_gpu_available(const char **reason) {
  static char why[256];
  if (tf_running) {
    *reason = tf_running->gpu ? "" : tf_running->reason;
    return tf_running->gpu;
  }
  const char *pre = tf_prof_gpu_precheck();
  if (pre) {
    *reason = pre;
    return false;
  }
  bool ok = tf_gpu_source->probe(why, sizeof why);
  *reason = ok ? "" : why;
  return ok;
}

tf_status tf_prof_start(const tf_prof_options *opts, tf_prof_session **out) {
  if (tf_running)
    return tf_fail(TF_ERR_STATE, "a collector is already running (only one at a time): stop it first with p:stop()");
  tf_prof_session *s = calloc(1, sizeof *s);
  if (!s) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a profiling session");
  s->opts = *opts;
  s->opts.metrics = NULL;
  s->opts.num_metrics = 0;
  s->running = true;
  if (opts->num_metrics > 0) {
    tf_status st = tf_prof_counters_prepare(s, opts);
    if (st != TF_OK) {
      s->running = false;
      tf_prof_session_free(s);
      return st;
    }
  }
  /* The GPU side starts (and warms up, see prof.h) before records are
   * kept: whatever it runs to warm up is not part of the session. */
  if (s->opts.num_metrics > 0) {
    tf_status st = tf_prof_counters_start(s);
    if (st != TF_OK) {
      s->running = false;
      tf_prof_session_free(s);
      return st;
    }
  } else if (opts->kernels || opts->memcpy) {
    const char *pre = tf_prof_gpu_precheck();
    if (pre)
      snprintf(s->reason, sizeof s->reason, "%s", pre);
    else if (tf_gpu_source->start(opts, s->reason, sizeof s->reason))
      s->gpu = true;
    if (!s->gpu) tf_prof_warn(s->reason);
  } else {
    snprintf(s->reason, sizeof s->reason, "GPU records were not asked for");
  }
  s->start_ns = tf_clock_ns();
  pthread_mutex_lock(&tf_record_lock);
  tf_record_target = s;
  pthread_mutex_unlock(&tf_record_lock);
  pthread_mutex_lock(&tf_launch_lock);
  tf_launch_target = s;
  pthread_mutex_unlock(&tf_launch_lock);
  if (s->gpu) tf_prof_clock_point(s);
  tf_running = s;
  atomic_store(&tf_host_ops_flag, opts->host_ops);
  for (int i = 0; i < tf_range_count; i++) tf_range_record(s, i);
  *out = s;
  return TF_OK;
}

tf_status tf_prof_stop(tf_prof_session *s) {
  if (!s || !s->running) return TF_OK;
  atomic_store(&tf_host_ops_flag, false);
  tf_status st = tf_prof_sync_devices();
  int64_t now = tf_clock_ns();
  tf_status counted = TF_OK;
  if (s->counting) counted = tf_prof_counters_stop(s);
  if (s->gpu) {
    tf_prof_clock_point(s);
    tf_gpu_source->stop(); /* flushes what CUPTI still holds into s */
  }
  pthread_mutex_lock(&tf_record_lock);
  tf_record_target = NULL;
  pthread_mutex_unlock(&tf_record_lock);
  tf_prof_settle(s);
  pthread_mutex_lock(&tf_launch_lock);
  tf_launch_target = NULL;
  s->lost += s->lost_launches;
  s->lost_launches = 0;
  pthread_mutex_unlock(&tf_launch_lock);
  if (s->opts.num_metrics > 0 && counted == TF_OK) tf_prof_pair_counters(s);
  tf_prof_mark_open(s, now);
  for (int i = 0; i < tf_range_count; i++) tf_ranges[i].recorded = -1;
  s->running = false;
  s->stop_ns = now;
  tf_running = NULL;
  if (s->dropped + s->lost)
    fprintf(stderr, "tf.prof: %llu records were dropped (out of buffer space)\n",
            (unsigned long long)(s->dropped + s->lost));
  if (st != TF_OK) {
    tf_fail_context("while waiting for the devices to stop profiling");
    return st;
  }
  return counted;
}

tf_status tf_prof_view_get(tf_prof_session *s, tf_prof_view *out) {
  tf_status st = TF_OK;
  if (s->running) {
    st = tf_prof_sync_devices();
    if (s->gpu) {
      tf_gpu_source->flush();
      tf_prof_clock_point(s);
    }
    tf_prof_settle(s);
    tf_prof_mark_open(s, tf_clock_ns());
  }
  *out = (tf_prof_view){0};
  out->kernels = s->kernels.data;
  out->num_kernels = s->kernels.len;
  out->transfers = s->transfers.data;
  out->num_transfers = s->transfers.len;
  out->ranges = s->ranges.data;
  out->num_ranges = s->ranges.len;
  out->running = s->running;
  out->gpu = s->gpu;
  out->gpu_reason = s->gpu ? "" : s->reason;
  out->start_ns = s->start_ns;
  out->stop_ns = s->stop_ns;
  out->dropped = s->dropped + s->lost;
  out->untimed = s->untimed;
  out->options = s->opts;
  out->counter_values = s->counter_values;
  out->counter_rows = s->counter_ranges;
  out->counters = s->counters;
  if (s->clock.len > 1) {
    const tf_clock_point *p = s->clock.data, *q = p + s->clock.len - 1;
    out->clock_drift_ns = (q->host_ns - (int64_t)q->cupti_ns) - (p->host_ns - (int64_t)p->cupti_ns);
  }
  if (st != TF_OK) tf_fail_context("while waiting for the devices to read the profile");
  return st;
}

bool tf_prof_running(const tf_prof_session *s) { return s && s->running; }

bool tf_prof_collecting(void) { return tf_running != NULL; }

bool tf_prof_collecting_gpu(void) { return tf_running && tf_running->gpu; }

bool tf_prof_counting(void) { return tf_running && tf_running->counting; }

tf_status tf_prof_counter_names(const char *chip, const char *base, const char *const **names, size_t *n) {
  *names = NULL;
  *n = 0;
  if (!tf_gpu_source || !tf_gpu_source->counter_names)
    return tf_fail(TF_ERR_DEVICE, "this tfhost was built without CUDA: it has no hardware counters");
  if (!chip) {
    const char *why = tf_gpu_source->unavailable();
    if (why) return tf_fail(TF_ERR_DEVICE, "%s: no hardware counters to read", why);
  }
  char reason[512];
  if (!tf_gpu_source->counter_names(chip, base, names, n, reason, sizeof reason))
    return tf_fail(base || chip ? TF_ERR_ARG : TF_ERR_DEVICE, "%s", reason);
  return TF_OK;
}

bool tf_prof_session_gpu(const tf_prof_session *s, const char **reason) {
  *reason = s->gpu ? "" : s->reason;
  return s->gpu;
}

void tf_prof_session_free(tf_prof_session *s) {
  if (!s) return;
  if (s->running && tf_prof_stop(s) != TF_OK) fprintf(stderr, "tf.prof: %s\n", tf_last_error());
  tf_vec_free(&s->kernels);
  tf_vec_free(&s->transfers);
  tf_vec_free(&s->ranges);
  tf_vec_free(&s->clock);
  tf_vec_free(&s->in_kernels);
  tf_vec_free(&s->in_transfers);
  tf_map_free(&s->corr);
  tf_map_free(&s->replays);
  free(s->metrics);
  free(s->counter_values);
  free(s);
}
