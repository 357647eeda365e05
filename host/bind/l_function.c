/* Differentiable ops written in Lua (tf.autograd.Function, lua/tf/autograd.lua):
 * the context a forward saves into, and the autograd node that calls the
 * script's backward.
 *
 * A call of a function runs its forward with grad mode off, then records one
 * node over the call's tensor arguments. With one differentiable output the
 * output's grad_fn is that node; with several, each output gets a relay node
 * (tf_node_relay) that parks its gradient in the node's slot for that output,
 * and the node runs once every relay reachable from the loss has, with all
 * the outputs' gradients (zeros for those the loss did not use, or nil when
 * the function asked for that). The node holds the context (a registry
 * reference): its saved tensors are released when the pass is done with them,
 * and the handles ctx:saved() gave the backward are freed with them, so memory
 * returns to its level before the forward as it does for the C ops. */
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "autocast.h"
#include "autograd.h"

#define TF_FN_CTX_TYPE "tf.FunctionCtx"

/* The context's user values: the fields a script sets (needs_input_grad
 * among them), the function (its name and backward), the handles of saved
 * tensors given to a backward, the outputs marked non-differentiable. */
enum { TF_FN_FIELDS = 1, TF_FN_FUNCTION, TF_FN_HANDLES, TF_FN_MARKED, TF_FN_NUV = TF_FN_MARKED };

typedef struct tf_fn_ctx {
  int nsaved, cap;
  tf_tensor **saved; /* detached aliases (NULL where nil was saved) */
  uint64_t *version; /* their storage's version when saved */
  bool recorded;     /* a node holds the context: ctx:save is over */
  bool freed;        /* a backward pass released the saved tensors */
  int autocast;      /* the forward's autocast dtype (-1: off), the backward's too, as custom_bwd */
  char name[64];
} tf_fn_ctx;

typedef struct tf_fn_output {
  bool differentiable;
  tf_shape shape;
  tf_dtype dtype;
  tf_device device;
} tf_fn_output;

/* A node's ext_data. */
typedef struct tf_fn_node {
  lua_State *L; /* the main thread, for the registry */
  int ctx_ref;
  tf_fn_ctx *ctx;
  int nargs;
  int *input_of;  /* the forward's argument i: its node input, or -1 (not a tensor) */
  tf_device in_device[TF_NODE_MAX_INPUTS];
  int nout, single; /* single: the one differentiable output, or -1 (relays) */
  tf_fn_output *out;
  tf_tensor **grads; /* the relays' gradients, by output */
  bool materialize;
} tf_fn_node;

static _Thread_local lua_State *tf_fn_backward_L;

lua_State *tf_lua_set_backward_state(lua_State *L) {
  lua_State *previous = tf_fn_backward_L;
  tf_fn_backward_L = L;
  return previous;
}

/* ---- the context ---------------------------------------------------------- */

static void tf_fn_ctx_free_saved(tf_fn_ctx *c) {
  for (int i = 0; i < c->nsaved; i++) tf_tensor_release(c->saved[i]);
  free(c->saved);
  free(c->version);
  c->saved = NULL;
  c->version = NULL;
  c->nsaved = c->cap = 0;
}

static tf_fn_ctx *tf_fn_checkctx(lua_State *L, int idx) { return luaL_checkudata(L, idx, TF_FN_CTX_TYPE); }

/* tf._function.ctx(fn, args, casting): the context of one call; args is the
 * packed argument list; casting: the call cast its inputs (cast_inputs), so
 * forward and backward run with autocast off. */
static int tf_l_fn_ctx(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  tf_fn_ctx *c = lua_newuserdatauv(L, sizeof *c, TF_FN_NUV);
  memset(c, 0, sizeof *c);
  luaL_setmetatable(L, TF_FN_CTX_TYPE);
  lua_getfield(L, 1, "name");
  snprintf(c->name, sizeof c->name, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "function");
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  lua_getfield(L, 2, "n");
  int n = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  lua_createtable(L, n, 0);
  bool grad = tf_grad_enabled();
  for (int i = 1; i <= n; i++) {
    lua_geti(L, 2, i);
    tf_tensor *t = tf_lua_totensor(L, -1);
    lua_pop(L, 1);
    lua_pushboolean(L, grad && t && tf_tensor_needs_grad(t));
    lua_rawseti(L, -2, i);
  }
  lua_setfield(L, -2, "needs_input_grad");
  lua_setiuservalue(L, -2, TF_FN_FIELDS);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, TF_FN_FUNCTION);
  c->autocast = lua_toboolean(L, 3) ? -1 : tf_autocast_dtype();
  return 1;
}

