/* tf.mem: the caching allocator's statistics and controls. */
#include "bind.h"

static tf_device_ctx *tf_l_mem_ctx(lua_State *L, int idx, const char *fname) {
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_lua_checkdevice(L, idx), &ctx), fname);
  return ctx;
}

#define TF_SET_INT(L, field, value) (lua_pushinteger(L, (lua_Integer)(value)), lua_setfield(L, -2, field))

/* tf.mem.stats([device]) -> table of byte counts and event counts. */
static int tf_l_mem_stats(lua_State *L) {
  tf_device_ctx *ctx = tf_l_mem_ctx(L, 1, "tf.mem.stats");
  const tf_alloc_stats *s = &ctx->alloc.stats;
  lua_createtable(L, 0, 16);
  lua_pushstring(L, ctx->alloc.device_name);
  lua_setfield(L, -2, "device");
  TF_SET_INT(L, "allocated", s->allocated);
  TF_SET_INT(L, "requested", s->requested);
  TF_SET_INT(L, "reserved", s->reserved);
  TF_SET_INT(L, "peak_allocated", s->peak_allocated);
  TF_SET_INT(L, "peak_reserved", s->peak_reserved);
  TF_SET_INT(L, "active_blocks", s->active_blocks);
  TF_SET_INT(L, "num_allocs", s->num_allocs);
  TF_SET_INT(L, "num_frees", s->num_frees);
  TF_SET_INT(L, "num_segments", s->num_segments);
  TF_SET_INT(L, "num_segment_allocs", s->num_segment_allocs);
  TF_SET_INT(L, "num_segment_frees", s->num_segment_frees);
  TF_SET_INT(L, "num_ooms", s->num_ooms);
  TF_SET_INT(L, "limit", ctx->alloc.limit);
  return 1;
}

static int tf_l_mem_reset_peak(lua_State *L) {
  tf_alloc_reset_peak(&tf_l_mem_ctx(L, 1, "tf.mem.reset_peak")->alloc);
  return 0;
}

/* Collects garbage tensors first: their blocks can only be released once
 * the Lua GC has finalised them. */
static int tf_l_mem_empty_cache(lua_State *L) {
  tf_device_ctx *ctx = tf_l_mem_ctx(L, 1, "tf.mem.empty_cache");
  lua_gc(L, LUA_GCCOLLECT);
  tf_alloc_empty_cache(&ctx->alloc);
  return 0;
}

/* tf.mem.set_limit(bytes | nil [, device]): caps reserved memory. */
static int tf_l_mem_set_limit(lua_State *L) {
  lua_Integer limit = luaL_opt(L, luaL_checkinteger, 1, 0);
  if (limit < 0) return luaL_argerror(L, 1, "the limit must be >= 0 (or nil for none)");
  tf_device_ctx *ctx = tf_l_mem_ctx(L, 2, "tf.mem.set_limit");
  tf_alloc_set_limit(&ctx->alloc, (size_t)limit);
  return 0;
}

/* tf.mem.collect(): a full Lua GC, so unreachable tensors give back memory. */
static int tf_l_mem_collect(lua_State *L) {
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}

static const luaL_Reg tf_mem_functions[] = {
    {"stats", tf_l_mem_stats},       {"reset_peak", tf_l_mem_reset_peak}, {"empty_cache", tf_l_mem_empty_cache},
    {"set_limit", tf_l_mem_set_limit}, {"collect", tf_l_mem_collect},     {NULL, NULL},
};

static void tf_reclaim_lua(void *ud) { lua_gc((lua_State *)ud, LUA_GCCOLLECT); }

void tf_lua_install_reclaim(lua_State *L) { tf_alloc_set_reclaim_hook(tf_reclaim_lua, L); }

void tf_open_mem(lua_State *L) {
  luaL_newlib(L, tf_mem_functions);
  lua_setfield(L, -2, "mem");
}
