/* tf._model: the fused Transformer engine (host/model/model.h), low level. The
 * public tf.model (lua/tf/model.lua) is built on it.
 *
 *   local m = tf._model.create({vocab_size = 10000, context_length = 256, d_model = 768, num_layers = 12,
 *                               num_heads = 12, d_ff = 3072, rope_theta = 10000},
 *                              {device = "cuda", precision = "bf16", graphs = true})
 *   local loss = m:loss(ids, targets); m:backward(); m:adamw_step{lr = 1e-3, step = 1}; m:zero_grad()
 *   local logits = m:forward(ids)         -- inference: no activations kept
 *   m:set_graphs(false); print(m:info().graph_replays)   -- CUDA graph replay (host/model/model.h)
 *   for _, p in ipairs(m:parameters()) do print(p.name, p.tensor.shape) end
 *
 * Tensors handed out (logits, losses, parameter and gradient views) hold
 * their own references: they stay valid after the model re-plans or is
 * freed. Parameter views share the engine's storage. */
#include <string.h>

#include "bind.h"
#include "model.h"

#define TF_MODEL_TYPE "tf.Model"

typedef struct tf_lua_model {
  tf_model *m; /* NULL once released */
} tf_lua_model;

/* The live engine at idx; a Lua error once it was freed. */
static tf_model *tf_l_checkmodel(lua_State *L, int idx) {
  tf_lua_model *u = luaL_checkudata(L, idx, TF_MODEL_TYPE);
  if (!u->m) luaL_argerror(L, idx, "model has been freed");
  return u->m;
}

/* ---- configuration ------------------------------------------------------------------ */

static const char *const tf_l_config_keys[] = {"vocab_size", "context_length", "d_model", "num_layers",
                                               "num_heads",  "d_ff",           "rope_theta", NULL};

/* A config table at idx: every size an integer, rope_theta a number
 * (10000 when absent); unknown keys are refused (a typo must not pass). */
static tf_model_config tf_l_checkconfig(lua_State *L, int idx, const char *fname) {
  luaL_checktype(L, idx, LUA_TTABLE);
  tf_lua_checkkeys(L, idx, fname, tf_l_config_keys);
  int64_t v[6];
  for (int i = 0; i < 6; i++) {
    lua_getfield(L, idx, tf_l_config_keys[i]);
    int ok;
    v[i] = (int64_t)lua_tointegerx(L, -1, &ok);
    if (!ok) tf_lua_error(L, "%s: config field '%s' must be an integer, not %s", fname, tf_l_config_keys[i],
                        lua_isnil(L, -1) ? "missing" : luaL_tolstring(L, -1, NULL));
    lua_pop(L, 1);
  }
  lua_getfield(L, idx, "rope_theta");
  double theta = 10000.0;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER) tf_lua_error(L, "%s: config field 'rope_theta' must be a number", fname);
    theta = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return (tf_model_config){v[0], v[1], v[2], v[3], v[4], v[5], theta};
}

/* Pushes the config as a table with the keys create() takes. */
static void tf_l_pushconfig(lua_State *L, const tf_model_config *c) {
  const int64_t v[6] = {c->vocab_size, c->context_length, c->d_model, c->num_layers, c->num_heads, c->d_ff};
  lua_createtable(L, 0, 7);
  for (int i = 0; i < 6; i++) {
    lua_pushinteger(L, (lua_Integer)v[i]);
    lua_setfield(L, -2, tf_l_config_keys[i]);
  }
  lua_pushnumber(L, c->rope_theta);
  lua_setfield(L, -2, "rope_theta");
}

/* tf._model.parameter_count(config) -> the number of scalar parameters (no model is made). */
static int tf_l_model_parameter_count(lua_State *L) {
  tf_model_config cfg = tf_l_checkconfig(L, 1, "tf._model.parameter_count");
  TF_LUA_CHECK(L, tf_model_config_check(&cfg), "tf._model.parameter_count");
  lua_pushinteger(L, (lua_Integer)tf_model_config_parameters(&cfg));
  return 1;
}

