/* Matrix products on the GPU, one dispatch for the eager matmul
 * (backend.h) and the engine's GEMM (model_kernels.h): cuBLASLt with
 * cached plans, plain cuBLAS as the fallback.
 *
 * tfhost's operands are row-major and cuBLAS is column-major: a row-major
 * (rows x cols) matrix with row stride ld is the column-major (cols x rows)
 * matrix with leading dimension ld, its transpose. So C = A B (row-major)
 * is computed as C^T = B^T A^T (column-major): cuBLAS's first operand is
 * our B, its second our A, and the dimensions are (n, m, k). An operand
 * stored transposed (trans_a: A kept as a row-major (k, m) matrix) is,
 * seen column-major, A itself, which cuBLAS transposes back (OP_T). A batch
 * stride of 0 broadcasts an operand over the batch.
 *
 * A plan (matmul descriptor, three layouts, the heuristic's algorithm) is
 * made the first time a (dtypes, transposes, sizes, strides, alignments)
 * combination is seen and kept in a small per-device cache, so steady
 * state pays no descriptor or heuristic cost. Split-K reductions are held
 * to f32 (no reduction in the output type), as the cuBLAS handle's math
 * mode does for the fallback. A shape Lt has no algorithm for, or a call
 * Lt refuses, goes to cublasGemmStridedBatchedEx from then on; so does
 * everything when TF_CUBLASLT=0 is set or gemm_use_lt(ctx, false) was
 * called. f64 products (the eager matmul's) always take plain cuBLAS, in
 * f64. The workspace (32 MiB) is a cudaMalloc of its own, like cuBLAS's
 * internal one, outside the caching allocator's accounting.
 *
 * Timed choice (a call with tune set, the engine's, when TF_GEMM_TUNE=1;
 * off by default, see below): the first eager call of a plan runs the
 * heuristic's first TF_GEMM_CANDIDATES algorithms on the call's own
 * operands and keeps the fastest, but only among those whose product has
 * the same bits as the first one's (a fingerprint of C after each). It is
 * off unless asked for because it gains nothing measurable in a step (the
 * 2.7B step, docs/performance.md). With it on, the fused engine's step
 * with AdamW beside the backward pass once gave other losses than the same
 * step run serially in about half the runs of
 * tests/lua/test_model_long_run.lua: not other bits from the algorithms
 * (tests/gpu/gemm_algorithms.cu --bits finds none beside another kernel)
 * but an ordering fault in the step's graph, mended in model_graph.cu
 * (tf_cuda_order_kernel). Products added into C, and calls made while the
 * stream is captured into a graph, are not timed (the next eager call is). */
#include "cuda_common.cuh"
#include "gemv.cuh"

#include <cublasLt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TF_GEMM_PLANS = 128, TF_GEMM_CANDIDATES = 8 };
static const size_t TF_GEMM_WORKSPACE = (size_t)32 << 20;

/* Everything a plan depends on; zeroed before filling so memcmp compares it. */
typedef struct tf_gemm_key {
  int ab_dtype, b_dtype, c_dtype, trans_a, trans_b, accumulate, tf32;
  int scaled, rowwise, fast_accum, amax; /* an FP8 product's options (tf_gemm_scaled) */
  int64_t batch, m, n, k, lda, ldb, ldc, batch_a, batch_b, batch_c;
  unsigned align_a, align_b, align_c;
} tf_gemm_key;

typedef struct tf_gemm_plan {
  tf_gemm_key key;
  bool used;
  bool lt; /* false: this combination runs through plain cuBLAS */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLAS's A (our B), B (our A), C */
  cublasLtMatmulAlgo_t algo;                           /* the one calls run */
  cublasLtMatmulAlgo_t candidates[TF_GEMM_CANDIDATES]; /* the heuristic's, best first */
  int ncandidates;
  bool timed; /* the timed choice was made (or had nothing to choose from) */
} tf_gemm_plan;

typedef struct tf_gemm_state {
  cublasLtHandle_t lt; /* NULL: Lt unavailable */
  void *workspace;
  unsigned long long *print; /* the device word fingerprints are summed into, made on first use */
  cudaEvent_t clock[2];      /* the timed choice's events, made with print */
  bool use_lt, tune;
  tf_gemm_tuning stats;
  int next; /* the slot the next new plan evicts, round robin */
  tf_gemm_plan plans[TF_GEMM_PLANS];
} tf_gemm_state;

/* ---- plans ------------------------------------------------------------------------------ */

/* Destroys a plan's descriptors and frees its slot. */
static void tf_gemm_plan_drop(tf_gemm_plan *p) {
  if (p->op) tf_cublas.cublasLtMatmulDescDestroy(p->op);
  if (p->la) tf_cublas.cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) tf_cublas.cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) tf_cublas.cublasLtMatrixLayoutDestroy(p->lc);
  memset(p, 0, sizeof *p);
}

