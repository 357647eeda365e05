/* Rotary position embedding on the GPU, the twin of kernels/cpu/rope.c: the eager
 * rope op (backend.h) and the engine's attention layout kernels
 * (model_kernels.h: rope_heads, heads), the pairs of both turned by one
 * rule (rope.h: tf_rope_inv_freq, tf_rope_turn).
 *
 * rope: one thread per pair (x[2k], x[2k+1]) of a row at position pos,
 * turned by pos * theta^(-2k/d) (by minus that for the inverse, the
 * backward pass). Both backends take the angle by the same double-precision
 * operations, so they rotate by the same angles: the frequencies come from
 * the host's pow (tf_rope_inv_freq) and travel in the kernel's arguments
 * (rows of up to 2 * TF_CUDA_ROPE_TABLE elements, every head size in use;
 * longer rows use the device's pow, which may differ in the last bit); the
 * product pos * frequency is one correctly rounded multiply (no fused
 * multiply-add). The cosine and sine are taken in double, then rounded to
 * the compute type.
 *
 * rope_heads: the fused q/k/v projection (B, T, 3, H, hd) into heads
 * (B, H, T, hd) with RoPE on q and k from the engine's cos/sin table (made
 * by the same rule, model_plan.c), one thread per pair; backward moves the
 * gradients back, turned by minus the angle. heads: (B, H, T, hd) <->
 * (B, T, H hd), rows of hd moved in the widest word the row size and
 * alignment allow. */
#include "cuda_common.cuh"

#include <math.h>
#include <string.h>

#include "rope.h"

enum { TF_CUDA_ROPE_TABLE = 256 };

typedef struct tf_cuda_rope_params {
  const void *x;
  void *y;
  const int64_t *positions; /* one per row, or NULL: row % seq */
  int64_t rows, cols, seq;
  double theta;
  bool inverse;
  bool table; /* inv_freq holds the cols / 2 frequencies */
  double inv_freq[TF_CUDA_ROPE_TABLE];
} tf_cuda_rope_params;

/* The table is read in place (__grid_constant__: no per-thread copy of the
 * arguments) into shared memory once per block. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_rope_kernel(const __grid_constant__ tf_cuda_rope_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  typedef typename D::compute C;
  __shared__ double inv_freq[TF_CUDA_ROPE_TABLE];
  const int64_t half = p.cols / 2, total = p.rows * half;
  if (p.table)
    for (int k = threadIdx.x; k < half; k += blockDim.x) inv_freq[k] = p.inv_freq[k];
  __syncthreads();
  const S *x = (const S *)p.x;
  S *y = (S *)p.y;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / half, k = i - row * half;
    const int64_t pos = p.positions ? p.positions[row] : row % p.seq;
    const double freq = p.table ? inv_freq[k] : tf_rope_inv_freq(p.theta, k, p.cols);
    const double angle = __dmul_rn((double)pos, freq);
    double sn, cs;
    sincos(angle, &sn, &cs);
    const C c = (C)cs, s = p.inverse ? -(C)sn : (C)sn;
    const int64_t at = row * p.cols + 2 * k;
    C y0, y1;
    tf_rope_turn<C>(D::load(x[at]), D::load(x[at + 1]), c, s, &y0, &y1);
    y[at] = D::store(y0);
    y[at + 1] = D::store(y1);
  }
}

/* The backend entry: the frequency table filled on the host, then one kernel. */
#define TF_CUDA_ROPE_CASE(DT, unused)                                                        \
  case DT:                                                                                   \
    tf_cuda_rope_kernel<DT><<<tf_cuda_blocks(st, p.rows * half), TF_CUDA_THREADS, 0, st->stream>>>(p); \
    return tf_cuda_launched("rope kernel");

tf_status tf_cuda_rope(tf_device_ctx *ctx, const tf_rope_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  tf_cuda_rope_params p;
  memset(&p, 0, sizeof p);
  p.x = tf_tensor_data(a->x);
  p.y = tf_tensor_data(a->y);
  p.positions = a->positions ? (const int64_t *)tf_tensor_data(a->positions) : NULL;
  p.rows = a->rows;
  p.cols = a->cols;
  p.seq = a->seq > 0 ? a->seq : 1;
  p.theta = a->theta;
  p.inverse = a->inverse;
  const int64_t half = a->cols / 2;
  p.table = half <= TF_CUDA_ROPE_TABLE;
  if (p.table)
    for (int64_t k = 0; k < half; k++) p.inv_freq[k] = tf_rope_inv_freq(a->theta, k, a->cols);
  switch (a->x->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_ROPE_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "rope: the CUDA backend has no kernel for dtype %s", tf_dtype_name(a->x->dtype));
}