/* tf._model.create(config [, {device = , precision = "f32" | "bf16" | "f16", attention = "flash" | "naive",
 *                              graphs = true | false}]) */
static int tf_l_model_create(lua_State *L) {
  const char *fname = "tf._model.create";
  tf_model_config cfg = tf_l_checkconfig(L, 1, fname);
  tf_device device = tf_default_device();
  tf_dtype precision = TF_F32;
  int flash = -1; /* the engine's default */
  bool graphs = true;
  if (!lua_isnoneornil(L, 2)) {
    static const char *const keys[] = {"device", "precision", "attention", "graphs", NULL};
    tf_lua_checkkeys(L, 2, fname, keys);
    lua_pushnil(L);
    while (lua_next(L, 2)) {
      const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
      if (strcmp(key, "device") == 0) {
        if (tf_device_parse(luaL_tolstring(L, -1, NULL), &device) != TF_OK) tf_lua_error(L, "%s: %s", fname, tf_last_error());
        lua_pop(L, 1);
      } else if (strcmp(key, "precision") == 0) {
        if (tf_dtype_parse(luaL_tolstring(L, -1, NULL), &precision) != TF_OK) tf_lua_error(L, "%s: %s", fname, tf_last_error());
        lua_pop(L, 1);
      } else if (strcmp(key, "attention") == 0) {
        const char *impl = lua_tostring(L, -1);
        if (!impl || (strcmp(impl, "flash") != 0 && strcmp(impl, "naive") != 0))
          tf_lua_error(L, "%s: attention must be \"flash\" or \"naive\"", fname);
        flash = strcmp(impl, "flash") == 0;
      } else { /* "graphs": the only key left */
        if (!lua_isboolean(L, -1)) tf_lua_error(L, "%s: graphs must be true or false", fname);
        graphs = lua_toboolean(L, -1);
      }
      lua_pop(L, 1);
    }
  }
  tf_lua_model *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->m = NULL;
  luaL_setmetatable(L, TF_MODEL_TYPE);
  TF_LUA_CHECK(L, tf_model_create(&cfg, device, precision, &u->m), fname);
  if (flash >= 0) TF_LUA_CHECK(L, tf_model_set_attention(u->m, flash), fname);
  tf_model_set_graphs(u->m, graphs);
  return 1;
}

/* ---- methods --------------------------------------------------------------------------- */