/* The largest power of two up to 256 dividing the address and, when
 * batched, the byte stride between batches. */
static unsigned tf_gemm_align(const void *ptr, int64_t batch, int64_t stride, size_t es) {
  uintptr_t v = (uintptr_t)ptr | 256u;
  if (batch > 1) v |= (uintptr_t)((uint64_t)stride * es);
  return (unsigned)(v & (~v + 1));
}

/* The CUDA type of a GEMM dtype (f32, f16, bf16, f64, the 8-bit floats). */
static cudaDataType tf_gemm_type(tf_dtype d) {
  switch (d) {
    case TF_F16: return CUDA_R_16F;
    case TF_BF16: return CUDA_R_16BF;
    case TF_F64: return CUDA_R_64F;
    case TF_F8E4M3: return CUDA_R_8F_E4M3;
    case TF_F8E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
  }
}

/* One attribute of a layout, a descriptor or a preference; false when Lt refuses it. */
static bool tf_gemm_set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void *v,
                               size_t n) {
  return tf_cublas.cublasLtMatrixLayoutSetAttribute(l, attr, v, n) == CUBLAS_STATUS_SUCCESS;
}
static bool tf_gemm_set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *v, size_t n) {
  return tf_cublas.cublasLtMatmulDescSetAttribute(d, attr, v, n) == CUBLAS_STATUS_SUCCESS;
}
static bool tf_gemm_set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const void *v,
                             size_t n) {
  return tf_cublas.cublasLtMatmulPreferenceSetAttribute(p, attr, v, n) == CUBLAS_STATUS_SUCCESS;
}

/* A column-major layout, strided-batched when batch > 1; *ok turns false on any failure. */
static cublasLtMatrixLayout_t tf_gemm_layout(cudaDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                             int64_t stride, bool *ok) {
  cublasLtMatrixLayout_t l = NULL;
  if (tf_cublas.cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld) != CUBLAS_STATUS_SUCCESS) {
    *ok = false;
    return NULL;
  }
  if (batch > 1) {
    int32_t count = (int32_t)batch;
    *ok = *ok && tf_gemm_set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    *ok = *ok && tf_gemm_set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  }
  return l;
}

/* An FP8 plan's descriptor options: fast accumulation, the scales' mode
 * (rowwise: one vector each; cuBLAS's A is our B, so its scale is ours of
 * B), and the amax output. The pointers are set for each call (the
 * workspace stands in for them while the heuristic chooses). */
static bool tf_gemm_scaled_desc(tf_gemm_state *gs, const tf_gemm_key *key, cublasLtMatmulDesc_t op) {
  const int8_t fast = (int8_t)key->fast_accum;
  const void *stand_in = gs->workspace;
  bool ok = tf_gemm_set_desc(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast) &&
            tf_gemm_set_desc(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof stand_in) &&
            tf_gemm_set_desc(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof stand_in);
  if (key->rowwise) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    ok = ok && tf_gemm_set_desc(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode) &&
         tf_gemm_set_desc(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
  }
  if (key->amax) ok = ok && tf_gemm_set_desc(op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &stand_in, sizeof stand_in);
  return ok;
}

/* Descriptors and the heuristic's best algorithm; p->lt stays false when
 * Lt cannot run this combination. */
static void tf_gemm_plan_make(tf_gemm_state *gs, const tf_gemm_key *key, tf_gemm_plan *p) {
  memset(p, 0, sizeof *p);
  p->key = *key;
  p->used = true;
  const cudaDataType ab = tf_gemm_type((tf_dtype)key->ab_dtype), bt = tf_gemm_type((tf_dtype)key->b_dtype),
                     c = tf_gemm_type((tf_dtype)key->c_dtype);
  const cublasOperation_t opa = key->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasComputeType_t compute = key->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  bool ok = tf_cublas.cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  ok = ok && tf_gemm_set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  ok = ok && tf_gemm_set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  if (ok && key->scaled) ok = tf_gemm_scaled_desc(gs, key, p->op);
  if (ok) {
    const bool na = opa == CUBLAS_OP_N, nb = opb == CUBLAS_OP_N;
    p->la = tf_gemm_layout(bt, na ? key->n : key->k, na ? key->k : key->n, key->ldb, key->batch, key->batch_b, &ok);
    if (ok) p->lb = tf_gemm_layout(ab, nb ? key->k : key->m, nb ? key->m : key->k, key->lda, key->batch, key->batch_a, &ok);
    if (ok) p->lc = tf_gemm_layout(c, key->n, key->m, key->ldc, key->batch, key->batch_c, &ok);
  }
  cublasLtMatmulPreference_t pref = NULL;
  ok = ok && tf_cublas.cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  if (ok) {
    const size_t ws = TF_GEMM_WORKSPACE;
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const uint32_t aa = key->align_b, ab_ = key->align_a, ac = key->align_c; /* cuBLAS's A is our B */
    ok = tf_gemm_set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) &&
         tf_gemm_set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof reductions) &&
         tf_gemm_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa) &&
         tf_gemm_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab_, sizeof ab_) &&
         tf_gemm_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac) &&
         tf_gemm_set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
  }
  if (ok) {
    cublasLtMatmulHeuristicResult_t results[TF_GEMM_CANDIDATES];
    int found = 0;
    memset(results, 0, sizeof results);
    ok = tf_cublas.cublasLtMatmulAlgoGetHeuristic(gs->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, TF_GEMM_CANDIDATES,
                                                  results, &found) == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; ok && i < found; i++)
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= TF_GEMM_WORKSPACE)
        p->candidates[p->ncandidates++] = results[i].algo;
    ok = ok && p->ncandidates > 0;
    if (ok) p->algo = p->candidates[0];
  }
  if (pref) tf_cublas.cublasLtMatmulPreferenceDestroy(pref);
  p->lt = ok;
}

