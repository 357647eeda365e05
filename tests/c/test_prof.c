/* The profiler's core without a GPU (host/observe/prof.h, kernels/cpu/cpu_prof.h): kernel
 * name shortening, the range stack (nesting, ids, scoped closes that find
 * inner ranges left open, the depth limit), and sessions recording
 * host-timed ops through the wrapped CPU backend: names, attribution to the
 * innermost range, ranges open at start and at stop, times that nest, one
 * collector at a time, reads after stop, nothing recorded when stopped.
 * The busy time (the union of kernel intervals, per device) of synthetic
 * spans. Last, with a stand-in GPU side feeding records as CUPTI's
 * callbacks and buffers would: launches tied to their ranges, a CUDA
 * graph's replays given instances of the ranges its nodes were captured
 * in, and the busy time of kernels from two streams that overlap. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "check.h"
#include "model_kernels.h"
#include "ops.h"
#include "prof.h"
#include "cpu.h"
#include "cpu_prof.h"

static void check_short(const char *full, const char *want) {
  char out[256];
  tf_prof_short_name(full, out, sizeof out);
  if (!CHECK(strcmp(out, want) == 0)) fprintf(stderr, "  short name of \"%s\": \"%s\", want \"%s\"\n", full, out, want);
}

static void test_short_names(void) {
  check_short("void tf::flash_fwd_kernel<(tf_dtype)2, 64>(tf::FlashParams const&)", "flash_fwd_kernel");
  check_short("void tf_cuda_fill_kernel<float>(float*, long, double)", "tf_cuda_fill_kernel");
  check_short("tf_cuda_adamw_kernel", "tf_cuda_adamw_kernel");
  check_short("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
              "kernel__5x_cublas",
              "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
              "kernel__5x_cublas");
  check_short("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN");
  check_short("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_bf16_64x64_32x6_tn_align8>"
              "(cutlass_80_tensorop_s1688gemm_bf16_64x64_32x6_tn_align8::Params)",
              "cutlass_80_tensorop_s1688gemm_bf16_64x64_32x6_tn_align8");
  check_short("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int>, void> >"
              "(cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int>, void>::Params)",
              "GemmUniversal");
  check_short("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
              "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
              "vectorized_elementwise_kernel");
  check_short("void (anonymous namespace)::softmax_warp_forward<float, float, 10>(float*, float const*, int)",
              "softmax_warp_forward");
  check_short("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::"
              "BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >"
              "(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::"
              "binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl<"
              "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >"
              "(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::"
              "binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})",
              "elementwise_kernel");
  check_short("splitKreduce_kernel", "splitKreduce_kernel");
  check_short("matmul", "matmul");
  check_short("unary:exp", "unary:exp");
}

static void test_ranges(void) {
  CHECK_INT(tf_range_depth(), 0);
  CHECK_INT(tf_range_current(), 0);
  CHECK(tf_range_pop() == TF_ERR_STATE); /* nothing open */
  CHECK_OK(tf_range_push("outer"));
  uint64_t outer = tf_range_current();
  CHECK(outer > 0);
  char name[32];
  snprintf(name, sizeof name, "inner");
  CHECK_OK(tf_range_push(name));
  name[0] = 'X'; /* the stack keeps its own copy */
  uint64_t inner = tf_range_current();
  CHECK(inner > outer);
  const char *names[4];
  CHECK_INT(tf_range_stack(names, 4), 2);
  CHECK(strcmp(names[0], "outer") == 0 && strcmp(names[1], "inner") == 0);
  CHECK_INT(tf_range_stack(names, 1), 1);
  CHECK(names[0] == tf_intern("outer")); /* interned */
  CHECK_OK(tf_range_close(inner));
  CHECK_OK(tf_range_close(inner)); /* closed already: nothing to do */
  CHECK_INT(tf_range_current(), outer);
  CHECK_OK(tf_range_pop());
  CHECK_INT(tf_range_depth(), 0);

  /* Closing a range with ranges still open inside closes them too and says so. */
  CHECK_OK(tf_range_push("a"));
  uint64_t a = tf_range_current();
  CHECK_OK(tf_range_push("b"));
  CHECK_OK(tf_range_push("c"));
  CHECK(tf_range_close(a) == TF_ERR_STATE);
  CHECK(strstr(tf_last_error(), "range 'a' closed while 'b', 'c' opened inside it were still open") != NULL);
  CHECK_INT(tf_range_depth(), 0);

  /* The depth limit is an error, not an overflow. */
  for (int i = 0; i < TF_RANGE_MAX_DEPTH; i++) CHECK_OK(tf_range_push("deep"));
  CHECK(tf_range_push("one too many") == TF_ERR_STATE);
  for (int i = 0; i < TF_RANGE_MAX_DEPTH; i++) CHECK_OK(tf_range_pop());
  CHECK_INT(tf_range_depth(), 0);
}

static const tf_prof_kernel *find_op(const tf_prof_view *v, const char *name, int nth) {
  for (size_t i = 0; i < v->num_kernels; i++)
    if (strcmp(v->kernels[i].name, name) == 0 && nth-- == 0) return &v->kernels[i];
  return NULL;
}

