/* The iteration space of an elementwise op: an output and up to two inputs
 * viewed with the output's shape, with size-1 dims dropped and dims merged
 * wherever every operand is contiguous across them. Both backends walk the
 * same collapsed space (the CPU row by row, the GPU by linear index). */
#ifndef TF_ITER_H
#define TF_ITER_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tf_iter {
  int ndim;                       /* >= 1 */
  int64_t numel;
  int64_t shape[TF_MAX_DIMS];     /* outermost first */
  int64_t stride[3][TF_MAX_DIMS]; /* element strides of out, in0, in1 (0 when absent) */
  int64_t offset[3];              /* element offsets of out, in0, in1 into their storage */
} tf_iter;

void tf_iter_init(tf_iter *it, const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1);

#ifdef __cplusplus
}
#endif
#endif
