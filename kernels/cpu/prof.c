/* Op records timed on the host (cpu_prof.h): on the CPU device they are
 * the profiler's "kernels". Each wrapper costs one relaxed load when no
 * collector records host ops; when one does, two clock reads and one
 * locked append. */
#include "cpu_prof.h"

#include <pthread.h>
#include <stdatomic.h>

#include "model_kernels.h"
#include "prof.h"

typedef struct tf_prof_wrap {
  const tf_backend *plain;
  tf_backend table;
  tf_model_kernels model;
} tf_prof_wrap;

enum { TF_PROF_WRAPS = 4 };
static tf_prof_wrap tf_wraps[TF_PROF_WRAPS];
static atomic_int tf_wrap_count;
static pthread_mutex_t tf_wrap_lock = PTHREAD_MUTEX_INITIALIZER;

/* The plain table behind ctx's wrapped one (the first wrapped, if ctx was
 * handed a plain table directly). */
static const tf_backend *tf_plain_of(const tf_device_ctx *ctx) {
  int n = atomic_load_explicit(&tf_wrap_count, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (&tf_wraps[i].table == ctx->backend || tf_wraps[i].plain == ctx->backend) return tf_wraps[i].plain;
  return tf_wraps[0].plain;
}

/* Returns plain's CALL, timed when host ops are being recorded. */
#define TF_PROF_TIMED(ctx, NAME, CALL)                                                  \
  do {                                                                                  \
    if (!tf_prof_host_ops_on()) return (CALL);                                          \
    uint64_t tf_range_ = tf_range_current();                                            \
    int64_t tf_start_ = tf_clock_ns();                                               \
    tf_status tf_st_ = (CALL);                                                          \
    tf_prof_record_host_op((NAME), (ctx)->device, tf_start_, tf_clock_ns(), tf_range_); \
    return tf_st_;                                                                      \
  } while (0)

#define TF_PLAIN(ctx) tf_plain_of(ctx)
#define TF_PLAIN_MODEL(ctx) tf_plain_of(ctx)->model

/* ---- op names --------------------------------------------------------------------------- */

#define TF_PROF_UNARY_NAME(CODE, name, kind, formula) "unary:" #name,
#define TF_PROF_BINARY_NAME(CODE, name, kind, formula) "binary:" #name,
static const char *const tf_unary_names[] = {TF_UNARY_OPS(TF_PROF_UNARY_NAME)};
static const char *const tf_binary_names[] = {TF_BINARY_OPS(TF_PROF_BINARY_NAME)};
static const char *const tf_reduce_names[] = {"reduce:sum", "reduce:mean", "reduce:max", "reduce:min"};
#undef TF_PROF_UNARY_NAME
#undef TF_PROF_BINARY_NAME

static const char *tf_unary_name(tf_unary_op op) {
  return (unsigned)op < TF_UNARY_COUNT ? tf_unary_names[op] : "unary";
}
static const char *tf_binary_name(tf_binary_op op) {
  return (unsigned)op < TF_BINARY_COUNT ? tf_binary_names[op] : "binary";
}
static const char *tf_reduce_name(tf_reduce_op op) {
  return (unsigned)op < TF_REDUCE_COUNT ? tf_reduce_names[op] : "reduce";
}

/* ---- the general ops (backend.h) -------------------------------------------------------- */

static tf_status tf_prof_copy(tf_device_ctx *ctx, void *dst, const void *src, size_t bytes, tf_copy_dir dir) {
  TF_PROF_TIMED(ctx, "copy", TF_PLAIN(ctx)->copy(ctx, dst, src, bytes, dir));
}
static tf_status tf_prof_fill(tf_device_ctx *ctx, tf_tensor *out, double value) {
  TF_PROF_TIMED(ctx, "fill", TF_PLAIN(ctx)->fill(ctx, out, value));
}
static tf_status tf_prof_arange(tf_device_ctx *ctx, tf_tensor *out, double start, double step) {
  TF_PROF_TIMED(ctx, "arange", TF_PLAIN(ctx)->arange(ctx, out, start, step));
}
static tf_status tf_prof_random(tf_device_ctx *ctx, tf_tensor *out, const tf_random_args *args) {
  TF_PROF_TIMED(ctx, "random", TF_PLAIN(ctx)->random(ctx, out, args));
}
static tf_status tf_prof_convert(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst) {
  TF_PROF_TIMED(ctx, "convert", TF_PLAIN(ctx)->convert(ctx, src, dst));
}
static tf_status tf_prof_convert_saturate(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst) {
  TF_PROF_TIMED(ctx, "convert", TF_PLAIN(ctx)->convert_saturate(ctx, src, dst));
}
static tf_status tf_prof_unary(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out) {
  TF_PROF_TIMED(ctx, tf_unary_name(op), TF_PLAIN(ctx)->unary(ctx, op, a, out));
}
static tf_status tf_prof_binary(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b,
                                double scalar, tf_scalar_side side, tf_tensor *out) {
  TF_PROF_TIMED(ctx, tf_binary_name(op), TF_PLAIN(ctx)->binary(ctx, op, a, b, scalar, side, out));
}
static tf_status tf_prof_reduce(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                                int64_t inner, tf_tensor *out) {
  TF_PROF_TIMED(ctx, tf_reduce_name(op), TF_PLAIN(ctx)->reduce(ctx, op, a, outer, r, inner, out));
}
static tf_status tf_prof_matmul(tf_device_ctx *ctx, const tf_matmul_args *args) {
  TF_PROF_TIMED(ctx, "matmul", TF_PLAIN(ctx)->matmul(ctx, args));
}
static tf_status tf_prof_softmax(tf_device_ctx *ctx, const tf_softmax_args *args) {
  const char *name = args->log ? (args->dy ? "log_softmax_backward" : "log_softmax")
                               : (args->dy ? "softmax_backward" : "softmax");
  TF_PROF_TIMED(ctx, name, TF_PLAIN(ctx)->softmax(ctx, args));
}
static tf_status tf_prof_norm(tf_device_ctx *ctx, const tf_norm_args *args) {
  const char *name = args->kind == TF_NORM_RMS ? (args->backward ? "rms_norm_backward" : "rms_norm")
                                               : (args->backward ? "layer_norm_backward" : "layer_norm");
  TF_PROF_TIMED(ctx, name, TF_PLAIN(ctx)->norm(ctx, args));
}
static tf_status tf_prof_cross_entropy(tf_device_ctx *ctx, const tf_cross_entropy_args *args, int64_t *bad) {
  TF_PROF_TIMED(ctx, args->backward ? "cross_entropy_backward" : "cross_entropy",
                TF_PLAIN(ctx)->cross_entropy(ctx, args, bad));
}
static tf_status tf_prof_rope(tf_device_ctx *ctx, const tf_rope_args *args) {
  TF_PROF_TIMED(ctx, args->inverse ? "rope_inverse" : "rope", TF_PLAIN(ctx)->rope(ctx, args));
}
static tf_status tf_prof_embedding(tf_device_ctx *ctx, const tf_embedding_args *args, int64_t *bad) {
  TF_PROF_TIMED(ctx, args->backward ? "embedding_backward" : "embedding", TF_PLAIN(ctx)->embedding(ctx, args, bad));
}
static tf_status tf_prof_masked_fill(tf_device_ctx *ctx, const tf_tensor *x, const tf_tensor *mask, double value,
                                     tf_tensor *out) {
  TF_PROF_TIMED(ctx, "masked_fill", TF_PLAIN(ctx)->masked_fill(ctx, x, mask, value, out));
}
static tf_status tf_prof_adamw(tf_device_ctx *ctx, const tf_adamw_update *args) {
  TF_PROF_TIMED(ctx, "adamw", TF_PLAIN(ctx)->adamw(ctx, args));
}
static tf_status tf_prof_flash_attention(tf_device_ctx *ctx, const tf_flash_args *args) {
  TF_PROF_TIMED(ctx, args->backward ? "flash_attention_backward" : "flash_attention",
                TF_PLAIN(ctx)->flash_attention(ctx, args));
}

/* ---- the Transformer engine's kernels (model_kernels.h) ------------------------------------ */

/* The model kernels that take one argument struct, timed under a fixed name. */
#define TF_PROF_MODEL_OP(fn, member, type, name)                   \
  static tf_status fn(tf_device_ctx *ctx, const type *a) {         \
    TF_PROF_TIMED(ctx, name, TF_PLAIN_MODEL(ctx)->member(ctx, a)); \
  }
TF_PROF_MODEL_OP(tf_prof_lm_loss, lm_loss, tf_lm_loss_args, "lm_loss")
TF_PROF_MODEL_OP(tf_prof_model_adamw, adamw, tf_model_adamw_args, "adamw")
TF_PROF_MODEL_OP(tf_prof_grad_norm, grad_norm, tf_grad_norm_args, "grad_norm")
TF_PROF_MODEL_OP(tf_prof_kv_append, kv_append, tf_kv_append_args, "kv_append")
TF_PROF_MODEL_OP(tf_prof_decode_attention, decode_attention, tf_decode_attention_args, "decode_attention")
TF_PROF_MODEL_OP(tf_prof_fp8_amax, fp8_amax, tf_fp8_amax_args, "fp8_amax")
TF_PROF_MODEL_OP(tf_prof_fp8_quantize, fp8_quantize, tf_fp8_quantize_args, "fp8_quantize")
TF_PROF_MODEL_OP(tf_prof_fp8_history, fp8_history, tf_fp8_history_args, "fp8_history")
#undef TF_PROF_MODEL_OP
static tf_status tf_prof_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *a);
static tf_status tf_prof_product(tf_device_ctx *ctx, const tf_gemm_args *a) {
  TF_PROF_TIMED(ctx, "gemm", TF_PLAIN_MODEL(ctx)->gemm(ctx, a));
}
/* The product timed alone, what follows it (then_swiglu, then_append) under its own name. */
static tf_status tf_prof_gemm(tf_device_ctx *ctx, const tf_gemm_args *a) {
  tf_gemm_args g = *a;
  g.then_swiglu = NULL;
  g.then_append = NULL;
  TF_TRY(tf_prof_product(ctx, &g));
  if (a->then_swiglu) TF_TRY(tf_prof_swiglu(ctx, a->then_swiglu));
  return a->then_append ? tf_prof_kv_append(ctx, a->then_append) : TF_OK;
}
static tf_status tf_prof_index_check(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit,
                                     int64_t *bad) {
  TF_PROF_TIMED(ctx, "index_check", TF_PLAIN_MODEL(ctx)->index_check(ctx, idx, n, limit, bad));
}
static tf_status tf_prof_encoder(tf_device_ctx *ctx, const tf_encoder_args *a) {
  TF_PROF_TIMED(ctx, a->backward ? "encoder_backward" : "encoder", TF_PLAIN_MODEL(ctx)->encoder(ctx, a));
}
static tf_status tf_prof_rmsnorm(tf_device_ctx *ctx, const tf_rmsnorm_args *a) {
  TF_PROF_TIMED(ctx, a->backward ? "rmsnorm_backward" : "rmsnorm", TF_PLAIN_MODEL(ctx)->rmsnorm(ctx, a));
}
static tf_status tf_prof_swiglu(tf_device_ctx *ctx, const tf_swiglu_args *a) {
  TF_PROF_TIMED(ctx, a->backward ? "swiglu_backward" : "swiglu", TF_PLAIN_MODEL(ctx)->swiglu(ctx, a));
}
static tf_status tf_prof_rope_heads(tf_device_ctx *ctx, const tf_rope_heads_args *a) {
  TF_PROF_TIMED(ctx, a->backward ? "rope_heads_backward" : "rope_heads", TF_PLAIN_MODEL(ctx)->rope_heads(ctx, a));
}
static tf_status tf_prof_heads(tf_device_ctx *ctx, const tf_heads_args *a) {
  TF_PROF_TIMED(ctx, a->split ? "heads_split" : "heads_merge", TF_PLAIN_MODEL(ctx)->heads(ctx, a));
}
static tf_status tf_prof_causal_softmax(tf_device_ctx *ctx, const tf_causal_softmax_args *a) {
  TF_PROF_TIMED(ctx, a->backward ? "causal_softmax_backward" : "causal_softmax",
                TF_PLAIN_MODEL(ctx)->causal_softmax(ctx, a));
}

