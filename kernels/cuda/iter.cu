/* The iteration geometry of the elementwise kernels: host/tensor/iter.h's
 * collapsed space, stored innermost first for the kernels. */
#include "cuda_common.cuh"

#include "iter.h"

/* Fills g for a contiguous out and inputs in0/in1 (in1 may be NULL) viewed
 * with out's shape, so kernels do as few divisions per element as the
 * layout allows and none at all when every operand is dense. */
void tf_cuda_strided_init(tf_cuda_strided *g, const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1) {
  tf_iter it;
  tf_iter_init(&it, out, in0, in1);
  int nd = it.ndim;
  *g = tf_cuda_strided{};
  g->ndim = nd;
  g->narrow = it.numel <= (int64_t)INT32_MAX; /* i + grid stride cannot wrap in 32 bits */
  for (int d = 0; d < nd; d++) {
    g->shape[d] = it.shape[nd - 1 - d];
    g->stride[0][d] = it.stride[1][nd - 1 - d];
    g->stride[1][d] = it.stride[2][nd - 1 - d];
  }
  g->contiguous = nd == 1 && (!in0 || g->stride[0][0] == 1) && (!in1 || g->stride[1][0] == 1);
}
