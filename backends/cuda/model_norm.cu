/* The engine's RMSNorm with the residual add fused in front, forward and
 * backward, on the GPU: the twin of cpu_model.c's rmsnorm. One row group
 * per row (nn_common.cuh), statistics in f32. The forward pass adds delta
 * into the f32 residual (in place is fine: each thread reads back only what
 * it wrote), reduces the sum of squares, and writes h in the compute dtype;
 * the backward pass reduces sum(dh g xhat), then adds dx into the f32
 * residual gradient and rounds a low-precision copy of it for the GEMMs.
 * The gain's gradient is a column sum over rows: splits of rows write
 * partial sums that a second kernel adds in order into dg, so it has the
 * same bits every run. */
#include "cuda_common.cuh"

#include "nn_common.cuh"

typedef struct tf_cuda_rms_params {
  const float *x;
  const void *delta;
  float *x_out;
  const float *g;
  void *h;
  float *rstd;
  const void *dh;
  float *dres;
  void *dres_low;
  int64_t rows, dim;
  float eps;
  int tpr;
  bool accumulate;
} tf_cuda_rms_params;

/* x_out = x + delta (when given); h = x_out rstd g in the compute dtype. */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_rms_forward_kernel(tf_cuda_rms_params p) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  __shared__ float scratch[32];
  const float inv_dim = 1.0f / (float)p.dim;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.dim : 0, off = row * p.dim;
    const float *x = p.x + off;
    float sq = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      float v[V];
      tf_cuda_load_row<TF_F32, V>(x + c, v);
      if (p.delta) {
        float dv[V];
        tf_cuda_load_row<DT, V>((const S *)p.delta + off + c, dv);
#pragma unroll
        for (int u = 0; u < V; u++) v[u] += dv[u];
        tf_cuda_store_row<TF_F32, V>(p.x_out + off + c, v);
      }
#pragma unroll
      for (int u = 0; u < V; u++) sq += v[u] * v[u];
    }
    sq = tf_cuda_group_reduce(sq, p.tpr, tf_cuda_add(), scratch);
    const float rstd = 1.0f / sqrtf(sq * inv_dim + p.eps);
    const float *xs = p.delta ? p.x_out + off : x;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      float v[V], g[V];
      tf_cuda_load_row<TF_F32, V>(xs + c, v);
      tf_cuda_load_row<TF_F32, V>(p.g + c, g);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] = (v[u] * rstd) * g[u];
      tf_cuda_store_row<DT, V>((S *)p.h + off + c, v);
    }
    if (live && lane == 0) p.rstd[row] = rstd;
  });
}

/* dx = rstd (dh g - xhat mean(dh g xhat)); dres (+)= dx; dres_low = dres. */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_rms_backward_kernel(tf_cuda_rms_params p) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  __shared__ float scratch[32];
  const float inv_dim = 1.0f / (float)p.dim;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.dim : 0, off = row * p.dim;
    const float *x = p.x + off;
    const S *dh = (const S *)p.dh + off;
    const float rstd = p.rstd[row];
    float sum = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      float v[V], g[V], d[V];
      tf_cuda_load_row<TF_F32, V>(x + c, v);
      tf_cuda_load_row<TF_F32, V>(p.g + c, g);
      tf_cuda_load_row<DT, V>(dh + c, d);
#pragma unroll
      for (int u = 0; u < V; u++) sum += (d[u] * g[u]) * (v[u] * rstd);
    }
    sum = tf_cuda_group_reduce(sum, p.tpr, tf_cuda_add(), scratch);
    const float mean = sum * inv_dim;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      float v[V], g[V], d[V], out[V];
      tf_cuda_load_row<TF_F32, V>(x + c, v);
      tf_cuda_load_row<TF_F32, V>(p.g + c, g);
      tf_cuda_load_row<DT, V>(dh + c, d);
      if (p.accumulate) {
        tf_cuda_load_row<TF_F32, V>(p.dres + off + c, out);
      } else {
#pragma unroll
        for (int u = 0; u < V; u++) out[u] = 0;
      }
