/* Matrix products on the CPU, one routine for the eager matmul (backend.h)
 * and the engine's GEMM (model_kernels.h), the twin of gemm.cu, through the
 * CBLAS found at build time (OpenBLAS by default):
 *   - f32 and f64 operands go to sgemm/dgemm where they lie, transposes
 *     passed as flags, never copied; C of the same dtype is written (or,
 *     when accumulating, added to with beta = 1) in place;
 *   - f16 and bf16 operands are widened to f32 (as cuBLAS computes them
 *     with COMPUTE_32F), multiplied by sgemm, and each result rounded once
 *     into C (added to C's value in f32 when accumulating);
 *   - operands whose leading dimension the BLAS would refuse (a broadcast
 *     row, a stride below the row length) are first copied dense.
 * The BLAS's own threads would make the last bits depend on the thread
 * count (it splits products by the threads it has), and the CPU is the
 * oracle the GPU is tested against, so tfhost splits them itself: C is cut
 * into tiles that depend on its shape alone, never on the thread count,
 * each tile one single-threaded BLAS call by one thread; a batch of
 * products of one tile each is spread over the cores one product a
 * thread. The same tiles give the same bits on 1 thread or 64. */
#include <stdlib.h>
#include <string.h>

#include TF_CBLAS_HEADER
#ifdef _OPENMP
#include <omp.h>
#endif

#include "elemio.h"
#include "half.h"
#include "cpu.h"
#include "cpu_model.h"

/* The tiles of C (rows, columns): larger for large products (each tile
 * packs its own panels of A and B); a function of the shape alone. */
static int64_t tf_gemm_tm(int64_t m) { return m >= 2048 ? 256 : 128; }
static int64_t tf_gemm_tn(int64_t n) { return n >= 2048 ? 1024 : 512; }

/* Whether a (rows x cols) operand stored with leading dimension ld
 * (transposed: cols x rows) is one the BLAS takes as it is. */
static bool tf_gemm_ld_ok(bool trans, int64_t ld, int64_t rows, int64_t cols) {
  const int64_t need = trans ? rows : cols;
  return ld >= (need > 1 ? need : 1);
}

/* A (rows x cols) operand as a dense row-major f32 or f64 buffer. */
static void tf_gemm_widen(const void *src, tf_dtype d, bool trans, int64_t ld, int64_t rows, int64_t cols, void *dst,
                          bool wide, bool in_parallel) {
#pragma omp parallel for schedule(static) if (!in_parallel && rows * cols > TF_CPU_PARALLEL_MIN)
  for (int64_t i = 0; i < rows; i++) {
    if (wide) {
      double *out = (double *)dst + i * cols;
      for (int64_t j = 0; j < cols; j++) out[j] = tf_elem_get(src, d, trans ? j * ld + i : i * ld + j);
      continue;
    }
    float *out = (float *)dst + i * cols;
    if (d == TF_BF16 && !trans) {
      const uint16_t *row = (const uint16_t *)src + i * ld;
      for (int64_t j = 0; j < cols; j++) out[j] = tf_bf16_to_f32(row[j]);
    } else if (d == TF_F16 && !trans) {
      const uint16_t *row = (const uint16_t *)src + i * ld;
      for (int64_t j = 0; j < cols; j++) out[j] = tf_f16_to_f32(row[j]);
    } else if (d == TF_BF16 || d == TF_F16) { /* transposed: element (i, j) at j * ld + i */
      const uint16_t *col = (const uint16_t *)src + i;
      for (int64_t j = 0; j < cols; j++) out[j] = d == TF_BF16 ? tf_bf16_to_f32(col[j * ld]) : tf_f16_to_f32(col[j * ld]);
    } else {
      for (int64_t j = 0; j < cols; j++) out[j] = (float)tf_elem_get(src, d, trans ? j * ld + i : i * ld + j);
    }
  }
}

/* Scratch for one product: the widened operands and the f32 result. */
typedef struct {
  void *a, *b, *c;
} tf_gemm_scratch;

static void tf_gemm_scratch_free(tf_gemm_scratch *s) {
  free(s->a), free(s->b), free(s->c);
  s->a = s->b = s->c = NULL;
}

