/* Dtype conversion and strided copies, fill and arange on the GPU: the twin
 * of kernels/cpu/convert.c, converting every element through elemio.h so both
 * backends round, clamp and truncate identically. */
#include "cuda_common.cuh"

#include <string.h>

#include "elemio.h"

/* Y(DTYPE, ...) for every dtype; the 8-bit floats only ever convert. */
#define TF_CUDA_FP8_TYPES(Y, ...) Y(TF_F8E4M3, __VA_ARGS__) Y(TF_F8E5M2, __VA_ARGS__)
#define TF_CUDA_ALL_TYPES(Y, ...)                                                                \
  TF_CUDA_FLOAT_TYPES(Y, __VA_ARGS__) TF_CUDA_INT_TYPES(Y, __VA_ARGS__) Y(TF_BOOL, __VA_ARGS__) \
  TF_CUDA_FP8_TYPES(Y, __VA_ARGS__)

typedef struct tf_cuda_copy_args {
  void *dst;
  const void *src;
  int64_t n;
  tf_cuda_strided geom;
} tf_cuda_copy_args;

/* One element converted, saturating (into an 8-bit float) or not, by the
 * CPU's rules. */
template <int SD, int DD, bool SAT>
__device__ __forceinline__ void tf_cuda_convert_one(const tf_cuda_copy_args &p, int64_t di, int64_t si) {
  if (SAT)
    tf_elem_convert_saturated(p.dst, DD, di, p.src, SD, si);
  else
    tf_elem_convert(p.dst, DD, di, p.src, SD, si);
}

/* The strided loop of a conversion: dst[offset of i] = convert(src[offset of i])
 * (geometry operand 0 is the source, operand 1 the destination). */
template <int SD, int DD, bool SAT, typename I>
__device__ __forceinline__ void tf_cuda_convert_strided(const tf_cuda_copy_args &p) {
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)p.n; i += (I)(gridDim.x * blockDim.x)) {
    int64_t off[2];
    tf_cuda_strided_offsets<2, I>(p.geom, i, off);
    tf_cuda_convert_one<SD, DD, SAT>(p, off[1], off[0]);
  }
}

/* dst[i] = convert(src[i]), with both dtypes known at compile time so that
 * elemio.h's switches fold away. */
template <int SD, int DD, bool SAT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_convert_kernel(tf_cuda_copy_args p) {
  if (p.geom.contiguous) {
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step)
      tf_cuda_convert_one<SD, DD, SAT>(p, i, i);
  } else if (p.geom.narrow) {
    tf_cuda_convert_strided<SD, DD, SAT, uint32_t>(p);
  } else {
    tf_cuda_convert_strided<SD, DD, SAT, int64_t>(p);
  }
}

/* A same-dtype strided copy moves element bits unchanged (NaN payloads
 * included), one word of the element's size at a time. */
template <typename W, typename I>
__device__ __forceinline__ void tf_cuda_gather_strided(const tf_cuda_copy_args &p) {
  W *dst = (W *)p.dst;
  const W *src = (const W *)p.src;
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)p.n; i += (I)(gridDim.x * blockDim.x)) {
    int64_t off[2];
    tf_cuda_strided_offsets<2, I>(p.geom, i, off);
    dst[off[1]] = src[off[0]];
  }
}

/* Same-dtype copy between strided views (dense ones use cudaMemcpyAsync). */
template <typename W>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_gather_kernel(tf_cuda_copy_args p) {
  if (p.geom.narrow)
    tf_cuda_gather_strided<W, uint32_t>(p);
  else
    tf_cuda_gather_strided<W, int64_t>(p);
}

/* Queues one (source, destination) dtype pair's kernel. */
template <int SD, int DD, bool SAT = false>
static tf_status tf_cuda_convert_launch(tf_cuda_state *st, const tf_cuda_copy_args &p) {
  tf_cuda_convert_kernel<SD, DD, SAT><<<tf_cuda_blocks(st, p.n), TF_CUDA_THREADS, 0, st->stream>>>(p);
  return tf_cuda_launched("convert kernel");
}

#define TF_CUDA_CONVERT_TO_CASE(DT, SD) \
  case DT: return tf_cuda_convert_launch<SD, DT>(st, p);

/* Picks the destination dtype's kernel for source dtype SD. */
template <int SD>
static tf_status tf_cuda_convert_from(tf_cuda_state *st, const tf_cuda_copy_args &p, tf_dtype dd) {
  switch (dd) {
    TF_CUDA_ALL_TYPES(TF_CUDA_CONVERT_TO_CASE, SD)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "convert: unknown destination dtype %d", (int)dd);
}

#define TF_CUDA_CONVERT_FROM_CASE(DT, unused) \
  case DT: return tf_cuda_convert_from<DT>(st, p, dst->dtype);

/* Picks the gather kernel by element size: bits move unchanged. */
static tf_status tf_cuda_gather(tf_cuda_state *st, const tf_cuda_copy_args &p, size_t elsize) {
  unsigned blocks = tf_cuda_blocks(st, p.n);
  switch (elsize) {
    case 1: tf_cuda_gather_kernel<uint8_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    case 2: tf_cuda_gather_kernel<uint16_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    case 4: tf_cuda_gather_kernel<uint32_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    case 8: tf_cuda_gather_kernel<uint64_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    default: return tf_fail(TF_ERR_ARG, "copy: no kernel for %zu-byte elements", elsize);
  }
  return tf_cuda_launched("strided copy kernel");
}

