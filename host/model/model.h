/* The fused Transformer-LM engine: the CS336 "basics" model (DESIGN.md,
 * "Reference semantics") with an explicit forward and backward pass, llm.c
 * style. A training step reads top to bottom as a short list of kernel
 * calls (model_kernels.h) over named, preallocated tensors:
 *
 *   parameters (f32), gradients (f32), AdamW's m and v (f32) and, under
 *   mixed precision, a bf16/f16 copy of the matmul weights: one allocation
 *   each, with a named view per tensor, all laid out alike so the optimizer
 *   runs once over the whole flat buffer;
 *   activations: one allocation planned per (batch, seq), reused while the
 *   shape stays the same, re-planned when it changes.
 *
 * Where the backend has CUDA graphs, the fixed kernel lists of a step are
 * captured once per shape and replayed with one launch each (below).
 *
 * Precision TF_F32 computes in f32 throughout. TF_BF16 / TF_F16 follow
 * PyTorch's autocast: matmuls in the low dtype accumulating in f32, from a
 * low-precision weight copy that the optimizer step refreshes (never
 * re-cast per forward); the residual stream, RMSNorm statistics, softmax
 * and the loss in f32; parameters and their gradients f32.
 *
 * Not thread-safe: one model is driven by one thread at a time. */
#ifndef TF_MODEL_H
#define TF_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nnops.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tf_model_config {
  int64_t vocab_size, context_length, d_model, num_layers, num_heads, d_ff;
  double rope_theta; /* 10000 in CS336 */
} tf_model_config;

/* Checks every field (positive sizes, d_model divisible by num_heads, an
 * even head dim for RoPE, a finite theta > 0, sizes the kernels can index). */
tf_status tf_model_config_check(const tf_model_config *cfg);
/* The number of scalar parameters: V d (embedding) + V d (lm_head) +
 * L (4 d^2 + 3 d d_ff + 2 d) + d. */
int64_t tf_model_config_parameters(const tf_model_config *cfg);

typedef struct tf_model tf_model;

/* A new model on device with precision TF_F32, TF_BF16 or TF_F16 (mixed),
 * initialised from the device's seeded generator in state-dict order
 * (truncated normals cut at 3 std: std sqrt(2 / (in + out)) for linears, 1
 * for the embedding; norm gains 1), gradients and optimizer state zero. */
tf_status tf_model_create(const tf_model_config *cfg, tf_device device, tf_dtype precision, tf_model **out);
/* FP8 training on a bf16 model (model_fp8.c): each layer's four products
 * forward and backward in FP8 by current scaling, weights and activations
 * e4m3, gradients grad (f8e5m2 or f8e4m3); d_model and d_ff multiples of
 * 16, and batch * seq too at each call. Called again, it changes grad. */
tf_status tf_model_set_fp8(tf_model *m, tf_dtype grad);
/* Delayed scaling (Transformer Engine's recipe) in place of current scaling for the training
 * passes' activations and gradients: each cast scaled by the largest amax of its last history
 * steps, recording its own amax as it casts (one pass over the operand, not two); the first step
 * scales by its own amax. history 0 returns to current scaling. Weights keep current scaling. */
tf_status tf_model_set_fp8_delayed(tf_model *m, int64_t history);
typedef struct tf_model_fp8_info {
  bool on;
  tf_dtype grad;
  int64_t history;   /* delayed scaling's history length; 0: current scaling */
  int64_t overflows; /* delayed scaling: casts whose amax exceeded the one they were scaled by (saturated) */
  int64_t nonfinite; /* casts whose amax was not finite (counted on the device since set_fp8) */
  float weight_amax_max, weight_scale_min, weight_scale_max; /* over the layer matrices' last casts */
} tf_model_fp8_info;
/* The recipe's state (waits for the device); on false for other models. */
tf_status tf_model_fp8_stats(tf_model *m, tf_model_fp8_info *out);
/* Delayed scaling's state, for checkpoints: the history tensor (borrowed; NULL under current
 * scaling: f32, the sites' histories, the amax each casts by, the newest, the overflow count) and
 * the two host counts a resumed run needs to cast as the uninterrupted one. */
tf_status tf_model_fp8_history_state(tf_model *m, tf_tensor **history, int64_t *rolls, int64_t *recorded);
tf_status tf_model_set_fp8_history_state(tf_model *m, int64_t rolls, int64_t recorded);
/* Releases the engine; views handed out keep their storage alive. NULL is fine. */
void tf_model_free(tf_model *m);

