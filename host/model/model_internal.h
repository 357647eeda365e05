/* The engine's insides, shared by model.c (parameters, optimizer),
 * model_plan.c (activation memory), model_forward.c, model_attention.c and
 * model_backward.c. Buffers are named raw pointers into one allocation
 * each, as in llm.c; the tensors the API hands out are views of the same
 * allocations. */
#ifndef TF_MODEL_INTERNAL_H
#define TF_MODEL_INTERNAL_H

#include "backend.h"
#include "model.h"
#include "model_kernels.h"
#include "prof.h"

/* Runs expr inside the range name (NVTX and the profiler see it), closing
 * the range whether expr fails or not; returns expr's failure. */
#define TF_RANGED(name, expr)                               \
  do {                                                      \
    bool tf_pushed_ = tf_range_push(name) == TF_OK;         \
    tf_status tf_ranged_st_ = (expr);                       \
    if (tf_pushed_) (void)tf_range_pop();                   \
    if (tf_ranged_st_ != TF_OK) return tf_ranged_st_;       \
  } while (0)

/* RMSNorm's eps (CS336). */
#define TF_MODEL_NORM_EPS 1e-5

/* One named parameter: its place in the flat buffers and its init. */
typedef struct tf_model_tensor {
  char name[48];
  tf_shape shape;
  int64_t offset, numel; /* elements, into params / grads / m / v (and low for matmul weights) */
  double init_std;       /* truncated normal's std; 0 for a norm gain (ones) */
  tf_tensor *param, *grad;
} tf_model_tensor;

/* Where a layer's weights start in the flat buffers. Storage keeps the
 * matmul weights of every layer first (so the low-precision copy is one
 * prefix of the buffer), q, k, v back to back (one (3d, d) GEMM) and w1,
 * w3 back to back (one (2 d_ff, d) GEMM). */
typedef struct tf_model_layer_weights {
  int64_t ln1, qkv, out, ln2, w13, w2;
} tf_model_layer_weights;

/* One layer's activations. Training plans keep per layer what is costly to
 * recompute (q, k, v, the attention output, the output projection's result,
 * the w1|w3 output, the norm statistics) and share one buffer among all
 * layers for what the backward pass recomputes cheaply and exactly (the norm
 * outputs h1 and h2, the attention probabilities p, the SwiGLU gate);
 * inference plans share all (model_plan.c). */
typedef struct tf_model_layer_acts {
  void *h1;        /* (n, d): ln1's output */
  float *rstd1;    /* (n,) */
  void *q, *k, *v; /* (B, H, T, hd) each, q and k after RoPE */
  void *p;         /* (B, H, T, T): attention probabilities (naive attention) */
  float *lse;      /* (B, H, T): log-sum-exp of the scaled scores (flash attention) */
  void *atty;      /* (n, d): attention output, heads merged */
  void *proj;      /* (n, d): output_proj(atty), kept in training when it stands for the residual
                      stream after attention (tf_model_keeps_projection); else NULL */
  void *h2;        /* (n, d): ln2's output */
  float *rstd2;
  void *ab;        /* (n, 2 d_ff): [w1 h2 | w3 h2] */
  void *gate;      /* (n, d_ff): silu(w1 h2) * w3 h2 */
} tf_model_layer_acts;

/* The activation plan for one (batch, seq): every buffer a step touches,
 * carved out of one allocation. n = batch * seq rows; tensors marked dtype
 * are in the compute dtype, the others f32 (ids i64). */
