/* The engine's token embedding on the GPU, the twin of cpu_model.c's
 * encoder. Ids were range-checked by the engine; a bad one still reads as
 * 0, so nothing is read or written out of bounds.
 *
 * The backward pass adds each position's gradient row into its id's row of
 * dwte, deterministically: (id, position) pairs sorted by id with CUB's
 * stable radix sort (positions stay in increasing order within an id), the
 * run of each id marked, then one thread per (id, column) adds the id's
 * rows in position order onto the value already there, in f32: the very
 * additions the CPU twin makes, so both give the same bits. */
#include "cuda_common.cuh"

#include <cub/device/device_radix_sort.cuh>

/* out[i] = wte[ids[i]], one thread per element. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_encoder_kernel(const int64_t *ids, const float *wte, float *out, int64_t n, int64_t dim, int64_t vocab) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * dim; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / dim, c = i - row * dim;
    int64_t id = ids[row];
    if (id < 0 || id >= vocab) id = 0;
    out[i] = wte[id * dim + c];
  }
}

/* The sort's input: key = id (a bad one read as 0), value = position. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_encoder_keys_kernel(const int64_t *ids, int64_t n, int64_t vocab, uint32_t *keys, uint32_t *positions) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t id = ids[i];
    if (id < 0 || id >= vocab) id = 0;
    keys[i] = (uint32_t)id;
    positions[i] = (uint32_t)i;
  }
}

/* The run of each id present in the sorted keys: its start, and (written
 * at the run's first slot) its end. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_encoder_runs_kernel(const uint32_t *keys, int64_t n, uint32_t *run_end) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i > 0 && keys[i - 1] == keys[i]) {
      run_end[i] = 0; /* not a run's first slot */
      continue;
    }
    int64_t j = i + 1;
    while (j < n && keys[j] == keys[i]) j++;
    run_end[i] = (uint32_t)j;
  }
}

/* Block y takes run starts y, y + gridDim.y, ...; its threads take columns. */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_encoder_sum_kernel(const float *dout, const uint32_t *keys, const uint32_t *positions,
                               const uint32_t *run_end, float *dwte, int64_t n, int64_t dim) {
  for (int64_t s = blockIdx.y; s < n; s += gridDim.y) {
    const uint32_t end = run_end[s];
    if (end == 0) continue;
    const int64_t id = keys[s];
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += (int64_t)gridDim.x * blockDim.x) {
      float acc = dwte[id * dim + c];
      for (uint32_t j = (uint32_t)s; j < end; j++) acc += dout[(int64_t)positions[j] * dim + c];
      dwte[id * dim + c] = acc;
    }
  }
}

/* Keeps the arrays carved out of one block aligned. */
static size_t tf_cuda_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The backward pass's scratch: five lists of n u32 (keys, positions, both
 * sorted, run ends), list bytes each, then CUB's sort space (temp bytes)
 * for keys of end_bit bits; total bytes in all. */
typedef struct tf_cuda_encoder_scratch {
  int end_bit;
  size_t list, temp, total;
} tf_cuda_encoder_scratch;

static tf_status tf_cuda_encoder_scratch_of(tf_cuda_state *st, const tf_encoder_args *a, tf_cuda_encoder_scratch *s) {
  if (a->n > (int64_t)INT32_MAX || a->vocab > (int64_t)INT32_MAX)
    return tf_fail(TF_ERR_ARG, "encoder backward: at most %d ids and a vocabulary of at most %d", INT32_MAX,
                   INT32_MAX);
  s->end_bit = 1;
  while (s->end_bit < 32 && ((int64_t)1 << s->end_bit) < a->vocab) s->end_bit++;
  s->list = tf_cuda_align256((size_t)a->n * sizeof(uint32_t));
  s->temp = 0;
  TF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, s->temp, (const uint32_t *)NULL, (uint32_t *)NULL,
                                                (const uint32_t *)NULL, (uint32_t *)NULL, (int)a->n, 0, s->end_bit,
                                                st->stream));
  s->total = s->list * 5 + tf_cuda_align256(s->temp > 0 ? s->temp : 1);
  return TF_OK;
}

