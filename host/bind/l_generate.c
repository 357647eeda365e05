/* tf.Model's generation methods (host/model/model_decode.c, model_sample.c),
 * added to the type tf_open_model made; the public m:generate is in
 * lua/tf/model.lua, which checks the options before they come here.
 *
 *   local logits = m:prefill(ids, max_len)      -- (batch, V) of each row's last position
 *   logits = m:decode_step({id_row1, id_row2})  -- the next position
 *   local ids, stats = m:generate_ids(prompt, {max_new_tokens = 32, temperature = 0.8, top_k = 50,
 *                                              top_p = 0.95, seed = 1, stop = {10}})
 *   local id, state = tf._model.sample(row_logits, opts, state)   -- one row, as generate draws it */
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "model.h"

/* m:prefill(ids, max_len) -> logits */
static int tf_l_model_prefill(lua_State *L) {
  tf_model *m = tf_lua_checkmodel(L, 1);
  tf_tensor *ids = tf_lua_checktensor(L, 2), *out = NULL;
  lua_Integer max_len = luaL_checkinteger(L, 3);
  TF_LUA_CHECK(L, tf_model_prefill(m, ids, (int64_t)max_len, &out), "model:prefill");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* m:decode_step({ids}) -> logits: one id a row of the prefilled batch */
static int tf_l_model_decode_step(lua_State *L) {
  tf_model *m = tf_lua_checkmodel(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  const int64_t B = tf_model_decode_batch(m);
  if (B == 0) return luaL_error(L, "model:decode_step: no prompt was prefilled");
  if ((int64_t)luaL_len(L, 2) != B)
    return luaL_error(L, "model:decode_step: %d ids given for a batch of %d", (int)luaL_len(L, 2), (int)B);
  int64_t *ids = lua_newuserdatauv(L, (size_t)B * sizeof *ids, 0);
  for (int64_t b = 0; b < B; b++) {
    lua_geti(L, 2, b + 1);
    if (!lua_isinteger(L, -1)) return luaL_error(L, "model:decode_step: id %d is not an integer", (int)(b + 1));
    ids[b] = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  tf_tensor *out = NULL;
  TF_LUA_CHECK(L, tf_model_decode_step(m, ids, &out), "model:decode_step");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* The options table at idx (checked by model.lua) into o; the stop ids in
 * a userdata left on the stack. */
static void tf_l_generate_opts(lua_State *L, int idx, tf_generate_opts *o) {
  *o = (tf_generate_opts){.max_new_tokens = 1, .temperature = 0, .top_p = 1, .top_k = 0, .seed = 0};
  luaL_checktype(L, idx, LUA_TTABLE);
  if (lua_getfield(L, idx, "max_new_tokens") != LUA_TNIL) o->max_new_tokens = (int64_t)luaL_checkinteger(L, -1);
  if (lua_getfield(L, idx, "temperature") != LUA_TNIL) o->temperature = luaL_checknumber(L, -1);
  if (lua_getfield(L, idx, "top_p") != LUA_TNIL) o->top_p = luaL_checknumber(L, -1);
  if (lua_getfield(L, idx, "top_k") != LUA_TNIL) o->top_k = (int64_t)luaL_checkinteger(L, -1);
  if (lua_getfield(L, idx, "seed") != LUA_TNIL) o->seed = (uint64_t)luaL_checkinteger(L, -1);
  lua_pop(L, 5);
  lua_getfield(L, idx, "stop");
  const int n = lua_istable(L, -1) ? (int)luaL_len(L, -1) : 0;
  int64_t *stop = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *stop, 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, -2, i + 1);
    stop[i] = (int64_t)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
  }
  lua_remove(L, -2);
  o->stop = stop;
  o->nstop = n;
}

/* m:generate_ids(prompt, opts) -> ids (batch, n) i64 on the CPU, stats */
static int tf_l_model_generate_ids(lua_State *L) {
  tf_model *m = tf_lua_checkmodel(L, 1);
  tf_tensor *prompt = tf_lua_checktensor(L, 2);
  tf_generate_opts o;
  tf_l_generate_opts(L, 3, &o);
  TF_LUA_CHECK(L, tf_model_generate_check(m, prompt, &o), "model:generate");
  const int64_t B = prompt->shape[0], n = o.max_new_tokens;
  int64_t *ids = lua_newuserdatauv(L, (size_t)(B * n) * sizeof *ids, 0), made = 0;
  tf_generate_stats stats;
  TF_LUA_CHECK(L, tf_model_generate(m, prompt, &o, ids, &made, &stats), "model:generate");
  /* the columns made, row by row */
  for (int64_t b = 0; b < B; b++) memmove(ids + b * made, ids + b * n, (size_t)made * sizeof *ids);
  tf_shape s = {2, {B, made}};
  tf_tensor *out = NULL;
  TF_LUA_CHECK(L, tf_tensor_empty(&s, TF_I64, tf_cpu(), &out), "model:generate");
  tf_status st = tf_tensor_write(out, ids, (size_t)(B * made) * sizeof *ids);
  if (st != TF_OK) tf_tensor_release(out);
  TF_LUA_CHECK(L, st, "model:generate");
  tf_lua_pushtensor(L, out);
  lua_createtable(L, 0, 6);
  lua_pushnumber(L, stats.prefill_ms);
  lua_setfield(L, -2, "prefill_ms");
  lua_pushnumber(L, stats.decode_ms);
  lua_setfield(L, -2, "decode_ms");
  lua_pushinteger(L, (lua_Integer)stats.decode_steps);
  lua_setfield(L, -2, "decode_steps");
  lua_pushinteger(L, (lua_Integer)made);
  lua_setfield(L, -2, "new_tokens");
  lua_pushnumber(L, stats.decode_ms > 0 ? (double)(stats.decode_steps * B) / (stats.decode_ms * 1e-3) : 0);
  lua_setfield(L, -2, "decode_tokens_per_s");
  lua_pushinteger(L, (lua_Integer)tf_model_decode_bytes(m));
  lua_setfield(L, -2, "cache_bytes");
  return 2;
}

/* tf._model.sample(logits, opts [, state]) -> id, state: one row of f32
 * logits (V,) on the CPU drawn by generate's rules; state is the
 * generator's (opts.seed when nil). */
static int tf_l_model_sample(lua_State *L) {
  tf_tensor *row = tf_lua_checktensor(L, 1);
  const bool given = !lua_isnoneornil(L, 3);
  const uint64_t state = given ? (uint64_t)luaL_checkinteger(L, 3) : 0;
  tf_generate_opts o;
  tf_l_generate_opts(L, 2, &o);
  uint64_t rng = given ? state : o.seed;
  if (row->dtype != TF_F32 || row->device.type != TF_DEV_CPU || row->ndim != 1)
    return luaL_error(L, "tf._model.sample: logits must be one f32 row on the CPU");
  const int64_t V = row->shape[0];
  float *logits = lua_newuserdatauv(L, (size_t)V * sizeof *logits, 0);
  TF_LUA_CHECK(L, tf_tensor_read(row, logits, (size_t)V * sizeof *logits), "tf._model.sample");
  tf_sample_entry_buf buf = {0};
  if (o.temperature > 0) TF_LUA_CHECK(L, tf_sample_buf_make(V, &buf), "tf._model.sample");
  int64_t id = tf_model_sample_row(logits, V, &o, &rng, &buf);
  tf_sample_buf_free(&buf);
  lua_pushinteger(L, (lua_Integer)id);
  lua_pushinteger(L, (lua_Integer)rng);
  return 2;
}

static const luaL_Reg tf_generate_methods[] = {
    {"prefill", tf_l_model_prefill},
    {"decode_step", tf_l_model_decode_step},
    {"generate_ids", tf_l_model_generate_ids},
    {NULL, NULL},
};

void tf_open_generate(lua_State *L) {
  luaL_getmetatable(L, "tf.Model");
  lua_getfield(L, -1, "__index");
  luaL_setfuncs(L, tf_generate_methods, 0);
  lua_pop(L, 2);
  lua_getfield(L, -1, "_model");
  lua_pushcfunction(L, tf_l_model_sample);
  lua_setfield(L, -2, "sample");
  lua_pop(L, 1);
}
