/* Rotary position embedding on the GPU: the twin of cpu_nn.c's rope. One
 * thread per pair (x[2k], x[2k+1]) of a row at position pos, turned by
 * pos * theta^(-2k/d) (by minus that for the inverse, the backward pass).
 *
 * Both backends take the angle by the same double-precision operations, so
 * they rotate by the same angles: the frequencies theta^(-2k/d) come from
 * the host's pow, evaluated by the very expression cpu_nn.c uses, and
 * travel in the kernel's arguments (rows of up to 2 * TF_CUDA_ROPE_TABLE
 * elements, every head size in use; longer rows use the device's pow,
 * which may differ in the last bit); the product pos * frequency is one
 * correctly rounded multiply (no fused multiply-add). The cosine and sine
 * are taken in double, then rounded to the compute type. */
#include "cuda_common.cuh"

#include <math.h>
#include <string.h>

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
    const double freq = p.table ? inv_freq[k] : pow(p.theta, -(double)(2 * k) / (double)p.cols);
    const double angle = __dmul_rn((double)pos, freq);
    double sn, cs;
    sincos(angle, &sn, &cs);
    const C c = (C)cs, s = p.inverse ? -(C)sn : (C)sn;
    const int64_t at = row * p.cols + 2 * k;
    const C x0 = D::load(x[at]), x1 = D::load(x[at + 1]);
    y[at] = D::store(x0 * c - x1 * s);
    y[at + 1] = D::store(x0 * s + x1 * c);
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
    for (int64_t k = 0; k < half; k++) p.inv_freq[k] = pow(a->theta, -(double)(2 * k) / (double)a->cols);
  switch (a->x->dtype) {
    TF_CUDA_FLOAT_TYPES(TF_CUDA_ROPE_CASE, 0)
    default: break;
  }
  return tf_fail(TF_ERR_ARG, "rope: the CUDA backend has no kernel for dtype %s", tf_dtype_name(a->x->dtype));
}