typedef struct tf_model_plan {
  int64_t batch, seq;
  bool training;      /* per-layer activations and backward buffers exist */
  tf_tensor *storage; /* the allocation; NULL while nothing is planned */
  size_t bytes;
  int64_t *ids, *targets;     /* (n,) */
  float *rope_cos, *rope_sin; /* (T, hd / 2) */
  /* training: 2L + 1 residual streams, x_l at 2l and x_l + attention at
   * 2l + 1 (the odd ones share one buffer, which the backward pass refills,
   * when the projection is kept or recomputed); inference: one, updated in place */
  float **resid;
  tf_model_layer_acts *layers; /* training: L; inference: 1 */
  void *hf;                    /* (n, d): ln_final's output */
  float *rstdf;
  void *logits;                /* training: (n, V), then their gradient */
  float *row_loss;             /* training: (n,) */
  float *loss;                 /* training: the mean loss, where a replayed graph finds it */
  /* scratch, shared by the layers */
  void *qkv;   /* (n, 3d): projections; backward: their gradient */
  void *heads; /* (n, d) in heads layout, naive attention: its output; backward: its gradient (flash: NULL) */
  void *proj;  /* (n, d): output_proj's or w2's output; backward: a norm output's gradient */
  /* backward (training plans) */
  float *dres;       /* (n, d): gradient of the residual stream */
  void *dres_low;    /* (n, d) dtype (dres itself under f32) */
  void *dqkv_heads;  /* 3 (n, d): dq, dk, dv in heads layout */
  void *dp;          /* (B, H, T, T) (naive attention) */
  void *flash_ws;    /* the flash backward's workspace */
  void *backward_ws; /* the encoder's and the norms' backward workspace (one at a time) */
  void *dgate;       /* (n, d_ff) */
  /* FP8 models: the 8-bit operands of one product at a time, n x max(3d, 2 d_ff) bytes each */
  void *fp8_x, *fp8_xt, *fp8_dy, *fp8_dyt;
} tf_model_plan;

/* The phases of a step that run as CUDA graphs where the backend has
 * them (model.c): the training forward with the fused loss, the backward
 * pass, and the layers of tf_model_forward (lm_head writes a new tensor
 * each time, so it runs after the replay). */
typedef enum tf_model_phase {
  TF_MODEL_PHASE_LOSS,
  TF_MODEL_PHASE_BACKWARD,
  TF_MODEL_PHASE_FORWARD,
  TF_MODEL_PHASES
} tf_model_phase;

/* What a captured phase bakes in besides the plan's buffers (a new plan
 * drops every graph): host values that choose kernels or their arguments. */
typedef struct tf_model_graph_key {
  int64_t batch, seq;
  bool training_plan, keep, flash, tf32;
  bool optimizer; /* the backward pass with AdamW beside it */
  bool ring;      /* ... writing the gradients into the ring (tf_model.ring) */
  bool clip;       /* ... or after it, clipped */
  double max_norm; /* clipping's threshold, baked into the norm kernel */
} tf_model_graph_key;

/* One phase's graph: the first call of a key runs eagerly (it warms
 * cuBLASLt's plans and loads modules), the second captures, later ones
 * replay. */
typedef struct tf_model_graph {
  tf_model_graph_key key;
  int64_t calls;  /* calls with this key */
  bool failed;    /* the capture failed: eager for this key from now on */
  bool traced;    /* captured while the profiler recorded GPU work: its nodes know their ranges */
  tf_graph *exec; /* NULL until captured */
} tf_model_graph;

/* Generation's KV cache and decode-step buffers (model_decode.c). */
typedef struct tf_model_decode tf_model_decode;

