/* Row norms on the GPU, one kernel family for the eager layer_norm and
 * rms_norm (backend.h) and the engine's RMSNorm with the residual add
 * fused in front (model_kernels.h): the twin of kernels/cpu/norm.c.
 *
 * A row's input x has storage dtype XT and the outputs y (and the
 * backward's dy, and the low-precision copy of dx) have YT: the eager ops
 * run with XT = YT = the tensor's dtype, the engine with an f32 residual
 * stream (XT = f32) and its compute dtype as YT. Statistics, weights and
 * sums are in XT's compute type (f32, f64 for f64). One row group per row
 * (nn_common.cuh); the statistics come from passes over the row (re-reads
 * hit L1/L2): layer_norm takes the mean, then the biased variance around
 * it (no cancellation, unlike sum and sum of squares); RMSNorm the mean of
 * squares, after adding delta into the residual when there is one (in
 * place is fine: each thread reads back only what it wrote). The weight
 * gradients are column sums over rows: blocks of columns times splits of
 * the rows write partial sums that a second kernel adds in order, so they
 * have the same bits every run (no atomics). */
#include "cuda_common.cuh"

#include <limits.h>
#include <type_traits>

#include "opmath.h"
#include "nn_common.cuh"

typedef struct tf_cuda_norm_params {
  const void *x;     /* XT: (rows, cols) */
  const void *delta; /* YT, forward: added into x first (x_out = x + delta), or NULL */
  void *x_out;       /* XT, with delta */
  const void *w, *b; /* compute type (cols,), or NULL */
  void *y;           /* YT, forward */
  void *mean, *rstd; /* compute type (rows,): written forward (unless NULL), read backward */
  const void *dy;    /* YT, backward */
  void *dx;          /* XT, backward: written, or added to when accumulate */
  void *dx_low;      /* YT, backward: a copy of dx, or NULL */
  int64_t rows, cols;
  double eps;
  int tpr;
  bool accumulate;
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

/* layer_norm: y = (x - mean) rstd w + b; RMSNorm: y = (x rstd) w, after
 * x_out = x + delta when delta is given. */
template <int XT, int YT, int V, bool LAYER>
__global__ void __launch_bounds__(1024) tf_cuda_norm_forward_kernel(tf_cuda_norm_params p) {
  typedef typename tf_cuda_dtype<XT>::storage XS;
  typedef typename tf_cuda_dtype<YT>::storage YS;
  typedef typename tf_cuda_dtype<XT>::compute C;
  static_assert(sizeof(C) == sizeof(typename tf_cuda_dtype<YT>::compute), "x and y share a compute type");
  __shared__ C scratch[32];
  const C inv_cols = (C)1 / (C)p.cols;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, off = row * p.cols;
    const XS *x = (const XS *)p.x + off;
    C mean = 0;
    if (LAYER) {
      C sum = 0;
      for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
        C v[V];
        tf_cuda_load_row<XT, V>(x + c, v);
#pragma unroll
        for (int u = 0; u < V; u++) sum += v[u];
      }
      mean = tf_cuda_group_reduce(sum, p.tpr, tf_cuda_add(), scratch) * inv_cols;
    }
    C sq = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<XT, V>(x + c, v);
      if (p.delta) {
        C dv[V];
        tf_cuda_load_row<YT, V>((const YS *)p.delta + off + c, dv);
#pragma unroll
        for (int u = 0; u < V; u++) v[u] += dv[u];
        tf_cuda_store_row<XT, V>((XS *)p.x_out + off + c, v);
      }
#pragma unroll
      for (int u = 0; u < V; u++) sq += LAYER ? (v[u] - mean) * (v[u] - mean) : v[u] * v[u];
    }
    sq = tf_cuda_group_reduce(sq, p.tpr, tf_cuda_add(), scratch);
    const C rstd = (C)1 / tf_sqrt(sq * inv_cols + (C)p.eps);
    const XS *xs = p.delta ? (const XS *)p.x_out + off : x;
    YS *y = (YS *)p.y + off;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V], w[V];
      tf_cuda_load_row<XT, V>(xs + c, v);
      tf_cuda_norm_weights<C, V>(p.w, c, (C)1, w);
      if (LAYER) {
        C b[V];
        tf_cuda_norm_weights<C, V>(p.b, c, (C)0, b);
#pragma unroll
        for (int u = 0; u < V; u++) v[u] = (v[u] - mean) * rstd * w[u] + b[u];
      } else {
#pragma unroll
        for (int u = 0; u < V; u++) v[u] = (v[u] * rstd) * w[u];
      }
      tf_cuda_store_row<YT, V>(y + c, v);
    }
    if (live && lane == 0) {
      if (p.mean) ((C *)p.mean)[row] = mean;
      if (p.rstd) ((C *)p.rstd)[row] = rstd;
    }
  });
}

