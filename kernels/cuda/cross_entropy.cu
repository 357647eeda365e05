/* Cross-entropy of logits against integer targets on the GPU, one row
 * kernel for the eager op (backend.h: forward, backward) and the engine's
 * loss fused with its gradient (model_kernels.h: lm_loss): the twin of
 * kernels/cpu/cross_entropy.c.
 *
 * One row group per row (nn_common.cuh). The statistics are softmax's
 * online max-and-sum (one read of the logits, no probabilities stored):
 * lse = max + log(sum) and the row's loss lse - x[target], the target's
 * logit kept on the way by the thread whose chunk holds it when the row is
 * about to be overwritten, else read once after. The fused form
 * then overwrites the row in place with (softmax - onehot) scale in a
 * second read; the backward form only does that second read, from a saved
 * lse. A single block adds the row losses in a fixed order, so the mean
 * has the same bits every run. A target outside [0, V) is reported through
 * the first-bad word (when one is given) and read as class 0, so nothing is
 * read out of bounds; in the backward form it matches no class. */
#include "cuda_common.cuh"

#include <limits.h>

#include "opmath.h"
#include "nn_common.cuh"

/* What a launch computes: the loss; the loss and the gradient in place; the
 * gradient from a saved lse. */
enum { TF_CE_FORWARD, TF_CE_FUSED, TF_CE_BACKWARD };

typedef struct tf_cuda_ce_params {
  const void *x;             /* logits (rows, cols) */
  const int64_t *targets;    /* (rows,) */
  void *lse;                 /* compute type: written by the forward form unless NULL, read by the backward */
  void *row_loss;            /* compute type, one per row (forward, fused) */
  void *dx;                  /* fused, backward: the gradient (x itself for the fused form) */
  const void *dloss;         /* backward: one value of the compute type, the scale is dloss / rows */
  double scale;              /* fused: the gradient's scale */
  int64_t rows, cols;
  int tpr;
  unsigned long long *first_bad; /* forward: NULL to skip the report */
} tf_cuda_ce_params;

template <int DT, int V, int MODE>
__global__ void __launch_bounds__(1024) tf_cuda_ce_kernel(tf_cuda_ce_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ tf_cuda_pair<C> scratch[32];
  const C scale = MODE == TF_CE_BACKWARD ? *(const C *)p.dloss / (C)p.rows : (C)p.scale;
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0;
    const S *x = (const S *)p.x + row * p.cols;
    int64_t target = p.targets[row];
    C lse;
    if (MODE == TF_CE_BACKWARD) {
      lse = ((const C *)p.lse)[row];
    } else {
      if (target < 0 || target >= p.cols) {
        if (p.first_bad && live && lane == 0) tf_cuda_report_bad(p.first_bad, row);
        target = 0;
      }
      tf_cuda_pair<C> ms;
      ms.a = (C)-INFINITY;
      ms.b = (C)0;
      C xt = 0;
      bool owner = false;
      for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
        C v[V];
        tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
        for (int u = 0; u < V; u++) {
          tf_cuda_maxsum_add(ms, v[u]);
          if (MODE == TF_CE_FUSED && c + u == target) xt = v[u], owner = true;
        }
      }
      ms = tf_cuda_group_reduce(ms, p.tpr, tf_cuda_maxsum(), scratch);
      lse = ms.a + tf_log(ms.b);
      /* In place, the target's logit was kept on the way (the row is
       * overwritten next); else lane 0 reads it once. */
      if (MODE == TF_CE_FORWARD && live && lane == 0) xt = D::load(x[target]), owner = true;
      if (owner) ((C *)p.row_loss)[row] = lse - xt;
      if (p.lse && live && lane == 0) ((C *)p.lse)[row] = lse;
    }
    if (MODE == TF_CE_FORWARD) return; /* the next row */
    S *dx = (S *)p.dx + row * p.cols;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] = (tf_exp(v[u] - lse) - (c + u == target ? (C)1 : (C)0)) * scale;
      tf_cuda_store_row<DT, V>(dx + c, v);
    }
  });
}

/* loss = mean of the row losses (compute type C), stored in dtype OUT: one
 * block, each thread adding a strided share in order, then the block's
 * fixed reduction tree. */
template <typename C, int OUT>
__global__ void __launch_bounds__(1024) tf_cuda_ce_mean_kernel(const C *row_loss, int64_t rows, void *loss) {
  __shared__ C scratch[32];
  C sum = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) sum += row_loss[i];
  sum = tf_cuda_group_reduce(sum, (int)blockDim.x, tf_cuda_add(), scratch);
  if (threadIdx.x == 0)
    *(typename tf_cuda_dtype<OUT>::storage *)loss = tf_cuda_dtype<OUT>::store((typename tf_cuda_dtype<OUT>::compute)(sum / (C)rows));
}