/* One BLAS product, row-major, as the BLAS takes it. */
typedef struct {
  bool wide;
  enum CBLAS_TRANSPOSE ta, tb;
  int m, n, k;
  const void *a;
  int lda;
  const void *b;
  int ldb;
  double beta;
  void *c;
  int ldc;
} tf_gemm_call;

/* The tile of C at rows i0.., columns j0.., on this thread alone. */
static void tf_gemm_tile(const tf_gemm_call *x, int64_t i0, int64_t j0) {
  const int64_t tm = tf_gemm_tm(x->m), tn = tf_gemm_tn(x->n);
  const int m = (int)(x->m - i0 < tm ? x->m - i0 : tm), n = (int)(x->n - j0 < tn ? x->n - j0 : tn);
  const int64_t a_off = x->ta == CblasTrans ? i0 : i0 * x->lda, b_off = x->tb == CblasTrans ? j0 * x->ldb : j0;
  const int64_t c_off = i0 * x->ldc + j0;
#ifdef _OPENMP
  /* outside a parallel region the BLAS would take every thread OpenMP
   * offers: it is offered one for the call */
  const int threads = omp_in_parallel() ? 0 : omp_get_max_threads();
  if (threads > 1) omp_set_num_threads(1);
#endif
  if (x->wide)
    cblas_dgemm(CblasRowMajor, x->ta, x->tb, m, n, x->k, 1.0, (const double *)x->a + a_off, x->lda,
                (const double *)x->b + b_off, x->ldb, x->beta, (double *)x->c + c_off, x->ldc);
  else
    cblas_sgemm(CblasRowMajor, x->ta, x->tb, m, n, x->k, 1.0f, (const float *)x->a + a_off, x->lda,
                (const float *)x->b + b_off, x->ldb, (float)x->beta, (float *)x->c + c_off, x->ldc);
#ifdef _OPENMP
  if (threads > 1) omp_set_num_threads(threads);
#endif
}

/* Product bi of the batch; in_parallel: already on one thread of a batch
 * spread over the cores (its tiles then run here, in order). */
static tf_status tf_gemm_one(const tf_gemm_args *g, int64_t bi, bool in_parallel) {
  const bool wide = g->ab_dtype == TF_F64, native = g->ab_dtype == TF_F32 || wide;
  const size_t es = wide ? sizeof(double) : sizeof(float);
  const int64_t as = (int64_t)tf_dtype_size(g->ab_dtype), cs = (int64_t)tf_dtype_size(g->c_dtype);
  const char *a = (const char *)g->a + bi * g->batch_a * as, *b = (const char *)g->b + bi * g->batch_b * as;
  char *out = (char *)g->c + bi * g->batch_c * cs;
  const bool a_ok = native && tf_gemm_ld_ok(g->trans_a, g->lda, g->m, g->k);
  const bool b_ok = native && tf_gemm_ld_ok(g->trans_b, g->ldb, g->k, g->n);
  const bool c_direct = g->c_dtype == g->ab_dtype && native && g->ldc >= (g->n > 1 ? g->n : 1);
  tf_gemm_scratch s = {NULL, NULL, NULL};
  if (!a_ok) s.a = malloc(es * (size_t)(g->m * g->k + 1));
  if (!b_ok) s.b = malloc(es * (size_t)(g->k * g->n + 1));
  if (!c_direct) s.c = malloc(es * (size_t)(g->m * g->n + 1));
  if ((!a_ok && !s.a) || (!b_ok && !s.b) || (!c_direct && !s.c)) {
    tf_gemm_scratch_free(&s);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for matmul buffers");
  }
  if (!a_ok) tf_gemm_widen(a, g->ab_dtype, g->trans_a, g->lda, g->m, g->k, s.a, wide, in_parallel);
  if (!b_ok) tf_gemm_widen(b, g->ab_dtype, g->trans_b, g->ldb, g->k, g->n, s.b, wide, in_parallel);
  const enum CBLAS_TRANSPOSE ta = a_ok && g->trans_a ? CblasTrans : CblasNoTrans,
                             tb = b_ok && g->trans_b ? CblasTrans : CblasNoTrans;
  const int lda = a_ok ? (int)g->lda : (int)g->k, ldb = b_ok ? (int)g->ldb : (int)g->n;
  const int ldc = c_direct ? (int)g->ldc : (int)g->n;
  const double beta = c_direct && g->accumulate ? 1.0 : 0.0;
  const tf_gemm_call call = {wide, ta, tb, (int)g->m, (int)g->n, (int)g->k, a_ok ? a : s.a, lda, b_ok ? b : s.b, ldb,
                             beta, c_direct ? (void *)out : s.c, ldc};
  const int64_t tm = tf_gemm_tm(g->m), tn = tf_gemm_tn(g->n), tiles_m = (g->m + tm - 1) / tm,
                tiles_n = (g->n + tn - 1) / tn;
#pragma omp parallel for schedule(dynamic, 1) if (tiles_m * tiles_n > 1 && !in_parallel)
  for (int64_t t = 0; t < tiles_m * tiles_n; t++) tf_gemm_tile(&call, t / tiles_n * tm, t % tiles_n * tn);
  if (!c_direct) /* each element rounded once into C, rows spread over the cores */
#pragma omp parallel for schedule(static) if (!in_parallel && g->m * g->n > TF_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        const int64_t at = i * g->ldc + j;
        if (wide) {
          double v = ((double *)s.c)[i * g->n + j];
          if (g->accumulate) v += tf_elem_get(out, g->c_dtype, at);
          tf_elem_set(out, g->c_dtype, at, v);
        } else {
          float v = ((float *)s.c)[i * g->n + j];
          if (g->accumulate) v += (float)tf_elem_get(out, g->c_dtype, at);
          tf_elem_set(out, g->c_dtype, at, v);
        }
      }
  tf_gemm_scratch_free(&s);
  return TF_OK;
}

