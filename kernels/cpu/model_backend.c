/* The Transformer engine's kernel table for the CPU backend
 * (model_kernels.h), the twin of kernels/cuda/model_backend.cu. The kernels
 * it names live with their families, one file each (norm.c, softmax.c,
 * rope.c, cross_entropy.c, embedding.c, gemm.c, swiglu.c, fp8_train.c), shared with the
 * eager ops. */
#include "cpu.h"
#include "cpu_model.h"

const tf_model_kernels tf_cpu_model_kernels = {
    .gemm = tf_cpu_gemm,
    .index_check = tf_cpu_index_check,
    .encoder = tf_cpu_encoder,
    .rmsnorm = tf_cpu_rmsnorm,
    .swiglu = tf_cpu_swiglu,
    .rope_heads = tf_cpu_rope_heads,
    .heads = tf_cpu_heads,
    .causal_softmax = tf_cpu_causal_softmax,
    .lm_loss = tf_cpu_lm_loss,
    .adamw_constants = tf_cpu_model_adamw_constants,
    .adamw = tf_cpu_model_adamw,
    .grad_norm = tf_cpu_grad_norm,
    .kv_append = tf_cpu_kv_append,
    .decode_attention = tf_cpu_decode_attention,
    .fp8_amax = tf_cpu_fp8_amax,
    .fp8_quantize = tf_cpu_fp8_quantize,
    .fp8_history = tf_cpu_fp8_history,
    .gemm_use_lt = NULL,
};