struct tf_model {
  tf_model_config cfg;
  tf_device device;
  tf_dtype dtype; /* compute dtype: f32, f16 or bf16 */
  tf_device_ctx *ctx;
  const tf_model_kernels *k;
  int ntensors;
  tf_model_tensor *tensors;       /* state-dict order */
  tf_model_layer_weights *layers; /* num_layers */
  int64_t wte, lnf, lm_head;
  int64_t total;        /* elements of each flat buffer (with alignment gaps) */
  int64_t matmul_total; /* the prefix holding the matmul weights */
  tf_tensor *params, *adam_m, *adam_v; /* flat f32 (total,) */
  tf_tensor *grads;         /* flat f32 (total,), made by the first backward pass that needs it
                               (tf_model_ensure_grads); NULL until then */
  bool grads_dirty;         /* grads may hold non-zeros (a backward pass since the last zero_grad) */
  /* tf_model_backward_adamw without accumulated gradients: each weight
   * matrix's gradient goes into one of TF_SIDE_MARKS slots (written, not
   * added to), used again two matrices later once the optimizer has read
   * it; lm_head's and the rest's (embedding, norms) have places of their
   * own, and the rest's, which are added to, are zeroed once read. */
  tf_tensor *ring;
  int64_t ring_at[TF_SIDE_MARKS + 1]; /* where each slot starts, then lm_head's place (elements) */
  bool use_ring;            /* the backward pass being run writes gradients into the ring */
  tf_tensor *adam_consts;   /* AdamW's step constants on the device, for tf_model_backward_adamw */
  bool step_in_backward;    /* the backward pass being run also steps the optimizer (and refreshes
                               the low copy, which tf_model_backward_adamw requires in step) */
  bool overlap;             /* ... on the second stream (tf_model_set_overlap) */
  double max_grad_norm;     /* clipping before each AdamW step (tf_model_set_max_grad_norm); 0: off */
  tf_tensor *clip;          /* f32 (TF_GRAD_NORM_OUT,): the last clipped step's norm and factor */
  tf_tensor *clip_partial;  /* f64 (TF_GRAD_NORM_BLOCKS,): grad_norm's workspace */
  bool clipped;             /* a step has written clip */
  bool clip_in_step;        /* the backward pass being run ends with the clipped update of every parameter */
  bool recompute_residual;  /* training plans keep x_l only; x_l + attention is recomputed
                               (tf_model_set_recompute_residual) */
  tf_tensor *low;           /* flat dtype (matmul_total,), or NULL under f32 */
  tf_tensor *matmul_params; /* params' first matmul_total elements */
  uint64_t low_version;     /* params' storage version the low copy was made from */
  /* FP8 training (precision "fp8", model_fp8.c): the layers' four products in FP8 by current
   * scaling, everything else as bf16 (dtype) */
  bool fp8;
  tf_dtype fp8_grad;        /* the gradients' format: f8e5m2 (the default) or f8e4m3 */
  tf_tensor *w8, *w8t;      /* e4m3 copies of the matmul weights at their offsets (1 byte each), and of their
                               transposes (weight (r, c) at its offset as (c, r)) */
  tf_tensor *fp8_state;     /* f32 device words: each layer matrix's amax and scale, then the activations' slots */
  uint64_t w8_version;      /* params' storage version w8 and w8t were made from */
  /* how model.c refreshes and frees the FP8 state (set with it: no call between the files) */
  tf_status (*fp8_sync)(tf_model *m);
  void (*fp8_release)(tf_model *m);
  const void *fp8_dy_cast;  /* the gradient tf_model_layer_linear_dx cast last (both layouts), until the next product */
  /* delayed scaling (tf_model_set_fp8_delayed): 8L cast sites (each matrix's input, then its
   * gradient), their histories, the amax each is scaled by and the newest, an overflow count */
  int64_t fp8_history;      /* history length; 0: current scaling */
  tf_tensor *fp8_hist;      /* f32 (8L history, 8L use, 8L newest, the count) */
  int64_t fp8_rolls;        /* history steps queued (host side: 0 until the second training pass) */
  int64_t fp8_recorded;     /* casts queued that record a newest amax */
  bool fp8_training_pass;   /* the loss pass is being queued (its casts follow the recipe) */
  tf_model_plan plan;
  bool flash;      /* FlashAttention (default) or naive attention with P materialised */
  bool loss_ready; /* the plan holds a loss's activations and logits' gradient */
  bool graphs;     /* replay phases as CUDA graphs: asked for (option, TF_MODEL_GRAPHS) and supported */
  tf_model_graph graph[TF_MODEL_PHASES];
  uint64_t graph_captures, graph_replays, graph_failures;
  /* data parallel (model_parallel.c) */
  tf_model_grad_sync grad_sync;
  bool zero1;                      /* adam_m/adam_v hold [shard_begin, shard_end) only */
  int64_t shard_begin, shard_end;  /* elements of the flat buffers this rank updates */
  int64_t bucket_elems;            /* TF_GRAD_SYNC_BUCKETS: a bucket's size */
  int64_t bucket_lo, bucket_hi;    /* the bucket being filled: [lo, hi), empty when equal */
  struct tf_dist_work **works;     /* collectives started during the backward pass */
  int nworks, cap_works;
  /* generation (model_decode.c) */
  tf_model_decode *decode;             /* the KV cache, NULL until a prefill */
  void (*decode_release)(tf_model *m); /* how tf_model_free frees it (set with it: no call between the files) */
  /* while a prefill runs the layers: each layer's keys and values go into the cache (model_forward.c
   * calls tf_model_prefill_store), at k0 / v0 plus layer_elems a layer, by these arguments */
  bool prefilling;
  tf_kv_append_args prefill_kv;
  void *prefill_k0, *prefill_v0;
  int64_t prefill_layer_elems;
};

