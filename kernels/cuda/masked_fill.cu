/* out = mask ? value : x on the GPU: the twin of kernels/cpu/masked_fill.c.
 * x and the (broadcast) bool mask are strided views of out's shape; the
 * value is converted to x's dtype once on the host by elemio.h, exactly as
 * the CPU converts it, and elements are moved as words of the element's
 * size, so the result is bit-identical to the CPU's. */
#include "cuda_common.cuh"

#include "elemio.h"

typedef struct tf_cuda_masked_fill_params {
  const void *x;
  const uint8_t *mask;
  void *out;
  int64_t n;
  uint64_t fill; /* the value in x's dtype, in its low bytes */
  tf_cuda_strided geom; /* operand 0: x, operand 1: mask */
} tf_cuda_masked_fill_params;

template <typename W, typename I>
__device__ __forceinline__ void tf_cuda_masked_fill_strided(const tf_cuda_masked_fill_params &p, W fill) {
  const W *x = (const W *)p.x;
  W *out = (W *)p.out;
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)p.n; i += (I)(gridDim.x * blockDim.x)) {
    int64_t off[2];
    tf_cuda_strided_offsets<2, I>(p.geom, i, off);
    out[i] = p.mask[off[1]] ? fill : x[off[0]];
  }
}

template <typename W>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_masked_fill_kernel(tf_cuda_masked_fill_params p) {
  W fill;
  memcpy(&fill, &p.fill, sizeof fill);
  if (p.geom.contiguous) {
    const W *x = (const W *)p.x;
    W *out = (W *)p.out;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (int64_t)gridDim.x * blockDim.x)
      out[i] = p.mask[i] ? fill : x[i];
  } else if (p.geom.narrow) {
    tf_cuda_masked_fill_strided<W, uint32_t>(p, fill);
  } else {
    tf_cuda_masked_fill_strided<W, int64_t>(p, fill);
  }
}

/* One kernel per element size: the dtype itself does not matter here. */
tf_status tf_cuda_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                              tf_tensor *out) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_cuda_masked_fill_params p;
  memset(&p, 0, sizeof p);
  p.x = tf_tensor_data(x);
  p.mask = (const uint8_t *)tf_tensor_data(mask);
  p.out = tf_tensor_data(out);
  p.n = tf_tensor_numel(out);
  tf_elem_set(&p.fill, x->dtype, 0, value);
  tf_cuda_strided_init(&p.geom, out, x, mask);
  const unsigned blocks = tf_cuda_blocks(st, p.n);
  switch (tf_dtype_size(x->dtype)) {
    case 1: tf_cuda_masked_fill_kernel<uint8_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    case 2: tf_cuda_masked_fill_kernel<uint16_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    case 4: tf_cuda_masked_fill_kernel<uint32_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    case 8: tf_cuda_masked_fill_kernel<uint64_t><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(p); break;
    default: return tf_fail(TF_ERR_ARG, "masked_fill: no kernel for %zu-byte elements", tf_dtype_size(x->dtype));
  }
  return tf_cuda_launched("masked_fill kernel");
}