/* The cached plan for key, made (evicting round robin) on a miss. */
static tf_gemm_plan *tf_gemm_plan_for(tf_gemm_state *gs, const tf_gemm_key *key) {
  for (int i = 0; i < TF_GEMM_PLANS; i++)
    if (gs->plans[i].used && memcmp(&gs->plans[i].key, key, sizeof *key) == 0) return &gs->plans[i];
  tf_gemm_plan *p = &gs->plans[gs->next];
  gs->next = (gs->next + 1) % TF_GEMM_PLANS;
  tf_gemm_plan_drop(p);
  tf_gemm_plan_make(gs, key, p);
  return p;
}

/* ---- device state ---------------------------------------------------------------------- */

/* Made on the first GEMM of a device: the Lt handle and its workspace, or
 * neither (plain cuBLAS only) when either cannot be had. */
static tf_status tf_gemm_state_of(tf_cuda_state *st, tf_gemm_state **out) {
  if (!st->gemm) {
    tf_gemm_state *gs = (tf_gemm_state *)calloc(1, sizeof *gs);
    if (!gs) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the GEMM plan cache");
    gs->use_lt = !tf_env_is("TF_CUBLASLT", "0");
    gs->tune = tf_env_is("TF_GEMM_TUNE", "1");
    if (tf_cublas.cublasLtCreate(&gs->lt) != CUBLAS_STATUS_SUCCESS) gs->lt = NULL;
    if (gs->lt && cudaMalloc(&gs->workspace, TF_GEMM_WORKSPACE) != cudaSuccess) {
      (void)cudaGetLastError();
      gs->workspace = NULL;
    }
    if (!gs->lt || !gs->workspace) gs->use_lt = false;
    st->gemm = gs;
  }
  *out = (tf_gemm_state *)st->gemm;
  return TF_OK;
}

/* At device shutdown: plans, the Lt handle and the workspace. */
void tf_cuda_gemm_release(tf_cuda_state *st) {
  tf_gemm_state *gs = (tf_gemm_state *)st->gemm;
  if (!gs) return;
  for (int i = 0; i < TF_GEMM_PLANS; i++) tf_gemm_plan_drop(&gs->plans[i]);
  if (gs->workspace) tf_cuda_report(cudaFree(gs->workspace), "cudaFree");
  if (gs->print) {
    tf_cuda_report(cudaFree(gs->print), "cudaFree");
    for (int i = 0; i < 2; i++) tf_cuda_report(cudaEventDestroy(gs->clock[i]), "cudaEventDestroy");
  }
  if (gs->lt) tf_cublas.cublasLtDestroy(gs->lt);
  free(gs);
  st->gemm = NULL;
}

/* Switches between the two paths (tests compare them). */
void tf_cuda_gemm_use_lt(tf_device_ctx *ctx, bool on) {
  tf_gemm_state *gs = NULL;
  if (tf_cuda_use_device(ctx) != TF_OK || tf_gemm_state_of(tf_cuda_state_of(ctx), &gs) != TF_OK) return;
  gs->use_lt = on && gs->lt && gs->workspace;
}

/* ---- the GEMM ---------------------------------------------------------------------------- */

/* Refuses a size cuBLAS's 32-bit arguments cannot carry; op names the caller in the message. */
static tf_status tf_gemm_fits(const char *op, const char *what, int64_t v) {
  if (v < 0 || v > INT_MAX)
    return tf_fail(TF_ERR_ARG, "%s: %s is %lld, more than the CUDA backend's limit of %d", op, what, (long long)v,
                   INT_MAX);
  return TF_OK;
}

/* The fallback: one strided-batched cublasGemmEx call (alpha and beta in
 * the compute type: double for f64, else float). */
