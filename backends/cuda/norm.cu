/* layer_norm and rms_norm over the last dim, forward and backward, on the
 * GPU: the twin of cpu_norm.c. One row group per row (nn_common.cuh);
 * statistics in f32 (f64 for f64) from passes over the row (re-reads hit
 * L1/L2): layer_norm takes the mean, then the biased variance around it
 * (no cancellation, unlike sum and sum of squares); rms_norm the mean of
 * squares. Weights come in the statistics dtype. The weight gradients are
 * column sums over rows: blocks of columns times splits of the rows write
 * partial sums, and a second pass adds the splits in order, so the result
 * has the same bits every run (no atomics). */
#include "cuda_common.cuh"

#include "opmath.h"
#include "nn_common.cuh"

typedef struct tf_cuda_norm_params {
  const void *x, *dy;
  const void *w, *b; /* statistics dtype, or NULL */
  void *y, *dx;
  void *mean, *rstd; /* statistics dtype: written forward (unless NULL), read backward */
  int64_t rows, cols;
  double eps;
  int tpr;
  bool layer;
} tf_cuda_norm_params;

/* V weights at c, or `absent` when there is no weight vector. */
template <typename C, int V>
__device__ __forceinline__ void tf_cuda_norm_weights(const void *w, int64_t c, C absent, C (&out)[V]) {
  if (w) {
    tf_cuda_load_n<C, V>((const C *)w + c, out);
  } else {
#pragma unroll
    for (int u = 0; u < V; u++) out[u] = absent;
  }
}

/* layer_norm: y = (x - mean) rstd w + b; rms_norm: y = (x rstd) g. */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_norm_forward_kernel(tf_cuda_norm_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ C scratch[32];
  const C inv_cols = (C)1 / (C)p.cols;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, off = row * p.cols;
    const S *x = (const S *)p.x + off;
    S *y = (S *)p.y + off;
    C mean = 0;
    if (p.layer) {
      C sum = 0;
      for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
        C v[V];
        tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
        for (int u = 0; u < V; u++) sum += v[u];
      }
      mean = tf_cuda_group_reduce(sum, p.tpr, tf_cuda_add(), scratch) * inv_cols;
    }
    C sq = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) sq += (v[u] - mean) * (v[u] - mean);
    }
    sq = tf_cuda_group_reduce(sq, p.tpr, tf_cuda_add(), scratch);
    const C rstd = (C)1 / tf_sqrt(sq * inv_cols + (C)p.eps);
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V], w[V], b[V];
      tf_cuda_load_row<DT, V>(x + c, v);
      tf_cuda_norm_weights<C, V>(p.w, c, (C)1, w);
      if (p.layer) {
        tf_cuda_norm_weights<C, V>(p.b, c, (C)0, b);
#pragma unroll
        for (int u = 0; u < V; u++) v[u] = (v[u] - mean) * rstd * w[u] + b[u];
      } else {
#pragma unroll
        for (int u = 0; u < V; u++) v[u] = (v[u] * rstd) * w[u];
      }
      tf_cuda_store_row<DT, V>(y + c, v);
    }
    if (live && lane == 0) {
      if (p.mean) ((C *)p.mean)[row] = mean;
      if (p.rstd) ((C *)p.rstd)[row] = rstd;
    }
  });
}

/* With g = dy w and xhat = (x - mean) rstd (rms: x rstd):
 * dx = rstd (g - mean(g) - xhat mean(g xhat)), without the mean(g) term for rms. */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_norm_backward_kernel(tf_cuda_norm_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ tf_cuda_pair<C> scratch[32];
  const C inv_cols = (C)1 / (C)p.cols;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, off = row * p.cols;
    const S *x = (const S *)p.x + off, *dy = (const S *)p.dy + off;
    S *dx = (S *)p.dx + off;
    const C mean = p.layer ? ((const C *)p.mean)[row] : (C)0, rstd = ((const C *)p.rstd)[row];
    tf_cuda_pair<C> sums;
    sums.a = 0;
    sums.b = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V], g[V], w[V];
      tf_cuda_load_row<DT, V>(x + c, v);
      tf_cuda_load_row<DT, V>(dy + c, g);
      tf_cuda_norm_weights<C, V>(p.w, c, (C)1, w);
