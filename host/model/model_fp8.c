/* FP8 training (precision "fp8"): each layer's four products (QKV, the
 * attention output, w1|w3, w2) forward and backward in FP8 by current
 * scaling, on the backend's scaled GEMM (tf_gemm_scaled); attention, the
 * norms, SwiGLU, the loss, lm_head and the f32 master weights and AdamW as
 * in bf16, the compute dtype.
 *
 * Current scaling: each operand is cast with its own amax of this step,
 * q = 448 / amax for e4m3 (57344 for e5m2), saturate(x q); the product
 * multiplies by the two 1 / q. Weights (from their bf16 copy, which the
 * optimizer keeps: half the bytes of the f32 parameters to read) and
 * activations are e4m3; the gradients dy are f8e5m2 by default (its range
 * holds the gradients' spread without a scale that flushes their small
 * values) or e4m3 (tf_model_set_fp8). Hopper's FP8 products take operands
 * with their rows along K only (tf_gemm_scaled), so a linear layer y = x W^T
 * needs:
 *   forward  y  = x8 (n, in) . W8 (out, in)        the weight's e4m3 copy
 *   backward dx = dy8 (n, out) . W8t (in, out)     the copy of its transpose
 *            dW = dy8t (out, n) . x8t (in, n)      both operands transposed
 * The weights' two copies are made once when the parameters move (at the
 * next forward, eagerly, never inside a graph); the activations' casts run
 * in the pass (an amax kernel, then one cast kernel writing the layouts the
 * products need), into four plan buffers that one product at a time uses.
 * The backward pass casts each input again, transposed, by the amax the
 * forward pass measured (the same bits: kept or recomputed exactly), and
 * w2's gradient dy once for both of its products.
 * An amax that is not finite (an overflow upstream) casts the tensor with
 * q = 1 (saturating) and is counted (tf_model_fp8_stats). */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

/* fp8_state's words: each layer matrix i's weight (amax, scale) at 2i, 2i + 1, then its input's
 * (amax, scale) at 2 (4L + i) (written by the forward pass, read again by the backward pass, which
 * casts the same input again, transposed, without a second amax), then these. Each word has 16
 * bytes to itself: cuBLASLt refuses, at launch, scale pointers that are not 16-byte aligned (the
 * H200, CUDA 13.0). */
enum { TF_FP8_DY_AMAX, TF_FP8_DY_SCALE, TF_FP8_NONFINITE, TF_FP8_SLOTS };
enum { TF_FP8_WORD = 4 }; /* floats a word */

static float *tf_fp8_word(const tf_model *m, int64_t i) {
  return (float *)tf_tensor_data(m->fp8_state) + TF_FP8_WORD * i;
}
static float *tf_fp8_slot(const tf_model *m, int slot) {
  return tf_fp8_word(m, 4 * TF_LAYER_MATS * m->cfg.num_layers + slot);
}
/* Matrix i's input amax (its scale is the next word). */
static float *tf_fp8_input(const tf_model *m, int64_t i) {
  return tf_fp8_word(m, 2 * (TF_LAYER_MATS * m->cfg.num_layers + i));
}

/* Delayed scaling's words of cast site k (0 .. 8L: matrix i's input at i, its gradient at 4L + i). */
static int64_t tf_fp8_sites(const tf_model *m) { return 2 * TF_LAYER_MATS * m->cfg.num_layers; }
static float *tf_fp8_use(const tf_model *m, int64_t k) {
  return (float *)tf_tensor_data(m->fp8_hist) + tf_fp8_sites(m) * m->fp8_history + k;
}
static float *tf_fp8_newest(const tf_model *m, int64_t k) { return tf_fp8_use(m, k) + tf_fp8_sites(m); }
static int32_t *tf_fp8_overflows(const tf_model *m) { return (int32_t *)tf_fp8_newest(m, tf_fp8_sites(m)); }

/* How a cast of site k is scaled: by the amax in *amax, measured by the cast's own amax pass
 * first unless known; record, when not NULL, receives the cast's amax as it goes. Current
 * scaling (and every cast outside a training pass): current's word, measured. Delayed: the
 * history's max, known, recording the newest; before the first history step, the cast's own
 * amax, measured into the newest word. */
typedef struct tf_fp8_how {
  float *amax;
  bool known;
  float *record;
} tf_fp8_how;