/* With g = dy w and xhat = (x - mean) rstd (RMSNorm: x rstd):
 * dx = rstd (g - mean(g) - xhat mean(g xhat)), without the mean(g) term for
 * RMSNorm; dx is added to what dx holds when accumulate, and copied into
 * dx_low when there is one. */
template <int XT, int YT, int V, bool LAYER>
__global__ void __launch_bounds__(1024) tf_cuda_norm_backward_kernel(tf_cuda_norm_params p) {
  typedef typename tf_cuda_dtype<XT>::storage XS;
  typedef typename tf_cuda_dtype<YT>::storage YS;
  typedef typename tf_cuda_dtype<XT>::compute C;
  typedef typename std::conditional<LAYER, tf_cuda_pair<C>, C>::type Sum;
  __shared__ Sum scratch[32];
  const C inv_cols = (C)1 / (C)p.cols;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0, off = row * p.cols;
    const XS *x = (const XS *)p.x + off;
    const YS *dy = (const YS *)p.dy + off;
    const C mean = LAYER ? ((const C *)p.mean)[row] : (C)0, rstd = ((const C *)p.rstd)[row];
    C sum_g = 0, sum_gx = 0;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V], g[V], w[V];
      tf_cuda_load_row<XT, V>(x + c, v);
      tf_cuda_load_row<YT, V>(dy + c, g);
      tf_cuda_norm_weights<C, V>(p.w, c, (C)1, w);
#pragma unroll
      for (int u = 0; u < V; u++) {
        const C gw = g[u] * w[u];
        if (LAYER) {
          sum_g += gw;
          sum_gx += gw * ((v[u] - mean) * rstd);
        } else {
          sum_gx += gw * (v[u] * rstd);
        }
      }
    }
    C mg = 0, mgx;
    if constexpr (LAYER) {
      tf_cuda_pair<C> sums;
      sums.a = sum_g;
      sums.b = sum_gx;
      sums = tf_cuda_group_reduce(sums, p.tpr, tf_cuda_add(), scratch);
      mg = sums.a * inv_cols;
      mgx = sums.b * inv_cols;
    } else {
      mgx = tf_cuda_group_reduce(sum_gx, p.tpr, tf_cuda_add(), scratch) * inv_cols;
    }
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V], g[V], w[V], out[V];
      tf_cuda_load_row<XT, V>(x + c, v);
      tf_cuda_load_row<YT, V>(dy + c, g);
      tf_cuda_norm_weights<C, V>(p.w, c, (C)1, w);
      if (p.accumulate) {
        tf_cuda_load_row<XT, V>((const XS *)p.dx + off + c, out);
      } else {
#pragma unroll
        for (int u = 0; u < V; u++) out[u] = 0;
      }
#pragma unroll
      for (int u = 0; u < V; u++)
        out[u] += LAYER ? rstd * (g[u] * w[u] - mg - ((v[u] - mean) * rstd) * mgx)
                        : rstd * (g[u] * w[u] - (v[u] * rstd) * mgx);
      tf_cuda_store_row<XT, V>((XS *)p.dx + off + c, out);
      if (p.dx_low) tf_cuda_store_row<YT, V>((YS *)p.dx_low + off + c, out);
    }
  });
}

enum { TF_CUDA_WGRAD_THREADS = 256 };

/* Column sums over rows [split * chunk, + chunk): dy xhat (for w) and dy
 * (for b). With one split they go straight into dw and db (added to what
 * they hold when add), else to the partial sums pw and pb at
 * [split * cols + col]. Any of the four may be NULL. */
template <int XT, int YT, bool LAYER>
__global__ void __launch_bounds__(TF_CUDA_WGRAD_THREADS)
    tf_cuda_norm_wgrad_kernel(tf_cuda_norm_params p, typename tf_cuda_dtype<XT>::compute *pw,
                              typename tf_cuda_dtype<XT>::compute *pb, typename tf_cuda_dtype<XT>::compute *dw,
                              typename tf_cuda_dtype<XT>::compute *db, int64_t chunk, bool add) {
  typedef typename tf_cuda_dtype<XT>::compute C;
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= p.cols) return;
  const int64_t r0 = (int64_t)blockIdx.y * chunk;
  const int64_t r1 = r0 + chunk < p.rows ? r0 + chunk : p.rows;
  const typename tf_cuda_dtype<XT>::storage *x = (const typename tf_cuda_dtype<XT>::storage *)p.x;
  const typename tf_cuda_dtype<YT>::storage *dy = (const typename tf_cuda_dtype<YT>::storage *)p.dy;
  const C *meanp = (const C *)p.mean, *rstdp = (const C *)p.rstd;
  C aw = 0, ab = 0;
