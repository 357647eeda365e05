/* masked_fill on the CPU: the reference of kernels/cuda/masked_fill.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_nn.h"

typedef struct {
  const char *x, *mask;
  char *out;
  size_t elsize;
  uint64_t fill; /* the value in x's dtype, in its low bytes */
} tf_cpu_masked_fill_job;

/* One row of the iteration space: operand 0 is x, operand 1 the mask. */
static void tf_cpu_masked_fill_rows(void *ud, int64_t oo, int64_t o0, int64_t o1, int64_t n, int64_t s0,
                                    int64_t s1) {
  tf_cpu_masked_fill_job *j = ud;
  size_t es = j->elsize;
  for (int64_t i = 0; i < n; i++) {
    char *dst = j->out + (size_t)(oo + i) * es;
    if (j->mask[o1 + i * s1])
      memcpy(dst, &j->fill, es);
    else
      memcpy(dst, j->x + (size_t)(o0 + i * s0) * es, es);
  }
}

/* Elements move as bytes, so NaN payloads and -0 survive, as on the GPU. */
tf_status tf_cpu_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                             tf_tensor *out) {
  (void)ctx;
  tf_cpu_masked_fill_job job = {x->storage->data, mask->storage->data, out->storage->data,
                                tf_dtype_size(x->dtype), 0};
  tf_elem_set(&job.fill, x->dtype, 0, value);
  tf_cpu_for_rows(out, x, mask, tf_cpu_masked_fill_rows, &job);
  return TF_OK;
}
