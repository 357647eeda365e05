/* tf._dist: the binding of host/dist (the Lua half, lua/tf/dist.lua, is
 * what scripts call as tf.dist). A started collective is a tf.DistWork
 * whose :wait() finishes it; :free(), <close> and __gc share one release
 * that waits first, so a tensor MPI still writes into is never released
 * under it. */
#include <stdio.h>

#include "bind.h"
#include "dist.h"

#define TF_DIST_WORK_TYPE "tf.DistWork"

typedef struct tf_lua_work {
  tf_dist_work *w;
} tf_lua_work;

static void tf_l_push_work(lua_State *L, tf_dist_work *w) {
  tf_lua_work *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->w = w;
  luaL_setmetatable(L, TF_DIST_WORK_TYPE);
}

static tf_lua_work *tf_l_checkwork(lua_State *L) {
  tf_lua_work *u = luaL_checkudata(L, 1, TF_DIST_WORK_TYPE);
  if (!u->w) luaL_argerror(L, 1, "this work has been waited for and freed");
  return u;
}

static tf_dist_op tf_l_checkop(lua_State *L, int idx, const char *fname) {
  tf_dist_op op;
  TF_LUA_CHECK(L, tf_dist_op_parse(luaL_optstring(L, idx, "sum"), &op), fname);
  return op;
}

static int tf_l_checkrank(lua_State *L, int idx, const char *what) {
  lua_Integer r = luaL_checkinteger(L, idx);
  if (r < 0 || r > 1 << 20) return luaL_error(L, "%s must be a rank (an integer >= 0), not %d", what, (int)r);
  return (int)r;
}

/* The collectives, one binding for all (the upvalue says which):
 * all_reduce(t, op, async), broadcast(t, root, async), all_gather(out, t,
 * async), reduce_scatter(out, t, op, async), send(t, peer, async),
 * recv(t, peer, async). */
enum { TF_L_ALL_REDUCE, TF_L_BROADCAST, TF_L_ALL_GATHER, TF_L_REDUCE_SCATTER, TF_L_SEND, TF_L_RECV, TF_L_COLLECTIVES };
static const char *const tf_l_collective_names[TF_L_COLLECTIVES] = {
    "all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv"};

static int tf_l_collective(lua_State *L) {
  const int which = (int)lua_tointeger(L, lua_upvalueindex(1));
  char fname[32];
  snprintf(fname, sizeof fname, "tf.dist.%s", tf_l_collective_names[which]);
  const bool pair = which == TF_L_ALL_GATHER || which == TF_L_REDUCE_SCATTER;
  tf_tensor *a = tf_lua_checktensor(L, 1), *b = pair ? tf_lua_checktensor(L, 2) : NULL;
  const bool async = lua_toboolean(L, which == TF_L_REDUCE_SCATTER ? 4 : 3);
  tf_dist_work *w = NULL, **wp = async ? &w : NULL;
  tf_status st = TF_OK;
  switch (which) {
    case TF_L_ALL_REDUCE: st = tf_dist_all_reduce(a, tf_l_checkop(L, 2, fname), wp); break;
    case TF_L_BROADCAST: st = tf_dist_broadcast(a, tf_l_checkrank(L, 2, "tf.dist.broadcast: root"), wp); break;
    case TF_L_ALL_GATHER: st = tf_dist_all_gather(a, b, wp); break;
    case TF_L_REDUCE_SCATTER: st = tf_dist_reduce_scatter(a, b, tf_l_checkop(L, 3, fname), wp); break;
    case TF_L_SEND: st = tf_dist_send(a, tf_l_checkrank(L, 2, "tf.dist.send: peer"), wp); break;
    default: st = tf_dist_recv(a, tf_l_checkrank(L, 2, "tf.dist.recv: peer"), wp); break;
  }
  if (st != TF_OK) return tf_lua_raise(L, st, fname);
  if (!async) return 0;
  tf_l_push_work(L, w);
  return 1;
}

static int tf_l_barrier(lua_State *L) {
  TF_LUA_CHECK(L, tf_dist_barrier(), "tf.dist.barrier");
  return 0;
}

