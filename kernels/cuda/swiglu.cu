/* SwiGLU's gate on the GPU, the twin of kernels/cpu/swiglu.c's swiglu: rows of
 * ab = [a | b] (2f wide) give y = silu(a) b (f wide), computed in f32;
 * backward da = dy b silu'(a), db = dy silu(a), with
 * silu'(a) = s (1 + a (1 - s)), s = sigmoid(a), and y again when asked.
 * One thread per V columns of a row (16-byte vectors when f and the
 * buffers allow). */
#include "cuda_common.cuh"

#include "nn_common.cuh"

typedef struct tf_cuda_swiglu_params {
  const void *ab, *dy;
  void *y, *dab;
  int64_t rows, f;
} tf_cuda_swiglu_params;

/* V columns of one row per thread, a and b read once, in f32: blocks
 * across a row (x) and over rows (y, grid-stride), so a thread finds its
 * row and columns without dividing (64-bit divisions cost as much as the
 * arithmetic here, and kept the kernel under the copy rate). */
template <int DT, int V>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_swiglu_kernel(tf_cuda_swiglu_params p, bool backward) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  tf_chain_next(); /* may be launched chained (the decode step's gate) */
  tf_chain_wait();
  const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= p.f) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const S *ab = (const S *)p.ab + r * 2 * p.f;
    float a[V], b[V];
    tf_cuda_load_row<DT, V>(ab + c, a);
    tf_cuda_load_row<DT, V>(ab + p.f + c, b);
    /* s = sigmoid(a) and silu(a) = a s in both passes, so that the backward
     * pass's y has the forward's bits; the hardware's exp and reciprocal
     * (__expf, __fdividef: a few ulp) where expf and the division took some
     * twenty instructions an element: under the step's power-limited clock
     * that arithmetic, not the memory, held the kernel under the copy
     * rate */
    float s[V], y[V];
#pragma unroll
    for (int u = 0; u < V; u++) {
      s[u] = __fdividef(1.0f, 1.0f + __expf(-a[u]));
      y[u] = a[u] * s[u] * b[u];
    }
    if (!backward) {
      tf_cuda_store_row<DT, V>((S *)p.y + r * p.f + c, y);
      continue;
    }
    float g[V], da[V], db[V];
    tf_cuda_load_row<DT, V>((const S *)p.dy + r * p.f + c, g);
#pragma unroll
    for (int u = 0; u < V; u++) {
      da[u] = g[u] * b[u] * (s[u] * (1.0f + a[u] * (1.0f - s[u])));
      db[u] = g[u] * (a[u] * s[u]);
    }
    S *dab = (S *)p.dab + r * 2 * p.f;
    tf_cuda_store_row<DT, V>(dab + c, da);
    tf_cuda_store_row<DT, V>(dab + p.f + c, db);
    if (p.y) tf_cuda_store_row<DT, V>((S *)p.y + r * p.f + c, y); /* over dy's words, read above */
  }
}

/* One pass at vector width V: f / V threads a row. */
template <int DT, int V>
static tf_status tf_cuda_swiglu_launch(tf_cuda_state *st, const tf_cuda_swiglu_params &p, bool backward, bool chained) {
  return tf_cuda_launch(st, chained, backward ? "swiglu backward kernel" : "swiglu kernel",
                        tf_cuda_rows_grid(st, p.rows, p.f / V), TF_CUDA_THREADS, tf_cuda_swiglu_kernel<DT, V>, p,
                        backward);
}

/* 16-byte vectors when d_ff and every buffer allow, else one element per step. */
template <int DT> static tf_status tf_cuda_swiglu_typed(tf_cuda_state *st, const tf_swiglu_args *a) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  tf_cuda_swiglu_params p;
  p.ab = a->ab;
  p.dy = a->dy;
  p.y = a->y;
  p.dab = a->dab;
  p.rows = a->rows;
  p.f = a->f;
  if (p.rows * p.f == 0) return TF_OK;
  const void *ptrs[4] = {p.ab, p.dy, p.y, p.dab};
  const int vec = tf_cuda_row_vec(sizeof(S), p.f, ptrs, 4);
  /* forward: [a | b] read, y written; backward: [a | b] and dy read, d[a | b] (and y again) written */
  const double rf = (double)p.rows * (double)p.f * (double)sizeof(S);
  tf_cuda_traffic("tf_cuda_swiglu_kernel", a->backward ? rf * (5 + (p.y ? 1 : 0)) : 3 * rf);
  const bool chained = a->chained && !a->backward;
  return vec > 1 ? tf_cuda_swiglu_launch<DT, VW>(st, p, a->backward, chained)
                 : tf_cuda_swiglu_launch<DT, 1>(st, p, a->backward, chained);
}

/* The backend entry of both passes. */
tf_status tf_cuda_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_swiglu_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_swiglu_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_swiglu_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "swiglu: the engine computes in f32, f16 or bf16, not %s", tf_dtype_name(a->dtype));
}