static tf_fp8_how tf_fp8_how_for(tf_model *m, int64_t k, float *current, bool training) {
  if (!m->fp8_history || !training) return (tf_fp8_how){current, false, NULL};
  m->fp8_recorded++;
  if (m->fp8_rolls == 0) return (tf_fp8_how){tf_fp8_newest(m, k), false, NULL};
  return (tf_fp8_how){tf_fp8_use(m, k), true, tf_fp8_newest(m, k)};
}

/* The layer matrix at weight offset w: its index among the 4 L, rows and cols. */
static int64_t tf_fp8_matrix(const tf_model *m, int64_t w, int64_t *rows, int64_t *cols) {
  const int64_t d = m->cfg.d_model, f = m->cfg.d_ff;
  for (int64_t l = 0; l < m->cfg.num_layers; l++) {
    const tf_model_layer_weights *lw = &m->layers[l];
    const int64_t offs[TF_LAYER_MATS] = {lw->w2, lw->w13, lw->out, lw->qkv};
    const int64_t r[TF_LAYER_MATS] = {d, 2 * f, d, 3 * d}, c[TF_LAYER_MATS] = {f, d, d, d};
    for (int j = 0; j < TF_LAYER_MATS; j++)
      if (offs[j] == w) {
        *rows = r[j], *cols = c[j];
        return l * TF_LAYER_MATS + j;
      }
  }
  return -1;
}

static tf_status tf_model_fp8_sync(tf_model *m);
static void tf_model_fp8_release(tf_model *m);

tf_status tf_model_set_fp8(tf_model *m, tf_dtype grad) {
  const int64_t d = m->cfg.d_model, f = m->cfg.d_ff, L = m->cfg.num_layers;
  if (grad != TF_F8E5M2 && grad != TF_F8E4M3)
    return tf_fail(TF_ERR_ARG, "model: fp8's gradient format is f8e5m2 or f8e4m3, not %s",
                   (unsigned)grad < TF_NDTYPES ? tf_dtype_name(grad) : "unknown");
  if (m->dtype != TF_BF16) return tf_fail(TF_ERR_ARG, "model: fp8 runs over a bf16 model (its compute dtype)");
  if (d % 16 != 0 || f % 16 != 0)
    return tf_fail(TF_ERR_ARG, "model: fp8 needs d_model and d_ff multiples of 16 (FP8 products read rows of 16-byte "
                   "words), not d_model %lld, d_ff %lld", (long long)d, (long long)f);
  if (!m->k->fp8_amax || !m->k->fp8_quantize)
    return tf_fail(TF_ERR_ARG, "model: the %s backend has no FP8 kernels", m->ctx->backend->name);
  if (m->fp8) {
    m->fp8_grad = grad;
    return TF_OK;
  }
  tf_model_plan_release(m); /* the next plan carves the 8-bit buffers */
  m->fp8_release = tf_model_fp8_release; /* what is made below is freed with the model, whatever fails */
  TF_TRY(tf_model_alloc(m, m->matmul_total, TF_F8E4M3, TF_TAG_PARAMETER, "model fp8 weights", &m->w8));
  TF_TRY(tf_model_alloc(m, m->matmul_total, TF_F8E4M3, TF_TAG_PARAMETER, "model fp8 weights (transposed)", &m->w8t));
  TF_TRY(tf_model_alloc(m, TF_FP8_WORD * (4 * TF_LAYER_MATS * L + TF_FP8_SLOTS), TF_F32, TF_TAG_PARAMETER, "model fp8 scales",
                        &m->fp8_state));
  TF_TRY(m->ctx->backend->fill(m->ctx, m->fp8_state, 0.0));
  m->fp8 = true;
  m->fp8_sync = tf_model_fp8_sync;
  m->fp8_grad = grad;
  m->w8_version = m->params->storage->version - 1; /* stale: the next forward casts */
  return TF_OK;
}

static void tf_model_fp8_release(tf_model *m) {
  tf_tensor_release(m->w8);
  tf_tensor_release(m->w8t);
  tf_tensor_release(m->fp8_state);
  tf_tensor_release(m->fp8_hist);
  m->w8 = m->w8t = m->fp8_state = m->fp8_hist = NULL;
}

