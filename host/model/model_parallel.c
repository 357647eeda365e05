/* Data-parallel training (model.h, tf_model_set_data_parallel): the
 * gradients averaged over the ranks by tf.dist, after the backward pass or
 * beside it, and ZeRO-1's sharded AdamW. The flat gradient buffer makes
 * each variant a few calls: a parameter is a range of it, a layer's
 * parameters are neighbours, and the backward pass finishes them in
 * descending order (lm_head, the last layer, ..., the first), so a bucket
 * is one range grown downwards. */
#include <stdlib.h>

#include "dist.h"
#include "model_internal.h"

tf_status tf_model_set_data_parallel(tf_model *m, tf_model_grad_sync sync, double bucket_mb, bool zero1) {
  if (sync == TF_GRAD_SYNC_BUCKETS && !(bucket_mb > 0 && bucket_mb < 1e6))
    return tf_fail(TF_ERR_ARG, "model: bucket_mb must be a size in MB > 0, not %g", bucket_mb);
  if (zero1 && sync == TF_GRAD_SYNC_NONE)
    return tf_fail(TF_ERR_ARG, "model: zero1 shards the optimizer of a data-parallel model: choose a gradient sync");
  tf_model_drop_works(m);
  if (sync != TF_GRAD_SYNC_NONE) {
    /* every rank starts from rank 0's parameters */
    TF_TRY(tf_dist_broadcast(m->params, 0, NULL));
    m->params->storage->version++;
    TF_TRY(tf_model_sync_weights(m));
  }
  const tf_dist_env *e = tf_dist_self();
  m->grad_sync = sync;
  m->bucket_elems = (int64_t)(bucket_mb * 1e6 / sizeof(float));
  if (m->bucket_elems < 1) m->bucket_elems = 1;
  m->bucket_lo = m->bucket_hi = 0;
  if (zero1 != m->zero1 || zero1) { /* the moments change shape: fresh optimizer state */
    tf_tensor_release(m->adam_m);
    tf_tensor_release(m->adam_v);
    m->adam_m = m->adam_v = NULL;
  }
  m->zero1 = zero1;
  tf_dist_shard(m->total, e->rank, e->world_size, &m->shard_begin, &m->shard_end);
  if (!zero1) m->shard_begin = 0, m->shard_end = m->total;
  /* collectives inside the backward pass cannot be captured into a graph */
  if (sync == TF_GRAD_SYNC_OVERLAP || sync == TF_GRAD_SYNC_BUCKETS) tf_model_set_graphs(m, false);
  return TF_OK;
}

tf_model_grad_sync tf_model_data_parallel(const tf_model *m, bool *zero1) {
  if (zero1) *zero1 = m->zero1;
  return m->grad_sync;
}

void tf_model_drop_works(tf_model *m) {
  for (int i = 0; i < m->nworks; i++) tf_dist_work_free(m->works[i]);
  m->nworks = 0;
  m->bucket_lo = m->bucket_hi = 0;
}

/* The average over the ranks of the gradients [begin, end), started. */
static tf_status tf_model_start_sync(tf_model *m, int64_t begin, int64_t end) {
  if (end <= begin) return TF_OK;
  if (m->nworks == m->cap_works) {
    int cap = m->cap_works ? 2 * m->cap_works : 64;
    tf_dist_work **w = realloc(m->works, (size_t)cap * sizeof *w);
    if (!w) return tf_fail(TF_ERR_OOM, "out of memory: the model's list of collectives");
    m->works = w;
    m->cap_works = cap;
  }
  TF_TRY(tf_dist_all_reduce_raw(tf_model_gw(m, begin), end - begin, TF_F32, m->device, TF_DIST_AVG,
                                &m->works[m->nworks]));
  m->nworks++;
  return TF_OK;
}

/* The bucket being filled, started (nothing when empty). */
static tf_status tf_model_flush_bucket(tf_model *m) {
  const int64_t lo = m->bucket_lo, hi = m->bucket_hi;
  m->bucket_lo = m->bucket_hi = 0;
  return tf_model_start_sync(m, lo, hi);
}

tf_status tf_model_grads_ready(tf_model *m, int64_t begin, int64_t end) {
  if (end <= begin) return TF_OK;
  if (m->grad_sync == TF_GRAD_SYNC_OVERLAP) {
    for (int i = 0; i < m->ntensors; i++) {
      const tf_model_tensor *t = &m->tensors[i];
      if (t->offset >= begin && t->offset < end) TF_TRY(tf_model_start_sync(m, t->offset, t->offset + t->numel));
    }
    return TF_OK;
  }
  if (m->grad_sync != TF_GRAD_SYNC_BUCKETS) return TF_OK;
  if (m->bucket_hi > m->bucket_lo && end != m->bucket_lo) TF_TRY(tf_model_flush_bucket(m)); /* not a neighbour */
  if (m->bucket_hi == m->bucket_lo) m->bucket_hi = end;
  m->bucket_lo = begin;
  if (m->bucket_hi - m->bucket_lo >= m->bucket_elems) TF_TRY(tf_model_flush_bucket(m));
  return TF_OK;
}

tf_status tf_model_sync_grads(tf_model *m) {
  tf_status st = TF_OK;
  switch (m->grad_sync) {
    case TF_GRAD_SYNC_NONE: return TF_OK;
    case TF_GRAD_SYNC_PER_PARAM:
      for (int i = 0; i < m->ntensors && st == TF_OK; i++) {
        const tf_model_tensor *t = &m->tensors[i];
        st = tf_dist_all_reduce_raw(tf_model_gw(m, t->offset), t->numel, TF_F32, m->device, TF_DIST_AVG, NULL);
      }
      return st;
    case TF_GRAD_SYNC_FLAT: /* ZeRO-1 needs its own shard's average only: a reduce-scatter, half the traffic */
      if (m->zero1) return tf_dist_reduce_to_shards(tf_tensor_data(m->grads), m->total, TF_F32, m->device, TF_DIST_AVG);
      return tf_dist_all_reduce_raw(tf_tensor_data(m->grads), m->total, TF_F32, m->device, TF_DIST_AVG, NULL);
    default:
      st = tf_model_flush_bucket(m);
      for (int i = 0; i < m->nworks && st == TF_OK; i++) st = tf_dist_wait(m->works[i]);
      tf_model_drop_works(m);
      return st;
  }
}
