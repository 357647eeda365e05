/* Softmax over each row of a contiguous rows x cols matrix, numerically
 * stable (the row's max is subtracted before exp), f32 arithmetic for any
 * element type T (float, __half, __nv_bfloat16).
 *
 *   row_softmax<BLOCK, T>(x, y, rows, cols), block = BLOCK threads:
 *     cols <= 1024: a warp a row, grid = ceil(rows / (BLOCK / 32));
 *     cols >  1024: a block a row, grid = rows.
 *   No dynamic shared memory (block reductions use tfhost.cuh's static one).
 *
 * Each thread reads its elements once into registers (16-byte loads when x
 * and y are 16-byte aligned and cols is a multiple of 16 bytes' worth of
 * elements), keeping up to CACHE of them, and writes each once: one read
 * and one write of the matrix, up to 32 CACHE columns a warp row and BLOCK
 * CACHE a block row. Longer rows take two reads: a pass for the running
 * max and sum (online, rescaled a chunk at a time), a pass that writes.
 * exp is expf (full precision), not the special-function unit's. */
#include <tfhost.cuh>

namespace row_softmax_detail {

constexpr int CACHE = 32; /* elements a thread keeps in registers */

/* Whether the row starts at 16-byte aligned addresses in both x and y and
 * its length is whole 16-byte words (so every row does). */
template <typename T> __device__ __forceinline__ bool vector_ok(const T *x, const T *y, int cols) {
  constexpr int V = 16 / sizeof(T);
  return cols % V == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15) == 0;
}

/* The softmax of one row whose elements are spread over LANES threads
 * (thread `me` of them), each keeping its CACHE values in registers: V
 * elements a chunk, chunk i of thread `me` at (i LANES + me) V. REDUCE
 * turns a thread's partial max (sum) into the row's. */
template <int V, int LANES, typename T, typename Max, typename Sum>
__device__ __forceinline__ void cached_row(const T *xr, T *yr, int cols, int me, Max row_max, Sum row_sum) {
  constexpr int CHUNKS = CACHE / V;
  typedef tf::vec<T, V> word;
  float v[CHUNKS][V];
  float m = -tf::infinity();
#pragma unroll
  for (int i = 0; i < CHUNKS; i++) {
    const int at = (i * LANES + me) * V;
    if (at < cols) {
      const word w = *reinterpret_cast<const word *>(xr + at);
#pragma unroll
      for (int u = 0; u < V; u++) v[i][u] = tf::to_float(w.v[u]);
    } else {
#pragma unroll
      for (int u = 0; u < V; u++) v[i][u] = -tf::infinity();
    }
#pragma unroll
    for (int u = 0; u < V; u++) m = fmaxf(m, v[i][u]);
  }
  m = row_max(m);
  /* a row of -inf only: every exp(-inf - -inf) would be NaN; NaN is then what the reference gives too */
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < CHUNKS; i++)
#pragma unroll
    for (int u = 0; u < V; u++) {
      v[i][u] = expf(v[i][u] - m);
      s += v[i][u];
    }
  const float inv = 1.f / row_sum(s);
#pragma unroll
  for (int i = 0; i < CHUNKS; i++) {
    const int at = (i * LANES + me) * V;
    if (at < cols) {
      word w;
#pragma unroll
      for (int u = 0; u < V; u++) w.v[u] = tf::from_float<T>(v[i][u] * inv);
      *reinterpret_cast<word *>(yr + at) = w;
    }
  }
}

/* A row too long to keep: BLOCK threads, V elements a chunk, two reads. */
template <int BLOCK, int V, typename T> __device__ __forceinline__ void streamed_row(const T *xr, T *yr, int cols) {
  typedef tf::vec<T, V> word;
  float m = -tf::infinity(), s = 0.f;
  for (int at = (int)threadIdx.x * V; at < cols; at += BLOCK * V) {
    const word w = *reinterpret_cast<const word *>(xr + at);
    float f[V], cm = m;
#pragma unroll
    for (int u = 0; u < V; u++) {
      f[u] = tf::to_float(w.v[u]);
      cm = fmaxf(cm, f[u]);
    }
    if (cm == -tf::infinity()) continue; /* nothing but -inf so far: the sum stays 0 */
    float cs = 0.f;
#pragma unroll
    for (int u = 0; u < V; u++) cs += expf(f[u] - cm);
    s = s * expf(m - cm) + cs; /* m = -inf: s is 0 and exp gives 0 */
    m = cm;
  }
  const float row_m = tf::block_max<BLOCK>(m);
  const float mine = m == -tf::infinity() ? 0.f : s * expf(m - row_m);
  const float inv = 1.f / tf::block_sum<BLOCK>(mine);
  for (int at = (int)threadIdx.x * V; at < cols; at += BLOCK * V) {
    const word w = *reinterpret_cast<const word *>(xr + at);
    word out;
#pragma unroll
    for (int u = 0; u < V; u++) out.v[u] = tf::from_float<T>(expf(tf::to_float(w.v[u]) - row_m) * inv);
    *reinterpret_cast<word *>(yr + at) = out;
  }
}

} /* namespace row_softmax_detail */

template <int BLOCK, typename T> __global__ void __launch_bounds__(BLOCK) row_softmax(const T *x, T *y, int rows, int cols) {
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK is whole warps");
  using namespace row_softmax_detail;
  constexpr int V16 = 16 / sizeof(T);
  const bool vec = vector_ok(x, y, cols);
  if (cols <= 1024) {
    const long long row = (long long)blockIdx.x * (BLOCK / 32) + threadIdx.x / 32;
    if (row >= rows) return; /* the whole warp */
    const T *xr = x + row * cols;
    T *yr = y + row * cols;
    const int lane = threadIdx.x % 32;
    auto wmax = [](float v) { return tf::warp_max(v); };
    auto wsum = [](float v) { return tf::warp_sum(v); };
    if (vec)
      cached_row<V16, 32>(xr, yr, cols, lane, wmax, wsum);
    else
      cached_row<1, 32>(xr, yr, cols, lane, wmax, wsum);
    return;
  }
  const T *xr = x + (long long)blockIdx.x * cols;
  T *yr = y + (long long)blockIdx.x * cols;
  auto bmax = [](float v) { return tf::block_max<BLOCK>(v); };
  auto bsum = [](float v) { return tf::block_sum<BLOCK>(v); };
  if (cols <= BLOCK * CACHE) {
    if (vec)
      cached_row<V16, BLOCK>(xr, yr, cols, (int)threadIdx.x, bmax, bsum);
    else
      cached_row<1, BLOCK>(xr, yr, cols, (int)threadIdx.x, bmax, bsum);
  } else if (vec) {
    streamed_row<BLOCK, V16>(xr, yr, cols);
  } else {
    streamed_row<BLOCK, 1>(xr, yr, cols);
  }
}
