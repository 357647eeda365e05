#include "autograd.h"

#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "memrec.h"
#include "ops.h"

static _Thread_local bool tf_grad_off; /* grad mode is on unless turned off */

bool tf_grad_enabled(void) { return !tf_grad_off; }

bool tf_set_grad_enabled(bool on) {
  bool previous = !tf_grad_off;
  tf_grad_off = !on;
  tf_mem_set_grad_mode(on);
  return previous;
}

tf_status tf_tensor_set_requires_grad(tf_tensor *t, bool on) {
  if (t->grad_fn)
    return tf_fail(TF_ERR_ARG, "requires_grad can only be changed on a leaf tensor (this one comes from %s; use "
                               "detach() for a tensor without history)", t->grad_fn->name);
  if (on && tf_dtype_is_fp8(t->dtype))
    return tf_fail(TF_ERR_ARG, "%s tensors cannot require gradients: no op differentiates through them (cast to "
                               "bf16 or f32 first)", tf_dtype_name(t->dtype));
  if (on && !tf_dtype_is_float(t->dtype))
    return tf_fail(TF_ERR_ARG, "only floating tensors can require gradients, not %s", tf_dtype_name(t->dtype));
  t->requires_grad = on;
  return TF_OK;
}

void tf_tensor_bump_version(tf_tensor *t) { t->storage->version++; }

tf_status tf_detach(const tf_tensor *t, tf_tensor **out) {
  tf_shape s = tf_tensor_shape(t);
  return tf_tensor_view(t, &s, t->strides, t->offset, out);
}

/* ---- nodes ----------------------------------------------------------- */

static void tf_node_free_saved(tf_node *n) {
  for (int i = 0; i < n->nsaved; i++) {
    tf_tensor_release(n->saved[i]);
    n->saved[i] = NULL;
  }
  if (n->ext && n->ext->free_saved) n->ext->free_saved(n->ext_data);
}

/* Releases iteratively: a long chain of nodes must not recurse once per op. */
void tf_node_release(tf_node *n) {
  tf_node *stack[64], **work = stack;
  size_t top = 0, cap = 64;
  if (n) work[top++] = n;
  while (top > 0) {
    tf_node *x = work[--top];
    if (--x->refcount > 0) continue;
    tf_node_free_saved(x);
    if (x->ext && x->ext->release) x->ext->release(x->ext_data);
    tf_tensor_release(x->gsum);
    for (int i = 0; i < x->ninputs; i++) {
      tf_tensor_release(x->leaf[i]);
      if (!x->next[i]) continue;
      if (top == cap) {
        tf_node **bigger = malloc(sizeof *bigger * cap * 2);
        if (!bigger) { /* no memory to go on iteratively: recurse for this one */
          tf_node_release(x->next[i]);
          continue;
        }
        memcpy(bigger, work, sizeof *bigger * top);
        if (work != stack) free(work);
        work = bigger;
        cap *= 2;
      }
      work[top++] = x->next[i];
    }
    free(x);
  }
  if (work != stack) free(work);
}

tf_status tf_node_begin(const char *name, tf_backward_fn backward, tf_tensor *const *inputs, int ninputs,
                        tf_node **out) {
  *out = NULL;
  if (!tf_grad_enabled()) return TF_OK;
  bool any = false;
  for (int i = 0; i < ninputs; i++) any = any || tf_tensor_needs_grad(inputs[i]);
  if (!any) return TF_OK;
  tf_tensor_set_node_release(tf_node_release);
  tf_node *n = calloc(1, sizeof *n);
  if (!n) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for an autograd node");
  n->refcount = 1;
  n->name = name;
  n->backward = backward;
  n->ninputs = ninputs;
  for (int i = 0; i < ninputs; i++) {
    const tf_tensor *t = inputs[i];
    if (!t) continue;
    n->in_shape[i] = tf_tensor_shape(t);
    n->in_dtype[i] = t->dtype;
    if (t->grad_fn) {
      n->next[i] = t->grad_fn;
      t->grad_fn->refcount++;
    } else if (t->requires_grad) {
      n->leaf[i] = tf_tensor_retain((tf_tensor *)t);
    }
  }
  *out = n;
  return TF_OK;
}

