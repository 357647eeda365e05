/* Mean cross-entropy of logits against integer targets, and its gradient,
 * on the GPU: the twin of cpu_nn.c's cross_entropy. The forward pass is
 * softmax's online max-and-sum per row (one read of the logits, no
 * probabilities stored) giving lse = max + log(sum) and the row's loss
 * lse - x[target]; a single block then adds the row losses in a fixed
 * order, so the mean has the same bits every run. A target outside
 * [0, V) is reported through the first-bad word and read as class 0, so
 * nothing is read out of bounds. The backward pass needs no reduction:
 * dlogits = (exp(x - lse) - onehot) * dloss / N, dloss read on the device. */
#include "cuda_common.cuh"

#include "opmath.h"
#include "nn_common.cuh"

typedef struct tf_cuda_ce_params {
  const void *x;
  const int64_t *targets;
  void *lse;      /* statistics dtype; forward: may be NULL */
  void *row_loss; /* forward: statistics dtype, one per row */
  const void *dloss; /* backward: one value of the statistics dtype */
  void *dx;          /* backward */
  int64_t rows, cols;
  int tpr;
  unsigned long long *first_bad;
} tf_cuda_ce_params;

template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_ce_forward_kernel(tf_cuda_ce_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ tf_cuda_pair<C> scratch[32];
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.cols : 0;
    const S *x = (const S *)p.x + row * p.cols;
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
    if (live && lane == 0) {
      const C lse = ms.a + tf_log(ms.b);
      int64_t t = p.targets[row];
      if (t < 0 || t >= p.cols) {
        tf_cuda_report_bad(p.first_bad, row);
        t = 0;
      }
      ((C *)p.row_loss)[row] = lse - D::load(x[t]);
      if (p.lse) ((C *)p.lse)[row] = lse;
    }
  });
}

/* loss = mean of the row losses: one block, each thread adding a strided
 * share in order, then the block's fixed reduction tree. */
template <int DT>
__global__ void __launch_bounds__(1024) tf_cuda_ce_mean_kernel(const void *row_loss, int64_t rows, void *loss) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::compute C;
  __shared__ C scratch[32];
  C sum = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) sum += ((const C *)row_loss)[i];
  sum = tf_cuda_group_reduce(sum, (int)blockDim.x, tf_cuda_add(), scratch);
  if (threadIdx.x == 0) *(typename D::storage *)loss = D::store(sum / (C)rows);
}

/* dlogits = (exp(x - lse) - (c == target)) * dloss / rows; a target out of
 * range matches no class. */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_ce_backward_kernel(tf_cuda_ce_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  const int groups = (int)blockDim.x / p.tpr, lane = (int)threadIdx.x % p.tpr;
  const C scale = *(const C *)p.dloss / (C)p.rows;
  for (int64_t base = (int64_t)blockIdx.x * groups; base < p.rows; base += (int64_t)gridDim.x * groups) {
    const int64_t row = base + (int)threadIdx.x / p.tpr;
    if (row >= p.rows) continue; /* no reduction here: threads may leave */
    const S *x = (const S *)p.x + row * p.cols;
    S *dx = (S *)p.dx + row * p.cols;
    const C lse = ((const C *)p.lse)[row];
    const int64_t t = p.targets[row];
    for (int64_t c = (int64_t)lane * V; c < p.cols; c += (int64_t)p.tpr * V) {
      C v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] = (tf_exp(v[u] - lse) - (c + u == t ? (C)1 : (C)0)) * scale;
      tf_cuda_store_row<DT, V>(dx + c, v);
    }
  }
}

/* Backward: one row kernel. Forward: the row kernel into a workspace of row
 * losses, the mean kernel, then the first-bad word read back (this syncs). */
template <int DT>
static tf_status tf_cuda_ce_typed(tf_device_ctx *ctx, tf_cuda_state *st, const tf_cross_entropy_args *a,
                                  int64_t *bad) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  typedef typename tf_cuda_dtype<DT>::compute C;
  constexpr int VW = (int)(16 / sizeof(S));
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
    const void *ptrs[2] = {p.x, p.dx};
    const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 2);
    const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
    p.tpr = g.tpr;
    if (vec > 1)
      tf_cuda_ce_backward_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_ce_backward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
    return tf_cuda_launched("cross_entropy backward kernel");
  }
  p.lse = a->lse ? tf_tensor_data(a->lse) : NULL;
  tf_block *losses = NULL, *word = NULL;
  TF_TRY(tf_alloc(&ctx->alloc, (size_t)p.rows * sizeof(C), &losses));
  p.row_loss = losses->ptr;
  tf_status s = tf_cuda_bad_begin(ctx, st, &word);
  if (s == TF_OK) {
    p.first_bad = (unsigned long long *)word->ptr;
    const void *ptrs[1] = {p.x};
    const int vec = tf_cuda_row_vec(sizeof(S), p.cols, ptrs, 1);
    const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.cols, vec);
    p.tpr = g.tpr;
    if (vec > 1)
      tf_cuda_ce_forward_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
    else
      tf_cuda_ce_forward_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
    s = tf_cuda_launched("cross_entropy kernel");
    if (s == TF_OK) {
      tf_cuda_ce_mean_kernel<DT><<<1, 1024, 0, st->stream>>>(p.row_loss, p.rows, tf_tensor_data(a->loss));
      s = tf_cuda_launched("cross_entropy mean kernel");
    }
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