#pragma unroll
      for (int u = 0; u < V; u++) out[u] += rstd * (d[u] * g[u] - (v[u] * rstd) * mean);
      tf_cuda_store_row<TF_F32, V>(p.dres + off + c, out);
      if (p.dres_low) tf_cuda_store_row<DT, V>((S *)p.dres_low + off + c, out);
    }
  });
}

enum { TF_CUDA_RMS_WGRAD_THREADS = 256 };

/* Partial column sums of dh xhat over rows [split * chunk, + chunk), into
 * partial[split * dim + col], or added straight into dg when there is one
 * split. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_RMS_WGRAD_THREADS)
    tf_cuda_rms_wgrad_kernel(tf_cuda_rms_params p, float *partial, float *dg, int64_t chunk) {
  typedef tf_cuda_dtype<DT> D;
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= p.dim) return;
  const int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < p.rows ? r0 + chunk : p.rows;
  const typename D::storage *dh = (const typename D::storage *)p.dh;
  float acc = 0;
#pragma unroll 4
  for (int64_t r = r0; r < r1; r++) acc += D::load(dh[r * p.dim + col]) * (p.x[r * p.dim + col] * p.rstd[r]);
  if (dg)
    dg[col] += acc;
  else
    partial[blockIdx.y * p.dim + col] = acc;
}

/* dg += the splits' partial sums, split 0 first. */
__global__ void __launch_bounds__(TF_CUDA_RMS_WGRAD_THREADS)
    tf_cuda_rms_wgrad_finish_kernel(const float *partial, float *dg, int64_t dim, int64_t splits) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= dim) return;
  float acc = 0;
  for (int64_t s = 0; s < splits; s++) acc += partial[s * dim + col];
  dg[col] += acc;
}

/* How dg's column sums are shared out: one pass straight into dg when the
 * column blocks fill the GPU (splits == 1), else splits of chunk rows each
 * (at least 32) into a workspace of splits * dim floats, then their sum. */
typedef struct tf_cuda_rms_split {
  int64_t col_blocks, splits, chunk;
} tf_cuda_rms_split;

static tf_cuda_rms_split tf_cuda_rms_splits(const tf_cuda_state *st, int64_t rows, int64_t dim) {
  tf_cuda_rms_split s;
  s.col_blocks = (dim + TF_CUDA_RMS_WGRAD_THREADS - 1) / TF_CUDA_RMS_WGRAD_THREADS;
  const int64_t want = ((int64_t)st->multiprocessors * 8 + s.col_blocks - 1) / s.col_blocks;
  const int64_t most = (rows + 31) / 32;
  s.splits = want < most ? want : most;
  if (s.splits < 1) s.splits = 1;
  if (s.splits > 65535) s.splits = 65535;
  s.chunk = (rows + s.splits - 1) / s.splits;
  s.splits = (rows + s.chunk - 1) / s.chunk;
  return s;
}

/* The partial sums' bytes for a backward call (model_kernels.h). */
size_t tf_cuda_rmsnorm_workspace(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  if (!a->backward || a->rows <= 0 || a->dim <= 0 || !ctx->backend_state) return 0;
  const tf_cuda_rms_split s = tf_cuda_rms_splits(tf_cuda_state_of(ctx), a->rows, a->dim);
  return s.splits > 1 ? (size_t)(s.splits * a->dim) * sizeof(float) : 0;
}

/* dg as tf_cuda_rms_splits shares it out; the partial sums go to
 * workspace, or to a block borrowed from the caching allocator without one. */
