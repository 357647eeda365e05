/* Autocast regions and the cast cache. The policy lists (autocast.h) are
 * applied where each differentiable op asks for its inputs:
 *   TF_CAST_LOW:  matmul, linear, attention (tf.attention, both the naive
 *                 and the flash implementation: torch's
 *                 scaled_dot_product_attention is on its lower-precision
 *                 list; the naive one's softmax still runs in f32, as the
 *                 same ops do in PyTorch);
 *   TF_CAST_F32:  exp, log, pow, rsqrt, sum, softmax, log_softmax,
 *                 layer_norm, cross_entropy;
 *   TF_CAST_NONE: every other op.
 * The casts themselves are made by tf_autocast_input, beside the cast op
 * it calls (grad_ops.c). */
#include "autocast.h"

#include <stdlib.h>

#include "autograd.h"

enum { TF_AUTOCAST_MAX_DEPTH = 64 };

typedef struct tf_cast_entry {
  tf_tensor *src, *dst; /* both retained */
  uint64_t version;     /* src's storage version when cast */
} tf_cast_entry;

/* Per thread: the stack of regions and the cast cache of the outermost one. */
static _Thread_local int tf_ac_stack[TF_AUTOCAST_MAX_DEPTH];
static _Thread_local int tf_ac_depth;
static _Thread_local tf_cast_entry *tf_ac_cache;
static _Thread_local size_t tf_ac_cached, tf_ac_cache_cap;

int tf_autocast_dtype(void) { return tf_ac_depth > 0 ? tf_ac_stack[tf_ac_depth - 1] : -1; }

tf_status tf_autocast_enter(int dtype, int *depth) {
  if (dtype != -1 && dtype != TF_F16 && dtype != TF_BF16)
    return tf_fail(TF_ERR_ARG, "autocast works with f16 or bf16, not %s", tf_dtype_name((tf_dtype)dtype));
  if (tf_ac_depth == TF_AUTOCAST_MAX_DEPTH)
    return tf_fail(TF_ERR_STATE, "autocast regions are nested more than %d deep", TF_AUTOCAST_MAX_DEPTH);
  tf_ac_stack[tf_ac_depth++] = dtype;
  *depth = tf_ac_depth;
  return TF_OK;
}

static void tf_autocast_clear_cache(void) {
  for (size_t i = 0; i < tf_ac_cached; i++) {
    tf_tensor_release(tf_ac_cache[i].src);
    tf_tensor_release(tf_ac_cache[i].dst);
  }
  free(tf_ac_cache);
  tf_ac_cache = NULL;
  tf_ac_cached = tf_ac_cache_cap = 0;
}

void tf_autocast_exit(int depth) {
  if (depth < 1 || depth > tf_ac_depth) return; /* already left */
  tf_ac_depth = depth - 1;
  if (tf_ac_depth == 0) tf_autocast_clear_cache();
}

/* A parameter's cast from earlier in this region, still valid. */
tf_tensor *tf_autocast_cached(tf_tensor *t, tf_dtype dtype) {
  for (size_t i = 0; i < tf_ac_cached; i++) {
    tf_cast_entry *e = &tf_ac_cache[i];
    if (e->src == t && e->dst->dtype == dtype && e->version == t->storage->version) return e->dst;
  }
  return NULL;
}

void tf_autocast_remember(tf_tensor *src, tf_tensor *dst) {
  if (tf_ac_cached == tf_ac_cache_cap) {
    size_t cap = tf_ac_cache_cap ? tf_ac_cache_cap * 2 : 16;
    tf_cast_entry *bigger = realloc(tf_ac_cache, sizeof *bigger * cap);
    if (!bigger) return; /* no cache: the next call casts again */
    tf_ac_cache = bigger;
    tf_ac_cache_cap = cap;
  }
  tf_ac_cache[tf_ac_cached++] = (tf_cast_entry){tf_tensor_retain(src), tf_tensor_retain(dst), src->storage->version};
}
