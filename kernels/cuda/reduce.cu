/* Reductions on the GPU over a contiguous (outer, r, inner) view: sum,
 * mean, max and min. Floats accumulate in float (f64 in double), integers
 * in int64 with wrapping sums; max/min propagate NaN like the CPU twin
 * (kernels/cpu/reduce.c, which accumulates float sums in double, so sums of many
 * floats agree to rounding, not to the bit).
 *
 * One kernel covers every shape. A block of 256 threads reduces a tile of
 * `cols` outputs with `lanes` threads per output (cols * lanes = 256):
 * threads of one output walk r in steps of `lanes`, then combine by warp
 * shuffles and one round through shared memory. Rows (inner == 1) put an
 * output's lanes side by side, so a warp reads consecutive elements of a
 * row; columns (inner > 1) put neighbouring outputs side by side, so a warp
 * reads consecutive columns. When the outputs alone cannot fill the GPU
 * (a full reduction, say) r is split over gridDim.y blocks that write
 * partials in the accumulation type, and a second pass reduces those. */
#include "cuda_common.cuh"

#include <math.h>

/* How an op folds values: 0 sum (and mean), 1 max, 2 min. */
enum { TF_CUDA_FOLD_SUM, TF_CUDA_FOLD_MAX, TF_CUDA_FOLD_MIN };

/* The accumulation type of a dtype: float for f32/f16/bf16, double for
 * f64, int64 for the integers (the elementwise compute type). */
template <int DT> struct tf_cuda_reduce_type {
  typedef typename tf_cuda_dtype<DT>::compute acc;
};

/* Identities and arithmetic per accumulation type. */
template <typename A> struct tf_cuda_limits;
template <> struct tf_cuda_limits<float> {
  static __device__ __forceinline__ float lowest() { return -INFINITY; }
  static __device__ __forceinline__ float highest() { return INFINITY; }
  static __device__ __forceinline__ bool isnan(float v) { return v != v; }
  static __device__ __forceinline__ float add(float x, float y) { return x + y; }
};
template <> struct tf_cuda_limits<double> {
  static __device__ __forceinline__ double lowest() { return -INFINITY; }
  static __device__ __forceinline__ double highest() { return INFINITY; }
  static __device__ __forceinline__ bool isnan(double v) { return v != v; }
  static __device__ __forceinline__ double add(double x, double y) { return x + y; }
};
template <> struct tf_cuda_limits<int64_t> {
  static __device__ __forceinline__ int64_t lowest() { return INT64_MIN; }
  static __device__ __forceinline__ int64_t highest() { return INT64_MAX; }
  static __device__ __forceinline__ bool isnan(int64_t) { return false; }
  /* Wraps instead of overflowing, as the CPU's uint64 add does. */
  static __device__ __forceinline__ int64_t add(int64_t x, int64_t y) { return (int64_t)((uint64_t)x + (uint64_t)y); }
};

/* The fold of one op: its identity and how two partial results combine
 * (a NaN on either side wins, so any NaN makes max/min NaN). */
template <int FOLD, typename A> struct tf_cuda_fold;
template <typename A> struct tf_cuda_fold<TF_CUDA_FOLD_SUM, A> {
  static __device__ __forceinline__ A identity() { return (A)0; }
  static __device__ __forceinline__ A combine(A x, A y) { return tf_cuda_limits<A>::add(x, y); }
};
template <typename A> struct tf_cuda_fold<TF_CUDA_FOLD_MAX, A> {
  static __device__ __forceinline__ A identity() { return tf_cuda_limits<A>::lowest(); }
  static __device__ __forceinline__ A combine(A x, A y) {
    if (tf_cuda_limits<A>::isnan(x)) return x;
    return (tf_cuda_limits<A>::isnan(y) || y > x) ? y : x;
  }
};
template <typename A> struct tf_cuda_fold<TF_CUDA_FOLD_MIN, A> {
  static __device__ __forceinline__ A identity() { return tf_cuda_limits<A>::highest(); }
  static __device__ __forceinline__ A combine(A x, A y) {
    if (tf_cuda_limits<A>::isnan(x)) return x;
    return (tf_cuda_limits<A>::isnan(y) || y < x) ? y : x;
  }
};

