/* FP8 training's casts on the GPU (model_kernels.h: fp8_amax,
 * fp8_quantize), the twins of kernels/cpu/fp8_train.c.
 *
 * amax: a grid-stride pass, each thread's largest magnitude as f32 bits
 * (non-negative floats order as unsigned integers; a NaN, made
 * 0x7fc00000, above every number), a block's maximum, then an integer
 * atomicMax into the zeroed word: the same bits in any order.
 *
 * quantize: the multiplier q = max / amax read from the device (fp8.h's
 * tf_fp8_multiplier, as the CPU computes it), each value saturate(x q).
 * Row-major only, a grid-stride pass of 16-byte loads where the buffers
 * allow (8 values a thread for the cast, four words of values for amax;
 * amax's loads stay in L2 for the cast, the cast's are streamed); with the
 * transposed copy too, tiles through shared memory (each block reads its
 * tile once, writes its rows, and its columns as the transposed tile's
 * rows): 128 x 64 of 16-byte words where the shape allows, else 32 x 32.
 * Under delayed scaling each also records its input's amax (one atomicMax
 * a warp, a block in the 128 x 64 kernel) while it casts by the history's.
 *
 * history: a thread a cast site, the twin of the CPU's loop. */
#include "cuda_common.cuh"

#include <type_traits>

#include "fp8.h"

/* A value's magnitude as amax's ordered bits (a NaN above every number). */
__device__ __forceinline__ unsigned tf_cuda_fp8_mag(float v) {
  v = fabsf(v);
  return v != v ? 0x7fc00000u : __float_as_uint(v);
}

/* The warp's largest of its lanes' `most` (amax's ordered bits), in every lane. */
__device__ __forceinline__ unsigned tf_cuda_fp8_warp_max(unsigned most) {
  for (int o = 16; o > 0; o /= 2) most = max(most, __shfl_xor_sync(0xffffffffu, most, o));
  return most;
}

/* The block's largest of its threads' `most` (every thread calls it), in thread 0. */
__device__ __forceinline__ unsigned tf_cuda_fp8_block_max(unsigned most) {
  __shared__ unsigned warps[32];
  most = tf_cuda_fp8_warp_max(most);
  const int t = threadIdx.x + threadIdx.y * blockDim.x, nwarps = (blockDim.x * blockDim.y + 31) / 32;
  if (t % 32 == 0) warps[t / 32] = most;
  __syncthreads();
  if (t == 0)
    for (int w = 1; w < nwarps; w++) most = max(most, warps[w]);
  return most;
}

/* The values as 16-byte words (vec: count and x whole words), AMAX_WORDS of them a thread in flight,
 * or one at a time; one atomicMax a block (a word a warp made 34 thousand atomics on one address a
 * call at the 2.7B model's sizes, serialised in L2: a third of the copy rate). */
enum { TF_FP8_AMAX_WORDS = 4 };
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_fp8_amax_kernel(const typename tf_cuda_dtype<DT>::storage *x,
                                                                          int64_t count, bool vec, unsigned *out) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  enum { PER = 16 / sizeof(S) };
  unsigned most = 0;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (vec) {
    union word {
      uint4 word;
      S v[PER];
    };
    const int64_t words = count / PER;
    for (int64_t w = first; w < words; w += TF_FP8_AMAX_WORDS * stride) {
      word u[TF_FP8_AMAX_WORDS];
#pragma unroll
      for (int k = 0; k < TF_FP8_AMAX_WORDS; k++) /* cached: the cast reads the same bytes next */
        if (w + k * stride < words) u[k].word = ((const uint4 *)x)[w + k * stride];
#pragma unroll
      for (int k = 0; k < TF_FP8_AMAX_WORDS; k++)
        if (w + k * stride < words)
#pragma unroll
          for (int j = 0; j < PER; j++) most = max(most, tf_cuda_fp8_mag(tf_cuda_dtype<DT>::load(u[k].v[j])));
    }
  } else {
    for (int64_t i = first; i < count; i += stride) most = max(most, tf_cuda_fp8_mag(tf_cuda_dtype<DT>::load(x[i])));
  }
  most = tf_cuda_fp8_block_max(most);
  if (threadIdx.x == 0) atomicMax(out, most);
}