#pragma unroll 4
  for (int64_t r = r0; r < r1; r++) {
    const int64_t at = r * p.cols + col;
    const C g = tf_cuda_dtype<YT>::load(dy[at]);
    const C xv = tf_cuda_dtype<XT>::load(x[at]);
    aw += LAYER ? g * ((xv - meanp[r]) * rstdp[r]) : g * (xv * rstdp[r]);
    if (LAYER) ab += g;
  }
  const int64_t out = (int64_t)blockIdx.y * p.cols + col;
  if (pw) pw[out] = aw;
  if (pb) pb[out] = ab;
  if (dw) dw[col] = add ? dw[col] + aw : aw;
  if (db) db[col] = add ? db[col] + ab : ab;
}

/* Adds the splits' partial sums of each column, split 0 first, into dw and
 * db (added to what they hold when add); either may be NULL. */
template <typename C>
__global__ void __launch_bounds__(TF_CUDA_WGRAD_THREADS)
    tf_cuda_norm_wgrad_finish_kernel(const C *pw, const C *pb, C *dw, C *db, int64_t cols, int64_t splits, bool add) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  C aw = 0, ab = 0;
  for (int64_t s = 0; s < splits; s++) {
    if (dw) aw += pw[s * cols + col];
    if (db) ab += pb[s * cols + col];
  }
  if (dw) dw[col] = add ? dw[col] + aw : aw;
  if (db) db[col] = add ? db[col] + ab : ab;
}

/* How the column sums are shared out: one pass straight into dw/db when the
 * column blocks fill the GPU (splits == 1), else splits of chunk rows each
 * (at least 32) into partial sums, then their sum. */
typedef struct tf_cuda_norm_split {
  int64_t col_blocks, splits, chunk;
} tf_cuda_norm_split;

static tf_cuda_norm_split tf_cuda_norm_splits(const tf_cuda_state *st, int64_t rows, int64_t cols) {
  tf_cuda_norm_split s;
  s.col_blocks = (cols + TF_CUDA_WGRAD_THREADS - 1) / TF_CUDA_WGRAD_THREADS;
  const int64_t want = ((int64_t)st->multiprocessors * 8 + s.col_blocks - 1) / s.col_blocks;
  const int64_t most = (rows + 31) / 32;
  s.splits = want < most ? want : most;
  if (s.splits < 1) s.splits = 1;
  if (s.splits > 65535) s.splits = 65535;
  s.chunk = (rows + s.splits - 1) / s.splits;
  s.splits = (rows + s.chunk - 1) / s.chunk;
  return s;
}

/* The partial sums' bytes: one array of splits * cols per wanted output. */
static size_t tf_cuda_norm_partial_bytes(const tf_cuda_norm_split &s, int64_t cols, int outputs, size_t csize) {
  return s.splits > 1 ? (size_t)(s.splits * cols) * csize * (size_t)outputs : 0;
}

/* dw and db as tf_cuda_norm_splits shares them out; the partial sums go to
 * workspace, or to a block borrowed from the caching allocator without one. */
