/* Generation's loop and its sampling: prefill, then a decode step a
 * token, each row's next token drawn on the host from the (batch, V)
 * logits copied back, from a generator of the call's own (splitmix64
 * seeded by opts->seed), so the same seed gives the same tokens on every
 * backend whose logits agree. The warpers run in Hugging Face's order:
 * temperature, then top-k, then top-p (nucleus: the smallest set of the
 * most likely tokens whose probabilities sum to top_p or more, at least
 * one kept). Temperature 0 is greedy (the first largest logit). */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

static uint64_t tf_sample_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A uniform double in [0, 1) from 53 bits. */
static double tf_sample_uniform(uint64_t *s) { return (double)(tf_sample_next(s) >> 11) * (1.0 / 9007199254740992.0); }

typedef struct tf_sample_entry {
  float logit;
  int64_t id;
} tf_sample_entry;

/* Descending by logit, ties by id (a total order: the same on every C library). */
static int tf_sample_cmp(const void *pa, const void *pb) {
  const tf_sample_entry *a = pa, *b = pb;
  if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

static int64_t tf_sample_argmax(const float *row, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (row[i] > row[best]) best = i;
  return best;
}

int64_t tf_model_sample_row(const float *row, int64_t V, const tf_generate_opts *o, uint64_t *rng,
                            tf_sample_entry_buf *buf) {
  if (o->temperature <= 0) return tf_sample_argmax(row, V);
  tf_sample_entry *e = (tf_sample_entry *)buf->entries;
  for (int64_t i = 0; i < V; i++) e[i] = (tf_sample_entry){row[i] / (float)o->temperature, i};
  qsort(e, (size_t)V, sizeof *e, tf_sample_cmp);
  int64_t keep = o->top_k > 0 && o->top_k < V ? o->top_k : V;
  /* softmax over the kept (largest first) */
  double *p = buf->probs, total = 0;
  for (int64_t i = 0; i < keep; i++) total += p[i] = exp((double)e[i].logit - (double)e[0].logit);
  if (o->top_p > 0 && o->top_p < 1) {
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += p[n++] / total;
      if (cum >= o->top_p) break;
    }
    keep = n;
    total = 0;
    for (int64_t i = 0; i < keep; i++) total += p[i];
  }
  double u = tf_sample_uniform(rng) * total, cum = 0;
  for (int64_t i = 0; i < keep; i++) {
    cum += p[i];
    if (u < cum) return e[i].id;
  }
  return e[keep - 1].id;
}

tf_status tf_sample_buf_make(int64_t V, tf_sample_entry_buf *buf) {
  buf->entries = malloc((size_t)V * sizeof(tf_sample_entry));
  buf->probs = malloc((size_t)V * sizeof(double));
  if (!buf->entries || !buf->probs) {
    tf_sample_buf_free(buf);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for sampling");
  }
  return TF_OK;
}

void tf_sample_buf_free(tf_sample_entry_buf *buf) {
  free(buf->entries);
  free(buf->probs);
  buf->entries = NULL;
  buf->probs = NULL;
}

static bool tf_generate_is_stop(const tf_generate_opts *o, int64_t id) {
  for (int i = 0; i < o->nstop; i++)
    if (o->stop[i] == id) return true;
  return false;
}

tf_status tf_model_generate_check(const tf_model *m, const tf_tensor *prompt, const tf_generate_opts *o) {
  if (prompt->ndim != 2 || prompt->shape[0] < 1 || prompt->shape[1] < 1)
    return tf_fail(TF_ERR_ARG, "model generate: prompt ids must be a non-empty 2-D (batch, seq) tensor");
  if (o->max_new_tokens < 1) return tf_fail(TF_ERR_ARG, "model generate: max_new_tokens must be >= 1");
  if (prompt->shape[1] + o->max_new_tokens > m->cfg.context_length)
    return tf_fail(TF_ERR_ARG, "model generate: the prompt's %lld tokens and max_new_tokens %lld are more than the "
                   "context length %lld", (long long)prompt->shape[1], (long long)o->max_new_tokens,
                   (long long)m->cfg.context_length);
  if (!(o->temperature >= 0) || !isfinite(o->temperature))
    return tf_fail(TF_ERR_ARG, "model generate: temperature must be a finite number >= 0");
  if (!(o->top_p > 0 && o->top_p <= 1)) return tf_fail(TF_ERR_ARG, "model generate: top_p must be in (0, 1]");
  if (o->top_k < 0) return tf_fail(TF_ERR_ARG, "model generate: top_k must be >= 0 (0: no cut)");
  return TF_OK;
}

tf_status tf_model_generate(tf_model *m, const tf_tensor *prompt, const tf_generate_opts *o, int64_t *out,
                            int64_t *produced, tf_generate_stats *stats) {
  TF_TRY(tf_model_generate_check(m, prompt, o));
  const int64_t B = prompt->shape[0], T = prompt->shape[1], V = m->cfg.vocab_size, n = o->max_new_tokens;
  float *logits = malloc((size_t)(B * V) * sizeof *logits);
  int64_t *next = malloc((size_t)B * sizeof *next);
  bool *done = calloc((size_t)B, sizeof *done);
  tf_sample_entry_buf buf = {0};
  tf_status st = logits && next && done ? TF_OK : tf_fail(TF_ERR_OOM, "out of memory: no host memory for generation");
  if (st == TF_OK && o->temperature > 0) st = tf_sample_buf_make(V, &buf);
  uint64_t rng = o->seed;
  int64_t t0 = tf_clock_ns(), t1 = t0, steps = 0;
  if (st == TF_OK) st = tf_model_prefill(m, prompt, T + n, NULL);
  if (st == TF_OK) st = tf_model_decode_logits_host(m, logits); /* waits for the prefill */
  t1 = tf_clock_ns();
  int64_t made = 0;
  while (st == TF_OK) {
    bool all_done = true;
    for (int64_t b = 0; b < B; b++) {
      if (done[b]) {
        out[b * n + made] = -1;
        continue;
      }
      next[b] = tf_model_sample_row(logits + b * V, V, o, &rng, &buf);
      out[b * n + made] = next[b];
      if (tf_generate_is_stop(o, next[b])) done[b] = true;
      all_done = all_done && done[b];
    }
    made++;
    if (made == n || all_done) break;
    st = tf_model_decode_step(m, next, NULL);
    if (st == TF_OK) st = tf_model_decode_logits_host(m, logits);
    steps++;
  }
  const int64_t t2 = tf_clock_ns();
  if (stats)
    *stats = (tf_generate_stats){.prefill_ms = (double)(t1 - t0) * 1e-6, .decode_ms = (double)(t2 - t1) * 1e-6,
                                 .decode_steps = steps, .batch = B, .prompt = T};
  *produced = made;
  free(logits);
  free(next);
  free(done);
  tf_sample_buf_free(&buf);
  return st;
}
