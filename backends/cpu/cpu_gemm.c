/* The engine's GEMM on the CPU: each batch's operands widened to dense f32
 * matrices, multiplied by the CPU matmul (f32 accumulation, as cuBLAS with
 * COMPUTE_32F), then stored or added into C of its own dtype. */
#include <stdlib.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"

/* A (rows x cols) operand, stored transposed when trans, as a dense f32 matrix. */
static void tf_cpu_gemm_widen(const void *src, tf_dtype d, bool trans, int64_t ld, int64_t rows, int64_t cols,
                              float *dst) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = (float)tf_elem_get(src, d, trans ? j * ld + i : i * ld + j);
}

/* Batch by batch; C is added to in f32 (then rounded) when accumulating. */
tf_status tf_cpu_gemm(tf_device_ctx *ctx, const tf_gemm_args *g) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return TF_OK;
  float *a = malloc(sizeof(float) * (size_t)(g->m * g->k + 1)), *b = malloc(sizeof(float) * (size_t)(g->k * g->n + 1)),
        *c = malloc(sizeof(float) * (size_t)(g->m * g->n));
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for gemm buffers");
  }
  const int64_t as = (int64_t)tf_dtype_size(g->ab_dtype), cs = (int64_t)tf_dtype_size(g->c_dtype);
  tf_status st = TF_OK;
  for (int64_t bi = 0; bi < g->batch && st == TF_OK; bi++) {
    tf_cpu_gemm_widen((const char *)g->a + bi * g->batch_a * as, g->ab_dtype, g->trans_a, g->lda, g->m, g->k, a);
    tf_cpu_gemm_widen((const char *)g->b + bi * g->batch_b * as, g->ab_dtype, g->trans_b, g->ldb, g->k, g->n, b);
    if (g->k > 0) {
      tf_matmul_args mm = {.a = a, .b = b, .c = c, .dtype = TF_F32, .batch = 1, .m = g->m, .n = g->n, .k = g->k,
                           .lda = g->k, .ldb = g->n, .ldc = g->n};
      st = tf_cpu_matmul(ctx, &mm);
    } else {
      for (int64_t i = 0; i < g->m * g->n; i++) c[i] = 0;
    }
    char *out = (char *)g->c + bi * g->batch_c * cs;
    for (int64_t i = 0; st == TF_OK && i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        int64_t at = i * g->ldc + j;
        float v = c[i * g->n + j];
        if (g->accumulate) v += (float)tf_elem_get(out, g->c_dtype, at);
        tf_elem_set(out, g->c_dtype, at, v);
      }
  }
  free(a), free(b), free(c);
  return st;
}