/* Queues the saturating conversion of source dtype SD into an 8-bit float. */
template <int SD>
static tf_status tf_cuda_convert_saturate_from(tf_cuda_state *st, const tf_cuda_copy_args &p, tf_dtype dd) {
  if (dd == TF_F8E4M3) return tf_cuda_convert_launch<SD, TF_F8E4M3, true>(st, p);
  if (dd == TF_F8E5M2) return tf_cuda_convert_launch<SD, TF_F8E5M2, true>(st, p);
  return tf_fail(TF_ERR_ARG, "convert: a saturating conversion goes into f8e4m3 or f8e5m2, not %s",
                 tf_dtype_name(dd));
}

#define TF_CUDA_SATURATE_FROM_CASE(DT, unused) \
  case DT: return tf_cuda_convert_saturate_from<DT>(st, p, dst->dtype);

/* Same dtype: a dense source is one device-to-device memcpy, a strided one a
 * gather; otherwise every element goes through tf_elem_convert. Saturating,
 * every element goes through tf_elem_convert_saturated, same dtype or not
 * (an e5m2 infinity becomes 57344). */
static tf_status tf_cuda_convert_as(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst, bool saturate) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_cuda_copy_args p;
  p.dst = tf_tensor_data(dst);
  p.src = tf_tensor_data(src);
  p.n = tf_tensor_numel(dst);
  if (p.n == 0) return TF_OK;
  tf_cuda_strided_init(&p.geom, dst, src, dst);
  if (saturate) {
    switch (src->dtype) {
      TF_CUDA_ALL_TYPES(TF_CUDA_SATURATE_FROM_CASE, 0)
      default: break;
    }
    return tf_fail(TF_ERR_ARG, "convert: unknown source dtype %d", (int)src->dtype);
  }
  if (src->dtype == dst->dtype) {
    size_t elsize = tf_dtype_size(src->dtype);
    if (p.geom.contiguous) {
      return tf_cuda_device_copy(st, p.dst, p.src, (size_t)p.n * elsize);
    }
    return tf_cuda_gather(st, p, elsize);
  }
  switch (src->dtype) {
    TF_CUDA_ALL_TYPES(TF_CUDA_CONVERT_FROM_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "convert: unknown source dtype %d", (int)src->dtype);
}

tf_status tf_cuda_convert(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst) {
  return tf_cuda_convert_as(ctx, src, dst, false);
}

tf_status tf_cuda_convert_saturate(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst) {
  return tf_cuda_convert_as(ctx, src, dst, true);
}

/* Broadcasts one element's bits, prepared on the host, over out. */
template <typename W>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_fill_kernel(W *out, int64_t n, W value) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) out[i] = value;
}

/* Copies the element's bytes into a word of its size for the fill kernel. */
template <typename W>
static tf_status tf_cuda_fill_words(tf_cuda_state *st, void *data, int64_t n, const unsigned char *pattern) {
  W value;
  memcpy(&value, pattern, sizeof value);
  tf_cuda_fill_kernel<W><<<tf_cuda_blocks(st, n), TF_CUDA_THREADS, 0, st->stream>>>((W *)data, n, value);
  return tf_cuda_launched("fill kernel");
}

/* The element is converted once, on the host, by tf_elem_set (exactly as
 * the CPU's fill does), then its bytes are broadcast; a pattern of equal
 * bytes (zeros, above all) is a plain memset. */
tf_status tf_cuda_fill(tf_device_ctx *ctx, tf_tensor *out, double value) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  int64_t n = tf_tensor_numel(out);
  if (n == 0) return TF_OK;
  void *data = tf_tensor_data(out);
  size_t elsize = tf_dtype_size(out->dtype);
  alignas(8) unsigned char pattern[8] = {0};
  tf_elem_set(pattern, out->dtype, 0, value);
  bool uniform = true;
  for (size_t i = 1; i < elsize; i++) uniform = uniform && pattern[i] == pattern[0];
  if (uniform) {
    return tf_cuda_memset(st, data, pattern[0], (size_t)n * elsize);
  }
  switch (elsize) {
    case 2: return tf_cuda_fill_words<uint16_t>(st, data, n, pattern);
    case 4: return tf_cuda_fill_words<uint32_t>(st, data, n, pattern);
    case 8: return tf_cuda_fill_words<uint64_t>(st, data, n, pattern);
    default: return tf_fail(TF_ERR_ARG, "fill: no kernel for %zu-byte elements", elsize);
  }
}

/* start + i * step, rounded as the CPU computes it: the explicit _rn
 * intrinsics keep the compiler from fusing them into one FMA. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_arange_kernel(void *out, int64_t n, double start,
                                                                         double step) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    tf_elem_set(out, DT, i, __dadd_rn(start, __dmul_rn((double)i, step)));
}

#define TF_CUDA_ARANGE_CASE(DT, unused)                                                       \
  case DT:                                                                                    \
    tf_cuda_arange_kernel<DT><<<tf_cuda_blocks(st, n), TF_CUDA_THREADS, 0, st->stream>>>(data, n, start, step); \
    return tf_cuda_launched("arange kernel");

/* Element i = start + i * step, stored by tf_elem_set as on the CPU. */
tf_status tf_cuda_arange(tf_device_ctx *ctx, tf_tensor *out, double start, double step) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  int64_t n = tf_tensor_numel(out);
  if (n == 0) return TF_OK;
  void *data = tf_tensor_data(out);
  switch (out->dtype) {
    TF_CUDA_ALL_TYPES(TF_CUDA_ARANGE_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "arange: unknown dtype %d", (int)out->dtype);
}