static int count_op(const tf_prof_view *v, const char *name, uint64_t range) {
  int n = 0;
  for (size_t i = 0; i < v->num_kernels; i++)
    if (strcmp(v->kernels[i].name, name) == 0 && (range == (uint64_t)-1 || v->kernels[i].range == range)) n++;
  return n;
}

static const tf_prof_range *find_range(const tf_prof_view *v, uint64_t id) {
  for (size_t i = 0; i < v->num_ranges; i++)
    if (v->ranges[i].id == id) return &v->ranges[i];
  return NULL;
}

static void test_sessions(void) {
  tf_device_ctx *ctx;
  if (!CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx))) return;
  const tf_backend *wrapped = tf_cpu_prof_backend(tf_cpu_backend());
  CHECK(wrapped == tf_cpu_prof_backend(tf_cpu_backend())); /* one table per plain table */
  CHECK(wrapped == tf_cpu_prof_backend(wrapped));
  CHECK(tf_prof_backend_is_wrapped(wrapped));
  CHECK(wrapped->model && wrapped->model->gemm);
  tf_tensor *t = NULL, *e = NULL;
  tf_shape shape = {1, {4}};
  CHECK_OK(tf_full(&shape, 0.0, TF_F32, tf_cpu(), &t));
  CHECK_OK(tf_full(&shape, 0.0, TF_F32, tf_cpu(), &e));

  /* Not recording: ops still run, nothing is kept. */
  CHECK(!tf_prof_host_ops_on());
  CHECK_OK(wrapped->fill(ctx, t, 2.0));
  float got[4];
  CHECK_OK(tf_tensor_read(t, got, sizeof got));
  CHECK(got[0] == 2.0f && got[3] == 2.0f);

  CHECK_OK(tf_range_push("before start")); /* open when the session starts */
  uint64_t before = tf_range_current();
  tf_prof_options opts = {true, true, true, NULL, 0, 0, false};
  tf_prof_session *s = NULL, *other = NULL;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  CHECK(tf_prof_start(&opts, &other) == TF_ERR_STATE);
  CHECK(strstr(tf_last_error(), "already running") != NULL);
  CHECK(tf_prof_host_ops_on());
  const char *reason = NULL;
  bool gpu = tf_prof_session_gpu(s, &reason);
  printf("GPU records: %s%s\n", gpu ? "yes" : "no: ", gpu ? "" : reason);
  if (!gpu) CHECK(reason && *reason);

  CHECK_OK(wrapped->fill(ctx, t, 1.0)); /* in "before start" */
  CHECK_OK(tf_range_push("a"));
  uint64_t a = tf_range_current();
  for (int i = 0; i < 3; i++) CHECK_OK(wrapped->unary(ctx, TF_OP_EXP, t, e));
  CHECK_OK(tf_range_push("b"));
  uint64_t b = tf_range_current();
  float one = 1.0f, out = 0.0f;
  tf_gemm_args g = {0};
  g.a = &one, g.b = &one, g.c = &out;
  g.ab_dtype = g.c_dtype = TF_F32;
  g.batch = g.m = g.n = g.k = 1;
  g.lda = g.ldb = g.ldc = 1;
  for (int i = 0; i < 2; i++) CHECK_OK(wrapped->model->gemm(ctx, &g));
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_range_pop());
  CHECK(out == 1.0f);
  CHECK_OK(tf_range_push("open at stop"));
  uint64_t open_at_stop = tf_range_current();

  tf_prof_view v;
  CHECK_OK(tf_prof_view_get(s, &v)); /* while running */
  CHECK(v.running);
  CHECK_INT(count_op(&v, "unary:exp", a), 3);
  CHECK_INT(count_op(&v, "gemm", b), 2);

  CHECK_OK(tf_prof_stop(s));
  CHECK_OK(tf_prof_stop(s)); /* stopping again does nothing */
  CHECK(!tf_prof_host_ops_on());
  CHECK_OK(wrapped->fill(ctx, t, 3.0)); /* after stop: not recorded */
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_range_pop());

  CHECK_OK(tf_prof_view_get(s, &v));
  CHECK(!v.running);
  CHECK(v.stop_ns >= v.start_ns);
  CHECK_INT(count_op(&v, "fill", -1), 1);
  CHECK_INT(count_op(&v, "fill", before), 1);
  CHECK_INT(count_op(&v, "unary:exp", a), 3);
  CHECK_INT(count_op(&v, "gemm", b), 2);
  CHECK_INT(v.num_ranges, 4);
  const tf_prof_range *rb = find_range(&v, before), *ra = find_range(&v, a), *rbb = find_range(&v, b),
                      *ro = find_range(&v, open_at_stop);
  if (CHECK(rb && ra && rbb && ro)) {
    CHECK(rb->start_ns < v.start_ns); /* opened before the session */
    CHECK(rb->open && ro->open && !ra->open && !rbb->open);
    CHECK(rb->end_ns == v.stop_ns && ro->end_ns == v.stop_ns);
    CHECK_INT(ra->parent, before);
    CHECK_INT(rbb->parent, a);
    CHECK_INT(ra->depth, 1);
    CHECK_INT(rbb->depth, 2);
    CHECK(strcmp(rbb->name, "b") == 0);
    CHECK(ra->start_ns <= rbb->start_ns && rbb->end_ns <= ra->end_ns);
    for (int i = 0; i < 2; i++) {
      const tf_prof_kernel *k = find_op(&v, "gemm", i);
      if (!CHECK(k)) break;
      CHECK(k->host && k->device.type == TF_DEV_CPU);
      CHECK(strcmp(k->short_name, "gemm") == 0);
      CHECK(rbb->start_ns <= k->start_ns && k->start_ns <= k->end_ns && k->end_ns <= rbb->end_ns);
    }
  }

  /* A new session starts empty; the stopped one stays readable. */
  if (CHECK_OK(tf_prof_start(&opts, &other))) {
    CHECK_OK(wrapped->unary(ctx, TF_OP_EXP, t, e));
    tf_prof_view w;
    CHECK_OK(tf_prof_view_get(other, &w));
    CHECK_INT(w.num_kernels, 1);
    CHECK_INT(w.num_ranges, 0);
    tf_prof_session_free(other); /* stops it */
    CHECK(!tf_prof_host_ops_on());
  }
  CHECK_OK(tf_prof_view_get(s, &v));
  CHECK_INT(count_op(&v, "unary:exp", -1), 3);
  tf_prof_session_free(s);

  /* Host ops only: no CUPTI attempt. */
  tf_prof_options host_only = {false, false, true, NULL, 0, 0, false};
  if (CHECK_OK(tf_prof_start(&host_only, &s))) {
    CHECK(!tf_prof_session_gpu(s, &reason));
    CHECK(strstr(reason, "not asked for") != NULL);
    tf_prof_session_free(s);
  }
  tf_tensor_release(t);
  tf_tensor_release(e);
}