/* m:forward(ids [, training]) -> logits (batch, seq, vocab) */
static int tf_l_model_forward(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  tf_tensor *ids = tf_lua_checktensor(L, 2), *out = NULL;
  bool training = lua_toboolean(L, 3);
  TF_LUA_CHECK(L, tf_model_forward(m, ids, training, &out), "model:forward");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* m:loss(ids, targets) -> 0-dim f32 tensor, ready for backward() */
static int tf_l_model_loss(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  tf_tensor *ids = tf_lua_checktensor(L, 2), *targets = tf_lua_checktensor(L, 3), *out = NULL;
  TF_LUA_CHECK(L, tf_model_loss(m, ids, targets, &out), "model:loss");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* m:backward(): gradients of the last loss added into m:grads(). */
static int tf_l_model_backward(lua_State *L) {
  TF_LUA_CHECK(L, tf_model_backward(tf_l_checkmodel(L, 1)), "model:backward");
  return 0;
}

/* m:sync_weights(): the low-precision weight copy refreshed now (forward does it when needed). */
static int tf_l_model_sync_weights(lua_State *L) {
  TF_LUA_CHECK(L, tf_model_sync_weights(tf_l_checkmodel(L, 1)), "model:sync_weights");
  return 0;
}

/* m:set_fp8(grad_dtype [, history]): FP8 training's products on (a bf16 model), gradients in
 * grad_dtype, delayed scaling over history steps (0 or none: current scaling). */
static int tf_l_model_set_fp8(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  TF_LUA_CHECK(L, tf_model_set_fp8(m, tf_lua_checkdtype(L, 2)), "tf.model.new");
  TF_LUA_CHECK(L, tf_model_set_fp8_delayed(m, luaL_optinteger(L, 3, 0)), "tf.model.new");
  return 0;
}

/* m:fp8_history_state() -> history tensor (or nil), rolls, recorded: delayed scaling's state for checkpoints. */
static int tf_l_model_fp8_history_state(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  tf_tensor *h = NULL;
  int64_t rolls = 0, recorded = 0;
  TF_LUA_CHECK(L, tf_model_fp8_history_state(m, &h, &rolls, &recorded), "model:fp8_history_state");
  if (h) tf_lua_pushtensor(L, tf_tensor_retain(h));
  else lua_pushnil(L);
  lua_pushinteger(L, (lua_Integer)rolls);
  lua_pushinteger(L, (lua_Integer)recorded);
  return 3;
}

/* m:set_fp8_history_state(rolls, recorded): after the history tensor's values were copied back. */
static int tf_l_model_set_fp8_history_state(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  TF_LUA_CHECK(L, tf_model_set_fp8_history_state(m, luaL_checkinteger(L, 2), luaL_checkinteger(L, 3)),
               "model:set_fp8_history_state");
  return 0;
}

/* m:set_graphs(on): CUDA graph replay on (where supported) or off; m:info().graphs says which it is. */
static int tf_l_model_set_graphs(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  tf_model_set_graphs(m, lua_toboolean(L, 2));
  return 0;
}

/* m:zero_grad() */
static int tf_l_model_zero_grad(lua_State *L) {
  TF_LUA_CHECK(L, tf_model_zero_grad(tf_l_checkmodel(L, 1)), "model:zero_grad");
  return 0;
}

/* Option key of the table at idx, a number (def when absent). */
static double tf_l_model_opt(lua_State *L, const char *fname, int idx, const char *key, double def) {
  lua_getfield(L, idx, key);
  double v = def;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER) tf_lua_error(L, "%s: option '%s' must be a number", fname, key);
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* m:adamw_step{step = t [, lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01]} */
/* The options table at index 2 of an AdamW call named fname. */
static void tf_l_model_adamw_args(lua_State *L, const char *fname, tf_adamw_args *a) {
  static const char *const keys[] = {"step", "lr", "beta1", "beta2", "eps", "weight_decay", NULL};
  luaL_checktype(L, 2, LUA_TTABLE);
  tf_lua_checkkeys(L, 2, fname, keys);
  lua_getfield(L, 2, "step");
  int ok;
  lua_Integer step = lua_tointegerx(L, -1, &ok);
  if (!ok) tf_lua_error(L, "%s: option 'step' must be an integer (counting from 1)", fname);
  lua_pop(L, 1);
  *a = (tf_adamw_args){tf_l_model_opt(L, fname, 2, "lr", 1e-3), tf_l_model_opt(L, fname, 2, "beta1", 0.9),
                       tf_l_model_opt(L, fname, 2, "beta2", 0.999), tf_l_model_opt(L, fname, 2, "eps", 1e-8),
                       tf_l_model_opt(L, fname, 2, "weight_decay", 0.01), (int64_t)step};
}

static int tf_l_model_adamw_step(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  tf_adamw_args a;
  tf_l_model_adamw_args(L, "model:adamw_step", &a);
  TF_LUA_CHECK(L, tf_model_adamw_step(m, &a), "model:adamw_step");
  return 0;
}

/* m:backward_adamw{step = t, ...}: m:backward() and m:adamw_step{...} in one
 * call, the optimizer beside the backward pass (model.h). */
static int tf_l_model_backward_adamw(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  tf_adamw_args a;
  tf_l_model_adamw_args(L, "model:backward_adamw", &a);
  TF_LUA_CHECK(L, tf_model_backward_adamw(m, &a), "model:backward_adamw");
  return 0;
}

/* m:set_max_grad_norm(max_norm): global gradient-norm clipping before each AdamW step (0: off; math.huge: measure). */
static int tf_l_model_set_max_grad_norm(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  TF_LUA_CHECK(L, tf_model_set_max_grad_norm(m, luaL_checknumber(L, 2)), "model:set_max_grad_norm");
  return 0;
}

/* m:grad_norm() -> the last clipped step's norm before clipping (a new 0-dim f32 tensor; nothing waits), or nil. */
static int tf_l_model_grad_norm(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  tf_tensor *norm = NULL;
  TF_LUA_CHECK(L, tf_model_grad_norm(m, &norm), "model:grad_norm");
  if (!norm) {
    lua_pushnil(L);
    return 1;
  }
  tf_lua_pushtensor(L, norm);
  return 1;
}

/* A list of {name, view, name = name, tensor = view} for parameters or gradients. */
static int tf_l_model_views(lua_State *L, bool grads) {
  tf_model *m = tf_l_checkmodel(L, 1);
  int n = tf_model_num_tensors(m);
  if (grads && n > 0 && !tf_model_grad(m, 0)) tf_lua_raise(L, TF_ERR_OOM, "model:grads"); /* made on first use */
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 2, 2);
    lua_pushstring(L, tf_model_tensor_name(m, i));
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, 1);
    lua_setfield(L, -2, "name");
    tf_lua_pushtensor(L, tf_tensor_retain(grads ? tf_model_grad(m, i) : tf_model_param(m, i)));
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, 2);
    lua_setfield(L, -2, "tensor");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* m:parameters() -> {{name, view, name =, tensor =}, ...} in state-dict order */
