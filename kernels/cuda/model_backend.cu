/* The Transformer engine's kernel table for the CUDA backend
 * (model_kernels.h), registered by backend.cu. */
#include "cuda_common.cuh"

/* Filled by name (no designated initialisers in C++17). */
static tf_model_kernels tf_cuda_make_model_table(void) {
  tf_model_kernels k;
  memset(&k, 0, sizeof k);
  k.gemm = tf_cuda_gemm;
  k.index_check = tf_cuda_index_check;
  k.encoder = tf_cuda_encoder;
  k.rmsnorm = tf_cuda_rmsnorm;
  k.swiglu = tf_cuda_swiglu;
  k.rope_heads = tf_cuda_rope_heads;
  k.heads = tf_cuda_heads;
  k.causal_softmax = tf_cuda_causal_softmax;
  k.lm_loss = tf_cuda_lm_loss;
  k.gemm_use_lt = tf_cuda_gemm_use_lt;
  k.gemm_tuning = tf_cuda_gemm_tuning;
  k.traffic = tf_cuda_traffic_count;
  k.encoder_workspace = tf_cuda_encoder_workspace;
  k.rmsnorm_workspace = tf_cuda_rmsnorm_workspace;
  k.capture_begin = tf_cuda_capture_begin;
  k.capture_end = tf_cuda_capture_end;
  k.graph_launch = tf_cuda_graph_launch;
  k.graph_destroy = tf_cuda_graph_destroy;
  k.adamw_constants = tf_cuda_adamw_constants;
  k.adamw = tf_cuda_model_adamw;
  k.grad_norm = tf_cuda_grad_norm;
  k.kv_append = tf_cuda_kv_append;
  k.decode_attention = tf_cuda_decode_attention;
  k.fp8_amax = tf_cuda_fp8_amax;
  k.fp8_quantize = tf_cuda_fp8_quantize;
  k.fp8_history = tf_cuda_fp8_history;
  k.side_enter = tf_cuda_side_enter;
  k.side_leave = tf_cuda_side_leave;
  k.side_join = tf_cuda_side_join;
  k.side_mark = tf_cuda_side_mark;
  k.main_wait = tf_cuda_main_wait;
  return k;
}

/* Built once (thread-safe static initialisation). */
const tf_model_kernels *tf_cuda_model_kernels(void) {
  static const tf_model_kernels table = tf_cuda_make_model_table();
  return &table;
}