/* TF_PROF_FORCE_NO_CUPTI: the failure path, whatever the machine has. */
static void test_forced_failure(void) {
  setenv("TF_PROF_FORCE_NO_CUPTI", "1", 1);
  const char *reason = NULL;
  CHECK(!tf_prof_gpu_available(&reason));
  printf("forced: %s\n", reason);
  tf_prof_options opts = {true, true, true, NULL, 0, 0, false};
  tf_prof_session *s = NULL;
  if (CHECK_OK(tf_prof_start(&opts, &s))) {
    CHECK(!tf_prof_session_gpu(s, &reason));
    if (tf_cuda_device_count() > 0) CHECK(strstr(reason, "TF_PROF_FORCE_NO_CUPTI") != NULL);
    tf_prof_record_host_op("by hand", tf_cpu(), tf_clock_ns(), tf_clock_ns(), 0);
    tf_prof_view v;
    CHECK_OK(tf_prof_view_get(s, &v));
    CHECK_INT(v.num_kernels, 1);
    tf_prof_session_free(s);
  }
  unsetenv("TF_PROF_FORCE_NO_CUPTI");
}

/* ---- a stand-in GPU side ------------------------------------------------------------- */

static const char *fake_unavailable(void) { return NULL; }
static bool fake_probe(char *reason, size_t n) { (void)reason, (void)n; return true; }
static bool fake_start(const tf_prof_options *o, char *reason, size_t n) { (void)o, (void)reason, (void)n; return true; }
static void fake_nothing(void) {}
/* CUPTI's clock is the host's here: record times need no mapping. */
static void fake_clock(int64_t *host_ns, uint64_t *cupti_ns) {
  *host_ns = tf_clock_ns();
  *cupti_ns = (uint64_t)*host_ns;
}
static const tf_prof_gpu_source fake_source = {fake_unavailable, fake_probe, fake_start, fake_nothing, fake_nothing,
                                               fake_clock,       NULL,       NULL,       NULL,
                                               NULL};

/* Stand-in counters: ranges of two metrics (a duration, a count), in
 * launch order, as CUPTI's range profiler would hand them over, with the
 * number it dropped past its capacity; each test sets them. */
static int fake_counter_starts;
static const double *fake_range_values;
static size_t fake_range_count, fake_ranges_dropped;
static uint64_t fake_pass_launches[4]; /* launches each pass reports */
static size_t fake_passes_needed = 3, fake_passes_ended;
static bool fake_counters_start(const char *const *metrics, size_t n, size_t max_kernels, bool by_pass,
                                tf_prof_counter_info *info, char *reason, size_t reason_size) {
  (void)metrics, (void)n, (void)reason, (void)reason_size, (void)by_pass;
  fake_passes_ended = 0;
  fake_counter_starts++;
  info->device = 0;
  info->passes = 3;
  info->max_kernels = max_kernels;
  return true;
}
static bool fake_counters_stop(double **values, size_t *ranges, tf_prof_counter_info *info, char *reason,
                               size_t reason_size) {
  (void)reason, (void)reason_size;
  *values = malloc(fake_range_count * 2 * sizeof **values);
  memcpy(*values, fake_range_values, fake_range_count * 2 * sizeof **values);
  *ranges = fake_range_count;
  info->ranges = fake_range_count;
  info->dropped = fake_ranges_dropped;
  return true;
}
static bool fake_counters_pass(bool *done, uint64_t *launches, char *reason, size_t reason_size) {
  (void)reason, (void)reason_size;
  *launches = fake_pass_launches[fake_passes_ended % 4];
  *done = ++fake_passes_ended >= fake_passes_needed;
  return true;
}
static const tf_prof_gpu_source fake_counting_source = {
    fake_unavailable,   fake_probe,         fake_start, fake_nothing, fake_nothing, fake_clock, fake_counters_start,
    fake_counters_pass, fake_counters_stop, NULL};

