/* Autograd and autocast from Lua: requires_grad, backward, grad, detach,
 * and the tf.no_grad / tf.enable_grad / tf.autocast scopes. */
#include <string.h>

#include "bind.h"
#include "autocast.h"
#include "autograd.h"

#define TF_SCOPE_TYPE "tf.Scope"

/* x:requires_grad(on) sets the flag and returns x; x:requires_grad() tells. */
static int tf_l_requires_grad(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  if (lua_isnone(L, 2)) {
    lua_pushboolean(L, tf_tensor_needs_grad(t));
    return 1;
  }
  TF_LUA_CHECK(L, tf_tensor_set_requires_grad(t, lua_toboolean(L, 2)), "requires_grad");
  lua_settop(L, 1);
  return 1;
}

/* The Lua function of backward's on_grad option, called with each leaf
 * whose gradient was just added to (a new handle on it); its error stops
 * the pass with the message. */
typedef struct tf_l_grad_hook {
  lua_State *L;
  int fn; /* the function's stack index */
} tf_l_grad_hook;

static tf_status tf_l_on_grad(void *ctx, tf_tensor *leaf) {
  const tf_l_grad_hook *h = ctx;
  lua_State *L = h->L;
  lua_pushvalue(L, h->fn);
  tf_lua_pushtensor(L, tf_tensor_retain(leaf));
  if (lua_pcall(L, 1, 0, 0) == LUA_OK) return TF_OK;
  tf_status st = tf_fail(TF_ERR_ARG, "on_grad: %s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(an error object)");
  lua_pop(L, 1);
  return st;
}

/* loss:backward([gradient] [, {retain_graph = bool, on_grad = function(leaf)}]) */
static int tf_l_backward(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  int opts = 2;
  const tf_tensor *grad = NULL;
  if (tf_lua_totensor(L, 2) || luaL_testudata(L, 2, TF_TENSOR_TYPE)) {
    grad = tf_lua_checktensor(L, 2);
    opts = 3;
  }
  bool retain = false;
  tf_l_grad_hook h = {L, 0};
  if (lua_istable(L, opts)) {
    static const char *const keys[] = {"retain_graph", "on_grad", NULL};
    tf_lua_checkkeys(L, opts, "backward", keys);
    lua_getfield(L, opts, "retain_graph");
    retain = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, opts, "on_grad"); /* stays on the stack for the pass */
    if (!lua_isnil(L, -1)) {
      if (!lua_isfunction(L, -1)) return luaL_error(L, "backward: on_grad must be a function of the leaf tensor");
      h.fn = lua_gettop(L);
    }
  } else if (!lua_isnoneornil(L, opts)) {
    return luaL_argerror(L, opts, "expected a gradient tensor or an options table");
  }
  const tf_grad_hook hook = {tf_l_on_grad, &h};
  lua_State *outer = tf_lua_set_backward_state(L); /* functions written in Lua run their backward on L */
  tf_status st = tf_backward_hooked(t, grad, retain, h.fn ? &hook : NULL);
  tf_lua_set_backward_state(outer);
  TF_LUA_CHECK(L, st, "backward");
  return 0;
}

/* x:zero_grad(): drops the accumulated gradient (x.grad becomes nil). */
static int tf_l_zero_grad(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  tf_tensor_release(t->grad);
  t->grad = NULL;
  return 0;
}

/* x:detach(): the same values, without history. */
static int tf_l_detach(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1), *out;
  TF_LUA_CHECK(L, tf_detach(t, &out), "detach");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* ---- scopes ------------------------------------------------------------- */

typedef enum { TF_SCOPE_GRAD, TF_SCOPE_AUTOCAST } tf_scope_kind;

typedef struct tf_scope {
  tf_scope_kind kind;
  int saved; /* grad mode before, or the autocast depth */
  bool open;
} tf_scope;

/* Ends the scope: __close and :exit(); harmless twice. A scope that is
 * never closed stays in effect (there is no __gc: a collection at some
 * random later point must not flip grad mode or autocast). */