/* A layer's weight matrices in the order the backward pass completes their
 * gradients; matrix j uses ring slot j % TF_SIDE_MARKS, so that the slots
 * alternate across layers too. */
enum { TF_MAT_W2, TF_MAT_W13, TF_MAT_OUT, TF_MAT_QKV, TF_LAYER_MATS };
_Static_assert(TF_LAYER_MATS % TF_SIDE_MARKS == 0, "the ring's slots alternate from layer to layer");
/* The elements [begin, end) of matrix j of layer l in the flat buffers (to the next one's start). */
void tf_model_matrix_range(const tf_model *m, int64_t l, int j, int64_t *begin, int64_t *end);

/* model.c: the optimizer's moments, allocated (zeroed) by the first step;
 * the flat gradients (zeroed, with their views) by the first pass that
 * needs them; the ring by the first step without them. */
tf_status tf_model_ensure_moments(tf_model *m);
/* An allocation of the model's, tagged and named for memory snapshots. */
tf_status tf_model_alloc(tf_model *m, int64_t n, tf_dtype d, int tag, const char *what, tf_tensor **out);
tf_status tf_model_ensure_grads(tf_model *m);
tf_status tf_model_ensure_ring(tf_model *m);
/* Clipping's buffers and AdamW's device constants, made on first use. */
tf_status tf_model_ensure_clip(tf_model *m);
/* The clipped update, kernels only (capturable): the norm of the flat
 * gradients, then AdamW over every parameter reading its factor (the low
 * copy refreshed when low; the gradients zeroed when zero_g). The
 * constants must have been written (adamw_constants). */
tf_status tf_model_clip_update(tf_model *m, bool low, bool zero_g);
/* Whether tf_model_adamw_step can run in this state (before a backward pass is spent on it). */
tf_status tf_model_adamw_step_check(const tf_model *m);

/* model_graph.c: CUDA graph replay. */
/* The body of a phase: kernels only, over the plan and the model's buffers
 * (no allocation, no wait, no host value that changes between calls). */
typedef tf_status (*tf_model_phase_fn)(tf_model *m, bool keep);
/* Runs body eagerly, or captures it, or replays its graph (see tf_model_graph). */
tf_status tf_model_run_phase(tf_model *m, tf_model_phase phase, bool keep, tf_model_phase_fn body);
/* Eager, captured or replayed as model_graph.c's phases are, for a graph
 * the caller keys (g->key set, g reset when the key changes); name names
 * its range and its messages. */
tf_status tf_model_run_graph(tf_model *m, tf_model_graph *g, const char *name, bool keep, tf_model_phase_fn body);
/* Frees every graph (the plan they run on is going away, or graphs were turned off). */
void tf_model_graphs_drop(tf_model *m);

/* model_parallel.c */
/* The gradients of [begin, end) of the flat buffers are final (the
 * backward pass calls it region by region, last layer first): overlapped
 * syncs start their all-reduces. */
tf_status tf_model_grads_ready(tf_model *m, int64_t begin, int64_t end);
/* After the backward pass: the gradients averaged over the ranks. */
tf_status tf_model_sync_grads(tf_model *m);
/* Drops collectives still in flight (waiting for them), after a failure. */
void tf_model_drop_works(tf_model *m);