/* A kernel record as CUPTI's thread hands it over. */
static void fake_kernel_from(const char *name, uint32_t correlation, uint64_t node, int64_t start_ns, int64_t end_ns,
                             bool from_launch) {
  tf_prof_kernel k = {0};
  k.from_launch = from_launch;
  k.name = k.short_name = name;
  k.correlation = correlation;
  k.graph_node = node;
  k.start_ns = start_ns;
  k.end_ns = end_ns;
  k.device = (tf_device){TF_DEV_CUDA, 0};
  tf_prof_gpu_lock();
  tf_prof_gpu_kernel(&k);
  tf_prof_gpu_unlock();
}

static void fake_kernel(const char *name, uint32_t correlation, uint64_t node, int64_t start_ns, int64_t end_ns) {
  fake_kernel_from(name, correlation, node, start_ns, end_ns, false);
}

static const tf_prof_kernel *kernel_at(const tf_prof_view *v, const char *name, int64_t start_ns) {
  for (size_t i = 0; i < v->num_kernels; i++)
    if (strcmp(v->kernels[i].name, name) == 0 && v->kernels[i].start_ns == start_ns) return &v->kernels[i];
  return NULL;
}

/* Launches in ranges (a library's launch through the driver is the same
 * call to the collector), a graph captured in ranges "attn" > "scores"
 * and replayed twice in range "replay", a node cloned at instantiation, a
 * node captured outside any range of the capture, and a node the
 * collector never saw. */
static void test_launches_and_replays(void) {
  tf_prof_set_gpu_source(&fake_source);
  tf_prof_options opts = {true, true, false, NULL, 0, 0, false};
  tf_prof_session *s = NULL;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  const char *reason = NULL;
  CHECK(tf_prof_session_gpu(s, &reason));
  CHECK(tf_prof_collecting_gpu());

  CHECK_OK(tf_range_push("step"));
  const uint64_t step = tf_range_current();
  tf_prof_gpu_launch(10); /* an eager kernel in "step" */
  /* The capture: nodes 1..3 made under the capture's ranges, then cloned. */
  tf_prof_graph_capture_begin();
  CHECK_OK(tf_range_push("attn"));
  tf_prof_gpu_graph_node(1, 0);
  CHECK_OK(tf_range_push("scores"));
  tf_prof_gpu_graph_node(2, 0);
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_range_pop());
  tf_prof_gpu_graph_node(3, 0); /* outside the capture's ranges */
  tf_prof_graph_capture_end();
  tf_prof_gpu_graph_node(11, 1);
  tf_prof_gpu_graph_node(12, 2);
  tf_prof_gpu_graph_node(13, 3);
  uint64_t replay[2];
  for (int i = 0; i < 2; i++) {
    CHECK_OK(tf_range_push("replay"));
    replay[i] = tf_range_current();
    tf_prof_gpu_launch((uint32_t)(20 + i)); /* the graph launch */
    CHECK_OK(tf_range_pop());
  }
  CHECK_OK(tf_range_pop());
  tf_prof_gpu_launch(30); /* outside every range */

  /* The records, as they would come: replay i runs from t0 + 1000 i. */
  const int64_t t0 = tf_clock_ns();
  fake_kernel("eager", 10, 0, t0 - 500, t0 - 400);
  for (int i = 0; i < 2; i++) {
    int64_t b = t0 + 1000 * i;
    fake_kernel("attn_k", (uint32_t)(20 + i), 11, b + 10, b + 20);
    fake_kernel("scores_k", (uint32_t)(20 + i), 12, b + 30, b + 60);
    fake_kernel("scores_k", (uint32_t)(20 + i), 12, b + 70, b + 90);
    fake_kernel("tail_k", (uint32_t)(20 + i), 13, b + 100, b + 110);
    fake_kernel("unseen_k", (uint32_t)(20 + i), 99, b + 120, b + 130);
  }
  fake_kernel("lone", 30, 0, t0 + 5000, t0 + 5100);
  CHECK_OK(tf_prof_stop(s));
  tf_prof_view v;
  CHECK_OK(tf_prof_view_get(s, &v));
  CHECK_INT(v.num_kernels, 12);

  const tf_prof_kernel *k = kernel_at(&v, "eager", t0 - 500);
  CHECK(k && k->range == step);
  k = kernel_at(&v, "lone", t0 + 5000);
  CHECK(k && k->range == 0);
  uint64_t attn_seen[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    int64_t b = t0 + 1000 * i;
    const tf_prof_kernel *a = kernel_at(&v, "attn_k", b + 10), *sc = kernel_at(&v, "scores_k", b + 30),
                         *sc2 = kernel_at(&v, "scores_k", b + 70), *tail = kernel_at(&v, "tail_k", b + 100),
                         *unseen = kernel_at(&v, "unseen_k", b + 120);
    if (!CHECK(a && sc && sc2 && tail && unseen)) return;
    /* Outside the capture's ranges, or never seen: the replay's own range. */
    CHECK_INT(tail->range, replay[i]);
    CHECK_INT(unseen->range, replay[i]);
    CHECK_INT(sc->range, sc2->range);
    const tf_prof_range *ra = find_range(&v, a->range), *rs = find_range(&v, sc->range),
                        *rr = find_range(&v, replay[i]);
    if (!CHECK(ra && rs && rr)) return;
    CHECK(strcmp(ra->name, "attn") == 0 && ra->replay && !ra->open);
    CHECK(strcmp(rs->name, "scores") == 0 && rs->replay);
    CHECK_INT(ra->parent, replay[i]);
    CHECK_INT(rs->parent, ra->id);
    CHECK_INT(ra->depth, rr->depth + 1);
    CHECK_INT(rs->depth, rr->depth + 2);
    CHECK(!rr->replay);
    /* A replay range spans its kernels' GPU times (the parent's include the child's). */
    CHECK_INT(rs->start_ns, b + 30);
    CHECK_INT(rs->end_ns, b + 90);
    CHECK_INT(ra->start_ns, b + 10);
    CHECK_INT(ra->end_ns, b + 90);
    attn_seen[i] = ra->id;
  }
  CHECK(attn_seen[0] != attn_seen[1]); /* one instance per replay */
  /* Ranges stay in order of id. */
  for (size_t i = 1; i < v.num_ranges; i++) CHECK(v.ranges[i].id > v.ranges[i - 1].id);
  CHECK_INT(v.num_ranges, 5 + 2 * 2); /* step, the capture's attn and scores, replay x2; attn and scores per replay */
  tf_prof_session_free(s);

  /* A later session keeps what the capture taught: a replay lands in "attn" again. */
  if (CHECK_OK(tf_prof_start(&opts, &s))) {
    CHECK_OK(tf_range_push("again"));
    tf_prof_gpu_launch(40);
    CHECK_OK(tf_range_pop());
    fake_kernel("attn_k", 40, 11, t0 + 9000, t0 + 9010);
    CHECK_OK(tf_prof_view_get(s, &v));
    CHECK_INT(v.num_kernels, 1);
    const tf_prof_range *r = v.num_kernels ? find_range(&v, v.kernels[0].range) : NULL;
    CHECK(r && strcmp(r->name, "attn") == 0 && r->replay);
    tf_prof_session_free(s);
  }
  CHECK(!tf_prof_collecting_gpu());
}