static tf_status tf_gemm_cublas(tf_cuda_state *st, const tf_gemm_args *g, const void *alpha, const void *beta) {
  const cudaDataType ab = tf_gemm_type(g->ab_dtype), c = tf_gemm_type(g->c_dtype);
  const cublasComputeType_t compute = g->ab_dtype == TF_F64                        ? CUBLAS_COMPUTE_64F
                                      : g->allow_tf32 && g->ab_dtype == TF_F32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                 : CUBLAS_COMPUTE_32F;
  TF_CUBLAS_CHECK(tf_cublas.cublasGemmStridedBatchedEx(
      st->blas, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)g->m,
      (int)g->k, alpha, g->b, ab, (int)g->ldb, (long long)g->batch_b, g->a, ab, (int)g->lda, (long long)g->batch_a,
      beta, g->c, c, (int)g->ldc, (long long)g->batch_c, (int)g->batch, compute, CUBLAS_GEMM_DEFAULT));
  return TF_OK;
}

/* Sizes and dtypes a product can run with; op names the caller in messages. */
static tf_status tf_gemm_check(const char *op, const tf_gemm_args *g) {
  TF_TRY(tf_gemm_fits(op, "the batch count", g->batch));
  TF_TRY(tf_gemm_fits(op, "m", g->m));
  TF_TRY(tf_gemm_fits(op, "n", g->n));
  TF_TRY(tf_gemm_fits(op, "k", g->k));
  TF_TRY(tf_gemm_fits(op, "the leading dimension of a", g->lda));
  TF_TRY(tf_gemm_fits(op, "the leading dimension of b", g->ldb));
  TF_TRY(tf_gemm_fits(op, "the leading dimension of c", g->ldc));
  if (g->scaled) {
    const tf_gemm_scaled *x = g->scaled;
    if (!tf_dtype_is_fp8(x->a_dtype) || !tf_dtype_is_fp8(x->b_dtype) ||
        (x->a_dtype == TF_F8E5M2 && x->b_dtype == TF_F8E5M2))
      return tf_fail(TF_ERR_ARG, "%s: FP8 products take f8e4m3 x f8e4m3, f8e4m3 x f8e5m2 or f8e5m2 x f8e4m3, not %s x %s",
                     op, tf_dtype_name(x->a_dtype), tf_dtype_name(x->b_dtype));
    if (g->c_dtype != TF_F32 && g->c_dtype != TF_BF16 && g->c_dtype != TF_F16)
      return tf_fail(TF_ERR_ARG, "%s: an FP8 product's C is f32, bf16 or f16, not %s", op, tf_dtype_name(g->c_dtype));
    return TF_OK;
  }
  const tf_dtype d = g->ab_dtype;
  if (d != TF_F32 && d != TF_F16 && d != TF_BF16 && d != TF_F64)
    return tf_fail(TF_ERR_ARG, "%s: the CUDA backend has no kernel for dtype %s", op, tf_dtype_name(d));
  if (g->c_dtype != d && !(g->c_dtype == TF_F32 && d != TF_F64))
    return tf_fail(TF_ERR_ARG, "%s: C must be %s%s, not %s", op, tf_dtype_name(d), d == TF_F64 ? "" : " or f32",
                   tf_dtype_name(g->c_dtype));
  return TF_OK;
}

/* ---- the timed choice ------------------------------------------------------------------- */

/* Adds into *out a mix of every 2-byte unit of C (batch x rows units of
 * row_units, rows ld units apart, batches stride units apart) with its
 * position: a sum, so the same for any order of the threads. */
__global__ void tf_gemm_print_kernel(const uint16_t *c, int64_t batch, int64_t rows, int64_t row_units, int64_t ld,
                                     int64_t stride, unsigned long long *out) {
  const int64_t total = batch * rows * row_units;
  unsigned long long sum = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t u = i % row_units, r = (i / row_units) % rows, b = i / (row_units * rows);
    unsigned long long h = ((unsigned long long)i << 16 | c[b * stride + r * ld + u]) + 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finaliser */
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    sum += h ^ (h >> 31);
  }
  atomicAdd(out, sum);
}

/* C's fingerprint after the work queued so far (waits for the device). */
static tf_status tf_gemm_print(tf_cuda_state *st, tf_gemm_state *gs, const tf_gemm_args *g, unsigned long long *out) {
  const int64_t units = (int64_t)tf_dtype_size(g->c_dtype) / 2; /* f16, bf16, f32 */
  TF_TRY(tf_cuda_memset(st, gs->print, 0, sizeof *gs->print));
  tf_gemm_print_kernel<<<2 * st->multiprocessors, 256, 0, st->stream>>>(
      (const uint16_t *)g->c, g->batch, g->m, g->n * units, g->ldc * units, g->batch_c * units, gs->print);
  TF_TRY(tf_cuda_launched("GEMM fingerprint kernel"));
  TF_CUDA_CHECK(cudaMemcpyAsync(out, gs->print, sizeof *out, cudaMemcpyDeviceToHost, st->stream));
  TF_CUDA_CHECK(cudaStreamSynchronize(st->stream));
  return TF_OK;
}

