/* TF_HD marks small functions shared by the C core and the CUDA kernels, so
 * that conversions, random numbers and op formulas are literally the same
 * code on both backends. */
#ifndef TF_HD_H
#define TF_HD_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TF_HD __host__ __device__ __forceinline__
#else
#define TF_HD static inline
#endif

TF_HD uint32_t tf_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

TF_HD float tf_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

#endif