/* ctx:save(a, b, ...): tensors (or nil, keeping its place) for the backward,
 * which ctx:saved() returns in the order saved, over every call. */
static int tf_l_fn_save(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  if (c->recorded)
    return tf_lua_error(L, "%s: ctx:save belongs in forward (the backward reads what forward saved with ctx:saved())",
                        c->name);
  int n = lua_gettop(L) - 1;
  for (int i = 2; i <= n + 1; i++)
    if (!lua_isnil(L, i) && !tf_lua_totensor(L, i)) {
      if (luaL_testudata(L, i, TF_TENSOR_TYPE)) tf_lua_checktensor(L, i); /* freed: its own message */
      return tf_lua_error(L, "%s: ctx:save takes tensors (and nil), not a %s as argument %d; keep other values as "
                             "fields: ctx.name = value", c->name, luaL_typename(L, i), i - 1);
    }
  if (c->nsaved + n > c->cap) {
    int cap = c->nsaved + n + 8;
    tf_tensor **s = realloc(c->saved, sizeof *s * (size_t)cap);
    if (s) c->saved = s;
    uint64_t *v = s ? realloc(c->version, sizeof *v * (size_t)cap) : NULL;
    if (v) c->version = v;
    if (!s || !v) return tf_lua_error(L, "out of memory: no host memory for %s's saved tensors", c->name);
    c->cap = cap;
  }
  for (int i = 2; i <= n + 1; i++) {
    tf_tensor *t = tf_lua_totensor(L, i), *alias = NULL;
    if (t) {
      TF_LUA_CHECK(L, tf_detach(t, &alias), "ctx:save");
      c->version[c->nsaved] = t->storage->version;
    }
    c->saved[c->nsaved++] = alias;
  }
  return 0;
}

/* ctx:saved(): what forward saved, as new handles; those a backward gets are
 * freed when it returns, unless the pass keeps the graph (retain_graph). */
static int tf_l_fn_saved(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  if (c->freed)
    return tf_lua_error(L, "backward through %s a second time: its saved tensors were freed by the first backward "
                           "(pass retain_graph = true to the first one to keep them)", c->name);
  luaL_checkstack(L, c->nsaved + 2, "too many saved tensors");
  for (int i = 0; i < c->nsaved; i++)
    if (c->saved[i] && c->saved[i]->storage->version != c->version[i])
      return tf_lua_error(L, "%s: saved tensor %d was modified in place after ctx:save (copy_, fill_ or an optimizer "
                             "step): its gradient would be wrong", c->name, i + 1);
  if (c->recorded) lua_getiuservalue(L, 1, TF_FN_HANDLES);
  int handles = lua_gettop(L);
  for (int i = 0; i < c->nsaved; i++) {
    if (!c->saved[i]) {
      lua_pushnil(L);
      continue;
    }
    tf_lua_pushtensor(L, tf_tensor_retain(c->saved[i]));
    if (c->recorded && lua_istable(L, handles)) {
      lua_pushvalue(L, -1);
      lua_rawseti(L, handles, (lua_Integer)lua_rawlen(L, handles) + 1);
    }
  }
  return c->nsaved;
}

/* ctx:mark_non_differentiable(out, ...): outputs that get no gradient (an
 * index tensor, a mask); integer outputs never do. */
static int tf_l_fn_mark(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  if (c->recorded) return tf_lua_error(L, "%s: ctx:mark_non_differentiable belongs in forward", c->name);
  lua_getiuservalue(L, 1, TF_FN_MARKED);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, 1, TF_FN_MARKED);
  }
  int marked = lua_gettop(L);
  for (int i = 2; i < marked; i++) {
    tf_tensor *t = tf_lua_totensor(L, i);
    if (!t) return tf_lua_error(L, "%s: ctx:mark_non_differentiable takes the output tensors, not a %s", c->name,
                                luaL_typename(L, i));
    lua_pushboolean(L, 1);
    lua_rawsetp(L, marked, t);
  }
  return 0;
}

