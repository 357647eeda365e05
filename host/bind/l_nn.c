/* Neural-network functions: tf.linear, softmax, log_softmax, layer_norm,
 * rms_norm, cross_entropy, rope, embedding, masked_fill, attention
 * (differentiable, autocast-aware: host/autograd/grad_ops.h, attention.h). */
#include <string.h>

#include "bind.h"
#include "attention.h"
#include "autograd.h"
#include "grad_ops.h"
#include "nnops.h"

/* Pushes *out after a call that set it (a pointer: the call must run first). */
static void tf_l_push_result(lua_State *L, tf_status st, tf_tensor *const *out, const char *fname) {
  TF_LUA_CHECK(L, st, fname);
  tf_lua_pushtensor(L, *out);
}

static tf_tensor *tf_l_opt_tensor(lua_State *L, int idx) { return lua_isnoneornil(L, idx) ? NULL : tf_lua_checktensor(L, idx); }

/* tf.linear(x, w [, b]): x @ w^T + b, w of shape (out, in). */
static int tf_l_linear(lua_State *L) {
  tf_tensor *x = tf_lua_checktensor(L, 1), *w = tf_lua_checktensor(L, 2), *b = tf_l_opt_tensor(L, 3), *out = NULL;
  tf_l_push_result(L, tf_ag_linear(x, w, b, &out), &out, "tf.linear");
  return 1;
}

/* softmax / log_softmax over dim (default the last): other dims go through a transpose. */
static int tf_l_softmax_dim(lua_State *L, bool log, const char *fname) {
  tf_tensor *x = tf_lua_checktensor(L, 1), *out = NULL, *t = NULL, *y = NULL;
  int last = x->ndim > 0 ? x->ndim - 1 : 0, dim = last;
  if (!lua_isnoneornil(L, 2)) TF_LUA_CHECK(L, tf_wrap_dim(tf_lua_checkdim(L, 2), x->ndim, &dim), fname);
  if (dim == last) {
    tf_l_push_result(L, tf_ag_softmax(x, log, &out), &out, fname);
    return 1;
  }
  tf_status st = tf_ag_transpose(x, dim, last, &t);
  if (st == TF_OK) st = tf_ag_softmax(t, log, &y);
  if (st == TF_OK) st = tf_ag_transpose(y, dim, last, &out);
  tf_tensor_release(t);
  tf_tensor_release(y);
  tf_l_push_result(L, st, &out, fname);
  return 1;
}

static int tf_l_softmax(lua_State *L) { return tf_l_softmax_dim(L, false, "tf.softmax"); }
static int tf_l_log_softmax(lua_State *L) { return tf_l_softmax_dim(L, true, "tf.log_softmax"); }

static double tf_l_eps(lua_State *L, int idx) {
  double eps = luaL_optnumber(L, idx, 1e-5);
  luaL_argcheck(L, eps > 0, idx, "eps must be > 0");
  return eps;
}

/* tf.layer_norm(x [, w [, b [, eps]]]) over the last dim. */
static int tf_l_layer_norm(lua_State *L) {
  tf_tensor *x = tf_lua_checktensor(L, 1), *w = tf_l_opt_tensor(L, 2), *b = tf_l_opt_tensor(L, 3), *out = NULL;
  tf_l_push_result(L, tf_ag_layer_norm(x, w, b, tf_l_eps(L, 4), &out), &out, "tf.layer_norm");
  return 1;
}

/* tf.rms_norm(x [, gain [, eps]]) over the last dim, statistics in f32. */
static int tf_l_rms_norm(lua_State *L) {
  tf_tensor *x = tf_lua_checktensor(L, 1), *g = tf_l_opt_tensor(L, 2), *out = NULL;
  tf_l_push_result(L, tf_ag_rms_norm(x, g, tf_l_eps(L, 3), &out), &out, "tf.rms_norm");
  return 1;
}

/* tf.cross_entropy(logits, targets): mean over rows. */
static int tf_l_cross_entropy(lua_State *L) {
  tf_tensor *logits = tf_lua_checktensor(L, 1), *targets = tf_lua_checktensor(L, 2), *out = NULL;
  tf_l_push_result(L, tf_ag_cross_entropy(logits, targets, &out), &out, "tf.cross_entropy");
  return 1;
}

/* tf.rope(x [, theta = 10000 [, positions]]) */
static int tf_l_rope(lua_State *L) {
  tf_tensor *x = tf_lua_checktensor(L, 1), *pos = tf_l_opt_tensor(L, 3), *out = NULL;
  double theta = luaL_optnumber(L, 2, 10000.0);
  luaL_argcheck(L, theta > 0, 2, "theta must be > 0");
  tf_l_push_result(L, tf_ag_rope(x, pos, theta, &out), &out, "tf.rope");
  return 1;
}