/* A thread's largest magnitude (amax's ordered bits) into *record: a warp's max, one atomicMax a
 * warp (record's word zeroed, or holding earlier casts' amax, by the history step). Every lane of
 * the warp calls it. */
__device__ __forceinline__ void tf_cuda_fp8_record(float *record, unsigned most) {
  most = tf_cuda_fp8_warp_max(most);
  if ((threadIdx.x + threadIdx.y * blockDim.x) % 32 == 0) atomicMax((unsigned *)record, most);
}

/* One value's code: saturate(x q) in the format. From sm_89 on, the GPU's own conversion
 * (cvt.rn.satfinite: round to nearest even, beyond the largest finite value that value, infinity
 * included), which is fp8.h's saturating rule but for a NaN's sign, so a NaN takes the NaN code with
 * its input's sign, as the CPU's product of a NaN keeps it (the multiplier is finite: a NaN product
 * comes only from a NaN input). fp8.h's integer form (some twenty dependent
 * operations and a branch a value) is for older GPUs. */
template <int FP8> __device__ __forceinline__ uint8_t tf_cuda_fp8_code(float v, float q) {
  const float p = __fmul_rn(v, q);
  if (p != p) return (uint8_t)((__float_as_uint(v) >> 24 & 0x80u) | 0x7fu); /* the GPU's product drops a NaN's sign */
#if __CUDA_ARCH__ >= 890
  /* at most half the format's smallest subnormal: zero with the product's sign, whether or not the
   * conversion flushes an f32 subnormal */
  if (fabsf(p) <= (FP8 == TF_F8E4M3 ? 0x1p-10f : 0x1p-17f)) return (uint8_t)(__float_as_uint(p) >> 24 & 0x80u);
  unsigned short pair;
  if (FP8 == TF_F8E4M3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(p));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(p));
  return (uint8_t)(pair & 0xffu);
#else
  return FP8 == TF_F8E4M3 ? tf_f32_to_f8e4m3_sat(p) : tf_f32_to_f8e5m2_sat(p);
#endif
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

/* Row-major only: 8 values a thread at a time (vec: the count and both buffers whole 8-value
 * words: 16 bytes of bf16 in, 8 bytes out), or one at a time. */
template <int DT, int FP8>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_fp8_quantize_kernel(tf_fp8_quantize_args a, bool vec) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  const float q = tf_cuda_fp8_q<FP8>(a, blockIdx.x == 0 && threadIdx.x == 0);
  const S *x = (const S *)a.x;
  uint8_t *out = (uint8_t *)a.out;
  const int64_t total = a.rows * a.cols, stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned most = 0;
  if (vec) {
    for (int64_t w = first; w < total / 8; w += stride) {
      S v[8];
#pragma unroll
      for (int h = 0; h < 8 * (int)sizeof(S) / 16; h++) ((uint4 *)v)[h] = __ldcs((const uint4 *)(x + w * 8) + h);
      union {
        uint2 word;
        uint8_t c[8];
      } o;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float f = D::load(v[j]);
        o.c[j] = tf_cuda_fp8_code<FP8>(f, q);
        most = max(most, tf_cuda_fp8_mag(f));
      }
      ((uint2 *)out)[w] = o.word;
    }
  } else {
    for (int64_t i = first; i < total; i += stride) {
      const float f = D::load(x[i]);
      out[i] = tf_cuda_fp8_code<FP8>(f, q);
      most = max(most, tf_cuda_fp8_mag(f));
    }
  }
  if (a.record) tf_cuda_fp8_record(a.record, most);
}

/* Tiles of (32 P)^2 values, a block of 32 x 8 threads: P = 2 where rows and cols are even (each
 * thread then loads two neighbours of a row, one 4- or 8-byte load, and stores two bytes of a row
 * of either copy), else 1. */