static const luaL_Reg tf_fn_ctx_methods[] = {
    {"save", tf_l_fn_save},
    {"saved", tf_l_fn_saved},
    {"mark_non_differentiable", tf_l_fn_mark},
    {NULL, NULL},
};

/* ctx.field: a method, or what the script set (needs_input_grad among them). */
static int tf_l_fn_index(lua_State *L) {
  tf_fn_checkctx(L, 1);
  luaL_getmetafield(L, 1, "__methods");
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  lua_getiuservalue(L, 1, TF_FN_FIELDS);
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

static int tf_l_fn_newindex(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  luaL_getmetafield(L, 1, "__methods");
  lua_pushvalue(L, 2);
  bool method = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  if (method || (key && strcmp(key, "needs_input_grad") == 0))
    return tf_lua_error(L, "%s: ctx.%s is tfhost's; store the function's own values under other names", c->name, key);
  lua_getiuservalue(L, 1, TF_FN_FIELDS);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, -3);
  return 0;
}

/* __close and __gc: a context no node took (the forward failed, or nothing
 * needed a gradient) lets its saved tensors go at once. */
static int tf_l_fn_close(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  if (!c->recorded) tf_fn_ctx_free_saved(c);
  return 0;
}

static int tf_l_fn_gc(lua_State *L) {
  tf_fn_ctx_free_saved(tf_fn_checkctx(L, 1));
  return 0;
}

static int tf_l_fn_tostring(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  lua_pushfstring(L, "tf.FunctionCtx(%s, %d saved%s)", c->name, c->nsaved, c->freed ? ", freed" : "");
  return 1;
}

/* ---- the node ------------------------------------------------------------- */

/* Forgets the handles a backward was given (saved tensors, gradients; ctx at
 * the top), freeing them first unless the pass keeps the graph. */
static void tf_fn_drop_handles(lua_State *L, bool free_them) {
  if (free_them && lua_getiuservalue(L, -1, TF_FN_HANDLES) == LUA_TTABLE) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      tf_lua_tensor *u = luaL_testudata(L, -1, TF_TENSOR_TYPE);
      if (u && u->t) {
        tf_tensor_release(u->t);
        u->t = NULL;
      }
      lua_pop(L, 1);
    }
  }
  if (free_them) lua_pop(L, 1);
  lua_newtable(L);
  lua_setiuservalue(L, -2, TF_FN_HANDLES);
}

static void tf_fn_node_free_saved(void *data) {
  tf_fn_node *f = data;
  tf_fn_ctx_free_saved(f->ctx);
  f->ctx->freed = true;
}

static void tf_fn_node_release(void *data) {
  tf_fn_node *f = data;
  for (int k = 0; k < f->nout; k++) tf_tensor_release(f->grads[k]);
  luaL_unref(f->L, LUA_REGISTRYINDEX, f->ctx_ref);
  free(f->grads);
  free(f->out);
  free(f->input_of);
  free(f);
}

static const tf_node_ext tf_fn_node_ext = {tf_fn_node_free_saved, tf_fn_node_release};

/* The gradient of output k, for the backward's argument list: what arrived,
 * zeros where nothing did (materialize_grads), else nil; its handle goes in
 * the list freed after the backward (handles: that table's index). Takes g. */
static tf_status tf_fn_push_grad(lua_State *L, const tf_fn_node *f, int k, tf_tensor *g, int handles) {
  if (!g && f->out[k].differentiable && f->materialize)
    TF_TRY(tf_full(&f->out[k].shape, 0.0, f->out[k].dtype, f->out[k].device, &g));
  if (!g) {
    lua_pushnil(L);
    return TF_OK;
  }
  tf_lua_pushtensor(L, g);
  lua_pushvalue(L, -1);
  lua_rawseti(L, handles, (lua_Integer)lua_rawlen(L, handles) + 1);
  return TF_OK;
}

