#include "cpu.h"

void tf_cpu_for_rows(const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1, tf_cpu_row_fn fn, void *ud) {
  /* Collapse: drop size-1 dims, merge dims that are contiguous in every operand. */
  int nd = 0;
  int64_t shape[TF_MAX_DIMS], so[TF_MAX_DIMS], s0[TF_MAX_DIMS], s1[TF_MAX_DIMS];
  for (int i = 0; i < out->ndim; i++) {
    if (out->shape[i] == 1) continue;
    int64_t a = in0 ? in0->strides[i] : 0, b = in1 ? in1->strides[i] : 0, o = out->strides[i];
    if (nd > 0 && so[nd - 1] == o * out->shape[i] && s0[nd - 1] == a * out->shape[i] &&
        s1[nd - 1] == b * out->shape[i]) {
      shape[nd - 1] *= out->shape[i];
      so[nd - 1] = o, s0[nd - 1] = a, s1[nd - 1] = b;
      continue;
    }
    shape[nd] = out->shape[i], so[nd] = o, s0[nd] = a, s1[nd] = b;
    nd++;
  }
  int64_t base0 = in0 ? in0->offset : 0, base1 = in1 ? in1->offset : 0;
  if (nd == 0) {
    fn(ud, out->offset, base0, base1, 1, 0, 0);
    return;
  }
  int64_t n = shape[nd - 1], rows = 1;
  for (int i = 0; i < nd - 1; i++) rows *= shape[i];
  int64_t idx[TF_MAX_DIMS] = {0}, o0 = base0, o1 = base1, oo = out->offset;
  for (int64_t r = 0; r < rows; r++) {
    fn(ud, oo, o0, o1, n, s0[nd - 1], s1[nd - 1]);
    for (int d = nd - 2; d >= 0; d--) {
      idx[d]++;
      o0 += s0[d], o1 += s1[d], oo += so[d];
      if (idx[d] < shape[d]) break;
      o0 -= s0[d] * shape[d], o1 -= s1[d] * shape[d], oo -= so[d] * shape[d];
      idx[d] = 0;
    }
  }
}
