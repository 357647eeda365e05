/* softmax / log_softmax over the last dim, and their backward passes, on
 * the GPU: the twin of cpu_norm.c's softmax. One row group per row
 * (nn_common.cuh). The forward pass keeps a running max and the sum of
 * exp(x - max) in one read of the row (one exp per element), combines the
 * threads' pairs, then writes y in a second read; the backward pass reduces
 * sum(dy * y) (or sum(dy)) and writes dx. Statistics in f32 (f64 for f64). */
#include "cuda_common.cuh"

#include "opmath.h"
#include "nn_common.cuh"

typedef struct tf_cuda_softmax_params {
  const void *x;  /* forward: x; backward: y */
  const void *dy; /* backward only */
  void *out;
  int64_t rows, cols;
  int tpr;
  bool log;
} tf_cuda_softmax_params;

template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_softmax_forward_kernel(tf_cuda_softmax_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ tf_cuda_pair<C> scratch[32];
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0;
    const S *x = (const S *)p.x + row * p.cols;
    S *y = (S *)p.out + row * p.cols;
    tf_cuda_pair<C> ms;
    ms.a = (C)-INFINITY;
    ms.b = (C)0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) tf_cuda_maxsum_add(ms, v[u]);
    }
    ms = tf_cuda_group_reduce(ms, p.tpr, tf_cuda_maxsum(), scratch);
    const C m = ms.a, inv = (C)1 / ms.b, lsum = tf_log(ms.b);
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] = p.log ? (v[u] - m) - lsum : tf_exp(v[u] - m) * inv;
      tf_cuda_store_row<DT, V>(y + c, v);
    }
  });
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy). */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_softmax_backward_kernel(tf_cuda_softmax_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ C scratch[32];
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, off = row * p.cols;
    const S *y = (const S *)p.x + off, *dy = (const S *)p.dy + off;
    S *dx = (S *)p.out + off;
    C dot = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C yv[V], gv[V];
      tf_cuda_load_row<DT, V>(dy + c, gv);
      if (p.log) {
#pragma unroll
        for (int u = 0; u < V; u++) dot += gv[u];
      } else {
        tf_cuda_load_row<DT, V>(y + c, yv);
#pragma unroll
        for (int u = 0; u < V; u++) dot += gv[u] * yv[u];
      }
    }
    dot = tf_cuda_group_reduce(dot, p.tpr, tf_cuda_add(), scratch);
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C yv[V], gv[V];
      tf_cuda_load_row<DT, V>(y + c, yv);
      tf_cuda_load_row<DT, V>(dy + c, gv);
#pragma unroll
      for (int u = 0; u < V; u++) yv[u] = p.log ? gv[u] - tf_exp(yv[u]) * dot : yv[u] * (gv[u] - dot);
      tf_cuda_store_row<DT, V>(dx + c, yv);
    }
  });
}

/* Picks the vector width (16-byte loads when every row is aligned) and the
 * row geometry, then queues the pass. */
template <int DT>
static tf_status tf_cuda_softmax_typed(tf_cuda_state *st, const tf_softmax_args *a) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  tf_cuda_softmax_params p;
  p.x = tf_tensor_data(a->x);
  p.dy = a->dy ? tf_tensor_data(a->dy) : NULL;
  p.out = tf_tensor_data(a->out);
  p.rows = a->rows;
  p.cols = a->cols;
  p.log = a->log;
  const void *ptrs[3] = {p.x, p.dy, p.out};
  const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 3);
  const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
  p.tpr = g.tpr;
  if (a->dy) {
    if (vec > 1)
      tf_cuda_softmax_backward_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_softmax_backward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
    return tf_cuda_launched("softmax backward kernel");
  }
  if (vec > 1)
    tf_cuda_softmax_forward_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
  else
    tf_cuda_softmax_forward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
  return tf_cuda_launched("softmax kernel");
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
