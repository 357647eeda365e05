/* Embedding lookup and its gradient on the GPU, one set of kernels for the
 * eager op (backend.h: embedding) and the engine's token embedding
 * (model_kernels.h: encoder, and the index check it runs first): the twin
 * of kernels/cpu/embedding.c. Ids outside [0, vocab) are reported through the
 * first-bad word (the engine checked them before and passes none) and read
 * as id 0, so nothing is read or written out of bounds.
 *
 * The forward pass copies weight rows in the widest words the row size and
 * alignment allow. The backward pass is deterministic (the same bits every
 * run, no float atomics): (id, position) pairs are sorted by id with CUB's
 * radix sort, which is stable, so each id's positions stay in increasing
 * order; the end of each id's run is marked at its first slot; then each
 * id present adds its dout rows in position order, one thread per column:
 * from zero into the eager op's gradient (zeroed first, so rows of unused
 * ids come out zero), onto the value already there for the engine's (rows
 * of unused ids untouched), in dweight's type. */
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
      if (first_bad && w == 0) tf_cuda_report_bad(first_bad, row);
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

/* The rows a lookup copies: n ids into out, rows of row_bytes of weight. */
typedef struct tf_cuda_gather {
  const int64_t *ids;
  const void *weight;
  void *out;
  int64_t n, vocab;
  size_t row_bytes;
  unsigned long long *first_bad; /* NULL: bad ids are not reported */
} tf_cuda_gather;

template <typename W> static tf_status tf_cuda_gather_launch(tf_cuda_state *st, const tf_cuda_gather &g) {
  const int64_t words = (int64_t)(g.row_bytes / sizeof(W));
  const int64_t items = g.n * (words > 0 ? words : 1);
  tf_cuda_embedding_kernel<W><<<tf_cuda_blocks(st, items), TF_CUDA_THREADS, 0, st->stream>>>(
      g.ids, (const W *)g.weight, (W *)g.out, g.n, words, g.vocab, g.first_bad);
  return tf_cuda_launched("embedding kernel");
}

/* Picks the copy word for the row size and both pointers' alignment. */
static tf_status tf_cuda_embedding_forward(tf_cuda_state *st, const tf_cuda_gather &g) {
  switch (tf_cuda_copy_word(g.row_bytes, g.weight, g.out)) {
    case 16: return tf_cuda_gather_launch<uint4>(st, g);
    case 8: return tf_cuda_gather_launch<uint64_t>(st, g);
    case 4: return tf_cuda_gather_launch<uint32_t>(st, g);
    case 2: return tf_cuda_gather_launch<uint16_t>(st, g);
    default: return tf_cuda_gather_launch<uint8_t>(st, g);
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
      if (first_bad) tf_cuda_report_bad(first_bad, i);
      id = 0;
    }
    keys[i] = (uint32_t)id;
    positions[i] = (uint32_t)i;
  }
}