enum { TF_FP8_TILE = 32, TF_FP8_TILE_ROWS = 8 };
template <int DT, int FP8, int P>
__global__ void __launch_bounds__(TF_FP8_TILE * TF_FP8_TILE_ROWS) tf_cuda_fp8_quantize_t_kernel(tf_fp8_quantize_args a) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  enum { EDGE = TF_FP8_TILE * P };
  __shared__ uint8_t tile[EDGE][EDGE + 4];
  const float q = tf_cuda_fp8_q<FP8>(a, blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0);
  const S *x = (const S *)a.x;
  uint8_t *out = (uint8_t *)a.out, *out_t = (uint8_t *)a.out_t;
  const int64_t row0 = (int64_t)blockIdx.y * EDGE, col0 = (int64_t)blockIdx.x * EDGE;
  const int tx = threadIdx.x, ty = threadIdx.y;
  unsigned most = 0;
  for (int r = ty; r < EDGE; r += TF_FP8_TILE_ROWS) {
    const int64_t i = row0 + r, j = col0 + P * tx;
    if (i >= a.rows || j >= a.cols) continue; /* P = 2: j even and cols even, so j + 1 is in too */
    S v[P];
    if (P == 2) {
      typedef typename std::conditional<sizeof(S) == 2, uint32_t, uint2>::type pair;
      *(pair *)v = *(const pair *)(x + i * a.cols + j);
    } else {
      v[0] = x[i * a.cols + j];
    }
    uint8_t c[P];
#pragma unroll
    for (int k = 0; k < P; k++) {
      tile[r][P * tx + k] = c[k] = tf_cuda_fp8_code<FP8>(D::load(v[k]), q);
      most = max(most, tf_cuda_fp8_mag(D::load(v[k])));
    }
    if (out) {
      if (P == 2) *(uint16_t *)(out + i * a.cols + j) = (uint16_t)(c[0] | c[P - 1] << 8);
      else out[i * a.cols + j] = c[0];
    }
  }
  if (a.record) tf_cuda_fp8_record(a.record, most);
  __syncthreads();
  for (int r = ty; r < EDGE; r += TF_FP8_TILE_ROWS) {
    const int64_t j = col0 + r, i = row0 + P * tx; /* out_t (cols, rows): row j, columns i .. i + P - 1 */
    if (i >= a.rows || j >= a.cols) continue;
    if (P == 2) *(uint16_t *)(out_t + j * a.rows + i) = (uint16_t)(tile[P * tx][r] | tile[P * tx + P - 1][r] << 8);
    else out_t[j * a.rows + i] = tile[tx][r];
  }
}

/* Both layouts from 16-bit values in tiles of 128 rows x 64 columns, a block of 256 threads: each
 * thread asks for four 16-byte words of x (8 values of a row, 32 rows apart) before it uses any,
 * writes the 8 codes of each to out and into the tile, then, the tile whole, two 16-byte words of
 * out_t (16 rows of one column each, from the tile's column). Where rows are whole 16-row groups and
 * columns whole 8-column groups, with the buffers aligned to match (tf_fp8_t16_fits); the 32-tile
 * kernel above, which loads two values a thread and stores two bytes, ran at a third of the copy
 * rate on the 2.7B model's tensors. */
enum { TF_FP8_T16_ROWS = 128, TF_FP8_T16_COLS = 64, TF_FP8_T16_LOADS = TF_FP8_T16_ROWS / 32 };
template <int DT, int FP8>
__global__ void __launch_bounds__(256) tf_cuda_fp8_quantize_t16_kernel(tf_fp8_quantize_args a) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  static_assert(sizeof(S) == 2, "16-bit values");
  __shared__ __align__(16) uint8_t tile[TF_FP8_T16_ROWS][TF_FP8_T16_COLS + 8];
  const float q = tf_cuda_fp8_q<FP8>(a, blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0);
  const S *x = (const S *)a.x;
  uint8_t *out = (uint8_t *)a.out, *out_t = (uint8_t *)a.out_t;
  const int64_t row0 = (int64_t)blockIdx.y * TF_FP8_T16_ROWS, col0 = (int64_t)blockIdx.x * TF_FP8_T16_COLS;
  const int t = threadIdx.x, c8 = 8 * (t % 8), r = t / 8;
  const int64_t j = col0 + c8;
  union word8 {
    uint4 word;
    S v[8];
  } v[TF_FP8_T16_LOADS];
