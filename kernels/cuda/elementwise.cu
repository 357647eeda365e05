/* Elementwise ops on the GPU: every op of ops.h's lists, instantiated for
 * the dtypes the CPU backend instantiates (kernels/cpu/elementwise.c), with the same
 * formulas, compute types and f16/bf16 rounding. One kernel per (op, dtype)
 * holds both a dense loop (no index math) and a strided one (broadcast and
 * transposed inputs, 32-bit index math when the space allows). Ops of the
 * COMPARE kind (result rule TF_RESULT_BOOL) write the formula's truth as a
 * bool byte instead of a value of the input's dtype. */
#include "cuda_common.cuh"

#include "opmath.h"

/* Each formula of the lists as a functor over the compute type T; to_bool
 * says whether its result is stored as a bool. */
#define TF_CUDA_UNARY_FUNCTOR(CODE, name, kind, formula)                     \
  struct tf_cuda_unary_##name {                                              \
    static const bool to_bool = TF_KIND_##kind##_RULE == TF_RESULT_BOOL;     \
    template <typename T>                                                    \
    static __device__ __forceinline__ T apply(T x) {                         \
      return (T)(formula);                                                   \
    }                                                                        \
  };
TF_UNARY_OPS(TF_CUDA_UNARY_FUNCTOR)
#undef TF_CUDA_UNARY_FUNCTOR

#define TF_CUDA_BINARY_FUNCTOR(CODE, name, kind, formula)                    \
  struct tf_cuda_binary_##name {                                             \
    static const bool to_bool = TF_KIND_##kind##_RULE == TF_RESULT_BOOL;     \
    template <typename T>                                                    \
    static __device__ __forceinline__ T apply(T x, T y) {                    \
      return (T)(formula);                                                   \
    }                                                                        \
  };
TF_BINARY_OPS(TF_CUDA_BINARY_FUNCTOR)
#undef TF_CUDA_BINARY_FUNCTOR

/* A result as an output element: the dtype's storage, or a bool byte. */
template <int DT, bool TO_BOOL> struct tf_cuda_result {
  typedef typename tf_cuda_dtype<DT>::storage type;
  static __device__ __forceinline__ type put(typename tf_cuda_dtype<DT>::compute v) {
    return tf_cuda_dtype<DT>::store(v);
  }
};
template <int DT> struct tf_cuda_result<DT, true> {
  typedef uint8_t type;
  static __device__ __forceinline__ uint8_t put(typename tf_cuda_dtype<DT>::compute v) { return v != 0; }
};

typedef struct tf_cuda_unary_args {
  void *out;
  const void *a;
  int64_t n;
  tf_cuda_strided geom;
} tf_cuda_unary_args;

/* The strided loop of a unary kernel, for one index width. */
template <class Op, int DT, typename I>
__device__ __forceinline__ void tf_cuda_unary_strided(const tf_cuda_unary_args &p) {
  typedef tf_cuda_dtype<DT> D;
  typedef tf_cuda_result<DT, Op::to_bool> R;
  typedef typename D::storage S;
  typename R::type *out = (typename R::type *)p.out;
  const S *a = (const S *)p.a;
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)p.n; i += (I)(gridDim.x * blockDim.x)) {
    int64_t off[1];
    tf_cuda_strided_offsets<1, I>(p.geom, i, off);
    out[i] = R::put(Op::apply(D::load(a[off[0]])));
  }
}

/* Elements each thread of a dense loop loads before computing: enough
 * loads in flight to saturate memory with 2-byte types too. */
enum { TF_CUDA_UNROLL = 4 };

/* out[i] = op(a[i]): the dense loop keeps several loads in flight per
 * thread, the strided one pays for the index math only where needed. */
template <class Op, int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS) tf_cuda_unary_kernel(tf_cuda_unary_args p) {
  typedef tf_cuda_dtype<DT> D;
  typedef tf_cuda_result<DT, Op::to_bool> R;
  typedef typename D::storage S;
  if (p.geom.contiguous) {
    typename R::type *out = (typename R::type *)p.out;
    const S *a = (const S *)p.a;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (TF_CUDA_UNROLL - 1) * step < p.n; i += TF_CUDA_UNROLL * step) {
      S v[TF_CUDA_UNROLL];
#pragma unroll
      for (int u = 0; u < TF_CUDA_UNROLL; u++) v[u] = a[i + u * step];
#pragma unroll
      for (int u = 0; u < TF_CUDA_UNROLL; u++) out[i + u * step] = R::put(Op::apply(D::load(v[u])));
    }
    for (; i < p.n; i += step) out[i] = R::put(Op::apply(D::load(a[i])));
  } else if (p.geom.narrow) {
    tf_cuda_unary_strided<Op, DT, uint32_t>(p);
  } else {
    tf_cuda_unary_strided<Op, DT, int64_t>(p);
  }
}

