/* The profiler's core without a GPU (host/observe/prof.h, backends/cpu/cpu_prof.h): kernel
 * name shortening, the range stack (nesting, ids, scoped closes that find
 * inner ranges left open, the depth limit), and sessions recording
 * host-timed ops through the wrapped CPU backend: names, attribution to the
 * innermost range, ranges open at start and at stop, times that nest, one
 * collector at a time, reads after stop, nothing recorded when stopped. */
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
  tf_prof_options opts = {true, true, true, true};
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
  tf_prof_options host_only = {false, false, true, false};
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
  tf_prof_options opts = {true, true, true, true};
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

int main(void) {
  tf_backends_init();
  test_short_names();
  test_ranges();
  test_sessions();
  test_forced_failure();
  return tf_check_done();
}
