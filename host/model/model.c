/* The engine's parameters: configuration checks, the layout of the flat
 * buffers (parameters, gradients, AdamW state, low-precision weights), the
 * seeded initialisation, the accessors and the optimizer step. The CUDA
 * graph replay of a step's phases is model_graph.c. */
#include "dist.h"
#include "model_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Views start on 256-byte boundaries (64 f32 elements): vector loads and
 * cuBLAS like aligned operands. */
enum { TF_MODEL_ALIGN = 64 };

/* Rounds an element offset up to the next view boundary. */
static int64_t tf_model_align(int64_t elems) { return (elems + TF_MODEL_ALIGN - 1) / TF_MODEL_ALIGN * TF_MODEL_ALIGN; }

/* ---- configuration -------------------------------------------------------------- */

/* Every message names the field, so a bad preset or option reads clearly. */
tf_status tf_model_config_check(const tf_model_config *c) {
  const struct {
    const char *name;
    int64_t v;
  } sizes[] = {{"vocab_size", c->vocab_size}, {"context_length", c->context_length}, {"d_model", c->d_model},
               {"num_layers", c->num_layers}, {"num_heads", c->num_heads},           {"d_ff", c->d_ff}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    if (sizes[i].v <= 0)
      return tf_fail(TF_ERR_ARG, "model config: %s must be a positive integer, not %lld", sizes[i].name,
                     (long long)sizes[i].v);
    /* GEMM dimensions and the embedding's sort keys are 32-bit on the GPU. */
    if (sizes[i].v > INT32_MAX / 4)
      return tf_fail(TF_ERR_ARG, "model config: %s is %lld, more than the engine's limit of %d", sizes[i].name,
                     (long long)sizes[i].v, INT32_MAX / 4);
  }
  if (c->d_model % c->num_heads != 0)
    return tf_fail(TF_ERR_ARG, "model config: d_model (%lld) must be divisible by num_heads (%lld)",
                   (long long)c->d_model, (long long)c->num_heads);
  int64_t hd = c->d_model / c->num_heads;
  if (hd % 2 != 0)
    return tf_fail(TF_ERR_ARG,
                   "model config: the head dim d_model / num_heads = %lld must be even (RoPE turns pairs)",
                   (long long)hd);
  if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
    return tf_fail(TF_ERR_ARG, "model config: rope_theta must be a finite number > 0, not %g", c->rope_theta);
  double params = (double)c->vocab_size * (double)c->d_model * 2 +
                  (double)c->num_layers * (4.0 * (double)c->d_model * (double)c->d_model +
                                           3.0 * (double)c->d_model * (double)c->d_ff + 2.0 * (double)c->d_model);
  if (params > 1e15) return tf_fail(TF_ERR_ARG, "model config: %.3g parameters is more than any device holds", params);
  return TF_OK;
}

/* The closed form, so presets can be counted without making them. */
int64_t tf_model_config_parameters(const tf_model_config *c) {
  int64_t d = c->d_model;
  return 2 * c->vocab_size * d + c->num_layers * (4 * d * d + 3 * d * c->d_ff + 2 * d) + d;
}

/* ---- layout ---------------------------------------------------------------------- */