template <int DT>
static tf_status tf_cuda_rms_wgrad(tf_device_ctx *ctx, tf_cuda_state *st, const tf_cuda_rms_params &p, float *dg,
                                   void *workspace) {
  const tf_cuda_rms_split sp = tf_cuda_rms_splits(st, p.rows, p.dim);
  const unsigned col_blocks = (unsigned)sp.col_blocks;
  if (sp.splits == 1) {
    tf_cuda_rms_wgrad_kernel<DT><<<dim3(col_blocks, 1), TF_CUDA_RMS_WGRAD_THREADS, 0, st->stream>>>(p, NULL, dg,
                                                                                                   sp.chunk);
    return tf_cuda_launched("rmsnorm gain-gradient kernel");
  }
  tf_block *work = NULL;
  if (!workspace) {
    TF_TRY(tf_alloc(&ctx->alloc, (size_t)(sp.splits * p.dim) * sizeof(float), &work));
    workspace = work->ptr;
  }
  float *partial = (float *)workspace;
  tf_cuda_rms_wgrad_kernel<DT><<<dim3(col_blocks, (unsigned)sp.splits), TF_CUDA_RMS_WGRAD_THREADS, 0, st->stream>>>(
      p, partial, NULL, sp.chunk);
  tf_status s = tf_cuda_launched("rmsnorm gain-gradient kernel");
  if (s == TF_OK) {
    tf_cuda_rms_wgrad_finish_kernel<<<col_blocks, TF_CUDA_RMS_WGRAD_THREADS, 0, st->stream>>>(partial, dg, p.dim,
                                                                                               sp.splits);
    s = tf_cuda_launched("rmsnorm gain-gradient sum kernel");
  }
  /* Safe before the kernels finish: the block's next user queues behind them. */
  if (work) tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* 8 elements per vector step (two 16-byte loads of f32, one of f16/bf16)
 * when every row of every operand is 16-byte aligned, else 1. */
static int tf_cuda_rms_vec(int64_t dim, const void *const *ptrs, int n) {
  if (dim % 8 != 0) return 1;
  for (int i = 0; i < n; i++)
    if (ptrs[i] && (uintptr_t)ptrs[i] % 16 != 0) return 1;
  return 8;
}

/* Forward: one row kernel. Backward: the dx row kernel, then dg. */
template <int DT>
static tf_status tf_cuda_rmsnorm_typed(tf_device_ctx *ctx, tf_cuda_state *st, const tf_rmsnorm_args *a) {
  tf_cuda_rms_params p;
  memset(&p, 0, sizeof p);
  p.x = a->x;
  p.delta = a->delta;
  p.x_out = a->x_out;
  p.g = a->g;
  p.h = a->h;
  p.rstd = a->rstd;
  p.dh = a->dh;
  p.dres = a->dres;
  p.dres_low = a->dres_low;
  p.rows = a->rows;
  p.dim = a->dim;
  p.eps = (float)a->eps;
  p.accumulate = a->accumulate;
  if (p.rows == 0) return TF_OK;
  const void *ptrs[6] = {p.x, p.delta, p.x_out, p.h, p.dh, p.dres_low};
  const void *more[2] = {p.dres, p.g};
  const int vec = tf_cuda_rms_vec(p.dim, ptrs, 6) == 8 && tf_cuda_rms_vec(p.dim, more, 2) == 8 ? 8 : 1;
  const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.dim, vec);
  p.tpr = g.tpr;
  if (!a->backward) {
    if (vec == 8)
      tf_cuda_rms_forward_kernel<DT, 8><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_rms_forward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
    return tf_cuda_launched("rmsnorm kernel");
  }
  if (vec == 8)
    tf_cuda_rms_backward_kernel<DT, 8><<<g.blocks, g.threads, 0, st->stream>>>(p);
  else
    tf_cuda_rms_backward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
  TF_TRY(tf_cuda_launched("rmsnorm backward kernel"));
  return tf_cuda_rms_wgrad<DT>(ctx, st, p, a->dg, a->workspace);
}

/* The backend entry of both passes. */
tf_status tf_cuda_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_rmsnorm_typed<TF_F32>(ctx, st, a);
    case TF_F16: return tf_cuda_rmsnorm_typed<TF_F16>(ctx, st, a);
    case TF_BF16: return tf_cuda_rmsnorm_typed<TF_BF16>(ctx, st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "rmsnorm: the engine computes in f32, f16 or bf16, not %s", tf_dtype_name(a->dtype));
}