/* ---- rope_heads --------------------------------------------------------------------- */

typedef struct tf_cuda_rope_heads_params {
  const float *cos, *sin;
  void *qkv, *q, *k, *v;
  int64_t batch, seq, heads, head_dim;
  bool backward;
} tf_cuda_rope_heads_params;

/* One thread per pair (b, t, q|k|v, head, i), read and written in layout order. */
template <int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_rope_heads_kernel(tf_cuda_rope_heads_params p) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  const int64_t H = p.heads, hd = p.head_dim, half = hd / 2, d = H * hd, T = p.seq;
  const int64_t total = p.batch * T * 3 * H * half;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % half, rest = i / half, h = rest % H, rest2 = rest / H;
    const int part = (int)(rest2 % 3);
    const int64_t bt = rest2 / 3, t = bt % T, b = bt / T;
    const int64_t row = bt * 3 * d + part * d + h * hd + 2 * k, hrow = ((b * H + h) * T + t) * hd + 2 * k;
    S *heads = (S *)(part == 0 ? p.q : part == 1 ? p.k : p.v);
    S *qkv = (S *)p.qkv;
    const float c = part < 2 ? p.cos[t * half + k] : 1.0f, s = part < 2 ? p.sin[t * half + k] : 0.0f;
    float y0, y1;
    if (!p.backward) {
      tf_rope_turn<float>(D::load(qkv[row]), D::load(qkv[row + 1]), c, s, &y0, &y1);
      heads[hrow] = D::store(y0);
      heads[hrow + 1] = D::store(y1);
    } else {
      tf_rope_turn<float>(D::load(heads[hrow]), D::load(heads[hrow + 1]), c, -s, &y0, &y1);
      qkv[row] = D::store(y0);
      qkv[row + 1] = D::store(y1);
    }
  }
}

/* One 16-byte word of VEC elements of part 0 q, 1 k or 2 v turned (q and
 * k, by the pairs' angles from cs and sn; backward, the other way) or
 * moved as it is (v). */
template <int DT, int VEC>
__device__ __forceinline__ uint4 tf_cuda_rope_heads_turn(uint4 word, int part, bool backward, const float *cs,
                                                         const float *sn) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::storage S;
  if (part == 2) return word;
  union {
    uint4 word;
    S v[VEC];
  } in, out;
  in.word = word;
#pragma unroll
  for (int j = 0; j < VEC / 2; j++) {
    float y0, y1;
    tf_rope_turn<float>(D::load(in.v[2 * j]), D::load(in.v[2 * j + 1]), cs[j], backward ? -sn[j] : sn[j], &y0, &y1);
    out.v[2 * j] = D::store(y0);
    out.v[2 * j + 1] = D::store(y1);
  }
  return out.word;
}

/* One 16-byte word between qkv (at row) and a head (at hrow, of part 0 q,
 * 1 k or 2 v), forward or backward. */
template <int DT, int VEC>
__device__ __forceinline__ void tf_cuda_rope_heads_word(const tf_cuda_rope_heads_params &p, int64_t row,
                                                        int64_t hrow, int part, const float *cs, const float *sn) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  S *heads = (S *)(part == 0 ? p.q : part == 1 ? p.k : p.v);
  S *qkv = (S *)p.qkv;
  const uint4 in = *(const uint4 *)(p.backward ? heads + hrow : qkv + row);
  *(uint4 *)(p.backward ? qkv + row : heads + hrow) = tf_cuda_rope_heads_turn<DT, VEC>(in, part, p.backward, cs, sn);
}

/* The same, VEC elements (16 bytes) per thread: a run of VEC elements of a
 * qkv row lies in one head of one of q, k, v when head_dim is a multiple
 * of VEC, and moves as one 16-byte word each way. Index arithmetic in I
 * (32 bits when everything fits). Each pair of q and k is turned by the
 * very operations of the kernel above, so the bits are the same; v is
 * moved as it is (the kernel above turns it by cos 1 and sin 0, which
 * differs only in the sign of a zero or where a neighbour is not finite). */
