/* One AdamW step on the GPU, in place: the twin of kernels/cpu/adamw.c. The
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
  P c[TF_ADAMW_CONSTS]; /* the step's constants, by enum tf_adamw_const */
  const P *consts;      /* or NULL: c from device memory instead */
  bool zero_g;     /* write zeros over g after reading it (f32 g only) */
  const float *grad_scale; /* or NULL: each gradient times grad_scale[TF_GRAD_SCALE] first (clipping) */
};

/* Correctly rounded operations, none fused, so that every kernel below
 * gives the same bits for an element (the compiler would contract
 * multiply-adds differently in each). */
template <typename P> struct tf_cuda_adamw_ops;
template <> struct tf_cuda_adamw_ops<float> {
  static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
  static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
  static __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
  static __device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
};
template <> struct tf_cuda_adamw_ops<double> {
  static __device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
  static __device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
  static __device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
  static __device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
  static __device__ __forceinline__ double sqrt(double a) { return __dsqrt_rn(a); }
};

/* One element: p = p decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
 * p -= step_size m / (sqrt(v) / bias2_sqrt + eps). */
template <typename P>
__device__ __forceinline__ void tf_cuda_adamw_one(const tf_cuda_adamw_params<P> &a, P gv, P &p, P &m, P &v) {
  typedef tf_cuda_adamw_ops<P> O;
  const P *c = a.c;
  m = O::add(O::mul(c[TF_ADAMW_BETA1], m), O::mul(c[TF_ADAMW_ONE_MINUS_BETA1], gv));
  v = O::add(O::mul(c[TF_ADAMW_BETA2], v), O::mul(O::mul(c[TF_ADAMW_ONE_MINUS_BETA2], gv), gv));
  p = O::mul(p, c[TF_ADAMW_DECAY]);
  p = O::sub(p, O::div(O::mul(c[TF_ADAMW_STEP_SIZE], m),
                       O::add(O::div(O::sqrt(v), c[TF_ADAMW_BIAS2_SQRT]), c[TF_ADAMW_EPS])));
}

/* The constants from device memory, when a.consts gives them. */
template <typename P> __device__ __forceinline__ void tf_cuda_adamw_load(tf_cuda_adamw_params<P> &a) {
  if (!a.consts) return;
  for (int k = 0; k < TF_ADAMW_CONSTS; k++) a.c[k] = a.consts[k];
}

/* The clipping factor grad_norm wrote, or 1 (not applied) without one. */
template <typename P> __device__ __forceinline__ float tf_cuda_adamw_scale(const tf_cuda_adamw_params<P> &a) {
  return a.grad_scale ? a.grad_scale[TF_GRAD_SCALE] : 1.f;
}

/* A gradient clipped as CS336's gradient_clipping scales it in place (one f32 product). */
__device__ __forceinline__ float tf_cuda_clipped(const float *grad_scale, float s, float g) {
  return grad_scale ? __fmul_rn(g, s) : g;
}

/* An element of the low-precision copy, rounded as the conversion kernels round. */
template <typename P> __device__ __forceinline__ uint16_t tf_cuda_adamw_low(const tf_cuda_adamw_params<P> &a, P p) {
  return a.low_bf16 ? tf_cuda_dtype<TF_BF16>::store((float)p) : tf_cuda_dtype<TF_F16>::store((float)p);
}

/* The update of every element; the low-precision copy of p's prefix by
 * the rounding of the conversion kernels. */
template <typename P, int GDT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_adamw_kernel(tf_cuda_adamw_params<P> a) {
  typedef tf_cuda_dtype<GDT> G;
  const typename G::storage *g = (const typename G::storage *)a.g;
  tf_cuda_adamw_load(a);
  const float s = tf_cuda_adamw_scale(a);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
    P p = a.p[i], m = a.m[i], v = a.v[i];
    const P gv = GDT == TF_F32 ? (P)tf_cuda_clipped(a.grad_scale, s, (float)G::load(g[i])) : (P)G::load(g[i]);
    tf_cuda_adamw_one<P>(a, gv, p, m, v);
    a.p[i] = p;
    if (i < a.n_low) ((uint16_t *)a.low)[i] = tf_cuda_adamw_low(a, p);
    a.m[i] = m;
    a.v[i] = v;
    if (a.zero_g && GDT == TF_F32) ((float *)a.g)[i] = 0.f;
  }
}