tf_status tf_model_set_fp8_delayed(tf_model *m, int64_t history) {
  if (!m->fp8) return tf_fail(TF_ERR_ARG, "model: delayed scaling is a recipe of precision fp8");
  if (history < 0 || history > 1024)
    return tf_fail(TF_ERR_ARG, "model: fp8's amax history holds 1 to 1024 steps (0: current scaling), not %lld",
                   (long long)history);
  if (!m->k->fp8_history) return tf_fail(TF_ERR_ARG, "model: the %s backend has no delayed scaling",
                                         m->ctx->backend->name);
  tf_model_graphs_drop(m); /* the captured passes cast by the recipe they were captured with */
  tf_tensor_release(m->fp8_hist);
  m->fp8_hist = NULL;
  m->fp8_history = history;
  m->fp8_rolls = m->fp8_recorded = 0;
  if (!history) return TF_OK;
  const int64_t k = tf_fp8_sites(m);
  TF_TRY(tf_model_alloc(m, k * history + 2 * k + 4, TF_F32, TF_TAG_PARAMETER, "model fp8 amax history", &m->fp8_hist));
  return m->ctx->backend->fill(m->ctx, m->fp8_hist, 0.0);
}

tf_status tf_model_fp8_pass_begin(tf_model *m) {
  m->fp8_training_pass = true;
  if (!m->fp8_history || !m->fp8_recorded) return TF_OK;
  const int64_t k = tf_fp8_sites(m);
  tf_fp8_history_args a = {.sites = k, .length = m->fp8_history, .history = (float *)tf_tensor_data(m->fp8_hist),
                           .use = tf_fp8_use(m, 0), .newest = tf_fp8_newest(m, 0), .overflows = tf_fp8_overflows(m)};
  m->fp8_rolls++;
  m->fp8_recorded = 0;
  return m->k->fp8_history(m->ctx, &a);
}

void tf_model_fp8_pass_end(tf_model *m) { m->fp8_training_pass = false; }

tf_status tf_model_fp8_history_state(tf_model *m, tf_tensor **history, int64_t *rolls, int64_t *recorded) {
  *history = m->fp8_hist;
  *rolls = m->fp8_rolls;
  *recorded = m->fp8_recorded;
  return TF_OK;
}

tf_status tf_model_set_fp8_history_state(tf_model *m, int64_t rolls, int64_t recorded) {
  if (!m->fp8_hist) return tf_fail(TF_ERR_ARG, "model: no fp8 amax history (delayed scaling is off)");
  tf_model_graphs_drop(m);
  m->fp8_rolls = rolls;
  m->fp8_recorded = recorded;
  return TF_OK;
}

/* One cast of x (rows, cols) of dtype by its amax (measured first unless known) into out and/or
 * out_t, the product's scale into scale. */
static tf_status tf_fp8_cast_by(tf_model *m, const void *x, tf_dtype dtype, int64_t rows, int64_t cols, tf_dtype fp8,
                                tf_fp8_how how, float *scale, void *out, void *out_t) {
  tf_fp8_amax_args a = {.count = rows * cols, .dtype = dtype, .x = x, .amax = how.amax};
  if (!how.known) TF_TRY(m->k->fp8_amax(m->ctx, &a));
  tf_fp8_quantize_args q = {.rows = rows, .cols = cols, .dtype = dtype, .fp8 = fp8, .x = x, .amax = how.amax,
                            .out = out, .out_t = out_t, .scale = scale,
                            .nonfinite = (int32_t *)tf_fp8_slot(m, TF_FP8_NONFINITE), .record = how.record};
  return m->k->fp8_quantize(m->ctx, &q);
}

static tf_status tf_fp8_cast(tf_model *m, const void *x, tf_dtype dtype, int64_t rows, int64_t cols, tf_dtype fp8,
                             float *amax, float *scale, void *out, void *out_t) {
  return tf_fp8_cast_by(m, x, dtype, rows, cols, fp8, (tf_fp8_how){amax, false, NULL}, scale, out, out_t);
}

/* Matrix i's gradient dy (rows, out) cast by the recipe into the dy slot's scale, out and/or out_t. */
static tf_status tf_fp8_cast_dy(tf_model *m, int64_t i, const void *dy, int64_t rows, int64_t out, void *dst,
                                void *dst_t) {
  const tf_fp8_how how = tf_fp8_how_for(m, TF_LAYER_MATS * m->cfg.num_layers + i, tf_fp8_slot(m, TF_FP8_DY_AMAX), true);
  return tf_fp8_cast_by(m, dy, m->dtype, rows, out, m->fp8_grad, how, tf_fp8_slot(m, TF_FP8_DY_SCALE), dst, dst_t);
}

/* How matrix i's input was scaled by the training pass (the backward pass casts it again, transposed,
 * by the same amax: known). */
static tf_fp8_how tf_fp8_input_again(const tf_model *m, int64_t i) {
  float *amax = !m->fp8_history ? tf_fp8_input(m, i) : m->fp8_rolls == 0 ? tf_fp8_newest(m, i) : tf_fp8_use(m, i);
  return (tf_fp8_how){amax, true, NULL};
}