/* Busy time is the union of the intervals, per device: overlapping, nested,
 * touching, disjoint, empty and reversed spans, in any order, on two
 * devices; never more than the summed durations nor than first start to
 * last end on one device. */
static void test_busy_union(void) {
  const tf_device gpu0 = {TF_DEV_CUDA, 0}, gpu1 = {TF_DEV_CUDA, 1};
  CHECK_INT(tf_prof_busy_ns(NULL, 0), 0);
  tf_prof_span one[] = {{100, 250, gpu0}};
  CHECK_INT(tf_prof_busy_ns(one, 1), 150);
  /* Two streams: [0,100) beside [50,150) -> [0,150); nested [20,30); touching [150,160); apart [200,210). */
  tf_prof_span spans[] = {
      {200, 210, gpu0}, {50, 150, gpu0}, {20, 30, gpu0}, {0, 100, gpu0}, {150, 160, gpu0},
      {300, 300, gpu0}, /* empty */
      {400, 390, gpu0}, /* reversed: covers nothing */
      {0, 100, gpu1},   {10, 40, gpu1}, /* the other device's time adds, however it overlaps gpu0's */
  };
  const size_t n = sizeof spans / sizeof spans[0];
  int64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += spans[i].end_ns > spans[i].start_ns ? spans[i].end_ns - spans[i].start_ns : 0;
  const int64_t busy = tf_prof_busy_ns(spans, n);
  CHECK_INT(busy, 160 + 10 + 100);
  CHECK(busy < sum);
  /* Sorted by device, then start. */
  for (size_t i = 1; i < n; i++) {
    const tf_prof_span *a = &spans[i - 1], *b = &spans[i];
    CHECK(a->device.index < b->device.index || (a->device.index == b->device.index && a->start_ns <= b->start_ns));
  }
  /* Random spans against a brute-force count of the covered nanoseconds. */
  srand(7);
  for (int round = 0; round < 50; round++) {
    enum { N = 40, T = 2000 };
    tf_prof_span r[N];
    static unsigned char covered[2][T];
    memset(covered, 0, sizeof covered);
    int64_t total = 0, lo[2] = {T, T}, hi[2] = {0, 0};
    for (int i = 0; i < N; i++) {
      int d = rand() % 2;
      int64_t s0 = rand() % (T - 100), len = rand() % 100;
      r[i] = (tf_prof_span){s0, s0 + len, d ? gpu1 : gpu0};
      total += len;
      for (int64_t t = s0; t < s0 + len; t++) covered[d][t] = 1;
      if (len > 0) {
        if (s0 < lo[d]) lo[d] = s0;
        if (s0 + len > hi[d]) hi[d] = s0 + len;
      }
    }
    int64_t want = 0;
    for (int d = 0; d < 2; d++)
      for (int t = 0; t < T; t++) want += covered[d][t];
    int64_t got = tf_prof_busy_ns(r, N);
    if (!CHECK_INT(got, want)) break;
    CHECK(got <= total);
    CHECK(got <= (hi[0] > lo[0] ? hi[0] - lo[0] : 0) + (hi[1] > lo[1] ? hi[1] - lo[1] : 0));
  }
}

