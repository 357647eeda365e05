/* What the CUDA backend's files share: the per-device state, the error
 * checks that turn every failing CUDA/cuBLAS call into a tf_status with a
 * message naming the call, the device switch, launch sizing, per-dtype
 * load/store traits and the strided-iteration geometry of the elementwise
 * families. Include this first in every kernels/cuda/ file. */
#ifndef TF_CUDA_COMMON_CUH
#define TF_CUDA_COMMON_CUH

#include <atomic>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend.h"
#include "half.h"
#include "model_kernels.h"

enum { TF_CUDA_THREADS = 256 };

/* What a CUDA device context owns (ctx->backend_state). */
typedef struct tf_cuda_state {
  cudaStream_t stream; /* every kernel, copy and cuBLAS call of the device */
  cublasHandle_t blas; /* bound to stream */
  int multiprocessors; /* for sizing grids */
  int cc;              /* compute capability, major * 10 + minor (90: H100/H200) */
  void *gemm;          /* the engine GEMM's cuBLASLt handle and plan cache (gemm.cu), made on first use */
  /* The side stream (model_graph.cu), made on first use: while work goes
   * to it, stream is side and main_stream holds the device's own stream. */
  cudaStream_t main_stream, side;
  cudaEvent_t fork, join, marks[TF_SIDE_MARKS];
  cudaStream_t comm; /* NCCL's collectives (backend.h, comm_begin), made on first use */
} tf_cuda_state;

/* The cuBLAS and cuBLASLt functions the backend calls, each under its
 * library's symbol name. The libraries are opened on the first use of a GPU
 * (tf_cublas_load, cublas_load.cu), not linked: their start-up code would
 * run in every process, one that never touches a GPU too. */
#define TF_CUBLAS_FUNCTIONS(X)                                                                                        \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasSetMathMode) X(cublasGetVersion_v2)            \
  X(cublasGetStatusString) X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic)   \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                          \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)                    \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)
typedef struct tf_cublas_api {
#define TF_CUBLAS_MEMBER(name) decltype(&::name) name;
  TF_CUBLAS_FUNCTIONS(TF_CUBLAS_MEMBER)
#undef TF_CUBLAS_MEMBER
  /* C++ sees two of these (the other takes a cudaDataType compute type): the library's own */
  cublasStatus_t (*cublasGemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                               const void *, const void *, cudaDataType, int, long long, const void *,
                                               cudaDataType, int, long long, const void *, void *, cudaDataType, int,
                                               long long, int, cublasComputeType_t, cublasGemmAlgo_t);
} tf_cublas_api;
/* Filled by tf_cublas_load (cuda_backend.h); read only after it returned TF_OK. */
extern tf_cublas_api tf_cublas;

/* Records "CUDA error in <call>: <reason>" (TF_ERR_OOM with "out of memory"
 * for allocation failures), clears the non-sticky error state, returns the
 * status. `call` may be the stringified call: only its name is kept. */
tf_status tf_cuda_error(cudaError_t err, const char *call);
tf_status tf_cublas_error(cublasStatus_t err, const char *call);
/* For paths that cannot return a status (frees, destroys): the failure goes
 * to stderr instead of being dropped. */
void tf_cuda_report(cudaError_t err, const char *call);

