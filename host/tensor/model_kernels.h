/* The kernels of the fused Transformer-LM engine (model.h): what a backend
 * implements for it, beside the general ops of backend.h.
 *
 * The engine owns every buffer (parameters, gradients, planned activations)
 * and hands kernels raw pointers with their dtypes, as llm.c does; shapes
 * are checked once by the engine, never per kernel. "dtype" below is the
 * compute dtype: f32, or f16/bf16 under mixed precision. Residual streams,
 * norm gains, statistics and gradients of parameters are always f32, and
 * every kernel computes in f32 whatever it stores. Where the eager ops of
 * backend.h have the same math (GEMM, norm, softmax, cross-entropy, RoPE,
 * embedding), both interfaces run the same kernel, in that family's file
 * (kernels/cuda/<family>.cu, kernels/cpu/<family>.c); each kernel has
 * one CPU twin that its CUDA version is tested against; both are deterministic:
 * sums run in a fixed order, never through float atomics. Index tensors
 * are i64, already checked by index_check; kernels read a bad index as 0
 * so that nothing is ever read out of bounds. */
#ifndef TF_MODEL_KERNELS_H
#define TF_MODEL_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C = A B, or C += A B (accumulate), per batch; row-major operands as in
 * tf_matmul_args: A is (m, k), stored (k, m) when trans_a; B is (k, n),
 * stored (n, k) when trans_b. A and B have ab_dtype (f32, f16, bf16); C has
 * c_dtype (ab_dtype, or f32 to add low-precision products into f32
 * gradients). Products accumulate in f32 (TF32 only when allow_tf32). */
typedef struct tf_gemm_scaled tf_gemm_scaled;
typedef struct tf_gemm_args {
  const void *a, *b;
  void *c;
  tf_dtype ab_dtype, c_dtype;
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;             /* row strides, in elements */
  int64_t batch_a, batch_b, batch_c; /* element strides between batches */
  bool accumulate;
  bool allow_tf32;
  /* The backend may time its algorithms for this shape on the first call
   * and keep the fastest of those with the same bits on that call (the
   * CUDA backend's timed choice, gemm.cu, when TF_GEMM_TUNE=1): for a
   * shape called many times, like the engine's. */
  bool tune;
  /* A product of few rows (m <= TF_GEMM_FEW_ROWS) over a weight read once,
   * as generation's decode step makes (C = A B^T, B (n, k) in f16/bf16):
   * the backend may run a kernel of its own for it, bandwidth-bound (the
   * CUDA backend's, gemm.cu; TF_DECODE_GEMV=0 turns it off), with other
   * rounding than its general path. */
  bool few_rows;
  /* Generation's decode step: the backend may start this launch before the
   * one ahead of it ends, where its kernels can wait inside for what they
   * read (the CUDA backend's chained launches, cuda_common.cuh); the same
   * field in the norm, SwiGLU, kv_append and decode attention arguments. */
  bool chained;
  /* An FP8 product (tf.scaled_matmul): NULL for every other. A and B then
   * have scaled's dtypes and ab_dtype is ignored. */
  const tf_gemm_scaled *scaled;
  /* What follows the product, in generation's decode step, or NULL: the
   * SwiGLU gate of C (then_swiglu->ab is C) or the KV cache's append of C
   * (then_append->qkv is C). The backend runs the product, then that
   * kernel; where it can it does both in one (the CUDA backend's one-row
   * kernel: the gate's or the append's values from the product's rounded
   * sums, the same bits as the two kernels, C then left unwritten). What
   * they point at lives for the call only: a backend keeps copies. */
  const struct tf_swiglu_args *then_swiglu;
  const struct tf_kv_append_args *then_append;
} tf_gemm_args;

/* The FP8 part of a product: C = (scale_a scale_b) A B, the scales f32 on
 * the operands' device, one value each (tensorwise) or A's m and B's n
 * values (rowwise: C[i][j] = scale_a[i] scale_b[j] (A B)[i][j]). A is
 * (m, k) row-major and B is stored (n, k) row-major (trans_b): the one
 * layout Hopper's FP8 products take (A and B both "K-major"); one batch; C
 * f32, bf16 or f16. The sums are f32 (fast_accum: the tensor cores' own
 * narrower accumulation, never promoted, as cuBLASLt's FAST_ACCUM). amax,
 * when not NULL, receives max |C| (one f32, of the value before C's
 * rounding on the CPU and wherever the backend computes it in the
 * product; of C as stored otherwise). */