/* Appends a named tensor (shape (d0,) or (d0, d1)) to the state-dict list. */
static tf_model_tensor *tf_model_add(tf_model *m, const char *name, int ndim, int64_t d0, int64_t d1, double std) {
  tf_model_tensor *t = &m->tensors[m->ntensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->shape = (tf_shape){ndim, {d0, d1}};
  t->numel = tf_shape_numel(&t->shape);
  t->init_std = std;
  return t;
}

/* Linear layers: truncated normal with std sqrt(2 / (in + out)). */
static double tf_model_linear_std(int64_t out, int64_t in) { return sqrt(2.0 / (double)(in + out)); }

/* The named tensors in state-dict order, then their offsets in storage
 * order: a group of tensors that one GEMM reads as one matrix is placed
 * back to back; groups start aligned. */
static tf_status tf_model_layout(tf_model *m) {
  const tf_model_config *c = &m->cfg;
  const int64_t d = c->d_model, f = c->d_ff, V = c->vocab_size;
  char name[48];
  tf_model_tensor **per = calloc((size_t)c->num_layers * 9, sizeof *per);
  if (!per) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the model's tables");
  tf_model_tensor *wte = tf_model_add(m, "token_embeddings.weight", 2, V, d, 1.0);
  for (int64_t l = 0; l < c->num_layers; l++) {
    static const char *const suffix[9] = {"ln1.weight", "attn.q_proj.weight", "attn.k_proj.weight",
                                          "attn.v_proj.weight", "attn.output_proj.weight", "ln2.weight",
                                          "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"};
    for (int j = 0; j < 9; j++) {
      snprintf(name, sizeof name, "layers.%lld.%s", (long long)l, suffix[j]);
      int64_t rows = j == 7 ? d : j >= 6 ? f : d, cols = j == 7 ? f : d;
      bool norm = j == 0 || j == 5;
      per[l * 9 + j] = tf_model_add(m, name, norm ? 1 : 2, norm ? d : rows, norm ? 0 : cols,
                                    norm ? 0.0 : tf_model_linear_std(rows, cols));
    }
  }
  tf_model_tensor *lnf = tf_model_add(m, "ln_final.weight", 1, d, 0, 0.0);
  tf_model_tensor *head = tf_model_add(m, "lm_head.weight", 2, V, d, tf_model_linear_std(V, d));

  /* Storage: matmul weights first (layer by layer, then lm_head), then the rest. */
  int64_t at = 0;
#define TF_PLACE(t) ((t)->offset = at, at += (t)->numel)
  for (int64_t l = 0; l < c->num_layers; l++) {
    tf_model_tensor **t = per + l * 9;
    tf_model_layer_weights *w = &m->layers[l];
    at = tf_model_align(at);
    w->qkv = at;
    TF_PLACE(t[1]), TF_PLACE(t[2]), TF_PLACE(t[3]);
    at = tf_model_align(at);
    w->out = at;
    TF_PLACE(t[4]);
    at = tf_model_align(at);
    w->w13 = at;
    TF_PLACE(t[6]), TF_PLACE(t[8]);
    at = tf_model_align(at);
    w->w2 = at;
    TF_PLACE(t[7]);
  }
  at = tf_model_align(at);
  m->lm_head = at;
  TF_PLACE(head);
  m->matmul_total = tf_model_align(at);
  at = m->matmul_total;
  m->wte = at;
  TF_PLACE(wte);
  for (int64_t l = 0; l < c->num_layers; l++) {
    at = tf_model_align(at);
    m->layers[l].ln1 = at;
    TF_PLACE(per[l * 9 + 0]);
    at = tf_model_align(at);
    m->layers[l].ln2 = at;
    TF_PLACE(per[l * 9 + 5]);
  }
  at = tf_model_align(at);
  m->lnf = at;
  TF_PLACE(lnf);
#undef TF_PLACE
  m->total = tf_model_align(at);
  free(per);
  return TF_OK;
}

/* ---- creation ---------------------------------------------------------------------- */

/* Names each tensor's range of a flat buffer for memory snapshots
 * ("layers.0.ffn.w1.weight.grad"); the buffer may hold a prefix. */
static tf_status tf_model_describe(tf_model *m, const tf_tensor *buf, int64_t n, int tag, const char *suffix) {
  const size_t es = tf_dtype_size(buf->dtype);
  tf_mem_region *regions = calloc((size_t)m->ntensors, sizeof *regions);
  char(*names)[80] = calloc((size_t)m->ntensors, sizeof *names);
  int count = 0;
  for (int i = 0; regions && names && i < m->ntensors; i++) {
    const tf_model_tensor *t = &m->tensors[i];
    if (t->offset + t->numel > n) continue;
    snprintf(names[count], sizeof names[count], "%s%s", t->name, suffix);
    regions[count] = (tf_mem_region){names[count], tag, (size_t)t->offset * es, (size_t)t->numel * es};
    count++;
  }
  tf_status st = regions && names ? tf_alloc_describe(&m->ctx->alloc, tf_tensor_data(buf), count, regions)
                                  : tf_fail(TF_ERR_OOM, "out of memory: no host memory for buffer names");
  free(regions);
  free(names);
  return st;
}

/* One flat buffer of the model (parameters, gradients, moments, low copy),
 * tagged and named for memory snapshots. */
tf_status tf_model_alloc(tf_model *m, int64_t n, tf_dtype d, int tag, const char *what, tf_tensor **out) {
  tf_shape s = {1, {n}};
  tf_mem_scope outer = tf_mem_scope_enter(tag, what);
  tf_status st = tf_tensor_empty(&s, d, m->device, out);
  tf_mem_scope_leave(outer);
  return st;
}

static tf_status tf_model_flat(tf_model *m, int64_t n, tf_dtype d, int tag, const char *suffix, tf_tensor **out) {
  TF_TRY(tf_model_alloc(m, n, d, tag, "model", out));
  return tf_model_describe(m, *out, n, tag, suffix);
}

/* Fills a whole buffer or view with one value (one kernel). */
static tf_status tf_model_fill(tf_model *m, tf_tensor *t, double v) { return m->ctx->backend->fill(m->ctx, t, v); }

/* Parameters in state-dict order from the device's generator: the same
 * seed gives the same model on every backend (the random draws are
 * temporaries). */
static tf_status tf_model_init_params(tf_model *m) {
  TF_TRY(tf_model_fill(m, m->params, 0.0));
  for (int i = 0; i < m->ntensors; i++) {
    tf_model_tensor *t = &m->tensors[i];
    if (t->init_std == 0) {
      TF_TRY(tf_model_fill(m, t->param, 1.0));
      continue;
    }
    tf_tensor *r = NULL;
    TF_TRY(tf_random(TF_RANDOM_TRUNC_NORMAL, &t->shape, t->init_std, 3.0, TF_F32, m->device, &r));
    tf_status st = tf_copy_into(t->param, r);
    tf_tensor_release(r);
    TF_TRY(st);
  }
  return TF_OK;
}

/* Tables, layout, the flat buffers, the named views, then the seeded init. */
static tf_status tf_model_build(tf_model *m) {
  int nt = 1 + 9 * (int)m->cfg.num_layers + 2;
  m->tensors = calloc((size_t)nt, sizeof *m->tensors);
  m->layers = calloc((size_t)m->cfg.num_layers, sizeof *m->layers);
  if (!m->tensors || !m->layers) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the model's tables");
  TF_TRY(tf_model_layout(m));
  TF_TRY(tf_model_flat(m, m->total, TF_F32, TF_TAG_PARAMETER, "", &m->params));
  if (m->dtype != TF_F32)
    TF_TRY(tf_model_flat(m, m->matmul_total, m->dtype, TF_TAG_PARAMETER, m->dtype == TF_BF16 ? ".bf16" : ".f16",
                         &m->low));
  tf_shape ms = {1, {m->matmul_total}};
  int64_t one = 1;
  TF_TRY(tf_tensor_view(m->params, &ms, &one, 0, &m->matmul_params));
  for (int i = 0; i < m->ntensors; i++) {
    tf_model_tensor *t = &m->tensors[i];
    int64_t strides[TF_MAX_DIMS];
    tf_contiguous_strides(&t->shape, strides);
    TF_TRY(tf_tensor_view(m->params, &t->shape, strides, t->offset, &t->param));
  }
  tf_mem_scope outer = tf_mem_scope_enter(TF_TAG_TEMPORARY, "model init");
  tf_status st = tf_model_init_params(m);
  tf_mem_scope_leave(outer);
  TF_TRY(st);
  m->low_version = m->params->storage->version - 1; /* stale: the first sync converts */
  return tf_model_sync_weights(m);
}

/* Checks, then builds; a failure part way releases everything made so far. */
tf_status tf_model_create(const tf_model_config *cfg, tf_device device, tf_dtype precision, tf_model **out) {
  TF_TRY(tf_model_config_check(cfg));
  if (precision != TF_F32 && precision != TF_BF16 && precision != TF_F16)
    return tf_fail(TF_ERR_ARG, "model: precision must be f32, bf16 or f16 (mixed), not %s",
                   (unsigned)precision < TF_NDTYPES ? tf_dtype_name(precision) : "unknown");
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(device, &ctx));
  if (!ctx->backend->model)
    return tf_fail(TF_ERR_DEVICE, "model: the %s backend has no Transformer kernels", ctx->backend->name);
  tf_model *m = calloc(1, sizeof *m);
  if (!m) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a model");
  m->cfg = *cfg;
  m->device = device;
  m->dtype = precision;
  m->ctx = ctx;
  m->k = ctx->backend->model;
  /* FlashAttention under mixed precision (tensor cores); true f32 keeps the
   * naive path, whose cuBLAS f32 GEMMs outrun the f32 flash kernel (FMA on
   * CUDA cores) */
  m->flash = precision != TF_F32 && ctx->backend->flash_attention != NULL && cfg->d_model / cfg->num_heads <= 128;
  tf_model_set_graphs(m, true);
  m->overlap = true;
  tf_status st = tf_model_build(m);
  if (st != TF_OK) {
    tf_model_free(m);
    return st;
  }
  *out = m;
  return TF_OK;
}