/* ---- the tables ------------------------------------------------------------------------- */

/* Wraps what plain has; members it lacks stay NULL. */
#define TF_PROF_WRAP(dst, src, member, fn) \
  if ((src)->member) (dst)->member = fn

static void tf_prof_wrap_init(tf_prof_wrap *w, const tf_backend *plain) {
  w->plain = plain;
  w->table = *plain;
  tf_backend *t = &w->table;
  TF_PROF_WRAP(t, plain, copy, tf_prof_copy);
  TF_PROF_WRAP(t, plain, fill, tf_prof_fill);
  TF_PROF_WRAP(t, plain, arange, tf_prof_arange);
  TF_PROF_WRAP(t, plain, random, tf_prof_random);
  TF_PROF_WRAP(t, plain, convert, tf_prof_convert);
  TF_PROF_WRAP(t, plain, convert_saturate, tf_prof_convert_saturate);
  TF_PROF_WRAP(t, plain, unary, tf_prof_unary);
  TF_PROF_WRAP(t, plain, binary, tf_prof_binary);
  TF_PROF_WRAP(t, plain, reduce, tf_prof_reduce);
  TF_PROF_WRAP(t, plain, matmul, tf_prof_matmul);
  TF_PROF_WRAP(t, plain, softmax, tf_prof_softmax);
  TF_PROF_WRAP(t, plain, norm, tf_prof_norm);
  TF_PROF_WRAP(t, plain, cross_entropy, tf_prof_cross_entropy);
  TF_PROF_WRAP(t, plain, rope, tf_prof_rope);
  TF_PROF_WRAP(t, plain, embedding, tf_prof_embedding);
  TF_PROF_WRAP(t, plain, masked_fill, tf_prof_masked_fill);
  TF_PROF_WRAP(t, plain, adamw, tf_prof_adamw);
  TF_PROF_WRAP(t, plain, flash_attention, tf_prof_flash_attention);
  if (plain->model) {
    const tf_model_kernels *pm = plain->model;
    tf_model_kernels *m = &w->model;
    *m = *pm;
    TF_PROF_WRAP(m, pm, gemm, tf_prof_gemm);
    TF_PROF_WRAP(m, pm, index_check, tf_prof_index_check);
    TF_PROF_WRAP(m, pm, encoder, tf_prof_encoder);
    TF_PROF_WRAP(m, pm, rmsnorm, tf_prof_rmsnorm);
    TF_PROF_WRAP(m, pm, swiglu, tf_prof_swiglu);
    TF_PROF_WRAP(m, pm, rope_heads, tf_prof_rope_heads);
    TF_PROF_WRAP(m, pm, heads, tf_prof_heads);
    TF_PROF_WRAP(m, pm, causal_softmax, tf_prof_causal_softmax);
    TF_PROF_WRAP(m, pm, lm_loss, tf_prof_lm_loss);
    TF_PROF_WRAP(m, pm, adamw, tf_prof_model_adamw);
    TF_PROF_WRAP(m, pm, grad_norm, tf_prof_grad_norm);
    TF_PROF_WRAP(m, pm, kv_append, tf_prof_kv_append);
    TF_PROF_WRAP(m, pm, decode_attention, tf_prof_decode_attention);
    TF_PROF_WRAP(m, pm, fp8_amax, tf_prof_fp8_amax);
    TF_PROF_WRAP(m, pm, fp8_quantize, tf_prof_fp8_quantize);
    TF_PROF_WRAP(m, pm, fp8_history, tf_prof_fp8_history);
    t->model = m;
  }
}

const tf_backend *tf_cpu_prof_backend(const tf_backend *plain) {
  if (!plain) return NULL;
  const tf_backend *found = NULL;
  pthread_mutex_lock(&tf_wrap_lock);
  int n = atomic_load_explicit(&tf_wrap_count, memory_order_relaxed);
  for (int i = 0; i < n && !found; i++)
    if (tf_wraps[i].plain == plain || &tf_wraps[i].table == plain) found = &tf_wraps[i].table;
  if (!found && n < TF_PROF_WRAPS) {
    tf_prof_wrap_init(&tf_wraps[n], plain);
    atomic_store_explicit(&tf_wrap_count, n + 1, memory_order_release);
    found = &tf_wraps[n].table;
  }
  pthread_mutex_unlock(&tf_wrap_lock);
  return found ? found : plain; /* more plain tables than slots: unwrapped */
}

bool tf_prof_backend_is_wrapped(const tf_backend *b) {
  int n = atomic_load_explicit(&tf_wrap_count, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (&tf_wraps[i].table == b) return true;
  return false;
}