/* Gathers one unary op's arguments and queues it on the device's stream. */
template <class Op, int DT>
static tf_status tf_cuda_unary_launch(tf_cuda_state *st, const tf_tensor *a, tf_tensor *out) {
  tf_cuda_unary_args p;
  p.out = tf_tensor_data(out);
  p.a = tf_tensor_data(a);
  p.n = tf_tensor_numel(out);
  tf_cuda_strided_init(&p.geom, out, a, NULL);
  tf_cuda_unary_kernel<Op, DT><<<tf_cuda_blocks(st, p.n), TF_CUDA_THREADS, 0, st->stream>>>(p);
  return tf_cuda_launched("unary kernel");
}

/* How the second operand is given: a tensor, or a scalar on one side. */
enum { TF_CUDA_OPERAND_TENSOR, TF_CUDA_OPERAND_SCALAR_RIGHT, TF_CUDA_OPERAND_SCALAR_LEFT };

/* A binary op's kernel argument; the scalar is stored in the compute type. */
template <typename T> struct tf_cuda_binary_args {
  void *out;
  const void *a, *b; /* b is NULL for a scalar operand */
  int64_t n;
  int mode;          /* TF_CUDA_OPERAND_* */
  T scalar;          /* (T)scalar, converted on the host as the CPU does */
  tf_cuda_strided geom;
};

/* One result from the loaded operands: x op y with the scalar, when there
 * is one, on its side (sb is unused then). */
template <class Op, int DT>
__device__ __forceinline__ typename tf_cuda_result<DT, Op::to_bool>::type tf_cuda_binary_apply(
    const tf_cuda_binary_args<typename tf_cuda_dtype<DT>::compute> &p, typename tf_cuda_dtype<DT>::storage sa,
    typename tf_cuda_dtype<DT>::storage sb) {
  typedef tf_cuda_dtype<DT> D;
  typedef typename D::compute T;
  T v = D::load(sa);
  T x = v, y = p.scalar;
  if (p.mode == TF_CUDA_OPERAND_TENSOR) y = D::load(sb);
  if (p.mode == TF_CUDA_OPERAND_SCALAR_LEFT) x = p.scalar, y = v;
  return tf_cuda_result<DT, Op::to_bool>::put(Op::apply(x, y));
}

/* The element of b at ib, or zero when the operand is a scalar. */
template <int DT>
__device__ __forceinline__ typename tf_cuda_dtype<DT>::storage tf_cuda_binary_b(
    const tf_cuda_binary_args<typename tf_cuda_dtype<DT>::compute> &p, int64_t ib) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  return p.mode == TF_CUDA_OPERAND_TENSOR ? ((const S *)p.b)[ib] : (S)0;
}

/* The strided loop of a binary kernel, for one index width. */
template <class Op, int DT, typename I>
__device__ __forceinline__ void tf_cuda_binary_strided(
    const tf_cuda_binary_args<typename tf_cuda_dtype<DT>::compute> &p) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  typedef typename tf_cuda_result<DT, Op::to_bool>::type O;
  O *out = (O *)p.out;
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)p.n; i += (I)(gridDim.x * blockDim.x)) {
    int64_t off[2];
    tf_cuda_strided_offsets<2, I>(p.geom, i, off);
    out[i] = tf_cuda_binary_apply<Op, DT>(p, ((const S *)p.a)[off[0]], tf_cuda_binary_b<DT>(p, off[1]));
  }
}