/* The run of each id present in the sorted keys: written at the run's
 * first slot, its end (0 at every other slot). */
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_embedding_runs_kernel(const uint32_t *keys, int64_t n, uint32_t *run_end) {
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

/* The gradient a backward pass adds up: dweight (vocab, dim) of dtype
 * dweight_dtype (f32 or f64) from dout (n, dim) of dtype dout_dtype. */
typedef struct tf_cuda_scatter {
  const int64_t *ids;
  const void *dout;
  void *dweight;
  tf_dtype dout_dtype, dweight_dtype;
  int64_t n, dim, vocab;
  bool add; /* onto dweight's values (rows of unused ids untouched), else from zero */
  unsigned long long *first_bad;
  void *workspace; /* tf_cuda_scatter_bytes of device memory, or NULL to borrow it */
  const char *op;  /* names the caller in messages */
} tf_cuda_scatter;

/* dweight[id][c] (+)= sum over the run of id of dout[position][c], in
 * order: block y takes run starts y, y + gridDim.y, ...; its threads take
 * V columns each (16 bytes of dout where the row and both pointers allow:
 * a column a thread left the kernel far under the copy rate). Only the ids
 * present are visited. */
template <int DT, typename A, int V>
__global__ void __launch_bounds__(1024)
    tf_cuda_embedding_sum_kernel(const void *dout, const uint32_t *keys, const uint32_t *positions,
                                 const uint32_t *run_end, A *dweight, int64_t n, int64_t dim, bool add) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  const S *src = (const S *)dout;
  const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= dim) return;
  for (int64_t s = blockIdx.y; s < n; s += gridDim.y) {
    const uint32_t end = run_end[s];
    if (end == 0) continue;
    A *row = dweight + (int64_t)keys[s] * dim + c;
    A acc[V];
    if (add) {
      tf_cuda_load_n<A, V>(row, acc);
    } else {
#pragma unroll
      for (int u = 0; u < V; u++) acc[u] = (A)0;
    }
    for (uint32_t j = (uint32_t)s; j < end; j++) {
      S v[V];
      tf_cuda_load_n<S, V>(src + (int64_t)positions[j] * dim + c, v);
#pragma unroll
      for (int u = 0; u < V; u++) acc[u] += (A)D::load(v[u]);
    }
    tf_cuda_store_n<A, V>(row, acc);
  }
}

template <int DT, typename A, int V>
static void tf_cuda_embedding_sum_launch(tf_cuda_state *st, const tf_cuda_scatter &a, const uint32_t *keys,
                                         const uint32_t *positions, const uint32_t *run_end) {
  const int64_t steps = a.dim / V;
  const int threads = steps < 1024 ? (int)((steps + 31) / 32 * 32) : 1024;
  int64_t gx = (steps + threads - 1) / threads, gy = a.n < 65535 ? a.n : 65535;
  if (gx > 65535) gx = 65535;
  dim3 grid((unsigned)gx, (unsigned)(gy > 0 ? gy : 1));
  tf_cuda_embedding_sum_kernel<DT, A, V>
      <<<grid, threads, 0, st->stream>>>(a.dout, keys, positions, run_end, (A *)a.dweight, a.n, a.dim, a.add);
}

/* 16 bytes of dout a step where every row of dout and of dweight starts
 * aligned for it, else one column. */
template <int DT, typename A>
static tf_status tf_cuda_embedding_sum(tf_cuda_state *st, const tf_cuda_scatter &a, const uint32_t *keys,
                                       const uint32_t *positions, const uint32_t *run_end) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  constexpr int VW = (int)(16 / sizeof(S));
  const void *ptrs[2] = {a.dout, a.dweight};
  if (VW > 1 && tf_cuda_row_vec(sizeof(S), a.dim, ptrs, 2) == VW)
    tf_cuda_embedding_sum_launch<DT, A, VW>(st, a, keys, positions, run_end);
  else
    tf_cuda_embedding_sum_launch<DT, A, 1>(st, a, keys, positions, run_end);
  return tf_cuda_launched("embedding backward sum kernel");
}

#define TF_CUDA_EMB_SUM_CASE(DT, A) \
  case DT: return tf_cuda_embedding_sum<DT, A>(st, a, keys, positions, run_end);

/* The sum kernel for dout's dtype and dweight's accumulation type. */
static tf_status tf_cuda_embedding_sum_dispatch(tf_cuda_state *st, const tf_cuda_scatter &a, const uint32_t *keys,
                                                const uint32_t *positions, const uint32_t *run_end) {
  if (a.dweight_dtype == TF_F64) {
    switch (a.dout_dtype) {
      TF_CUDA_FLOAT_TYPES(TF_CUDA_EMB_SUM_CASE, double)
      default: break;
    }
  } else if (a.dweight_dtype == TF_F32) {
    switch (a.dout_dtype) {
      TF_CUDA_FLOAT_TYPES(TF_CUDA_EMB_SUM_CASE, float)
      default: break;
    }
  }
  return tf_fail(TF_ERR_ARG, "%s: the CUDA backend has no kernel for dout %s into %s", a.op,
                 tf_dtype_name(a.dout_dtype), tf_dtype_name(a.dweight_dtype));
}