typedef struct tf_cuda_reduce_args {
  const void *src; /* (outer, r, inner): the input's storage, or partials of the accumulation type */
  void *dst;       /* (outer, inner) results, or (outer, splits, inner) partials */
  int64_t outer, r, inner;
  int64_t nout;    /* outer * inner */
  int64_t chunk;   /* elements of r per split; gridDim.y splits */
  int cols;        /* outputs per block (a power of two); lanes = 256 / cols */
  bool rows;       /* inner == 1: an output's lanes are adjacent threads */
  int64_t mean_of; /* > 0: the final result is divided by this count */
} tf_cuda_reduce_args;

/* Combines the `lanes` per-thread values of each output of the tile; the
 * result is valid in the thread with lane 0. Every thread must call it. */
template <int FOLD, typename A>
__device__ __forceinline__ A tf_cuda_tile_combine(A v, const tf_cuda_reduce_args &p, int col, int lane, A *held) {
  typedef tf_cuda_fold<FOLD, A> F;
  const int lanes = TF_CUDA_THREADS / p.cols;
  /* Lanes of one output within a warp, and how many threads apart they are. */
  const int apart = p.rows ? 1 : p.cols;
  const int per_warp = p.rows ? min(lanes, 32) : max(32 / p.cols, 1);
  for (int off = apart * per_warp / 2; off >= apart; off /= 2) v = F::combine(v, __shfl_down_sync(0xffffffffu, v, off));
  if (per_warp == lanes) return v; /* one warp held all lanes of each output */
  held[threadIdx.x] = v;
  __syncthreads();
  if (lane == 0)
    for (int t = per_warp; t < lanes; t += per_warp)
      v = F::combine(v, held[p.rows ? col * lanes + t : t * p.cols + col]);
  __syncthreads();
  return v;
}

/* One pass over src, read as the dtype's storage (first pass) or as
 * partials of the accumulation type (FROM_PARTIALS); TO_PARTIALS writes
 * partials instead of results. */
template <int DT, int FOLD, bool FROM_PARTIALS, bool TO_PARTIALS>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_reduce_kernel(tf_cuda_reduce_args p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename tf_cuda_reduce_type<DT>::acc A;
  typedef tf_cuda_fold<FOLD, A> F;
  typedef typename D::storage S;
  __shared__ A held[TF_CUDA_THREADS];
  const int lanes = TF_CUDA_THREADS / p.cols;
  const int col = p.rows ? (int)threadIdx.x / lanes : (int)threadIdx.x % p.cols;
  const int lane = p.rows ? (int)threadIdx.x % lanes : (int)threadIdx.x / p.cols;
  const int64_t k0 = (int64_t)blockIdx.y * p.chunk;
  const int64_t k1 = min(p.r, k0 + p.chunk);
  const int64_t tiles = (p.nout + p.cols - 1) / p.cols;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j = tile * p.cols + col;
    const bool valid = j < p.nout;
    int64_t o = 0, i = 0;
    A a0 = F::identity(), a1 = a0, a2 = a0, a3 = a0;
    if (valid) {
      o = p.rows ? j : j / p.inner;
      i = j - o * p.inner;
      const int64_t step = (int64_t)lanes * p.inner;
      int64_t k = k0 + lane;
      if (FROM_PARTIALS) {
        const A *at = (const A *)p.src + (o * p.r + k) * p.inner + i;
        for (; k + 7 * lanes < k1; k += 8 * lanes, at += 8 * step) {
          A v[8];
#pragma unroll
          for (int u = 0; u < 8; u++) v[u] = at[u * step];
          a0 = F::combine(a0, F::combine(v[0], v[4]));
          a1 = F::combine(a1, F::combine(v[1], v[5]));
          a2 = F::combine(a2, F::combine(v[2], v[6]));
          a3 = F::combine(a3, F::combine(v[3], v[7]));
        }
#pragma unroll 4
        for (; k < k1; k += lanes, at += step) a0 = F::combine(a0, at[0]);
      } else {
        const S *at = (const S *)p.src + (o * p.r + k) * p.inner + i;
        for (; k + 7 * lanes < k1; k += 8 * lanes, at += 8 * step) {
          S v[8];
#pragma unroll
          for (int u = 0; u < 8; u++) v[u] = at[u * step];
          a0 = F::combine(a0, F::combine((A)D::load(v[0]), (A)D::load(v[4])));
          a1 = F::combine(a1, F::combine((A)D::load(v[1]), (A)D::load(v[5])));
          a2 = F::combine(a2, F::combine((A)D::load(v[2]), (A)D::load(v[6])));
          a3 = F::combine(a3, F::combine((A)D::load(v[3]), (A)D::load(v[7])));
        }
#pragma unroll 4
        for (; k < k1; k += lanes, at += step) a0 = F::combine(a0, (A)D::load(at[0]));
      }
    }
    A v = tf_cuda_tile_combine<FOLD, A>(F::combine(F::combine(a0, a1), F::combine(a2, a3)), p, col, lane, held);
    if (!valid || lane != 0) continue;
    if (TO_PARTIALS) {
      ((A *)p.dst)[(o * gridDim.y + blockIdx.y) * p.inner + i] = v;
    } else {
      if (p.mean_of > 0) v = v / (A)p.mean_of;
      ((S *)p.dst)[j] = D::store(v);
    }
  }
}