/* Records fed in as CUPTI would deliver them: a step whose optimizer
 * kernels run on a second stream beside the backward pass's; the busy time
 * of the session's kernels is their union, below their sum and inside the
 * range that waited for them. */
static void test_overlapped_records(void) {
  tf_prof_set_gpu_source(&fake_source);
  tf_prof_options opts = {true, true, false, NULL, 0, 0, false};
  tf_prof_session *s = NULL;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  CHECK_OK(tf_range_push("step"));
  const uint64_t step = tf_range_current();
  for (uint32_t c = 50; c < 54; c++) tf_prof_gpu_launch(c);
  const int64_t t0 = tf_clock_ns();
  fake_kernel("backward_a", 50, 0, t0 + 100, t0 + 400);
  fake_kernel("adamw", 51, 0, t0 + 300, t0 + 600); /* beside backward_a and backward_b */
  fake_kernel("backward_b", 52, 0, t0 + 400, t0 + 700);
  fake_kernel("adamw", 53, 0, t0 + 800, t0 + 900);
  while (tf_clock_ns() < t0 + 1000) {
  }
  CHECK_OK(tf_range_pop());
  CHECK_OK(tf_prof_stop(s));
  tf_prof_view v;
  if (CHECK_OK(tf_prof_view_get(s, &v)) && CHECK_INT(v.num_kernels, 4)) {
    tf_prof_span spans[4];
    int64_t sum = 0;
    for (size_t i = 0; i < v.num_kernels; i++) {
      CHECK_INT(v.kernels[i].range, step);
      spans[i] = (tf_prof_span){v.kernels[i].start_ns, v.kernels[i].end_ns, v.kernels[i].device};
      sum += v.kernels[i].end_ns - v.kernels[i].start_ns;
    }
    const int64_t busy = tf_prof_busy_ns(spans, v.num_kernels);
    CHECK_INT(sum, 1000);
    CHECK_INT(busy, 700);
    const tf_prof_range *r = find_range(&v, step);
    if (CHECK(r)) CHECK(busy <= r->end_ns - r->start_ns);
  }
  tf_prof_session_free(s);
}

/* A device-to-device copy of 64 bytes (correlation c, at t), and a memset
 * (which never makes a counted range), as CUPTI's thread hands them over. */
static void fake_copy_and_memset(uint32_t c, uint32_t memset_c, int64_t t) {
  tf_prof_transfer copy = {0};
  copy.kind = "DtoD";
  copy.bytes = 64;
  copy.correlation = c;
  copy.start_ns = t;
  copy.end_ns = t + 100;
  copy.device = (tf_device){TF_DEV_CUDA, 0};
  copy.from_launch = true;
  tf_prof_transfer memset_rec = copy;
  memset_rec.from_launch = false;
  memset_rec.memset = true;
  memset_rec.kind = "memset";
  memset_rec.correlation = memset_c;
  tf_prof_gpu_lock();
  tf_prof_gpu_transfer(&copy);
  tf_prof_gpu_transfer(&memset_rec);
  tf_prof_gpu_unlock();
}

/* Counters are paired with launches by order on the counted device: the
 * n-th range with the n-th launch (correlation order, whatever order the
 * records arrive in), a device-to-device copy's range left out, a kernel
 * past the ranges lost, the stand-in's durations matching the records'.
 * Without a source that counts, asking for counters is an error; the
 * time-only session never starts the counters. */
static void test_counters_pairing(void) {
  static const char *const metrics[] = {"gpu__time_duration.sum", "sm__count.sum"};
  tf_prof_options opts = {true, true, false, metrics, 2, 0, false};
  tf_prof_session *s = NULL;
  tf_prof_set_gpu_source(&fake_source);
  CHECK(tf_prof_start(&opts, &s) == TF_ERR_DEVICE);
  CHECK(strstr(tf_last_error(), "no hardware counters") != NULL);
  CHECK(!tf_prof_collecting());

  tf_prof_set_gpu_source(&fake_counting_source);
  tf_prof_options plain = {true, true, false, NULL, 0, 0, false};
  if (CHECK_OK(tf_prof_start(&plain, &s))) {
    CHECK(!tf_prof_counting());
    tf_prof_session_free(s);
  }
  CHECK_INT(fake_counter_starts, 0);

  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  CHECK(tf_prof_counting());
  CHECK_INT(fake_counter_starts, 1);
  /* Four ranges made (the copy's among them), one dropped past the capacity. */
  static const double values[] = {100, 1, 100, 2, 200, 3}; /* range 1 is the copy's */
  fake_range_values = values, fake_range_count = 3, fake_ranges_dropped = 1;
  const int64_t t0 = tf_clock_ns();
  fake_kernel_from("second", 7, 0, t0 + 1000, t0 + 1200, true);
  fake_kernel_from("first", 5, 0, t0, t0 + 100, true);
  fake_kernel_from("past_the_ranges", 8, 0, t0 + 2000, t0 + 2100, true);
  fake_copy_and_memset(6, 4, t0 + 500);
  CHECK_OK(tf_prof_stop(s));
  CHECK(!tf_prof_counting());
  tf_prof_view v;
  if (CHECK_OK(tf_prof_view_get(s, &v))) {
    CHECK_INT(v.options.num_metrics, 2);
    CHECK(strcmp(v.options.metrics[0], "gpu__time_duration.sum") == 0);
    CHECK_INT(v.options.max_kernels, TF_PROF_COUNTERS_DEFAULT_KERNELS);
    CHECK_INT(v.counter_rows, 3);
    CHECK_INT(v.counters.counted, 2);
    CHECK_INT(v.counters.copies, 1);
    CHECK_INT(v.counters.lost, 1);
    CHECK_INT(v.counters.unpaired, 0);
    CHECK_INT(v.counters.mismatched, 0);
    CHECK_INT(v.counters.passes, 3);
    for (size_t i = 0; i < v.num_kernels; i++) {
      const tf_prof_kernel *k = &v.kernels[i];
      if (strcmp(k->name, "first") == 0 && CHECK_INT(k->counter_row, 1))
        CHECK_NEAR(v.counter_values[(k->counter_row - 1) * 2 + 1], 1, 0);
      if (strcmp(k->name, "second") == 0 && CHECK_INT(k->counter_row, 3))
        CHECK_NEAR(v.counter_values[(k->counter_row - 1) * 2 + 1], 3, 0);
      if (strcmp(k->name, "past_the_ranges") == 0) CHECK_INT(k->counter_row, 0);
    }
    for (size_t i = 0; i < v.num_transfers; i++)
      CHECK_INT(v.transfers[i].counter_row, v.transfers[i].memset ? 0 : 2);
  }
  tf_prof_session_free(s);
}

