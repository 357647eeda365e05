/* The profiler on a GPU (host/observe/prof.h, kernels/cuda/prof.cu), with work of
 * known shape and length (tests/c/prof_testkernels.cu): a kernel that spins
 * on the GPU's nanosecond clock is launched 4 times in range "outer", 3
 * times in range "inner" nested in it (longer spins), and once outside any
 * range; a memset and two copies of known sizes run in "outer"; a cuBLAS
 * GEMM runs in range "gemm". Checked: counts per range through CUPTI's
 * external correlation ids (cuBLAS's kernels included), spin durations
 * within tolerance of the request, launch shapes (grid, block, registers,
 * static and dynamic shared memory), memcpy/memset byte counts and kinds,
 * timestamps ordered on the stream and inside their range's host interval
 * (each range waits for its work before closing), the clock mapping's
 * drift, a second session that starts empty, one collector at a time, and
 * the forced failure path (TF_PROF_FORCE_NO_CUPTI). Then a CUDA graph
 * captured in ranges and replayed: each replay's kernels land in that
 * replay's instances of the capture's ranges. Prints what it saw.
 * Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "check.h"
#include "model_kernels.h"
#include "ops.h"
#include "prof.h"

#ifdef TF_WITH_CUDA
/* Test-only launchers (tests/c/prof_testkernels.cu). */
tf_status tf_prof_test_spin(tf_device_ctx *ctx, int64_t ns, int gx, int gy, int bx, int by, int dynamic_shared);
tf_status tf_prof_test_memops(tf_device_ctx *ctx, size_t memset_bytes, size_t h2d_bytes, size_t d2h_bytes);

enum {
  OUTER_SPINS = 4,
  INNER_SPINS = 3,
  OUTER_NS = 200000, /* 200 us */
  INNER_NS = 300000, /* 300 us */
  LONE_NS = 100000,  /* 100 us, outside every range */
  GX = 3, GY = 2, BX = 64, BY = 2,
  DYN_SHARED = 512,
  MEMSET_BYTES = 1 << 20, H2D_BYTES = 256 << 10, D2H_BYTES = 64 << 10,
};
static const int64_t SKEW_NS = 50000; /* clock mapping error allowed between host and GPU times */

static bool is_spin(const tf_prof_kernel *k) { return !k->host && strcmp(k->short_name, "tf_prof_spin_kernel") == 0; }

static int by_start(const void *a, const void *b) {
  const tf_prof_kernel *x = *(const tf_prof_kernel *const *)a, *y = *(const tf_prof_kernel *const *)b;
  return (x->start_ns > y->start_ns) - (x->start_ns < y->start_ns);
}

static const tf_prof_range *range_named(const tf_prof_view *v, const char *name) {
  for (size_t i = 0; i < v->num_ranges; i++)
    if (strcmp(v->ranges[i].name, name) == 0) return &v->ranges[i];
  return NULL;
}

static void print_view(const tf_prof_view *v) {
  printf("session: %zu kernels, %zu copies/memsets, %zu ranges, %llu dropped, %llu untimed, clock drift %lld ns\n",
         v->num_kernels, v->num_transfers, v->num_ranges, (unsigned long long)v->dropped,
         (unsigned long long)v->untimed, (long long)v->clock_drift_ns);
  for (size_t i = 0; i < v->num_kernels; i++) {
    const tf_prof_kernel *k = &v->kernels[i];
    printf("  kernel %-28.28s %9.1f us  range %-3llu stream %-3u grid %dx%dx%d block %dx%dx%d regs %d smem %d+%d  %s\n",
           k->short_name, (double)(k->end_ns - k->start_ns) / 1e3, (unsigned long long)k->range, k->stream,
           k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->registers,
           k->static_shared, k->dynamic_shared, k->name);
  }
  for (size_t i = 0; i < v->num_transfers; i++) {
    const tf_prof_transfer *t = &v->transfers[i];
    printf("  %-6s %9llu bytes %8.1f us  range %llu\n", t->kind, (unsigned long long)t->bytes,
           (double)(t->end_ns - t->start_ns) / 1e3, (unsigned long long)t->range);
  }
  for (size_t i = 0; i < v->num_ranges; i++) {
    const tf_prof_range *r = &v->ranges[i];
    printf("  range %llu '%s' parent %llu depth %d: %.1f us%s\n", (unsigned long long)r->id, r->name,
           (unsigned long long)r->parent, r->depth, (double)(r->end_ns - r->start_ns) / 1e3, r->open ? " (open)" : "");
  }
}

