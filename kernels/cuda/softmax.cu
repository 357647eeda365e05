/* Row softmax on the GPU, one kernel pair for the eager softmax /
 * log_softmax (backend.h) and the engine's causal softmax over attention
 * scores (model_kernels.h): the twin of kernels/cpu/softmax.c. One row group per
 * row (nn_common.cuh). The forward pass keeps a running max and the sum of
 * exp(x - max) in one read of the row (one exp per element), combines the
 * threads' pairs, then writes y in a second read; the backward pass reduces
 * sum(dy * y) (or sum(dy)) and writes dx. Statistics in f32 (f64 for f64).
 * The causal form (CAUSAL) scales the scores first and sees, in row r,
 * only the columns 0..r % seq (query t sees keys up to t): it reads only
 * those and writes zeros past them; it runs in place on the score rows. */
#include "cuda_common.cuh"

#include "opmath.h"
#include "nn_common.cuh"

typedef struct tf_cuda_softmax_params {
  const void *x;  /* forward: x; backward: y */
  const void *dy; /* backward only */
  void *out;      /* y, or dx (may be x or dy: each thread reads its elements before writing them) */
  int64_t rows, cols;
  double scale;   /* CAUSAL: the scores' scale */
  int tpr;
  bool log;
} tf_cuda_softmax_params;

/* The columns row `row` sees: all of them, or 0..t in the causal form. */
template <bool CAUSAL>
__device__ __forceinline__ int64_t tf_cuda_softmax_visible(const tf_cuda_softmax_params &p, int64_t row) {
  return CAUSAL ? row % p.cols + 1 : p.cols;
}

template <int DT, int V, bool CAUSAL>
__global__ void __launch_bounds__(1024) tf_cuda_softmax_forward_kernel(tf_cuda_softmax_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ tf_cuda_pair<C> scratch[32];
  const C scale = (C)p.scale;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, visible = live ? tf_cuda_softmax_visible<CAUSAL>(p, row) : 0;
    const S *x = (const S *)p.x + row * p.cols;
    S *y = (S *)p.out + row * p.cols;
    tf_cuda_pair<C> ms;
    ms.a = (C)-INFINITY;
    ms.b = (C)0;
    for (int64_t c = (int64_t)lane * V; c < visible; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++)
        if (!CAUSAL || c + u < visible) tf_cuda_maxsum_add(ms, CAUSAL ? v[u] * scale : v[u]);
    }
    ms = tf_cuda_group_reduce(ms, p.tpr, tf_cuda_maxsum(), scratch);
    const C m = ms.a, inv = (C)1 / ms.b, lsum = tf_log(ms.b);
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V] = {};
      if (!CAUSAL || c < visible) tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) {
        if (CAUSAL)
          v[u] = c + u < visible ? tf_exp(v[u] * scale - m) * inv : (C)0;
        else
          v[u] = p.log ? (v[u] - m) - lsum : tf_exp(v[u] - m) * inv;
      }
      tf_cuda_store_row<DT, V>(y + c, v);
    }
  });
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy);
 * causal: dx = scale y (dy - sum(dy y)) over the visible columns, zeros after. */
template <int DT, int V, bool CAUSAL>
__global__ void __launch_bounds__(1024) tf_cuda_softmax_backward_kernel(tf_cuda_softmax_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ C scratch[32];
  const C scale = (C)p.scale;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, off = row * p.cols;
    const int64_t visible = live ? tf_cuda_softmax_visible<CAUSAL>(p, row) : 0;
    const S *y = (const S *)p.x + off, *dy = (const S *)p.dy + off;
    S *dx = (S *)p.out + off;
    C dot = 0;
    for (int64_t c = (int64_t)lane * V; c < visible; c += (int64_t)p.tpr * V) {
      C yv[V], gv[V];
      tf_cuda_load_row<DT, V>(dy + c, gv);
      if (!CAUSAL && p.log) {
#pragma unroll
        for (int u = 0; u < V; u++) dot += gv[u];
      } else {
        tf_cuda_load_row<DT, V>(y + c, yv);
#pragma unroll
        for (int u = 0; u < V; u++)
          if (!CAUSAL || c + u < visible) dot += gv[u] * yv[u];
      }
    }
    dot = tf_cuda_group_reduce(dot, p.tpr, tf_cuda_add(), scratch);
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C yv[V] = {}, gv[V] = {};
      if (!CAUSAL || c < visible) {
        tf_cuda_load_row<DT, V>(y + c, yv);
        tf_cuda_load_row<DT, V>(dy + c, gv);
      }
#pragma unroll
      for (int u = 0; u < V; u++) {
        if (CAUSAL)
          yv[u] = c + u < visible ? scale * yv[u] * (gv[u] - dot) : (C)0;
        else
          yv[u] = p.log ? gv[u] - tf_exp(yv[u]) * dot : yv[u] * (gv[u] - dot);
      }
      tf_cuda_store_row<DT, V>(dx + c, yv);
    }
  });
}

