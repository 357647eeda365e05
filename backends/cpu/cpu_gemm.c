/* Matrix products on the CPU, one routine for the eager matmul (backend.h)
 * and the engine's GEMM (model_kernels.h), the twin of gemm.cu. Each
 * batch's operands are widened to the compute type (float for f32, f16 and
 * bf16, accumulating in f32 as cuBLAS does with COMPUTE_32F; double for
 * f64) into dense row-major buffers, multiplied with a cache-blocked i-k-j
 * loop that the compiler vectorises, then stored into C of its own dtype
 * or, when accumulating, added to C in the compute type, rounded once. */
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"

enum { TF_MM_BLOCK_K = 256, TF_MM_BLOCK_N = 512 };

#define TF_CPU_GEMM(T, name)                                                                 \
  static void name(const T *restrict a, const T *restrict b, T *restrict c, int64_t m, int64_t n, int64_t k) { \
    memset(c, 0, sizeof(T) * (size_t)(m * n));                                               \
    for (int64_t p0 = 0; p0 < k; p0 += TF_MM_BLOCK_K)                                        \
      for (int64_t j0 = 0; j0 < n; j0 += TF_MM_BLOCK_N) {                                    \
        int64_t p1 = p0 + TF_MM_BLOCK_K < k ? p0 + TF_MM_BLOCK_K : k;                        \
        int64_t j1 = j0 + TF_MM_BLOCK_N < n ? j0 + TF_MM_BLOCK_N : n;                        \
        _Pragma("omp parallel for schedule(static) if (m * (p1 - p0) * (j1 - j0) > 65536)") \
        for (int64_t i = 0; i < m; i++) {                                                    \
          T *restrict crow = c + i * n;                                                      \
          for (int64_t p = p0; p < p1; p++) {                                                \
            T av = a[i * k + p];                                                             \
            const T *restrict brow = b + p * n;                                              \
            for (int64_t j = j0; j < j1; j++) crow[j] += av * brow[j];                       \
          }                                                                                  \
        }                                                                                    \
      }                                                                                      \
  }
TF_CPU_GEMM(float, tf_cpu_gemm_f32)
TF_CPU_GEMM(double, tf_cpu_gemm_f64)

/* Copies a (rows x cols) operand, possibly stored transposed, into a dense
 * row-major buffer of the compute type (float or double). */
static void tf_cpu_widen(const void *src, tf_dtype d, bool trans, int64_t ld, int64_t rows, int64_t cols, void *dst,
                         bool wide) {
  if (!trans && (d == TF_F32 || d == TF_F64)) {
    size_t es = tf_dtype_size(d);
    for (int64_t i = 0; i < rows; i++)
      memcpy((char *)dst + i * cols * (int64_t)es, (const char *)src + i * ld * (int64_t)es, (size_t)cols * es);
    return;
  }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      int64_t at = trans ? j * ld + i : i * ld + j;
      double v = tf_elem_get(src, d, at);
      if (wide)
        ((double *)dst)[i * cols + j] = v;
      else
        ((float *)dst)[i * cols + j] = (float)v;
    }
}

/* The one routine, over the engine's argument struct (the eager matmul's
 * fits in it: C in the operands' dtype, nothing accumulated). */
static tf_status tf_cpu_gemm_run(const tf_gemm_args *g) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return TF_OK;
  const bool wide = g->ab_dtype == TF_F64;
  const size_t es = wide ? sizeof(double) : sizeof(float);
  void *a = malloc(es * (size_t)(g->m * g->k + 1)), *b = malloc(es * (size_t)(g->k * g->n + 1)),
       *c = malloc(es * (size_t)(g->m * g->n));
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for matmul buffers");
  }
  const int64_t as = (int64_t)tf_dtype_size(g->ab_dtype), cs = (int64_t)tf_dtype_size(g->c_dtype);
  for (int64_t bi = 0; bi < g->batch; bi++) {
    tf_cpu_widen((const char *)g->a + bi * g->batch_a * as, g->ab_dtype, g->trans_a, g->lda, g->m, g->k, a, wide);
    tf_cpu_widen((const char *)g->b + bi * g->batch_b * as, g->ab_dtype, g->trans_b, g->ldb, g->k, g->n, b, wide);
    if (wide)
      tf_cpu_gemm_f64(a, b, c, g->m, g->n, g->k);
    else
      tf_cpu_gemm_f32(a, b, c, g->m, g->n, g->k);
    char *out = (char *)g->c + bi * g->batch_c * cs;
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        const int64_t at = i * g->ldc + j;
        if (wide) {
          double v = ((double *)c)[i * g->n + j];
          if (g->accumulate) v += tf_elem_get(out, g->c_dtype, at);
          tf_elem_set(out, g->c_dtype, at, v);
        } else {
          float v = ((float *)c)[i * g->n + j];
          if (g->accumulate) v += (float)tf_elem_get(out, g->c_dtype, at);
          tf_elem_set(out, g->c_dtype, at, v);
        }
      }
  }
  free(a), free(b), free(c);
  return TF_OK;
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