static tf_status tf_model_fp8_sync(tf_model *m) {
  if (!m->fp8 || m->w8_version == m->params->storage->version) return TF_OK;
  for (int64_t l = 0; l < m->cfg.num_layers; l++) {
    const tf_model_layer_weights *lw = &m->layers[l];
    const int64_t offs[TF_LAYER_MATS] = {lw->w2, lw->w13, lw->out, lw->qkv};
    for (int j = 0; j < TF_LAYER_MATS; j++) {
      int64_t rows = 0, cols = 0;
      const int64_t i = tf_fp8_matrix(m, offs[j], &rows, &cols), w = offs[j];
      TF_TRY(tf_fp8_cast(m, tf_model_mw(m, w), m->dtype, rows, cols, TF_F8E4M3, tf_fp8_word(m, 2 * i),
                         tf_fp8_word(m, 2 * i + 1), (uint8_t *)tf_tensor_data(m->w8) + w,
                         (uint8_t *)tf_tensor_data(m->w8t) + w));
    }
  }
  m->w8_version = m->params->storage->version;
  return TF_OK;
}

/* The FP8 product C (mm, nn) = A (mm, kk) B^T, A's rows lda apart and B stored (nn, kk) ldb apart. */
static tf_status tf_fp8_gemm(tf_model *m, const void *a, tf_dtype ad, const float *sa, const void *b, tf_dtype bd,
                             const float *sb, int64_t mm, int64_t nn, int64_t kk, void *c, tf_dtype cd, bool accumulate) {
  const tf_gemm_scaled x = {.a_dtype = ad, .b_dtype = bd, .scale_a = sa, .scale_b = sb};
  tf_gemm_args g = {.a = a, .b = b, .c = c, .ab_dtype = ad, .c_dtype = cd, .batch = 1, .m = mm, .n = nn, .k = kk,
                    .trans_b = true, .lda = kk, .ldb = kk, .ldc = nn, .accumulate = accumulate, .scaled = &x};
  return m->k->gemm(m->ctx, &g);
}

/* A layer matrix's index, FP8 copies and scale, or an error naming the offset (an engine bug). */
static tf_status tf_fp8_weight(const tf_model *m, int64_t w, int64_t *index, const uint8_t **w8, const uint8_t **w8t,
                               const float **scale) {
  int64_t rows, cols;
  const int64_t i = tf_fp8_matrix(m, w, &rows, &cols);
  if (i < 0) return tf_fail(TF_ERR_STATE, "model: no FP8 copy of the weight at offset %lld", (long long)w);
  *index = i;
  *w8 = (const uint8_t *)tf_tensor_data(m->w8) + w;
  *w8t = (const uint8_t *)tf_tensor_data(m->w8t) + w;
  *scale = tf_fp8_word(m, 2 * i + 1);
  return TF_OK;
}

tf_status tf_model_layer_linear(tf_model *m, const void *x, int64_t rows, int64_t in, int64_t out, int64_t w, void *y) {
  if (!m->fp8 || m->prefilling) /* generation runs in bf16, its decode step's products too */
    return tf_model_linear(m, x, rows, in, out, tf_model_mw(m, w), y);
  const uint8_t *w8 = NULL, *w8t = NULL;
  const float *ws = NULL;
  int64_t i = 0;
  TF_TRY(tf_fp8_weight(m, w, &i, &w8, &w8t, &ws));
  float *xa = tf_fp8_input(m, i), *xs = xa + TF_FP8_WORD;
  const tf_fp8_how how = tf_fp8_how_for(m, i, xa, m->fp8_training_pass);
  TF_TRY(tf_fp8_cast_by(m, x, m->dtype, rows, in, TF_F8E4M3, how, xs, m->plan.fp8_x, NULL));
  return tf_fp8_gemm(m, m->plan.fp8_x, TF_F8E4M3, xs, w8, TF_F8E4M3, ws, rows, out, in, y, m->dtype, false);
}

/* dx (rows, in) = dy W from dy's row-major cast (in fp8_dy, scale in the dy slot). */
static tf_status tf_fp8_dx(tf_model *m, const uint8_t *w8t, const float *ws, int64_t rows, int64_t in, int64_t out,
                           void *dx) {
  return tf_fp8_gemm(m, m->plan.fp8_dy, m->fp8_grad, tf_fp8_slot(m, TF_FP8_DY_SCALE), w8t, TF_F8E4M3, ws, rows, in,
                     out, dx, m->dtype, false);
}

