/* The engine's CUDA graph replay (model.c) checked on the CPU through a
 * recording stand-in for a backend's graph hooks: while "capturing", every
 * kernel call of the engine's table is recorded with its arguments by
 * value instead of running (as a CUDA capture records launches), and a
 * replay runs the records. A model replaying and one running eagerly,
 * seeded alike, must agree in every bit of every loss, gradient and logit,
 * which they only do if nothing a phase needs changes between calls (a
 * loss written into the caller's new tensor, or lm_head into a forward's
 * new logits, would be replayed into the first call's tensor). The
 * counters must follow the policy: a key's first call eager, the second
 * captured, later ones replayed; a refused capture, or one that took
 * memory from the caching allocator, runs eagerly for good. Attention is
 * naive here: flash attention is a backend op, outside the recorded table.
 * TF_TEST_SEED repeats a run. */
#include <string.h>

#include "backends.h"
#include "model_internal.h"
#include "nnref.h"

enum { B = 2, T = 8, V = 64 };
static const tf_model_config CFG = {V, 16, 32, 2, 4, 64, 10000.0};

/* ---- the recording graph hooks ------------------------------------------------------------- */

typedef enum { REC_GEMM, REC_ENCODER, REC_RMSNORM, REC_SWIGLU, REC_ROPE, REC_HEADS, REC_SOFTMAX, REC_LOSS } rec_kind;

/* One recorded kernel call. */
typedef struct rec {
  rec_kind kind;
  union {
    tf_gemm_args gemm;
    tf_encoder_args encoder;
    tf_rmsnorm_args rmsnorm;
    tf_swiglu_args swiglu;
    tf_rope_heads_args rope;
    tf_heads_args heads;
    tf_causal_softmax_args softmax;
    tf_lm_loss_args loss;
  } a;
} rec;

struct tf_graph {
  rec *recs;
  int n;
};

static const tf_model_kernels *cpu; /* the CPU backend's kernels, which run the calls */
static tf_model_kernels recording;  /* the same, with the graph hooks below */

static struct {
  tf_graph *g;   /* being recorded; NULL when not capturing */
  bool refuse;   /* capture_end fails, as a spoiled CUDA capture does */
  bool allocate; /* GEMMs take a cached block from the allocator while captured */
  int live;      /* graphs made and not yet destroyed */
} capture;

static tf_status record(rec r) {
  tf_graph *g = capture.g;
  rec *more = realloc(g->recs, (size_t)(g->n + 1) * sizeof *more);
  if (!more) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a recorded call");
  g->recs = more;
  g->recs[g->n++] = r;
  return TF_OK;
}

/* A kernel of the table: run now, or recorded while capturing. */
#define TF_RECORDING(name, fn, kind_, member, type)                 \
  static tf_status name(tf_device_ctx *ctx, const type *a) {        \
    if (!capture.g) return cpu->fn(ctx, a);                         \
    return record((rec){.kind = kind_, .a.member = *a});            \
  }
TF_RECORDING(recording_encoder, encoder, REC_ENCODER, encoder, tf_encoder_args)
TF_RECORDING(recording_rmsnorm, rmsnorm, REC_RMSNORM, rmsnorm, tf_rmsnorm_args)
TF_RECORDING(recording_swiglu, swiglu, REC_SWIGLU, swiglu, tf_swiglu_args)
TF_RECORDING(recording_rope, rope_heads, REC_ROPE, rope, tf_rope_heads_args)
TF_RECORDING(recording_heads, heads, REC_HEADS, heads, tf_heads_args)
TF_RECORDING(recording_softmax, causal_softmax, REC_SOFTMAX, softmax, tf_causal_softmax_args)
TF_RECORDING(recording_loss, lm_loss, REC_LOSS, loss, tf_lm_loss_args)
#undef TF_RECORDING

/* With capture.allocate, a capture also takes (and returns) a small block
 * from the caching allocator: one it already holds, so nothing but the
 * engine's check can notice. */