/* model_plan.c */
/* RoPE's cos and sin tables (T, hd / 2) of f32 on the device, by rope.h's rule. */
tf_status tf_model_rope_tables(tf_model *m, int64_t T, float *cos_out, float *sin_out);
/* Makes the plan fit (batch, seq) and the mode: kept when it already does
 * (a training plan serves inference too), else released and made anew. */
tf_status tf_model_plan_ensure(tf_model *m, int64_t batch, int64_t seq, bool training);
void tf_model_plan_release(tf_model *m);
/* A tensor view of plan memory at ptr (for copies into the plan). */
tf_status tf_model_plan_view(const tf_model *m, void *ptr, tf_dtype dtype, const tf_shape *shape, tf_tensor **out);

/* model_forward.c */
/* Generation's prefill: ids taken into the plan, the inference forward's
 * layers run eagerly (never as a graph) while m->prefilling has each
 * layer store its keys and values (tf_model_prefill_store); ends with the
 * plan's hf. */
tf_status tf_model_prefill_layers(tf_model *m, const tf_tensor *ids);
/* RMSNorm of x into h and rstd (delta added into x_out first, when given). */
tf_status tf_model_norm(tf_model *m, const float *x, const void *delta, float *x_out, int64_t gain, void *h,
                        float *rstd);
/* tf_model_norm again from the rstd it kept (the same bits, no sums). */
tf_status tf_model_norm_again(tf_model *m, const float *x, const void *delta, float *x_out, int64_t gain, void *h,
                              float *rstd);
/* The SwiGLU gate of one layer from its w1|w3 output (a->ab into a->gate). */
tf_status tf_model_swiglu(tf_model *m, const tf_model_layer_acts *a);

/* model_attention.c: causal self-attention of one layer. Forward: qkv (n,
 * 3d) -> acts->atty (n, d), saving q, k, v (and lse with flash attention)
 * in acts. Backward: datty (n, d) -> dqkv (n, 3d). */
/* The flash arguments of the plan's shape, O and dO with the heads merged
 * (o_row_stride d_model; pointers left for the caller). */
tf_flash_args tf_model_flash_args(const tf_model *m, int64_t batch, int64_t seq);
tf_status tf_model_attention_forward(tf_model *m, tf_model_layer_acts *acts, const void *qkv);
tf_status tf_model_attention_backward(tf_model *m, const tf_model_layer_acts *acts, const void *datty, void *dqkv);

/* Whether a training plan keeps each layer's output projection (dtype) in
 * place of the residual stream after attention (f32), which the backward
 * pass rebuilds from it and x_l with the forward's own fused add and norm:
 * for a low-precision model, half the bytes for one more read of x_l. */
static inline bool tf_model_keeps_projection(const tf_model *m) { return m->dtype != TF_F32; }

/* ---- pointers into the flat buffers ---------------------------------------- */

static inline float *tf_model_pw(const tf_model *m, int64_t off) { return (float *)tf_tensor_data(m->params) + off; }
/* Where the gradient of parameter element off goes in the ring (see tf_model.ring). */
float *tf_model_ring_at(const tf_model *m, int64_t off);
static inline float *tf_model_gw(const tf_model *m, int64_t off) {
  return m->use_ring ? tf_model_ring_at(m, off) : (float *)tf_tensor_data(m->grads) + off;
}
/* A matmul weight as the GEMMs read it: the low copy, or the f32 parameter. */
static inline void *tf_model_mw(const tf_model *m, int64_t off) {
  if (!m->low) return tf_model_pw(m, off);
  return (char *)tf_tensor_data(m->low) + off * (int64_t)tf_dtype_size(m->dtype);
}
/* Element i of a buffer of the compute dtype. */
static inline void *tf_model_at(const tf_model *m, void *base, int64_t i) {
  return (char *)base + i * (int64_t)tf_dtype_size(m->dtype);
}

/* During a prefill: layer l's keys (turned by RoPE) and values from its
 * fused projection qkv into the KV cache (model_decode.c set prefill_kv). */