/* What the value at idx is, in messages: "tensor", "string", ... */
static const char *tf_fn_kind(lua_State *L, int idx) {
  return luaL_testudata(L, idx, TF_TENSOR_TYPE) ? "tensor" : luaL_typename(L, idx);
}

/* The script's results as the node's input gradients (results from base + 1). */
static tf_status tf_fn_take_results(lua_State *L, tf_node *n, const tf_fn_node *f, int base, tf_tensor **gin) {
  int nres = lua_gettop(L) - base;
  if (nres > f->nargs)
    return tf_fail(TF_ERR_ARG, "backward of %s returned %d values for a forward of %d arguments: one gradient (or nil) "
                               "per argument of forward", n->name, nres, f->nargs);
  for (int i = 0; i < nres; i++) {
    int idx = base + 1 + i, j = f->input_of[i];
    if (lua_isnil(L, idx)) continue;
    tf_tensor *g = tf_lua_totensor(L, idx);
    if (j < 0)
      return tf_fail(TF_ERR_ARG, "backward of %s returned a %s for argument %d of forward, which is not a tensor (its "
                                 "gradient must be nil)", n->name, tf_fn_kind(L, idx), i + 1);
    if (!g)
      return tf_fail(TF_ERR_ARG, "backward of %s returned a %s for argument %d; a gradient is a tensor or nil",
                     n->name, tf_fn_kind(L, idx), i + 1);
    if (!tf_device_eq(g->device, f->in_device[j])) {
      char a[32], b[32];
      tf_device_format(g->device, a, sizeof a);
      tf_device_format(f->in_device[j], b, sizeof b);
      return tf_fail(TF_ERR_DEVICE, "backward of %s returned a gradient on %s for argument %d, which is on %s",
                     n->name, a, i + 1, b);
    }
    if (!tf_dtype_is_float(g->dtype))
      return tf_fail(TF_ERR_ARG, "backward of %s returned a %s gradient for argument %d; gradients are floating",
                     n->name, tf_dtype_name(g->dtype), i + 1);
    gin[j] = tf_tensor_retain(g);
  }
  return TF_OK;
}

static tf_status tf_fn_backward(tf_node *n, const tf_tensor *gout, tf_tensor **gin) {
  tf_fn_node *f = n->ext_data;
  lua_State *L = tf_fn_backward_L;
  if (!L)
    return tf_fail(TF_ERR_STATE, "backward of %s: a function written in Lua is differentiated by a backward called "
                                 "from Lua", n->name);
  if (!lua_checkstack(L, f->nout + f->nargs + 8))
    return tf_fail(TF_ERR_OOM, "out of memory: no Lua stack for the backward of %s", n->name);
  int base = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, f->ctx_ref);
  int ctx = lua_gettop(L);
  lua_getiuservalue(L, ctx, TF_FN_HANDLES);
  int handles = lua_gettop(L);
  lua_getiuservalue(L, ctx, TF_FN_FUNCTION);
  lua_getfield(L, -1, "backward");
  lua_remove(L, -2);
  lua_pushvalue(L, ctx);
  tf_status st = TF_OK;
  for (int k = 0; k < f->nout && st == TF_OK; k++) {
    tf_tensor *g = NULL;
    if (f->single == k && gout)
      g = tf_tensor_retain((tf_tensor *)gout);
    else if (f->single < 0) {
      g = f->grads[k];
      f->grads[k] = NULL;
    }
    st = tf_fn_push_grad(L, f, k, g, handles);
  }
  if (st == TF_OK) {
    int depth = 0;
    st = tf_autocast_enter(f->ctx->autocast, &depth);
    if (st == TF_OK) {
      int rc = lua_pcall(L, 1 + f->nout, LUA_MULTRET, 0);
      tf_autocast_exit(depth);
      if (rc != LUA_OK)
        st = tf_fail(TF_ERR_ARG, "backward of %s: %s", n->name,
                     lua_tostring(L, -1) ? lua_tostring(L, -1) : "(an error object that is not a string)");
      else
        st = tf_fn_take_results(L, n, f, handles, gin);
    }
  }
  if (st != TF_OK)
    for (int j = 0; j < n->ninputs; j++) {
      tf_tensor_release(gin[j]);
      gin[j] = NULL;
    }
  lua_settop(L, ctx);
  tf_fn_drop_handles(L, !n->retaining);
  lua_settop(L, base);
  return st;
}

