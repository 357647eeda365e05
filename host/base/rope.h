/* The rotary position embedding's rule, written once for every place that
 * turns pairs: the eager rope op and the engine's rope_heads on both
 * backends (kernels/cpu/rope.c, rope.cu) and the engine's cos/sin tables
 * (model_plan.c). Pair k = (x[2k], x[2k+1]) of a row of dim elements at
 * position pos turns by pos * theta^(-2k/dim); the frequency and the angle
 * are taken in double (one pow, one correctly rounded multiply), so every
 * backend turns by the same angles. */
#ifndef TF_ROPE_H
#define TF_ROPE_H

#include <math.h>
#include <stdint.h>

#include "hd.h"

/* theta^(-2k/dim), in double. */
TF_HD double tf_rope_inv_freq(double theta, int64_t k, int64_t dim) {
  return pow(theta, -(double)(2 * k) / (double)dim);
}

/* (x0, x1) turned by the angle whose cosine and sine are c and s; by minus
 * that angle with -s (the backward pass). */
#ifdef __CUDACC__
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float tf_rope_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double tf_rope_mul(double a, double b) { return __dmul_rn(a, b); }
#endif
/* On the device one product rounded, then a fused multiply-add, spelled out: left to itself the
 * compiler contracts the expression one way in one kernel and the other way in another, and the
 * decode step's fused KV append (gemm.cu) must give the append kernel's bits. */
template <typename C> TF_HD void tf_rope_turn(C x0, C x1, C c, C s, C *y0, C *y1) {
#ifdef __CUDA_ARCH__
  *y0 = fma(x0, c, -tf_rope_mul(x1, s));
  *y1 = fma(x0, s, tf_rope_mul(x1, c));
#else
  *y0 = x0 * c - x1 * s;
  *y1 = x0 * s + x1 * c;
#endif
}
#else
TF_HD void tf_rope_turn(double x0, double x1, double c, double s, double *y0, double *y1) {
  *y0 = x0 * c - x1 * s;
  *y1 = x0 * s + x1 * c;
}
#endif

#endif