template <int DT, int VEC, typename I>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_rope_heads_vec_kernel(tf_cuda_rope_heads_params p) {
  static_assert(VEC * sizeof(typename tf_cuda_dtype<DT>::storage) == sizeof(uint4), "one 16-byte word per thread");
  const I H = (I)p.heads, hd = (I)p.head_dim, half = hd / 2, d = H * hd, T = (I)p.seq;
  const I per_row = 3 * d / VEC, total = (I)p.batch * T * per_row;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
    const I bt = i / per_row, e = (i - bt * per_row) * VEC;
    const I part = e / d, rem = e - part * d, h = rem / hd, at = rem - h * hd;
    const I t = bt % T, b = bt / T;
    const I row = bt * 3 * d + e, hrow = ((b * H + h) * T + t) * hd + at;
    tf_cuda_rope_heads_word<DT, VEC>(p, row, hrow, (int)part, p.cos + t * half + at / 2, p.sin + t * half + at / 2);
  }
}

/* The same per 16-byte word, from a grid of (parts x word blocks, seq /
 * TT, batch): a block's TT rows (b, t..t+TT-1) and part (q, k or v) come
 * from its indices, so a thread divides only by hd / VEC (32-bit) to find
 * its head; it loads its word of each of the TT rows before turning and
 * storing any (TT loads waiting on memory together, and each head's TT
 * rows written as one run of the heads layout). The 64-bit divisions of
 * the grid-stride kernel above held it well under the copy rate, and one
 * row a block leaves fewer loads in flight. */
enum { TF_CUDA_ROPE_ROWS = 4 };
template <int DT, int VEC>
__global__ void __launch_bounds__(1024) tf_cuda_rope_heads_rows_kernel(tf_cuda_rope_heads_params p, int part_blocks) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  enum { TT = TF_CUDA_ROPE_ROWS, PAIRS = VEC / 2 };
  const int hdw = (int)p.head_dim / VEC, dw = (int)p.heads * hdw, half = (int)p.head_dim / 2;
  const int part = (int)blockIdx.x / part_blocks;
  const int word = ((int)blockIdx.x - part * part_blocks) * (int)blockDim.x + (int)threadIdx.x;
  if (word >= dw) return;
  const int h = word / hdw, at = (word - h * hdw) * VEC;
  const int64_t t0 = (int64_t)blockIdx.y * TT, b = blockIdx.z, d = p.heads * p.head_dim;
  S *heads = (S *)(part == 0 ? p.q : part == 1 ? p.k : p.v);
  S *qkv = (S *)p.qkv;
  const int64_t row0 = (b * p.seq + t0) * 3 * d + part * d + (int64_t)word * VEC;
  const int64_t hrow0 = ((b * p.heads + h) * p.seq + t0) * p.head_dim + at;
  uint4 in[TT];
  float cs[TT][PAIRS], sn[TT][PAIRS];
#pragma unroll
  for (int j = 0; j < TT; j++) {
    if (t0 + j >= p.seq) break;
    in[j] = *(const uint4 *)(p.backward ? heads + hrow0 + j * p.head_dim : qkv + row0 + j * 3 * d);
    if (part == 2) continue;
#pragma unroll
    for (int u = 0; u < PAIRS; u++) {
      cs[j][u] = p.cos[(t0 + j) * half + at / 2 + u];
      sn[j][u] = p.sin[(t0 + j) * half + at / 2 + u];
    }
  }
#pragma unroll
  for (int j = 0; j < TT; j++) {
    if (t0 + j >= p.seq) break;
    const uint4 out = tf_cuda_rope_heads_turn<DT, VEC>(in[j], part, p.backward, cs[j], sn[j]);
    *(uint4 *)(p.backward ? qkv + row0 + j * 3 * d : heads + hrow0 + j * p.head_dim) = out;
  }
}

static bool tf_cuda_aligned16(const void *ptr) { return ((uintptr_t)ptr & 15) == 0; }

/* Arguments by value; one grid-stride kernel (16 bytes per thread where
 * the head size and the buffers' alignment allow). */