/* The constants rounded to P once, on the host (as the CPU's double ones
 * are rounded by its stores). */
template <typename P> static void tf_cuda_adamw_round(const tf_adamw_update *u, P *c) {
  c[TF_ADAMW_DECAY] = (P)u->decay;
  c[TF_ADAMW_BETA1] = (P)u->beta1;
  c[TF_ADAMW_BETA2] = (P)u->beta2;
  c[TF_ADAMW_ONE_MINUS_BETA1] = (P)(1.0 - u->beta1);
  c[TF_ADAMW_ONE_MINUS_BETA2] = (P)(1.0 - u->beta2);
  c[TF_ADAMW_STEP_SIZE] = (P)u->step_size;
  c[TF_ADAMW_BIAS2_SQRT] = (P)u->bias2_sqrt;
  c[TF_ADAMW_EPS] = (P)u->eps;
}

/* Queues the kernel for g's dtype. */
template <typename P>
static tf_status tf_cuda_adamw_typed(tf_cuda_state *st, const tf_adamw_update *u) {
  tf_cuda_adamw_params<P> a;
  a.consts = NULL;
  a.zero_g = false;
  a.grad_scale = NULL;
  a.p = (P *)tf_tensor_data(u->p);
  a.m = (P *)tf_tensor_data(u->m);
  a.v = (P *)tf_tensor_data(u->v);
  a.g = tf_tensor_data(u->g);
  a.n = tf_tensor_numel(u->p);
  a.low = u->low ? tf_tensor_data(u->low) : NULL;
  a.n_low = u->low ? tf_tensor_numel(u->low) : 0;
  a.low_bf16 = u->low && u->low->dtype == TF_BF16;
  tf_cuda_adamw_round<P>(u, a.c);
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
  /* the engine's separate step (and tf.optim's) comes here: p, m, v read and
   * written, g read, the low copy written */
  tf_cuda_traffic("tf_cuda_adamw_kernel", (double)a.n * (6.0 * sizeof(P) + (double)tf_dtype_size(u->g->dtype)) +
                                              (double)a.n_low * (u->low ? (double)tf_dtype_size(u->low->dtype) : 0));
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

/* ---- the engine's AdamW beside its backward pass (model_kernels.h) -------------------------- */

struct tf_cuda_adamw_consts {
  float v[TF_ADAMW_CONSTS];
};

__global__ void tf_cuda_adamw_consts_kernel(float *dst, tf_cuda_adamw_consts c) {
  if (threadIdx.x < TF_ADAMW_CONSTS) dst[threadIdx.x] = c.v[threadIdx.x];
}

/* One small kernel writes them (ordered on the stream, nothing waits), and
 * the side stream is made now, outside any capture. */
tf_status tf_cuda_adamw_constants(tf_device_ctx *ctx, float *consts, const tf_adamw_update *u) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  TF_TRY(tf_cuda_side_ready(st));
  tf_cuda_adamw_consts c;
  tf_cuda_adamw_round<float>(u, c.v);
  tf_cuda_adamw_consts_kernel<<<1, 32, 0, st->stream>>>(consts, c);
  return tf_cuda_launched("adamw constants kernel");
}