struct tf_gemm_scaled {
  tf_dtype a_dtype, b_dtype; /* f8e4m3 or f8e5m2, not both f8e5m2 */
  const float *scale_a, *scale_b;
  bool rowwise;
  bool fast_accum;
  float *amax;
};
enum { TF_GEMM_FEW_ROWS = 16 };

/* What a backend's timed choice of GEMM algorithms (tf_gemm_args.tune)
 * did over a device's life. */
typedef struct tf_gemm_tuning {
  int plans;      /* shapes that went through it (with one algorithm to offer or more) */
  int changed;    /* of them, those that left the heuristic's first algorithm */
  int candidates; /* other algorithms tried */
  int refused;    /* of them, refused at launch */
  int other_bits; /* of them, whose product had other bits than the first's (never chosen) */
  double first_ms, chosen_ms; /* summed over the shapes: the first algorithm's time, the chosen one's */
  bool enabled;               /* the choice is made (TF_GEMM_TUNE=1) */
} tf_gemm_tuning;

/* The traffic count of the memory-bound kernels: while it is on, each
 * launch of one adds a call and the bytes its operands take under the
 * kernel's name, every operand read once and every result written once,
 * as the launch's arguments give them (which operands a call has, their
 * dtypes and sizes). Per-row statistics (rstd, a row's loss) and token
 * ids count; vectors of one row's width (norm gains) and RoPE's tables
 * do not. A launch queued into a CUDA graph counts once, at capture (a
 * capture that fails, and runs again eagerly, once too), and its replays
 * do not. The engine's kernels are counted, and of the eager ops' only
 * AdamW's (the engine's separate step runs it) and FlashAttention's row
 * sums. */
enum { TF_TRAFFIC_KERNELS = 48 };
typedef struct tf_traffic_entry {
  const char *kernel; /* a static string */
  int64_t calls;
  double bytes;
} tf_traffic_entry;
typedef struct tf_traffic {
  int n;
  tf_traffic_entry kernels[TF_TRAFFIC_KERNELS];
} tf_traffic;

/* Token embedding. Forward: out[i] = wte[ids[i]]. Backward: dwte[ids[i]] +=
 * dout[i], each id's rows added in position order (the same bits on every
 * backend). */
typedef struct tf_encoder_args {
  bool backward;
  int64_t n, dim, vocab;
  const int64_t *ids;  /* (n,) */
  const float *wte;    /* forward: (vocab, dim) */
  float *out;          /* forward: (n, dim) */
  const float *dout;   /* backward: (n, dim) */
  float *dwte;         /* backward: (vocab, dim), added to */
  void *workspace;     /* backward: encoder_workspace bytes, or NULL (see workspaces below) */
} tf_encoder_args;

/* RMSNorm over rows of dim (CS336: h = x rstd g, rstd = 1 / sqrt(mean(x^2)
 * + eps), computed in f32) with the residual add fused in front of it.
 * Forward: when delta is given, x_out = x + delta (f32; may be x itself)
 * and x_out is normalised, else x is; h (dtype) and rstd written. With
 * rstd_given, rstd is read instead (x_out still written when delta is
 * given): h = x rstd g again from the rows' kept statistics, the bits of
 * the pass that wrote them, with no sum.
 * Backward, x being the normalised input and xhat = x rstd:
 *   dx = rstd (dh g - xhat mean(dh g xhat)),
 *   dres = dx (+ dres when accumulate), dres_low = dres in dtype (optional),
 *   dg += sum over rows of dh xhat. */