template <int XT, int YT, bool LAYER>
static tf_status tf_cuda_norm_wgrad(tf_device_ctx *ctx, tf_cuda_state *st, const tf_cuda_norm_params &p, void *dw,
                                    void *db, bool add, void *workspace) {
  typedef typename tf_cuda_dtype<XT>::compute C;
  const tf_cuda_norm_split sp = tf_cuda_norm_splits(st, p.rows, p.cols);
  const unsigned col_blocks = (unsigned)sp.col_blocks;
  if (sp.splits == 1) {
    tf_cuda_norm_wgrad_kernel<XT, YT, LAYER><<<dim3(col_blocks, 1), TF_CUDA_WGRAD_THREADS, 0, st->stream>>>(
        p, NULL, NULL, (C *)dw, (C *)db, sp.chunk, add);
    return tf_cuda_launched("norm weight-gradient kernel");
  }
  tf_block *work = NULL;
  if (!workspace) {
    const int outputs = (dw ? 1 : 0) + (db ? 1 : 0);
    TF_TRY(tf_alloc(&ctx->alloc, tf_cuda_norm_partial_bytes(sp, p.cols, outputs, sizeof(C)), &work));
    workspace = work->ptr;
  }
  C *pw = dw ? (C *)workspace : NULL;
  C *pb = db ? (C *)workspace + (dw ? sp.splits * p.cols : 0) : NULL;
  tf_cuda_norm_wgrad_kernel<XT, YT, LAYER><<<dim3(col_blocks, (unsigned)sp.splits), TF_CUDA_WGRAD_THREADS, 0,
                                            st->stream>>>(p, pw, pb, NULL, NULL, sp.chunk, add);
  tf_status s = tf_cuda_launched("norm weight-gradient kernel");
  if (s == TF_OK) {
    tf_cuda_norm_wgrad_finish_kernel<C><<<col_blocks, TF_CUDA_WGRAD_THREADS, 0, st->stream>>>(
        pw, pb, (C *)dw, (C *)db, p.cols, sp.splits, add);
    s = tf_cuda_launched("norm weight-gradient sum kernel");
  }
  /* Safe before the kernels finish: the block's next user queues behind them. */
  if (work) tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* One pass: the forward row kernel, or the backward row kernel (when dx is
 * wanted) and then the weight gradients (when asked), at vector width V
 * (1 when the rows are not aligned for it). */
template <int XT, int YT, bool LAYER, int V>
static tf_status tf_cuda_norm_launch(tf_device_ctx *ctx, tf_cuda_state *st, tf_cuda_norm_params p, int vec,
                                     bool backward, void *dw, void *db, bool add, void *workspace) {
  if (p.rows == 0) return TF_OK;
  const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
  p.tpr = g.tpr;
  if (!backward) {
    if (vec > 1)
      tf_cuda_norm_forward_kernel<XT, YT, V, LAYER><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_norm_forward_kernel<XT, YT, 1, LAYER><<<g.blocks, g.threads, 0, st->stream>>>(p);
    return tf_cuda_launched("norm kernel");
  }
  if (p.dx) {
    if (vec > 1)
      tf_cuda_norm_backward_kernel<XT, YT, V, LAYER><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_norm_backward_kernel<XT, YT, 1, LAYER><<<g.blocks, g.threads, 0, st->stream>>>(p);
    TF_TRY(tf_cuda_launched("norm backward kernel"));
  }
  if (!dw && !db) return TF_OK;
  return tf_cuda_norm_wgrad<XT, YT, LAYER>(ctx, st, p, dw, db, add, workspace);
}

/* ---- the engine's RMSNorm backward with its gain's gradient in one pass ------------------ */

/* The engine's RMSNorm backward (f32 x, dy of YT) and the gain's gradient
 * dg = sum over rows of dy xhat in one pass over x and dy: one block a row
 * at a time (block b takes rows b, b + gridDim.x, ...), each thread one
 * vector step of 8 columns. A thread reads its part of x, dy (and of dx,
 * when added to) into registers a row ahead: the next row's loads wait on
 * memory while this row's sum is taken over the block. It keeps the
 * column sums of the rows its block takes;
 * block b writes them as row b of the partial sums, which
 * tf_cuda_rms_partial_sum_kernel adds in a fixed order. Several blocks a
 * multiprocessor each at its own row hide one another's waits. dx is
 * computed as tf_cuda_norm_backward_kernel computes it, from the row's sum
 * over the block's threads; the rows each block takes depend on the shape
 * and the GPU only, so dg has the same bits every run. */
/* Rows of up to 8 x 512 = 4096 columns, at most 64 registers a thread:
 * three blocks of the 2.7B model's 320 threads a multiprocessor, with some
 * 60 bytes of spills, run faster than two blocks at the 100 registers the
 * compiler wants or four at 40 registers. */
enum { TF_CUDA_RMS_FUSED_THREADS = 512 };
template <int YT>
__global__ void __launch_bounds__(TF_CUDA_RMS_FUSED_THREADS, 2)
    tf_cuda_rms_backward_fused_kernel(tf_cuda_norm_params p, float *partial) {
  typedef typename tf_cuda_dtype<YT>::storage YS;
  __shared__ float scratch[32];
  const float inv_cols = 1.0f / (float)p.cols;
  const int64_t c = 8 * (int64_t)threadIdx.x;
  const bool mine = c < p.cols;
  float acc[8], w[8];
#pragma unroll
  for (int u = 0; u < 8; u++) acc[u] = 0.f;
  tf_cuda_norm_weights<float, 8>(mine ? p.w : NULL, c, 1.0f, w);
  /* The next row's x, dy (as stored), dx and rstd, loaded while this row
   * waits for the block's sum. */
  float nx[8], ndx[8], nrstd = 0;
  YS ndy[8];
  auto load = [&](int64_t row) {
    if (row >= p.rows) return;
    nrstd = ((const float *)p.rstd)[row];
    if (!mine) return;
    const int64_t off = row * p.cols + c;
    tf_cuda_load_row<TF_F32, 8>((const float *)p.x + off, nx);
    tf_cuda_load_n<YS, 8>((const YS *)p.dy + off, ndy);
    if (p.accumulate) {
      tf_cuda_load_row<TF_F32, 8>((const float *)p.dx + off, ndx);
    } else {
#pragma unroll
      for (int u = 0; u < 8; u++) ndx[u] = 0;
    }
  };
  load(blockIdx.x);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    /* what the row's dx needs after the sum: g w, xhat = x rstd and dx */
    const float rstd = nrstd;
    float gw[8], xhat[8], out[8], sum_gx = 0;
    if (mine) {
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const float g = tf_cuda_dtype<YT>::load(ndy[u]);
        gw[u] = g * w[u];
        xhat[u] = nx[u] * rstd;
        out[u] = ndx[u];
        sum_gx += gw[u] * xhat[u];
        acc[u] += g * xhat[u];
      }
    }
    load(row + gridDim.x);
    const float mgx = tf_cuda_group_reduce(sum_gx, (int)blockDim.x, tf_cuda_add(), scratch) * inv_cols;
    if (!mine) continue;
#pragma unroll
    for (int u = 0; u < 8; u++) out[u] += rstd * (gw[u] - xhat[u] * mgx);
    const int64_t off = row * p.cols + c;
    tf_cuda_store_row<TF_F32, 8>((float *)p.dx + off, out);
    if (p.dx_low) tf_cuda_store_row<YT, 8>((YS *)p.dx_low + off, out);
  }
  if (mine) tf_cuda_store_n<float, 8>(partial + (int64_t)blockIdx.x * p.cols + c, acc);
}