#pragma unroll
  for (int k = 0; k < TF_FP8_T16_LOADS; k++) {
    const int64_t i = row0 + r + 32 * k;
    if (i < a.rows && j < a.cols) v[k].word = __ldcs((const uint4 *)(x + i * a.cols + j));
  }
  unsigned most = 0;
#pragma unroll
  for (int k = 0; k < TF_FP8_T16_LOADS; k++) {
    const int64_t i = row0 + r + 32 * k;
    if (i >= a.rows || j >= a.cols) continue;
    union {
      uint2 word;
      uint8_t c[8];
    } o;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const float f = D::load(v[k].v[e]);
      o.c[e] = tf_cuda_fp8_code<FP8>(f, q);
      most = max(most, tf_cuda_fp8_mag(f));
    }
    *(uint2 *)&tile[r + 32 * k][c8] = o.word;
    if (out) *(uint2 *)(out + i * a.cols + j) = o.word;
  }
  if (a.record) {
    most = tf_cuda_fp8_block_max(most); /* (its barrier also orders the tile's writes) */
    if (t == 0) atomicMax((unsigned *)a.record, most);
  }
  __syncthreads();
  const int jj = t % TF_FP8_T16_COLS, part = t / TF_FP8_T16_COLS; /* 4 parts of 32 rows */
  const int64_t jt = col0 + jj;
  if (jt >= a.cols) return;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int ti = 32 * part + 16 * h;
    const int64_t i0 = row0 + ti;
    if (i0 >= a.rows) continue;
    union {
      uint4 word;
      uint8_t c[16];
    } o;
#pragma unroll
    for (int e = 0; e < 16; e++) o.c[e] = tile[ti + e][jj];
    *(uint4 *)(out_t + jt * a.rows + i0) = o.word;
  }
}

/* Whether the 128 x 64 tile kernel takes a (of 16-bit values): whole 16-row and 8-column groups, x and
 * out_t 16-byte aligned (so is every 16-row group of out_t), out 8-byte aligned. */
static bool tf_fp8_t16_fits(const tf_fp8_quantize_args *a) {
  return a->rows % 16 == 0 && a->cols % 8 == 0 && ((uintptr_t)a->x & 15) == 0 &&
         ((uintptr_t)a->out_t & 15) == 0 && ((uintptr_t)a->out & 7) == 0 &&
         (a->rows + TF_FP8_T16_ROWS - 1) / TF_FP8_T16_ROWS <= 65535;
}