typedef struct tf_rmsnorm_args {
  bool backward;
  int64_t rows, dim;
  double eps;
  tf_dtype dtype;    /* of delta, h, dh and dres_low */
  const float *x;    /* (rows, dim) */
  const void *delta; /* forward: (rows, dim) or NULL */
  float *x_out;      /* forward: with delta */
  const float *g;    /* (dim,) */
  void *h;           /* forward */
  float *rstd;       /* (rows,): written forward (read with rstd_given), read backward */
  bool rstd_given;   /* forward: rstd as kept, not computed */
  const void *dh;    /* backward */
  float *dres;       /* backward: (rows, dim) */
  bool accumulate;
  void *dres_low;    /* backward: NULL to skip */
  float *dg;         /* backward: (dim,), added to */
  void *workspace;   /* backward: rmsnorm_workspace bytes, or NULL (see workspaces below) */
  bool chained;      /* forward: as tf_gemm_args' */
} tf_rmsnorm_args;

/* SwiGLU's gate on rows of ab = [a | b] (2 f wide): forward y = silu(a) b
 * (rows, f); backward dab = [dy b silu'(a) | dy silu(a)]. A backward pass
 * given y also writes y again, with the forward pass's bits: one pass that
 * reads a, b and dy once (y may be dy itself, and dab ab: every element is
 * read before it is written). */
typedef struct tf_swiglu_args {
  bool backward;
  int64_t rows, f;
  tf_dtype dtype;
  const void *ab;
  void *y;        /* forward; backward: NULL, or y written again */
  const void *dy; /* backward */
  void *dab;      /* backward; may be ab itself (each element is read before it is written) */
  bool chained;   /* forward: as tf_gemm_args' */
} tf_swiglu_args;

/* Queries, keys and values into heads, with RoPE on q and k (interleaved
 * pairs; cos and sin of position t and pair i at [t * head_dim / 2 + i]).
 * Forward: qkv (batch, seq, 3, heads, head_dim) -> q, k, v each (batch,
 * heads, seq, head_dim). Backward: the gradients dq, dk, dv (in q, k, v)
 * -> dqkv (in qkv), q and k rotated back. */
typedef struct tf_rope_heads_args {
  bool backward;
  int64_t batch, seq, heads, head_dim;
  tf_dtype dtype;
  const float *cos, *sin;
  void *qkv;
  void *q, *k, *v;
} tf_rope_heads_args;

/* (batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim) (merge),
 * or back (split). */
typedef struct tf_heads_args {
  bool split;
  int64_t batch, seq, heads, head_dim;
  tf_dtype dtype;
  const void *src;
  void *dst;
} tf_heads_args;

/* Causal softmax over the rows of batch (seq, seq) matrices, in place; row
 * t sees columns 0..t. Forward: s -> p = softmax(scale s) on the visible
 * columns, 0 above the diagonal. Backward: s holds dp and becomes
 * ds = scale p (dp - sum(p dp)) (0 above the diagonal). */
typedef struct tf_causal_softmax_args {
  bool backward;
  int64_t batch, seq;
  double scale;
  tf_dtype dtype;
  void *s;
  const void *p; /* backward */
} tf_causal_softmax_args;

/* Mean cross-entropy of logits (rows, vocab) against targets, fused with
 * its gradient: row_loss[r] = lse_r - logits[r, target_r]; *loss = their
 * mean (f32, added in a fixed order); when grad, the logits are overwritten
 * by d loss / d logits = (softmax - onehot) / rows. */
typedef struct tf_lm_loss_args {
  int64_t rows, vocab;
  tf_dtype dtype;
  void *logits;
  const int64_t *targets;
  float *row_loss; /* (rows,) workspace */
  float *loss;     /* one value */
  bool grad;
} tf_lm_loss_args;

/* AdamW (backend.h's tf_adamw_update) over n contiguous f32 parameters,
 * the step's constants read from device memory (written by
 * adamw_constants, in the order enum tf_adamw_const says), so that a
 * captured graph replays with each step's values; low (or NULL) gets the
 * first n_low new values rounded to low_dtype (bf16 or f16). */