/* tf.embedding(weight, ids) */
static int tf_l_embedding(lua_State *L) {
  tf_tensor *w = tf_lua_checktensor(L, 1), *ids = tf_lua_checktensor(L, 2), *out = NULL;
  tf_l_push_result(L, tf_ag_embedding(w, ids, &out), &out, "tf.embedding");
  return 1;
}

/* tf.masked_fill(x, mask, value) */
static int tf_l_masked_fill(lua_State *L) {
  tf_tensor *x = tf_lua_checktensor(L, 1), *mask = tf_lua_checktensor(L, 2), *out = NULL;
  double value = luaL_checknumber(L, 3);
  tf_l_push_result(L, tf_ag_masked_fill(x, mask, value, &out), &out, "tf.masked_fill");
  return 1;
}

/* A boolean option of tf.attention's table (the value is on top of the stack). */
static bool tf_l_attention_bool(lua_State *L, const char *key) {
  if (!lua_isboolean(L, -1))
    tf_lua_error(L, "tf.attention: option '%s' must be a boolean, not %s", key, luaL_typename(L, -1));
  return lua_toboolean(L, -1);
}

/* tf.attention's options {causal, impl, scale, deterministic, return_lse}
 * at idx; unknown keys and wrong types are errors. */
static bool tf_l_attention_opts(lua_State *L, int idx, tf_attention_opts *o) {
  *o = (tf_attention_opts){.impl = TF_ATTENTION_FLASH};
  bool return_lse = false;
  if (lua_isnoneornil(L, idx)) return false;
  if (!lua_istable(L, idx))
    tf_lua_error(L, "tf.attention: argument #%d must be a table of options, not %s", idx, luaL_typename(L, idx));
  static const char *const keys[] = {"causal", "impl", "scale", "deterministic", "return_lse", NULL};
  tf_lua_checkkeys(L, idx, "tf.attention", keys);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "";
    if (strcmp(key, "causal") == 0) {
      o->causal = tf_l_attention_bool(L, key);
    } else if (strcmp(key, "deterministic") == 0) {
      o->deterministic = tf_l_attention_bool(L, key);
    } else if (strcmp(key, "return_lse") == 0) {
      return_lse = tf_l_attention_bool(L, key);
    } else if (strcmp(key, "scale") == 0) {
      if (lua_type(L, -1) != LUA_TNUMBER)
        tf_lua_error(L, "tf.attention: option 'scale' must be a number, not %s", luaL_typename(L, -1));
      o->has_scale = true;
      o->scale = lua_tonumber(L, -1);
    } else { /* "impl": the only key left */
      const char *impl = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
      if (impl && strcmp(impl, "flash") == 0)
        o->impl = TF_ATTENTION_FLASH;
      else if (impl && strcmp(impl, "naive") == 0)
        o->impl = TF_ATTENTION_NAIVE;
      else
        tf_lua_error(L, "tf.attention: option 'impl' must be \"naive\" or \"flash\", not %s",
                   luaL_tolstring(L, -1, NULL));
    }
    lua_pop(L, 1);
  }
  return return_lse;
}

/* tf.attention(q, k, v [, {causal, impl, scale, deterministic, return_lse}]):
 * softmax(scale q k^T, masked) v; with return_lse also the log-sum-exp of
 * each row of scaled, masked scores. */
static int tf_l_attention(lua_State *L) {
  tf_tensor *q = tf_lua_checktensor(L, 1), *k = tf_lua_checktensor(L, 2), *v = tf_lua_checktensor(L, 3);
  tf_tensor *out = NULL, *lse = NULL;
  tf_attention_opts opts;
  bool return_lse = tf_l_attention_opts(L, 4, &opts);
  tf_l_push_result(L, tf_ag_attention(q, k, v, &opts, &out, return_lse ? &lse : NULL), &out, "tf.attention");
  if (!return_lse) return 1;
  tf_lua_pushtensor(L, lse);
  return 2;
}

static double tf_l_field(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  int ok;
  double v = lua_tonumberx(L, -1, &ok);
  if (!ok) tf_lua_error(L, "tf._adamw_step: option '%s' must be a number", key);
  lua_pop(L, 1);
  return v;
}

/* tf._adamw_step(p, g, m, v, {lr, beta1, beta2, eps, weight_decay, step}):
 * one fused, in-place AdamW update (lua/tf/optim.lua's AdamW calls it). */