tf_status tf_cuda_fp8_amax(tf_device_ctx *ctx, const tf_fp8_amax_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  TF_TRY(tf_cuda_memset(st, a->amax, 0, sizeof *a->amax));
  if (a->count == 0) return TF_OK;
  const int64_t per = 16 / (int64_t)tf_dtype_size(a->dtype);
  const bool vec = a->count % per == 0 && ((uintptr_t)a->x & 15) == 0;
  const int64_t items = vec ? (a->count / per + TF_FP8_AMAX_WORDS - 1) / TF_FP8_AMAX_WORDS : a->count;
  const int64_t most = (int64_t)st->multiprocessors * 8, want = (items + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS;
  const unsigned blocks = (unsigned)(want < 1 ? 1 : want < most ? want : most);
  unsigned *word = (unsigned *)a->amax;
  switch (a->dtype) {
    case TF_BF16:
      tf_cuda_fp8_amax_kernel<TF_BF16><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>((const uint16_t *)a->x, a->count,
                                                                                   vec, word);
      break;
    case TF_F16:
      tf_cuda_fp8_amax_kernel<TF_F16><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>((const uint16_t *)a->x, a->count,
                                                                                  vec, word);
      break;
    case TF_F32:
      tf_cuda_fp8_amax_kernel<TF_F32><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>((const float *)a->x, a->count, vec,
                                                                                  word);
      break;
    default: return tf_fail(TF_ERR_ARG, "fp8_amax: no kernel for dtype %s", tf_dtype_name(a->dtype));
  }
  tf_cuda_traffic("tf_cuda_fp8_amax_kernel", a->count * (int64_t)tf_dtype_size(a->dtype));
  return tf_cuda_launched("fp8 amax kernel");
}

template <int DT, int FP8> static tf_status tf_cuda_fp8_quantize_typed(tf_cuda_state *st, const tf_fp8_quantize_args *a) {
  if (!a->out_t) {
    const int64_t n = a->rows * a->cols;
    const bool vec = n % 8 == 0 && ((uintptr_t)a->x & 15) == 0 && ((uintptr_t)a->out & 7) == 0;
    tf_cuda_fp8_quantize_kernel<DT, FP8><<<tf_cuda_blocks(st, vec ? n / 8 : n), TF_CUDA_THREADS, 0, st->stream>>>(*a, vec);
    return tf_cuda_launched("fp8 quantize kernel");
  }
  const size_t es = sizeof(typename tf_cuda_dtype<DT>::storage);
  if constexpr (sizeof(typename tf_cuda_dtype<DT>::storage) == 2) {
    if (tf_fp8_t16_fits(a)) {
      const dim3 tiles((unsigned)((a->cols + TF_FP8_T16_COLS - 1) / TF_FP8_T16_COLS),
                       (unsigned)((a->rows + TF_FP8_T16_ROWS - 1) / TF_FP8_T16_ROWS));
      tf_cuda_fp8_quantize_t16_kernel<DT, FP8><<<tiles, 256, 0, st->stream>>>(*a);
      return tf_cuda_launched("fp8 quantize-and-transpose kernel");
    }
  }
  const bool pairs = a->rows % 2 == 0 && a->cols % 2 == 0 && ((uintptr_t)a->x & (2 * es - 1)) == 0 &&
                     ((uintptr_t)a->out & 1) == 0 && ((uintptr_t)a->out_t & 1) == 0;
  const int64_t edge = TF_FP8_TILE * (pairs ? 2 : 1);
  if ((a->rows + edge - 1) / edge > 65535)
    return tf_fail(TF_ERR_ARG, "fp8_quantize: %lld rows are more than the transposing kernel's grid takes",
                   (long long)a->rows);
  const dim3 grid((unsigned)((a->cols + edge - 1) / edge), (unsigned)((a->rows + edge - 1) / edge));
  const dim3 block(TF_FP8_TILE, TF_FP8_TILE_ROWS);
  if (pairs) tf_cuda_fp8_quantize_t_kernel<DT, FP8, 2><<<grid, block, 0, st->stream>>>(*a);
  else tf_cuda_fp8_quantize_t_kernel<DT, FP8, 1><<<grid, block, 0, st->stream>>>(*a);
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

/* The larger of two amax values, NaN if either is (the CPU twin's rule). */
__device__ __forceinline__ float tf_cuda_fp8_max(float a, float b) {
  return a != a || b != b ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

/* A thread a site (fp8_train.c's loop, site by site). */
__global__ void tf_cuda_fp8_history_kernel(tf_fp8_history_args a) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.sites) return;
  float *h = a.history + i * a.length;
  const float newest = a.newest[i], used = a.use[i];
  if (used > 0.0f && newest > used) atomicAdd(a.overflows, 1);
  for (int64_t k = a.length - 1; k > 0; k--) h[k] = h[k - 1];
  h[0] = newest;
  float most = 0.0f;
  for (int64_t k = 0; k < a.length; k++) most = tf_cuda_fp8_max(most, h[k]);
  a.use[i] = most;
  a.newest[i] = 0.0f;
}

tf_status tf_cuda_fp8_history(tf_device_ctx *ctx, const tf_fp8_history_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (a->sites == 0) return TF_OK;
  tf_cuda_fp8_history_kernel<<<(unsigned)((a->sites + 127) / 128), 128, 0, st->stream>>>(*a);
  return tf_cuda_launched("fp8 amax history kernel");
}
