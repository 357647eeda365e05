/* AdamW's update on the CPU: the reference of kernels/cuda/adamw.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_nn.h"
#include "cpu_model.h"

/* The f32 update of n elements, the generic loop's arithmetic on plain
 * floats: built for AVX-512, AVX2 and the baseline, the one that the CPU
 * has chosen at load time. Vector lanes round as the scalar code does (the
 * file is built without contraction into FMA and with sqrt as an
 * instruction), so every build gives the same bits; as scalar code the
 * update waited on its divisions and square roots. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
tf_cpu_adamw_f32(const tf_adamw_update *a, float *restrict p, float *restrict m, float *restrict v,
                 const float *restrict g, int64_t n) {
  const double decay = a->decay, beta1 = a->beta1, beta2 = a->beta2, step = a->step_size, eps = a->eps,
               bias2_sqrt = a->bias2_sqrt;
  for (int64_t i = 0; i < n; i++) {
    const double gv = g[i];
    double pv = (double)p[i] * decay;
    const double mv = beta1 * (double)m[i] + (1.0 - beta1) * gv;
    const double vv = beta2 * (double)v[i] + (1.0 - beta2) * gv * gv;
    pv -= step * mv / (sqrt(vv) / bias2_sqrt + eps);
    p[i] = (float)pv, m[i] = (float)mv, v[i] = (float)vv;
  }
}

/* torch.optim.AdamW's update, element by element, in double. */
tf_status tf_cpu_adamw(tf_device_ctx *ctx, const tf_adamw_update *a) {
  (void)ctx;
  void *p = tf_tensor_data(a->p), *m = tf_tensor_data(a->m), *v = tf_tensor_data(a->v);
  const void *g = tf_tensor_data(a->g);
  tf_dtype pd = a->p->dtype, gd = a->g->dtype;
  int64_t n = tf_tensor_numel(a->p), n_low = a->low ? tf_tensor_numel(a->low) : 0;
  void *low = a->low ? tf_tensor_data(a->low) : NULL;
  if (pd == TF_F32 && gd == TF_F32 && !low) { /* the common case: spans of 64Ki elements a thread */
    enum { SPAN = 1 << 16 };
#pragma omp parallel for schedule(static) if (n > TF_CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i += SPAN)
      tf_cpu_adamw_f32(a, (float *)p + i, (float *)m + i, (float *)v + i, (const float *)g + i,
                       n - i < SPAN ? n - i : SPAN);
    return TF_OK;
  }
#pragma omp parallel for schedule(static) if (n > TF_CPU_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) {
    double gv = tf_elem_get(g, gd, i);
    double pv = tf_elem_get(p, pd, i) * a->decay;
    double mv = a->beta1 * tf_elem_get(m, pd, i) + (1.0 - a->beta1) * gv;
    double vv = a->beta2 * tf_elem_get(v, pd, i) + (1.0 - a->beta2) * gv * gv;
    pv -= a->step_size * mv / (sqrt(vv) / a->bias2_sqrt + a->eps);
    tf_elem_set(p, pd, i, pv);
    if (i < n_low) tf_elem_set(low, a->low->dtype, i, tf_elem_get(p, pd, i)); /* from the stored p */
    tf_elem_set(m, pd, i, mv);
    tf_elem_set(v, pd, i, vv);
  }
  return TF_OK;
}

/* ---- the engine's AdamW and clipping (model_kernels.h): the twins of adamw.cu's ------------------ */

/* The constants rounded to f32 once, as tf_cuda_adamw_round<float> rounds them. */
tf_status tf_cpu_model_adamw_constants(tf_device_ctx *ctx, float *consts, const tf_adamw_update *u) {
  (void)ctx;
  consts[TF_ADAMW_DECAY] = (float)u->decay;
  consts[TF_ADAMW_BETA1] = (float)u->beta1;
  consts[TF_ADAMW_BETA2] = (float)u->beta2;
  consts[TF_ADAMW_ONE_MINUS_BETA1] = (float)(1.0 - u->beta1);
  consts[TF_ADAMW_ONE_MINUS_BETA2] = (float)(1.0 - u->beta2);
  consts[TF_ADAMW_STEP_SIZE] = (float)u->step_size;
  consts[TF_ADAMW_BIAS2_SQRT] = (float)u->bias2_sqrt;
  consts[TF_ADAMW_EPS] = (float)u->eps;
  return TF_OK;
}