/* Smallest power of two >= n, at most 256. */
static int tf_cuda_pow2_upto_256(int64_t n) {
  int p = 1;
  while (p < 256 && p < n) p *= 2;
  return p;
}

/* The tile shape for reducing r elements per output with the given inner
 * stride. Rows give an output enough lanes (up to 256) for 8 elements each,
 * 16 past r = 128: one or two rounds of the 8-deep loop (short rows
 * otherwise leave too few loads in flight, long ones pay the block combine
 * per tile). Columns keep 32 (or inner, if
 * fewer) neighbouring outputs per warp-row and give each output up to 8
 * lanes, fewer when r is shorter. */
static void tf_cuda_reduce_tile(tf_cuda_reduce_args *p) {
  p->rows = p->inner == 1;
  int lanes;
  if (p->rows) {
    int64_t per_lane = p->r <= 128 ? 8 : 16;
    lanes = tf_cuda_pow2_upto_256((p->r + per_lane - 1) / per_lane);
  } else {
    int min_cols = tf_cuda_pow2_upto_256(p->inner < 32 ? p->inner : 32);
    lanes = tf_cuda_pow2_upto_256(p->r);
    if (lanes > TF_CUDA_THREADS / min_cols) lanes = TF_CUDA_THREADS / min_cols;
  }
  p->cols = TF_CUDA_THREADS / lanes;
}

typedef void (*tf_cuda_reduce_kernel_fn)(tf_cuda_reduce_args);

/* Queues one pass with gridDim.y = splits. */
static tf_status tf_cuda_reduce_run(tf_cuda_state *st, tf_cuda_reduce_kernel_fn kernel, const tf_cuda_reduce_args &p,
                                    int64_t grid_x, int64_t splits) {
  dim3 grid((unsigned)grid_x, (unsigned)splits);
  kernel<<<grid, TF_CUDA_THREADS, 0, st->stream>>>(p);
  return tf_cuda_launched("reduce kernel");
}

/* Runs one reduction: directly when the outputs fill the GPU, else as a
 * split pass into a workspace from the device's caching allocator and a
 * second pass over the partials. */
