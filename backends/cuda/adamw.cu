/* One AdamW step on the GPU, in place: the twin of cpu_nn.c's adamw. The
 * step-dependent constants come from the dispatcher (worked out in double)
 * and are rounded once to the parameters' dtype; each element is then
 * updated in f32 (f64 for f64 parameters), the gradient read in its own
 * dtype. */
#include "cuda_common.cuh"

template <typename P> struct tf_cuda_adamw_params {
  P *p, *m, *v;
  const void *g;
  int64_t n;
  void *low; /* the first n_low elements of the new p, rounded to bf16 (low_bf16) or f16; f32 p only */
  int64_t n_low;
  bool low_bf16;
  P decay, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, bias2_sqrt, eps;
};

/* p = p decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * p -= step_size m / (sqrt(v) / bias2_sqrt + eps); the low-precision copy
 * of p's prefix by the rounding of the conversion kernels. */
template <typename P, int GDT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_adamw_kernel(tf_cuda_adamw_params<P> a) {
  typedef tf_cuda_dtype<GDT> G;
  const typename G::storage *g = (const typename G::storage *)a.g;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
    const P gv = (P)G::load(g[i]);
    const P m = a.beta1 * a.m[i] + a.one_minus_beta1 * gv;
    const P v = a.beta2 * a.v[i] + a.one_minus_beta2 * gv * gv;
    P p = a.p[i] * a.decay;
    p -= a.step_size * m / (sqrt(v) / a.bias2_sqrt + a.eps);
    a.p[i] = p;
    if (i < a.n_low) {
      uint16_t *low = (uint16_t *)a.low;
      low[i] = a.low_bf16 ? tf_f32_to_bf16((float)p) : tf_f32_to_f16((float)p);
    }
    a.m[i] = m;
    a.v[i] = v;
  }
}

/* Rounds the constants to P once, on the host (as the CPU's double ones are
 * rounded by its stores), and queues the kernel for g's dtype. */
template <typename P>
static tf_status tf_cuda_adamw_typed(tf_cuda_state *st, const tf_adamw_update *u) {
  tf_cuda_adamw_params<P> a;
  a.p = (P *)tf_tensor_data(u->p);
  a.m = (P *)tf_tensor_data(u->m);
  a.v = (P *)tf_tensor_data(u->v);
  a.g = tf_tensor_data(u->g);
  a.n = tf_tensor_numel(u->p);
  a.low = u->low ? tf_tensor_data(u->low) : NULL;
  a.n_low = u->low ? tf_tensor_numel(u->low) : 0;
  a.low_bf16 = u->low && u->low->dtype == TF_BF16;
  a.decay = (P)u->decay;
  a.beta1 = (P)u->beta1;
  a.beta2 = (P)u->beta2;
  a.one_minus_beta1 = (P)(1.0 - u->beta1);
  a.one_minus_beta2 = (P)(1.0 - u->beta2);
  a.step_size = (P)u->step_size;
  a.bias2_sqrt = (P)u->bias2_sqrt;
  a.eps = (P)u->eps;
  const unsigned blocks = tf_cuda_blocks(st, a.n);
  switch (u->g->dtype) {
    case TF_F32: tf_cuda_adamw_kernel<P, TF_F32><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(a); break;
    case TF_F16: tf_cuda_adamw_kernel<P, TF_F16><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(a); break;
    case TF_BF16: tf_cuda_adamw_kernel<P, TF_BF16><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(a); break;
    case TF_F64: tf_cuda_adamw_kernel<P, TF_F64><<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(a); break;
    default:
      return tf_fail(TF_ERR_ARG, "adamw_step: the CUDA backend has no kernel for a %s gradient",
                     tf_dtype_name(u->g->dtype));
  }
  return tf_cuda_launched("adamw kernel");
}

/* The backend entry: f32 or f64 parameters, the gradient's dtype picked inside. */
tf_status tf_cuda_adamw(tf_device_ctx *ctx, const tf_adamw_update *u) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (u->p->dtype == TF_F32) return tf_cuda_adamw_typed<float>(st, u);
  if (u->p->dtype == TF_F64) return tf_cuda_adamw_typed<double>(st, u);
  return tf_fail(TF_ERR_ARG, "adamw_step: the CUDA backend updates f32 or f64 parameters, not %s",
                 tf_dtype_name(u->p->dtype));
}
