/* The language-model loss fused with its gradient, and the range check of
 * token ids and targets, on the GPU: twins of cpu_model.c's.
 *
 * lm_loss: one row group per row of logits. One read gives the online max
 * and sum of exp (f32) and, to the thread whose chunk holds it, the target's
 * logit; then lse = max + log(sum), that thread writes the row's loss, and
 * a second read overwrites the row in place with (softmax - onehot) / rows
 * (no probabilities stored, the logits never read again). A single block
 * then adds the row losses in a fixed order, so the mean has the same bits
 * every run. Nothing waits for the device. */
#include "cuda_common.cuh"

#include "nn_common.cuh"

typedef struct tf_cuda_lm_loss_params {
  void *logits;
  const int64_t *targets;
  float *row_loss;
  int64_t rows, vocab;
  float inv_rows;
  int tpr;
  bool grad;
} tf_cuda_lm_loss_params;

/* One row group per row: statistics and the target's logit in one read,
 * then the gradient written over the row. */
template <int DT, int V>
__global__ void __launch_bounds__(1024) tf_cuda_lm_loss_kernel(tf_cuda_lm_loss_params p) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  __shared__ tf_cuda_pair<float> scratch[32];
  tf_cuda_for_each_row(p.rows, p.tpr, [&](int64_t row, bool live, int lane) {
    const int64_t n = live ? p.vocab : 0;
    int64_t target = p.targets[row];
    if (target < 0 || target >= p.vocab) target = 0; /* checked before; never read out of bounds */
    S *x = (S *)p.logits + row * p.vocab;
    tf_cuda_pair<float> ms;
    ms.a = -INFINITY;
    ms.b = 0.0f;
    float xt = 0.0f;
    bool owner = false;
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      float v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) {
        tf_cuda_maxsum_add(ms, v[u]);
        if (c + u == target) xt = v[u], owner = true;
      }
    }
    ms = tf_cuda_group_reduce(ms, p.tpr, tf_cuda_maxsum(), scratch);
    const float lse = ms.a + logf(ms.b);
    if (owner) p.row_loss[row] = lse - xt;
    if (!p.grad) return; /* the next row */
    for (int64_t c = (int64_t)lane * V; c < n; c += (int64_t)p.tpr * V) {
      float v[V];
      tf_cuda_load_row<DT, V>(x + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) v[u] = (expf(v[u] - lse) - (c + u == target ? 1.0f : 0.0f)) * p.inv_rows;
      tf_cuda_store_row<DT, V>(x + c, v);
    }
  });
}

/* loss = mean of the row losses: each thread adds a strided share in
 * order, then the block's fixed reduction tree. */
__global__ void __launch_bounds__(1024) tf_cuda_lm_loss_mean_kernel(const float *row_loss, int64_t rows, float *loss) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) sum += row_loss[i];
  sum = tf_cuda_group_reduce(sum, (int)blockDim.x, tf_cuda_add(), scratch);
  if (threadIdx.x == 0) *loss = sum / (float)rows;
}

/* Vector width and row geometry, then the two kernels. */
template <int DT> static tf_status tf_cuda_lm_loss_typed(tf_cuda_state *st, const tf_lm_loss_args *a) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  tf_cuda_lm_loss_params p;
  p.logits = a->logits;
  p.targets = a->targets;
  p.row_loss = a->row_loss;
  p.rows = a->rows;
  p.vocab = a->vocab;
  p.inv_rows = 1.0f / (float)a->rows;
  p.grad = a->grad;
  const void *ptrs[1] = {p.logits};
  const int vec = tf_cuda_row_vec(sizeof(S), p.vocab, ptrs, 1);
  const tf_cuda_row_launch g = tf_cuda_row_geometry(st, p.rows, p.vocab, vec);
  p.tpr = g.tpr;
  if (vec > 1)
    tf_cuda_lm_loss_kernel<DT, VW><<<g.blocks, g.threads, 0, st->stream>>>(p);
  else
    tf_cuda_lm_loss_kernel<DT, 1><<<g.blocks, g.threads, 0, st->stream>>>(p);
  TF_TRY(tf_cuda_launched("lm_loss kernel"));
  tf_cuda_lm_loss_mean_kernel<<<1, 1024, 0, st->stream>>>(p.row_loss, p.rows, a->loss);
  return tf_cuda_launched("lm_loss mean kernel");
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

/* ---- index check ------------------------------------------------------------------------- */

/* Every bad index reports its position; the smallest wins. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_index_check_kernel(const int64_t *idx, int64_t n, int64_t limit, unsigned long long *first_bad) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (idx[i] < 0 || idx[i] >= limit) tf_cuda_report_bad(first_bad, i);
}

/* The one place the engine waits for the device in a step: the host needs the answer. */
tf_status tf_cuda_index_check(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit, int64_t *bad) {
  *bad = -1;
  if (n == 0) return TF_OK;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_block *word = NULL;
  TF_TRY(tf_cuda_bad_begin(ctx, st, &word));
  tf_cuda_index_check_kernel<<<tf_cuda_blocks(st, n), TF_CUDA_THREADS, 0, st->stream>>>(
      idx, n, limit, (unsigned long long *)word->ptr);
  tf_status s = tf_cuda_launched("index check kernel");
  /* Read even after a failure: it waits for the queued work and frees the word. */
  tf_status e = tf_cuda_bad_end(ctx, st, word, bad);
  return s != TF_OK ? s : e;
}