template <int DT> static tf_status tf_cuda_rope_heads_typed(tf_cuda_state *st, const tf_rope_heads_args *a) {
  tf_cuda_rope_heads_params p;
  p.cos = a->cos;
  p.sin = a->sin;
  p.qkv = a->qkv;
  p.q = a->q;
  p.k = a->k;
  p.v = a->v;
  p.batch = a->batch;
  p.seq = a->seq;
  p.heads = a->heads;
  p.head_dim = a->head_dim;
  p.backward = a->backward;
  const int64_t total = a->batch * a->seq * 3 * a->heads * (a->head_dim / 2);
  if (total == 0) return TF_OK;
  enum { VEC = (int)(sizeof(uint4) / sizeof(typename tf_cuda_dtype<DT>::storage)) };
  /* q, k and v (total pairs) read and written, one way or the other (cos and sin not counted) */
  const double moved = 4.0 * (double)total * (double)sizeof(typename tf_cuda_dtype<DT>::storage);
  if (a->head_dim % VEC == 0 && tf_cuda_aligned16(a->qkv) && tf_cuda_aligned16(a->q) && tf_cuda_aligned16(a->k) &&
      tf_cuda_aligned16(a->v)) {
    const int64_t words = total * 2 / VEC, dw = a->heads * a->head_dim / VEC;
    if (a->seq <= 65535 && a->batch <= 65535 && dw <= INT32_MAX / 2) {
      const int threads = dw < 1024 ? (int)((dw + 31) / 32 * 32) : 1024;
      const int part_blocks = (int)((dw + threads - 1) / threads);
      tf_cuda_rope_heads_rows_kernel<DT, VEC>
          <<<dim3(3 * (unsigned)part_blocks, (unsigned)((a->seq + TF_CUDA_ROPE_ROWS - 1) / TF_CUDA_ROPE_ROWS),
                  (unsigned)a->batch),
              threads, 0, st->stream>>>(p, part_blocks);
      tf_cuda_traffic("tf_cuda_rope_heads_rows_kernel", moved);
    } else {
      if (words * VEC < INT32_MAX)
        tf_cuda_rope_heads_vec_kernel<DT, VEC, int32_t><<<tf_cuda_blocks(st, words), TF_CUDA_THREADS, 0, st->stream>>>(p);
      else
        tf_cuda_rope_heads_vec_kernel<DT, VEC, int64_t><<<tf_cuda_blocks(st, words), TF_CUDA_THREADS, 0, st->stream>>>(p);
      tf_cuda_traffic("tf_cuda_rope_heads_vec_kernel", moved);
    }
    return tf_cuda_launched("rope_heads kernel");
  }
  tf_cuda_rope_heads_kernel<DT><<<tf_cuda_blocks(st, total), TF_CUDA_THREADS, 0, st->stream>>>(p);
  tf_cuda_traffic("tf_cuda_rope_heads_kernel", moved);
  return tf_cuda_launched("rope_heads kernel");
}

/* The backend entry: one kernel per compute dtype. */
tf_status tf_cuda_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (a->dtype) {
    case TF_F32: return tf_cuda_rope_heads_typed<TF_F32>(st, a);
    case TF_F16: return tf_cuda_rope_heads_typed<TF_F16>(st, a);
    case TF_BF16: return tf_cuda_rope_heads_typed<TF_BF16>(st, a);
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "rope_heads: the engine computes in f32, f16 or bf16, not %s", tf_dtype_name(a->dtype));
}

/* ---- heads ---------------------------------------------------------------------------------- */

/* Word w of every row of hd elements: rows are (b, h, t) in heads layout
 * and (b, t, h) in merged layout. */
template <typename W>
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_heads_kernel(const W *src, W *dst, int64_t batch, int64_t seq, int64_t heads, int64_t words, bool split) {
  const int64_t total = batch * seq * heads * words;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t w = i % words, r = i / words;
    /* r enumerates the destination's rows */
    int64_t b, t, h;
    if (split) { /* dst (b, h, t) */
      t = r % seq, h = (r / seq) % heads, b = r / (seq * heads);
    } else { /* dst (b, t, h) */
      h = r % heads, t = (r / heads) % seq, b = r / (heads * seq);
    }
    const int64_t merged = (b * seq + t) * heads + h, split_row = (b * heads + h) * seq + t;
    dst[i] = src[(split ? merged : split_row) * words + w];
  }
}

