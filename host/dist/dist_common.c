/* What every part of tf.dist shares: the names of collectives and
 * reductions, the signature the ranks compare, the shards of a flat buffer. */
#include <stdio.h>
#include <string.h>

#include "dist_internal.h"

static const char *const tf_kind_names[TF_DIST_KINDS] = {
    "barrier", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv", "all_gather_shards", "reduce_to_shards"};
static const char *const tf_op_names[] = {"sum", "avg", "max", "min"};

tf_status tf_dist_op_parse(const char *name, tf_dist_op *out) {
  for (int i = 0; i < 4; i++) {
    if (strcmp(name, tf_op_names[i]) == 0) {
      *out = (tf_dist_op)i;
      return TF_OK;
    }
  }
  return tf_fail(TF_ERR_ARG, "unknown reduction '%s' (expected sum, avg, max or min)", name);
}

void tf_dist_signature(const tf_dist_call *c, int64_t sig[TF_DIST_SIG_LEN]) {
  const bool reduces = c->kind == TF_DIST_K_ALL_REDUCE || c->kind == TF_DIST_K_REDUCE_SCATTER;
  int64_t s[TF_DIST_SIG_LEN] = {c->kind, c->dtype, c->count, c->device.type,
                                c->kind == TF_DIST_K_BROADCAST ? c->peer : -1, reduces ? (int64_t)c->op : -1, 0x7fd157};
  memcpy(sig, s, sizeof s);
}

const char *tf_dist_signature_format(const int64_t sig[TF_DIST_SIG_LEN], char *buf, size_t n) {
  const char *kind = sig[0] >= 0 && sig[0] < TF_DIST_KINDS ? tf_kind_names[sig[0]] : "?";
  const char *dtype = sig[1] >= 0 && sig[1] < TF_NDTYPES ? tf_dtype_name((tf_dtype)sig[1]) : "?";
  int used = snprintf(buf, n, "%s of %lld %s on %s", kind, (long long)sig[2], dtype, sig[3] == TF_DEV_CPU ? "cpu" : "cuda");
  if (sig[4] >= 0 && used > 0 && (size_t)used < n) used += snprintf(buf + used, n - (size_t)used, ", root %lld", (long long)sig[4]);
  if (sig[5] >= 0 && sig[5] < 4 && used > 0 && (size_t)used < n) snprintf(buf + used, n - (size_t)used, ", %s", tf_op_names[sig[5]]);
  return buf;
}

void tf_dist_shard(int64_t n, int rank, int world, int64_t *begin, int64_t *end) {
  int64_t chunk = (n + world - 1) / world;
  int64_t b = chunk * rank, e = b + chunk;
  *begin = b < n ? b : n;
  *end = e < n ? e : n;
}