/* Views handed out keep their storage: only the engine's references go here. */
void tf_model_free(tf_model *m) {
  if (!m) return;
  if (m->decode_release) m->decode_release(m);
  tf_model_plan_release(m);
  if (m->fp8_release) m->fp8_release(m);
  for (int i = 0; i < m->ntensors; i++) {
    tf_tensor_release(m->tensors[i].param);
    tf_tensor_release(m->tensors[i].grad);
  }
  tf_tensor *bufs[] = {m->matmul_params, m->params, m->grads,  m->adam_m,       m->adam_v,
                       m->low,           m->adam_consts, m->ring, m->clip, m->clip_partial};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tf_tensor_release(bufs[i]);
  for (int i = 0; i < m->nworks; i++) tf_dist_work_free(m->works[i]); /* waits for each */
  free(m->works);
  free(m->tensors);
  free(m->layers);
  free(m);
}

/* ---- accessors ----------------------------------------------------------------------- */

const tf_model_config *tf_model_get_config(const tf_model *m) { return &m->cfg; }
tf_dtype tf_model_precision(const tf_model *m) { return m->dtype; }
tf_device tf_model_device(const tf_model *m) { return m->device; }
int tf_model_num_tensors(const tf_model *m) { return m->ntensors; }

const char *tf_model_tensor_name(const tf_model *m, int i) {
  return i >= 0 && i < m->ntensors ? m->tensors[i].name : NULL;
}