static inline tf_status tf_model_prefill_store(tf_model *m, int64_t l, const void *qkv) {
  tf_kv_append_args a = m->prefill_kv;
  a.seq = m->plan.seq;
  a.qkv = qkv;
  a.k_cache = tf_model_at(m, m->prefill_k0, l * m->prefill_layer_elems);
  a.v_cache = tf_model_at(m, m->prefill_v0, l * m->prefill_layer_elems);
  return m->k->kv_append(m->ctx, &a);
}

/* ---- GEMMs ---------------------------------------------------------------------- */

/* model_fp8.c: the layers' products (QKV, output, w1|w3, w2; w is the
 * weight's offset), in FP8 on an FP8 model and as tf_model_linear* below
 * on the others; the e4m3 weights made again when the parameters moved
 * (tf_model_sync_weights). */
tf_status tf_model_layer_linear(tf_model *m, const void *x, int64_t rows, int64_t in, int64_t out, int64_t w, void *y);
tf_status tf_model_layer_linear_dx(tf_model *m, const void *dy, int64_t rows, int64_t in, int64_t out, int64_t w,
                                   void *dx);
tf_status tf_model_layer_linear_backward(tf_model *m, const void *dy, const void *x, int64_t rows, int64_t in,
                                         int64_t out, int64_t w, float *dw, void *dx);
/* Brackets the loss pass's body (model_forward.c): under delayed scaling, the history step for
 * the casts recorded since the last one, then the pass's casts by the recipe. */
tf_status tf_model_fp8_pass_begin(tf_model *m);
void tf_model_fp8_pass_end(tf_model *m);

/* y (rows, out) = x (rows, in) W^T, W (out, in): a bias-free linear layer. */
static inline tf_status tf_model_linear(tf_model *m, const void *x, int64_t rows, int64_t in, int64_t out,
                                        const void *w, void *y) {
  tf_gemm_args g = {.a = x, .b = w, .c = y, .ab_dtype = m->dtype, .c_dtype = m->dtype, .batch = 1,
                    .m = rows, .n = out, .k = in, .trans_b = true, .lda = in, .ldb = in, .ldc = out,
                    .allow_tf32 = m->ctx->allow_tf32, .tune = true};
  return m->k->gemm(m->ctx, &g);
}

/* The linear layer's input gradient: dx (rows, in) = dy (rows, out) W. */
static inline tf_status tf_model_linear_dx(tf_model *m, const void *dy, int64_t rows, int64_t in, int64_t out,
                                           const void *w, void *dx) {
  tf_gemm_args gx = {.a = dy, .b = w, .c = dx, .ab_dtype = m->dtype, .c_dtype = m->dtype, .batch = 1, .m = rows,
                     .n = in, .k = out, .lda = out, .ldb = in, .ldc = in, .allow_tf32 = m->ctx->allow_tf32,
                     .tune = true};
  return m->k->gemm(m->ctx, &gx);
}

/* The linear layer's backward pass: dx (rows, in) = dy W (unless dx is
 * NULL), and dW (f32) += dy^T x; into the ring, dW = dy^T x (each matmul
 * weight has one product per step, so the optimizer need not zero the
 * slot after reading it: 4 bytes a parameter less to write). */
static inline tf_status tf_model_linear_backward(tf_model *m, const void *dy, const void *x, int64_t rows, int64_t in,
                                                 int64_t out, const void *w, float *dw, void *dx) {
  tf_gemm_args gw = {.a = dy, .b = x, .c = dw, .ab_dtype = m->dtype, .c_dtype = TF_F32, .batch = 1, .m = out,
                     .n = in, .k = rows, .trans_a = true, .lda = out, .ldb = in, .ldc = in, .accumulate = !m->use_ring,
                     .allow_tf32 = m->ctx->allow_tf32, .tune = true};
  TF_TRY(m->k->gemm(m->ctx, &gw));
  return dx ? tf_model_linear_dx(m, dy, rows, in, out, w, dx) : TF_OK;
}

#endif