template <int DT, int FOLD>
static tf_status tf_cuda_reduce_typed(tf_device_ctx *ctx, tf_cuda_state *st, const tf_tensor *a, int64_t outer,
                                      int64_t r, int64_t inner, tf_tensor *out, bool mean) {
  typedef typename tf_cuda_reduce_type<DT>::acc A;
  tf_cuda_reduce_args p;
  p.src = tf_tensor_data(a);
  p.dst = tf_tensor_data(out);
  p.outer = outer, p.r = r, p.inner = inner;
  p.nout = outer * inner;
  p.mean_of = mean ? r : 0;
  tf_cuda_reduce_tile(&p);
  const int lanes = TF_CUDA_THREADS / p.cols;
  const int64_t tiles = (p.nout + p.cols - 1) / p.cols;
  /* Blocks resident at once on the whole GPU: one wave, no tail. */
  static int per_sm = 0;
  if (per_sm == 0) {
    TF_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, tf_cuda_reduce_kernel<DT, FOLD, false, true>, TF_CUDA_THREADS, 0));
    if (per_sm < 1) per_sm = 1;
  }
  const int64_t fill = (int64_t)st->multiprocessors * per_sm;
  const int64_t grid_x = tiles < fill * 4 ? tiles : fill * 4;
  /* Split r when the tiles leave SMs idle and each split still gives every
   * lane at least 32 elements. */
  int64_t splits = 1;
  if (tiles < fill) {
    int64_t want = (fill + tiles - 1) / tiles;
    int64_t most = r / ((int64_t)lanes * 32);
    splits = want < most ? want : most;
    if (splits < 1) splits = 1;
  }
  p.chunk = (r + splits - 1) / splits;
  splits = (r + p.chunk - 1) / p.chunk;
  if (splits == 1) return tf_cuda_reduce_run(st, tf_cuda_reduce_kernel<DT, FOLD, false, false>, p, grid_x, 1);

  tf_block *work = NULL;
  TF_TRY(tf_alloc(&ctx->alloc, (size_t)(outer * splits * inner) * sizeof(A), &work));
  tf_cuda_reduce_args partial = p;
  partial.dst = work->ptr;
  tf_status s = tf_cuda_reduce_run(st, tf_cuda_reduce_kernel<DT, FOLD, false, true>, partial, grid_x, splits);
  if (s == TF_OK) {
    tf_cuda_reduce_args second = p;
    second.src = work->ptr;
    second.r = splits;
    tf_cuda_reduce_tile(&second);
    second.chunk = splits;
    int64_t tiles2 = (second.nout + second.cols - 1) / second.cols;
    s = tf_cuda_reduce_run(st, tf_cuda_reduce_kernel<DT, FOLD, true, false>, second,
                           tiles2 < fill * 4 ? tiles2 : fill * 4, 1);
  }
  /* Safe before the kernels finish: the block's next user queues on the
   * same stream, behind them. */
  tf_alloc_free(&ctx->alloc, work);
  return s;
}

/* Maps an op to its fold: mean is a sum with a final division. */
template <int DT>
static tf_status tf_cuda_reduce_fold(tf_device_ctx *ctx, tf_cuda_state *st, tf_reduce_op op, const tf_tensor *a,
                                     int64_t outer, int64_t r, int64_t inner, tf_tensor *out) {
  switch (op) {
    case TF_REDUCE_SUM: return tf_cuda_reduce_typed<DT, TF_CUDA_FOLD_SUM>(ctx, st, a, outer, r, inner, out, false);
    case TF_REDUCE_MEAN: return tf_cuda_reduce_typed<DT, TF_CUDA_FOLD_SUM>(ctx, st, a, outer, r, inner, out, true);
    case TF_REDUCE_MAX: return tf_cuda_reduce_typed<DT, TF_CUDA_FOLD_MAX>(ctx, st, a, outer, r, inner, out, false);
    case TF_REDUCE_MIN: return tf_cuda_reduce_typed<DT, TF_CUDA_FOLD_MIN>(ctx, st, a, outer, r, inner, out, false);
    default: return tf_fail(TF_ERR_ARG, "reduce: unknown op %d", (int)op);
  }
}

#define TF_CUDA_REDUCE_CASE(DT, unused) \
  case DT: return tf_cuda_reduce_fold<DT>(ctx, st, op, a, outer, r, inner, out);

/* Checks what the kernels assume (results in the input dtype, which is the
 * dispatcher's rule; mean only of floats), then dispatches by dtype. */
tf_status tf_cuda_reduce(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                         int64_t inner, tf_tensor *out) {
  if (out->dtype != a->dtype)
    return tf_fail(TF_ERR_ARG, "reduce: the CUDA backend writes results in the input dtype (%s), not %s",
                   tf_dtype_name(a->dtype), tf_dtype_name(out->dtype));
  if (op == TF_REDUCE_MEAN && !tf_dtype_is_float(a->dtype))
    return tf_fail(TF_ERR_ARG, "mean needs a floating dtype, not %s", tf_dtype_name(a->dtype));
  if (outer * inner == 0 || r == 0) return TF_OK;
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_REDUCE_CASE, 0)
    TF_CUDA_INT_TYPES(TF_CUDA_REDUCE_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "reduce: no kernel for dtype %s", tf_dtype_name(a->dtype));
}
