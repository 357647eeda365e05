/* Embedding lookup and its gradient on the GPU: the twin of cpu_nn.c's
 * embedding. Ids outside [0, vocab) are reported through the first-bad
 * word and read as id 0, so nothing is read or written out of bounds.
 *
 * The forward pass copies weight rows in the widest words the row size and
 * alignment allow. The backward pass is deterministic (the same bits every
 * run, no float atomics): (id, position) pairs are sorted by id with CUB's
 * radix sort, which is stable, so each id's positions stay in increasing
 * order; the first and last slot of each id's run are marked; then every
 * vocabulary row adds its dout rows in position order (rows of unused ids
 * come out zero), one thread per column. */
#include "cuda_common.cuh"

#include <cub/device/device_radix_sort.cuh>

#include "nn_common.cuh"

/* ---- forward ------------------------------------------------------------- */

template <typename W>
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_embedding_kernel(const int64_t *ids, const W *weight, W *out, int64_t n, int64_t words, int64_t vocab,
                             unsigned long long *first_bad) {
  /* A row of no words still has its id checked. */
  const int64_t per = words > 0 ? words : 1;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * per; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / per, w = i - row * per;
    int64_t id = ids[row];
    if (id < 0 || id >= vocab) {
      if (w == 0) tf_cuda_report_bad(first_bad, row);
      id = 0;
    }
    if (words > 0) out[row * words + w] = weight[id * words + w];
  }
}

/* The widest word (16, 8, 4, 2 or 1 bytes) that divides a row and the
 * alignment of both base pointers. */
static int tf_cuda_copy_word(size_t row_bytes, const void *a, const void *b) {
  for (int w = 16; w > 1; w /= 2)
    if (row_bytes % (size_t)w == 0 && (uintptr_t)a % (uintptr_t)w == 0 && (uintptr_t)b % (uintptr_t)w == 0) return w;
  return 1;
}

template <typename W>
static tf_status tf_cuda_embedding_launch(tf_cuda_state *st, const tf_embedding_args *a, size_t row_bytes,
                                          unsigned long long *first_bad) {
  const int64_t words = (int64_t)(row_bytes / sizeof(W));
  const int64_t items = a->n * (words > 0 ? words : 1);
  tf_cuda_embedding_kernel<W><<<tf_cuda_blocks(st, items), TF_CUDA_THREADS, 0, st->stream>>>(
      (const int64_t *)tf_tensor_data(a->ids), (const W *)tf_tensor_data(a->weight), (W *)tf_tensor_data(a->out),
      a->n, words, a->vocab, first_bad);
  return tf_cuda_launched("embedding kernel");
}

/* Picks the copy word for the row size and both pointers' alignment. */
static tf_status tf_cuda_embedding_forward(tf_cuda_state *st, const tf_embedding_args *a,
                                           unsigned long long *first_bad) {
  const size_t row_bytes = (size_t)a->dim * tf_dtype_size(a->weight->dtype);
  switch (tf_cuda_copy_word(row_bytes, tf_tensor_data(a->weight), tf_tensor_data(a->out))) {
    case 16: return tf_cuda_embedding_launch<uint4>(st, a, row_bytes, first_bad);
    case 8: return tf_cuda_embedding_launch<uint64_t>(st, a, row_bytes, first_bad);
    case 4: return tf_cuda_embedding_launch<uint32_t>(st, a, row_bytes, first_bad);
    case 2: return tf_cuda_embedding_launch<uint16_t>(st, a, row_bytes, first_bad);
    default: return tf_cuda_embedding_launch<uint8_t>(st, a, row_bytes, first_bad);
  }
}

/* ---- backward ------------------------------------------------------------ */