/* Bytes rounded up so that the arrays carved out of one block stay aligned. */
static size_t tf_cuda_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The scratch of a backward pass, carved out of one block: keys and
 * positions, their sorted copies and the run ends (list bytes each), then
 * CUB's sort space (temp bytes) for keys of end_bit bits; total bytes in all. */
typedef struct tf_cuda_scatter_scratch {
  int end_bit;
  size_t list, temp, total;
} tf_cuda_scatter_scratch;

static tf_status tf_cuda_scatter_scratch_of(tf_cuda_state *st, const tf_cuda_scatter &a, tf_cuda_scatter_scratch *s) {
  if (a.n > (int64_t)INT32_MAX || a.vocab > (int64_t)INT32_MAX)
    return tf_fail(TF_ERR_ARG,
                   "%s: the CUDA backend takes at most %d ids and a vocabulary of at most %d "
                   "(got %lld ids, vocabulary %lld)",
                   a.op, INT32_MAX, INT32_MAX, (long long)a.n, (long long)a.vocab);
  s->end_bit = 1;
  while (s->end_bit < 32 && ((int64_t)1 << s->end_bit) < a.vocab) s->end_bit++;
  s->list = tf_cuda_align256((size_t)a.n * sizeof(uint32_t));
  s->temp = 0;
  TF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, s->temp, (const uint32_t *)NULL, (uint32_t *)NULL,
                                                (const uint32_t *)NULL, (uint32_t *)NULL, (int)a.n, 0, s->end_bit,
                                                st->stream));
  s->total = s->list * 5 + tf_cuda_align256(s->temp > 0 ? s->temp : 1);
  return TF_OK;
}

/* Keys, stable sort, runs, sums: no float atomics, the same bits every
 * run. The scratch is a.workspace, or a block borrowed from the caching
 * allocator without one. */
static tf_status tf_cuda_embedding_backward(tf_device_ctx *ctx, tf_cuda_state *st, const tf_cuda_scatter &a) {
  tf_cuda_scatter_scratch sc;
  TF_TRY(tf_cuda_scatter_scratch_of(st, a, &sc));
  tf_block *work = NULL;
  char *base = (char *)a.workspace;
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
  const unsigned blocks = tf_cuda_blocks(st, a.n);
  tf_cuda_embedding_keys_kernel<<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(a.ids, a.n, a.vocab, keys, positions,
                                                                           a.first_bad);
  tf_status s = tf_cuda_launched("embedding backward keys kernel");
  if (s == TF_OK) {
    cudaError_t err = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, positions,
                                                      positions_sorted, (int)a.n, 0, sc.end_bit, st->stream);
    if (err != cudaSuccess) s = tf_cuda_error(err, "cub::DeviceRadixSort::SortPairs");
  }
  if (s == TF_OK && !a.add && a.vocab > 0 && a.dim > 0) { /* rows of unused ids are sums of nothing */
    const size_t es = a.dweight_dtype == TF_F64 ? sizeof(double) : sizeof(float);
    s = tf_cuda_memset(st, a.dweight, 0, (size_t)(a.vocab * a.dim) * es);
  }
  if (s == TF_OK) {
    tf_cuda_embedding_runs_kernel<<<blocks, TF_CUDA_THREADS, 0, st->stream>>>(keys_sorted, a.n, run_end);
    s = tf_cuda_launched("embedding backward runs kernel");
  }
  if (s == TF_OK && a.dim > 0 && a.n > 0)
    s = tf_cuda_embedding_sum_dispatch(st, a, keys_sorted, positions_sorted, run_end);
  /* Safe before the kernels finish: the block's next user queues behind it. */
  if (work) tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* ---- the eager op (backend.h) -------------------------------------------------------------- */