/* Kernel records made from the launch calls while counting: as many ranges
 * as kernels means the copy made none (it is left out of the order); each
 * record's end becomes its start plus the counted duration, and a counted
 * time longer than the call that ran it is a mismatch. */
static void test_counters_launch_records(void) {
  static const char *const metrics[] = {"gpu__time_duration.sum", "sm__count.sum"};
  tf_prof_options opts = {true, true, false, metrics, 2, 0, false};
  tf_prof_session *s = NULL;
  tf_prof_set_gpu_source(&fake_counting_source);
  static const double values[] = {1000, 1, 200, 2, 20000, 3};
  fake_range_values = values, fake_range_count = 3, fake_ranges_dropped = 0;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  const int64_t t0 = tf_clock_ns();
  fake_kernel_from("a", 20, 0, t0, t0 + 5000, true);
  fake_copy_and_memset(21, 19, t0 + 5500);
  fake_kernel_from("b", 22, 0, t0 + 6000, t0 + 6100, true);
  fake_kernel_from("c", 23, 0, t0 + 7000, t0 + 7100, true); /* counted 20 us in a 0.1 us call */
  fake_kernel("a", 20, 0, t0 + 10, t0 + 1010);              /* CUPTI's activity record of it: a duplicate */
  CHECK_OK(tf_prof_stop(s));
  tf_prof_view v;
  if (CHECK_OK(tf_prof_view_get(s, &v))) {
    CHECK_INT(v.num_kernels, 3);
    CHECK_INT(v.counters.counted, 3);
    CHECK_INT(v.counters.copies, 0);
    CHECK_INT(v.counters.lost, 0);
    CHECK_INT(v.counters.unpaired, 0);
    CHECK_INT(v.counters.mismatched, 1);
    static const char *const order[] = {"a", "b", "c"};
    for (size_t i = 0; i < v.num_kernels; i++) {
      const tf_prof_kernel *k = &v.kernels[i];
      for (uint32_t j = 0; j < 3; j++) {
        if (strcmp(k->name, order[j]) != 0) continue;
        if (CHECK_INT(k->counter_row, j + 1))
          CHECK_INT(k->end_ns - k->start_ns, (int64_t)values[j * 2]);
      }
    }
    for (size_t i = 0; i < v.num_transfers; i++) CHECK_INT(v.transfers[i].counter_row, 0);
  }
  tf_prof_session_free(s);
}

/* Counted by passes: the work runs once a pass; only the first pass's
 * records and ranges are kept (the later ones' launches come after it), so
 * the ranges pair with them as in one pass; a pass launching other work
 * than the first is an error, and next_pass outside such a session too. */
