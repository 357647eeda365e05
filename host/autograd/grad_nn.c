/* Differentiable neural-network ops: nnops.h's forward and backward kernels
 * recorded as autograd nodes, under the autocast policy. */
#include "autocast.h"
#include "autograd.h"
#include "grad_ops.h"
#include "nnops.h"

/* Shared tail: temporaries released, then the node (if any) finished on y. */
static tf_status tf_nn_done(tf_status st, tf_node *node, tf_tensor *y, tf_tensor *const *temps, int ntemps,
                            tf_tensor **out) {
  for (int i = 0; i < ntemps; i++) tf_tensor_release(temps[i]);
  return tf_node_complete(st, node, y, out);
}

/* ---- softmax / log_softmax ------------------------------------------------------ */

static tf_status tf_bw_softmax(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *y;
  TF_TRY(tf_node_saved(n, 0, &y));
  return tf_softmax_backward(y, g, n->param[0] != 0, &gin[0]);
}

tf_status tf_ag_softmax(tf_tensor *x, bool log, tf_tensor **out) {
  tf_tensor *cx, *y = NULL;
  TF_TRY(tf_autocast_input(TF_CAST_F32, x, &cx));
  tf_node *node = NULL;
  tf_status st = tf_softmax(cx, log, &y);
  if (st == TF_OK) st = tf_node_begin(log ? "log_softmax" : "softmax", tf_bw_softmax, &cx, 1, &node);
  if (st == TF_OK && node) {
    node->param[0] = log;
    st = tf_node_save(node, y);
  }
  return tf_nn_done(st, node, y, &cx, 1, out);
}

/* ---- layer_norm ------------------------------------------------------------------ */

static tf_status tf_bw_layer_norm(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *x, *w, *mean, *rstd;
  TF_TRY(tf_node_saved(n, 0, &x));
  TF_TRY(tf_node_saved(n, 1, &w));
  TF_TRY(tf_node_saved(n, 2, &mean));
  TF_TRY(tf_node_saved(n, 3, &rstd));
  return tf_layer_norm_backward(g, x, w, mean, rstd, tf_node_wants(n, 0) ? &gin[0] : NULL,
                                tf_node_wants(n, 1) ? &gin[1] : NULL, tf_node_wants(n, 2) ? &gin[2] : NULL);
}

tf_status tf_ag_layer_norm(tf_tensor *x, tf_tensor *w, tf_tensor *b, double eps, tf_tensor **out) {
  tf_tensor *c[3] = {NULL, NULL, NULL}, *y = NULL, *mean = NULL, *rstd = NULL;
  tf_tensor *in[3] = {x, w, b};
  tf_status st = TF_OK;
  for (int i = 0; i < 3 && st == TF_OK; i++) st = tf_autocast_input(TF_CAST_F32, in[i], &c[i]);
  tf_node *node = NULL;
  if (st == TF_OK) st = tf_layer_norm(c[0], c[1], c[2], eps, &y, &mean, &rstd);
  if (st == TF_OK) st = tf_node_begin("layer_norm", tf_bw_layer_norm, c, 3, &node);
  if (st == TF_OK && node) {
    const tf_tensor *saves[4] = {c[0], c[1], mean, rstd};
    st = tf_node_save_all(node, saves, 4);
  }
  tf_tensor *temps[5] = {c[0], c[1], c[2], mean, rstd};
  return tf_nn_done(st, node, y, temps, 5, out);
}

/* ---- rms_norm --------------------------------------------------------------------- */

static tf_status tf_bw_rms_norm(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *x, *gain, *rstd;
  TF_TRY(tf_node_saved(n, 0, &x));
  TF_TRY(tf_node_saved(n, 1, &gain));
  TF_TRY(tf_node_saved(n, 2, &rstd));
  return tf_rms_norm_backward(g, x, gain, rstd, tf_node_wants(n, 0) ? &gin[0] : NULL,
                              tf_node_wants(n, 1) ? &gin[1] : NULL);
}