/* A GEMM through cuBLAS (tf_matmul) in range "gemm". */
static void run_gemm(void) {
  tf_device gpu = {TF_DEV_CUDA, 0};
  tf_shape s = {2, {256, 256}};
  tf_tensor *a = NULL, *c = NULL;
  CHECK_OK(tf_full(&s, 0.5, TF_F32, gpu, &a));
  CHECK_OK(tf_device_sync(gpu));
  CHECK_OK(tf_range_push("gemm"));
  CHECK_OK(tf_matmul(a, a, &c));
  CHECK_OK(tf_device_sync(gpu));
  CHECK_OK(tf_range_pop());
  tf_tensor_release(a);
  tf_tensor_release(c);
}

static void test_known_work(tf_device_ctx *ctx) {
  /* Load the module and warm up outside the session. */
  CHECK_OK(tf_prof_test_spin(ctx, 1000, 1, 1, 32, 1, 0));
  CHECK_OK(ctx->backend->synchronize(ctx));

  tf_prof_options opts = {true, true, false, NULL, 0, 0, false};
  tf_prof_session *s = NULL;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  const char *reason = NULL;
  if (!CHECK(tf_prof_session_gpu(s, &reason))) {
    fprintf(stderr, "GPU records unavailable on a GPU machine: %s\n", reason);
    tf_prof_session_free(s);
    return;
  }
  tf_prof_session *second = NULL;
  CHECK(tf_prof_start(&opts, &second) == TF_ERR_STATE);

  CHECK_OK(tf_range_push("outer"));
  for (int i = 0; i < OUTER_SPINS; i++) CHECK_OK(tf_prof_test_spin(ctx, OUTER_NS, GX, GY, BX, BY, DYN_SHARED));
  CHECK_OK(tf_range_push("inner"));
  for (int i = 0; i < INNER_SPINS; i++) CHECK_OK(tf_prof_test_spin(ctx, INNER_NS, GX, GY, BX, BY, DYN_SHARED));
  CHECK_OK(ctx->backend->synchronize(ctx)); /* the range's host interval covers its kernels */
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_prof_test_memops(ctx, MEMSET_BYTES, H2D_BYTES, D2H_BYTES));
  CHECK_OK(ctx->backend->synchronize(ctx));
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_prof_test_spin(ctx, LONE_NS, 1, 1, 32, 1, 0));
  run_gemm();

  tf_prof_view v;
  CHECK_OK(tf_prof_view_get(s, &v)); /* a read while running flushes too */
  size_t spins_running = 0;
  for (size_t i = 0; i < v.num_kernels; i++) spins_running += is_spin(&v.kernels[i]);
  CHECK_INT(spins_running, OUTER_SPINS + INNER_SPINS + 1);
  CHECK_OK(tf_prof_stop(s));
  CHECK_OK(tf_prof_view_get(s, &v));
  print_view(&v);
  CHECK(v.gpu && !v.running);
  CHECK_INT(v.dropped, 0);
  CHECK_INT(v.untimed, 0);
  CHECK(llabs(v.clock_drift_ns) < 1000000);

  const tf_prof_range *outer = range_named(&v, "outer"), *inner = range_named(&v, "inner"),
                      *gemm = range_named(&v, "gemm");
  if (!CHECK(outer && inner && gemm)) return;
  CHECK_INT(inner->parent, outer->id);
  CHECK_INT(inner->depth, outer->depth + 1);

  /* Spins: counts per range, durations, launch shape, order on the stream. */
  int in_outer = 0, in_inner = 0, lone = 0, nspins = 0;
  const tf_prof_kernel *spins[OUTER_SPINS + INNER_SPINS + 1];
  uint32_t stream = 0;
  for (size_t i = 0; i < v.num_kernels; i++) {
    const tf_prof_kernel *k = &v.kernels[i];
    if (!is_spin(k)) continue;
    if (nspins < OUTER_SPINS + INNER_SPINS + 1) spins[nspins++] = k;
    int64_t want = k->range == inner->id ? INNER_NS : k->range == outer->id ? OUTER_NS : LONE_NS;
    int64_t dur = k->end_ns - k->start_ns;
    if (!CHECK(dur >= want - 2000 && dur <= want + want / 5 + 20000))
      fprintf(stderr, "  spin of %lld ns took %lld ns\n", (long long)want, (long long)dur);
    if (k->range == outer->id) in_outer++;
    else if (k->range == inner->id) in_inner++;
    else if (k->range == 0) lone++;
    if (k->range == 0) continue; /* the lone spin has a 1x1 grid */
    CHECK_INT(k->device.type, TF_DEV_CUDA);
    CHECK_INT(k->device.index, 0);
    CHECK(k->grid[0] == GX && k->grid[1] == GY && k->grid[2] == 1);
    CHECK(k->block[0] == BX && k->block[1] == BY && k->block[2] == 1);
    CHECK(k->registers > 0);
    CHECK(k->static_shared >= 1024); /* the kernel's 256-int scratch */
    CHECK_INT(k->dynamic_shared, DYN_SHARED);
    CHECK(k->correlation > 0);
    if (stream == 0) stream = k->stream;
    CHECK_INT(k->stream, stream);
    /* Inside its range's host interval. */
    const tf_prof_range *r = k->range == inner->id ? inner : outer;
    CHECK(k->start_ns >= r->start_ns - SKEW_NS && k->end_ns <= r->end_ns + SKEW_NS);
  }
  CHECK_INT(in_outer, OUTER_SPINS);
  CHECK_INT(in_inner, INNER_SPINS);
  CHECK_INT(lone, 1);
  /* One stream runs them one after the other: no overlap, in launch order. */
  qsort(spins, (size_t)nspins, sizeof spins[0], by_start);
  for (int i = 1; i < nspins; i++) CHECK(spins[i]->start_ns >= spins[i - 1]->end_ns - 1000);
  if (nspins == OUTER_SPINS + INNER_SPINS + 1) {
    CHECK_INT(spins[0]->range, outer->id);
    CHECK_INT(spins[OUTER_SPINS]->range, inner->id);
    CHECK_INT(spins[nspins - 1]->range, 0);
  }
  CHECK(inner->start_ns >= outer->start_ns && inner->end_ns <= outer->end_ns);

  /* Memset and copies: sizes, kinds, ranges. */
  bool memset_seen = false, h2d = false, d2h = false;
  for (size_t i = 0; i < v.num_transfers; i++) {
    const tf_prof_transfer *t = &v.transfers[i];
    CHECK(t->end_ns >= t->start_ns);
    if (t->range != outer->id) continue;
    if (t->memset && t->bytes == MEMSET_BYTES) memset_seen = true;
    if (!t->memset && strcmp(t->kind, "HtoD") == 0 && t->bytes == H2D_BYTES) h2d = true;
    if (!t->memset && strcmp(t->kind, "DtoH") == 0 && t->bytes == D2H_BYTES) d2h = true;
    CHECK(t->start_ns >= outer->start_ns - SKEW_NS && t->end_ns <= outer->end_ns + SKEW_NS);
  }
  CHECK(memset_seen);
  CHECK(h2d);
  CHECK(d2h);

  /* cuBLAS's kernels: every kernel launched in "gemm" maps to it. */
  int gemm_kernels = 0;
  for (size_t i = 0; i < v.num_kernels; i++) {
    const tf_prof_kernel *k = &v.kernels[i];
    if (k->host || is_spin(k)) continue;
    if (k->start_ns >= gemm->start_ns && k->end_ns <= gemm->end_ns + SKEW_NS) {
      gemm_kernels++;
      if (!CHECK_INT(k->range, gemm->id)) fprintf(stderr, "  unattributed: %s\n", k->name);
    }
  }
  CHECK(gemm_kernels >= 1);
  tf_prof_session_free(s);

  /* A second session starts empty. */
  if (CHECK_OK(tf_prof_start(&opts, &s))) {
    CHECK_OK(tf_prof_test_spin(ctx, 20000, 1, 1, 32, 1, 0));
    CHECK_OK(tf_prof_view_get(s, &v));
    int spins = 0;
    for (size_t i = 0; i < v.num_kernels; i++) spins += is_spin(&v.kernels[i]);
    CHECK_INT(spins, 1);
    CHECK_INT(v.num_ranges, 0);
    tf_prof_session_free(s);
  }
}

