/* CUDA graph replay of the engine's phases (forward and loss, backward,
 * inference forward): where the backend can capture and replay its
 * stream, a phase whose key (plan shape, mode and kernel-choosing
 * settings) repeats runs as one graph launch instead of its kernels. */
#include "model_internal.h"

#include <stdio.h>
#include <string.h>

/* Range and message names of the phases, in tf_model_phase order. */
static const char *const tf_model_phase_names[TF_MODEL_PHASES] = {"forward and loss graph", "backward graph",
                                                                  "forward graph"};

static bool tf_model_graphs_supported(const tf_model *m) {
  const tf_model_kernels *k = m->k;
  return k->capture_begin && k->capture_end && k->graph_launch && k->graph_destroy;
}

void tf_model_set_graphs(tf_model *m, bool on) {
  m->graphs = on && tf_model_graphs_supported(m) && !tf_env_is("TF_MODEL_GRAPHS", "0");
  if (!m->graphs) tf_model_graphs_drop(m);
}

tf_model_graph_stats tf_model_graphs(const tf_model *m) {
  return (tf_model_graph_stats){.supported = tf_model_graphs_supported(m), .on = m->graphs,
                                .captures = m->graph_captures, .replays = m->graph_replays,
                                .failures = m->graph_failures};
}

void tf_model_graphs_drop(tf_model *m) {
  for (int i = 0; i < TF_MODEL_PHASES; i++) {
    if (m->graph[i].exec) m->k->graph_destroy(m->ctx, m->graph[i].exec);
    memset(&m->graph[i], 0, sizeof m->graph[i]);
  }
}

/* The key of a phase now (the plan's shape and mode, keep, and the
 * settings that choose kernels). */
static tf_model_graph_key tf_model_graph_key_now(const tf_model *m, bool keep) {
  return (tf_model_graph_key){.batch = m->plan.batch, .seq = m->plan.seq, .training_plan = m->plan.training,
                              .keep = keep, .flash = m->flash, .tf32 = m->ctx->allow_tf32,
                              .optimizer = m->step_in_backward, .ring = m->use_ring,
                              .clip = m->clip_in_step, .max_norm = m->clip_in_step ? m->max_grad_norm : 0};
}

static bool tf_model_graph_key_eq(const tf_model_graph_key *a, const tf_model_graph_key *b) {
  return a->batch == b->batch && a->seq == b->seq && a->training_plan == b->training_plan && a->keep == b->keep &&
         a->flash == b->flash && a->tf32 == b->tf32 && a->optimizer == b->optimizer &&
         a->ring == b->ring && a->clip == b->clip && a->max_norm == b->max_norm;
}

/* Captures body into g->exec. On failure nothing has run: the failure is
 * counted, the key is marked (eager from now on) and the caller runs body
 * eagerly. Besides what the backend refuses during capture (allocations,
 * waits, copies to the host), a block the caching allocator hands out from
 * its cache needs no cudaMalloc, so capture cannot see it; its address
 * would be baked into the graph while the allocator gives it to others,
 * so any allocation during the capture fails it too. */
static bool tf_model_capture(tf_model *m, const char *name, tf_model_graph *g, bool keep, tf_model_phase_fn body) {
  char why[256] = "";
  const uint64_t allocs = m->ctx->alloc.stats.num_allocs;
  tf_prof_graph_capture_begin();
  if (m->k->capture_begin(m->ctx) != TF_OK) {
    snprintf(why, sizeof why, "%s", tf_last_error());
  } else {
    if (body(m, keep) != TF_OK) snprintf(why, sizeof why, "%s", tf_last_error());
    if (m->k->capture_end(m->ctx, &g->exec) != TF_OK && !why[0]) snprintf(why, sizeof why, "%s", tf_last_error());
    if (!why[0] && m->ctx->alloc.stats.num_allocs != allocs)
      snprintf(why, sizeof why, "the pass took memory from the caching allocator while being captured");
  }
  tf_prof_graph_capture_end();
  if (!why[0]) {
    g->traced = tf_prof_collecting_gpu();
    m->graph_captures++;
    return true;
  }
  m->k->graph_destroy(m->ctx, g->exec);
  g->exec = NULL;
  g->failed = true;
  m->graph_failures++;
  if (tf_env_is("TF_MODEL_GRAPHS_DEBUG", "1"))
    fprintf(stderr, "tfhost: model: %s for batch %lld, seq %lld not captured (runs eagerly): %s\n",
            name, (long long)g->key.batch, (long long)g->key.seq, why);
  return false;
}

/* Eager while replay is off. Else a new key replaces the phase's graph;
 * the key's first call runs eagerly, the second captures, and a captured
 * phase is replayed. The profiler's collector attributes a replay's
 * kernels to the ranges they were captured in, which it learns during the
 * capture: a graph captured while no collector recorded GPU work is
 * captured again (instead of replayed) the first time one does. */
tf_status tf_model_run_phase(tf_model *m, tf_model_phase phase, bool keep, tf_model_phase_fn body) {
  if (!m->graphs) return body(m, keep);
  tf_model_graph *g = &m->graph[phase];
  const tf_model_graph_key key = tf_model_graph_key_now(m, keep);
  if (!tf_model_graph_key_eq(&g->key, &key)) {
    m->k->graph_destroy(m->ctx, g->exec);
    *g = (tf_model_graph){.key = key};
  }
  return tf_model_run_graph(m, g, tf_model_phase_names[phase], keep, body);
}

tf_status tf_model_run_graph(tf_model *m, tf_model_graph *g, const char *name, bool keep, tf_model_phase_fn body) {
  /* While the collector counts hardware counters (tf.prof.start{metrics}),
   * the phases run eagerly, neither captured nor replayed: CUPTI counts
   * each launched kernel as a range of its own, replaying it once per pass,
   * which a graph launch (many kernels in one launch) does not give. A
   * graph captured before stays, and is replayed again once counting
   * stops. */
  if (!m->graphs || tf_prof_counting()) return body(m, keep);
  if (g->exec && !g->traced && tf_prof_collecting_gpu()) {
    m->k->graph_destroy(m->ctx, g->exec);
    g->exec = NULL;
  }
  if (!g->exec) {
    const bool warm = g->calls++ > 0;
    if (!warm || g->failed || !tf_model_capture(m, name, g, keep, body)) return body(m, keep);
  }
  TF_RANGED(name, m->k->graph_launch(m->ctx, g->exec));
  m->graph_replays++;
  return TF_OK;
}