/* out[i] = a[i] op b[i] (or op the scalar), laid out like the unary kernel. */
template <class Op, int DT>
__global__ void __launch_bounds__(TF_CUDA_THREADS)
    tf_cuda_binary_kernel(tf_cuda_binary_args<typename tf_cuda_dtype<DT>::compute> p) {
  typedef typename tf_cuda_dtype<DT>::storage S;
  typedef typename tf_cuda_result<DT, Op::to_bool>::type O;
  if (p.geom.contiguous) {
    O *out = (O *)p.out;
    const S *a = (const S *)p.a;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (TF_CUDA_UNROLL - 1) * step < p.n; i += TF_CUDA_UNROLL * step) {
      S va[TF_CUDA_UNROLL], vb[TF_CUDA_UNROLL];
#pragma unroll
      for (int u = 0; u < TF_CUDA_UNROLL; u++) va[u] = a[i + u * step], vb[u] = tf_cuda_binary_b<DT>(p, i + u * step);
#pragma unroll
      for (int u = 0; u < TF_CUDA_UNROLL; u++) out[i + u * step] = tf_cuda_binary_apply<Op, DT>(p, va[u], vb[u]);
    }
    for (; i < p.n; i += step) out[i] = tf_cuda_binary_apply<Op, DT>(p, a[i], tf_cuda_binary_b<DT>(p, i));
  } else if (p.geom.narrow) {
    tf_cuda_binary_strided<Op, DT, uint32_t>(p);
  } else {
    tf_cuda_binary_strided<Op, DT, int64_t>(p);
  }
}

/* Converts the scalar to the compute type on the host, exactly as the CPU
 * backend's (T)scalar does, and queues the kernel. */
template <class Op, int DT>
static tf_status tf_cuda_binary_launch(tf_cuda_state *st, const tf_tensor *a, const tf_tensor *b, double scalar,
                                       tf_scalar_side side, tf_tensor *out) {
  typedef typename tf_cuda_dtype<DT>::compute T;
  tf_cuda_binary_args<T> p;
  p.out = tf_tensor_data(out);
  p.a = tf_tensor_data(a);
  p.b = b ? tf_tensor_data(b) : NULL;
  p.n = tf_tensor_numel(out);
  p.mode = b ? TF_CUDA_OPERAND_TENSOR
             : side == TF_SCALAR_LEFT ? TF_CUDA_OPERAND_SCALAR_LEFT : TF_CUDA_OPERAND_SCALAR_RIGHT;
  p.scalar = b ? (T)0 : (T)scalar;
  tf_cuda_strided_init(&p.geom, out, a, b);
  tf_cuda_binary_kernel<Op, DT><<<tf_cuda_blocks(st, p.n), TF_CUDA_THREADS, 0, st->stream>>>(p);
  return tf_cuda_launched("binary kernel");
}

/* The same refusal as the CPU backend's, should the dispatcher ever pass a
 * dtype that an op's kind has no kernel for. */
static tf_status tf_cuda_no_kernel(const char *family, int op, tf_dtype d) {
  return tf_fail(TF_ERR_ARG, "the CUDA backend has no %s kernel %d for dtype %s", family, op, tf_dtype_name(d));
}

/* Dispatch by op, then dtype; integer cases exist only for the ops whose
 * kind keeps them (TF_IF_INTS_<kind>), exactly as on the CPU. */
#define TF_CUDA_UNARY_CASE(DT, name) \
  case DT: return tf_cuda_unary_launch<tf_cuda_unary_##name, DT>(st, a, out);
#define TF_CUDA_UNARY_OP_CASE(CODE, name, kind, formula)         \
  case TF_OP_##CODE:                                             \
    switch (a->dtype) {                                          \
      TF_CUDA_FLOAT_TYPES(TF_CUDA_UNARY_CASE, name)              \
      TF_IF_INTS_##kind(TF_CUDA_INT_TYPES(TF_CUDA_UNARY_CASE, name)) \
      default: break;                                            \
    }                                                            \
    break;

tf_status tf_cuda_unary(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (op) {
    TF_UNARY_OPS(TF_CUDA_UNARY_OP_CASE)
    default: break;
  }
  return tf_cuda_no_kernel("unary", op, a->dtype);
}

#define TF_CUDA_BINARY_CASE(DT, name) \
  case DT: return tf_cuda_binary_launch<tf_cuda_binary_##name, DT>(st, a, b, scalar, side, out);
#define TF_CUDA_BINARY_OP_CASE(CODE, name, kind, formula)          \
  case TF_OP_##CODE:                                               \
    switch (a->dtype) {                                            \
      TF_CUDA_FLOAT_TYPES(TF_CUDA_BINARY_CASE, name)               \
      TF_IF_INTS_##kind(TF_CUDA_INT_TYPES(TF_CUDA_BINARY_CASE, name)) \
      default: break;                                              \
    }                                                              \
    break;

tf_status tf_cuda_binary(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, double scalar,
                         tf_scalar_side side, tf_tensor *out) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  switch (op) {
    TF_BINARY_OPS(TF_CUDA_BINARY_OP_CASE)
    default: break;
  }
  return tf_cuda_no_kernel("binary", op, a->dtype);
}