tf_status tf_node_relay(const char *name, tf_backward_fn backward, tf_node *next, tf_node **out) {
  tf_node *n = calloc(1, sizeof *n);
  *out = n;
  if (!n) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for an autograd node");
  n->refcount = 1;
  n->name = name;
  n->backward = backward;
  n->ninputs = 1;
  n->next[0] = next;
  next->refcount++;
  return TF_OK;
}

tf_status tf_node_save(tf_node *n, const tf_tensor *t) {
  if (n->nsaved == TF_NODE_MAX_SAVED) return tf_fail(TF_ERR_STATE, "%s: too many saved tensors", n->name);
  tf_tensor *alias = NULL;
  if (t) {
    TF_TRY(tf_detach(t, &alias));
    n->saved_version[n->nsaved] = t->storage->version;
  }
  n->saved[n->nsaved++] = alias;
  return TF_OK;
}

void tf_node_finish(tf_node *n, tf_tensor *out) {
  tf_node_release(out->grad_fn);
  out->grad_fn = n;
}

void tf_node_discard(tf_node *n) { tf_node_release(n); }

tf_status tf_node_save_all(tf_node *n, const tf_tensor *const *ts, int count) {
  for (int i = 0; i < count; i++) TF_TRY(tf_node_save(n, ts[i]));
  return TF_OK;
}

tf_status tf_node_complete(tf_status st, tf_node *node, tf_tensor *out, tf_tensor **result) {
  if (st != TF_OK) {
    if (node) tf_node_discard(node);
    tf_tensor_release(out);
    return st;
  }
  if (node) tf_node_finish(node, out);
  *result = out;
  return TF_OK;
}

tf_status tf_node_saved(tf_node *n, int i, const tf_tensor **out) {
  if (n->freed)
    return tf_fail(TF_ERR_STATE, "backward through %s a second time: its saved tensors were freed by the first "
                                 "backward (pass retain_graph = true to the first one to keep them)", n->name);
  const tf_tensor *t = n->saved[i];
  if (t && t->storage->version != n->saved_version[i])
    return tf_fail(TF_ERR_STATE, "a tensor saved for the backward pass of %s was modified in place afterwards "
                                 "(copy_, fill_ or an optimizer step): its gradient would be wrong", n->name);
  *out = t;
  return TF_OK;
}

/* ---- backward ---------------------------------------------------------- */

static uint64_t tf_backward_epoch;

/* acc = acc + g (a new tensor), or g itself when acc is empty; takes g. */
static tf_status tf_accumulate(tf_tensor **acc, tf_tensor *g) {
  if (!*acc) {
    *acc = g;
    return TF_OK;
  }
  tf_tensor *sum;
  tf_status st = tf_binary(TF_OP_ADD, *acc, g, &sum);
  tf_tensor_release(g);
  if (st != TF_OK) return st;
  tf_tensor_release(*acc);
  *acc = sum;
  return TF_OK;
}

/* The first gradient a leaf keeps must own its memory: views of other
 * gradients, or a tensor also held elsewhere (passed through to two
 * leaves, or the caller's backward(g)), would alias them. */
static tf_status tf_accumulate_leaf(tf_tensor *leaf, tf_tensor *g) {
  if (!leaf->grad &&
      (g->refcount > 1 || g->storage->refcount > 1 || !tf_tensor_is_contiguous(g) || g->offset != 0)) {
    tf_tensor *own;
    tf_status st = tf_to(g, g->dtype, g->device, &own);
    tf_tensor_release(g);
    if (st != TF_OK) return st;
    g = own;
  }
  TF_TRY(tf_accumulate(&leaf->grad, g));
  tf_device_ctx *ctx;
  if (leaf->grad->storage->block && tf_device_ctx_get(leaf->grad->device, &ctx) == TF_OK)
    tf_alloc_retag(&ctx->alloc, leaf->grad->storage->block, TF_TAG_GRADIENT);
  return TF_OK;
}

