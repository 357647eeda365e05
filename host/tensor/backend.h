/* The backend interface: what a device must implement.
 *
 * The dispatch layer (ops.c) has already checked devices, dtypes and shapes
 * and allocated outputs; a backend only runs the computation. Inputs of the
 * elementwise families may be strided views (broadcast dims have stride 0);
 * outputs are always contiguous and of the same shape as the iteration
 * space. Both backends expand the op lists of ops.h. */
#ifndef TF_BACKEND_H
#define TF_BACKEND_H

#include "ops.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_copy_dir { TF_COPY_H2D, TF_COPY_D2H, TF_COPY_D2D } tf_copy_dir;

typedef struct tf_matmul_args {
  const void *a, *b;
  void *c;
  tf_dtype dtype;
  int64_t batch, m, n, k;
  /* Row-major operands: A is (m, k), or (k, m) stored when trans_a. */
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;                /* leading dimensions (row strides) */
  int64_t batch_a, batch_b, batch_c;    /* element strides between batches (0 = broadcast) */
  bool allow_tf32;
} tf_matmul_args;

typedef struct tf_random_args {
  tf_random_kind kind;
  double a, b;
  uint64_t seed, offset; /* Philox key and first counter */
} tf_random_args;

/* An opaque timestamp for tf.timer: a CUDA event or a host clock reading. */
typedef struct tf_event tf_event;

/* ---- fused neural-network ops (nnops.h) ----------------------------------
 * nnops.c passes contiguous tensors only (masked_fill excepted). A row op
 * sees x as (rows, cols), cols being the last dim. Statistics (mean, rstd,
 * lse), norm weights and scalars such as dloss come in the statistics
 * dtype: f64 when x is f64, else f32; kernels compute in that dtype. */

typedef struct tf_softmax_args {
  int64_t rows, cols;
  bool log;
  const tf_tensor *x;  /* forward: the input; backward: the forward output y */
  const tf_tensor *dy; /* backward: the gradient of y; NULL in the forward pass */
  tf_tensor *out;      /* y, or dx; x's dtype */
} tf_softmax_args;

typedef enum tf_norm_kind { TF_NORM_LAYER, TF_NORM_RMS } tf_norm_kind;

typedef struct tf_norm_args {
  tf_norm_kind kind;
  bool backward;
  int64_t rows, cols;
  double eps;             /* forward */
  const tf_tensor *x;     /* (rows, cols) */
  const tf_tensor *w, *b; /* (cols,) or NULL; rms_norm's gain is w, it has no b */
  /* Forward: y (x's dtype) written, mean and rstd (rows,) written unless
   * NULL. Backward: mean (layer_norm) and rstd read. */
  tf_tensor *y, *mean, *rstd;
  const tf_tensor *dy;      /* backward: x's shape and dtype */
  tf_tensor *dx, *dw, *db;  /* backward: dx of x's dtype; dw, db (cols,) or NULL to skip */
} tf_norm_args;

typedef struct tf_cross_entropy_args {
  bool backward;
  int64_t rows, cols;
  const tf_tensor *logits;  /* (rows, cols) */
  const tf_tensor *targets; /* (rows,) i64 */
  tf_tensor *lse;           /* (rows,): written forward unless NULL, read backward */
  tf_tensor *loss;          /* forward: 0-dim, logits' dtype */
  const tf_tensor *dloss;   /* backward: 0-dim */
  tf_tensor *dlogits;       /* backward: logits' shape and dtype */
} tf_cross_entropy_args;

typedef struct tf_rope_args {
  int64_t rows, cols;
  int64_t seq;                /* without positions, row r is at position r % seq */
  double theta;
  bool inverse;
  const tf_tensor *x;
  const tf_tensor *positions; /* (rows,) i64, or NULL */
  tf_tensor *y;
} tf_rope_args;

typedef struct tf_embedding_args {
  bool backward;
  int64_t n, dim, vocab;    /* n ids; rows of dim elements */
  const tf_tensor *ids;     /* (n,) i64 */
  const tf_tensor *weight;  /* forward: (vocab, dim), any dtype */
  tf_tensor *out;           /* forward: (n, dim), weight's dtype */
  const tf_tensor *dout;    /* backward: (n, dim), any float dtype */
  tf_tensor *dweight;       /* backward: (vocab, dim), f32 or f64 */
} tf_embedding_args;

/* One AdamW step with its step-dependent constants worked out once, in
 * double, by the dispatcher (torch.optim.AdamW's single-tensor form):
 *   p = p * decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
 *   p = p - step_size * m / (sqrt(v) / bias2_sqrt + eps) */