#define TF_CUDA_CHECK(call)                                              \
  do {                                                                   \
    cudaError_t tf_cuda_err_ = (call);                                   \
    if (tf_cuda_err_ != cudaSuccess) return tf_cuda_error(tf_cuda_err_, #call); \
  } while (0)

#define TF_CUBLAS_CHECK(call)                                                \
  do {                                                                       \
    cublasStatus_t tf_cublas_err_ = (call);                                  \
    if (tf_cublas_err_ != CUBLAS_STATUS_SUCCESS) return tf_cublas_error(tf_cublas_err_, #call); \
  } while (0)

/* The fault that made the CUDA context unusable ("an illegal memory access ... (seen in cudaMemcpy)"),
 * NULL while there was none. */
const char *tf_cuda_fault(void);
/* CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel, so a fault is seen at its own launch. */
bool tf_cuda_launch_blocking(void);

/* After a <<<>>> launch: a bad configuration or an earlier asynchronous
 * fault shows up here, named after the kernel. */
tf_status tf_cuda_launched(const char *kernel);
/* cudaMemsetAsync of `bytes` bytes on st's stream; while the hardware
 * counters replay kernels, a kernel that does the same instead (util.cu). */
tf_status tf_cuda_memset(tf_cuda_state *st, void *data, int value, size_t bytes);
/* cudaMemcpyAsync of `bytes` bytes from device to device on st's stream; in the hardware counters' SASS
 * pass, a kernel that does the same instead (util.cu). */
tf_status tf_cuda_device_copy(tf_cuda_state *st, void *dst, const void *src, size_t bytes);

/* The traffic count (model_kernels.h): the engine's memory-bound launches
 * call tf_cuda_traffic with their kernel's name and the bytes their
 * arguments give; a load of one flag while the count is off. */
extern std::atomic<bool> tf_cuda_traffic_on;
void tf_cuda_traffic_add(const char *kernel, double bytes);
static inline void tf_cuda_traffic(const char *kernel, double bytes) {
  if (tf_cuda_traffic_on.load(std::memory_order_relaxed)) tf_cuda_traffic_add(kernel, bytes);
}
void tf_cuda_traffic_count(tf_device_ctx *ctx, bool start, tf_traffic *out);
/* capture_begin holds the count; a capture that yields no graph puts it back */
void tf_cuda_traffic_hold(void);
void tf_cuda_traffic_restore(void);

/* log2(e): exp(x) = exp2(x log2(e)) */
#define TF_CUDA_LOG2E 1.4426950408889634

/* 2^x on the special-function unit, ex2.approx.ftz (exp2(-inf) = 0; a
 * result under 2^-126 flushes to 0, where exp2f takes care of it). */
__device__ __forceinline__ float tf_cuda_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* Makes ctx's GPU current for this host thread (cudaSetDevice only when it
 * differs from the one this thread last made current). */
tf_status tf_cuda_use_device(tf_device_ctx *ctx);

static inline tf_cuda_state *tf_cuda_state_of(tf_device_ctx *ctx) { return (tf_cuda_state *)ctx->backend_state; }

/* Blocks for a grid-stride loop over n items: enough to fill the GPU a few
 * times over, never more than the items need. */
static inline unsigned tf_cuda_blocks(const tf_cuda_state *st, int64_t n) {
  int64_t want = (n + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS;
  int64_t cap = (int64_t)st->multiprocessors * 32;
  if (want > cap) want = cap;
  return want < 1 ? 1u : (unsigned)want;
}

/* The grid of an elementwise pass over rows, each row `per_row` threads'
 * work: enough blocks across a row (x) for them, and over rows (y, which
 * the kernel strides) up to the blocks the GPU keeps busy. */
static inline dim3 tf_cuda_rows_grid(const tf_cuda_state *st, int64_t rows, int64_t per_row) {
  const int64_t across = (per_row + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS;
  int64_t over = (int64_t)tf_cuda_blocks(st, rows * TF_CUDA_THREADS * across) / across;
  if (over < 1) over = 1;
  if (over > rows) over = rows;
  if (over > 65535) over = 65535;
  return dim3((unsigned)across, (unsigned)over);
}

/* ---- chained launches (Hopper's programmatic dependent launch) ----------------------
 *
 * A kernel launched chained (tf_cuda_launch with chained, on a GPU of
 * compute capability 9.0 or more) may start before the kernel ahead of it
 * in the stream has ended: its blocks are placed once every block of that
 * kernel has called tf_chain_next (or ended). Until tf_chain_wait returns
 * (the kernel ahead ended, its writes visible) it may only read what no
 * kernel of the stream writes, such as weights, and write nothing; or,
 * in generation's decode step, what only an earlier step's kernels wrote
 * (the cached keys and values below the position, the position itself),
 * since every step begins with a copy from the host, which waits for all
 * of the stream's work before it. A
 * kernel that may be launched chained calls tf_chain_wait in every thread
 * before any other memory access and before any return: a grid that ended
 * without waiting would let the kernel after it start before the one
 * before it ended. Both are no-ops in a kernel launched plainly and below
 * sm_90. The generation's decode step chains its kernels, so that a
 * product streams its weights while the small kernels before it (norms,
 * attention over the cache) run and while the product before it drains. */
__device__ __forceinline__ void tf_chain_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void tf_chain_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* Brings the 128-byte line holding p into L2 without waiting for it. */
__device__ __forceinline__ void tf_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* kernel<<<grid, block, 0, st->stream>>>(args...), chained when asked and
 * the GPU can, then tf_cuda_launched's check under the kernel's name. */
template <typename... P, typename... A>
static inline tf_status tf_cuda_launch(const tf_cuda_state *st, bool chained, const char *name, dim3 grid, dim3 block,
                                       void (*kernel)(P...), A... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st->stream;
  cfg.attrs = attr;
  cfg.numAttrs = chained && st->cc >= 90 ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args...);
  return err == cudaSuccess ? tf_cuda_launched(name) : tf_cuda_error(err, name);
}

/* Storage and compute types of a dtype. f16 and bf16 convert with the
 * hardware's instructions (cvt.rn: round to nearest even, subnormals kept),
 * which give half.h's bits, so the CPU's, for every number; a NaN comes out
 * as the canonical quiet NaN instead of keeping its sign and payload. The
 * software forms took some six (bf16) to twenty (f16) instructions an
 * element. i32 computes in int64, like the CPU backend (cpu.h). */
template <int DT> struct tf_cuda_dtype;
template <> struct tf_cuda_dtype<TF_F32> {
  typedef float storage;
  typedef float compute;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct tf_cuda_dtype<TF_F16> {
  typedef uint16_t storage;
  typedef float compute;
  static __device__ __forceinline__ float load(uint16_t v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ uint16_t store(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <> struct tf_cuda_dtype<TF_BF16> {
  typedef uint16_t storage;
  typedef float compute;
  static __device__ __forceinline__ float load(uint16_t v) { return tf_bf16_to_f32(v); }
  static __device__ __forceinline__ uint16_t store(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <> struct tf_cuda_dtype<TF_F64> {
  typedef double storage;
  typedef double compute;
  static __device__ __forceinline__ double load(double v) { return v; }
  static __device__ __forceinline__ double store(double v) { return v; }
};
template <> struct tf_cuda_dtype<TF_I32> {
  typedef int32_t storage;
  typedef int64_t compute;
  static __device__ __forceinline__ int64_t load(int32_t v) { return v; }
  static __device__ __forceinline__ int32_t store(int64_t v) { return (int32_t)v; }
};
template <> struct tf_cuda_dtype<TF_I64> {
  typedef int64_t storage;
  typedef int64_t compute;
  static __device__ __forceinline__ int64_t load(int64_t v) { return v; }
  static __device__ __forceinline__ int64_t store(int64_t v) { return v; }
};

/* Y(DTYPE, ...) for each dtype elementwise kernels exist for, as cpu.h's
 * TF_CPU_FLOAT_TYPES / TF_CPU_INT_TYPES. */
#define TF_CUDA_FLOAT_TYPES(Y, ...) \
  Y(TF_F32, __VA_ARGS__) Y(TF_F16, __VA_ARGS__) Y(TF_BF16, __VA_ARGS__) Y(TF_F64, __VA_ARGS__)
#define TF_CUDA_INT_TYPES(Y, ...) Y(TF_I32, __VA_ARGS__) Y(TF_I64, __VA_ARGS__)

/* An elementwise iteration space with a contiguous output and up to two
 * strided inputs, collapsed as kernels/cpu/iter.c does (size-1 dims dropped, dims
 * merged where every operand allows). Dims are stored innermost first so
 * kernels index them with compile-time positions (no local-memory copy of
 * the parameter). Passed to kernels by value. */
typedef struct tf_cuda_strided {
  int ndim;        /* >= 1 */
  bool contiguous; /* every input is dense over the whole space: element i is at i */
  bool narrow;     /* the element count fits 31 bits: index math in 32 bits */
  int64_t shape[TF_MAX_DIMS];
  int64_t stride[2][TF_MAX_DIMS];
} tf_cuda_strided;

void tf_cuda_strided_init(tf_cuda_strided *g, const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1);

/* Element offset of linear output index i in each of NIN inputs. */
template <int NIN, typename I>
__device__ __forceinline__ void tf_cuda_strided_offsets(const tf_cuda_strided &g, I i, int64_t *off) {
  I idx = i;
  for (int k = 0; k < NIN; k++) off[k] = 0;
#pragma unroll
  for (int d = 0; d < TF_MAX_DIMS; d++) {
    if (d == g.ndim - 1) {
      for (int k = 0; k < NIN; k++) off[k] += (int64_t)idx * g.stride[k][d];
      break;
    }
    I size = (I)g.shape[d];
    I q = idx / size;
    I r = idx - q * size;
    for (int k = 0; k < NIN; k++) off[k] += (int64_t)r * g.stride[k][d];
    idx = q;
  }
}

/* Kernel entry points of the other files, gathered into the backend table
 * by backend.cu. */
tf_status tf_cuda_unary(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out);
tf_status tf_cuda_binary(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, double scalar,
                         tf_scalar_side side, tf_tensor *out);
tf_status tf_cuda_convert(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
tf_status tf_cuda_convert_saturate(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
tf_status tf_cuda_fill(tf_device_ctx *ctx, tf_tensor *out, double value);
tf_status tf_cuda_arange(tf_device_ctx *ctx, tf_tensor *out, double start, double step);
tf_status tf_cuda_random(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args);
tf_status tf_cuda_reduce(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                         int64_t inner, tf_tensor *out);
/* The ops whose math the fused engine shares live with its kernel for it,
 * one file per family: gemm.cu (matmul), norm.cu, softmax.cu,
 * cross_entropy.cu, rope.cu, embedding.cu; shared pieces in nn_common.cuh. */
tf_status tf_cuda_matmul(tf_device_ctx *ctx, const tf_matmul_args *args);
tf_status tf_cuda_softmax(tf_device_ctx *ctx, const tf_softmax_args *args);
tf_status tf_cuda_norm(tf_device_ctx *ctx, const tf_norm_args *args);
tf_status tf_cuda_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *args, int64_t *bad);
tf_status tf_cuda_rope(tf_device_ctx *ctx, const tf_rope_args *args);
tf_status tf_cuda_embedding(tf_device_ctx *ctx, const tf_embedding_args *args, int64_t *bad);
tf_status tf_cuda_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                              tf_tensor *out);
tf_status tf_cuda_adamw(tf_device_ctx *ctx, const tf_adamw_update *args);
/* FlashAttention-2 (flash_attn.cu, with flash_attn_fwd.cu and flash_attn_bwd.cu). */
tf_status tf_cuda_flash_attention(tf_device_ctx *ctx, const tf_flash_args *args);
size_t tf_cuda_flash_workspace(tf_device_ctx *ctx, const tf_flash_args *args);
/* The Transformer engine's kernels (model_kernels.h), gathered into one
 * table by model_backend.cu: in the files of the eager ops of the same math
 * (gemm.cu, embedding.cu, norm.cu, rope.cu, softmax.cu, cross_entropy.cu),
 * its own SwiGLU (swiglu.cu) and CUDA graphs (model_graph.cu). */
tf_status tf_cuda_gemm(tf_device_ctx *ctx, const tf_gemm_args *args);
void tf_cuda_gemm_use_lt(tf_device_ctx *ctx, bool on);
void tf_cuda_gemm_tuning(tf_device_ctx *ctx, tf_gemm_tuning *out);
void tf_cuda_gemm_release(tf_cuda_state *st); /* at shutdown */
tf_status tf_cuda_index_check(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit, int64_t *bad);
tf_status tf_cuda_encoder(tf_device_ctx *ctx, const tf_encoder_args *args);
size_t tf_cuda_encoder_workspace(tf_device_ctx *ctx, const tf_encoder_args *args);
tf_status tf_cuda_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *args);
size_t tf_cuda_rmsnorm_workspace(tf_device_ctx *ctx, const tf_rmsnorm_args *args);
tf_status tf_cuda_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *args);
tf_status tf_cuda_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *args);
tf_status tf_cuda_heads(tf_device_ctx *ctx, const tf_heads_args *args);
tf_status tf_cuda_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *args);
tf_status tf_cuda_lm_loss(tf_device_ctx *ctx, const tf_lm_loss_args *args);
tf_status tf_cuda_capture_begin(tf_device_ctx *ctx);
tf_status tf_cuda_capture_end(tf_device_ctx *ctx, tf_graph **out);
tf_status tf_cuda_graph_launch(tf_device_ctx *ctx, tf_graph *g);
void tf_cuda_graph_destroy(tf_device_ctx *ctx, tf_graph *g);
tf_status tf_cuda_side_ready(tf_cuda_state *st);
void tf_cuda_side_release(tf_cuda_state *st); /* at shutdown */
tf_status tf_cuda_side_enter(tf_device_ctx *ctx);
tf_status tf_cuda_side_leave(tf_device_ctx *ctx);
tf_status tf_cuda_side_join(tf_device_ctx *ctx);
tf_status tf_cuda_side_mark(tf_device_ctx *ctx, int i);
tf_status tf_cuda_main_wait(tf_device_ctx *ctx, int i);
tf_status tf_cuda_adamw_constants(tf_device_ctx *ctx, float *consts, const tf_adamw_update *u);
tf_status tf_cuda_model_adamw(tf_device_ctx *ctx, const tf_model_adamw_args *a);
tf_status tf_cuda_grad_norm(tf_device_ctx *ctx, const tf_grad_norm_args *a);
/* generation's KV cache and its attention (decode.cu) */
tf_status tf_cuda_kv_append(tf_device_ctx *ctx, const tf_kv_append_args *a);
tf_status tf_cuda_decode_attention(tf_device_ctx *ctx, const tf_decode_attention_args *a);
tf_status tf_cuda_fp8_amax(tf_device_ctx *ctx, const tf_fp8_amax_args *a);         /* fp8_train.cu */
tf_status tf_cuda_fp8_quantize(tf_device_ctx *ctx, const tf_fp8_quantize_args *a); /* fp8_train.cu */
tf_status tf_cuda_fp8_history(tf_device_ctx *ctx, const tf_fp8_history_args *a);   /* fp8_train.cu */
const tf_model_kernels *tf_cuda_model_kernels(void);

#endif