/* The sum of the fused pass's partial sums, one row a block: 32 columns a
 * block, TF_CUDA_RMS_SUM_DOWN threads down each column adding every
 * TF_CUDA_RMS_SUM_DOWN-th row in order, then theirs added in order into dg
 * (added to): the same bits every run. Each thread loads 8 of its rows
 * before adding them (in the same order), so that its loads wait for
 * memory together rather than one after another (one load at a time, a
 * short call waited on each while AdamW shared the memory); 32 threads
 * down a column leave each two such batches of the 396 rows of the 2.7B
 * model's backward on an H200 (three blocks on each of its 132
 * multiprocessors). */
enum { TF_CUDA_RMS_SUM_DOWN = 32 };
__global__ void __launch_bounds__(32 * TF_CUDA_RMS_SUM_DOWN)
    tf_cuda_rms_partial_sum_kernel(const float *partial, float *dg, int64_t cols, int64_t rows) {
  enum { DOWN = TF_CUDA_RMS_SUM_DOWN, BATCH = 8 };
  __shared__ float part[DOWN][33];
  const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
  float sum = 0;
  if (col < cols) {
    int64_t r = threadIdx.y;
    for (; r + (BATCH - 1) * DOWN < rows; r += BATCH * DOWN) {
      float v[BATCH];
#pragma unroll
      for (int i = 0; i < BATCH; i++) v[i] = partial[(r + i * DOWN) * cols + col];
#pragma unroll
      for (int i = 0; i < BATCH; i++) sum += v[i];
    }
    for (; r < rows; r += DOWN) sum += partial[r * cols + col];
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0;
#pragma unroll
  for (int i = 0; i < DOWN; i++) total += part[i][threadIdx.x];
  dg[col] += total;
}

/* The fused pass's launch: a thread for each 8 columns (rounded up to
 * whole warps), as many blocks as are resident at once (one wave; the
 * partial sums are one row a block). ok is false where the rows are not in
 * 16-byte vectors of 8 or are longer than 8 TF_CUDA_RMS_FUSED_THREADS
 * (4096) columns: the two-kernel path then runs. */
typedef struct tf_cuda_rms_fused {
  bool ok;
  int threads;
  unsigned blocks;
} tf_cuda_rms_fused;

static void *tf_cuda_rms_fused_kernel_for(tf_dtype dt) {
  switch (dt) {
    case TF_F32: return (void *)tf_cuda_rms_backward_fused_kernel<TF_F32>;
    case TF_F16: return (void *)tf_cuda_rms_backward_fused_kernel<TF_F16>;
    case TF_BF16: return (void *)tf_cuda_rms_backward_fused_kernel<TF_BF16>;
    default: return NULL;
  }
}

static tf_cuda_rms_fused tf_cuda_rms_fused_geometry(const tf_cuda_state *st, tf_dtype dt, int64_t rows, int64_t cols,
                                                    int vec) {
  tf_cuda_rms_fused f = {};
  void *kernel = tf_cuda_rms_fused_kernel_for(dt);
  if (vec != 8 || rows <= 0 || cols <= 0 || cols > 8 * TF_CUDA_RMS_FUSED_THREADS || !kernel) return f;
  f.threads = (int)((cols / 8 + 31) / 32 * 32);
  int resident = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, f.threads, 0) != cudaSuccess || resident < 1) {
    (void)cudaGetLastError();
    return f;
  }
  const int64_t cap = (int64_t)st->multiprocessors * resident;
  f.blocks = (unsigned)(rows < cap ? rows : cap);
  f.ok = true;
  return f;
}