const tf_model_config *tf_model_get_config(const tf_model *m);
tf_dtype tf_model_precision(const tf_model *m);
/* Attention: FlashAttention-2 (the default under f16/bf16 where the backend
 * has it) or naive (P materialised; the default in f32, where cuBLAS's f32
 * GEMMs are faster than the f32 flash kernel); changing it drops the
 * activation plan. */
tf_status tf_model_set_attention(tf_model *m, bool flash);
bool tf_model_uses_flash(const tf_model *m);
tf_device tf_model_device(const tf_model *m);

/* CUDA graph replay for fixed shapes. A step's phases that are fixed
 * lists of kernels over planned memory (the training forward with the
 * fused loss, the backward pass, the layers of tf_model_forward) run
 * eagerly the first time for a key (batch, seq, training or not, attention,
 * TF32), are captured into a graph the second time, and are replayed from
 * then on: the same kernels on the same buffers, so the same bits. Taking
 * the inputs (with its range check), lm_head of tf_model_forward, the
 * optimizer step and zero_grad stay eager. A phase that cannot be captured
 * runs eagerly for that key; everything runs eagerly while the profiler's
 * collector records (per-kernel ranges), on backends without graphs (the
 * CPU), and with replay off. A new plan, another attention or turning
 * replay off frees the graphs.
 * Replay is on by default where supported, unless the environment has
 * TF_MODEL_GRAPHS=0 (every model); TF_MODEL_GRAPHS_DEBUG=1 says on stderr
 * why a capture failed. */
typedef struct tf_model_graph_stats {
  bool supported; /* the backend can capture graphs */
  bool on;        /* phases are replayed: supported, asked for, not TF_MODEL_GRAPHS=0 */
  uint64_t captures, replays, failures; /* graphs made, launches of them, captures that failed */
} tf_model_graph_stats;
/* Asks for replay (taken where supported and not turned off by the
 * environment) or turns it off (graphs freed). */
void tf_model_set_graphs(tf_model *m, bool on);
tf_model_graph_stats tf_model_graphs(const tf_model *m);

/* The named tensors, in state-dict order: token_embeddings.weight,
 * layers.{i}.ln1.weight, layers.{i}.attn.{q,k,v,output}_proj.weight,
 * layers.{i}.ln2.weight, layers.{i}.ffn.w{1,2,3}.weight, ln_final.weight,
 * lm_head.weight. Views are borrowed (retain them to keep them); they share
 * the engine's storage, so writing into a parameter view writes the model
 * (bump its version, as copy_ does, so the low-precision copy follows). */
int tf_model_num_tensors(const tf_model *m);
const char *tf_model_tensor_name(const tf_model *m, int i);
tf_tensor *tf_model_param(const tf_model *m, int i);
tf_tensor *tf_model_grad(tf_model *m, int i); /* makes the gradients on first use (NULL: out of memory) */
/* AdamW's moments, for checkpoints: *out is a new view (release it) of
 * tensor i's exp_avg (which 0) or exp_avg_sq (which 1), f32 of the
 * parameter's shape, made (zero) when no step has run yet; writing it
 * writes the optimizer's state. Under ZeRO-1 each rank holds only a shard:
 * tf_model_moment_shard gives the rank's whole buffer (a new reference)
 * and the elements [*begin, *end) of the flat layout it holds (0 and the
 * flat size without ZeRO-1). */
tf_status tf_model_moment(tf_model *m, int i, int which, tf_tensor **out);
tf_status tf_model_moment_shard(tf_model *m, int which, tf_tensor **out, int64_t *begin, int64_t *end);
/* The index of a name, or -1. */
int tf_model_find(const tf_model *m, const char *name);
/* Refreshes the low-precision weight copy now if the parameters' storage
 * version moved since it was made (forward passes check this themselves). */
tf_status tf_model_sync_weights(tf_model *m);

/* Bytes held by each part of the engine (activations: the current plan). */
typedef struct tf_model_memory {
  size_t params, grads, optimizer, low_precision, activations;
} tf_model_memory;
tf_model_memory tf_model_memory_use(const tf_model *m);

/* logits (batch, seq, vocab) for ids (batch, seq) of i32/i64 on the
 * model's device or the CPU: a new tensor of the compute dtype (f32, or
 * bf16/f16: lm_head is a linear). training=false keeps no activations
 * (one layer's worth of buffers, reused by every layer); training=true
 * runs the forward pass of a training step, activations kept. */
