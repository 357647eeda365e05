/* tf.Timer: elapsed time of device work (CUDA events on a GPU, the
 * monotonic clock on the CPU), plus tf.sync and tf.now. */

#include "bind.h"
#include "clock.h"
#include "backend.h"

#define TF_TIMER_TYPE "tf.Timer"

typedef struct tf_lua_timer {
  tf_device_ctx *ctx;
  tf_event *start, *end;
} tf_lua_timer;

static void tf_timer_clear(tf_lua_timer *t) {
  if (t->start) t->ctx->backend->event_destroy(t->ctx, t->start);
  if (t->end) t->ctx->backend->event_destroy(t->ctx, t->end);
  t->start = t->end = NULL;
}

static tf_lua_timer *tf_l_checktimer(lua_State *L) {
  tf_lua_timer *t = luaL_checkudata(L, 1, TF_TIMER_TYPE);
  if (!t->ctx) luaL_argerror(L, 1, "timer has been freed");
  return t;
}

/* t:start(): (re)starts the timer at the current point of the device's queue. */
static int tf_l_timer_start(lua_State *L) {
  tf_lua_timer *t = tf_l_checktimer(L);
  tf_timer_clear(t);
  TF_LUA_CHECK(L, t->ctx->backend->event_record(t->ctx, &t->start), "timer:start");
  lua_settop(L, 1);
  return 1;
}

/* tf.timer([device]): a started timer. */
static int tf_l_timer_new(lua_State *L) {
  tf_device dev = tf_lua_checkdevice(L, 1);
  tf_lua_timer *t = lua_newuserdatauv(L, sizeof *t, 0);
  *t = (tf_lua_timer){0};
  luaL_setmetatable(L, TF_TIMER_TYPE);
  TF_LUA_CHECK(L, tf_device_ctx_get(dev, &t->ctx), "tf.timer");
  lua_insert(L, 1);
  lua_settop(L, 1);
  return tf_l_timer_start(L);
}

static int tf_l_timer_stop(lua_State *L) {
  tf_lua_timer *t = tf_l_checktimer(L);
  if (t->end) t->ctx->backend->event_destroy(t->ctx, t->end), t->end = NULL;
  TF_LUA_CHECK(L, t->ctx->backend->event_record(t->ctx, &t->end), "timer:stop");
  lua_settop(L, 1);
  return 1;
}

/* t:ms(): milliseconds from start to stop (stopping now if not stopped);
 * waits for the device work in between to finish. */
static int tf_l_timer_ms(lua_State *L) {
  tf_lua_timer *t = tf_l_checktimer(L);
  if (!t->end) tf_l_timer_stop(L);
  double ms;
  TF_LUA_CHECK(L, t->ctx->backend->event_elapsed_ms(t->ctx, t->start, t->end, &ms), "timer:ms");
  lua_pushnumber(L, ms);
  return 1;
}

static int tf_l_timer_release(lua_State *L) {
  tf_lua_timer *t = luaL_checkudata(L, 1, TF_TIMER_TYPE);
  if (t->ctx) tf_timer_clear(t);
  t->ctx = NULL;
  return 0;
}

static int tf_l_timer_tostring(lua_State *L) {
  tf_lua_timer *t = luaL_checkudata(L, 1, TF_TIMER_TYPE);
  lua_pushstring(L, t->ctx ? (t->end ? "tf.Timer(stopped)" : "tf.Timer(running)") : "tf.Timer(freed)");
  return 1;
}

/* tf.sync([device]): waits for all queued work on the device, or on every
 * device in use when none is named. */
static int tf_l_sync(lua_State *L) {
  if (!lua_isnoneornil(L, 1)) {
    TF_LUA_CHECK(L, tf_device_sync(tf_lua_checkdevice(L, 1)), "tf.sync");
    return 0;
  }
  TF_LUA_CHECK(L, tf_devices_sync_all(), "tf.sync");
  return 0;
}

/* tf.now(): the process's clock (clock.h) in milliseconds. */
static int tf_l_now(lua_State *L) {
  lua_pushnumber(L, (double)tf_clock_ns() * 1e-6);
  return 1;
}

static const luaL_Reg tf_timer_methods[] = {
    {"start", tf_l_timer_start}, {"stop", tf_l_timer_stop}, {"ms", tf_l_timer_ms},
    {"free", tf_l_timer_release}, {NULL, NULL},
};

static const luaL_Reg tf_timer_meta[] = {
    {"__gc", tf_l_timer_release}, {"__close", tf_l_timer_release}, {"__tostring", tf_l_timer_tostring},
    {NULL, NULL},
};

static const luaL_Reg tf_timer_functions[] = {
    {"timer", tf_l_timer_new}, {"sync", tf_l_sync}, {"now", tf_l_now}, {NULL, NULL},
};

void tf_open_timer(lua_State *L) {
  tf_lua_newclass(L, TF_TIMER_TYPE, tf_timer_meta, tf_timer_methods);
  luaL_setfuncs(L, tf_timer_functions, 0);
}