static int tf_l_adamw_step(lua_State *L) {
  tf_tensor *p = tf_lua_checktensor(L, 1), *g = tf_lua_checktensor(L, 2), *m = tf_lua_checktensor(L, 3),
            *v = tf_lua_checktensor(L, 4);
  static const char *const keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "step", NULL};
  luaL_checktype(L, 5, LUA_TTABLE);
  tf_lua_checkkeys(L, 5, "tf._adamw_step", keys);
  tf_adamw_args args = {tf_l_field(L, 5, "lr"), tf_l_field(L, 5, "beta1"), tf_l_field(L, 5, "beta2"),
                        tf_l_field(L, 5, "eps"), tf_l_field(L, 5, "weight_decay"), (int64_t)tf_l_field(L, 5, "step")};
  TF_LUA_CHECK(L, tf_adamw_step(p, g, m, v, &args), "tf.optim.AdamW");
  tf_tensor_bump_version(p);
  tf_tensor_bump_version(m);
  tf_tensor_bump_version(v);
  return 0;
}

/* A scale option of tf.scaled_matmul: a tensor as it is, or a number made
 * a one-value f32 tensor on like's device (left on the stack, so that the
 * collector frees it whatever happens next). */
static tf_tensor *tf_l_scale_opt(lua_State *L, int opts, const char *key, const tf_tensor *like) {
  lua_getfield(L, opts, key);
  if (lua_isnumber(L, -1)) {
    const double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    tf_tensor *t = NULL;
    const tf_shape scalar = {0, {0}};
    TF_LUA_CHECK(L, tf_full(&scalar, v, TF_F32, like->device, &t), "tf.scaled_matmul");
    tf_lua_pushtensor(L, t);
    return t;
  }
  tf_tensor *t = tf_lua_totensor(L, -1);
  if (!t)
    tf_lua_error(L, "tf.scaled_matmul: %s must be a number or an f32 tensor, not %s", key,
                 lua_isnil(L, -1) ? "nothing (it is needed)" : luaL_typename(L, -1));
  return t;
}

/* tf.scaled_matmul(a, b, {scale_a, scale_b [, out_dtype = "bf16"] [, amax]
 * [, fast_accum]}): the FP8 product (nnops.h); returns C, and its amax
 * (a 0-dim f32 tensor) when amax = true. */
static int tf_l_scaled_matmul(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *b = tf_lua_checktensor(L, 2), *out = NULL, *amax = NULL;
  static const char *const keys[] = {"scale_a", "scale_b", "out_dtype", "amax", "fast_accum", NULL};
  luaL_checktype(L, 3, LUA_TTABLE);
  tf_lua_checkkeys(L, 3, "tf.scaled_matmul", keys);
  tf_scaled_matmul_opts o = {.out_dtype = TF_BF16};
  o.scale_a = tf_l_scale_opt(L, 3, "scale_a", a);
  o.scale_b = tf_l_scale_opt(L, 3, "scale_b", a);
  lua_getfield(L, 3, "out_dtype");
  if (!lua_isnil(L, -1)) o.out_dtype = tf_lua_checkdtype(L, lua_gettop(L));
  bool flags[2];
  const char *const names[] = {"amax", "fast_accum"};
  for (int i = 0; i < 2; i++) {
    lua_getfield(L, 3, names[i]);
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
      return tf_lua_error(L, "tf.scaled_matmul: %s must be a boolean, not a %s", names[i], luaL_typename(L, -1));
    flags[i] = lua_toboolean(L, -1);
  }
  o.fast_accum = flags[1];
  TF_LUA_CHECK(L, tf_scaled_matmul(a, b, &o, &out, flags[0] ? &amax : NULL), "tf.scaled_matmul");
  tf_lua_pushtensor(L, out);
  if (!amax) return 1;
  tf_lua_pushtensor(L, amax);
  return 2;
}

static const luaL_Reg tf_nn_functions[] = {
    {"linear", tf_l_linear},         {"softmax", tf_l_softmax},     {"log_softmax", tf_l_log_softmax},
    {"layer_norm", tf_l_layer_norm}, {"rms_norm", tf_l_rms_norm},   {"cross_entropy", tf_l_cross_entropy},
    {"rope", tf_l_rope},             {"embedding", tf_l_embedding}, {"masked_fill", tf_l_masked_fill},
    {"attention", tf_l_attention},   {NULL, NULL},
};

/* Also methods: x:softmax(dim), x:log_softmax(dim), x:masked_fill(mask, v), ... */
void tf_open_nn(lua_State *L) {
  lua_pushcfunction(L, tf_l_adamw_step);
  lua_setfield(L, -2, "_adamw_step");
  lua_pushcfunction(L, tf_l_scaled_matmul);
  lua_setfield(L, -2, "scaled_matmul");
  luaL_setfuncs(L, tf_nn_functions, 0);
  lua_getfield(L, -1, "Tensor");
  luaL_setfuncs(L, tf_nn_functions, 0);
  lua_pop(L, 1);
}
