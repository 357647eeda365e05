/* Matrix products through cuBLAS. tfhost's operands are row-major and
 * cuBLAS is column-major: a row-major (rows x cols) matrix with row stride
 * ld is the column-major (cols x rows) matrix with leading dimension ld,
 * its transpose. So C = A B (row-major) is computed as C^T = B^T A^T
 * (column-major): cuBLAS's first operand is B, its second A, and the
 * dimensions are (n, m, k). An operand stored transposed (trans_a: A kept
 * as a row-major (k, m) matrix) is, seen column-major, A itself, which
 * cuBLAS transposes back with CUBLAS_OP_T. */
#include "cuda_common.cuh"

#include <limits.h>

/* Refuses a size that cuBLAS's 32-bit arguments cannot carry. */
static tf_status tf_cuda_matmul_fits(const char *what, int64_t v) {
  if (v < 0 || v > INT_MAX)
    return tf_fail(TF_ERR_ARG, "matmul: %s is %lld, more than the CUDA backend's limit of %d", what, (long long)v,
                   INT_MAX);
  return TF_OK;
}

/* One strided-batched cuBLAS call for the whole (broadcast) batch: operand
 * types and compute type by dtype, TF32 only when the device allows it. */
tf_status tf_cuda_matmul(tf_device_ctx *ctx, const tf_matmul_args *x) {
  TF_TRY(tf_cuda_matmul_fits("the batch count", x->batch));
  TF_TRY(tf_cuda_matmul_fits("m", x->m));
  TF_TRY(tf_cuda_matmul_fits("n", x->n));
  TF_TRY(tf_cuda_matmul_fits("k", x->k));
  TF_TRY(tf_cuda_matmul_fits("the leading dimension of a", x->lda));
  TF_TRY(tf_cuda_matmul_fits("the leading dimension of b", x->ldb));
  TF_TRY(tf_cuda_matmul_fits("the leading dimension of c", x->ldc));
  if (x->batch == 0 || x->m == 0 || x->n == 0) return TF_OK;

  cudaDataType type;
  cublasComputeType_t compute;
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void *alpha = &one_f, *beta = &zero_f;
  switch (x->dtype) {
    case TF_F32:
      type = CUDA_R_32F;
      compute = x->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case TF_F16:
      type = CUDA_R_16F;
      compute = CUBLAS_COMPUTE_32F;
      break;
    case TF_BF16:
      type = CUDA_R_16BF;
      compute = CUBLAS_COMPUTE_32F;
      break;
    case TF_F64:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      alpha = &one_d, beta = &zero_d;
      break;
    default: return tf_fail(TF_ERR_ARG, "matmul: the CUDA backend has no kernel for dtype %s", tf_dtype_name(x->dtype));
  }

  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  TF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      st->blas, x->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, x->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)x->n, (int)x->m,
      (int)x->k, alpha, x->b, type, (int)x->ldb, (long long)x->batch_b, x->a, type, (int)x->lda,
      (long long)x->batch_a, beta, x->c, type, (int)x->ldc, (long long)x->batch_c, (int)x->batch, compute,
      CUBLAS_GEMM_DEFAULT));
  return TF_OK;
}