/* The one routine, over the engine's argument struct (the eager matmul's
 * fits in it: C in the operands' dtype, nothing accumulated). */
static tf_status tf_cpu_gemm_run(const tf_gemm_args *g) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return TF_OK;
  if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->lda > INT32_MAX || g->ldb > INT32_MAX ||
      g->ldc > INT32_MAX)
    return tf_fail(TF_ERR_ARG, "matmul: a dimension above 2^31 - 1 is out of the CPU BLAS's range");
  if (g->k == 0) { /* an empty sum: C = 0 (or unchanged when accumulating) */
    if (g->accumulate) return TF_OK;
    for (int64_t bi = 0; bi < g->batch; bi++)
      for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) tf_elem_set(g->c, g->c_dtype, bi * g->batch_c + i * g->ldc + j, 0.0);
    return TF_OK;
  }
  const bool spread = g->batch > 1 && g->m <= tf_gemm_tm(g->m) && g->n <= tf_gemm_tn(g->n) && tf_cpu_threads() > 1;
  if (!spread) {
    for (int64_t bi = 0; bi < g->batch; bi++) TF_TRY(tf_gemm_one(g, bi, false));
    return TF_OK;
  }
  tf_status st = TF_OK;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bi = 0; bi < g->batch; bi++) {
    const tf_status one = tf_gemm_one(g, bi, true);
    if (one != TF_OK) {
#pragma omp critical(tf_cpu_gemm_status)
      if (st == TF_OK) st = one;
    }
  }
  return st;
}

/* The engine's entry (model_kernels.h). */
tf_status tf_cpu_gemm(tf_device_ctx *ctx, const tf_gemm_args *g) {
  (void)ctx;
  return tf_cpu_gemm_run(g);
}

/* The eager matmul's entry (backend.h). */
tf_status tf_cpu_matmul(tf_device_ctx *ctx, const tf_matmul_args *x) {
  (void)ctx;
  const tf_gemm_args g = {.a = x->a, .b = x->b, .c = x->c, .ab_dtype = x->dtype, .c_dtype = x->dtype,
                          .batch = x->batch, .m = x->m, .n = x->n, .k = x->k, .trans_a = x->trans_a,
                          .trans_b = x->trans_b, .lda = x->lda, .ldb = x->ldb, .ldc = x->ldc,
                          .batch_a = x->batch_a, .batch_b = x->batch_b, .batch_c = x->batch_c,
                          .allow_tf32 = x->allow_tf32};
  return tf_cpu_gemm_run(&g);
}