static int tf_l_model_parameters(lua_State *L) { return tf_l_model_views(L, false); }
/* m:grads(): the same for the gradients */
static int tf_l_model_grads(lua_State *L) { return tf_l_model_views(L, true); }

/* m:moments() -> AdamW's state for checkpoints, made (zeros) before the
 * first step: {sharded = false, exp_avg = {name = view}, exp_avg_sq = {...}},
 * or under ZeRO-1 this rank's flat shard: {sharded = true, begin =, ["end"] =,
 * exp_avg = tensor, exp_avg_sq = tensor} (elements [begin, end) of the flat layout). */
static int tf_l_model_moments(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  bool zero1 = false;
  tf_model_data_parallel(m, &zero1);
  static const char *const field[] = {"exp_avg", "exp_avg_sq"};
  lua_createtable(L, 0, 4);
  lua_pushboolean(L, zero1);
  lua_setfield(L, -2, "sharded");
  for (int which = 0; which < 2; which++) {
    if (zero1) {
      tf_tensor *t;
      int64_t begin, end;
      TF_LUA_CHECK(L, tf_model_moment_shard(m, which, &t, &begin, &end), "model:moments");
      TF_SET_INT(L, "begin", begin);
      TF_SET_INT(L, "end", end);
      tf_lua_pushtensor(L, t);
    } else {
      int n = tf_model_num_tensors(m);
      lua_createtable(L, 0, n);
      for (int i = 0; i < n; i++) {
        tf_tensor *t;
        TF_LUA_CHECK(L, tf_model_moment(m, i, which, &t), "model:moments");
        tf_lua_pushtensor(L, t);
        lua_setfield(L, -2, tf_model_tensor_name(m, i));
      }
    }
    lua_setfield(L, -2, field[which]);
  }
  return 1;
}

/* m:config() -> a table create() accepts */
static int tf_l_model_config(lua_State *L) {
  tf_l_pushconfig(L, tf_model_get_config(tf_l_checkmodel(L, 1)));
  return 1;
}

/* m:set_overlap(on): AdamW beside the backward pass (on) or after each layer's part of it (off). */
static int tf_l_model_set_overlap(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  tf_model_set_overlap(m, lua_toboolean(L, 2));
  return 0;
}