static tf_status recording_gemm(tf_device_ctx *ctx, const tf_gemm_args *a) {
  if (!capture.g) return cpu->gemm(ctx, a);
  if (capture.allocate) {
    tf_block *b = NULL;
    TF_TRY(tf_alloc(&ctx->alloc, 256, &b));
    tf_alloc_free(&ctx->alloc, b);
  }
  return record((rec){.kind = REC_GEMM, .a.gemm = *a});
}

static tf_status replay(tf_device_ctx *ctx, const rec *r) {
  switch (r->kind) {
    case REC_GEMM: return cpu->gemm(ctx, &r->a.gemm);
    case REC_ENCODER: return cpu->encoder(ctx, &r->a.encoder);
    case REC_RMSNORM: return cpu->rmsnorm(ctx, &r->a.rmsnorm);
    case REC_SWIGLU: return cpu->swiglu(ctx, &r->a.swiglu);
    case REC_ROPE: return cpu->rope_heads(ctx, &r->a.rope);
    case REC_HEADS: return cpu->heads(ctx, &r->a.heads);
    case REC_SOFTMAX: return cpu->causal_softmax(ctx, &r->a.softmax);
    case REC_LOSS: return cpu->lm_loss(ctx, &r->a.loss);
  }
  return tf_fail(TF_ERR_STATE, "test: a record of no known kind");
}

static tf_status recording_begin(tf_device_ctx *ctx) {
  (void)ctx;
  if (capture.g) return tf_fail(TF_ERR_STATE, "test: a capture inside a capture");
  capture.g = calloc(1, sizeof *capture.g);
  return capture.g ? TF_OK : tf_fail(TF_ERR_OOM, "out of memory: no host memory for a graph");
}

static void recording_destroy(tf_device_ctx *ctx, tf_graph *g) {
  (void)ctx;
  if (!g) return;
  free(g->recs);
  free(g);
  capture.live--;
}

static tf_status recording_end(tf_device_ctx *ctx, tf_graph **out) {
  tf_graph *g = capture.g;
  capture.g = NULL;
  capture.live++;
  *out = NULL;
  if (capture.refuse) {
    recording_destroy(ctx, g);
    return tf_fail(TF_ERR_BACKEND, "test: capture refused");
  }
  *out = g;
  return TF_OK;
}

static tf_status recording_launch(tf_device_ctx *ctx, tf_graph *g) {
  for (int i = 0; i < g->n; i++) TF_TRY(replay(ctx, &g->recs[i]));
  return TF_OK;
}

static void recording_init(void) {
  tf_device_ctx *ctx = NULL;
  if (!CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx))) exit(1);
  cpu = ctx->backend->model;
  recording = *cpu;
  recording.gemm = recording_gemm;
  recording.encoder = recording_encoder;
  recording.rmsnorm = recording_rmsnorm;
  recording.swiglu = recording_swiglu;
  recording.rope_heads = recording_rope;
  recording.heads = recording_heads;
  recording.causal_softmax = recording_softmax;
  recording.lm_loss = recording_loss;
  recording.capture_begin = recording_begin;
  recording.capture_end = recording_end;
  recording.graph_launch = recording_launch;
  recording.graph_destroy = recording_destroy;
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A model of the seed on the recording table, naive attention, replay as asked. */
static tf_model *make(tf_dtype precision, bool graphs) {
  tf_seed_all(17);
  tf_model *m = NULL;
  if (!CHECK_OK(tf_model_create(&CFG, tf_cpu(), precision, &m))) exit(1);
  CHECK_OK(tf_model_set_attention(m, false));
  m->k = &recording;
  tf_model_set_graphs(m, graphs);
  CHECK(tf_model_graphs(m).on == graphs);
  return m;
}

static tf_tensor *random_ids(int64_t b, int64_t t) {
  double v[B * T * 2];
  for (int64_t i = 0; i < b * t; i++) v[i] = (double)rng_int(0, V);
  return tensor_from(v, SHAPE(b, t), TF_I64);
}

static bool same_bits(const tf_tensor *x, const tf_tensor *y) {
  const int64_t n = tf_tensor_numel(x);
  double *u = tensor_values(x), *v = tensor_values(y);
  bool same = n == tf_tensor_numel(y) && memcmp(u, v, (size_t)n * sizeof *u) == 0;
  free(u), free(v);
  return same;
}

