/* FP8 training's casts on the CPU (model_kernels.h: fp8_amax,
 * fp8_quantize), the twins of kernels/cuda/fp8_train.cu: the same
 * multiplier (fp8.h's tf_fp8_multiplier) and the same saturating cast of
 * one f32 product, so the same bytes. */
#include <math.h>

#include "cpu.h"
#include "cpu_model.h"
#include "elemio.h"
#include "fp8.h"

tf_status tf_cpu_fp8_amax(tf_device_ctx *ctx, const tf_fp8_amax_args *a) {
  (void)ctx;
  float most = 0.0f;
  for (int64_t i = 0; i < a->count; i++) {
    const float v = fabsf((float)tf_elem_get(a->x, a->dtype, i));
    if (v != v) {
      most = v;
      break;
    }
    if (v > most) most = v;
  }
  *a->amax = most;
  return TF_OK;
}

tf_status tf_cpu_fp8_quantize(tf_device_ctx *ctx, const tf_fp8_quantize_args *a) {
  (void)ctx;
  const float amax = *a->amax, top = a->fp8 == TF_F8E4M3 ? 448.0f : 57344.0f;
  const float q = tf_fp8_multiplier(amax, top);
  uint8_t *out = (uint8_t *)a->out, *out_t = (uint8_t *)a->out_t;
#pragma omp parallel for schedule(static) if (a->rows * a->cols > TF_CPU_PARALLEL_MIN)
  for (int64_t i = 0; i < a->rows; i++)
    for (int64_t j = 0; j < a->cols; j++) {
      const float v = (float)tf_elem_get(a->x, a->dtype, i * a->cols + j) * q;
      const uint8_t c = a->fp8 == TF_F8E4M3 ? tf_f32_to_f8e4m3_sat(v) : tf_f32_to_f8e5m2_sat(v);
      if (out) out[i * a->cols + j] = c;
      if (out_t) out_t[j * a->rows + i] = c;
    }
  if (a->scale) *a->scale = 1.0f / q;
  if (a->nonfinite && !(amax <= 3.40282347e38f)) (*a->nonfinite)++;
  return TF_OK;
}
