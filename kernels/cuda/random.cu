/* Random tensors on the GPU, bit-identical with kernels/cpu/random.c's
 * tf_cpu_random: element i is word i % 4 of Philox block offset + i / 4,
 * turned into a value by philox.h's double-precision arithmetic (each
 * normal pair once per block, tf_det_random_block) and stored
 * by tf_elem_set. CMake compiles this file with --fmad=false so that no
 * multiply-add is fused and every operation rounds as on the host. */
#include "cuda_common.cuh"

#include "elemio.h"
#include "philox.h"

/* One thread per Philox block of four elements. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_random_kernel(void *out, int64_t n,
                                                                         tf_random_args args) {
  int64_t blocks = (n + 3) / 4;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t blk = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; blk < blocks; blk += step) {
    double v[4];
    tf_det_random_block(args.seed, args.offset, (uint64_t)blk, (int)args.kind, args.a, args.b, v);
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (blk * 4 + j < n) tf_elem_set(out, DT, blk * 4 + j, v[j]);
  }
}

#define TF_CUDA_RANDOM_CASE(DT, unused)                                                               \
  case DT:                                                                                            \
    tf_cuda_random_kernel<DT><<<tf_cuda_blocks(st, (n + 3) / 4), TF_CUDA_THREADS, 0, st->stream>>>(data, n, *args); \
    return tf_cuda_launched("random kernel");

/* Picks the kernel by output dtype; args->offset is the first Philox block,
 * already reserved by the dispatcher. */
tf_status tf_cuda_random(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  int64_t n = tf_tensor_numel(out);
  if (n == 0) return TF_OK;
  void *data = tf_tensor_data(out);
  switch (out->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_RANDOM_CASE, 0)
    TF_CUDA_INT_TYPES(TF_CUDA_RANDOM_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "random: no kernel for dtype %s", tf_dtype_name(out->dtype));
}