/* tf_cuda_adamw_one<float>'s operations in its order, each rounded to f32
 * (no contraction in this file): the GPU's bits. */
tf_status tf_cpu_model_adamw(tf_device_ctx *ctx, const tf_model_adamw_args *a) {
  (void)ctx;
  const float *c = a->consts;
  const float s = a->grad_scale ? a->grad_scale[TF_GRAD_SCALE] : 1.f;
  float *g = (float *)a->g;
  uint16_t *low = a->low;
#pragma omp parallel for schedule(static) if (a->n > TF_CPU_PARALLEL_MIN)
  for (int64_t i = 0; i < a->n; i++) {
    const float gv = a->grad_scale ? g[i] * s : g[i];
    const float m = c[TF_ADAMW_BETA1] * a->m[i] + c[TF_ADAMW_ONE_MINUS_BETA1] * gv;
    const float v = c[TF_ADAMW_BETA2] * a->v[i] + c[TF_ADAMW_ONE_MINUS_BETA2] * gv * gv;
    float p = a->p[i] * c[TF_ADAMW_DECAY];
    p = p - c[TF_ADAMW_STEP_SIZE] * m / (sqrtf(v) / c[TF_ADAMW_BIAS2_SQRT] + c[TF_ADAMW_EPS]);
    a->p[i] = p, a->m[i] = m, a->v[i] = v;
    if (a->zero_g) g[i] = 0.f;
    if (low && i < a->n_low) low[i] = a->low_dtype == TF_BF16 ? tf_f32_to_bf16(p) : tf_f32_to_f16(p);
  }
  return TF_OK;
}

/* The halving tree of the GPU's block reduction over x[TF_GRAD_NORM_THREADS]. */
static double tf_cpu_grad_norm_tree(double *x) {
  for (int s = TF_GRAD_NORM_THREADS / 2; s > 0; s /= 2)
    for (int t = 0; t < s; t++) x[t] += x[t + s];
  return x[0];
}

/* The GPU's order of additions (model_kernels.h), block by block. */
tf_status tf_cpu_grad_norm(tf_device_ctx *ctx, const tf_grad_norm_args *a) {
  (void)ctx;
  const int64_t block = TF_GRAD_NORM_THREADS, stride = (int64_t)TF_GRAD_NORM_BLOCKS * TF_GRAD_NORM_THREADS;
#pragma omp parallel for schedule(static) if (a->n > TF_CPU_PARALLEL_MIN)
  for (int b = 0; b < TF_GRAD_NORM_BLOCKS; b++) {
    double x[TF_GRAD_NORM_THREADS] = {0};
    for (int64_t at = (int64_t)b * block; at < a->n; at += stride) {
      const int64_t count = a->n - at < block ? a->n - at : block;
      for (int64_t t = 0; t < count; t++) {
        const double v = a->g[at + t];
        x[t] += v * v;
      }
    }
    a->partial[b] = tf_cpu_grad_norm_tree(x);
  }
  double x[TF_GRAD_NORM_THREADS] = {0};
  for (int b = 0; b < TF_GRAD_NORM_BLOCKS; b++) x[b % TF_GRAD_NORM_THREADS] += a->partial[b];
  const double norm = sqrt(tf_cpu_grad_norm_tree(x));
  a->out[TF_GRAD_NORM] = (float)norm;
  a->out[TF_GRAD_SCALE] = norm > a->max_norm ? (float)(a->max_norm / (norm + 1e-6)) : 1.f;
  return TF_OK;
}