template <int YT>
static tf_status tf_cuda_rms_backward_fused(tf_cuda_state *st, const tf_cuda_norm_params &p, const tf_cuda_rms_fused &f,
                                            float *dg, float *workspace) {
  tf_cuda_rms_backward_fused_kernel<YT><<<f.blocks, f.threads, 0, st->stream>>>(p, workspace);
  TF_TRY(tf_cuda_launched("norm backward kernel (with the gain's gradient)"));
  tf_cuda_rms_partial_sum_kernel<<<(unsigned)((p.cols + 31) / 32), dim3(32, TF_CUDA_RMS_SUM_DOWN), 0, st->stream>>>(
      workspace, dg, p.cols, f.blocks);
  return tf_cuda_launched("norm weight-gradient sum kernel");
}

/* ---- the engine's RMSNorm forward, one block a row ----------------------------------------- */

/* The most vector steps of 8 a thread that the row kernel takes (1024 threads). */
enum { TF_CUDA_RMS_ROW_K = 3 };

/* The engine's RMSNorm forward (f32 x, x_out; h of YT) with the row in
 * registers: one block a row, each thread K vector steps of 8 columns
 * (blockDim.x threads apart), x and delta read once each, x_out and h
 * written once: no second pass over the row; the gains are read with the
 * row. In the 2.7B model's step (2560 columns, 320 threads) this is faster
 * than the gains read after the row's sum, or a row group of 128 threads
 * and a second pass. */
template <int YT, int K>
__global__ void __launch_bounds__(1024) tf_cuda_rms_forward_row_kernel(tf_cuda_norm_params p) {
  typedef typename tf_cuda_dtype<YT>::storage YS;
  __shared__ float scratch[32];
  tf_chain_next(); /* may be launched chained (the decode step's norms) */
  tf_chain_wait();
  const int64_t off = (int64_t)blockIdx.x * p.cols;
  const int chunks = (int)(p.cols / 8);
  float v[K][8], w[K][8];
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c = k * (int)blockDim.x + (int)threadIdx.x;
    if (c < chunks) tf_cuda_load_row<TF_F32, 8>((const float *)p.x + off + 8 * c, v[k]);
  }
  /* the gains are loaded with the row, so that their wait does not follow
   * the block's sum (the widest rows, K = 3, have no registers for them) */
  constexpr bool early = K < TF_CUDA_RMS_ROW_K;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c = k * (int)blockDim.x + (int)threadIdx.x;
    if (early && c < chunks) tf_cuda_norm_weights<float, 8>(p.w, 8 * c, 1.0f, w[k]);
  }
  if (p.delta) {
    float d[K][8];
#pragma unroll
    for (int k = 0; k < K; k++) {
      const int c = k * (int)blockDim.x + (int)threadIdx.x;
      if (c < chunks) tf_cuda_load_row<YT, 8>((const YS *)p.delta + off + 8 * c, d[k]);
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
      const int c = k * (int)blockDim.x + (int)threadIdx.x;
      if (c >= chunks) continue;
#pragma unroll
      for (int u = 0; u < 8; u++) v[k][u] += d[k][u];
      tf_cuda_store_row<TF_F32, 8>((float *)p.x_out + off + 8 * c, v[k]);
    }
  }
  float sq = 0;
#pragma unroll
  for (int k = 0; k < K; k++)
    if (k * (int)blockDim.x + (int)threadIdx.x < chunks)
#pragma unroll
      for (int u = 0; u < 8; u++) sq += v[k][u] * v[k][u];
  sq = tf_cuda_group_reduce(sq, (int)blockDim.x, tf_cuda_add(), scratch);
  const float rstd = 1.0f / tf_sqrt(sq * (1.0f / (float)p.cols) + (float)p.eps);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c = k * (int)blockDim.x + (int)threadIdx.x;
    if (c >= chunks) continue;
    if (!early) tf_cuda_norm_weights<float, 8>(p.w, 8 * c, 1.0f, w[k]);
#pragma unroll
    for (int u = 0; u < 8; u++) v[k][u] = (v[k][u] * rstd) * w[k][u];
    tf_cuda_store_row<YT, 8>((YS *)p.y + off + 8 * c, v[k]);
  }
  if (threadIdx.x == 0 && p.rstd) ((float *)p.rstd)[blockIdx.x] = rstd;
}

/* The row kernel for rows of cols (vector width 8), or false when a row
 * needs more than TF_CUDA_RMS_ROW_K steps a thread or the grid too many
 * blocks; the caller then takes the row-group kernel. *launched: the
 * launch's status. */