/* Gives g the input's dtype (gradients match their tensors, as in PyTorch). */
static tf_status tf_match_input(tf_node *n, int i, tf_tensor **g) {
  tf_shape s = tf_tensor_shape(*g);
  if (s.ndim != n->in_shape[i].ndim || memcmp(s.dims, n->in_shape[i].dims, sizeof(int64_t) * (size_t)s.ndim) != 0) {
    char a[128], b[128];
    return tf_fail(TF_ERR_STATE, "backward of %s: gradient of shape %s for an input of shape %s", n->name,
                   tf_shape_format(&s, a, sizeof a), tf_shape_format(&n->in_shape[i], b, sizeof b));
  }
  if ((*g)->dtype == n->in_dtype[i]) return TF_OK;
  tf_tensor *c;
  TF_TRY(tf_to(*g, n->in_dtype[i], (*g)->device, &c));
  tf_tensor_release(*g);
  *g = c;
  return TF_OK;
}

typedef struct tf_node_list {
  tf_node **items;
  size_t n, cap;
} tf_node_list;

static tf_status tf_node_list_push(tf_node_list *l, tf_node *x) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    tf_node **bigger = realloc(l->items, sizeof *bigger * cap);
    if (!bigger) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the backward pass");
    l->items = bigger;
    l->cap = cap;
  }
  l->items[l->n++] = x;
  return TF_OK;
}

/* Every node reachable from root, each once, with pending = its number of
 * consumers inside the graph. */
static tf_status tf_collect(tf_node *root, uint64_t epoch, tf_node_list *all) {
  tf_node_list stack = {0};
  root->epoch = epoch;
  root->pending = 0;
  tf_status st = tf_node_list_push(all, root);
  if (st == TF_OK) st = tf_node_list_push(&stack, root);
  while (st == TF_OK && stack.n > 0) {
    tf_node *x = stack.items[--stack.n];
    for (int i = 0; i < x->ninputs && st == TF_OK; i++) {
      tf_node *c = x->next[i];
      if (!c) continue;
      if (c->epoch != epoch) {
        c->epoch = epoch;
        c->pending = 0;
        st = tf_node_list_push(all, c);
        if (st == TF_OK) st = tf_node_list_push(&stack, c);
      }
      c->pending++;
    }
  }
  free(stack.items);
  return st;
}

/* A leaf's gradient added in, then the hook told (when there is one). */
static tf_status tf_accumulate_leaf_hooked(tf_tensor *leaf, tf_tensor *g, const tf_grad_hook *hook) {
  TF_TRY(tf_accumulate_leaf(leaf, g));
  return hook && hook->on_grad ? hook->on_grad(hook->ctx, leaf) : TF_OK;
}

static tf_status tf_run_node(tf_node *x, bool retain, tf_node_list *ready, const tf_grad_hook *hook) {
  if (x->freed) {
    const tf_tensor *unused;
    return tf_node_saved(x, 0, &unused); /* the "second backward" message */
  }
  tf_tensor *gin[TF_NODE_MAX_INPUTS] = {0};
  tf_mem_scope outer = tf_mem_scope_enter(TF_TAG_TEMPORARY, x->name);
  x->retaining = retain;
  tf_status st = x->backward(x, x->gsum, gin);
  tf_mem_scope_leave(outer);
  /* The node's gradient is released before its inputs' are handed on, so
   * that one it passed through unchanged is held by that input alone and a
   * leaf can keep it without a copy (tf_accumulate_leaf). */
  tf_tensor_release(x->gsum);
  x->gsum = NULL;
  for (int i = 0; i < x->ninputs; i++) {
    tf_tensor *g = gin[i];
    gin[i] = NULL;
    if (!g) {
      if (x->next[i] && --x->next[i]->pending == 0 && st == TF_OK) st = tf_node_list_push(ready, x->next[i]);
      continue;
    }
    if (st == TF_OK) st = tf_match_input(x, i, &g);
    if (st != TF_OK) {
      tf_tensor_release(g);
      continue;
    }
    if (x->next[i]) {
      st = tf_accumulate(&x->next[i]->gsum, g);
      if (st == TF_OK && --x->next[i]->pending == 0) st = tf_node_list_push(ready, x->next[i]);
    } else if (x->leaf[i]) {
      st = tf_accumulate_leaf_hooked(x->leaf[i], g, hook);
    } else {
      tf_tensor_release(g);
    }
  }
  if (!retain && st == TF_OK) {
    tf_node_free_saved(x);
    x->freed = true;
  }
  return st;
}

