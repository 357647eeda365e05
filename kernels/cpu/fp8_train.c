/* FP8 training's casts on the CPU (model_kernels.h: fp8_amax,
 * fp8_quantize, fp8_history), the twins of kernels/cuda/fp8_train.cu: the same
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
    if (v != v) { /* any NaN, payload or not, is the GPU's one NaN word */
      most = NAN;
      break;
    }
    if (v > most) most = v;
  }
  *a->amax = most;
  return TF_OK;
}

/* The larger of two amax values, NaN if either is (the GPU's order of f32 bits). */
static float tf_fp8_max(float a, float b) { return a != a || b != b ? NAN : a > b ? a : b; }

tf_status tf_cpu_fp8_quantize(tf_device_ctx *ctx, const tf_fp8_quantize_args *a) {
  (void)ctx;
  if (a->record) {
    float most = 0.0f;
    const tf_fp8_amax_args m = {.count = a->rows * a->cols, .dtype = a->dtype, .x = a->x, .amax = &most};
    tf_cpu_fp8_amax(NULL, &m);
    *a->record = tf_fp8_max(*a->record, most);
  }
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

tf_status tf_cpu_fp8_history(tf_device_ctx *ctx, const tf_fp8_history_args *a) {
  (void)ctx;
  for (int64_t i = 0; i < a->sites; i++) {
    float *h = a->history + i * a->length;
    const float newest = a->newest[i], used = a->use[i];
    if (used > 0.0f && newest > used) (*a->overflows)++;
    for (int64_t k = a->length - 1; k > 0; k--) h[k] = h[k - 1];
    h[0] = newest;
    float most = 0.0f;
    for (int64_t k = 0; k < a->length; k++) most = tf_fp8_max(most, h[k]);
    a->use[i] = most;
    a->newest[i] = 0.0f;
  }
  return TF_OK;
}