tf_status tf_model_forward(tf_model *m, const tf_tensor *ids, bool training, tf_tensor **logits);
/* The mean cross-entropy (a new 0-dim f32 tensor) of the model on ids
 * against targets (same shape), keeping what backward needs: the forward
 * pass of a training step plus the fused loss and its gradient. */
tf_status tf_model_loss(tf_model *m, const tf_tensor *ids, const tf_tensor *targets, tf_tensor **loss);
/* Adds d loss / d parameter of the last tf_model_loss into the gradients
 * (as PyTorch's .grad accumulates); one backward per loss. */
tf_status tf_model_backward(tf_model *m);
tf_status tf_model_zero_grad(tf_model *m);
/* One AdamW step over every parameter (one fused kernel over the flat
 * buffers), then the low-precision weight copy refreshed (one conversion). */
tf_status tf_model_adamw_step(tf_model *m, const tf_adamw_args *args);
/* tf_model_backward, then tf_model_adamw_step, with the same bits; where
 * the backend has a second stream, each layer's parameters are updated
 * there as soon as the backward pass has finished with them, beside the
 * rest of the pass (the last backward of a step: gradients accumulated
 * over several backward passes go through tf_model_backward, then
 * tf_model_adamw_step). */
tf_status tf_model_backward_adamw(tf_model *m, const tf_adamw_args *args);
/* Global gradient-norm clipping (CS336's gradient_clipping) in every AdamW
 * step of tf_model_adamw_step and tf_model_backward_adamw from now on: the
 * L2 norm of all the gradients together, and where it is above max_norm
 * every gradient multiplied by max_norm / (norm + 1e-6) before the update.
 * The norm and the factor are worked out on the device and read there by
 * the update (no wait for the host; inside the backward graph on a GPU),
 * so tf_model_backward_adamw then updates after the whole pass instead of
 * beside it, and zeroes the gradients as it reads them. max_norm > 0;
 * INFINITY measures the norm without clipping; 0 turns clipping off.
 * Not with ZeRO-1 (each rank holds part of the gradients). */
tf_status tf_model_set_max_grad_norm(tf_model *m, double max_norm);
double tf_model_max_grad_norm(const tf_model *m);
/* *out: a new 0-dim f32 tensor on the model's device holding the norm
 * before clipping of the last clipped step (a copy queued on the stream:
 * reading its value waits for the step); NULL when no step clipped yet. */
tf_status tf_model_grad_norm(tf_model *m, tf_tensor **out);
/* Where tf_model_backward_adamw updates a layer's parameters: on the second
 * stream beside the rest of the pass (on, the default), or on the pass's
 * own stream before it goes on (off: the same kernels, the same bits, each
 * running alone, which is how their own speed is measured). */
void tf_model_set_overlap(tf_model *m, bool on);
bool tf_model_overlaps(const tf_model *m);
/* Training plans keep the residual stream x_l before each layer only; the
 * backward pass recomputes x_l + attention (one more output-projection GEMM
 * a layer, the same bits) instead of keeping L f32 (n, d) buffers. Off by
 * default; changing it drops the plan. */
void tf_model_set_recompute_residual(tf_model *m, bool on);
bool tf_model_recomputes_residual(const tf_model *m);

/* Data-parallel training over the ranks of the run (tf.dist): every rank
 * runs the same model on its own batch, and the gradients are averaged over
 * the ranks before the optimizer uses them, so that after a step every rank
 * holds the parameters one process would have after the same step over all
 * the ranks' batches together. How the gradients travel: */
typedef enum tf_model_grad_sync {
  TF_GRAD_SYNC_NONE,      /* not data parallel */
  TF_GRAD_SYNC_PER_PARAM, /* one all-reduce per parameter, after the backward pass */
  TF_GRAD_SYNC_FLAT,      /* one all-reduce of the flat gradient buffer, after it */
  TF_GRAD_SYNC_OVERLAP,   /* one per parameter, started as soon as the pass has finished its gradient */
  TF_GRAD_SYNC_BUCKETS    /* buckets of about bucket_mb MB of neighbouring gradients, started as each fills */
} tf_model_grad_sync;