/* Sort input: key = id (a bad one reported and read as 0), value = position. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_embedding_keys_kernel(const int64_t *ids, int64_t n, int64_t vocab, uint32_t *keys, uint32_t *positions,
                                  unsigned long long *first_bad) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t id = ids[i];
    if (id < 0 || id >= vocab) {
      tf_cuda_report_bad(first_bad, i);
      id = 0;
    }
    keys[i] = (uint32_t)id;
    positions[i] = (uint32_t)i;
  }
}

/* Marks each id's run in the sorted keys: [start[id], end[id]) (both zero
 * beforehand, so unused ids have empty runs). One writer per entry. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_embedding_runs_kernel(const uint32_t *keys, int64_t n, uint32_t *start, uint32_t *end) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t k = keys[i];
    if (i == 0 || keys[i - 1] != k) start[k] = (uint32_t)i;
    if (i == n - 1 || keys[i + 1] != k) end[k] = (uint32_t)(i + 1);
  }
}

/* dweight[v][c] = sum over the run of v of dout[position][c], in order. */
template <int DT, typename A>
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_embedding_sum_kernel(const void *dout, const uint32_t *positions, const uint32_t *start,
                                 const uint32_t *end, A *dweight, int64_t vocab, int64_t dim) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  const S *src = (const S *)dout;
  for (int64_t v = blockIdx.y; v < vocab; v += gridDim.y) {
    const uint32_t j0 = start[v], j1 = end[v];
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += (int64_t)gridDim.x * blockDim.x) {
      A acc = 0;
      for (uint32_t j = j0; j < j1; j++) acc += (A)D::load(src[(int64_t)positions[j] * dim + c]);
      dweight[v * dim + c] = acc;
    }
  }
}