/* An output's relay: its gradient waits in the node's slot for it. */
static tf_status tf_fn_relay_backward(tf_node *n, const tf_tensor *gout, tf_tensor **gin) {
  tf_fn_node *f = n->next[0]->ext_data;
  int k = (int)n->param[0];
  tf_tensor_release(f->grads[k]);
  f->grads[k] = gout ? tf_tensor_retain((tf_tensor *)gout) : NULL;
  gin[0] = NULL;
  return TF_OK;
}

/* ---- recording ------------------------------------------------------------ */

/* Whether output tensor t must become an alias before it takes the node:
 * one of the inputs, an output seen already, or a tensor with history. */
static bool tf_fn_needs_alias(tf_tensor *t, tf_tensor *const *inputs, int ninputs, tf_tensor *const *outs, int k) {
  if (t->grad_fn || t->requires_grad) return true;
  for (int i = 0; i < ninputs; i++)
    if (inputs[i] == t) return true;
  for (int i = 0; i < k; i++)
    if (outs[i] == t) return true;
  return false;
}

static tf_fn_node *tf_fn_node_new(int nargs, int nout) {
  tf_fn_node *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->input_of = calloc((size_t)(nargs > 0 ? nargs : 1), sizeof *f->input_of);
  f->out = calloc((size_t)nout, sizeof *f->out);
  f->grads = calloc((size_t)nout, sizeof *f->grads);
  if (!f->input_of || !f->out || !f->grads) {
    free(f->input_of);
    free(f->out);
    free(f->grads);
    free(f);
    return NULL;
  }
  f->nargs = nargs;
  f->nout = nout;
  f->ctx_ref = LUA_NOREF;
  return f;
}

/* Gives the differentiable outputs their grad_fn: the node itself for one,
 * a relay each for several. The results table is at index 3. */
static tf_status tf_fn_attach(tf_node *node, tf_fn_node *f, tf_tensor **outs) {
  int ndiff = 0;
  for (int k = 0; k < f->nout; k++) ndiff += f->out[k].differentiable;
  f->single = -1;
  for (int k = 0; k < f->nout; k++) {
    if (!f->out[k].differentiable) continue;
    if (ndiff == 1) {
      f->single = k;
      node->refcount++;
      tf_node_finish(node, outs[k]);
      continue;
    }
    tf_node *relay;
    tf_status st = tf_node_relay(node->name, tf_fn_relay_backward, node, &relay);
    if (st != TF_OK) return st;
    relay->param[0] = k;
    tf_node_finish(relay, outs[k]);
  }
  return TF_OK;
}

/* tf._function.record(ctx, args, results): the node of one call, made when a
 * tensor argument needs a gradient (and grad mode is on); returns the results,
 * the differentiable outputs with their grad_fn. */