/* Makes the model data parallel (or not again, with TF_GRAD_SYNC_NONE):
 * rank 0's parameters are broadcast to every rank, and from then on
 * tf_model_backward returns with the gradients averaged over the ranks.
 * zero1 also shards AdamW's moments (ZeRO stage 1): each rank keeps and
 * updates only its part of the flat buffers, [r * ceil(total / world),
 * ...), and the parameters are all-gathered after the update, so the
 * optimizer's memory per rank falls by the world size; with
 * TF_GRAD_SYNC_FLAT the gradients are reduce-scattered instead of
 * all-reduced (each rank's shard averaged, the rest of the buffer left
 * with partial sums: half the traffic). Optimizer state
 * held before is dropped (call it before the first step). Overlapped
 * syncs turn graph replay off (the backward pass starts collectives). A
 * world of one is allowed: every collective is then local. */
tf_status tf_model_set_data_parallel(tf_model *m, tf_model_grad_sync sync, double bucket_mb, bool zero1);
tf_model_grad_sync tf_model_data_parallel(const tf_model *m, bool *zero1);

/* ---- generation with a KV cache (model_decode.c, model_sample.c) ------------------- */

/* Prefill: ids (batch, seq) i32/i64 (on the model's device or the CPU; every
 * row the same length: ragged prompts are not supported) run through the
 * layers with each layer's keys (after RoPE) and values kept in a cache of
 * at least max_len positions (seq <= max_len <= context_length; the cache
 * of an earlier prefill is kept, with its captured decode step, when it has
 * the batch and room enough). *logits (or NULL): a new
 * (batch, V) tensor of the compute dtype, the logits of each row's last
 * position. */
tf_status tf_model_prefill(tf_model *m, const tf_tensor *ids, int64_t max_len, tf_tensor **logits);
/* One decode step: ids (batch values on the host) at the next position,
 * appended to the cache; *logits (or NULL) as for prefill. Replayed as one
 * CUDA graph from the third step on where the engine replays graphs. */
tf_status tf_model_decode_step(tf_model *m, const int64_t *ids, tf_tensor **logits);
/* Tokens in the cache (0 before a prefill), its batch, its bytes. */
int64_t tf_model_decode_position(const tf_model *m);
int64_t tf_model_decode_batch(const tf_model *m);
size_t tf_model_decode_bytes(const tf_model *m);
/* The last logits (batch * V floats) into out on the host (waits). */
tf_status tf_model_decode_logits_host(tf_model *m, float *out);
/* Frees the cache (tf_model_free does too). */
void tf_model_decode_release(tf_model *m);

typedef struct tf_generate_opts {
  int64_t max_new_tokens; /* >= 1; prompt + max_new_tokens <= context_length */
  double temperature;     /* 0: greedy */
  double top_p;           /* (0, 1]; 1: no cut */
  int64_t top_k;          /* 0: no cut */
  uint64_t seed;          /* the sampler's own generator */
  const int64_t *stop;    /* a row that emits one of these stops */
  int nstop;
} tf_generate_opts;
typedef struct tf_generate_stats {
  double prefill_ms, decode_ms; /* the prefill (to its logits on the host), then the rest */
  int64_t decode_steps, batch, prompt;
} tf_generate_stats;
/* Prefill, then a decode step a token, each row's token drawn on the host
 * (model_sample.c). out: batch * max_new_tokens ids (row-major); a row
 * that stopped holds -1 after its stop token; *produced: the columns
 * written (fewer than max_new_tokens when every row stopped). stats may be
 * NULL. */
tf_status tf_model_generate(tf_model *m, const tf_tensor *prompt, const tf_generate_opts *o, int64_t *out,
                            int64_t *produced, tf_generate_stats *stats);
tf_status tf_model_generate_check(const tf_model *m, const tf_tensor *prompt, const tf_generate_opts *o);
/* One row of logits sampled by o's rules (greedy at temperature 0). buf:
 * scratch for V tokens (tf_sample_buf_make), unused when greedy. */
typedef struct tf_sample_entry_buf {
  void *entries;
  double *probs;
} tf_sample_entry_buf;
tf_status tf_sample_buf_make(int64_t V, tf_sample_entry_buf *buf);
void tf_sample_buf_free(tf_sample_entry_buf *buf);
int64_t tf_model_sample_row(const float *row, int64_t V, const tf_generate_opts *o, uint64_t *rng,
                            tf_sample_entry_buf *buf);

#ifdef __cplusplus
}
#endif
#endif