/* Milliseconds a call takes on algorithm a, the mean of reps calls. */
static tf_status tf_gemm_clock(tf_cuda_state *st, tf_gemm_state *gs, const tf_gemm_plan *p, const tf_gemm_args *g,
                               const cublasLtMatmulAlgo_t *a, const void *alpha, const void *beta, int reps,
                               float *ms) {
  TF_CUDA_CHECK(cudaEventRecord(gs->clock[0], st->stream));
  for (int r = 0; r < reps; r++)
    TF_CUBLAS_CHECK(tf_cublas.cublasLtMatmul(gs->lt, p->op, alpha, g->b, p->la, g->a, p->lb, beta, g->c, p->lc, g->c,
                                             p->lc, a, gs->workspace, TF_GEMM_WORKSPACE, st->stream));
  TF_CUDA_CHECK(cudaEventRecord(gs->clock[1], st->stream));
  TF_CUDA_CHECK(cudaEventSynchronize(gs->clock[1]));
  TF_CUDA_CHECK(cudaEventElapsedTime(ms, gs->clock[0], gs->clock[1]));
  *ms /= (float)reps;
  return TF_OK;
}

/* The timed choice (see the top of the file) for plan p on g's operands;
 * C holds some candidate's product afterwards, so the caller runs the call. */
static tf_status tf_gemm_choose(tf_cuda_state *st, tf_gemm_state *gs, tf_gemm_plan *p, const tf_gemm_args *g,
                                const void *alpha, const void *beta) {
  p->timed = true;
  gs->stats.plans++;
  if (p->ncandidates < 2) return TF_OK;
  /* nothing else on the device while the clock runs (the optimizer's
   * stream may have work beside the pass) */
  TF_CUDA_CHECK(cudaDeviceSynchronize());
  if (!gs->print) {
    TF_CUDA_CHECK(cudaMalloc(&gs->print, sizeof *gs->print));
    for (int i = 0; i < 2; i++) TF_CUDA_CHECK(cudaEventCreate(&gs->clock[i]));
  }
  /* the first candidate: its product's fingerprint, and the repetitions
   * that make each clock reading some 2 ms (3 to 50) */
  unsigned long long want = 0, got = 0;
  float first = 0, best = 0, ms = 0;
  TF_TRY(tf_gemm_clock(st, gs, p, g, &p->candidates[0], alpha, beta, 1, &first));
  TF_TRY(tf_gemm_print(st, gs, g, &want));
  const int reps = first <= 0 ? 50 : (int)fminf(50.0f, fmaxf(3.0f, 2.0f / first));
  TF_TRY(tf_gemm_clock(st, gs, p, g, &p->candidates[0], alpha, beta, reps, &best));
  const float heuristic = best;
  int chosen = 0;
  for (int i = 1; i < p->ncandidates; i++) {
    gs->stats.candidates++;
    if (tf_cublas.cublasLtMatmul(gs->lt, p->op, alpha, g->b, p->la, g->a, p->lb, beta, g->c, p->lc, g->c, p->lc,
                                 &p->candidates[i], gs->workspace, TF_GEMM_WORKSPACE,
                                 st->stream) != CUBLAS_STATUS_SUCCESS) {
      gs->stats.refused++;
      continue;
    }
    TF_TRY(tf_gemm_print(st, gs, g, &got));
    if (got != want) { /* other bits: never chosen, however fast */
      gs->stats.other_bits++;
      continue;
    }
    TF_TRY(tf_gemm_clock(st, gs, p, g, &p->candidates[i], alpha, beta, reps, &ms));
    if (ms < 0.98f * best) best = ms, chosen = i; /* 2 % or more faster: more than the clock's noise */
  }
  p->algo = p->candidates[chosen];
  if (chosen > 0) gs->stats.changed++;
  gs->stats.first_ms += heuristic;
  gs->stats.chosen_ms += best;
  return TF_OK;
}

/* The timed choice's counts so far on ctx's device (model_kernels.h). */
void tf_cuda_gemm_tuning(tf_device_ctx *ctx, tf_gemm_tuning *out) {
  memset(out, 0, sizeof *out);
  tf_gemm_state *gs = NULL;
  if (tf_cuda_use_device(ctx) != TF_OK || tf_gemm_state_of(tf_cuda_state_of(ctx), &gs) != TF_OK) return;
  *out = gs->stats;
  out->enabled = gs->tune;
}

