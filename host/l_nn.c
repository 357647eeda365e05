/* Neural-network functions: tf.linear, softmax, log_softmax, layer_norm,
 * rms_norm, cross_entropy, rope, embedding, masked_fill (differentiable,
 * autocast-aware: core/grad_ops.h). */
#include "bind.h"
#include "core/autograd.h"
#include "core/grad_ops.h"
#include "core/nnops.h"

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
  if (!lua_isnoneornil(L, 2)) TF_LUA_CHECK(L, tf_wrap_dim((int)luaL_checkinteger(L, 2), x->ndim, &dim), fname);
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

static double tf_l_field(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  int ok;
  double v = lua_tonumberx(L, -1, &ok);
  if (!ok) luaL_error(L, "tf._adamw_step: option '%s' must be a number", key);
  lua_pop(L, 1);
  return v;
}

/* tf._adamw_step(p, g, m, v, {lr, beta1, beta2, eps, weight_decay, step}):
 * one fused, in-place AdamW update (lua/tf/optim.lua's AdamW calls it). */
static int tf_l_adamw_step(lua_State *L) {
  tf_tensor *p = tf_lua_checktensor(L, 1), *g = tf_lua_checktensor(L, 2), *m = tf_lua_checktensor(L, 3),
            *v = tf_lua_checktensor(L, 4);
  luaL_checktype(L, 5, LUA_TTABLE);
  tf_adamw_args args = {tf_l_field(L, 5, "lr"), tf_l_field(L, 5, "beta1"), tf_l_field(L, 5, "beta2"),
                        tf_l_field(L, 5, "eps"), tf_l_field(L, 5, "weight_decay"), (int64_t)tf_l_field(L, 5, "step")};
  TF_LUA_CHECK(L, tf_adamw_step(p, g, m, v, &args), "tf.optim.AdamW");
  tf_tensor_bump_version(p);
  tf_tensor_bump_version(m);
  tf_tensor_bump_version(v);
  return 0;
}

static const luaL_Reg tf_nn_functions[] = {
    {"linear", tf_l_linear},         {"softmax", tf_l_softmax},     {"log_softmax", tf_l_log_softmax},
    {"layer_norm", tf_l_layer_norm}, {"rms_norm", tf_l_rms_norm},   {"cross_entropy", tf_l_cross_entropy},
    {"rope", tf_l_rope},             {"embedding", tf_l_embedding}, {"masked_fill", tf_l_masked_fill},
    {NULL, NULL},
};

/* Also methods: x:softmax(dim), x:log_softmax(dim), x:masked_fill(mask, v), ... */
void tf_open_nn(lua_State *L) {
  lua_pushcfunction(L, tf_l_adamw_step);
  lua_setfield(L, -2, "_adamw_step");
  luaL_setfuncs(L, tf_nn_functions, 0);
  lua_getfield(L, -1, "Tensor");
  luaL_setfuncs(L, tf_nn_functions, 0);
  lua_pop(L, 1);
}