/* ---- the engine's fused loss, one block a row ------------------------------------------------- */

/* The most vector steps a thread that the row kernel takes. */
enum { TF_CUDA_CE_ROW_K = 4 };

/* Element u of a 16-byte word of V values of storage type S, as the compute type. */
template <int DT, int V>
__device__ __forceinline__ typename tf_cuda_dtype<DT>::compute tf_cuda_ce_unpack(const uint4 &r, int u) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  S v;
  if (sizeof(S) == 8) {
    const uint64_t b = (uint64_t)w[2 * u + 1] << 32 | w[2 * u];
    memcpy(&v, &b, sizeof v);
  } else if (sizeof(S) == 4) {
    memcpy(&v, &w[u], sizeof v);
  } else {
    const uint16_t b = (uint16_t)(w[u / 2] >> (16 * (u & 1)));
    memcpy(&v, &b, sizeof v);
  }
  return tf_cuda_dtype<DT>::load(v);
}

/* exp(v - max) for the row kernel, given max and max log2(e): in f32 the
 * hardware's exp2 of v log2(e) - max log2(e), one FFMA and one MUFU.EX2
 * where expf takes some ten instructions (the product's rounding makes a
 * relative error of about |v| 2^-24; exp2f's care for results under 2^-126
 * is left out too: a logit more than 87 below its row's max gives 0, which
 * moves neither the sum nor any gradient by more than 1e-38); in f64 exp. */
__device__ __forceinline__ float tf_cuda_ce_exp(float v, float mx, float mx_log2e) {
  (void)mx;
  return tf_cuda_exp2(fmaf(v, (float)TF_CUDA_LOG2E, -mx_log2e));
}
__device__ __forceinline__ double tf_cuda_ce_exp(double v, double mx, double mx_log2e) {
  (void)mx_log2e;
  return exp(v - mx);
}

/* The engine's loss with its gradient in place, the row in registers: one
 * block a row, each thread K 16-byte words of V logits (blockDim.x threads
 * apart), read once and kept as read. The block's max first, then the sum
 * of e = exp(x - max); lse = max + log(sum), the row's loss lse -
 * x[target] (from the thread holding the target), and the row overwritten
 * with e (scale / sum), e computed again (the same bits), then the
 * target's element with e (scale / sum) - scale by the thread that holds
 * it: one read and one write of the logits. In f32 the exponential is one
 * FFMA and the hardware's exp2 (tf_cuda_ce_exp), and no element is
 * compared with the target: the arithmetic per logit, not the memory, is
 * what held the kernel back. Keeping the words as read instead of
 * each thread's e in f32 takes a thread from 52 registers to 32 (the 2.7B
 * model's 10000 columns in bf16), so that four blocks of 448 threads a
 * multiprocessor run instead of two (f16's conversion and f64 take more:
 * three and one; tf_cuda_ce_rows now makes the blocks smaller): two
 * blocks leave too few rows' loads in flight, as does the row-group
 * kernel's online max-and-sum with its second read. */
template <int DT> struct tf_cuda_ce_row_blocks { /* blocks a multiprocessor holds, within which nothing spills */
  enum { value = DT == TF_F64 ? 1 : DT == TF_F16 ? 3 : 4 };
};

template <int DT, int V, int K>
__global__ void __launch_bounds__(512, tf_cuda_ce_row_blocks<DT>::value) tf_cuda_ce_row_kernel(tf_cuda_ce_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ C scratch[32];
  const int64_t row = blockIdx.x, chunks = p.cols / V;
  S *x = (S *)p.dx + row * p.cols; /* in place: p.x == p.dx */
  int64_t target = p.targets[row];
  if (target < 0 || target >= p.cols) target = 0; /* checked before the pass (index_check) */
  uint4 raw[K];
  C mx = (C)-INFINITY;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int64_t c = (int64_t)k * blockDim.x + threadIdx.x;
    if (c < chunks) raw[k] = *(const uint4 *)(x + c * V);
  }
  const C xt = D::load(x[target]); /* read by every thread before any writes (the sums' barriers come first) */
#pragma unroll
  for (int k = 0; k < K; k++)
    if ((int64_t)k * blockDim.x + threadIdx.x < chunks)
#pragma unroll
      for (int u = 0; u < V; u++) {
        /* fmax: one instruction where the comparison and a select took two;
         * a NaN loses here too (the sum carries it) */
        mx = fmax(mx, tf_cuda_ce_unpack<DT, V>(raw[k], u));
      }
  mx = tf_cuda_group_reduce(mx, (int)blockDim.x, tf_cuda_max(), scratch);
  const C mxl = mx * (C)TF_CUDA_LOG2E;
  C sum = 0;