#pragma unroll
      for (int u = 0; u < V; u++) {
        C gw = g[u] * w[u];
        sums.a += gw;
        sums.b += gw * ((v[u] - mean) * rstd);
      }
    }
    sums = tf_cuda_group_reduce(sums, p.tpr, tf_cuda_add(), scratch);
    const C mg = p.layer ? sums.a * inv_cols : (C)0, mgx = sums.b * inv_cols;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V], g[V], w[V];
      tf_cuda_load_row<DT, V>(x + c, v);
      tf_cuda_load_row<DT, V>(dy + c, g);
      tf_cuda_norm_weights<C, V>(p.w, c, (C)1, w);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] = rstd * (g[u] * w[u] - mg - ((v[u] - mean) * rstd) * mgx);
      tf_cuda_store_row<DT, V>(dx + c, v);
    }
  });
}

enum { TF_CUDA_WGRAD_THREADS = 256 };

/* Partial column sums over rows [split * chunk, +chunk): dy xhat into pw,
 * dy into pb (either may be NULL), at pw[split * cols + col]. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_WGRAD_THREADS)
    tf_cuda_norm_wgrad_kernel(tf_cuda_norm_params p, void *pw, void *pb, int64_t chunk) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= p.cols) return;
  const int64_t r0 = (int64_t)blockIdx.y * chunk;
  const int64_t r1 = r0 + chunk < p.rows ? r0 + chunk : p.rows;
  const S *x = (const S *)p.x, *dy = (const S *)p.dy;
  const C *meanp = (const C *)p.mean, *rstdp = (const C *)p.rstd;
  C aw = 0, ab = 0;
#pragma unroll 4
  for (int64_t r = r0; r < r1; r++) {
    const int64_t at = r * p.cols + col;
    const C g = D::load(dy[at]);
    const C mean = p.layer ? meanp[r] : (C)0;
    aw += g * ((D::load(x[at]) - mean) * rstdp[r]);
    ab += g;
  }
  const int64_t out = (int64_t)blockIdx.y * p.cols + col;
  if (pw) ((C *)pw)[out] = aw;
  if (pb) ((C *)pb)[out] = ab;
}

/* Adds the splits' partial sums of each column, split 0 first. */
template <typename C>
__global__ void __launch_bounds__(TF_CUDA_WGRAD_THREADS)
    tf_cuda_norm_wgrad_finish_kernel(const C *pw, const C *pb, C *dw, C *db, int64_t cols, int64_t splits) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  C aw = 0, ab = 0;
  for (int64_t s = 0; s < splits; s++) {
    if (dw) aw += pw[s * cols + col];
    if (db) ab += pb[s * cols + col];
  }
  if (dw) dw[col] = aw;
  if (db) db[col] = ab;
}

/* dw and db: one pass straight into them when the column blocks fill the
 * GPU, else split rows into a workspace and add the splits. */