/* The plan cache's key of a call. */
static tf_gemm_key tf_gemm_key_of(const tf_gemm_args *g) {
  const tf_gemm_scaled *x = g->scaled;
  tf_gemm_key key;
  memset(&key, 0, sizeof key);
  key.ab_dtype = x ? x->a_dtype : g->ab_dtype, key.b_dtype = x ? x->b_dtype : g->ab_dtype;
  key.c_dtype = g->c_dtype, key.trans_a = g->trans_a, key.trans_b = g->trans_b;
  key.accumulate = g->accumulate, key.tf32 = g->allow_tf32 && g->ab_dtype == TF_F32 && !x;
  key.scaled = x != NULL, key.rowwise = x && x->rowwise, key.fast_accum = x && x->fast_accum;
  key.amax = x && x->amax;
  key.batch = g->batch, key.m = g->m, key.n = g->n, key.k = g->k;
  key.lda = g->lda, key.ldb = g->ldb, key.ldc = g->ldc;
  if (g->batch > 1) key.batch_a = g->batch_a, key.batch_b = g->batch_b, key.batch_c = g->batch_c;
  key.align_a = tf_gemm_align(g->a, g->batch, g->batch_a, tf_dtype_size((tf_dtype)key.ab_dtype));
  key.align_b = tf_gemm_align(g->b, g->batch, g->batch_b, tf_dtype_size((tf_dtype)key.b_dtype));
  key.align_c = tf_gemm_align(g->c, g->batch, g->batch_c, tf_dtype_size(g->c_dtype));
  return key;
}

/* max |C| into *out, C (m, n) of dtype DT with row stride ldc: the f32
 * bits of non-negative floats order as unsigned integers (a NaN's above
 * every number, so one NaN gives NaN), so an integer atomicMax over a
 * zeroed word is the largest magnitude in any order. */
template <int DT>
__global__ void tf_gemm_amax_kernel(const typename tf_cuda_dtype<DT>::storage *c, int64_t m, int64_t n, int64_t ldc,
                                    unsigned *out) {
  unsigned most = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m * n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = fabsf(tf_cuda_dtype<DT>::load(c[i / n * ldc + i % n]));
    most = max(most, __float_as_uint(v != v ? __int_as_float(0x7fc00000) : v));
  }
  for (int o = 16; o > 0; o /= 2) most = max(most, __shfl_xor_sync(0xffffffffu, most, o));
  if (threadIdx.x % 32 == 0) atomicMax(out, most);
}

/* An FP8 product (tf_gemm_scaled): cuBLASLt alone (plain cuBLAS has none),
 * the call's scale pointers set on the cached plan's descriptor; amax from
 * the product itself when cuBLASLt offers an algorithm that computes it,
 * else from C afterwards. */
static tf_status tf_gemm_scaled_run(tf_cuda_state *st, tf_gemm_state *gs, const tf_gemm_args *g) {
  const tf_gemm_scaled *x = g->scaled;
  if (!gs->lt || !gs->workspace)
    return tf_fail(TF_ERR_ARG, "scaled_matmul: cuBLASLt could not be started on this device, and FP8 products need it");
  tf_gemm_key key = tf_gemm_key_of(g);
  tf_gemm_plan *p = tf_gemm_plan_for(gs, &key);
  if (!p->lt && key.amax) {
    key.amax = 0;
    p = tf_gemm_plan_for(gs, &key);
  }
  if (!p->lt)
    return tf_fail(TF_ERR_ARG,
                   "scaled_matmul: cuBLASLt has no FP8 algorithm for m=%lld, n=%lld, k=%lld (%s x %s into %s, %s "
                   "scales%s) on this device",
                   (long long)g->m, (long long)g->n, (long long)g->k, tf_dtype_name(x->a_dtype),
                   tf_dtype_name(x->b_dtype), tf_dtype_name(g->c_dtype), x->rowwise ? "rowwise" : "tensorwise",
                   x->fast_accum ? ", fast accumulation" : "");
  const void *scale_of_lt_a = x->scale_b, *scale_of_lt_b = x->scale_a; /* cuBLAS's A is our B */
  void *amax = x->amax;
  bool ok = tf_gemm_set_desc(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_of_lt_a, sizeof scale_of_lt_a) &&
            tf_gemm_set_desc(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_of_lt_b, sizeof scale_of_lt_b);
  if (key.amax) ok = ok && tf_gemm_set_desc(p->op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &amax, sizeof amax);
  if (!ok) return tf_fail(TF_ERR_BACKEND, "scaled_matmul: cublasLtMatmulDescSetAttribute refused the scales' pointers");
  if (x->amax) TF_TRY(tf_cuda_memset(st, x->amax, 0, sizeof *x->amax));
  const float one = 1.0f, zero = 0.0f; /* beta 1: added into C (f32 gradients) */
  TF_CUBLAS_CHECK(tf_cublas.cublasLtMatmul(gs->lt, p->op, &one, g->b, p->la, g->a, p->lb, g->accumulate ? &one : &zero,
                                           g->c, p->lc, g->c, p->lc, &p->algo, gs->workspace, TF_GEMM_WORKSPACE,
                                           st->stream));
  if (!x->amax || key.amax) return TF_OK;
  const unsigned blocks = (unsigned)(g->m * g->n < 1024 * (int64_t)st->multiprocessors ? (g->m * g->n + 255) / 256
                                                                                : 4 * st->multiprocessors);
  unsigned *word = (unsigned *)x->amax;
  if (g->c_dtype == TF_BF16)
    tf_gemm_amax_kernel<TF_BF16><<<blocks, 256, 0, st->stream>>>((const uint16_t *)g->c, g->m, g->n, g->ldc, word);
  else if (g->c_dtype == TF_F16)
    tf_gemm_amax_kernel<TF_F16><<<blocks, 256, 0, st->stream>>>((const uint16_t *)g->c, g->m, g->n, g->ldc, word);
  else
    tf_gemm_amax_kernel<TF_F32><<<blocks, 256, 0, st->stream>>>((const float *)g->c, g->m, g->n, g->ldc, word);
  return tf_cuda_launched("scaled_matmul's amax kernel");
}