static tf_status tf_root_gradient(tf_tensor *root, const tf_tensor *grad, tf_tensor **out) {
  tf_shape s = tf_tensor_shape(root);
  if (!grad) {
    if (tf_tensor_numel(root) != 1)
      return tf_fail(TF_ERR_ARG, "backward: a gradient can be implied only for a one-element tensor; this one has "
                                 "%lld elements, so pass the gradient", (long long)tf_tensor_numel(root));
    return tf_full(&s, 1.0, root->dtype, root->device, out);
  }
  tf_shape gs = tf_tensor_shape(grad);
  if (gs.ndim != s.ndim || memcmp(gs.dims, s.dims, sizeof(int64_t) * (size_t)s.ndim) != 0) {
    char a[128], b[128];
    return tf_fail(TF_ERR_ARG, "backward: the gradient has shape %s but the tensor has shape %s",
                   tf_shape_format(&gs, a, sizeof a), tf_shape_format(&s, b, sizeof b));
  }
  if (!tf_device_eq(grad->device, root->device))
    return tf_fail(TF_ERR_DEVICE, "backward: the gradient is on another device than the tensor");
  /* The caller's tensor itself where it already fits (dtype, contiguous),
   * as PyTorch does: the pass reads gradients and never writes them in
   * place, and a leaf keeps a copy of a gradient someone else holds
   * (tf_accumulate_leaf). */
  if (grad->dtype == root->dtype && tf_tensor_is_contiguous(grad)) {
    *out = tf_tensor_retain((tf_tensor *)grad);
    return TF_OK;
  }
  return tf_to(grad, root->dtype, root->device, out);
}

tf_status tf_backward(tf_tensor *root, const tf_tensor *grad, bool retain) {
  return tf_backward_hooked(root, grad, retain, NULL);
}

tf_status tf_backward_hooked(tf_tensor *root, const tf_tensor *grad, bool retain, const tf_grad_hook *hook) {
  if (!tf_tensor_needs_grad(root))
    return tf_fail(TF_ERR_ARG, "backward: the tensor does not require grad (nothing it was computed from has "
                               "requires_grad set)");
  tf_tensor *g;
  TF_TRY(tf_root_gradient(root, grad, &g));
  if (!root->grad_fn) return tf_accumulate_leaf_hooked(root, g, hook);
  bool was = tf_set_grad_enabled(false);
  uint64_t epoch = ++tf_backward_epoch;
  tf_node_list all = {0}, ready = {0};
  tf_status st = tf_collect(root->grad_fn, epoch, &all);
  if (st == TF_OK) {
    root->grad_fn->gsum = g;
    g = NULL;
    st = tf_node_list_push(&ready, root->grad_fn);
  }
  while (st == TF_OK && ready.n > 0) st = tf_run_node(ready.items[--ready.n], retain, &ready, hook);
  for (size_t i = 0; i < all.n; i++) { /* after an error, gradients in flight are dropped */
    tf_tensor_release(all.items[i]->gsum);
    all.items[i]->gsum = NULL;
  }
  tf_tensor_release(g);
  free(all.items);
  free(ready.items);
  tf_set_grad_enabled(was);
  return st;
}