template <int DT>
static tf_status tf_cuda_norm_wgrad(tf_device_ctx *ctx, tf_cuda_state *st, const tf_cuda_norm_params &p, void *dw,
                                    void *db) {
  typedef typename tf_cuda_dtype<DT>::compute C;
  const int64_t col_blocks = (p.cols + TF_CUDA_WGRAD_THREADS - 1) / TF_CUDA_WGRAD_THREADS;
  const int64_t want = ((int64_t)st->multiprocessors * 8 + col_blocks - 1) / col_blocks;
  const int64_t most = (p.rows + 31) / 32; /* at least 32 rows per split */
  int64_t splits = want < most ? want : most;
  if (splits < 1) splits = 1;
  const int64_t chunk = (p.rows + splits - 1) / splits;
  splits = (p.rows + chunk - 1) / chunk;
  if (splits == 1) {
    dim3 grid((unsigned)col_blocks, 1);
    tf_cuda_norm_wgrad_kernel<DT><<<grid, TF_CUDA_WGRAD_THREADS, 0, st->stream>>>(p, dw, db, chunk);
    return tf_cuda_launched("norm weight-gradient kernel");
  }
  tf_block *work = NULL;
  const size_t half = (size_t)(splits * p.cols) * sizeof(C);
  TF_TRY(tf_alloc(&ctx->alloc, half * 2, &work));
  C *pw = (C *)work->ptr, *pb = (C *)((char *)work->ptr + half);
  dim3 grid((unsigned)col_blocks, (unsigned)splits);
  tf_cuda_norm_wgrad_kernel<DT><<<grid, TF_CUDA_WGRAD_THREADS, 0, st->stream>>>(p, dw ? pw : NULL, db ? pb : NULL,
                                                                               chunk);
  tf_status s = tf_cuda_launched("norm weight-gradient kernel");
  if (s == TF_OK) {
    tf_cuda_norm_wgrad_finish_kernel<C><<<(unsigned)col_blocks, TF_CUDA_WGRAD_THREADS, 0, st->stream>>>(
        pw, pb, (C *)dw, (C *)db, p.cols, splits);
    s = tf_cuda_launched("norm weight-gradient sum kernel");
  }
  /* Safe before the kernels finish: the block's next user queues behind them. */
  tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* Forward: one row kernel. Backward: the dx row kernel (when asked) and the
 * weight-gradient column sums (when asked). */
template <int DT>
static tf_status tf_cuda_norm_typed(tf_device_ctx *ctx, tf_cuda_state *st, const tf_norm_args *a) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  tf_cuda_norm_params p;
  memset(&p, 0, sizeof p);
  p.x = tf_tensor_data(a->x);
  p.w = a->w ? tf_tensor_data(a->w) : NULL;
  p.b = a->b ? tf_tensor_data(a->b) : NULL;
  p.mean = a->mean ? tf_tensor_data(a->mean) : NULL;
  p.rstd = a->rstd ? tf_tensor_data(a->rstd) : NULL;
  p.rows = a->rows;
  p.cols = a->cols;
  p.eps = a->eps;
  p.layer = a->kind == TF_NORM_LAYER;
  if (!a->backward) {
    p.y = tf_tensor_data(a->y);
    const void *ptrs[4] = {p.x, p.y, p.w, p.b};
    const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 4);
    const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
    p.tpr = g.tpr;
    if (vec > 1)
      tf_cuda_norm_forward_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_norm_forward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
    return tf_cuda_launched("norm kernel");
  }
  p.dy = tf_tensor_data(a->dy);
  if (a->dx) {
    p.dx = tf_tensor_data(a->dx);
    const void *ptrs[4] = {p.x, p.dy, p.dx, p.w};
    const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 4);
    const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
    p.tpr = g.tpr;
    if (vec > 1)
      tf_cuda_norm_backward_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_norm_backward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
    TF_TRY(tf_cuda_launched("norm backward kernel"));
  }
  if (!a->dw && !a->db) return TF_OK;
  return tf_cuda_norm_wgrad<DT>(ctx, st, p, a->dw ? tf_tensor_data(a->dw) : NULL,
                                a->db ? tf_tensor_data(a->db) : NULL);
}

/* The backend entry of both norms, both passes. */
#define TF_CUDA_NORM_CASE(DT, unused) \
  case DT: return tf_cuda_norm_typed<DT>(ctx, st, a);

tf_status tf_cuda_norm(tf_device_ctx *ctx, const tf_norm_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->x->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_NORM_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "norm: the CUDA backend has no kernel for dtype %s", tf_dtype_name(a->x->dtype));
}