typedef struct tf_adamw_update {
  tf_tensor *p, *m, *v; /* f32 or f64, one dtype, updated in place */
  const tf_tensor *g;   /* any float dtype, p's element count */
  double decay;         /* 1 - lr * weight_decay */
  double beta1, beta2;
  double step_size;     /* lr / (1 - beta1^step) */
  double bias2_sqrt;    /* sqrt(1 - beta2^step) */
  double eps;
  tf_tensor *low;       /* or NULL (f32 p only): the first numel(low) elements of the updated p, rounded
                           to low's dtype (f16 or bf16), as a conversion of p afterwards would give them */
} tf_adamw_update;

/* FlashAttention-2 over batch independent problems (all leading dims of
 * q/k/v folded into batch). q is (batch, seq_q, head_dim), k and v are
 * (batch, seq_k, head_dim), o is q's shape; all contiguous, one dtype (f32,
 * f16, bf16; the CPU also takes f64). Scores are s = scale q.k; with causal,
 * key j is visible to query i iff j <= i (top-left aligned, as torch's
 * is_causal), so no row is ever fully masked. lse (batch, seq_q) is the
 * natural-log log-sum-exp of each row of scaled, masked scores, in f32 (f64
 * for f64). Products accumulate in f32 (f64 for f64); tiles that are fully
 * masked are skipped.
 * Backward reads q, k, v, o, lse and dout and writes dq, dk, dv (q/k/v's
 * shapes and dtype): D = rowsum(dout * o), P = exp(s - lse), dV = P^T dO,
 * dP = dO V^T, dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q.
 * workspace holds flash_workspace(ctx, args) bytes of device memory (may be 0).
 * deterministic asks for the same bits on every run (no float atomics).
 * o_row_stride (0: head_dim) spaces O's rows further apart: a multiple
 * h * head_dim, h dividing batch, writes O in the merged layout (batch / h,
 * seq_q, h, head_dim), problem b's rows at head b % h of problem group
 * b / h; the backward pass reads O and dout in that layout (the fused
 * engine's attention output and its gradient, heads merged without a pass
 * of their own). */
typedef struct tf_flash_args {
  bool backward;
  bool causal;
  bool deterministic;
  tf_dtype dtype;
  int64_t batch, seq_q, seq_k, head_dim;
  double scale;
  const void *q, *k, *v;
  void *o;          /* forward: written; backward: read */
  void *lse;        /* forward: written; backward: read */
  const void *dout; /* backward */
  void *dq, *dk, *dv;
  void *workspace;  /* backward */
  int64_t o_row_stride;
} tf_flash_args;

/* O's (and in the backward pass dout's) row stride and the problems that
 * share one of its rows (1 for the plain layout), or an error for an
 * o_row_stride the layout cannot have. */
static inline tf_status tf_flash_o_layout(const tf_flash_args *a, int64_t *ld, int64_t *group) {
  *ld = a->o_row_stride ? a->o_row_stride : a->head_dim;
  *group = 1;
  if (!a->o_row_stride) return TF_OK;
  if (a->head_dim <= 0 || a->o_row_stride < a->head_dim || a->o_row_stride % a->head_dim != 0 ||
      a->batch % (a->o_row_stride / a->head_dim) != 0)
    return tf_fail(TF_ERR_ARG,
                   "flash_attention: O's row stride %lld does not fit: it takes a multiple h of head dim %lld with h "
                   "dividing batch %lld",
                   (long long)a->o_row_stride, (long long)a->head_dim, (long long)a->batch);
  *group = a->o_row_stride / a->head_dim;
  return TF_OK;
}

struct tf_backend {
  const char *name;
  /* Devices of this kind present (the CPU: 1); a machine without a driver has none. */
  int (*device_count)(void);
  tf_status (*init)(tf_device_ctx *ctx);
  void (*shutdown)(tf_device_ctx *ctx);
  tf_status (*info)(tf_device_ctx *ctx, tf_device_info *info);