/* m:set_recompute_residual(on): training plans keep x_l only and recompute x_l + attention. */
static int tf_l_model_set_recompute_residual(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  tf_model_set_recompute_residual(m, lua_toboolean(L, 2));
  return 0;
}

static const char *const tf_l_grad_syncs[] = {"none", "per_param", "flat", "overlap", "bucket", NULL};

/* m:set_data_parallel(sync [, bucket_mb [, zero1]]): sync is "none", "per_param", "flat", "overlap"
 * or "bucket" (tf_model_set_data_parallel). */
static int tf_l_model_set_data_parallel(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  int sync = luaL_checkoption(L, 2, NULL, tf_l_grad_syncs);
  double bucket_mb = luaL_optnumber(L, 3, 25.0);
  TF_LUA_CHECK(L, tf_model_set_data_parallel(m, (tf_model_grad_sync)sync, bucket_mb, lua_toboolean(L, 4)),
               "model:set_data_parallel");
  return 0;
}

/* m:info() -> {precision =, device =, parameters =, tensors =, attention =, graphs = (replay on),
 * graphs_supported =, graph_captures =, graph_replays =, graph_failures =, overlap =,
 * recompute_residual =, grad_sync =, zero1 =} */
static int tf_l_model_info(lua_State *L) {
  tf_model *m = tf_l_checkmodel(L, 1);
  char dev[16];
  tf_device_format(tf_model_device(m), dev, sizeof dev);
  lua_createtable(L, 0, 12);
  TF_SET_STR(L, "precision", tf_dtype_name(tf_model_precision(m)));
  TF_SET_STR(L, "device", dev);
  TF_SET_INT(L, "parameters", tf_model_config_parameters(tf_model_get_config(m)));
  TF_SET_INT(L, "tensors", tf_model_num_tensors(m));
  TF_SET_STR(L, "attention", tf_model_uses_flash(m) ? "flash" : "naive");
  tf_model_graph_stats g = tf_model_graphs(m);
  TF_SET_BOOL(L, "graphs", g.on);
  TF_SET_BOOL(L, "graphs_supported", g.supported);
  TF_SET_INT(L, "graph_captures", g.captures);
  TF_SET_INT(L, "graph_replays", g.replays);
  TF_SET_INT(L, "graph_failures", g.failures);
  TF_SET_BOOL(L, "overlap", tf_model_overlaps(m));
  TF_SET_BOOL(L, "recompute_residual", tf_model_recomputes_residual(m));
  bool zero1;
  TF_SET_STR(L, "grad_sync", tf_l_grad_syncs[tf_model_data_parallel(m, &zero1)]);
  TF_SET_BOOL(L, "zero1", zero1);
  tf_model_fp8_info f;
  TF_LUA_CHECK(L, tf_model_fp8_stats(m, &f), "model:info");
  if (f.on) { /* fp8 = {recipe, grad_dtype, nonfinite, weight amax and scales} */
    lua_createtable(L, 0, 6);
    TF_SET_STR(L, "recipe", f.history ? "delayed scaling" : "current scaling");
    TF_SET_INT(L, "history", f.history);
    TF_SET_INT(L, "overflows", f.overflows);
    TF_SET_STR(L, "grad_dtype", tf_dtype_name(f.grad));
    TF_SET_INT(L, "nonfinite", f.nonfinite);
    TF_SET_NUM(L, "weight_amax_max", f.weight_amax_max);
    TF_SET_NUM(L, "weight_scale_min", f.weight_scale_min);
    TF_SET_NUM(L, "weight_scale_max", f.weight_scale_max);
    lua_setfield(L, -2, "fp8");
  }
  return 1;
}