/* Both passes, the first-bad word around either. */
tf_status tf_cuda_embedding(tf_device_ctx *ctx, const tf_embedding_args *a, int64_t *bad) {
  *bad = -1;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_block *word = NULL;
  TF_TRY(tf_cuda_bad_begin(ctx, st, &word));
  unsigned long long *first_bad = (unsigned long long *)word->ptr;
  const int64_t *ids = (const int64_t *)tf_tensor_data(a->ids);
  tf_status s;
  if (a->backward) {
    tf_cuda_scatter sc;
    memset(&sc, 0, sizeof sc);
    sc.ids = ids, sc.dout = tf_tensor_data(a->dout), sc.dweight = tf_tensor_data(a->dweight);
    sc.dout_dtype = a->dout->dtype, sc.dweight_dtype = a->dweight->dtype;
    sc.n = a->n, sc.dim = a->dim, sc.vocab = a->vocab;
    sc.first_bad = first_bad, sc.op = "embedding_backward";
    s = tf_cuda_embedding_backward(ctx, st, sc);
  } else {
    tf_cuda_gather g = {ids, tf_tensor_data(a->weight), tf_tensor_data(a->out), a->n, a->vocab,
                        (size_t)a->dim * tf_dtype_size(a->weight->dtype), first_bad};
    s = tf_cuda_embedding_forward(st, g);
  }
  /* Read even after a failure: it waits for the queued work and frees the word. */
  tf_status e = tf_cuda_bad_end(ctx, st, word, bad);
  return s != TF_OK ? s : e;
}

/* ---- the engine's token embedding (model_kernels.h) ---------------------------------------- */

/* The engine's lookup: f32 rows, the gradient added onto dwte. */
static tf_cuda_scatter tf_cuda_encoder_scatter(const tf_encoder_args *a) {
  tf_cuda_scatter sc;
  memset(&sc, 0, sizeof sc);
  sc.ids = a->ids, sc.dout = a->dout, sc.dweight = a->dwte;
  sc.dout_dtype = TF_F32, sc.dweight_dtype = TF_F32;
  sc.n = a->n, sc.dim = a->dim, sc.vocab = a->vocab;
  sc.add = true, sc.workspace = a->workspace, sc.op = "encoder backward";
  return sc;
}

/* The scratch bytes of a backward call, planned by the engine; 0 when it cannot run. */
size_t tf_cuda_encoder_workspace(tf_device_ctx *ctx, const tf_encoder_args *a) {
  tf_cuda_scatter_scratch s;
  if (!a->backward || a->n <= 0 || !ctx->backend_state) return 0;
  if (tf_cuda_use_device(ctx) != TF_OK ||
      tf_cuda_scatter_scratch_of(tf_cuda_state_of(ctx), tf_cuda_encoder_scatter(a), &s) != TF_OK)
    return 0;
  return s.total;
}

/* Both passes; ids were checked before (tf_cuda_index_check), nothing waits. */
tf_status tf_cuda_encoder(tf_device_ctx *ctx, const tf_encoder_args *a) {
  if (a->n == 0) return TF_OK;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  /* Forward: the ids read, a row read and one written for each. Backward:
   * dout read, and a row of dwte read and written for each position (an
   * id's rows summed first where it repeats: at most this much). */
  const double nd = (double)a->n * (double)a->dim;
  if (a->backward) {
    if (a->dim > 0) tf_cuda_traffic("tf_cuda_embedding_sum_kernel", 12 * nd);
    return tf_cuda_embedding_backward(ctx, st, tf_cuda_encoder_scatter(a));
  }
  tf_cuda_traffic("tf_cuda_embedding_kernel", 8 * nd + 8.0 * (double)a->n);
  tf_cuda_gather g = {a->ids, a->wte, a->out, a->n, a->vocab, (size_t)a->dim * sizeof(float), NULL};
  return tf_cuda_embedding_forward(st, g);
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