/* Picks the vector width (16-byte loads when every row is aligned) and the
 * row geometry (sized for geometry_cols, the columns a row reads on
 * average), then queues the pass. */
template <int DT, bool CAUSAL>
static tf_status tf_cuda_softmax_launch(tf_cuda_state *st, tf_cuda_softmax_params p, bool backward,
                                        int64_t geometry_cols) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  if (p.rows == 0) return TF_OK;
  const void *ptrs[3] = {p.x, p.dy, p.out};
  const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 3);
  const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, geometry_cols, vec);
  p.tpr = g.tpr;
  if (backward) {
    if (vec > 1)
      tf_cuda_softmax_backward_kernel<DT, VW, CAUSAL><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_softmax_backward_kernel<DT, 1, CAUSAL><<<g.blocks, g.threads, 0, st->stream>>>(p);
    return tf_cuda_launched("softmax backward kernel");
  }
  if (vec > 1)
    tf_cuda_softmax_forward_kernel<DT, VW, CAUSAL><<<g.blocks, g.threads, 0, st->stream>>>(p);
  else
    tf_cuda_softmax_forward_kernel<DT, 1, CAUSAL><<<g.blocks, g.threads, 0, st->stream>>>(p);
  return tf_cuda_launched("softmax kernel");
}

/* ---- the eager ops (backend.h) ----------------------------------------------------------- */

template <int DT> static tf_status tf_cuda_softmax_typed(tf_cuda_state *st, const tf_softmax_args *a) {
  tf_cuda_softmax_params p;
  memset(&p, 0, sizeof p);
  p.x = tf_tensor_data(a->x);
  p.dy = a->dy ? tf_tensor_data(a->dy) : NULL;
  p.out = tf_tensor_data(a->out);
  p.rows = a->rows;
  p.cols = a->cols;
  p.scale = 1.0;
  p.log = a->log;
  return tf_cuda_softmax_launch<DT, false>(st, p, a->dy != NULL, p.cols);
}

/* The backend entry: dy says which pass; one kernel per float dtype. */
#define TF_CUDA_SOFTMAX_CASE(DT, unused) \
  case DT: return tf_cuda_softmax_typed<DT>(st, a);

tf_status tf_cuda_softmax(tf_device_ctx *ctx, const tf_softmax_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->x->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_SOFTMAX_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "softmax: the CUDA backend has no kernel for dtype %s", tf_dtype_name(a->x->dtype));
}

/* ---- the engine's causal softmax (model_kernels.h) ---------------------------------------- */

/* In place over (batch seq, seq) score rows: forward s -> p; backward s
 * holds dp and becomes ds, p read beside it. */
template <int DT> static tf_status tf_cuda_causal_typed(tf_cuda_state *st, const tf_causal_softmax_args *a) {
  tf_cuda_softmax_params p;
  memset(&p, 0, sizeof p);
  p.x = a->backward ? a->p : a->s;
  p.dy = a->backward ? a->s : NULL;
  p.out = a->s;
  p.rows = a->batch * a->seq;
  p.cols = a->seq;
  p.scale = (double)(float)a->scale;
  /* The visible scores (t + 1 of row t) read, the whole row written (zeros
   * past t); backward reads dp and p where visible. */
  const double e = (double)sizeof(typename tf_cuda_dtype<DT>::storage), rows = (double)p.rows;
  const double tri = rows * (double)(a->seq + 1) / 2, full = rows * (double)a->seq;
  if (p.rows > 0)
    tf_cuda_traffic(a->backward ? "tf_cuda_softmax_backward_kernel" : "tf_cuda_softmax_forward_kernel",
                    (a->backward ? 2 * tri + full : tri + full) * e);
  /* Rows average half their length visible: size groups for that. */
  return tf_cuda_softmax_launch<DT, true>(st, p, a->backward, (a->seq + 1) / 2);
}

/* The backend entry of both passes. */
tf_status tf_cuda_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_causal_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_causal_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_causal_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "causal_softmax: the engine computes in f32, f16 or bf16, not %s",
                 tf_dtype_name(a->dtype));
}