static void test_counters_by_pass(void) {
  static const char *const metrics[] = {"gpu__time_duration.sum", "sm__count.sum"};
  tf_prof_options opts = {true, true, false, metrics, 2, 0, true};
  tf_prof_set_gpu_source(&fake_counting_source);
  static const double values[] = {100, 1, 200, 2};
  fake_range_values = values, fake_range_count = 2, fake_ranges_dropped = 0;
  fake_passes_needed = 3;
  fake_pass_launches[0] = fake_pass_launches[1] = fake_pass_launches[2] = 2;
  tf_prof_session *s = NULL;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  uint32_t c = 100;
  bool more = true;
  int passes = 0;
  while (more && passes < 5) {
    CHECK_OK(tf_range_push("pass"));
    const int64_t t0 = tf_clock_ns();
    for (int k = 0; k < 2; k++, c++) {
      tf_prof_gpu_launch(c);
      fake_kernel_from(k == 0 ? "x" : "y", c, 0, t0 + k * 1000, t0 + k * 1000 + (k + 1) * 100, true);
    }
    while (tf_clock_ns() < t0 + 2500) {
    } /* the pass's work done before it ends, as after a wait for the devices */
    CHECK_OK(tf_range_pop());
    passes++;
    if (!CHECK_OK(tf_prof_next_pass(s, &more))) break;
  }
  CHECK_INT(passes, 3);
  CHECK_OK(tf_prof_stop(s));
  tf_prof_view v;
  if (CHECK_OK(tf_prof_view_get(s, &v))) {
    CHECK_INT(v.num_kernels, 2);
    CHECK_INT(v.num_ranges, 1);
    CHECK_INT(v.counters.counted, 2);
    CHECK_INT(v.counters.launches, 2);
    CHECK_INT(v.counters.lost, 0);
    CHECK_INT(v.counters.mismatched, 0);
    CHECK(v.counters.by_pass);
    for (size_t i = 0; i < v.num_kernels; i++) {
      CHECK_INT(v.kernels[i].range, v.ranges[0].id);
      CHECK_INT(v.kernels[i].counter_row, strcmp(v.kernels[i].name, "x") == 0 ? 1 : 2);
    }
  }
  tf_prof_session_free(s);

  /* A second pass with a kernel more. */
  fake_pass_launches[1] = 3;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  CHECK_OK(tf_prof_next_pass(s, &more));
  CHECK(more);
  CHECK(tf_prof_next_pass(s, &more) == TF_ERR_STATE);
  CHECK(strstr(tf_last_error(), "pass 1 launched 2 kernels and copies, pass 2 3") != NULL);
  CHECK(!more);
  CHECK_OK(tf_prof_stop(s));
  tf_prof_session_free(s);

  /* next_pass on a session counting by kernel replay. */
  opts.by_pass = false;
  if (!CHECK_OK(tf_prof_start(&opts, &s))) return;
  CHECK(tf_prof_next_pass(s, &more) == TF_ERR_STATE);
  CHECK(strstr(tf_last_error(), "does not count by passes") != NULL);
  CHECK_OK(tf_prof_stop(s));
  tf_prof_session_free(s);
}

/* Every entry of the model-kernel table that does work on the CPU is timed by the profiler's wrapper
 * (its host ops are the CPU's "kernels"): a table of stand-in entries is wrapped, and each entry but
 * those that set up, capture or order work must have been replaced. An entry added without a wrapper
 * fails here, naming its offset. */
static void test_every_model_kernel_timed(void) {
  enum { SLOTS = sizeof(tf_model_kernels) / sizeof(void (*)(void)) };
  _Static_assert(sizeof(uintptr_t) == sizeof(void (*)(void)), "a table entry is a pointer-sized slot");
  CHECK(sizeof(tf_model_kernels) % sizeof(void (*)(void)) == 0);
  /* static: the wrapper keeps the plain table's address for the process */
  static tf_model_kernels fake;
  static tf_backend plain;
  for (size_t i = 0; i < SLOTS; i++) {
    uintptr_t v = 0x1000 + i;
    memcpy((char *)&fake + i * sizeof v, &v, sizeof v);
  }
  plain = *tf_cpu_backend();
  plain.model = &fake;
  const tf_backend *wrapped = tf_cpu_prof_backend(&plain);
  CHECK(wrapped && wrapped != &plain && wrapped->model);
  if (!wrapped || !wrapped->model) return;
  static const size_t untimed[] = {
      offsetof(tf_model_kernels, gemm_use_lt),       offsetof(tf_model_kernels, gemm_tuning),
      offsetof(tf_model_kernels, traffic),           offsetof(tf_model_kernels, encoder_workspace),
      offsetof(tf_model_kernels, rmsnorm_workspace), offsetof(tf_model_kernels, capture_begin),
      offsetof(tf_model_kernels, capture_end),       offsetof(tf_model_kernels, graph_launch),
      offsetof(tf_model_kernels, graph_destroy),     offsetof(tf_model_kernels, adamw_constants),
      offsetof(tf_model_kernels, side_enter),        offsetof(tf_model_kernels, side_leave),
      offsetof(tf_model_kernels, side_join),         offsetof(tf_model_kernels, side_mark),
      offsetof(tf_model_kernels, main_wait),
  };
  int timed = 0;
  for (size_t i = 0; i < SLOTS; i++) {
    const size_t at = i * sizeof(uintptr_t);
    bool setup = false;
    for (size_t k = 0; k < sizeof untimed / sizeof untimed[0]; k++) setup = setup || untimed[k] == at;
    uintptr_t before, after;
    memcpy(&before, (const char *)&fake + at, sizeof before);
    memcpy(&after, (const char *)wrapped->model + at, sizeof after);
    if (setup) {
      CHECK(after == before);
    } else {
      if (after == before) fprintf(stderr, "model kernel entry at offset %zu is not timed by the profiler\n", at);
      CHECK(after != before);
      timed++;
    }
  }
  CHECK(timed >= 16); /* gemm ... fp8_history */
}

int main(void) {
  tf_backends_init();
  test_every_model_kernel_timed();
  test_short_names();
  test_ranges();
  test_sessions();
  test_forced_failure();
  test_busy_union();
  test_launches_and_replays(); /* from here on: the stand-in GPU side */
  test_overlapped_records();
  test_counters_pairing();
  test_counters_launch_records();
  test_counters_by_pass();
  return tf_check_done();
}
