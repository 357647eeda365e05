/* Reverse-mode automatic differentiation.
 *
 * A differentiable op (grad_ops.h) that runs while grad mode is on and has
 * an input requiring grad records a node: which inputs the gradient flows
 * to (their own nodes, or the leaf tensors themselves), the tensors its
 * backward needs (saved as detached aliases, with the storage version at
 * save time), a few parameters, and its backward function. The output gets
 * the node as grad_fn. tf_backward walks the graph in topological order,
 * sums gradients per node, accumulates them into the leaves' grad, and
 * releases every saved tensor as soon as its node has run, so memory returns
 * to the pre-forward level plus the gradients.
 *
 * References only point backwards (output -> node -> input nodes, saved
 * aliases carry no grad_fn), so the graph never holds a cycle. */
#ifndef TF_AUTOGRAD_H
#define TF_AUTOGRAD_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { TF_NODE_MAX_INPUTS = 8, TF_NODE_MAX_SAVED = 6 };

/* Computes the gradients of the node's inputs from the gradient of its
 * output: gin[i] receives a new tensor, or stays NULL (no gradient). */
typedef tf_status (*tf_backward_fn)(tf_node *n, const tf_tensor *gout, tf_tensor **gin);

/* What a node made outside the C ops holds (an autograd function a script
 * defines, host/bind/l_function.c): free_saved drops its saved tensors when
 * a backward pass is done with them, release everything when the node goes. */
typedef struct tf_node_ext {
  void (*free_saved)(void *data);
  void (*release)(void *data);
} tf_node_ext;

struct tf_node {
  int refcount;
  const char *name; /* the op, for messages: "matmul" */
  tf_backward_fn backward;
  int ninputs;
  tf_node *next[TF_NODE_MAX_INPUTS];      /* input i's own node (retained) ... */
  tf_tensor *leaf[TF_NODE_MAX_INPUTS];    /* ... or the leaf it accumulates into (retained) */
  tf_shape in_shape[TF_NODE_MAX_INPUTS];  /* inputs' shapes and dtypes, for sum-to-shape and casts */
  tf_dtype in_dtype[TF_NODE_MAX_INPUTS];
  int nsaved;
  tf_tensor *saved[TF_NODE_MAX_SAVED];
  uint64_t saved_version[TF_NODE_MAX_SAVED];
  double scalar[4]; /* op parameters (eps, theta, scalar operands, ...) */
  int64_t param[6];
  bool freed;       /* saved tensors released by a backward pass */
  const tf_node_ext *ext; /* with ext_data: a node of a script's function (NULL: a C op's) */
  void *ext_data;
  bool retaining;   /* the pass running the backward keeps saved tensors (retain_graph) */
  /* during tf_backward */
  uint64_t epoch;   /* the backward pass that last visited this node */
  int pending;      /* gradients still to arrive from consumers */
  tf_tensor *gsum;  /* gradient summed so far */
};

void tf_node_release(tf_node *n);

/* Grad mode (per thread): ops record nodes only while it is on. */
bool tf_grad_enabled(void);
/* Sets the mode and returns the previous one. */
bool tf_set_grad_enabled(bool on);

/* Whether a tensor takes part in differentiation. */
static inline bool tf_tensor_needs_grad(const tf_tensor *t) { return t && (t->requires_grad || t->grad_fn); }

/* Marks a leaf tensor as requiring grad (floating dtypes only). */
tf_status tf_tensor_set_requires_grad(tf_tensor *t, bool on);

/* Starts a node for an op with the given inputs when grad mode is on and
 * some input needs grad; *out is NULL otherwise (nothing to record). */
tf_status tf_node_begin(const char *name, tf_backward_fn backward, tf_tensor *const *inputs, int ninputs,
                        tf_node **out);
/* Saves a detached alias of t for the backward pass (t may be NULL). */
tf_status tf_node_save(tf_node *n, const tf_tensor *t);
/* Makes out the node's output (out->grad_fn = n, taking the reference). */
void tf_node_finish(tf_node *n, tf_tensor *out);
/* A node with one input, next (retained): each output of a node with
 * several outputs gets one, whose backward hands its gradient to next's
 * own bookkeeping (next's backward then runs once, after all of them). */
tf_status tf_node_relay(const char *name, tf_backward_fn backward, tf_node *next, tf_node **out);
/* Abandons a node begun but not finished. */
void tf_node_discard(tf_node *n);
/* Saved tensor i, after checking nothing modified it in place since. */
tf_status tf_node_saved(tf_node *n, int i, const tf_tensor **out);

/* Saves several tensors (NULL entries save nothing, keeping positions). */
tf_status tf_node_save_all(tf_node *n, const tf_tensor *const *ts, int count);
/* Whether input i's gradient is wanted (it leads to a leaf that requires grad). */
static inline bool tf_node_wants(const tf_node *n, int i) { return n->next[i] || n->leaf[i]; }
/* The last step of a differentiable op: on success the node (if any) goes
 * on out and *result = out; on failure both are dropped. Returns st. */
tf_status tf_node_complete(tf_status st, tf_node *node, tf_tensor *out, tf_tensor **result);

/* Bumps the version of t's storage: every in-place write calls this. */
void tf_tensor_bump_version(tf_tensor *t);

/* Backpropagates from root. grad is d(something)/d(root), NULL for a
 * one-element root (then 1). retain keeps saved tensors for another pass. */
tf_status tf_backward(tf_tensor *root, const tf_tensor *grad, bool retain);

/* Called after each gradient added into a leaf's grad, while the pass goes
 * on (a leaf reached by several paths gets a call for each); a failure
 * stops the pass with its status. */
typedef struct tf_grad_hook {
  tf_status (*on_grad)(void *ctx, tf_tensor *leaf);
  void *ctx;
} tf_grad_hook;

/* tf_backward with hook->on_grad called after each leaf's accumulation. */
tf_status tf_backward_hooked(tf_tensor *root, const tf_tensor *grad, bool retain, const tf_grad_hook *hook);

/* A detached alias: same storage and view, no autograd fields. */
tf_status tf_detach(const tf_tensor *t, tf_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
