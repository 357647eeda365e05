/* FP8 training's casts on the GPU (model_kernels.h: fp8_amax,
 * fp8_quantize), the twins of kernels/cpu/fp8_train.c.
 *
 * amax: a grid-stride pass, each thread's largest magnitude as f32 bits
 * (non-negative floats order as unsigned integers; a NaN, made
 * 0x7fc00000, above every number), a warp's maximum, then an integer
 * atomicMax into the zeroed word: the same bits in any order.
 *
 * quantize: the multiplier q = max / amax read from the device (fp8.h's
 * tf_fp8_multiplier, as the CPU computes it), each value saturate(x q).
 * Row-major only, a grid-stride pass; with the transposed copy too, 32 x 32
 * tiles through shared memory (each block reads its tile once, writes
 * its rows, and its columns as the transposed tile's rows). */
#include "cuda_common.cuh"

#include "fp8.h"

template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_fp8_amax_kernel(const typename tf_cuda_dtype<DT>::storage *x,
                                                                          int64_t count, unsigned *out) {
  unsigned most = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = fabsf(tf_cuda_dtype<DT>::load(x[i]));
    most = max(most, v != v ? 0x7fc00000u : __float_as_uint(v));
  }
  for (int o = 16; o > 0; o /= 2) most = max(most, __shfl_xor_sync(0xffffffffu, most, o));
  if (threadIdx.x % 32 == 0) atomicMax(out, most);
}

/* One value's code: saturate(x q) in the format. */
template <int FP8> __device__ __forceinline__ uint8_t tf_cuda_fp8_code(float v, float q) {
  return FP8 == TF_F8E4M3 ? tf_f32_to_f8e4m3_sat(__fmul_rn(v, q)) : tf_f32_to_f8e5m2_sat(__fmul_rn(v, q));
}

/* The multiplier, and (one thread of the grid) the product's scale and the count of non-finite amax. */
template <int FP8> __device__ __forceinline__ float tf_cuda_fp8_q(const tf_fp8_quantize_args &a, bool first) {
  const float amax = *a.amax, q = tf_fp8_multiplier(amax, FP8 == TF_F8E4M3 ? 448.0f : 57344.0f);
  if (first) {
    if (a.scale) *a.scale = 1.0f / q;
    if (a.nonfinite && !(amax <= 3.40282347e38f)) *a.nonfinite += 1;
  }
  return q;
}

template <int DT, int FP8> __global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_fp8_quantize_kernel(tf_fp8_quantize_args a) {
  typedef tf_cuda_dtype<DT> D;
  const float q = tf_cuda_fp8_q<FP8>(a, blockIdx.x == 0 && threadIdx.x == 0);
  const typename D::storage *x = (const typename D::storage *)a.x;
  uint8_t *out = (uint8_t *)a.out;
  const int64_t total = a.rows * a.cols;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = tf_cuda_fp8_code<FP8>(D::load(x[i]), q);
}

enum { TF_FP8_TILE = 32, TF_FP8_TILE_ROWS = 8 };
template <int DT, int FP8>
__global__ void __launch_bounds__(TF_FP8_TILE * TF_FP8_TILE_ROWS) tf_cuda_fp8_quantize_t_kernel(tf_fp8_quantize_args a) {
  typedef tf_cuda_dtype<DT> D;
  __shared__ uint8_t tile[TF_FP8_TILE][TF_FP8_TILE + 1];
  const float q = tf_cuda_fp8_q<FP8>(a, blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0);
  const typename D::storage *x = (const typename D::storage *)a.x;
  uint8_t *out = (uint8_t *)a.out, *out_t = (uint8_t *)a.out_t;
  const int64_t row0 = (int64_t)blockIdx.y * TF_FP8_TILE, col0 = (int64_t)blockIdx.x * TF_FP8_TILE;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int r = ty; r < TF_FP8_TILE; r += TF_FP8_TILE_ROWS) {
    const int64_t i = row0 + r, j = col0 + tx;
    if (i < a.rows && j < a.cols) {
      const uint8_t c = tf_cuda_fp8_code<FP8>(D::load(x[i * a.cols + j]), q);
      if (out) out[i * a.cols + j] = c;
      tile[r][tx] = c;
    }
  }
  __syncthreads();
  for (int r = ty; r < TF_FP8_TILE; r += TF_FP8_TILE_ROWS) {
    const int64_t j = col0 + r, i = row0 + tx; /* out_t (cols, rows): row j, column i */
    if (i < a.rows && j < a.cols) out_t[j * a.rows + i] = tile[tx][r];
  }
}