/* The one dispatch: the cached Lt plan when there is one, else plain cuBLAS. */
static tf_status tf_gemm_run(tf_device_ctx *ctx, const tf_gemm_args *g, const char *op) {
  TF_TRY(tf_gemm_check(op, g));
  if (g->batch == 0 || g->m == 0 || g->n == 0) return TF_OK;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  const bool wide = g->ab_dtype == TF_F64;
  const float one = 1.0f, zero = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void *alpha = wide ? (const void *)&one_d : (const void *)&one;
  const void *beta = g->accumulate ? alpha : wide ? (const void *)&zero_d : (const void *)&zero;
  if (g->k == 0) { /* a sum of nothing: C = 0 (+ C) */
    if (g->accumulate) return TF_OK;
    const size_t es = tf_dtype_size(g->c_dtype);
    for (int64_t b = 0; b < g->batch; b++)
      TF_CUDA_CHECK(cudaMemset2DAsync((char *)g->c + (size_t)(b * g->batch_c) * es, (size_t)g->ldc * es, 0,
                                      (size_t)g->n * es, (size_t)g->m, st->stream));
    return TF_OK;
  }
  tf_gemm_state *gs = NULL;
  TF_TRY(tf_gemm_state_of(st, &gs));
  if (g->scaled) return tf_gemm_scaled_run(st, gs, g);
  if (gs->use_lt && !wide) {
    const tf_gemm_key key = tf_gemm_key_of(g);
    tf_gemm_plan *p = tf_gemm_plan_for(gs, &key);
    if (p->lt && !p->timed && g->tune && gs->tune && !g->accumulate) {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      TF_CUDA_CHECK(cudaStreamIsCapturing(st->stream, &capturing));
      if (capturing == cudaStreamCaptureStatusNone) TF_TRY(tf_gemm_choose(st, gs, p, g, alpha, beta));
    }
    if (p->lt) {
      cublasStatus_t s = tf_cublas.cublasLtMatmul(gs->lt, p->op, alpha, g->b, p->la, g->a, p->lb, beta, g->c, p->lc,
                                                  g->c, p->lc, &p->algo, gs->workspace, TF_GEMM_WORKSPACE, st->stream);
      if (s == CUBLAS_STATUS_SUCCESS) return TF_OK;
      /* refused at launch: this combination uses cuBLAS from now on; but
       * not for a refusal while the stream is being captured into a CUDA
       * graph (the capture may have been spoiled by another call, and the
       * engine then runs the pass again eagerly, on the same plan) */
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(st->stream, &capturing) != cudaSuccess) (void)cudaGetLastError();
      if (capturing == cudaStreamCaptureStatusNone) p->lt = false;
      else return tf_cublas_error(s, "cublasLtMatmul");
    }
  }
  return tf_gemm_cublas(st, g, alpha, beta);
}

/* ---- one row: the decode step's products at batch 1 (the kernel: gemv.cuh) ------------- */

/* Whether g is a product the one-row kernel takes: one batch, one row, C =
 * A B^T of f16/bf16 in and out, nothing added, rows and pointers whole
 * 16-byte words. */
static bool tf_gemv_fits(const tf_gemm_args *g) {
  static const bool off = getenv("TF_DECODE_GEMV") && strcmp(getenv("TF_DECODE_GEMV"), "0") == 0;
  const bool low = g->ab_dtype == TF_BF16 || g->ab_dtype == TF_F16;
  return !off && !g->scaled && g->few_rows && low && g->c_dtype == g->ab_dtype && g->batch == 1 && !g->trans_a &&
         g->trans_b && !g->accumulate && g->m == 1 && g->k % 8 == 0 && g->ldb % 8 == 0 &&
         ((uintptr_t)g->a & 15) == 0 && ((uintptr_t)g->b & 15) == 0 && g->n <= INT32_MAX && g->k <= INT32_MAX;
}