template <int DT, typename A>
static tf_status tf_cuda_embedding_sum(tf_cuda_state *st, const tf_embedding_args *a, const uint32_t *positions,
                                       const uint32_t *start, const uint32_t *end) {
  int64_t gx = (a->dim + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS, gy = a->vocab < 65535 ? a->vocab : 65535;
  if (gx > 65535) gx = 65535;
  dim3 grid((unsigned)gx, (unsigned)(gy > 0 ? gy : 1));
  tf_cuda_embedding_sum_kernel<DT, A><<<grid, TF_CUDA_THREADS, 0, st->stream>>>(
      tf_tensor_data(a->dout), positions, start, end, (A *)tf_tensor_data(a->dweight), a->vocab, a->dim);
  return tf_cuda_launched("embedding backward sum kernel");
}

#define TF_CUDA_EMB_SUM_CASE(DT, A) \
  case DT: return tf_cuda_embedding_sum<DT, A>(st, a, positions, start, end);

/* The sum kernel for dout's dtype and dweight's accumulation type. */
static tf_status tf_cuda_embedding_sum_dispatch(tf_cuda_state *st, const tf_embedding_args *a,
                                                const uint32_t *positions, const uint32_t *start,
                                                const uint32_t *end) {
  if (a->dweight->dtype == TF_F64) {
    switch (a->dout->dtype) {
      TF_CUDA_FLOAT_TYPES(TF_CUDA_EMB_SUM_CASE, double)
      default: break;
    }
  } else if (a->dweight->dtype == TF_F32) {
    switch (a->dout->dtype) {
      TF_CUDA_FLOAT_TYPES(TF_CUDA_EMB_SUM_CASE, float)
      default: break;
    }
  }
  return tf_fail(TF_ERR_ARG, "embedding_backward: the CUDA backend has no kernel for dout %s into %s",
                 tf_dtype_name(a->dout->dtype), tf_dtype_name(a->dweight->dtype));
}

/* Bytes rounded up so that the arrays carved out of one block stay aligned. */
static size_t tf_cuda_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* Workspace: keys and positions, their sorted copies, run starts and ends
 * (one block), plus CUB's temporary storage (another). */
static tf_status tf_cuda_embedding_backward(tf_device_ctx *ctx, tf_cuda_state *st, const tf_embedding_args *a,
                                            unsigned long long *first_bad) {
  if (a->n > (int64_t)INT32_MAX || a->vocab > (int64_t)INT32_MAX)
    return tf_fail(TF_ERR_ARG,
                   "embedding_backward: the CUDA backend takes at most %d ids and a vocabulary of at most %d "
                   "(got %lld ids, vocabulary %lld)",
                   INT32_MAX, INT32_MAX, (long long)a->n, (long long)a->vocab);
  const int n = (int)a->n;
  int end_bit = 1;
  while (end_bit < 32 && ((int64_t)1 << end_bit) < a->vocab) end_bit++;
  const size_t list = tf_cuda_align256((size_t)n * sizeof(uint32_t));
  const size_t runs = tf_cuda_align256((size_t)a->vocab * sizeof(uint32_t));
  size_t temp_bytes = 0;
  TF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                                (const uint32_t *)NULL, (uint32_t *)NULL, n, 0, end_bit,
                                                st->stream));
  tf_block *work = NULL, *temp = NULL;
  TF_TRY(tf_alloc(&ctx->alloc, list * 4 + runs * 2, &work));
  tf_status s = tf_alloc(&ctx->alloc, temp_bytes > 0 ? temp_bytes : 1, &temp);
  if (s != TF_OK) {
    tf_alloc_free(&ctx->alloc, work);
    return s;
  }
  char *base = (char *)work->ptr;
  uint32_t *keys = (uint32_t *)base, *positions = (uint32_t *)(base + list);
  uint32_t *keys_sorted = (uint32_t *)(base + 2 * list), *positions_sorted = (uint32_t *)(base + 3 * list);
  uint32_t *start = (uint32_t *)(base + 4 * list), *end = (uint32_t *)(base + 4 * list + runs);
  const unsigned blocks = tf_cuda_blocks(st, a->n);
  tf_cuda_embedding_keys_kernel<<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(
      (const int64_t *)tf_tensor_data(a->ids), a->n, a->vocab, keys, positions, first_bad);
  s = tf_cuda_launched("embedding backward keys kernel");
  if (s == TF_OK) {
    cudaError_t err = cub::DeviceRadixSort::SortPairs(temp->ptr, temp_bytes, keys, keys_sorted, positions,
                                                      positions_sorted, n, 0, end_bit, st->stream);
    if (err != cudaSuccess) s = tf_cuda_error(err, "cub::DeviceRadixSort::SortPairs");
  }
  if (s == TF_OK) {
    cudaError_t err = cudaMemsetAsync(start, 0, runs * 2, st->stream);
    if (err != cudaSuccess) s = tf_cuda_error(err, "cudaMemsetAsync");
  }
  if (s == TF_OK) {
    tf_cuda_embedding_runs_kernel<<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(keys_sorted, a->n, start, end);
    s = tf_cuda_launched("embedding backward runs kernel");
  }
  if (s == TF_OK && a->dim > 0 && a->vocab > 0) s = tf_cuda_embedding_sum_dispatch(st, a, positions_sorted, start, end);
  /* Safe before the kernels finish: the blocks' next users queue behind them. */
  tf_alloc_free(&ctx->alloc, temp);
  tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* The backend entry of both passes: the first-bad word around either. */
tf_status tf_cuda_embedding(tf_device_ctx *ctx, const tf_embedding_args *a, int64_t *bad) {
  *bad = -1;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_block *word = NULL;
  TF_TRY(tf_cuda_bad_begin(ctx, st, &word));
  unsigned long long *first_bad = (unsigned long long *)word->ptr;
  tf_status s = a->backward ? tf_cuda_embedding_backward(ctx, st, a, first_bad)
                            : tf_cuda_embedding_forward(st, a, first_bad);
  /* Read even after a failure: it waits for the queued work and frees the word. */
  tf_status e = tf_cuda_bad_end(ctx, st, word, bad);
  return s != TF_OK ? s : e;
}