tf_status tf_cuda_fp8_amax(tf_device_ctx *ctx, const tf_fp8_amax_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  TF_CUDA_CHECK(cudaMemsetAsync(a->amax, 0, sizeof *a->amax, st->stream));
  if (a->count == 0) return TF_OK;
  const unsigned blocks = tf_cuda_blocks(st, a->count);
  unsigned *word = (unsigned *)a->amax;
  switch (a->dtype) {
    case TF_BF16:
      tf_cuda_fp8_amax_kernel<TF_BF16><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>((const uint16_t *)a->x, a->count, word);
      break;
    case TF_F16:
      tf_cuda_fp8_amax_kernel<TF_F16><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>((const uint16_t *)a->x, a->count, word);
      break;
    case TF_F32:
      tf_cuda_fp8_amax_kernel<TF_F32><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>((const float *)a->x, a->count, word);
      break;
    default: return tf_fail(TF_ERR_ARG, "fp8_amax: no kernel for dtype %s", tf_dtype_name(a->dtype));
  }
  tf_cuda_traffic("tf_cuda_fp8_amax_kernel", a->count * (int64_t)tf_dtype_size(a->dtype));
  return tf_cuda_launched("fp8 amax kernel");
}

template <int DT, int FP8> static tf_status tf_cuda_fp8_quantize_typed(tf_cuda_state *st, const tf_fp8_quantize_args *a) {
  if (!a->out_t) {
    tf_cuda_fp8_quantize_kernel<DT, FP8><<<tf_cuda_blocks(st, a->rows * a->cols), TF_CUDA_THREADS, 0, st->stream>>>(*a);
    return tf_cuda_launched("fp8 quantize kernel");
  }
  if ((a->rows + TF_FP8_TILE - 1) / TF_FP8_TILE > 65535)
    return tf_fail(TF_ERR_ARG, "fp8_quantize: %lld rows are more than the transposing kernel's grid takes",
                   (long long)a->rows);
  const dim3 grid((unsigned)((a->cols + TF_FP8_TILE - 1) / TF_FP8_TILE), (unsigned)((a->rows + TF_FP8_TILE - 1) / TF_FP8_TILE));
  tf_cuda_fp8_quantize_t_kernel<DT, FP8><<<grid, dim3(TF_FP8_TILE, TF_FP8_TILE_ROWS), 0, st->stream>>>(*a);
  return tf_cuda_launched("fp8 quantize-and-transpose kernel");
}

template <int DT> static tf_status tf_cuda_fp8_quantize_in(tf_cuda_state *st, const tf_fp8_quantize_args *a) {
  return a->fp8 == TF_F8E4M3 ? tf_cuda_fp8_quantize_typed<DT, TF_F8E4M3>(st, a)
                             : tf_cuda_fp8_quantize_typed<DT, TF_F8E5M2>(st, a);
}

tf_status tf_cuda_fp8_quantize(tf_device_ctx *ctx, const tf_fp8_quantize_args *a) {
  if (a->fp8 != TF_F8E4M3 && a->fp8 != TF_F8E5M2)
    return tf_fail(TF_ERR_ARG, "fp8_quantize: the destination is f8e4m3 or f8e5m2, not %s", tf_dtype_name(a->fp8));
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (a->rows * a->cols == 0) return TF_OK;
  const int64_t n = a->rows * a->cols;
  tf_cuda_traffic(a->out_t ? "tf_cuda_fp8_quantize_t_kernel" : "tf_cuda_fp8_quantize_kernel",
                  n * ((int64_t)tf_dtype_size(a->dtype) + (a->out ? 1 : 0) + (a->out_t ? 1 : 0)));
  switch (a->dtype) {
    case TF_BF16: return tf_cuda_fp8_quantize_in<TF_BF16>(st, a);
    case TF_F16: return tf_cuda_fp8_quantize_in<TF_F16>(st, a);
    case TF_F32: return tf_cuda_fp8_quantize_in<TF_F32>(st, a);
    default: return tf_fail(TF_ERR_ARG, "fp8_quantize: no kernel for dtype %s", tf_dtype_name(a->dtype));
  }
}
