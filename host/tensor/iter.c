#include "iter.h"

void tf_iter_init(tf_iter *it, const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1) {
  const tf_tensor *ops[3] = {out, in0, in1};
  int nd = 0;
  it->numel = 1;
  for (int i = 0; i < out->ndim; i++) {
    int64_t size = out->shape[i];
    it->numel *= size;
    if (size == 1) continue;
    int64_t st[3];
    for (int k = 0; k < 3; k++) st[k] = ops[k] ? ops[k]->strides[i] : 0;
    bool merge = nd > 0;
    for (int k = 0; k < 3 && merge; k++) merge = it->stride[k][nd - 1] == st[k] * size;
    if (merge) {
      it->shape[nd - 1] *= size;
    } else {
      it->shape[nd] = size;
      nd++;
    }
    for (int k = 0; k < 3; k++) it->stride[k][nd - 1] = st[k];
  }
  if (nd == 0) { /* a single element */
    it->shape[0] = 1;
    for (int k = 0; k < 3; k++) it->stride[k][0] = 1;
    nd = 1;
  }
  it->ndim = nd;
  for (int k = 0; k < 3; k++) it->offset[k] = ops[k] ? ops[k]->offset : 0;
}
