/* The CPU twins of the Transformer engine's kernels (model_kernels.h): the
 * references the CUDA kernels are tested against. Row statistics and
 * elementwise formulas run in double and round once into each output. */
#ifndef TF_CPU_MODEL_H
#define TF_CPU_MODEL_H

#include "model_kernels.h"

/* Each beside the eager op of the same math. */
tf_status tf_cpu_gemm(tf_device_ctx *ctx, const tf_gemm_args *a);     /* gemm.c */
tf_status tf_cpu_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *a); /* norm.c */
tf_status tf_cpu_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *a); /* softmax.c */
tf_status tf_cpu_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a);         /* rope.c */
tf_status tf_cpu_heads(tf_device_ctx *ctx, const tf_heads_args *a);                   /* rope.c */
tf_status tf_cpu_lm_loss(tf_device_ctx *ctx, const tf_lm_loss_args *a);               /* cross_entropy.c */
tf_status tf_cpu_encoder(tf_device_ctx *ctx, const tf_encoder_args *a);               /* embedding.c */
tf_status tf_cpu_index_check(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit, int64_t *bad);
tf_status tf_cpu_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *a); /* swiglu.c */
/* adamw.c: the engine's AdamW with its constants in memory, and clipping */
tf_status tf_cpu_model_adamw_constants(tf_device_ctx *ctx, float *consts, const struct tf_adamw_update *u);
tf_status tf_cpu_model_adamw(tf_device_ctx *ctx, const tf_model_adamw_args *a);
tf_status tf_cpu_grad_norm(tf_device_ctx *ctx, const tf_grad_norm_args *a);
/* decode.c: generation's KV cache and its attention */
tf_status tf_cpu_kv_append(tf_device_ctx *ctx, const tf_kv_append_args *a);
tf_status tf_cpu_decode_attention(tf_device_ctx *ctx, const tf_decode_attention_args *a);

/* fp8_train.c: FP8 training's amax and current-scaling cast */
tf_status tf_cpu_fp8_amax(tf_device_ctx *ctx, const tf_fp8_amax_args *a);
tf_status tf_cpu_fp8_quantize(tf_device_ctx *ctx, const tf_fp8_quantize_args *a);
tf_status tf_cpu_fp8_history(tf_device_ctx *ctx, const tf_fp8_history_args *a);

/* The table backend.c registers (model_backend.c). */
extern const tf_model_kernels tf_cpu_model_kernels;

#endif