tf_tensor *tf_model_param(const tf_model *m, int i) { return i >= 0 && i < m->ntensors ? m->tensors[i].param : NULL; }
tf_tensor *tf_model_grad(tf_model *m, int i) {
  if (i < 0 || i >= m->ntensors || tf_model_ensure_grads(m) != TF_OK) return NULL;
  return m->tensors[i].grad;
}

/* The moments' buffer which (0: exp_avg, 1: exp_avg_sq), made (zeros) when
 * no step has run yet. */
static tf_status tf_model_moment_buffer(tf_model *m, int which, tf_tensor **buf) {
  if (which != 0 && which != 1) return tf_fail(TF_ERR_ARG, "tf_model_moment: which must be 0 or 1, not %d", which);
  TF_TRY(tf_model_ensure_moments(m));
  *buf = which == 0 ? m->adam_m : m->adam_v;
  return TF_OK;
}

tf_status tf_model_moment(tf_model *m, int i, int which, tf_tensor **out) {
  *out = NULL;
  if (i < 0 || i >= m->ntensors) return tf_fail(TF_ERR_ARG, "tf_model_moment: no tensor %d", i);
  if (m->zero1) return tf_fail(TF_ERR_ARG, "the optimizer's moments are sharded over the ranks (ZeRO-1): read each rank's shard");
  tf_tensor *buf = NULL;
  TF_TRY(tf_model_moment_buffer(m, which, &buf));
  const tf_model_tensor *t = &m->tensors[i];
  int64_t strides[TF_MAX_DIMS];
  tf_contiguous_strides(&t->shape, strides);
  return tf_tensor_view(buf, &t->shape, strides, t->offset, out);
}

