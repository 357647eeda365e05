/* SwiGLU on the CPU, the fused engine's kernel: the reference of
 * kernels/cuda/swiglu.cu, formulas in double, rounded once into each
 * output. */
#include <math.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* ---- swiglu ------------------------------------------------------------------------- */

/* Row r: silu(a) b, or its two partial derivatives (and silu(a) b again
 * where y is given), per element, for a dtype d that TF_CPU_WITH_DTYPE
 * makes a constant. */
TF_CPU_INLINE void tf_cpu_swiglu_row(tf_dtype d, const tf_swiglu_args *a, int64_t r) {
  const int64_t f = a->f;
  for (int64_t c = 0; c < f; c++) {
    const double x = tf_elem_get(a->ab, d, r * 2 * f + c), b = tf_elem_get(a->ab, d, r * 2 * f + f + c);
    const double s = 1.0 / (1.0 + exp(-x)), silu = x * s;
    if (!a->backward) {
      tf_elem_set(a->y, d, r * f + c, silu * b);
      continue;
    }
    const double g = tf_elem_get(a->dy, d, r * f + c);
    tf_elem_set(a->dab, d, r * 2 * f + c, g * b * (s * (1.0 + x * (1.0 - s))));
    tf_elem_set(a->dab, d, r * 2 * f + f + c, g * silu);
    if (a->y) tf_elem_set(a->y, d, r * f + c, silu * b); /* over dy's element, read above */
  }
}

tf_status tf_cpu_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *a) {
  (void)ctx;
#pragma omp parallel for schedule(static) if (a->rows * a->f > TF_CPU_PARALLEL_MIN)
  for (int64_t r = 0; r < a->rows; r++) TF_CPU_WITH_DTYPE(a->dtype, tf_cpu_swiglu_row, a, r);
  return TF_OK;
}