/* A graph captured while the collector runs: 2 spins in "captured", 1 in
 * "captured" > "inner part", 1 outside the capture's ranges; replayed
 * REPLAYS times in range "replay". Then the same graph in a later session
 * (what the capture taught stays), and a graph captured with no collector
 * running, whose replay lands in the range around its launch. */
static void test_graph_replay(tf_device_ctx *ctx) {
  enum { REPLAYS = 3, A_NS = 40000, B_NS = 70000, C_NS = 20000 };
  const tf_model_kernels *mk = ctx->backend->model;
  if (!CHECK(mk && mk->capture_begin && mk->capture_end && mk->graph_launch && mk->graph_destroy)) return;
  tf_prof_options opts = {true, true, false, NULL, 0, 0, false};
  tf_prof_session *s = NULL;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  tf_graph *g = NULL;
  CHECK_OK(tf_range_push("step"));
  tf_prof_graph_capture_begin();
  CHECK_OK(mk->capture_begin(ctx));
  CHECK_OK(tf_range_push("captured"));
  CHECK_OK(tf_prof_test_spin(ctx, A_NS, 1, 1, 32, 1, 0));
  CHECK_OK(tf_prof_test_spin(ctx, A_NS, 1, 1, 32, 1, 0));
  CHECK_OK(tf_range_push("inner part"));
  CHECK_OK(tf_prof_test_spin(ctx, B_NS, 1, 1, 32, 1, 0));
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_prof_test_spin(ctx, C_NS, 1, 1, 32, 1, 0));
  CHECK_OK(mk->capture_end(ctx, &g));
  tf_prof_graph_capture_end();
  if (!CHECK(g != NULL)) return;
  uint64_t replay[REPLAYS];
  for (int i = 0; i < REPLAYS; i++) {
    CHECK_OK(tf_range_push("replay"));
    replay[i] = tf_range_current();
    CHECK_OK(mk->graph_launch(ctx, g));
    CHECK_OK(tf_range_pop());
  }
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_prof_stop(s));
  tf_prof_view v;
  CHECK_OK(tf_prof_view_get(s, &v));
  print_view(&v);
  int in_captured[REPLAYS] = {0}, in_inner[REPLAYS] = {0}, in_replay[REPLAYS] = {0}, graph_spins = 0;
  for (size_t i = 0; i < v.num_kernels; i++) {
    const tf_prof_kernel *k = &v.kernels[i];
    if (!is_spin(k)) continue;
    CHECK(k->graph_node != 0); /* nothing ran outside the graph */
    graph_spins++;
    const tf_prof_range *r = NULL;
    for (size_t j = 0; j < v.num_ranges; j++)
      if (v.ranges[j].id == k->range) r = &v.ranges[j];
    if (!CHECK(r != NULL)) continue;
    int64_t want = strcmp(r->name, "inner part") == 0 ? B_NS : strcmp(r->name, "captured") == 0 ? A_NS : C_NS;
    CHECK(k->end_ns - k->start_ns >= want - 2000);
    /* The replay this kernel belongs to: its range or an ancestor. */
    const tf_prof_range *up = r;
    while (up && !(strcmp(up->name, "replay") == 0 && !up->replay)) {
      const tf_prof_range *parent = NULL;
      for (size_t j = 0; j < v.num_ranges; j++)
        if (v.ranges[j].id == up->parent) parent = &v.ranges[j];
      up = parent;
    }
    int at = -1;
    for (int j = 0; j < REPLAYS && up; j++)
      if (replay[j] == up->id) at = j;
    if (!CHECK(at >= 0)) continue;
    if (r->id == replay[at]) in_replay[at]++;
    else if (strcmp(r->name, "captured") == 0 && r->replay && r->parent == replay[at]) in_captured[at]++;
    else if (strcmp(r->name, "inner part") == 0 && r->replay) in_inner[at]++;
    /* A replayed range spans its kernels. */
    if (r->replay) CHECK(k->start_ns >= r->start_ns && k->end_ns <= r->end_ns);
  }
  CHECK_INT(graph_spins, 4 * REPLAYS);
  for (int i = 0; i < REPLAYS; i++) {
    CHECK_INT(in_captured[i], 2);
    CHECK_INT(in_inner[i], 1);
    CHECK_INT(in_replay[i], 1);
  }
  tf_prof_session_free(s);

  /* A later session: the graph's nodes still know their ranges. */
  if (CHECK_OK(tf_prof_start(&opts, &s))) {
    CHECK_OK(tf_range_push("replay"));
    CHECK_OK(mk->graph_launch(ctx, g));
    CHECK_OK(tf_range_pop());
    CHECK_OK(tf_prof_view_get(s, &v));
    int inner = 0;
    for (size_t i = 0; i < v.num_kernels; i++)
      for (size_t j = 0; j < v.num_ranges; j++)
        if (v.ranges[j].id == v.kernels[i].range && strcmp(v.ranges[j].name, "inner part") == 0) inner++;
    CHECK_INT(inner, 1);
    tf_prof_session_free(s);
  }
  mk->graph_destroy(ctx, g);

  /* Captured with no collector: a replay lands in the range of its launch. */
  g = NULL;
  CHECK_OK(mk->capture_begin(ctx));
  CHECK_OK(tf_range_push("captured"));
  CHECK_OK(tf_prof_test_spin(ctx, C_NS, 1, 1, 32, 1, 0));
  CHECK_OK(tf_range_pop());
  CHECK_OK(mk->capture_end(ctx, &g));
  if (g && CHECK_OK(tf_prof_start(&opts, &s))) {
    CHECK_OK(tf_range_push("late replay"));
    uint64_t late = tf_range_current();
    CHECK_OK(mk->graph_launch(ctx, g));
    CHECK_OK(tf_range_pop());
    CHECK_OK(tf_prof_view_get(s, &v));
    int spins = 0;
    for (size_t i = 0; i < v.num_kernels; i++)
      if (is_spin(&v.kernels[i])) spins += CHECK_INT(v.kernels[i].range, late);
    CHECK_INT(spins, 1);
    tf_prof_session_free(s);
  }
  mk->graph_destroy(ctx, g);
}