tf_status tf_model_moment_shard(tf_model *m, int which, tf_tensor **out, int64_t *begin, int64_t *end) {
  *out = NULL;
  tf_tensor *buf = NULL;
  TF_TRY(tf_model_moment_buffer(m, which, &buf));
  tf_tensor_retain(buf);
  *out = buf;
  *begin = m->zero1 ? m->shard_begin : 0;
  *end = m->zero1 ? m->shard_end : m->total;
  return TF_OK;
}

/* A linear search: a model has a few hundred names at most. */
int tf_model_find(const tf_model *m, const char *name) {
  for (int i = 0; i < m->ntensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return i;
  return -1;
}

/* Sizes of the allocations the engine holds now. */
tf_model_memory tf_model_memory_use(const tf_model *m) {
  tf_model_memory u = {0};
  u.params = tf_tensor_nbytes(m->params);
  u.grads = (m->grads ? tf_tensor_nbytes(m->grads) : 0) + (m->ring ? tf_tensor_nbytes(m->ring) : 0);
  u.optimizer = m->adam_m ? tf_tensor_nbytes(m->adam_m) + tf_tensor_nbytes(m->adam_v) : 0;
  u.low_precision = (m->low ? tf_tensor_nbytes(m->low) : 0) + (m->w8 ? 2 * tf_tensor_nbytes(m->w8) : 0);
  u.activations = m->plan.storage ? m->plan.bytes : 0;
  return u;
}

/* ---- gradients and the optimizer ---------------------------------------------------- */

/* One conversion of the whole matmul prefix, only when the parameters moved. */
tf_status tf_model_sync_weights(tf_model *m) {
  if (m->low && m->low_version != m->params->storage->version) {
    TF_TRY(tf_copy_into(m->low, m->matmul_params));
    m->low_version = m->params->storage->version;
  }
  return m->fp8_sync ? m->fp8_sync(m) : TF_OK;
}

tf_status tf_model_set_attention(tf_model *m, bool flash) {
  if (flash && !m->ctx->backend->flash_attention)
    return tf_fail(TF_ERR_ARG, "flash attention is not available on %s", m->ctx->backend->name);
  if (flash && m->cfg.d_model / m->cfg.num_heads > 128)
    return tf_fail(TF_ERR_ARG, "flash attention takes head dims up to 128 (this model's is %lld)",
                   (long long)(m->cfg.d_model / m->cfg.num_heads));
  if (flash != m->flash) tf_model_plan_release(m);
  m->flash = flash;
  return TF_OK;
}

bool tf_model_uses_flash(const tf_model *m) { return m->flash; }

/* The captured backward pass names its streams: a change drops the graphs. */
void tf_model_set_overlap(tf_model *m, bool on) {
  if (on != m->overlap) tf_model_graphs_drop(m);
  m->overlap = on;
}

bool tf_model_overlaps(const tf_model *m) { return m->overlap; }

void tf_model_set_recompute_residual(tf_model *m, bool on) {
  if (on != m->recompute_residual) tf_model_plan_release(m);
  m->recompute_residual = on;
}

bool tf_model_recomputes_residual(const tf_model *m) { return m->recompute_residual; }

/* One fill over the flat gradient buffer. */
/* Nothing to do for gradients never written (or written by a step that
 * zeroed them as it read them). */
tf_status tf_model_zero_grad(tf_model *m) {
  if (!m->grads || !m->grads_dirty) return TF_OK;
  TF_TRY(tf_model_fill(m, m->grads, 0.0));
  m->grads_dirty = false;
  return TF_OK;
}

tf_status tf_model_ensure_grads(tf_model *m) {
  if (m->grads) return TF_OK;
  TF_TRY(tf_model_flat(m, m->total, TF_F32, TF_TAG_GRADIENT, ".grad", &m->grads));
  tf_status st = tf_model_fill(m, m->grads, 0.0);
  for (int i = 0; st == TF_OK && i < m->ntensors; i++) {
    tf_model_tensor *t = &m->tensors[i];
    int64_t strides[TF_MAX_DIMS];
    tf_contiguous_strides(&t->shape, strides);
    st = tf_tensor_view(m->grads, &t->shape, strides, t->offset, &t->grad);
  }
  if (st != TF_OK) {
    for (int i = 0; i < m->ntensors; i++) {
      tf_tensor_release(m->tensors[i].grad);
      m->tensors[i].grad = NULL;
    }
    tf_tensor_release(m->grads);
    m->grads = NULL;
  }
  m->grads_dirty = false;
  return st;
}

void tf_model_matrix_range(const tf_model *m, int64_t l, int j, int64_t *begin, int64_t *end) {
  const tf_model_layer_weights *w = &m->layers[l];
  const int64_t next = l + 1 < m->cfg.num_layers ? m->layers[l + 1].qkv : m->lm_head;
  switch (j) {
    case TF_MAT_W2: *begin = w->w2, *end = next; return;
    case TF_MAT_W13: *begin = w->w13, *end = w->w2; return;
    case TF_MAT_OUT: *begin = w->out, *end = w->w13; return;
    default: *begin = w->qkv, *end = w->out; return;
  }
}

/* The ring: slot s holds the gradient of matrix j of a layer when
 * j % TF_SIDE_MARKS == s (w2 and output_proj in one, w1|w3 and qkv in the
 * other), each as large as the largest it holds; then lm_head's gradient,
 * then the rest's (embedding, norms: [matmul_total, total)). */
tf_status tf_model_ensure_ring(tf_model *m) {
  if (m->ring) return TF_OK;
  int64_t slot[TF_SIDE_MARKS] = {0};
  for (int64_t l = 0; l < m->cfg.num_layers; l++)
    for (int j = 0; j < TF_LAYER_MATS; j++) {
      int64_t begin, end;
      tf_model_matrix_range(m, l, j, &begin, &end);
      if (end - begin > slot[j % TF_SIDE_MARKS]) slot[j % TF_SIDE_MARKS] = end - begin;
    }
  m->ring_at[0] = 0;
  for (int s = 0; s < TF_SIDE_MARKS; s++) m->ring_at[s + 1] = m->ring_at[s] + slot[s];
  TF_TRY(tf_model_alloc(m, m->ring_at[TF_SIDE_MARKS] + (m->total - m->lm_head), TF_F32, TF_TAG_GRADIENT,
                        "model gradient ring", &m->ring));
  tf_status st = tf_model_fill(m, m->ring, 0.0);
  if (st != TF_OK) {
    tf_tensor_release(m->ring);
    m->ring = NULL;
  }
  return st;
}

float *tf_model_ring_at(const tf_model *m, int64_t off) {
  float *base = tf_tensor_data(m->ring);
  if (off >= m->lm_head) return base + m->ring_at[TF_SIDE_MARKS] + (off - m->lm_head);
  int64_t lo = 0, hi = m->cfg.num_layers - 1; /* the last layer starting at or before off */
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (m->layers[mid].qkv <= off) lo = mid; else hi = mid - 1;
  }
  int j = 0;
  int64_t begin = 0, end = 0;
  for (; j < TF_LAYER_MATS; j++) {
    tf_model_matrix_range(m, lo, j, &begin, &end);
    if (off >= begin && off < end) break;
  }
  return base + m->ring_at[j % TF_SIDE_MARKS] + (off - begin);
}