/* Statistics are f32 whatever the region: the op is not cast by autocast. */
tf_status tf_ag_rms_norm(tf_tensor *x, tf_tensor *gain, double eps, tf_tensor **out) {
  tf_tensor *y = NULL, *rstd = NULL;
  tf_node *node = NULL;
  tf_status st = tf_rms_norm(x, gain, eps, &y, &rstd);
  tf_tensor *in[2] = {x, gain};
  if (st == TF_OK) st = tf_node_begin("rms_norm", tf_bw_rms_norm, in, 2, &node);
  if (st == TF_OK && node) {
    const tf_tensor *saves[3] = {x, gain, rstd};
    st = tf_node_save_all(node, saves, 3);
  }
  return tf_nn_done(st, node, y, &rstd, 1, out);
}

/* ---- cross_entropy ---------------------------------------------------------------- */

static tf_status tf_bw_cross_entropy(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *logits, *targets, *lse;
  TF_TRY(tf_node_saved(n, 0, &logits));
  TF_TRY(tf_node_saved(n, 1, &targets));
  TF_TRY(tf_node_saved(n, 2, &lse));
  return tf_cross_entropy_backward(logits, targets, lse, g, &gin[0]);
}

tf_status tf_ag_cross_entropy(tf_tensor *logits, tf_tensor *targets, tf_tensor **out) {
  tf_tensor *cl, *y = NULL, *lse = NULL;
  TF_TRY(tf_autocast_input(TF_CAST_F32, logits, &cl));
  tf_node *node = NULL;
  tf_status st = tf_cross_entropy(cl, targets, &y, &lse);
  tf_tensor *in[2] = {cl, targets};
  if (st == TF_OK) st = tf_node_begin("cross_entropy", tf_bw_cross_entropy, in, 2, &node);
  if (st == TF_OK && node) {
    const tf_tensor *saves[3] = {cl, targets, lse};
    st = tf_node_save_all(node, saves, 3);
  }
  tf_tensor *temps[2] = {cl, lse};
  return tf_nn_done(st, node, y, temps, 2, out);
}

/* ---- rope --------------------------------------------------------------------------- */

static tf_status tf_bw_rope(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *positions;
  TF_TRY(tf_node_saved(n, 0, &positions));
  return tf_rope(g, positions, n->scalar[0], true, &gin[0]);
}

tf_status tf_ag_rope(tf_tensor *x, tf_tensor *positions, double theta, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_node *node = NULL;
  tf_status st = tf_rope(x, positions, theta, false, &y);
  if (st == TF_OK) st = tf_node_begin("rope", tf_bw_rope, &x, 1, &node);
  if (st == TF_OK && node) {
    node->scalar[0] = theta;
    st = tf_node_save(node, positions);
  }
  return tf_nn_done(st, node, y, NULL, 0, out);
}

/* ---- embedding ---------------------------------------------------------------------- */

static tf_status tf_bw_embedding(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *ids;
  TF_TRY(tf_node_saved(n, 0, &ids));
  return tf_embedding_backward(g, ids, n->in_shape[0].dims[0], n->in_dtype[0], &gin[0]);
}

tf_status tf_ag_embedding(tf_tensor *weight, tf_tensor *ids, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_node *node = NULL;
  tf_status st = tf_embedding(weight, ids, &y);
  if (st == TF_OK) st = tf_node_begin("embedding", tf_bw_embedding, &weight, 1, &node);
  if (st == TF_OK && node) st = tf_node_save(node, ids);
  return tf_nn_done(st, node, y, NULL, 0, out);
}

/* ---- masked_fill ---------------------------------------------------------------------- */

static tf_status tf_bw_masked_fill(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *mask;
  TF_TRY(tf_node_saved(n, 0, &mask));
  return tf_masked_fill(g, mask, 0.0, &gin[0]);
}

tf_status tf_ag_masked_fill(tf_tensor *x, tf_tensor *mask, double value, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_node *node = NULL;
  tf_status st = tf_masked_fill(x, mask, value, &y);
  if (st == TF_OK) st = tf_node_begin("masked_fill", tf_bw_masked_fill, &x, 1, &node);
  if (st == TF_OK && node) st = tf_node_save(node, mask);
  return tf_nn_done(st, node, y, NULL, 0, out);
}