/* m:memory() -> bytes held: {params, grads, optimizer, low_precision, activations} */
static int tf_l_model_memory(lua_State *L) {
  tf_model_memory u = tf_model_memory_use(tf_l_checkmodel(L, 1));
  lua_createtable(L, 0, 5);
  const struct {
    const char *k;
    size_t v;
  } f[] = {{"params", u.params},
           {"grads", u.grads},
           {"optimizer", u.optimizer},
           {"low_precision", u.low_precision},
           {"activations", u.activations}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    lua_pushinteger(L, (lua_Integer)f[i].v);
    lua_setfield(L, -2, f[i].k);
  }
  return 1;
}

/* free(), __gc and __close: one release, harmless the second time. */
static int tf_l_model_release(lua_State *L) {
  tf_lua_model *u = luaL_checkudata(L, 1, TF_MODEL_TYPE);
  tf_model_free(u->m);
  u->m = NULL;
  return 0;
}

/* tf.Model(d_model=..., ..., bf16, cuda:0) */
static int tf_l_model_tostring(lua_State *L) {
  tf_lua_model *u = luaL_checkudata(L, 1, TF_MODEL_TYPE);
  if (!u->m) {
    lua_pushliteral(L, "tf.Model (freed)");
    return 1;
  }
  const tf_model_config *c = tf_model_get_config(u->m);
  char dev[16];
  tf_device_format(tf_model_device(u->m), dev, sizeof dev);
  lua_pushfstring(L, "tf.Model(d_model=%d, layers=%d, heads=%d, d_ff=%d, vocab=%d, context=%d, %s, %s)",
                  (int)c->d_model, (int)c->num_layers, (int)c->num_heads, (int)c->d_ff, (int)c->vocab_size,
                  (int)c->context_length, tf_dtype_name(tf_model_precision(u->m)), dev);
  return 1;
}

static const luaL_Reg tf_model_methods[] = {
    {"forward", tf_l_model_forward},       {"loss", tf_l_model_loss},
    {"backward", tf_l_model_backward},     {"zero_grad", tf_l_model_zero_grad},
    {"adamw_step", tf_l_model_adamw_step}, {"backward_adamw", tf_l_model_backward_adamw}, {"parameters", tf_l_model_parameters},
    {"grads", tf_l_model_grads},           {"config", tf_l_model_config},
    {"moments", tf_l_model_moments},
    {"info", tf_l_model_info},             {"memory", tf_l_model_memory},
    {"set_fp8", tf_l_model_set_fp8},
    {"fp8_history_state", tf_l_model_fp8_history_state},
    {"set_fp8_history_state", tf_l_model_set_fp8_history_state},
    {"sync_weights", tf_l_model_sync_weights}, {"set_graphs", tf_l_model_set_graphs},
    {"set_overlap", tf_l_model_set_overlap}, {"set_data_parallel", tf_l_model_set_data_parallel},
    {"set_recompute_residual", tf_l_model_set_recompute_residual},
    {"set_max_grad_norm", tf_l_model_set_max_grad_norm}, {"grad_norm", tf_l_model_grad_norm},
    {"free", tf_l_model_release},
    {NULL, NULL},
};

static const luaL_Reg tf_model_meta[] = {
    {"__gc", tf_l_model_release},
    {"__close", tf_l_model_release},
    {"__tostring", tf_l_model_tostring},
    {NULL, NULL},
};

static const luaL_Reg tf_model_functions[] = {
    {"create", tf_l_model_create},
    {"parameter_count", tf_l_model_parameter_count},
    {NULL, NULL},
};

/* Registers the tf.Model type and tf._model.{create, parameter_count}. */
void tf_open_model(lua_State *L) {
  tf_lua_newclass(L, TF_MODEL_TYPE, tf_model_meta, tf_model_methods);
  luaL_newlib(L, tf_model_functions);
  lua_setfield(L, -2, "_model");
}

/* The live engine at idx, for the bindings that add methods to tf.Model (l_generate.c). */
tf_model *tf_lua_checkmodel(lua_State *L, int idx) { return tf_l_checkmodel(L, idx); }