/* The moments are allocated (zeroed) by the first step: a model only run
 * forward never holds optimizer state. */
tf_status tf_model_ensure_moments(tf_model *m) {
  if (m->adam_m) return TF_OK;
  tf_status st;
  if (m->zero1) { /* this rank's shard of the flat buffers */
    const int64_t n = m->shard_end - m->shard_begin;
    st = tf_model_alloc(m, n, TF_F32, TF_TAG_OPTIMIZER, "model AdamW shard (exp_avg)", &m->adam_m);
    if (st == TF_OK) st = tf_model_alloc(m, n, TF_F32, TF_TAG_OPTIMIZER, "model AdamW shard (exp_avg_sq)", &m->adam_v);
  } else {
    st = tf_model_flat(m, m->total, TF_F32, TF_TAG_OPTIMIZER, ".exp_avg", &m->adam_m);
    if (st == TF_OK) st = tf_model_flat(m, m->total, TF_F32, TF_TAG_OPTIMIZER, ".exp_avg_sq", &m->adam_v);
  }
  if (st == TF_OK) st = tf_model_fill(m, m->adam_m, 0.0);
  if (st == TF_OK) st = tf_model_fill(m, m->adam_v, 0.0);
  if (st != TF_OK) {
    tf_tensor_release(m->adam_m);
    tf_tensor_release(m->adam_v);
    m->adam_m = m->adam_v = NULL;
  }
  return st;
}