enum tf_adamw_const {
  TF_ADAMW_DECAY, TF_ADAMW_BETA1, TF_ADAMW_BETA2, TF_ADAMW_ONE_MINUS_BETA1, TF_ADAMW_ONE_MINUS_BETA2,
  TF_ADAMW_STEP_SIZE, TF_ADAMW_BIAS2_SQRT, TF_ADAMW_EPS, TF_ADAMW_CONSTS
};
typedef struct tf_model_adamw_args {
  float *p, *m, *v;
  const float *g;
  void *low;
  tf_dtype low_dtype;
  int64_t n, n_low;
  const float *consts; /* TF_ADAMW_CONSTS floats on the device */
  bool zero_g;         /* g is zeroed after it is read (a gradient buffer used again) */
  /* NULL, or grad_norm's output on the device: each gradient is multiplied
   * by grad_scale[TF_GRAD_SCALE] (f32, rounded) before the update */
  const float *grad_scale;
} tf_model_adamw_args;

/* Global gradient-norm clipping (CS336's gradient_clipping): the L2 norm of
 * n f32 gradients and the factor that clips them, written into out on the
 * device (nothing waits for them): out[TF_GRAD_NORM] = sqrt(sum g^2),
 * out[TF_GRAD_SCALE] = max_norm / (norm + 1e-6) where norm > max_norm, else
 * 1. The squares are summed in double in one fixed order, the same on every
 * backend: TF_GRAD_NORM_BLOCKS blocks of TF_GRAD_NORM_THREADS threads, thread
 * t of block b adding elements b T + t, b T + t + B T, ... one after the
 * other, then a halving tree over each block's threads (x[t] += x[t + s],
 * s = T/2 ... 1) into partial[b], then the partials, thread t adding
 * partial[t], partial[t + T], ... and the same tree; norm and scale in
 * double, rounded to f32 once. partial holds TF_GRAD_NORM_BLOCKS doubles. */
enum { TF_GRAD_NORM, TF_GRAD_SCALE, TF_GRAD_NORM_OUT };
enum { TF_GRAD_NORM_BLOCKS = 1024, TF_GRAD_NORM_THREADS = 256 };
typedef struct tf_grad_norm_args {
  const float *g;
  int64_t n;
  double max_norm; /* > 0; infinity measures without clipping */
  double *partial; /* TF_GRAD_NORM_BLOCKS doubles of workspace on the device */
  float *out;      /* TF_GRAD_NORM_OUT floats on the device */
} tf_grad_norm_args;

/* Generation's KV cache (model_decode.c). kv_append: seq new tokens of
 * each of batch rows, at positions *pos .. *pos + seq - 1 (pos read from
 * device memory, so one captured graph serves every position), from the
 * fused projection qkv (batch, seq, 3, heads, head_dim): k turned by RoPE
 * (rope_heads' rule, from tables of the cache's whole length) and v as it
 * is, written into the caches k_cache and v_cache (batch, heads, max_len,
 * head_dim); q, when not NULL, gets the turned queries (batch, heads, seq,
 * head_dim). */
typedef struct tf_kv_append_args {
  int64_t batch, seq, heads, head_dim, max_len;
  tf_dtype dtype;
  const float *cos, *sin; /* (max_len, head_dim / 2) */
  const int64_t *pos;     /* one value on the device */
  const void *qkv;
  void *q;
  void *k_cache, *v_cache;
  bool chained; /* as tf_gemm_args' */
} tf_kv_append_args;

/* One query a row and head against the cached keys 0 .. *pos (pos on the
 * device): out (batch, heads * head_dim) = softmax(scale q k^T) v, in f32,
 * rounded once. The keys are cut into splits stretches of
 * ceil(max_len / splits) (a fixed cut, so the same bits at every length
 * and in a graph), each reduced alone into partial (batch * heads * splits
 * * (head_dim + 2) floats: its max, its sum, its weighted values), then
 * the stretches merged in order. */
typedef struct tf_decode_attention_args {
  int64_t batch, heads, head_dim, max_len, splits;
  double scale;
  tf_dtype dtype;
  const int64_t *pos;
  const void *q; /* (batch, heads, head_dim) */
  const void *k_cache, *v_cache;
  void *out;
  float *partial;
  /* GPU: the kernel whose warps take eight keys at a time, which every head
   * size can use, even where the tiled one (a thread a key, rows of whole
   * 16-byte words) would run: for tests */
  bool general;
  bool chained;     /* as tf_gemm_args' */
  /* GPU: batch * heads counters, zero, or NULL. Given, the stretches of a
   * row and head count themselves done there and the last one merges them
   * (and sets its counter to zero again): one kernel instead of two. */
  unsigned *done;
} tf_decode_attention_args;