/* The engine's update, 4 elements per thread in 16-byte words (p, m, v, g
 * 16-byte aligned), the tail one by one; the bits of tf_cuda_adamw_kernel. */
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_adamw4_kernel(tf_cuda_adamw_params<float> a) {
  tf_cuda_adamw_load(a);
  const float s = tf_cuda_adamw_scale(a);
  const float *g = (const float *)a.g;
  uint16_t *low = (uint16_t *)a.low;
  const int64_t words = a.n / 4, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride) {
    float4 p = ((const float4 *)a.p)[w], m = ((const float4 *)a.m)[w], v = ((const float4 *)a.v)[w];
    const float4 gv = ((const float4 *)g)[w];
    tf_cuda_adamw_one<float>(a, tf_cuda_clipped(a.grad_scale, s, gv.x), p.x, m.x, v.x);
    tf_cuda_adamw_one<float>(a, tf_cuda_clipped(a.grad_scale, s, gv.y), p.y, m.y, v.y);
    tf_cuda_adamw_one<float>(a, tf_cuda_clipped(a.grad_scale, s, gv.z), p.z, m.z, v.z);
    tf_cuda_adamw_one<float>(a, tf_cuda_clipped(a.grad_scale, s, gv.w), p.w, m.w, v.w);
    ((float4 *)a.p)[w] = p;
    ((float4 *)a.m)[w] = m;
    ((float4 *)a.v)[w] = v;
    if (a.zero_g) ((float4 *)a.g)[w] = make_float4(0.f, 0.f, 0.f, 0.f);
    const int64_t i = 4 * w;
    if (i + 3 < a.n_low) {
      *(ushort4 *)(low + i) = make_ushort4(tf_cuda_adamw_low(a, p.x), tf_cuda_adamw_low(a, p.y),
                                           tf_cuda_adamw_low(a, p.z), tf_cuda_adamw_low(a, p.w));
    } else if (i < a.n_low) {
      const float ps[4] = {p.x, p.y, p.z, p.w};
      for (int u = 0; u < 4 && i + u < a.n_low; u++) low[i + u] = tf_cuda_adamw_low(a, ps[u]);
    }
  }
  for (int64_t i = 4 * words + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    float p = a.p[i], m = a.m[i], v = a.v[i];
    tf_cuda_adamw_one<float>(a, tf_cuda_clipped(a.grad_scale, s, g[i]), p, m, v);
    a.p[i] = p;
    a.m[i] = m;
    a.v[i] = v;
    if (a.zero_g) ((float *)a.g)[i] = 0.f;
    if (i < a.n_low) low[i] = tf_cuda_adamw_low(a, p);
  }
}

/* One word per thread (the last block's threads past the words left
 * idle; the first threads also take the tail): short blocks, which
 * the scheduler hands back to the backward pass's kernels beside them (a
 * grid capped at the resident blocks held every SM for the whole update)
 * and which also run the update alone faster. */
static unsigned tf_cuda_adamw4_blocks(int64_t n) {
  return (unsigned)((n / 4 + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS + 1);
}

static bool tf_cuda_adamw_aligned(const void *ptr, size_t bytes) { return ((uintptr_t)ptr & (bytes - 1)) == 0; }

/* The f32-gradient kernel of tf_cuda_adamw, its constants from consts (in
 * 16-byte words where the buffers allow). */
tf_status tf_cuda_model_adamw(tf_device_ctx *ctx, const tf_model_adamw_args *m) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (m->n == 0) return TF_OK;
  tf_cuda_adamw_params<float> a;
  memset(&a, 0, sizeof a);
  a.p = m->p;
  a.m = m->m;
  a.v = m->v;
  a.g = m->g;
  a.n = m->n;
  a.low = m->low;
  a.n_low = m->low ? m->n_low : 0;
  a.low_bf16 = m->low_dtype == TF_BF16;
  a.consts = m->consts;
  a.zero_g = m->zero_g;
  a.grad_scale = m->grad_scale;
  /* p, g, m and v read; p, m and v written; the low copy written; g zeroed where asked */
  const double bytes = 28.0 * (double)a.n + (a.zero_g ? 4.0 * (double)a.n : 0) +
                       (double)a.n_low * (double)tf_dtype_size(m->low_dtype);
  if (tf_cuda_adamw_aligned(a.p, 16) && tf_cuda_adamw_aligned(a.m, 16) && tf_cuda_adamw_aligned(a.v, 16) &&
      tf_cuda_adamw_aligned(a.g, 16) && (!a.low || tf_cuda_adamw_aligned(a.low, 8))) {
    tf_cuda_adamw4_kernel<<<tf_cuda_adamw4_blocks(a.n), TF_CUDA_THREADS, 0, st->stream>>>(a);
    tf_cuda_traffic("tf_cuda_adamw4_kernel", bytes);
  } else {
    tf_cuda_adamw_kernel<float, TF_F32><<<tf_cuda_blocks(st, a.n), TF_CUDA_THREADS, 0, st->stream>>>(a);
    tf_cuda_traffic("tf_cuda_adamw_kernel", bytes);
  }
  return tf_cuda_launched("adamw kernel");
}