/* One fused kernel over every parameter (alignment gaps hold zeros and stay
 * zero) that also refreshes the low-precision copy of the matmul weights
 * from the new ones, in the same pass (when it was in step before: else
 * the whole copy is converted afterwards). */
static tf_status tf_model_run_adamw(tf_model *m, const tf_adamw_args *args) {
  TF_TRY(tf_model_ensure_moments(m));
  TF_TRY(tf_model_ensure_grads(m));
  const bool in_step = m->low && m->low_version == m->params->storage->version;
  TF_TRY(tf_adamw_step_with_low(m->params, m->grads, m->adam_m, m->adam_v, in_step ? m->low : NULL, args));
  m->params->storage->version++; /* an in-place write, as autograd counts them */
  if (in_step) m->low_version = m->params->storage->version;
  return tf_model_sync_weights(m);
}

/* ZeRO-1 (tf_model_set_data_parallel): AdamW over this rank's shard of the
 * flat buffers, then every rank's shard gathered; the low-precision copy
 * follows at the next forward pass. */
static tf_status tf_model_adamw_shard(tf_model *m, const tf_adamw_args *args) {
  TF_TRY(tf_model_ensure_moments(m));
  TF_TRY(tf_model_ensure_grads(m));
  const int64_t n = m->shard_end - m->shard_begin;
  tf_shape shape = {.ndim = 1, .dims = {n}};
  const int64_t stride = 1;
  tf_tensor *p = NULL, *g = NULL;
  tf_status st = tf_tensor_view(m->params, &shape, &stride, m->shard_begin, &p);
  if (st == TF_OK) st = tf_tensor_view(m->grads, &shape, &stride, m->shard_begin, &g);
  if (st == TF_OK && n > 0) st = tf_adamw_step_with_low(p, g, m->adam_m, m->adam_v, NULL, args);
  tf_tensor_release(p);
  tf_tensor_release(g);
  TF_TRY(st);
  TF_TRY(tf_dist_all_gather_shards(tf_tensor_data(m->params), m->total, TF_F32, m->device));
  m->params->storage->version++; /* the low-precision copy follows at the next forward */
  return tf_model_sync_weights(m);
}

/* ---- global gradient-norm clipping -------------------------------------------------------- */

tf_status tf_model_set_max_grad_norm(tf_model *m, double max_norm) {
  if (!(max_norm >= 0)) /* NaN too */
    return tf_fail(TF_ERR_ARG, "model: max_norm must be a number > 0 (or 0: no clipping), not %g", max_norm);
  if (max_norm > 0 && !(m->k->grad_norm && m->k->adamw && m->k->adamw_constants))
    return tf_fail(TF_ERR_DEVICE, "model: the %s backend cannot clip gradients", m->ctx->backend->name);
  m->max_grad_norm = max_norm;
  return TF_OK;
}

double tf_model_max_grad_norm(const tf_model *m) { return m->max_grad_norm; }

tf_status tf_model_grad_norm(tf_model *m, tf_tensor **out) {
  *out = NULL;
  if (!m->clipped) return TF_OK;
  tf_tensor *norm = NULL, *copy = NULL;
  const tf_shape scalar = {0, {0}};
  TF_TRY(tf_tensor_view(m->clip, &scalar, NULL, TF_GRAD_NORM, &norm));
  tf_status st = tf_tensor_empty(&scalar, TF_F32, m->device, &copy);
  if (st == TF_OK) st = tf_copy_into(copy, norm);
  tf_tensor_release(norm);
  if (st != TF_OK) {
    tf_tensor_release(copy);
    return st;
  }
  *out = copy;
  return TF_OK;
}