template <int YT>
static bool tf_cuda_rms_forward_rows(tf_cuda_state *st, const tf_cuda_norm_params &p, int vec, bool chained,
                                     tf_status *launched) {
  const int64_t chunks = p.cols / 8;
  if (vec != 8 || p.rows > INT_MAX || chunks > 1024 * TF_CUDA_RMS_ROW_K) return false;
  const int k = (int)((chunks + 1023) / 1024);
  const int threads = (int)(((chunks + k - 1) / k + 31) / 32 * 32);
  switch (k) {
#define TF_CUDA_RMS_ROW_CASE(K)                                                                  \
  case K:                                                                                            \
    *launched = tf_cuda_launch(st, chained, "norm kernel (a block a row)", (unsigned)p.rows, threads, \
                               tf_cuda_rms_forward_row_kernel<YT, K>, p);                             \
    break;
    TF_CUDA_RMS_ROW_CASE(1)
    TF_CUDA_RMS_ROW_CASE(2)
    TF_CUDA_RMS_ROW_CASE(3)
#undef TF_CUDA_RMS_ROW_CASE
    default: return false;
  }
  return true;
}

/* The engine's RMSNorm forward again from the rows' kept rstd (rstd_given,
 * the norms the backward pass recomputes): x_out = x + delta when delta is
 * given, then h = (x rstd) g, the forward kernels' arithmetic without their
 * sum, so the same bits. An elementwise pass, V columns a thread, blocks
 * across a row (x) and over rows (y, grid-stride) as in the SwiGLU
 * kernel: no barrier and no division, where the row kernel's sum over the
 * block held these calls back. */
template <int YT, int V>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_rms_apply_kernel(tf_cuda_norm_params p) {
  typedef typename tf_cuda_dtype<YT>::storage YS;
  const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= p.cols) return;
  float w[V];
  tf_cuda_norm_weights<float, V>(p.w, c, 1.0f, w);
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    float v[V];
    tf_cuda_load_row<TF_F32, V>((const float *)p.x + r * p.cols + c, v);
    if (p.delta) {
      float d[V];
      tf_cuda_load_row<YT, V>((const YS *)p.delta + r * p.cols + c, d);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] += d[u];
      tf_cuda_store_row<TF_F32, V>((float *)p.x_out + r * p.cols + c, v);
    }
    const float rstd = ((const float *)p.rstd)[r];
#pragma unroll
    for (int u = 0; u < V; u++) v[u] = (v[u] * rstd) * w[u];
    tf_cuda_store_row<YT, V>((YS *)p.y + r * p.cols + c, v);
  }
}

/* The apply kernel at vector width V: cols / V threads a row. */
template <int YT, int V> static void tf_cuda_rms_apply_launch(tf_cuda_state *st, const tf_cuda_norm_params &p) {
  tf_cuda_rms_apply_kernel<YT, V><<<tf_cuda_rows_grid(st, p.rows, p.cols / V), TF_CUDA_THREADS, 0, st->stream>>>(p);
}

/* ---- the eager ops (backend.h): x and y of one dtype ------------------------------------ */

/* 16 bytes per vector step when every row of every operand is aligned for it. */
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
  int vec;
  if (!a->backward) {
    p.y = tf_tensor_data(a->y);
    const void *ptrs[4] = {p.x, p.y, p.w, p.b};
    vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 4);
  } else {
    p.dy = tf_tensor_data(a->dy);
    p.dx = a->dx ? tf_tensor_data(a->dx) : NULL;
    const void *ptrs[4] = {p.x, p.dy, p.dx, p.w};
    vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 4);
  }
  void *dw = a->dw ? tf_tensor_data(a->dw) : NULL, *db = a->db ? tf_tensor_data(a->db) : NULL;
  if (a->kind == TF_NORM_LAYER)
    return tf_cuda_norm_launch<DT, DT, true, VW>(ctx, st, p, vec, a->backward, dw, db, false, NULL);
  return tf_cuda_norm_launch<DT, DT, false, VW>(ctx, st, p, vec, a->backward, dw, NULL, false, NULL);
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

/* ---- the engine's RMSNorm (model_kernels.h): an f32 residual, h in the compute dtype ------- */

/* 8 elements per vector step (two 16-byte loads of f32, one of f16/bf16)
 * when every row of every operand is 16-byte aligned, else 1. */
static int tf_cuda_rms_vec(int64_t dim, const void *const *ptrs, int n) {
  if (dim % 8 != 0) return 1;
  for (int i = 0; i < n; i++)
    if (ptrs[i] && (uintptr_t)ptrs[i] % 16 != 0) return 1;
  return 8;
}

/* The partial sums' bytes for a backward call, planned by the engine: the
 * fused pass's one row a block where it runs (the engine's buffers are
 * 16-byte aligned, so the vector width is the shape's), else the splits'. */