/* Which of the one-row kernel's endings g's then_ asks for, where the kernel can do it: its blocks of split warps a
 * column hold pairs of columns (split 4 or fewer) and the gate or the append is of this one row, from C. */
static int tf_gemv_then_of(const tf_gemm_args *g, int split, tf_gemv_then *then) {
  memset(then, 0, sizeof *then);
  static const bool off = getenv("TF_DECODE_FUSE") && strcmp(getenv("TF_DECODE_FUSE"), "0") == 0;
  if (off || split > TF_GEMV_WARPS / 2) return -1;
  const tf_swiglu_args *sw = g->then_swiglu;
  const tf_kv_append_args *kv = g->then_append;
  if (sw && !kv && !sw->backward && sw->rows == 1 && 2 * sw->f == g->n && sw->ab == g->c && sw->dtype == g->c_dtype) {
    then->gate = sw->y, then->f = sw->f;
    return TF_GEMV_GATE;
  }
  if (kv && !sw && kv->batch == 1 && kv->seq == 1 && kv->head_dim % 2 == 0 && 3 * kv->heads * kv->head_dim == g->n &&
      kv->qkv == g->c && kv->dtype == g->c_dtype) {
    then->kv = *kv;
    return TF_GEMV_APPEND;
  }
  return sw || kv ? -1 : TF_GEMV_STORE;
}

template <int DT, int THEN>
static tf_status tf_gemv_launch(tf_cuda_state *st, const tf_gemm_args *g, int split, const tf_gemv_then &then) {
  const uint16_t *a = (const uint16_t *)g->a, *b = (const uint16_t *)g->b;
  uint16_t *c = (uint16_t *)g->c;
  const int64_t cols = TF_GEMV_WARPS / split, per_block = THEN == TF_GEMV_GATE ? cols / 2 : cols;
  const int64_t outs = THEN == TF_GEMV_GATE ? then.f : g->n;
  const unsigned blocks = (unsigned)((outs + per_block - 1) / per_block);
  return tf_cuda_launch(st, g->chained, "one-row gemm kernel", blocks, 32 * TF_GEMV_WARPS,
                        tf_gemv_kernel_of<DT, THEN>(split), a, b, c, (int)g->n, (int)g->k, g->ldb, then);
}

/* The one-row product, with its ending where the kernel takes it (1), else plainly (0: the caller then runs
 * then_swiglu or then_append). */
template <int DT> static tf_status tf_gemv_typed(tf_cuda_state *st, const tf_gemm_args *g, bool *ended) {
  const int split = tf_gemv_split(g->k);
  tf_gemv_then then;
  const int kind = tf_gemv_then_of(g, split, &then);
  *ended = kind == TF_GEMV_GATE || kind == TF_GEMV_APPEND;
  if (kind == TF_GEMV_GATE) return tf_gemv_launch<DT, TF_GEMV_GATE>(st, g, split, then);
  if (kind == TF_GEMV_APPEND) return tf_gemv_launch<DT, TF_GEMV_APPEND>(st, g, split, then);
  return tf_gemv_launch<DT, TF_GEMV_STORE>(st, g, split, then);
}

/* The engine's entry (model_kernels.h): the product, then what follows it. */
tf_status tf_cuda_gemm(tf_device_ctx *ctx, const tf_gemm_args *g) {
  bool ended = false;
  if (tf_gemv_fits(g)) {
    TF_TRY(tf_cuda_use_device(ctx));
    tf_cuda_state *st = tf_cuda_state_of(ctx);
    TF_TRY(g->ab_dtype == TF_BF16 ? tf_gemv_typed<TF_BF16>(st, g, &ended)
                                  : tf_gemv_typed<TF_F16>(st, g, &ended));
  } else {
    TF_TRY(tf_gemm_run(ctx, g, "gemm"));
  }
  if (ended) return TF_OK;
  if (g->then_swiglu) TF_TRY(tf_cuda_swiglu(ctx, g->then_swiglu));
  return g->then_append ? tf_cuda_kv_append(ctx, g->then_append) : TF_OK;
}

/* The eager matmul's entry (backend.h): the same product with C in the
 * operands' dtype, nothing accumulated. */
tf_status tf_cuda_matmul(tf_device_ctx *ctx, const tf_matmul_args *x) {
  tf_gemm_args g;
  memset(&g, 0, sizeof g);
  g.a = x->a, g.b = x->b, g.c = x->c;
  g.ab_dtype = g.c_dtype = x->dtype;
  g.batch = x->batch, g.m = x->m, g.n = x->n, g.k = x->k;
  g.trans_a = x->trans_a, g.trans_b = x->trans_b;
  g.lda = x->lda, g.ldb = x->ldb, g.ldc = x->ldc;
  g.batch_a = x->batch_a, g.batch_b = x->batch_b, g.batch_c = x->batch_c;
  g.allow_tf32 = x->allow_tf32;
  return tf_gemm_run(ctx, &g, "matmul");
}