/* The scratch bytes of a backward call (model_kernels.h); 0 when it cannot run. */
size_t tf_cuda_encoder_workspace(tf_device_ctx *ctx, const tf_encoder_args *a) {
  tf_cuda_encoder_scratch s;
  if (!a->backward || a->n <= 0 || !ctx->backend_state) return 0;
  if (tf_cuda_use_device(ctx) != TF_OK || tf_cuda_encoder_scratch_of(tf_cuda_state_of(ctx), a, &s) != TF_OK) return 0;
  return s.total;
}

/* Keys, stable sort, runs, sums: no float atomics, the same bits every
 * run. The scratch is a->workspace, or a block borrowed from the caching
 * allocator without one. */
static tf_status tf_cuda_encoder_backward(tf_device_ctx *ctx, tf_cuda_state *st, const tf_encoder_args *a) {
  tf_cuda_encoder_scratch sc;
  TF_TRY(tf_cuda_encoder_scratch_of(st, a, &sc));
  const int n = (int)a->n;
  tf_block *work = NULL;
  char *base = (char *)a->workspace;
  if (!base) {
    TF_TRY(tf_alloc(&ctx->alloc, sc.total, &work));
    base = (char *)work->ptr;
  }
  const size_t list = sc.list;
  uint32_t *keys = (uint32_t *)base, *positions = (uint32_t *)(base + list);
  uint32_t *keys_sorted = (uint32_t *)(base + 2 * list), *positions_sorted = (uint32_t *)(base + 3 * list);
  uint32_t *run_end = (uint32_t *)(base + 4 * list);
  void *temp = base + 5 * list;
  size_t temp_bytes = sc.temp;
  const unsigned blocks = tf_cuda_blocks(st, a->n);
  tf_cuda_encoder_keys_kernel<<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(a->ids, a->n, a->vocab, keys, positions);
  tf_status s = tf_cuda_launched("encoder backward keys kernel");
  if (s == TF_OK) {
    cudaError_t err = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, positions, positions_sorted,
                                                      n, 0, sc.end_bit, st->stream);
    if (err != cudaSuccess) s = tf_cuda_error(err, "cub::DeviceRadixSort::SortPairs");
  }
  if (s == TF_OK) {
    tf_cuda_encoder_runs_kernel<<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(keys_sorted, a->n, run_end);
    s = tf_cuda_launched("encoder backward runs kernel");
  }
  if (s == TF_OK && a->dim > 0) {
    int64_t gx = (a->dim + TF_CUDA_THREADS - 1) / TF_CUDA_THREADS, gy = a->n < 65535 ? a->n : 65535;
    if (gx > 65535) gx = 65535;
    tf_cuda_encoder_sum_kernel<<<dim3((unsigned)gx, (unsigned)gy), TF_CUDA_THREADS, 0, st->stream>>>(
        a->dout, keys_sorted, positions_sorted, run_end, a->dwte, a->n, a->dim);
    s = tf_cuda_launched("encoder backward sum kernel");
  }
  /* Safe before the kernels finish: the block's next user queues behind them. */
  if (work) tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* The backend entry of both passes. */
tf_status tf_cuda_encoder(tf_device_ctx *ctx, const tf_encoder_args *a) {
  if (a->n == 0) return TF_OK;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (a->backward) return tf_cuda_encoder_backward(ctx, st, a);
  tf_cuda_encoder_kernel<<<tf_cuda_blocks(st, a->n * a->dim), TF_CUDA_THREADS, 0, st->stream>>>(
      a->ids, a->wte, a->out, a->n, a->dim, a->vocab);
  return tf_cuda_launched("encoder kernel");
}