static double item(const tf_tensor *t) {
  double *v = tensor_values(t), x = v[0];
  free(v);
  return x;
}

/* m's graph counters are {captures, replays, failures}. */
static void counts(const tf_model *m, uint64_t captures, uint64_t replays, uint64_t failures) {
  tf_model_graph_stats g = tf_model_graphs(m);
  CHECK_INT(g.captures, captures);
  CHECK_INT(g.replays, replays);
  CHECK_INT(g.failures, failures);
}

/* One training step on both models: the same loss bits and gradient bits,
 * then AdamW and zero_grad. Returns the loss tensor of the model with
 * graphs (to release). */
static tf_tensor *step_both(tf_model *on, tf_model *off, const tf_tensor *ids, const tf_tensor *targets, int step) {
  tf_tensor *la = NULL, *lb = NULL;
  CHECK_OK(tf_model_loss(on, ids, targets, &la));
  CHECK_OK(tf_model_loss(off, ids, targets, &lb));
  CHECK_OK(tf_model_backward(on));
  CHECK_OK(tf_model_backward(off));
  CHECK(item(la) == item(lb));
  for (int i = 0; i < tf_model_num_tensors(on); i++)
    if (!CHECK(same_bits(tf_model_grad(on, i), tf_model_grad(off, i))))
      fprintf(stderr, "  step %d: %s differs\n", step, tf_model_tensor_name(on, i));
  const tf_adamw_args args = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                              .step = step};
  CHECK_OK(tf_model_adamw_step(on, &args));
  CHECK_OK(tf_model_adamw_step(off, &args));
  CHECK_OK(tf_model_zero_grad(on));
  CHECK_OK(tf_model_zero_grad(off));
  tf_tensor_release(lb);
  return la;
}

/* n steps on both models, their losses not kept; *step counts them. */
static void steps(tf_model *on, tf_model *off, const tf_tensor *ids, const tf_tensor *targets, int n, int *step) {
  for (int i = 0; i < n; i++) tf_tensor_release(step_both(on, off, ids, targets, ++*step));
}

/* Three forward calls on both models, every result kept until all are
 * compared (a freed tensor's memory would come back as the next one). */
static void forward_both(tf_model *on, tf_model *off, const tf_tensor *ids, bool training) {
  tf_tensor *a[3] = {NULL}, *b[3] = {NULL};
  for (int i = 0; i < 3; i++) {
    CHECK_OK(tf_model_forward(on, ids, training, &a[i]));
    CHECK_OK(tf_model_forward(off, ids, training, &b[i]));
  }
  for (int i = 0; i < 3; i++) {
    CHECK(same_bits(a[i], b[i]));
    tf_tensor_release(a[i]), tf_tensor_release(b[i]);
  }
}