tf_status tf_model_ensure_clip(tf_model *m) {
  if (!m->adam_consts)
    TF_TRY(tf_model_alloc(m, TF_ADAMW_CONSTS, TF_F32, TF_TAG_OPTIMIZER, "model AdamW constants", &m->adam_consts));
  if (!m->clip_partial)
    TF_TRY(tf_model_alloc(m, TF_GRAD_NORM_BLOCKS, TF_F64, TF_TAG_OPTIMIZER, "model gradient norm (partial sums)",
                          &m->clip_partial));
  if (!m->clip) {
    TF_TRY(tf_model_alloc(m, TF_GRAD_NORM_OUT, TF_F32, TF_TAG_OPTIMIZER, "model gradient norm", &m->clip));
    tf_status st = tf_model_fill(m, m->clip, 0.0);
    if (st != TF_OK) {
      tf_tensor_release(m->clip);
      m->clip = NULL;
      return st;
    }
  }
  return TF_OK;
}

tf_status tf_model_clip_update(tf_model *m, bool low, bool zero_g) {
  float *clip = tf_tensor_data(m->clip), *grads = tf_tensor_data(m->grads);
  tf_grad_norm_args n = {.g = grads, .n = m->total, .max_norm = m->max_grad_norm,
                         .partial = tf_tensor_data(m->clip_partial), .out = clip};
  TF_RANGED("gradient clipping", m->k->grad_norm(m->ctx, &n));
  tf_model_adamw_args a = {.p = tf_tensor_data(m->params), .m = tf_tensor_data(m->adam_m),
                           .v = tf_tensor_data(m->adam_v), .g = grads, .n = m->total,
                           .consts = tf_tensor_data(m->adam_consts), .zero_g = zero_g, .grad_scale = clip};
  if (low && m->low) {
    a.low = tf_tensor_data(m->low);
    a.low_dtype = m->dtype;
    a.n_low = m->matmul_total;
  }
  TF_RANGED("optimizer", m->k->adamw(m->ctx, &a));
  m->clipped = true;
  return TF_OK;
}

/* ZeRO-1 updates a shard from a shard of the averaged gradients: no whole norm to clip by. */
tf_status tf_model_adamw_step_check(const tf_model *m) {
  if (m->max_grad_norm > 0 && m->zero1)
    return tf_fail(TF_ERR_ARG, "model: gradient clipping (max_norm) needs every gradient: not with parallel = zero1");
  return TF_OK;
}

/* tf_model_adamw_step with clipping: the norm, then one update over the flat buffers. */
static tf_status tf_model_run_clipped(tf_model *m, const tf_adamw_args *args) {
  tf_adamw_update u = {0};
  TF_TRY(tf_adamw_constants("model:adamw_step", args, &u));
  TF_TRY(tf_model_ensure_moments(m));
  TF_TRY(tf_model_ensure_grads(m));
  TF_TRY(tf_model_ensure_clip(m));
  TF_TRY(m->k->adamw_constants(m->ctx, tf_tensor_data(m->adam_consts), &u));
  const bool in_step = m->low && m->low_version == m->params->storage->version;
  TF_TRY(tf_model_clip_update(m, in_step, false));
  m->params->storage->version++; /* an in-place write, as autograd counts them */
  if (in_step) m->low_version = m->params->storage->version;
  return tf_model_sync_weights(m);
}

tf_status tf_model_adamw_step(tf_model *m, const tf_adamw_args *args) {
  TF_TRY(tf_model_adamw_step_check(m));
  if (m->max_grad_norm > 0) return tf_model_run_clipped(m, args); /* its kernels open their ranges */
  TF_RANGED("optimizer", m->zero1 ? tf_model_adamw_shard(m, args) : tf_model_run_adamw(m, args));
  return TF_OK;
}