/* With the environment variable, the collector steps aside and keeps host records. */
static void test_forced_failure(void) {
  setenv("TF_PROF_FORCE_NO_CUPTI", "1", 1);
  tf_prof_options opts = {true, true, true, NULL, 0, 0, false};
  tf_prof_session *s = NULL;
  if (CHECK_OK(tf_prof_start(&opts, &s))) {
    const char *reason = NULL;
    CHECK(!tf_prof_session_gpu(s, &reason));
    CHECK(strstr(reason, "TF_PROF_FORCE_NO_CUPTI") != NULL);
    tf_prof_record_host_op("by hand", tf_cpu(), tf_clock_ns(), tf_clock_ns(), 0);
    tf_prof_view v;
    CHECK_OK(tf_prof_view_get(s, &v));
    CHECK_INT(v.num_kernels, 1);
    tf_prof_session_free(s);
  }
  unsetenv("TF_PROF_FORCE_NO_CUPTI");
  const char *reason = NULL;
  CHECK(tf_prof_gpu_available(&reason)); /* and comes back after */
}
#endif

int main(void) {
  tf_backends_init();
  if (tf_cuda_device_count() == 0) tf_check_skip("no CUDA device (or a build without CUDA)");
#ifdef TF_WITH_CUDA
  tf_device_ctx *ctx;
  if (!CHECK_OK(tf_device_ctx_get((tf_device){TF_DEV_CUDA, 0}, &ctx))) return tf_check_done();
  test_known_work(ctx);
  test_graph_replay(ctx);
  test_forced_failure();
#endif
  return tf_check_done();
}