static int tf_l_scope_exit(lua_State *L) {
  tf_scope *s = luaL_checkudata(L, 1, TF_SCOPE_TYPE);
  if (!s->open) return 0;
  s->open = false;
  if (s->kind == TF_SCOPE_GRAD)
    tf_set_grad_enabled(s->saved != 0);
  else
    tf_autocast_exit(s->saved);
  return 0;
}

static tf_scope *tf_l_push_scope(lua_State *L, tf_scope_kind kind, int saved) {
  tf_scope *s = lua_newuserdatauv(L, sizeof *s, 0);
  *s = (tf_scope){kind, saved, true};
  luaL_setmetatable(L, TF_SCOPE_TYPE);
  return s;
}

/* tf._grad_scope(on): a scope with grad mode set to on. */
static int tf_l_grad_scope(lua_State *L) {
  bool on = lua_toboolean(L, 1);
  tf_scope *s = tf_l_push_scope(L, TF_SCOPE_GRAD, 0);
  s->saved = tf_set_grad_enabled(on);
  return 1;
}

/* tf._autocast_scope(dtype | nil): a region with that autocast dtype (nil disables). */
static int tf_l_autocast_scope(lua_State *L) {
  int dtype = -1;
  if (!lua_isnoneornil(L, 1)) {
    /* tf.autocast calls this from Lua: tf_lua_error points past it, at the user's line */
    tf_dtype d;
    const char *name = lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : NULL;
    if (!name || tf_dtype_parse(name, &d) != TF_OK || (d != TF_F16 && d != TF_BF16))
      return tf_lua_error(L, "tf.autocast: the dtype must be \"bf16\" or \"f16\" (nil: autocast off), not %s",
                          name ? name : luaL_typename(L, 1));
    dtype = (int)d;
  }
  int depth;
  TF_LUA_CHECK(L, tf_autocast_enter(dtype, &depth), "tf.autocast");
  tf_l_push_scope(L, TF_SCOPE_AUTOCAST, depth);
  return 1;
}

static int tf_l_is_grad_enabled(lua_State *L) {
  lua_pushboolean(L, tf_grad_enabled());
  return 1;
}

/* tf.autocast_dtype(): "bf16", "f16" or nil. */
static int tf_l_autocast_dtype(lua_State *L) {
  int d = tf_autocast_dtype();
  if (d < 0)
    lua_pushnil(L);
  else
    lua_pushstring(L, tf_dtype_name((tf_dtype)d));
  return 1;
}

static int tf_l_scope_tostring(lua_State *L) {
  tf_scope *s = luaL_checkudata(L, 1, TF_SCOPE_TYPE);
  lua_pushfstring(L, "tf.Scope(%s, %s)", s->kind == TF_SCOPE_GRAD ? "grad" : "autocast", s->open ? "open" : "closed");
  return 1;
}

static const luaL_Reg tf_autograd_methods[] = {
    {"requires_grad", tf_l_requires_grad},
    {"backward", tf_l_backward},
    {"zero_grad", tf_l_zero_grad},
    {"detach", tf_l_detach},
    {NULL, NULL},
};

static const luaL_Reg tf_autograd_functions[] = {
    {"_grad_scope", tf_l_grad_scope},
    {"_autocast_scope", tf_l_autocast_scope},
    {"is_grad_enabled", tf_l_is_grad_enabled},
    {"autocast_dtype", tf_l_autocast_dtype},
    {NULL, NULL},
};

void tf_open_autograd(lua_State *L) {
  luaL_setfuncs(L, tf_autograd_functions, 0);
  lua_getfield(L, -1, "Tensor");
  luaL_setfuncs(L, tf_autograd_methods, 0);
  lua_pop(L, 1);
  static const luaL_Reg scope_meta[] = {{"__close", tf_l_scope_exit}, {"__tostring", tf_l_scope_tostring}, {NULL, NULL}};
  static const luaL_Reg scope_methods[] = {{"exit", tf_l_scope_exit}, {NULL, NULL}};
  tf_lua_newclass(L, TF_SCOPE_TYPE, scope_meta, scope_methods);
}