/* Frees both models, and with them every graph made. */
static void free_both(tf_model *on, tf_model *off) {
  tf_model_free(on), tf_model_free(off);
  CHECK_INT(capture.live, 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Steps at one shape, then another and back; the losses of replays are
 * tensors of their own, kept here until the end. */
static void test_training(tf_dtype precision) {
  tf_model *on = make(precision, true), *off = make(precision, false);
  tf_tensor *x = random_ids(B, T), *y = random_ids(B, T), *xs = random_ids(1, T), *ys = random_ids(1, T);
  tf_tensor *loss[6];
  double value[6];
  int s = 0;
  for (; s < 6; s++) {
    loss[s] = step_both(on, off, x, y, s + 1);
    value[s] = item(loss[s]);
    if (s == 0) counts(on, 0, 0, 0); /* the first call of a key runs eagerly */
    if (s == 1) counts(on, 2, 2, 0); /* the second captures forward + loss and backward */
  }
  counts(on, 2, 10, 0);
  CHECK(value[5] < value[0] && value[5] != value[4]);
  for (int i = 0; i < 6; i++) {
    CHECK(item(loss[i]) == value[i]);
    tf_tensor_release(loss[i]);
  }
  counts(off, 0, 0, 0);
  steps(on, off, xs, ys, 1, &s);
  counts(on, 2, 10, 0); /* a new plan: the graphs went with the old one */
  steps(on, off, xs, ys, 2, &s);
  counts(on, 4, 14, 0);
  steps(on, off, x, y, 2, &s);
  counts(on, 6, 16, 0);
  tf_tensor_release(x), tf_tensor_release(y), tf_tensor_release(xs), tf_tensor_release(ys);
  free_both(on, off);
}

/* The layers replayed, lm_head into each call's new logits. */
static void test_inference(void) {
  tf_model *on = make(TF_BF16, true), *off = make(TF_BF16, false);
  tf_tensor *x = random_ids(1, T), *y = random_ids(1, T);
  int s = 0;
  forward_both(on, off, x, false);
  counts(on, 1, 2, 0);
  forward_both(on, off, x, true);
  counts(on, 2, 4, 0);
  steps(on, off, x, y, 2, &s);
  forward_both(on, off, x, false); /* on the training plan */
  counts(on, 5, 8, 0);
  tf_tensor_release(x), tf_tensor_release(y);
  free_both(on, off);
}

/* A refused capture, or one that took memory, runs eagerly: counted once
 * per phase, never tried again for the key; a new key tries again. */
static void test_failed_captures(void) {
  tf_model *on = make(TF_F32, true), *off = make(TF_F32, false);
  tf_tensor *x = random_ids(B, T), *y = random_ids(B, T), *xs = random_ids(1, T), *ys = random_ids(1, T);
  int s = 0;
  capture.refuse = true;
  steps(on, off, x, y, 4, &s);
  counts(on, 0, 0, 2);
  capture.refuse = false;
  steps(on, off, x, y, 1, &s);
  counts(on, 0, 0, 2);
  capture.allocate = true;
  steps(on, off, xs, ys, 3, &s);
  counts(on, 0, 0, 4);
  capture.allocate = false;
  steps(on, off, x, y, 3, &s);
  counts(on, 2, 4, 4);
  tf_tensor_release(x), tf_tensor_release(y), tf_tensor_release(xs), tf_tensor_release(ys);
  free_both(on, off);
}

/* A bad id fails before any phase, with the same message; the graphs keep
 * replaying after it. Turning replay off frees them. */
static void test_errors_and_switch(void) {
  tf_model *on = make(TF_BF16, true), *off = make(TF_BF16, false);
  tf_tensor *x = random_ids(B, T), *y = random_ids(B, T), *loss = NULL;
  int s = 0;
  steps(on, off, x, y, 3, &s);
  counts(on, 2, 4, 0);
  double v[B * T];
  for (int i = 0; i < B * T; i++) v[i] = i == T + 3 ? V : 1;
  tf_tensor *bad = tensor_from(v, SHAPE(B, T), TF_I64);
  CHECK_INT(tf_model_loss(on, bad, y, &loss), TF_ERR_ARG);
  CHECK(strstr(tf_last_error(), "token id 64 at position [1, 3] is out of range [0, 64)") != NULL);
  CHECK_INT(tf_model_backward(on), TF_ERR_STATE);
  counts(on, 2, 4, 0);
  steps(on, off, x, y, 1, &s);
  counts(on, 2, 6, 0);
  tf_model_set_graphs(on, false);
  CHECK(!tf_model_graphs(on).on);
  CHECK_INT(capture.live, 0);
  steps(on, off, x, y, 1, &s);
  counts(on, 2, 6, 0);
  tf_model_set_graphs(on, true);
  steps(on, off, x, y, 2, &s);
  counts(on, 4, 8, 0);
  tf_tensor_release(bad), tf_tensor_release(x), tf_tensor_release(y);
  free_both(on, off);
}

int main(void) {
  tf_backends_init();
  const char *env = getenv("TF_MODEL_GRAPHS");
  if (env && strcmp(env, "0") == 0) tf_check_skip("TF_MODEL_GRAPHS=0 turns graph replay off");
  test_seed();
  recording_init();
  test_training(TF_F32);
  test_training(TF_BF16);
  test_inference();
  test_failed_captures();
  test_errors_and_switch();
  tf_device_ctx *ctx = NULL;
  if (CHECK_OK(tf_device_ctx_get(tf_cpu(), &ctx))) CHECK_INT(ctx->alloc.stats.active_blocks, 0);
  return tf_check_done();
}
