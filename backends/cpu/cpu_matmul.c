/* Matrix products on the CPU: each operand is widened to its compute type
 * (float for f32/f16/bf16, accumulating in f32 as cuBLAS does; double for
 * f64) into a plain row-major buffer, then multiplied with a cache-blocked
 * i-k-j loop that the compiler vectorises. */
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"

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

tf_status tf_cpu_matmul(tf_device_ctx *ctx, const tf_matmul_args *x) {
  (void)ctx;
  bool wide = x->dtype == TF_F64;
  size_t es = wide ? sizeof(double) : sizeof(float), ds = tf_dtype_size(x->dtype);
  void *a = malloc(es * (size_t)(x->m * x->k)), *b = malloc(es * (size_t)(x->k * x->n)),
       *c = malloc(es * (size_t)(x->m * x->n));
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for matmul buffers");
  }
  for (int64_t bi = 0; bi < x->batch; bi++) {
    tf_cpu_widen((const char *)x->a + bi * x->batch_a * (int64_t)ds, x->dtype, x->trans_a, x->lda, x->m, x->k, a,
                 wide);
    tf_cpu_widen((const char *)x->b + bi * x->batch_b * (int64_t)ds, x->dtype, x->trans_b, x->ldb, x->k, x->n, b,
                 wide);
    if (wide)
      tf_cpu_gemm_f64(a, b, c, x->m, x->n, x->k);
    else
      tf_cpu_gemm_f32(a, b, c, x->m, x->n, x->k);
    char *cout = (char *)x->c + bi * x->batch_c * (int64_t)ds;
    for (int64_t i = 0; i < x->m; i++)
      for (int64_t j = 0; j < x->n; j++)
        tf_elem_set(cout, x->dtype, i * x->ldc + j, wide ? ((double *)c)[i * x->n + j] : ((float *)c)[i * x->n + j]);
  }
  free(a), free(b), free(c);
  return TF_OK;
}