tf_status tf_model_layer_linear_dx(tf_model *m, const void *dy, int64_t rows, int64_t in, int64_t out, int64_t w,
                                   void *dx) {
  if (!m->fp8) return tf_model_linear_dx(m, dy, rows, in, out, tf_model_mw(m, w), dx);
  const uint8_t *w8 = NULL, *w8t = NULL;
  const float *ws = NULL;
  int64_t i = 0;
  TF_TRY(tf_fp8_weight(m, w, &i, &w8, &w8t, &ws));
  /* both layouts: the weight gradient's product that follows (tf_model_layer_linear_backward with
   * dx NULL, the engine's order for w2) reads the transposed cast of the same dy */
  TF_TRY(tf_fp8_cast_dy(m, i, dy, rows, out, m->plan.fp8_dy, m->plan.fp8_dyt));
  m->fp8_dy_cast = dy;
  return tf_fp8_dx(m, w8t, ws, rows, in, out, dx);
}

tf_status tf_model_layer_linear_backward(tf_model *m, const void *dy, const void *x, int64_t rows, int64_t in,
                                         int64_t out, int64_t w, float *dw, void *dx) {
  if (!m->fp8) return tf_model_linear_backward(m, dy, x, rows, in, out, tf_model_mw(m, w), dw, dx);
  const uint8_t *w8 = NULL, *w8t = NULL;
  const float *ws = NULL;
  int64_t i = 0;
  TF_TRY(tf_fp8_weight(m, w, &i, &w8, &w8t, &ws));
  tf_model_plan *p = &m->plan;
  float *dys = tf_fp8_slot(m, TF_FP8_DY_SCALE), *xs = tf_fp8_input(m, i) + TF_FP8_WORD;
  const bool cast = m->fp8_dy_cast != dy || dx; /* dy was cast, both layouts, by the dx product just before */
  m->fp8_dy_cast = NULL;
  if (cast) TF_TRY(tf_fp8_cast_dy(m, i, dy, rows, out, dx ? p->fp8_dy : NULL, p->fp8_dyt));
  /* x as the forward pass cast it (the same bits, kept or recomputed), by that pass's amax */
  TF_TRY(tf_fp8_cast_by(m, x, m->dtype, rows, in, TF_F8E4M3, tf_fp8_input_again(m, i), xs, NULL, p->fp8_xt));
  /* dW (out, in) = dy^T x: A = dy^T (out, rows), B stored (in, rows) = x^T */
  TF_TRY(tf_fp8_gemm(m, p->fp8_dyt, m->fp8_grad, dys, p->fp8_xt, TF_F8E4M3, xs, out, in, rows, dw, TF_F32,
                     !m->use_ring));
  return dx ? tf_fp8_dx(m, w8t, ws, rows, in, out, dx) : TF_OK;
}

tf_status tf_model_fp8_stats(tf_model *m, tf_model_fp8_info *out) {
  memset(out, 0, sizeof *out);
  if (!m->fp8) return TF_OK;
  out->on = true;
  out->grad = m->fp8_grad;
  out->history = m->fp8_history;
  if (m->fp8_hist) {
    int32_t overflows = 0;
    TF_TRY(m->ctx->backend->copy(m->ctx, &overflows, tf_fp8_overflows(m), sizeof overflows, TF_COPY_D2H));
    out->overflows = overflows;
  }
  int32_t count = 0;
  TF_TRY(m->ctx->backend->copy(m->ctx, &count, tf_fp8_slot(m, TF_FP8_NONFINITE), sizeof count, TF_COPY_D2H));
  out->nonfinite = count;
  const int64_t n = TF_LAYER_MATS * m->cfg.num_layers;
  const size_t floats = (size_t)(2 * n * TF_FP8_WORD);
  float *words = malloc(floats * sizeof *words);
  if (!words) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the FP8 scales");
  tf_status st = m->ctx->backend->copy(m->ctx, words, tf_fp8_word(m, 0), floats * sizeof *words, TF_COPY_D2H);
  if (st == TF_OK) {
    out->weight_amax_max = 0;
    out->weight_scale_min = out->weight_scale_max = words[TF_FP8_WORD];
    for (int64_t i = 0; i < n; i++) {
      const float amax = words[2 * i * TF_FP8_WORD], scale = words[(2 * i + 1) * TF_FP8_WORD];
      if (amax > out->weight_amax_max) out->weight_amax_max = amax;
      if (scale < out->weight_scale_min) out->weight_scale_min = scale;
      if (scale > out->weight_scale_max) out->weight_scale_max = scale;
    }
  }
  free(words);
  return st;
}
