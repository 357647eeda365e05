/* AdamW's update on the CPU: the reference of kernels/cuda/adamw.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_nn.h"

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