/* FP8 training's casts (the engine's precision "fp8", model_fp8.c).
 * amax: *amax = max |x| over count values of dtype (f32, f16, bf16), NaN
 * if any is NaN; in any order, the same bits. */
typedef struct tf_fp8_amax_args {
  int64_t count;
  tf_dtype dtype;
  const void *x;
  float *amax; /* one f32 */
} tf_fp8_amax_args;

/* quantize: x (rows, cols) of dtype into the 8-bit float fp8 by current
 * scaling, q = max / *amax (the format's max; q = 1 when *amax is 0 or not
 * finite), each value saturate(x q) (elemio.h's saturating cast: one
 * rounding of the f32 product), into out (rows, cols) row-major and/or
 * out_t (cols, rows) row-major (either may be NULL); *scale = 1 / q, the
 * scale of the FP8 product that reads them (tf_gemm_scaled), and
 * *nonfinite (not NULL) counts one when *amax is not finite. amax, scale
 * and nonfinite are on the device, read and written there: nothing waits. */
typedef struct tf_fp8_quantize_args {
  int64_t rows, cols;
  tf_dtype dtype, fp8;
  const void *x;
  const float *amax;
  void *out, *out_t;
  float *scale;
  int32_t *nonfinite;
  /* delayed scaling: not NULL, this cast's own max |x| is maxed into
   * *record (NaN if any), the amax history's newest word, while *amax (the
   * history's max) scales it */
  float *record;
} tf_fp8_quantize_args;

/* Delayed scaling's step (Transformer Engine's recipe): for each of sites
 * cast sites, an overflow counted where its newest amax exceeds the amax
 * it was scaled by (use > 0), the newest amax pushed into its history of
 * length values (the oldest dropped), use = the history's max, newest
 * zeroed for the next step. history is (sites, length), newest first. */
typedef struct tf_fp8_history_args {
  int64_t sites, length;
  float *history, *use, *newest;
  int32_t *overflows;
} tf_fp8_history_args;

/* A captured, instantiated CUDA graph: work queued on a device's stream
 * once, replayed as one launch. */
typedef struct tf_graph tf_graph;

