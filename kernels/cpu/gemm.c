/* Matrix products on the CPU, one routine for the eager matmul (backend.h)
 * and the engine's GEMM (model_kernels.h), the twin of gemm.cu, through the
 * CBLAS found at build time (OpenBLAS by default):
 *   - f32 and f64 operands go to sgemm/dgemm where they lie, transposes
 *     passed as flags, never copied; C of the same dtype is written (or,
 *     when accumulating, added to with beta = 1) in place;
 *   - f16 and bf16 operands are widened to f32 (as cuBLAS computes them
 *     with COMPUTE_32F), multiplied by sgemm, and each result rounded once
 *     into C (added to C's value in f32 when accumulating);
 *   - FP8 operands (tf.scaled_matmul, tf_gemm_scaled) are decoded to f32
 *     the same way, their f32 sums multiplied by the scales (the two
 *     multiplied first) and rounded once into C: the twin of cuBLASLt's
 *     FP8 product, whose tensor cores sum in fewer bits (nnops.h);
 *   - operands whose leading dimension the BLAS would refuse (a broadcast
 *     row, a stride below the row length) are first copied dense.
 * The BLAS's own threads would make the last bits depend on the thread
 * count (it splits products by the threads it has), and the CPU is the
 * oracle the GPU is tested against, so tfhost splits them itself (the
 * plan, tf_gemm_plan): C is cut into tiles, and a long sum into a few
 * chunks of K, by its shape alone, never by the thread count; each piece is
 * one single-threaded BLAS call by one thread, and the chunks' partial
 * products are added in chunk order; a batch of products of one piece each
 * is spread over the cores one product a thread. The same plan gives the
 * same bits on 1 thread or 64. */
#include <math.h>
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

/* How a product is cut: tiles of tm x tn of C, and K in `chunks` chunks
 * of kc (the last one shorter). A function of the shape alone. */
typedef struct {
  int64_t tm, tn, tiles_m, tiles_n, chunks, kc;
} tf_gemm_plan;

/* Each piece packs its own panels of A and B, so larger pieces cost less
 * per FLOP: the largest tiles that still give every core of a large
 * machine work (TF_GEMM_PIECES pieces: four rounds on 16 cores) are
 * taken, and when even the smallest tiles give fewer (a few hundred rows
 * times a model's width: the backward products of a short context), a long
 * K is cut into chunks of at least TF_GEMM_KC_MIN: both counts were chosen
 * by timing a small model's step on 16 cores (docs/performance.md, "Why
 * the kernels are as they are"). Tall tiles (more rows than columns) are
 * taken: OpenBLAS runs them faster per core than wide ones of the same
 * size. */
enum { TF_GEMM_PIECES = 64, TF_GEMM_KC_MIN = 256 };

static tf_gemm_plan tf_gemm_plan_for(int64_t m, int64_t n, int64_t k) {
  static const int64_t ladder[][2] = {{1024, 256}, {512, 256}, {512, 128}, {256, 128}};
  const size_t rungs = sizeof ladder / sizeof ladder[0];
  tf_gemm_plan p = {0};
  for (size_t i = 0; i < rungs; i++) {
    p.tm = ladder[i][0], p.tn = ladder[i][1];
    p.tiles_m = (m + p.tm - 1) / p.tm, p.tiles_n = (n + p.tn - 1) / p.tn;
    if (p.tiles_m * p.tiles_n >= TF_GEMM_PIECES) break;
  }
  const int64_t tiles = p.tiles_m * p.tiles_n, want = (TF_GEMM_PIECES + tiles - 1) / tiles,
                most = k / TF_GEMM_KC_MIN;
  p.chunks = want < most ? want : most;
  if (p.chunks < 1) p.chunks = 1;
  p.kc = (k + p.chunks - 1) / p.chunks;
  return p;
}

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

/* Scratch for one product: the widened operands, the f32 result and the
 * partial products of K's chunks past the first. */
typedef struct {
  void *a, *b, *c, *partials;
} tf_gemm_scratch;

