/* What the fused neural-network kernels share: row groups (a power-of-two
 * number of threads working on one row, several groups per block), their
 * reductions (warp shuffles, then shared memory across warps, always in
 * the same order so results never depend on timing), vector loads of a
 * row's elements, and the device word that index checks report the first
 * bad index through. Include after cuda_common.cuh. */
#ifndef TF_NN_COMMON_CUH
#define TF_NN_COMMON_CUH

#include "cuda_common.cuh"

#include "opmath.h"

#include <math.h>
#include <string.h>

/* ---- shuffles and row-group reductions ---------------------------------- */

template <typename C> struct tf_cuda_pair {
  C a, b;
};

__device__ __forceinline__ float tf_cuda_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ double tf_cuda_shfl_xor(double v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
template <typename C>
__device__ __forceinline__ tf_cuda_pair<C> tf_cuda_shfl_xor(tf_cuda_pair<C> v, int mask) {
  tf_cuda_pair<C> r;
  r.a = tf_cuda_shfl_xor(v.a, mask);
  r.b = tf_cuda_shfl_xor(v.b, mask);
  return r;
}

struct tf_cuda_add {
  template <typename C> __device__ __forceinline__ C operator()(C x, C y) const { return x + y; }
  template <typename C>
  __device__ __forceinline__ tf_cuda_pair<C> operator()(tf_cuda_pair<C> x, tf_cuda_pair<C> y) const {
    tf_cuda_pair<C> r;
    r.a = x.a + y.a;
    r.b = x.b + y.b;
    return r;
  }
};

/* The grid-stride loop of the row kernels: groups of tpr threads, one row
 * each, over rows. body(row, live, lane) runs once per step on every thread
 * of the block; a thread past the last row gets live = false and its
 * group's first row (a valid index), so it still joins the block's
 * reductions (tf_cuda_group_reduce) without reading or writing for it. */
template <class F>
__device__ __forceinline__ void tf_cuda_for_each_row(int64_t rows, int tpr, F body) {
  const int groups = (int)blockDim.x / tpr, lane = (int)threadIdx.x % tpr;
  for (int64_t base = (int64_t)blockIdx.x * groups; base < rows; base += (int64_t)gridDim.x * groups) {
    const int64_t r = base + (int)threadIdx.x / tpr;
    const bool live = r < rows;
    body(live ? r : base, live, lane);
  }
}

/* Combines v over the tpr threads of each row group (tpr a power of two,
 * 32..1024, groups aligned to multiples of tpr; or the whole block, tpr =
 * blockDim.x, any multiple of 32); every thread gets the result. scratch holds one value per warp of the block. Every thread of
 * the block must call it (it synchronises the block when tpr > 32). */
template <typename T, class F>
__device__ __forceinline__ T tf_cuda_group_reduce(T v, int tpr, F combine, T *scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = combine(v, tf_cuda_shfl_xor(v, off));
  if (tpr <= 32) return v;
  const int warp = (int)threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  const int first = ((int)threadIdx.x / tpr) * (tpr / 32);
  v = scratch[first];
  for (int w = 1; w < tpr / 32; w++) v = combine(v, scratch[first + w]);
  __syncthreads();
  return v;
}

/* ---- online softmax statistics ----------------------------------------- */

/* Pairs (max m, sum of exp(x - m)) of two parts of a row, merged. When both
 * maxima are -inf (a row masked so far) the sums just add: they are counts
 * that a later finite max scales to zero, and an all -inf row ends as NaN,
 * as in PyTorch and on the CPU. */
struct tf_cuda_maxsum {
  template <typename C>
  __device__ __forceinline__ tf_cuda_pair<C> operator()(tf_cuda_pair<C> x, tf_cuda_pair<C> y) const {
    tf_cuda_pair<C> r;
    r.a = x.a > y.a ? x.a : y.a;
    if (r.a == (C)-INFINITY)
      r.b = x.b + y.b;
    else
      r.b = x.b * tf_exp(x.a - r.a) + y.b * tf_exp(y.a - r.a);
    return r;
  }
};

/* The larger of two values (a NaN loses to a number: the caller's sums carry it). */
struct tf_cuda_max {
  template <typename C> __device__ __forceinline__ C operator()(C x, C y) const { return x > y ? x : y; }
};

/* Adds element v to a thread's running pair (a NaN element makes the sum NaN). */
template <typename C> __device__ __forceinline__ void tf_cuda_maxsum_add(tf_cuda_pair<C> &ms, C v) {
  if (v > ms.a) {
    ms.b = ms.b * tf_exp(ms.a - v) + (C)1;
    ms.a = v;
  } else {
    ms.b += v == ms.a ? (C)1 : tf_exp(v - ms.a);
  }
}

/* ---- row geometry ------------------------------------------------------- */

/* How a row kernel is launched: tpr threads per row, blocks of `threads`
 * (a multiple of tpr), `blocks` of them looping over the rows. */
typedef struct tf_cuda_row_launch {
  int tpr, threads;
  unsigned blocks;
} tf_cuda_row_launch;

/* Gives a row about four vector loads per thread (wider groups for longer
 * rows, up to 1024 threads), widens the groups further when the rows alone
 * cannot fill the GPU, and caps the grid at a few waves. */
static inline tf_cuda_row_launch tf_cuda_row_geometry(const tf_cuda_state *st, int64_t rows, int64_t cols, int vec) {
  int64_t chunks = (cols + vec - 1) / vec;
  int tpr = 32;
  while (tpr < 1024 && (int64_t)tpr * 4 < chunks) tpr *= 2;
  const int64_t resident = (int64_t)st->multiprocessors * 2048;
  while (tpr < 1024 && rows * tpr < resident && (int64_t)tpr * 2 <= chunks) tpr *= 2;
  tf_cuda_row_launch g;
  g.tpr = tpr;
  g.threads = tpr < 256 ? 256 : tpr;
  int64_t per_block = g.threads / tpr;
  int64_t blocks = (rows + per_block - 1) / per_block;
  int64_t cap = (int64_t)st->multiprocessors * (2048 / g.threads) * 8;
  if (blocks > cap) blocks = cap;
  g.blocks = blocks < 1 ? 1u : (unsigned)blocks;
  return g;
}

/* ---- vector access to rows ---------------------------------------------- */

/* Loads N consecutive elements at p: 16-byte loads when N elements fill
 * whole 16-byte words (the caller guarantees the alignment), else one by one. */
template <typename T, int N> __device__ __forceinline__ void tf_cuda_load_n(const T *p, T (&out)[N]) {
  if constexpr (N > 1 && (N * sizeof(T)) % 16 == 0) {
#pragma unroll
    for (int w = 0; w < (int)(N * sizeof(T) / 16); w++) {
      uint4 raw = reinterpret_cast<const uint4 *>(p)[w];
      memcpy(reinterpret_cast<char *>(out) + 16 * w, &raw, 16);
    }
  } else {
#pragma unroll
    for (int u = 0; u < N; u++) out[u] = p[u];
  }
}

template <typename T, int N> __device__ __forceinline__ void tf_cuda_store_n(T *p, const T (&in)[N]) {
  if constexpr (N > 1 && (N * sizeof(T)) % 16 == 0) {
#pragma unroll
    for (int w = 0; w < (int)(N * sizeof(T) / 16); w++) {
      uint4 raw;
      memcpy(&raw, reinterpret_cast<const char *>(in) + 16 * w, 16);
      reinterpret_cast<uint4 *>(p)[w] = raw;
    }
  } else {
#pragma unroll
    for (int u = 0; u < N; u++) p[u] = in[u];
  }
}

/* V elements of dtype DT at p, widened to the compute type. */
template <int DT, int V>
__device__ __forceinline__ void tf_cuda_load_row(const typename tf_cuda_dtype<DT>::storage *p,
                                                 typename tf_cuda_dtype<DT>::compute (&out)[V]) {
  typename tf_cuda_dtype<DT>::storage raw[V];
  tf_cuda_load_n<typename tf_cuda_dtype<DT>::storage, V>(p, raw);
#pragma unroll
  for (int u = 0; u < V; u++) out[u] = tf_cuda_dtype<DT>::load(raw[u]);
}

template <int DT, int V>
__device__ __forceinline__ void tf_cuda_store_row(typename tf_cuda_dtype<DT>::storage *p,
                                                  const typename tf_cuda_dtype<DT>::compute (&in)[V]) {
  typename tf_cuda_dtype<DT>::storage raw[V];
#pragma unroll
  for (int u = 0; u < V; u++) raw[u] = tf_cuda_dtype<DT>::store(in[u]);
  tf_cuda_store_n<typename tf_cuda_dtype<DT>::storage, V>(p, raw);
}

/* The vector width a row kernel may use: 16 bytes of elements when every
 * row of every operand starts on a 16-byte boundary, else 1. */
static inline int tf_cuda_row_vec(size_t elsize, int64_t cols, const void *const *ptrs, int nptrs) {
  int vec = (int)(16 / elsize);
  if (vec < 1 || cols % vec != 0) return 1;
  for (int i = 0; i < nptrs; i++)
    if (ptrs[i] && ((uintptr_t)ptrs[i] % 16) != 0) return 1;
  return vec;
}

/* ---- first-bad-index reports -------------------------------------------- */

/* A kernel that meets a bad index records its position with
 * tf_cuda_report_bad (the smallest position wins, so the report names the
 * first one whatever the timing); the host reads it back once the work is
 * done. The read waits for the stream: acceptable on this error path's
 * ops (embedding, cross_entropy), the price of never reading out of
 * bounds. */
__device__ __forceinline__ void tf_cuda_report_bad(unsigned long long *first_bad, int64_t pos) {
  atomicMin(first_bad, (unsigned long long)pos);
}

static inline tf_status tf_cuda_bad_begin(tf_device_ctx *ctx, tf_cuda_state *st, tf_block **word) {
  TF_TRY(tf_alloc(&ctx->alloc, sizeof(unsigned long long), word));
  tf_status s = tf_cuda_memset(st, (*word)->ptr, 0xff, sizeof(unsigned long long));
  if (s != TF_OK) {
    tf_alloc_free(&ctx->alloc, *word);
    *word = NULL;
  }
  return s;
}

/* Reads the word back (waiting for the stream) into *bad (-1: none) and frees it. */
static inline tf_status tf_cuda_bad_end(tf_device_ctx *ctx, tf_cuda_state *st, tf_block *word, int64_t *bad) {
  unsigned long long v = ~0ull;
  cudaError_t err = cudaMemcpyAsync(&v, word->ptr, sizeof v, cudaMemcpyDeviceToHost, st->stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st->stream);
  tf_alloc_free(&ctx->alloc, word);
  if (err != cudaSuccess) return tf_cuda_error(err, "cudaMemcpyAsync");
  *bad = v == ~0ull ? -1 : (int64_t)v;
  return TF_OK;
}

#endif