/* The same for TF_CUDA_HEADS_ROWS merged rows (b, t), t = R blockIdx.y
 * onwards, of blockIdx.z = b: a thread per word of a row (heads * words),
 * dividing only by words (32-bit) to find its head, all its loads issued
 * before its stores. The R rows are consecutive on both sides (a head's
 * rows are consecutive in the heads layout): a little faster than one row
 * a block in the 2.7B step. */
enum { TF_CUDA_HEADS_ROWS = 4 };
template <typename W>
__global__ void __launch_bounds__(1024)
    tf_cuda_heads_rows_kernel(const W *src, W *dst, int64_t seq, int heads, int words, bool split) {
  enum { R = TF_CUDA_HEADS_ROWS };
  const int j = (int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x;
  if (j >= heads * words) return;
  const int h = j / words, w = j - h * words;
  const int64_t t0 = (int64_t)blockIdx.y * R, b = blockIdx.z;
  const int n = seq - t0 < R ? (int)(seq - t0) : R;
  const int64_t merged = ((b * seq + t0) * heads + h) * words + w, split_at = ((b * heads + h) * seq + t0) * words + w;
  const int64_t merged_step = (int64_t)heads * words;
  const W *from = src + (split ? merged : split_at);
  W *to = dst + (split ? split_at : merged);
  const int64_t from_step = split ? merged_step : words, to_step = split ? words : merged_step;
  W v[R];
#pragma unroll
  for (int i = 0; i < R; i++)
    if (i < n) v[i] = from[i * from_step];
#pragma unroll
  for (int i = 0; i < R; i++)
    if (i < n) to[i * to_step] = v[i];
}

/* The kernel for word type W (row bytes divisible by its size). */
template <typename W> static tf_status tf_cuda_heads_launch(tf_cuda_state *st, const tf_heads_args *a, size_t row) {
  const int64_t words = (int64_t)(row / sizeof(W)), total = a->batch * a->seq * a->heads * words;
  if (total == 0) return TF_OK;
  const int64_t row_words = a->heads * words, row_groups = (a->seq + TF_CUDA_HEADS_ROWS - 1) / TF_CUDA_HEADS_ROWS;
  if (row_groups <= 65535 && a->batch <= 65535 && row_words <= INT32_MAX / 2) {
    const int threads = row_words < 1024 ? (int)((row_words + 31) / 32 * 32) : 1024;
    const unsigned blocks = (unsigned)((row_words + threads - 1) / threads);
    tf_cuda_heads_rows_kernel<W><<<dim3(blocks, (unsigned)row_groups, (unsigned)a->batch), threads, 0, st->stream>>>(
        (const W *)a->src, (W *)a->dst, a->seq, (int)a->heads, (int)words, a->split);
    tf_cuda_traffic("tf_cuda_heads_rows_kernel", 2.0 * (double)total * sizeof(W)); /* read once, written once */
  } else {
    tf_cuda_heads_kernel<W><<<tf_cuda_blocks(st, total), TF_CUDA_THREADS, 0, st->stream>>>(
        (const W *)a->src, (W *)a->dst, a->batch, a->seq, a->heads, words, a->split);
    tf_cuda_traffic("tf_cuda_heads_kernel", 2.0 * (double)total * sizeof(W));
  }
  return tf_cuda_launched("heads kernel");
}

/* The widest word that divides a row and both pointers' alignment. */
tf_status tf_cuda_heads(tf_device_ctx *ctx, const tf_heads_args *a) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  const size_t row = (size_t)a->head_dim * tf_dtype_size(a->dtype);
  const uintptr_t align = (uintptr_t)a->src | (uintptr_t)a->dst | (uintptr_t)row;
  if (align % 16 == 0) return tf_cuda_heads_launch<uint4>(st, a, row);
  if (align % 8 == 0) return tf_cuda_heads_launch<uint2>(st, a, row);
  if (align % 4 == 0) return tf_cuda_heads_launch<uint32_t>(st, a, row);
  return tf_cuda_heads_launch<uint16_t>(st, a, row);
}