static void tf_gemm_scratch_free(tf_gemm_scratch *s) {
  free(s->a), free(s->b), free(s->c), free(s->partials);
  s->a = s->b = s->c = s->partials = NULL;
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

/* Piece u of the plan on this thread alone: its tile of C, and its chunk
 * of K; chunk 0 goes into C (with the call's beta), chunk q > 0 into
 * partial product q - 1 (m x n, dense). */
static void tf_gemm_piece(const tf_gemm_call *x, const tf_gemm_plan *p, int64_t u, void *partials) {
  const int64_t q = u % p->chunks, tile = u / p->chunks;
  const int64_t i0 = tile / p->tiles_n * p->tm, j0 = tile % p->tiles_n * p->tn, k0 = q * p->kc;
  const int m = (int)(x->m - i0 < p->tm ? x->m - i0 : p->tm), n = (int)(x->n - j0 < p->tn ? x->n - j0 : p->tn);
  const int k = (int)(x->k - k0 < p->kc ? x->k - k0 : p->kc);
  const int64_t a_off = x->ta == CblasTrans ? k0 * x->lda + i0 : i0 * x->lda + k0,
                b_off = x->tb == CblasTrans ? j0 * x->ldb + k0 : k0 * x->ldb + j0;
  const size_t es = x->wide ? sizeof(double) : sizeof(float);
  char *c = q == 0 ? (char *)x->c : (char *)partials + (size_t)(q - 1) * (size_t)(x->m * x->n) * es;
  const int ldc = q == 0 ? x->ldc : x->n;
  const double beta = q == 0 ? x->beta : 0.0;
  c += (size_t)(i0 * ldc + j0) * es;
#ifdef _OPENMP
  /* outside a parallel region the BLAS would take every thread OpenMP
   * offers: it is offered one for the call */
  const int threads = omp_in_parallel() ? 0 : omp_get_max_threads();
  if (threads > 1) omp_set_num_threads(1);
#endif
  if (x->wide)
    cblas_dgemm(CblasRowMajor, x->ta, x->tb, m, n, k, 1.0, (const double *)x->a + a_off, x->lda,
                (const double *)x->b + b_off, x->ldb, beta, (double *)c, ldc);
  else
    cblas_sgemm(CblasRowMajor, x->ta, x->tb, m, n, k, 1.0f, (const float *)x->a + a_off, x->lda,
                (const float *)x->b + b_off, x->ldb, (float)beta, (float *)c, ldc);
#ifdef _OPENMP
  if (threads > 1) omp_set_num_threads(threads);
#endif
}

/* C += the partial products of chunks 1.., in chunk order, element by
 * element (rows spread over the cores). */
static void tf_gemm_add_partials(const tf_gemm_call *x, const tf_gemm_plan *p, const void *partials,
                                 bool in_parallel) {
  const int64_t mn = x->m * x->n;
#pragma omp parallel for schedule(static) if (!in_parallel && mn * (p->chunks - 1) > TF_CPU_PARALLEL_MIN)
  for (int64_t i = 0; i < x->m; i++)
    for (int64_t q = 1; q < p->chunks; q++) {
      const int64_t from = (q - 1) * mn + i * x->n;
      if (x->wide) {
        double *row = (double *)x->c + i * x->ldc;
        const double *part = (const double *)partials + from;
        for (int64_t j = 0; j < x->n; j++) row[j] += part[j];
      } else {
        float *row = (float *)x->c + i * x->ldc;
        const float *part = (const float *)partials + from;
        for (int64_t j = 0; j < x->n; j++) row[j] += part[j];
      }
    }
}

/* Row i of the f32 (f64 when wide) result c rounded once into C, of
 * dtype cd (a constant through TF_CPU_WITH_DTYPE), added to C's value when
 * accumulating. */
TF_CPU_INLINE void tf_gemm_round_row(tf_dtype cd, const tf_gemm_args *g, const void *c, char *out, int64_t i,
                                     bool wide) {
  for (int64_t j = 0; j < g->n; j++) {
    const int64_t at = i * g->ldc + j;
    if (wide) {
      double v = ((const double *)c)[i * g->n + j];
      if (g->accumulate) v += tf_elem_get(out, cd, at);
      tf_elem_set(out, cd, at, v);
    } else {
      float v = ((const float *)c)[i * g->n + j];
      if (g->accumulate) v += (float)tf_elem_get(out, cd, at);
      tf_elem_set(out, cd, at, v);
    }
  }
}

/* An FP8 product's f32 sums c (m x n, dense) times its scales, in place,
 * the two scales multiplied first (as cuBLASLt folds them into alpha), and
 * the largest magnitude (NaN if any is) into *amax when asked for. */
static void tf_gemm_apply_scales(const tf_gemm_args *g, float *c, bool in_parallel) {
  const tf_gemm_scaled *x = g->scaled;
#pragma omp parallel for schedule(static) if (!in_parallel && g->m * g->n > TF_CPU_PARALLEL_MIN)
  for (int64_t i = 0; i < g->m; i++)
    for (int64_t j = 0; j < g->n; j++) {
      const float scale = x->rowwise ? x->scale_a[i] * x->scale_b[j] : x->scale_a[0] * x->scale_b[0];
      c[i * g->n + j] *= scale;
    }
  if (!x->amax) return;
  float most = 0.0f;
  for (int64_t i = 0; i < g->m * g->n; i++) {
    const float v = fabsf(c[i]);
    if (v != v) {
      most = v;
      break;
    }
    if (v > most) most = v;
  }
  *x->amax = most;
}

/* Product bi of the batch; in_parallel: already on one thread of a batch
 * spread over the cores (its tiles then run here, in order). */
static tf_status tf_gemm_one(const tf_gemm_args *g, int64_t bi, bool in_parallel) {
  const tf_dtype ad = g->scaled ? g->scaled->a_dtype : g->ab_dtype, bd = g->scaled ? g->scaled->b_dtype : g->ab_dtype;
  const bool wide = ad == TF_F64, native = (ad == TF_F32 || wide) && !g->scaled;
  const size_t es = wide ? sizeof(double) : sizeof(float);
  const int64_t as = (int64_t)tf_dtype_size(ad), bs = (int64_t)tf_dtype_size(bd), cs = (int64_t)tf_dtype_size(g->c_dtype);
  const char *a = (const char *)g->a + bi * g->batch_a * as, *b = (const char *)g->b + bi * g->batch_b * bs;
  char *out = (char *)g->c + bi * g->batch_c * cs;
  const bool a_ok = native && tf_gemm_ld_ok(g->trans_a, g->lda, g->m, g->k);
  const bool b_ok = native && tf_gemm_ld_ok(g->trans_b, g->ldb, g->k, g->n);
  const bool c_direct = g->c_dtype == g->ab_dtype && native && g->ldc >= (g->n > 1 ? g->n : 1);
  const tf_gemm_plan plan = tf_gemm_plan_for(g->m, g->n, g->k);
  tf_gemm_scratch s = {NULL, NULL, NULL, NULL};
  if (!a_ok) s.a = malloc(es * (size_t)(g->m * g->k + 1));
  if (!b_ok) s.b = malloc(es * (size_t)(g->k * g->n + 1));
  if (!c_direct) s.c = malloc(es * (size_t)(g->m * g->n + 1));
  if (plan.chunks > 1) s.partials = malloc(es * (size_t)((plan.chunks - 1) * g->m * g->n));
  if ((!a_ok && !s.a) || (!b_ok && !s.b) || (!c_direct && !s.c) || (plan.chunks > 1 && !s.partials)) {
    tf_gemm_scratch_free(&s);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for matmul buffers");
  }
  if (!a_ok) tf_gemm_widen(a, ad, g->trans_a, g->lda, g->m, g->k, s.a, wide, in_parallel);
  if (!b_ok) tf_gemm_widen(b, bd, g->trans_b, g->ldb, g->k, g->n, s.b, wide, in_parallel);
  const enum CBLAS_TRANSPOSE ta = a_ok && g->trans_a ? CblasTrans : CblasNoTrans,
                             tb = b_ok && g->trans_b ? CblasTrans : CblasNoTrans;
  const int lda = a_ok ? (int)g->lda : (int)g->k, ldb = b_ok ? (int)g->ldb : (int)g->n;
  const int ldc = c_direct ? (int)g->ldc : (int)g->n;
  const double beta = c_direct && g->accumulate ? 1.0 : 0.0;
  const tf_gemm_call call = {wide, ta, tb, (int)g->m, (int)g->n, (int)g->k, a_ok ? a : s.a, lda, b_ok ? b : s.b, ldb,
                             beta, c_direct ? (void *)out : s.c, ldc};
  const int64_t pieces = plan.tiles_m * plan.tiles_n * plan.chunks;
#pragma omp parallel for schedule(dynamic, 1) if (pieces > 1 && !in_parallel)
  for (int64_t u = 0; u < pieces; u++) tf_gemm_piece(&call, &plan, u, s.partials);
  if (plan.chunks > 1) tf_gemm_add_partials(&call, &plan, s.partials, in_parallel);
  if (g->scaled) tf_gemm_apply_scales(g, (float *)s.c, in_parallel);
  if (!c_direct) /* each element rounded once into C, rows spread over the cores */
#pragma omp parallel for schedule(static) if (!in_parallel && g->m * g->n > TF_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < g->m; i++) TF_CPU_WITH_DTYPE(g->c_dtype, tf_gemm_round_row, g, s.c, out, i, wide);
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
  const tf_gemm_plan plan = tf_gemm_plan_for(g->m, g->n, g->k);
  /* Batches of one tile each are spread over the threads, unless the whole
   * product is too small to pay for waking them (on a loaded machine a
   * fork and join waits for a descheduled thread: milliseconds). */
  const bool spread = g->batch > 1 && plan.tiles_m * plan.tiles_n * plan.chunks == 1 && tf_cpu_threads() > 1 &&
                      g->batch * g->m * g->n * g->k >= TF_CPU_GEMM_PARALLEL_MIN;
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
  TF_TRY(tf_cpu_gemm_run(g));
  if (g->then_swiglu) TF_TRY(tf_cpu_swiglu(ctx, g->then_swiglu));
  return g->then_append ? tf_cpu_kv_append(ctx, g->then_append) : TF_OK;
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