/* ---- global gradient-norm clipping (model_kernels.h's tf_grad_norm_args) ----------------------- */

/* The halving tree over a block's TF_GRAD_NORM_THREADS sums (x[t] += x[t + s]): the order the CPU
 * twin repeats. */
__device__ __forceinline__ double tf_cuda_grad_norm_tree(double *x) {
  const int t = threadIdx.x;
  for (int s = TF_GRAD_NORM_THREADS / 2; s > 0; s /= 2) {
    __syncthreads();
    if (t < s) x[t] = __dadd_rn(x[t], x[t + s]);
  }
  __syncthreads();
  return x[0];
}

/* Block b's sum of squares into partial[b]; each product of two floats is exact in double. */
__global__ void __launch_bounds__(TF_GRAD_NORM_THREADS) tf_cuda_grad_norm_partial(const float *g, int64_t n,
                                                                                 double *partial) {
  __shared__ double x[TF_GRAD_NORM_THREADS];
  const int64_t stride = (int64_t)TF_GRAD_NORM_BLOCKS * TF_GRAD_NORM_THREADS;
  double acc = 0;
  for (int64_t i = (int64_t)blockIdx.x * TF_GRAD_NORM_THREADS + threadIdx.x; i < n; i += stride) {
    const double v = g[i];
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  x[threadIdx.x] = acc;
  const double sum = tf_cuda_grad_norm_tree(x);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

/* The partials in the same order, then the norm and the clipping factor. */
__global__ void __launch_bounds__(TF_GRAD_NORM_THREADS) tf_cuda_grad_norm_final(const double *partial,
                                                                               double max_norm, float *out) {
  __shared__ double x[TF_GRAD_NORM_THREADS];
  double acc = 0;
  for (int b = threadIdx.x; b < TF_GRAD_NORM_BLOCKS; b += TF_GRAD_NORM_THREADS) acc = __dadd_rn(acc, partial[b]);
  x[threadIdx.x] = acc;
  const double sum = tf_cuda_grad_norm_tree(x);
  if (threadIdx.x == 0) {
    const double norm = __dsqrt_rn(sum);
    out[TF_GRAD_NORM] = (float)norm;
    out[TF_GRAD_SCALE] = norm > max_norm ? (float)__ddiv_rn(max_norm, __dadd_rn(norm, 1e-6)) : 1.f;
  }
}

/* Two kernels on the stream, nothing waits: the step's AdamW reads out after them. */
tf_status tf_cuda_grad_norm(tf_device_ctx *ctx, const tf_grad_norm_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_cuda_grad_norm_partial<<<TF_GRAD_NORM_BLOCKS, TF_GRAD_NORM_THREADS, 0, st->stream>>>(a->g, a->n, a->partial);
  TF_TRY(tf_cuda_launched("gradient norm kernel (partial sums)"));
  tf_cuda_traffic("tf_cuda_grad_norm_partial", 4.0 * (double)a->n);
  tf_cuda_grad_norm_final<<<1, TF_GRAD_NORM_THREADS, 0, st->stream>>>(a->partial, a->max_norm, a->out);
  return tf_cuda_launched("gradient norm kernel (final)");
}