typedef struct tf_model_kernels {
  tf_status (*gemm)(tf_device_ctx *ctx, const tf_gemm_args *a);
  /* *bad: the first i in [0, n) with idx[i] outside [0, limit), or -1.
   * Waits for the device (the answer is needed on the host). */
  tf_status (*index_check)(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit, int64_t *bad);
  tf_status (*encoder)(tf_device_ctx *ctx, const tf_encoder_args *a);
  tf_status (*rmsnorm)(tf_device_ctx *ctx, const tf_rmsnorm_args *a);
  tf_status (*swiglu)(tf_device_ctx *ctx, const tf_swiglu_args *a);
  tf_status (*rope_heads)(tf_device_ctx *ctx, const tf_rope_heads_args *a);
  tf_status (*heads)(tf_device_ctx *ctx, const tf_heads_args *a);
  tf_status (*causal_softmax)(tf_device_ctx *ctx, const tf_causal_softmax_args *a);
  tf_status (*lm_loss)(tf_device_ctx *ctx, const tf_lm_loss_args *a);
  /* Chooses the GEMM path: cuBLASLt with cached plans (true, the default)
   * or plain cuBLAS (false), so tests can compare them; NULL where a
   * backend has one path only. */
  void (*gemm_use_lt)(tf_device_ctx *ctx, bool on);
  /* The timed choice's counts so far on ctx's device (zeros before its
   * first GEMM); NULL where a backend does not time its GEMMs. */
  void (*gemm_tuning)(tf_device_ctx *ctx, tf_gemm_tuning *out);
  /* The traffic count (tf_traffic above), one for the process: start true
   * clears it and turns it on, false turns it off; out, when not NULL,
   * gets the count as it stands. NULL where a backend does not count. */
  void (*traffic)(tf_device_ctx *ctx, bool start, tf_traffic *out);

  /* Workspaces: the device scratch bytes the backward passes of encoder
   * and rmsnorm need for args' sizes. The engine plans them, so a step
   * allocates nothing and can be captured; NULL here (or 0) where a
   * backend needs none. A call whose workspace is NULL borrows the bytes
   * from the caching allocator for its duration (not capturable). */
  size_t (*encoder_workspace)(tf_device_ctx *ctx, const tf_encoder_args *a);
  size_t (*rmsnorm_workspace)(tf_device_ctx *ctx, const tf_rmsnorm_args *a);

  /* CUDA graphs, all NULL where a backend has none (the engine then runs
   * eagerly). capture_begin starts capturing the device's stream in
   * thread-local mode, so that a call which cannot be captured (an
   * allocation, a wait, a copy to the host) fails and spoils the capture
   * instead of running. capture_end always stops the capture; it
   * instantiates what was queued into *out, or fails leaving *out NULL:
   * either way nothing has run and the stream is usable. graph_launch
   * queues one replay on the stream; graph_destroy frees a graph (NULL is
   * fine; one still running finishes first). */
  tf_status (*capture_begin)(tf_device_ctx *ctx);
  tf_status (*capture_end)(tf_device_ctx *ctx, tf_graph **out);
  tf_status (*graph_launch)(tf_device_ctx *ctx, tf_graph *g);
  void (*graph_destroy)(tf_device_ctx *ctx, tf_graph *g);

  /* The optimizer beside the backward pass: the side_* and main_wait
   * entries NULL where a backend runs one stream (the engine then steps
   * after the backward pass); adamw_constants, adamw and grad_norm also run
   * the clipped step, which updates after the whole pass (every backend
   * has them). adamw_constants queues the write of u's constants, rounded to f32, into
   * consts (TF_ADAMW_CONSTS floats), and readies the side stream; it is
   * not capturable. side_enter makes the device's work from now on go to
   * a second stream, after everything queued so far on the main one;
   * side_leave sends work to the main stream again; side_join makes the
   * main stream wait for everything queued on the side one. All three may
   * be captured into a graph (the side stream joins the capture). After
   * side_join and main_wait, nothing the main stream queues next may start
   * before the awaited work ends, in a graph too and for kernels that are
   * launched to start early (the CUDA backend queues a kernel of its own
   * after the wait). */
  tf_status (*adamw_constants)(tf_device_ctx *ctx, float *consts, const struct tf_adamw_update *u);
  tf_status (*adamw)(tf_device_ctx *ctx, const tf_model_adamw_args *a);
  /* Clipping (tf_grad_norm_args), capturable; NULL where a backend has none
   * (the engine then refuses max_norm). */
  tf_status (*grad_norm)(tf_device_ctx *ctx, const tf_grad_norm_args *a);
  tf_status (*side_enter)(tf_device_ctx *ctx);
  tf_status (*side_leave)(tf_device_ctx *ctx);
  tf_status (*side_join)(tf_device_ctx *ctx);
  /* side_mark records mark i (0 <= i < TF_SIDE_MARKS) after what is queued
   * on the side stream so far; main_wait makes the main stream wait for
   * the work before the last mark i. Capturable. */
  tf_status (*side_mark)(tf_device_ctx *ctx, int i);
  tf_status (*main_wait)(tf_device_ctx *ctx, int i);

  /* Generation (tf_kv_append_args, tf_decode_attention_args above); both
   * capturable. */
  tf_status (*kv_append)(tf_device_ctx *ctx, const tf_kv_append_args *a);
  tf_status (*decode_attention)(tf_device_ctx *ctx, const tf_decode_attention_args *a);

  /* FP8 training (tf_fp8_amax_args, tf_fp8_quantize_args above); both capturable. */
  tf_status (*fp8_amax)(tf_device_ctx *ctx, const tf_fp8_amax_args *a);
  tf_status (*fp8_quantize)(tf_device_ctx *ctx, const tf_fp8_quantize_args *a);
  tf_status (*fp8_history)(tf_device_ctx *ctx, const tf_fp8_history_args *a);
} tf_model_kernels;

enum { TF_SIDE_MARKS = 2 };

#ifdef __cplusplus
}
#endif
#endif