#pragma unroll
  for (int k = 0; k < K; k++)
    if ((int64_t)k * blockDim.x + threadIdx.x < chunks)
#pragma unroll
      for (int u = 0; u < V; u++) sum += tf_cuda_ce_exp(tf_cuda_ce_unpack<DT, V>(raw[k], u), mx, mxl);
  sum = tf_cuda_group_reduce(sum, (int)blockDim.x, tf_cuda_add(), scratch);
  if (threadIdx.x == 0) ((C *)p.row_loss)[row] = mx + tf_log(sum) - xt;
  const C scale = (C)p.scale, inv_scale = (C)1 / sum * scale;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int64_t c = (int64_t)k * blockDim.x + threadIdx.x;
    if (c >= chunks) continue;
    C e[V];
#pragma unroll
    for (int u = 0; u < V; u++) e[u] = tf_cuda_ce_exp(tf_cuda_ce_unpack<DT, V>(raw[k], u), mx, mxl) * inv_scale;
    tf_cuda_store_row<DT, V>(x + c * V, e);
    /* the target's gradient over the word's (program order: this store lands last) */
    if (c == target / V) x[target] = D::store(tf_cuda_ce_exp(xt, mx, mxl) * inv_scale - scale);
  }
}

/* The row kernel for the engine's fused loss, or false (the row-group
 * kernel runs) when the rows are not in 16-byte vectors or need more than
 * TF_CUDA_CE_ROW_K steps of 512 threads. A thread takes as many steps as
 * leave the row at least 256 threads (up to TF_CUDA_CE_ROW_K): smaller
 * blocks, more of them on a multiprocessor, more rows' loads in flight
 * while other rows sum. The 2.7B model's 10000 columns in bf16: 4 steps of
 * 320 threads, six blocks a multiprocessor, faster than 3 steps of 448
 * threads (four blocks). */
template <int DT> static bool tf_cuda_ce_rows(tf_cuda_state *st, const tf_cuda_ce_params &p) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  const void *ptrs[1] = {p.dx};
  if (p.x != p.dx || p.rows > INT_MAX || tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 1) != VW) return false;
  const int64_t chunks = p.cols / VW;
  int64_t k = (chunks + 511) / 512;
  if (k > TF_CUDA_CE_ROW_K) return false;
  while (k < TF_CUDA_CE_ROW_K && (chunks + k) / (k + 1) >= 256) k++;
  const int threads = (int)(((chunks + k - 1) / k + 31) / 32 * 32);
  switch (k) {
#define TF_CUDA_CE_ROW_CASE(K)                                                                             \
  case K: tf_cuda_ce_row_kernel<DT, VW, K><<<(unsigned)p.rows, threads, 0, st->stream>>>(p); break;
    TF_CUDA_CE_ROW_CASE(1)
    TF_CUDA_CE_ROW_CASE(2)
    TF_CUDA_CE_ROW_CASE(3)
    TF_CUDA_CE_ROW_CASE(4)
#undef TF_CUDA_CE_ROW_CASE
    default: return false;
  }
  return true;
}

/* The row kernel (the engine's fused form: a block a row where the rows
 * allow; else row groups at the widest vector the rows allow), then
 * (forward and fused forms) the mean of the row losses into loss, stored as
 * LOSS_DT. traffic: the bytes the traffic count gets for the row kernel
 * (the engine's calls), or < 0 for none (the eager op's). */
template <int DT, int MODE, int LOSS_DT>
static tf_status tf_cuda_ce_launch(tf_cuda_state *st, tf_cuda_ce_params p, void *loss, double traffic = -1) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  typedef typename tf_cuda_dtype<DT>::compute C;
  constexpr int VW = (int)(16 / sizeof(S));
  if (MODE == TF_CE_FUSED && tf_cuda_ce_rows<DT>(st, p)) {
    if (traffic >= 0) tf_cuda_traffic("tf_cuda_ce_row_kernel", traffic);
    TF_TRY(tf_cuda_launched("cross_entropy kernel (a block a row)"));
  } else {
    if (traffic >= 0) tf_cuda_traffic("tf_cuda_ce_kernel", traffic);
    const void *ptrs[2] = {p.x, p.dx};
    const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 2);
    const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
    p.tpr = g.tpr;
    if (vec > 1)
      tf_cuda_ce_kernel<DT, VW, MODE><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_ce_kernel<DT, 1, MODE><<<g.blocks, g.threads, 0, st->stream>>>(p);
    TF_TRY(tf_cuda_launched("cross_entropy kernel"));
  }
  if (MODE == TF_CE_BACKWARD) return TF_OK;
  tf_cuda_ce_mean_kernel<C, LOSS_DT><<<1, 1024, 0, st->stream>>>((const C *)p.row_loss, p.rows, loss);
  return tf_cuda_launched("cross_entropy mean kernel");
}