/* tf._dist.init(): joins the world (an error names what is wrong with it). */
static int tf_l_init(lua_State *L) {
  TF_LUA_CHECK(L, tf_dist_init(), "tf.dist");
  return 0;
}

/* tf._dist.info(): this rank's place and what the build has. */
static int tf_l_info(lua_State *L) {
  bool joined = tf_dist_init() == TF_OK;
  const tf_dist_env *e = tf_dist_self();
  lua_createtable(L, 0, 10);
  TF_SET_INT(L, "rank", e->rank);
  TF_SET_INT(L, "world_size", e->world_size);
  TF_SET_INT(L, "local_rank", e->local_rank);
  TF_SET_INT(L, "local_world_size", e->local_world_size);
  TF_SET_STR(L, "launcher", e->launcher);
  TF_SET_BOOL(L, "joined", joined);
  TF_SET_BOOL(L, "mpi_compiled", tf_dist_mpi_compiled());
  if (tf_dist_mpi_version()) TF_SET_STR(L, "mpi", tf_dist_mpi_version());
  char why[256];
  bool nccl = tf_dist_nccl_available(why, sizeof why);
  TF_SET_BOOL(L, "nccl_available", nccl);
  if (nccl && tf_dist_nccl_version()) TF_SET_STR(L, "nccl", tf_dist_nccl_version());
  if (!nccl) TF_SET_STR(L, "nccl_missing", why);
  TF_SET_BOOL(L, "checks", tf_dist_checks());
  lua_pushnumber(L, tf_dist_timeout());
  lua_setfield(L, -2, "timeout");
  return 1;
}

static int tf_l_set_checks(lua_State *L) {
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  tf_dist_set_checks(lua_toboolean(L, 1));
  return 0;
}

static int tf_l_set_timeout(lua_State *L) {
  TF_LUA_CHECK(L, tf_dist_set_timeout(luaL_checknumber(L, 1)), "tf.dist.set_timeout");
  return 0;
}

static int tf_l_work_wait(lua_State *L) {
  tf_lua_work *u = tf_l_checkwork(L);
  TF_LUA_CHECK(L, tf_dist_wait(u->w), "work:wait");
  return 0;
}

static int tf_l_work_done(lua_State *L) {
  lua_pushboolean(L, tf_dist_done(tf_l_checkwork(L)->w));
  return 1;
}

static int tf_l_work_release(lua_State *L) {
  tf_lua_work *u = luaL_checkudata(L, 1, TF_DIST_WORK_TYPE);
  tf_dist_work_free(u->w);
  u->w = NULL;
  return 0;
}

static int tf_l_work_tostring(lua_State *L) {
  tf_lua_work *u = luaL_checkudata(L, 1, TF_DIST_WORK_TYPE);
  lua_pushstring(L, !u->w ? "tf.DistWork(freed)" : tf_dist_done(u->w) ? "tf.DistWork(done)" : "tf.DistWork(running)");
  return 1;
}

void tf_open_dist(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"wait", tf_l_work_wait}, {"is_completed", tf_l_work_done}, {"free", tf_l_work_release}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__gc", tf_l_work_release}, {"__close", tf_l_work_release}, {"__tostring", tf_l_work_tostring}, {NULL, NULL}};
  tf_lua_newclass(L, TF_DIST_WORK_TYPE, meta, methods);
  static const luaL_Reg fns[] = {{"init", tf_l_init},
                                  {"info", tf_l_info},
                                  {"barrier", tf_l_barrier},
                                  {"set_checks", tf_l_set_checks},
                                  {"set_timeout", tf_l_set_timeout},
                                  {NULL, NULL}};
  luaL_newlib(L, fns);
  for (int i = 0; i < TF_L_COLLECTIVES; i++) {
    lua_pushinteger(L, i);
    lua_pushcclosure(L, tf_l_collective, 1);
    lua_setfield(L, -2, tf_l_collective_names[i]);
  }
  lua_setfield(L, -2, "_dist");
}