size_t tf_cuda_rmsnorm_workspace(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  if (!a->backward || a->rows <= 0 || a->dim <= 0 || !ctx->backend_state) return 0;
  const tf_cuda_state *st = tf_cuda_state_of(ctx);
  const tf_cuda_rms_fused f = tf_cuda_rms_fused_geometry(st, a->dtype, a->rows, a->dim, a->dim % 8 == 0 ? 8 : 1);
  const size_t fused = f.ok ? (size_t)f.blocks * (size_t)a->dim * sizeof(float) : 0;
  const tf_cuda_norm_split s = tf_cuda_norm_splits(st, a->rows, a->dim);
  const size_t split = tf_cuda_norm_partial_bytes(s, a->dim, 1, sizeof(float));
  return fused > split ? fused : split;
}

/* The traffic count's bytes of an engine RMSNorm call (x and the residual
 * f32, the rest in a->dtype). Forward: x (and delta) read, h (and, with
 * delta, x_out) written, rstd written or, kept, read. Backward: x, dh and rstd read, the
 * residual's gradient written (read too when added to), its low copy
 * written; the gain's gradient sum: x, dh and rstd read. */
static double tf_cuda_rms_bytes(const tf_rmsnorm_args *a, bool wgrad) {
  const double e = (double)tf_dtype_size(a->dtype), nd = (double)a->rows * (double)a->dim, row = 4.0 * (double)a->rows;
  if (wgrad) return nd * (4 + e) + row;
  if (!a->backward) return nd * (4 + e + (a->delta ? e + 4 : 0)) + (a->rstd ? row : 0); /* x_out with delta only */
  return nd * (4 + e + (a->dres ? (a->accumulate ? 8 : 4) : 0) + (a->dres_low ? e : 0)) + row;
}

/* Forward: one row kernel. Backward: the dx row kernel (added into the
 * residual's gradient, with its low-precision copy), then dg added to. */
template <int DT>
static tf_status tf_cuda_rmsnorm_typed(tf_device_ctx *ctx, tf_cuda_state *st, const tf_rmsnorm_args *a) {
  tf_cuda_norm_params p;
  memset(&p, 0, sizeof p);
  p.x = a->x;
  p.delta = a->delta;
  p.x_out = a->x_out;
  p.w = a->g;
  p.y = a->h;
  p.rstd = a->rstd;
  p.dy = a->dh;
  p.dx = a->backward ? a->dres : NULL;
  p.dx_low = a->dres_low;
  p.rows = a->rows;
  p.cols = a->dim;
  p.eps = (double)(float)a->eps;
  p.accumulate = a->accumulate;
  const void *ptrs[8] = {a->x, a->delta, a->x_out, a->h, a->dh, a->dres_low, a->dres, a->g};
  const int vec = tf_cuda_rms_vec(a->dim, ptrs, 8);
  if (a->rstd_given && a->backward) return tf_fail(TF_ERR_ARG, "rmsnorm: rstd_given is for the forward pass");
  if (a->rstd_given) {
    if (!a->rstd) return tf_fail(TF_ERR_ARG, "rmsnorm: rstd_given without rstd");
    if (a->rows <= 0 || a->dim <= 0) return TF_OK;
    if (vec == 8)
      tf_cuda_rms_apply_launch<DT, 8>(st, p);
    else
      tf_cuda_rms_apply_launch<DT, 1>(st, p);
    tf_cuda_traffic("tf_cuda_rms_apply_kernel", tf_cuda_rms_bytes(a, false));
    return tf_cuda_launched("norm kernel (the kept rstd applied)");
  }
  tf_status launched = TF_OK;
  if (!a->backward && a->rows > 0 && tf_cuda_rms_forward_rows<DT>(st, p, vec, a->chained, &launched)) {
    tf_cuda_traffic("tf_cuda_rms_forward_row_kernel", tf_cuda_rms_bytes(a, false));
    return launched;
  }
  if (a->backward && a->dres && a->dg && a->workspace && !getenv("TF_NORM_UNFUSED")) {
    const tf_cuda_rms_fused f = tf_cuda_rms_fused_geometry(st, (tf_dtype)DT, a->rows, a->dim, vec);
    if (f.ok) {
      tf_cuda_traffic("tf_cuda_rms_backward_fused_kernel", tf_cuda_rms_bytes(a, false));
      return tf_cuda_rms_backward_fused<DT>(st, p, f, a->dg, (float *)a->workspace);
    }
  }
  if (a->rows > 0) {
    if (!a->backward) tf_cuda_traffic("tf_cuda_norm_forward_kernel", tf_cuda_rms_bytes(a, false));
    if (a->backward && a->dres) tf_cuda_traffic("tf_cuda_norm_backward_kernel", tf_cuda_rms_bytes(a, false));
    if (a->backward && a->dg) tf_cuda_traffic("tf_cuda_norm_wgrad_kernel", tf_cuda_rms_bytes(a, true));
  }
  return tf_cuda_norm_launch<TF_F32, DT, false, 8>(ctx, st, p, vec, a->backward, a->backward ? a->dg : NULL, NULL,
                                                   true, a->workspace);
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
