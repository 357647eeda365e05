#include "iter.h"
#include "cpu.h"

void tf_cpu_for_rows(const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1, tf_cpu_row_fn fn, void *ud) {
  tf_iter it;
  tf_iter_init(&it, out, in0, in1);
  int nd = it.ndim;
  int64_t n = it.shape[nd - 1], rows = it.numel / (n ? n : 1);
  int64_t idx[TF_MAX_DIMS] = {0}, oo = it.offset[0], o0 = it.offset[1], o1 = it.offset[2];
  const int64_t *so = it.stride[0], *s0 = it.stride[1], *s1 = it.stride[2];
  for (int64_t r = 0; r < rows; r++) {
    fn(ud, oo, o0, o1, n, s0[nd - 1], s1[nd - 1]);
    for (int d = nd - 2; d >= 0; d--) {
      idx[d]++;
      o0 += s0[d], o1 += s1[d], oo += so[d];
      if (idx[d] < it.shape[d]) break;
      o0 -= s0[d] * it.shape[d], o1 -= s1[d] * it.shape[d], oo -= so[d] * it.shape[d];
      idx[d] = 0;
    }
  }
}