  /* Memory, used through the caching allocator. */
  tf_status (*raw_alloc)(void *ctx, size_t bytes, void **ptr);
  void (*raw_free)(void *ctx, void *ptr);
  tf_status (*copy)(tf_device_ctx *ctx, void *dst, const void *src, size_t bytes, tf_copy_dir dir);
  /* Page-locked host memory, which copies to and from the device read at
   * the bus's full rate; NULL where the backend has none (the CPU). */
  tf_status (*host_alloc)(tf_device_ctx *ctx, size_t bytes, void **ptr);
  void (*host_free)(tf_device_ctx *ctx, void *ptr);
  tf_status (*synchronize)(tf_device_ctx *ctx);
  /* Collectives (NCCL) run on a stream of their own, beside the kernels;
   * NULL where there is none (the CPU). comm_begin orders that stream after
   * everything queued so far on the device's and returns it (a
   * cudaStream_t), the device made current for this thread; comm_end
   * records the end of what was queued on it since (an event); comm_done
   * asks whether that end was reached; comm_join makes the device's stream
   * wait for it (work queued later sees the collective's result) and frees
   * the event. */
  tf_status (*comm_begin)(tf_device_ctx *ctx, void **stream);
  tf_status (*comm_end)(tf_device_ctx *ctx, void **event);
  bool (*comm_done)(tf_device_ctx *ctx, void *event);
  tf_status (*comm_join)(tf_device_ctx *ctx, void *event);

  /* Timing. */
  tf_status (*event_record)(tf_device_ctx *ctx, tf_event **ev);
  tf_status (*event_elapsed_ms)(tf_device_ctx *ctx, tf_event *start, tf_event *end, double *ms);
  void (*event_destroy)(tf_device_ctx *ctx, tf_event *ev);

  /* Ops. */
  tf_status (*fill)(tf_device_ctx *ctx, tf_tensor *out, double value);
  tf_status (*arange)(tf_device_ctx *ctx, tf_tensor *out, double start, double step);
  tf_status (*random)(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args);
  /* Strided src of any dtype into strided dst of any dtype, same shape. */
  tf_status (*convert)(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
  /* The same into an 8-bit float dst, saturating: beyond the largest finite
   * value (infinities too) gives that value, NaN stays NaN (elemio.h). */
  tf_status (*convert_saturate)(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst);
  tf_status (*unary)(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out);
  /* b is NULL for a scalar operand on the given side. */
  tf_status (*binary)(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, double scalar,
                      tf_scalar_side side, tf_tensor *out);
  /* a is contiguous, viewed as (outer, r, inner); out is (outer, inner). */
  tf_status (*reduce)(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                      int64_t inner, tf_tensor *out);
  tf_status (*matmul)(tf_device_ctx *ctx, const tf_matmul_args *args);

  /* Fused neural-network ops (nnops.h); the arguments above. Index checks
   * report the first bad index in *bad (-1 when every one is in range)
   * instead of failing, so that both backends word the error the same. */
  tf_status (*softmax)(tf_device_ctx *ctx, const tf_softmax_args *args);
  tf_status (*norm)(tf_device_ctx *ctx, const tf_norm_args *args);
  /* *bad: the first target outside [0, cols) (forward only). */
  tf_status (*cross_entropy)(tf_device_ctx *ctx, const tf_cross_entropy_args *args, int64_t *bad);
  tf_status (*rope)(tf_device_ctx *ctx, const tf_rope_args *args);
  /* *bad: the first id outside [0, vocab); nothing is read out of bounds. */
  tf_status (*embedding)(tf_device_ctx *ctx, const tf_embedding_args *args, int64_t *bad);
  /* x and mask (bool) are strided views of out's shape; value is converted
   * to x's dtype as a copy would convert it (elemio.h). */
  tf_status (*masked_fill)(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                           tf_tensor *out);
  tf_status (*adamw)(tf_device_ctx *ctx, const tf_adamw_update *args);
  /* Head dims 1..128 (TF_FLASH_MAX_HEAD_DIM, host/autograd/attention.c; the
   * CUDA backend refuses others, the CPU's takes any): on the GPU f16 and bf16
   * at multiples of 8 with 16-byte aligned buffers take the tensor-core
   * kernels, everything else the SIMT ones. flash_workspace gives the
   * backward pass's scratch bytes. */
  tf_status (*flash_attention)(tf_device_ctx *ctx, const tf_flash_args *args);
  size_t (*flash_workspace)(tf_device_ctx *ctx, const tf_flash_args *args);

  /* The fused Transformer engine's kernels (model_kernels.h). */
  const struct tf_model_kernels *model;
};

/* Backends register themselves with the device layer (kernels/backends.c
 * does it for those a build has, at start): one per device type, the
 * later registration replacing the earlier. */
void tf_device_register_backend(tf_device_type type, const tf_backend *be);

#ifdef __cplusplus
}
#endif
#endif