static int tf_l_fn_record(lua_State *L) {
  tf_fn_ctx *c = tf_fn_checkctx(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_getfield(L, 2, "n");
  int nargs = (int)lua_tointeger(L, -1);
  lua_getfield(L, 3, "n");
  int nout = (int)lua_tointeger(L, -1);
  lua_pop(L, 2);
  if (nout == 0) return tf_lua_error(L, "%s: forward returned nothing (it returns the function's outputs)", c->name);
  tf_tensor *inputs[TF_NODE_MAX_INPUTS];
  int ninputs = 0;
  for (int i = 1; i <= nargs; i++) {
    lua_geti(L, 2, i);
    tf_tensor *t = tf_lua_totensor(L, -1);
    lua_pop(L, 1);
    if (!t) continue;
    if (ninputs == TF_NODE_MAX_INPUTS)
      return tf_lua_error(L, "%s: at most %d tensor arguments (pass more as a table and differentiate through views)",
                          c->name, TF_NODE_MAX_INPUTS);
    inputs[ninputs++] = t;
  }
  luaL_checkstack(L, nout + 4, "too many outputs");
  lua_getiuservalue(L, 1, TF_FN_MARKED);
  int marked = lua_gettop(L);
  tf_tensor **outs = lua_newuserdatauv(L, sizeof *outs * (size_t)nout, 0);
  int ndiff = 0;
  for (int k = 0; k < nout; k++) {
    lua_geti(L, 3, k + 1);
    outs[k] = tf_lua_totensor(L, -1);
    lua_pop(L, 1);
    bool skip = !outs[k] || !tf_dtype_is_float(outs[k]->dtype);
    if (!skip && lua_istable(L, marked)) {
      skip = lua_rawgetp(L, marked, outs[k]) != LUA_TNIL;
      lua_pop(L, 1);
    }
    if (skip) outs[k] = NULL; /* no gradient for this one */
    ndiff += !skip;
  }
  tf_node *node = NULL;
  if (ndiff > 0) TF_LUA_CHECK(L, tf_node_begin(c->name, tf_fn_backward, inputs, ninputs, &node), c->name);
  c->recorded = true; /* ctx:save is over */
  if (!node) { /* nothing to differentiate: the saved tensors go now */
    tf_fn_ctx_free_saved(c);
    lua_settop(L, 3);
    for (int k = 1; k <= nout; k++) lua_geti(L, 3, k);
    return nout;
  }
  tf_fn_node *f = tf_fn_node_new(nargs, nout);
  if (!f) {
    tf_node_discard(node);
    return tf_lua_error(L, "out of memory: no host memory for the autograd node of %s", c->name);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  f->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  f->ctx = c;
  node->name = c->name; /* lives in the context, which the node keeps */
  for (int i = 0, j = 0; i < nargs; i++) {
    lua_geti(L, 2, i + 1);
    f->input_of[i] = tf_lua_totensor(L, -1) ? j++ : -1;
    lua_pop(L, 1);
  }
  for (int j = 0; j < ninputs; j++) f->in_device[j] = inputs[j]->device;
  lua_getiuservalue(L, 1, TF_FN_FUNCTION);
  lua_getfield(L, -1, "materialize_grads");
  f->materialize = lua_isnil(L, -1) || lua_toboolean(L, -1);
  lua_pop(L, 2);
  /* outputs that must not take the node directly become aliases, in the results too */
  for (int k = 0; k < nout; k++) {
    if (!outs[k]) continue;
    f->out[k] = (tf_fn_output){true, tf_tensor_shape(outs[k]), outs[k]->dtype, outs[k]->device};
    if (!tf_fn_needs_alias(outs[k], inputs, ninputs, outs, k)) continue;
    tf_tensor *alias;
    tf_status st = tf_detach(outs[k], &alias);
    if (st != TF_OK) {
      tf_fn_node_release(f);
      tf_node_discard(node);
      return tf_lua_raise(L, st, c->name);
    }
    tf_lua_pushtensor(L, alias);
    lua_seti(L, 3, k + 1);
    outs[k] = alias;
  }
  lua_newtable(L);
  lua_setiuservalue(L, 1, TF_FN_HANDLES);
  lua_pushvalue(L, 1);
  f->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  node->ext = &tf_fn_node_ext;
  node->ext_data = f;
  tf_status st = tf_fn_attach(node, f, outs);
  tf_node_release(node); /* tf_node_begin's reference: the outputs hold the node now */
  if (st != TF_OK) return tf_lua_raise(L, st, c->name);
  lua_settop(L, 3);
  for (int k = 1; k <= nout; k++) lua_geti(L, 3, k);
  return nout;
}

void tf_open_function(lua_State *L) {
  static const luaL_Reg meta[] = {{"__index", tf_l_fn_index},   {"__newindex", tf_l_fn_newindex},
                                  {"__close", tf_l_fn_close},   {"__gc", tf_l_fn_gc},
                                  {"__tostring", tf_l_fn_tostring}, {NULL, NULL}};
  tf_lua_newclass(L, TF_FN_CTX_TYPE, meta, NULL);
  luaL_getmetatable(L, TF_FN_CTX_TYPE);
  lua_newtable(L);
  luaL_setfuncs(L, tf_fn_ctx_methods, 0);
  lua_setfield(L, -2, "__methods");
  lua_pop(L, 1);
  static const luaL_Reg fns[] = {{"ctx", tf_l_fn_ctx}, {"record", tf_l_fn_record}, {NULL, NULL}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  lua_setfield(L, -2, "_function");
}