/* ---- the eager op (backend.h) -------------------------------------------------------------- */

/* Backward: the row kernel from the saved lse. Forward: the row kernel into
 * a workspace of row losses, the mean, then the first-bad word read back
 * (this syncs). */
template <int DT>
static tf_status tf_cuda_ce_typed(tf_device_ctx *ctx, tf_cuda_state *st, const tf_cross_entropy_args *a,
                                  int64_t *bad) {
  typedef typename tf_cuda_dtype<DT>::compute C;
  tf_cuda_ce_params p;
  memset(&p, 0, sizeof p);
  p.x = tf_tensor_data(a->logits);
  p.targets = (const int64_t *)tf_tensor_data(a->targets);
  p.rows = a->rows;
  p.cols = a->cols;
  if (a->backward) {
    p.lse = tf_tensor_data(a->lse);
    p.dloss = tf_tensor_data(a->dloss);
    p.dx = tf_tensor_data(a->dlogits);
    return tf_cuda_ce_launch<DT, TF_CE_BACKWARD, DT>(st, p, NULL);
  }
  p.lse = a->lse ? tf_tensor_data(a->lse) : NULL;
  tf_block *losses = NULL, *word = NULL;
  TF_TRY(tf_alloc(&ctx->alloc, (size_t)p.rows * sizeof(C), &losses));
  p.row_loss = losses->ptr;
  tf_status s = tf_cuda_bad_begin(ctx, st, &word);
  if (s == TF_OK) {
    p.first_bad = (unsigned long long *)word->ptr;
    s = tf_cuda_ce_launch<DT, TF_CE_FORWARD, DT>(st, p, tf_tensor_data(a->loss));
    tf_status e = tf_cuda_bad_end(ctx, st, word, bad);
    if (s == TF_OK) s = e;
  }
  /* Safe before the kernels finish: the block's next user queues behind them. */
  tf_alloc_free(&ctx->alloc, losses);
  return s;
}

/* The backend entry; *bad only from the forward pass. */
#define TF_CUDA_CE_CASE(DT, unused) \
  case DT: return tf_cuda_ce_typed<DT>(ctx, st, a, bad);

tf_status tf_cuda_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *a, int64_t *bad) {
  *bad = -1;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->logits->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_CE_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "cross_entropy: the CUDA backend has no kernel for dtype %s",
                 tf_dtype_name(a->logits->dtype));
}

/* ---- the engine's loss (model_kernels.h) --------------------------------------------------- */

/* The row kernel (the gradient over the logits in place when asked), then
 * the mean into the f32 loss; targets were checked before (index_check),
 * and nothing waits for the device. */
template <int DT> static tf_status tf_cuda_lm_loss_typed(tf_cuda_state *st, const tf_lm_loss_args *a) {
  tf_cuda_ce_params p;
  memset(&p, 0, sizeof p);
  p.x = a->logits;
  p.dx = a->grad ? a->logits : NULL;
  p.targets = a->targets;
  p.row_loss = a->row_loss;
  p.rows = a->rows;
  p.cols = a->vocab;
  p.scale = (double)(1.0f / (float)a->rows);
  /* the logits read (and their gradient written over them), the targets and the row losses */
  const double bytes = (double)a->rows * ((double)a->vocab * (double)sizeof(typename tf_cuda_dtype<DT>::storage) *
                                              (a->grad ? 2 : 1) + sizeof(int64_t) + sizeof(float));
  if (a->grad) return tf_cuda_ce_launch<DT, TF_CE_FUSED, TF_F32>(st, p, a->loss, bytes);
  return tf_cuda_ce_launch<DT, TF_CE_FORWARD, TF_F32>(st, p, a->loss, bytes);
}

/* The backend entry: the row kernel, then the mean. */
tf_status tf_cuda_lm_loss(tf_device_ctx *ctx, const tf_lm_loss_args *a) {
  if (a->rows == 0 || a->vocab == 0) return tf_fail(TF_ERR_ARG, "lm_loss: no rows or no classes");
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_lm_loss_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_lm_loss_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_lm_loss_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "lm_loss: the engine computes in f32, f16 or bf16, not %s", tf_dtype_name(a->dtype));
}
