/* The CPU twins of the Transformer engine's kernels (model_kernels.h): the
 * references the CUDA kernels are tested against. Row statistics and
 * elementwise formulas run in double and round once into each output. */
#ifndef TF_CPU_MODEL_H
#define TF_CPU_MODEL_H

#include "model_kernels.h"

/* cpu_gemm.c */
tf_status tf_cpu_gemm(tf_device_ctx *ctx, const tf_gemm_args *a);

/* The table cpu_backend.c registers (cpu_model.c). */
extern const tf_model_kernels tf_cpu_model_kernels;

#endif
