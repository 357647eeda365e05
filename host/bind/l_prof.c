/* tf.range and the profiler's C side (host/observe/prof.h), as tf._prof: ranges as
 * to-be-closed values, collector sessions (tf.Profile) and their raw
 * records. lua/tf/prof.lua builds tf.prof on it: the tables, the kernel
 * classes and the trace file. */
#include <string.h>

#include "bind.h"
#include "prof.h"
#include "cpu_prof.h"

#define TF_RANGE_TYPE "tf.Range"
#define TF_PROFILE_TYPE "tf.Profile"

/* ---- ranges ------------------------------------------------------------------------------ */

typedef struct tf_lua_range {
  uint64_t id;
  const char *name; /* interned */
  bool closed;
} tf_lua_range;

/* tf._prof.range(name) -> an open tf.Range; closing it (close(), <close>)
 * closes the range. */
static int tf_l_range_open(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  tf_lua_range *r = lua_newuserdatauv(L, sizeof *r, 0);
  *r = (tf_lua_range){0, NULL, true};
  luaL_setmetatable(L, TF_RANGE_TYPE);
  TF_LUA_CHECK(L, tf_range_push(name), "tf.range");
  r->id = tf_range_current();
  r->name = tf_intern(name);
  r->closed = false;
  return 1;
}

/* r:close() and __close: closes the range; again, nothing. A range closed
 * while ranges opened inside it are still open closes them too and is an
 * error, unless an error is already on its way (__close's second argument):
 * that one matters more. */
static int tf_l_range_close(lua_State *L) {
  tf_lua_range *r = luaL_checkudata(L, 1, TF_RANGE_TYPE);
  if (r->closed) return 0;
  r->closed = true;
  tf_status st = tf_range_close(r->id);
  if (st != TF_OK && lua_isnoneornil(L, 2)) tf_lua_raise(L, st, "tf.range");
  return 0;
}

static int tf_l_range_index(lua_State *L) {
  tf_lua_range *r = luaL_checkudata(L, 1, TF_RANGE_TYPE);
  const char *key = luaL_checkstring(L, 2);
  if (strcmp(key, "close") == 0)
    lua_pushcfunction(L, tf_l_range_close);
  else if (strcmp(key, "id") == 0)
    lua_pushinteger(L, (lua_Integer)r->id);
  else if (strcmp(key, "name") == 0)
    lua_pushstring(L, r->name);
  else if (strcmp(key, "open") == 0)
    lua_pushboolean(L, !r->closed);
  else
    lua_pushnil(L);
  return 1;
}

static int tf_l_range_tostring(lua_State *L) {
  tf_lua_range *r = luaL_checkudata(L, 1, TF_RANGE_TYPE);
  lua_pushfstring(L, "tf.Range(%s, %s)", r->name ? r->name : "?", r->closed ? "closed" : "open");
  return 1;
}

/* tf._prof.range_stack() -> names of the open ranges, outermost first. */
static int tf_l_range_stack(lua_State *L) {
  const char *names[TF_RANGE_MAX_DEPTH];
  int n = tf_range_stack(names, TF_RANGE_MAX_DEPTH);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* ---- sessions ----------------------------------------------------------------------------- */

typedef struct tf_lua_profile {
  tf_prof_session *s; /* NULL once collected */
} tf_lua_profile;

static tf_prof_session *tf_l_checkprofile(lua_State *L) {
  tf_lua_profile *p = luaL_checkudata(L, 1, TF_PROFILE_TYPE);
  if (!p->s) luaL_argerror(L, 1, "profile has been released");
  return p->s;
}

static bool tf_l_optbool(lua_State *L, int idx, const char *key, bool dflt) {
  bool v = dflt;
  if (lua_getfield(L, idx, key) != LUA_TNIL) {
    if (!lua_isboolean(L, -1)) tf_lua_error(L, "tf.prof.start: option '%s' must be a boolean", key);
    v = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* opts.metrics (a list of CUPTI metric names, lua/tf/prof.lua having
 * expanded the sets) into opts, the names pointing into the Lua strings of
 * the table at idx (alive for the call); opts.max_kernels. */
static void tf_l_prof_metrics(lua_State *L, int idx, tf_prof_options *opts) {
  if (lua_getfield(L, idx, "max_kernels") != LUA_TNIL) {
    int ok = 0;
    lua_Integer n = lua_tointegerx(L, -1, &ok);
    if (!ok || n < 1 || n > (1 << 24))
      tf_lua_error(L, "tf.prof.start: max_kernels must be an integer from 1 to %d", 1 << 24);
    opts->max_kernels = (size_t)n;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "metrics") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1)) tf_lua_error(L, "tf.prof.start: metrics must be a list of metric names");
  int list = lua_gettop(L);
  size_t n = (size_t)lua_rawlen(L, list);
  const char **names = lua_newuserdatauv(L, (n ? n : 1) * sizeof *names, 0); /* freed by the GC, also on error */
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, list, (lua_Integer)i + 1);
    if (lua_type(L, -1) != LUA_TSTRING) tf_lua_error(L, "tf.prof.start: metric %d is not a name (a string)", (int)i + 1);
    names[i] = lua_tostring(L, -1);
    lua_pop(L, 1); /* the string stays in the table */
  }
  opts->metrics = names;
  opts->num_metrics = n;
  /* the list and the array stay on the stack until the call returns */
}

/* tf._prof.start([opts]) -> a running tf.Profile. opts: kernels, memcpy,
 * host_ops (booleans, true by default); metrics (a list of CUPTI metric
 * names: hardware counters of each kernel), max_kernels and by_pass (the
 * counters by passes of the work, p:next_pass(); false: by replaying each
 * kernel). driver, an
 * option of earlier versions (driver API records, which attributed
 * driver-launched work to ranges), is accepted and does nothing: every
 * launch is attributed now. */
static int tf_l_prof_start(lua_State *L) {
  static const char *const keys[] = {"kernels", "memcpy", "host_ops", "driver", "metrics", "max_kernels", "by_pass",
                                     NULL};
  tf_prof_options opts = {true, true, true, NULL, 0, 0, false};
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
      lua_pop(L, 1);
      bool known = false;
      if (lua_type(L, -1) == LUA_TSTRING)
        for (int i = 0; keys[i]; i++) known = known || strcmp(lua_tostring(L, -1), keys[i]) == 0;
      if (!known)
        return tf_lua_error(L, "tf.prof.start: unknown option '%s' (have kernels, memcpy, host_ops, metrics, "
                            "max_kernels, by_pass, driver)",
                          luaL_tolstring(L, -1, NULL));
    }
    opts.kernels = tf_l_optbool(L, 1, "kernels", true);
    opts.memcpy = tf_l_optbool(L, 1, "memcpy", true);
    opts.host_ops = tf_l_optbool(L, 1, "host_ops", true);
    (void)tf_l_optbool(L, 1, "driver", false); /* checked for a boolean, no effect */
    opts.by_pass = tf_l_optbool(L, 1, "by_pass", false);
    tf_l_prof_metrics(L, 1, &opts);
  }
  tf_lua_profile *p = lua_newuserdatauv(L, sizeof *p, 0);
  p->s = NULL;
  luaL_setmetatable(L, TF_PROFILE_TYPE);
  TF_LUA_CHECK(L, tf_prof_start(&opts, &p->s), "tf.prof.start");
  return 1;
}

/* p:stop() -> p: waits for the devices and stops; stopping again does nothing. */
static int tf_l_prof_stop(lua_State *L) {
  TF_LUA_CHECK(L, tf_prof_stop(tf_l_checkprofile(L)), "profile:stop");
  lua_settop(L, 1);
  return 1;
}

/* p:next_pass() -> more: ends a counting pass of a profile counted by
 * passes; true while the metrics need the work run again. */
static int tf_l_prof_next_pass(lua_State *L) {
  bool more = false;
  TF_LUA_CHECK(L, tf_prof_next_pass(tf_l_checkprofile(L), &more), "profile:next_pass");
  lua_pushboolean(L, more);
  return 1;
}

/* __close: stops (an error while stopping is raised unless one is already
 * on its way). */
static int tf_l_prof_close(lua_State *L) {
  tf_lua_profile *p = luaL_checkudata(L, 1, TF_PROFILE_TYPE);
  if (!p->s) return 0;
  tf_status st = tf_prof_stop(p->s);
  if (st != TF_OK && lua_isnoneornil(L, 2)) tf_lua_raise(L, st, "profile:close");
  return 0;
}

static int tf_l_prof_gc(lua_State *L) {
  tf_lua_profile *p = luaL_checkudata(L, 1, TF_PROFILE_TYPE);
  tf_prof_session_free(p->s);
  p->s = NULL;
  return 0;
}

static const char *tf_l_device_name(tf_device d, char *buf, size_t n) {
  tf_device_format(d, buf, n);
  return buf;
}

static void tf_l_push_names(lua_State *L, const char *const *names, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

/* What p:info().counters says: how counting went, and the device's limits. */
static void tf_l_push_counter_info(lua_State *L, const tf_prof_counter_info *c) {
  lua_createtable(L, 0, 15);
  TF_SET_INT(L, "device", c->device);
  TF_SET_STR(L, "chip", c->chip);
  TF_SET_INT(L, "passes", c->passes);
  lua_pushboolean(L, c->by_pass);
  lua_setfield(L, -2, "by_pass");
  TF_SET_INT(L, "launches", c->launches);
  TF_SET_INT(L, "max_kernels", c->max_kernels);
  TF_SET_INT(L, "ranges", c->ranges);
  TF_SET_INT(L, "dropped", c->dropped);
  TF_SET_INT(L, "counted", c->counted);
  TF_SET_INT(L, "lost", c->lost);
  TF_SET_INT(L, "copies", c->copies);
  TF_SET_INT(L, "mismatched", c->mismatched);
  TF_SET_INT(L, "unpaired", c->unpaired);
  if (c->sass_left_out[0]) TF_SET_STR(L, "sass_left_out", c->sass_left_out);
  TF_SET_INT(L, "start_ns", c->start_ns);
  TF_SET_INT(L, "stop_ns", c->stop_ns);
  const tf_prof_device_limits *l = &c->limits;
  lua_createtable(L, 0, 10);
  TF_SET_INT(L, "sm_count", l->sm_count);
  TF_SET_INT(L, "warp_size", l->warp_size);
  TF_SET_INT(L, "max_threads_per_sm", l->max_threads_per_sm);
  TF_SET_INT(L, "max_blocks_per_sm", l->max_blocks_per_sm);
  TF_SET_INT(L, "max_threads_per_block", l->max_threads_per_block);
  TF_SET_INT(L, "regs_per_sm", l->regs_per_sm);
  TF_SET_INT(L, "regs_per_block", l->regs_per_block);
  TF_SET_INT(L, "shared_per_sm", l->shared_per_sm);
  TF_SET_INT(L, "shared_per_block_optin", l->shared_per_block_optin);
  TF_SET_INT(L, "reserved_shared_per_block", l->reserved_shared_per_block);
  lua_setfield(L, -2, "limits");
}

/* p:info() -> {running, gpu, reason, start_ns, stop_ns, dropped,
 * clock_drift_ns, options = {...}, kernels, transfers, ranges (counts)}. */
static int tf_l_prof_info(lua_State *L) {
  tf_prof_view v;
  TF_LUA_CHECK(L, tf_prof_view_get(tf_l_checkprofile(L), &v), "profile:info");
  lua_createtable(L, 0, 12);
  TF_SET_BOOL(L, "running", v.running);
  TF_SET_BOOL(L, "gpu", v.gpu);
  if (!v.gpu) TF_SET_STR(L, "reason", v.gpu_reason);
  TF_SET_INT(L, "start_ns", v.start_ns);
  if (!v.running) TF_SET_INT(L, "stop_ns", v.stop_ns);
  TF_SET_INT(L, "dropped", v.dropped);
  TF_SET_INT(L, "untimed", v.untimed);
  TF_SET_INT(L, "clock_drift_ns", v.clock_drift_ns);
  TF_SET_INT(L, "kernels", v.num_kernels);
  TF_SET_INT(L, "transfers", v.num_transfers);
  TF_SET_INT(L, "ranges", v.num_ranges);
  lua_createtable(L, 0, 3);
  TF_SET_BOOL(L, "kernels", v.options.kernels);
  TF_SET_BOOL(L, "memcpy", v.options.memcpy);
  TF_SET_BOOL(L, "host_ops", v.options.host_ops);
  if (v.options.num_metrics) {
    tf_l_push_names(L, v.options.metrics, v.options.num_metrics);
    lua_setfield(L, -2, "metrics");
    TF_SET_INT(L, "max_kernels", v.options.max_kernels);
  }
  lua_setfield(L, -2, "options");
  if (v.options.num_metrics) {
    tf_l_push_counter_info(L, &v.counters);
    lua_setfield(L, -2, "counters");
  }
  return 1;
}

/* p:_status() -> running, gpu, reason: without waiting for the devices. */
static int tf_l_prof_status(lua_State *L) {
  tf_prof_session *s = tf_l_checkprofile(L);
  const char *reason = "";
  lua_pushboolean(L, tf_prof_running(s));
  lua_pushboolean(L, tf_prof_session_gpu(s, &reason));
  lua_pushstring(L, reason);
  return 3;
}

static void tf_l_push_dim3(lua_State *L, const int32_t *d) {
  lua_createtable(L, 3, 0);
  for (int i = 0; i < 3; i++) {
    lua_pushinteger(L, d[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* Sets the record's counters = {metric = value} to row counter_row (1-based) of v's values, when it has one;
 * a metric that could not be counted (NaN: the SASS pass of a count by passes that did not see the same kernels)
 * is left out. */
static void tf_l_push_counters(lua_State *L, uint32_t counter_row, const tf_prof_view *v) {
  if (!counter_row || counter_row > v->counter_rows) return;
  const double *values = v->counter_values + (size_t)(counter_row - 1) * v->options.num_metrics;
  lua_createtable(L, 0, (int)v->options.num_metrics);
  for (size_t m = 0; m < v->options.num_metrics; m++) {
    if (values[m] != values[m]) continue;
    lua_pushnumber(L, values[m]);
    lua_setfield(L, -2, v->options.metrics[m]);
  }
  lua_setfield(L, -2, "counters");
}

/* Pushes a kernel record; with counters = {metric = value} when it was counted. */
static void tf_l_push_kernel(lua_State *L, const tf_prof_kernel *k, const tf_prof_view *v) {
  char dev[32];
  lua_createtable(L, 0, 16);
  TF_SET_STR(L, "name", k->name);
  TF_SET_STR(L, "short_name", k->short_name);
  TF_SET_STR(L, "device", tf_l_device_name(k->device, dev, sizeof dev));
  TF_SET_INT(L, "stream", k->stream);
  TF_SET_INT(L, "start_ns", k->start_ns);
  TF_SET_INT(L, "end_ns", k->end_ns);
  if (k->range) TF_SET_INT(L, "range", k->range);
  TF_SET_BOOL(L, "host", k->host);
  if (!k->host) {
    TF_SET_INT(L, "correlation", k->correlation);
    if (k->graph_node) TF_SET_INT(L, "graph_node", (int64_t)k->graph_node);
    tf_l_push_dim3(L, k->grid);
    lua_setfield(L, -2, "grid");
    tf_l_push_dim3(L, k->block);
    lua_setfield(L, -2, "block");
    TF_SET_INT(L, "registers", k->registers);
    TF_SET_INT(L, "static_shared", k->static_shared);
    TF_SET_INT(L, "dynamic_shared", k->dynamic_shared);
    TF_SET_INT(L, "shared_memory", (int64_t)k->static_shared + k->dynamic_shared);
    tf_l_push_counters(L, k->counter_row, v);
  }
}

static void tf_l_push_transfer(lua_State *L, const tf_prof_transfer *t, const tf_prof_view *v) {
  char dev[32];
  lua_createtable(L, 0, 10);
  TF_SET_STR(L, "kind", t->kind);
  TF_SET_INT(L, "bytes", t->bytes);
  TF_SET_STR(L, "device", tf_l_device_name(t->device, dev, sizeof dev));
  TF_SET_INT(L, "stream", t->stream);
  TF_SET_INT(L, "start_ns", t->start_ns);
  TF_SET_INT(L, "end_ns", t->end_ns);
  TF_SET_INT(L, "correlation", t->correlation);
  if (t->graph_node) TF_SET_INT(L, "graph_node", (int64_t)t->graph_node);
  if (t->range) TF_SET_INT(L, "range", t->range);
  tf_l_push_counters(L, t->counter_row, v);
}

static void tf_l_push_range(lua_State *L, const tf_prof_range *r) {
  lua_createtable(L, 0, 8);
  TF_SET_INT(L, "id", r->id);
  TF_SET_STR(L, "name", r->name);
  if (r->parent) TF_SET_INT(L, "parent", r->parent);
  TF_SET_INT(L, "depth", r->depth);
  TF_SET_INT(L, "start_ns", r->start_ns);
  TF_SET_INT(L, "end_ns", r->end_ns);
  TF_SET_BOOL(L, "open", r->open);
  if (r->replay) TF_SET_BOOL(L, "replay", true);
}

/* Appends the value on top of the stack to the array at idx. */
static void tf_l_append(lua_State *L, int idx) {
  lua_rawseti(L, idx, (lua_Integer)lua_rawlen(L, idx) + 1);
}

/* p:records() -> {kernels, memcpy, memset, ranges, host_ops}: every record,
 * times in ns of the host's monotonic clock. kernels are GPU kernels and
 * the CPU device's ops; host_ops are ops timed on the host for a GPU (when
 * the GPU backend is wrapped too). */
static int tf_l_prof_records(lua_State *L) {
  tf_prof_view v;
  TF_LUA_CHECK(L, tf_prof_view_get(tf_l_checkprofile(L), &v), "profile:records");
  lua_createtable(L, 0, 6);
  int top = lua_gettop(L);
  lua_createtable(L, (int)v.num_kernels, 0);   /* top + 1: kernels */
  lua_createtable(L, 0, 0);                    /* top + 2: memcpy */
  lua_createtable(L, 0, 0);                    /* top + 3: memset */
  lua_createtable(L, (int)v.num_ranges, 0);    /* top + 4: ranges */
  lua_createtable(L, 0, 0);                    /* top + 5: host_ops */
  for (size_t i = 0; i < v.num_kernels; i++) {
    const tf_prof_kernel *k = &v.kernels[i];
    tf_l_push_kernel(L, k, &v);
    tf_l_append(L, k->host && k->device.type != TF_DEV_CPU ? top + 5 : top + 1);
  }
  for (size_t i = 0; i < v.num_transfers; i++) {
    tf_l_push_transfer(L, &v.transfers[i], &v);
    tf_l_append(L, v.transfers[i].memset ? top + 3 : top + 2);
  }
  for (size_t i = 0; i < v.num_ranges; i++) {
    tf_l_push_range(L, &v.ranges[i]);
    tf_l_append(L, top + 4);
  }
  static const char *const fields[] = {"kernels", "memcpy", "memset", "ranges", "host_ops"};
  for (int i = 4; i >= 0; i--) lua_setfield(L, top, fields[i]);
  return 1;
}

static int tf_l_prof_tostring(lua_State *L) {
  tf_lua_profile *p = luaL_checkudata(L, 1, TF_PROFILE_TYPE);
  lua_pushstring(L, !p->s ? "tf.Profile(released)"
                          : tf_prof_running(p->s) ? "tf.Profile(running)" : "tf.Profile(stopped)");
  return 1;
}

/* tf._prof.available() -> ok, reason */
static int tf_l_prof_available(lua_State *L) {
  const char *reason = "";
  bool ok = tf_prof_gpu_available(&reason);
  lua_pushboolean(L, ok);
  lua_pushstring(L, reason);
  return 2;
}

/* tf._prof.cpu_wired() -> whether the CPU backend records host ops (the
 * table registered for the CPU comes from tf_cpu_prof_backend). */
static int tf_l_prof_cpu_wired(lua_State *L) {
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_cpu(), &ctx), "tf._prof.cpu_wired");
  lua_pushboolean(L, tf_prof_backend_is_wrapped(ctx->backend));
  return 1;
}

/* tf._prof.busy_ns(spans) -> how long one device was busy with the
 * intervals in spans, a flat array {start_ns, end_ns, start_ns, end_ns,
 * ...}: the length of their union (tf_prof_busy_ns). */
static int tf_l_prof_busy_ns(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  size_t len = (size_t)lua_rawlen(L, 1);
  if (len % 2) return tf_lua_error(L, "tf._prof.busy_ns: expects start, end pairs (got %d values)", (int)len);
  size_t n = len / 2;
  tf_prof_span *spans = lua_newuserdatauv(L, n ? n * sizeof *spans : 1, 0); /* freed by the GC, also on error */
  for (size_t i = 0; i < n; i++) {
    int64_t t[2];
    for (int j = 0; j < 2; j++) {
      int ok;
      lua_rawgeti(L, 1, (lua_Integer)(2 * i + (size_t)j + 1));
      t[j] = (int64_t)lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok) return tf_lua_error(L, "tf._prof.busy_ns: value %d is not an integer time", (int)(2 * i + (size_t)j + 1));
    }
    spans[i] = (tf_prof_span){t[0], t[1], {TF_DEV_CPU, 0}};
  }
  lua_pushinteger(L, (lua_Integer)tf_prof_busy_ns(spans, n));
  return 1;
}

/* tf._prof.counter_names([chip]) -> the chip's base metric names (chip
 * nil: the current GPU's); tf._prof.counter_names(chip, base) -> base's
 * submetrics (".sum", ...). An error where this build or machine has no
 * hardware counters. */
static int tf_l_prof_counter_names(lua_State *L) {
  const char *chip = luaL_optstring(L, 1, NULL);
  const char *base = luaL_optstring(L, 2, NULL);
  const char *const *names = NULL;
  size_t n = 0;
  TF_LUA_CHECK(L, tf_prof_counter_names(chip, base, &names, &n), "tf.prof");
  tf_l_push_names(L, names, n);
  return 1;
}

static const luaL_Reg tf_profile_methods[] = {
    {"stop", tf_l_prof_stop},       {"info", tf_l_prof_info}, {"records", tf_l_prof_records},
    {"next_pass", tf_l_prof_next_pass},
    {"_status", tf_l_prof_status}, {NULL, NULL},
};

static const luaL_Reg tf_prof_functions[] = {
    {"range", tf_l_range_open},         {"range_stack", tf_l_range_stack}, {"start", tf_l_prof_start},
    {"available", tf_l_prof_available}, {"cpu_wired", tf_l_prof_cpu_wired}, {"busy_ns", tf_l_prof_busy_ns},
    {"counter_names", tf_l_prof_counter_names}, {NULL, NULL},
};

/* Adds _prof (with _prof.methods, tf.Profile's method table, for
 * lua/tf/prof.lua to extend) to the table on top of the stack. */
void tf_open_prof(lua_State *L) {
  static const luaL_Reg range_meta[] = {
      {"__close", tf_l_range_close}, {"__index", tf_l_range_index}, {"__tostring", tf_l_range_tostring},
      {NULL, NULL}};
  static const luaL_Reg profile_meta[] = {
      {"__gc", tf_l_prof_gc}, {"__close", tf_l_prof_close}, {"__tostring", tf_l_prof_tostring}, {NULL, NULL}};
  tf_lua_newclass(L, TF_RANGE_TYPE, range_meta, NULL);
  tf_lua_newclass(L, TF_PROFILE_TYPE, profile_meta, tf_profile_methods);
  luaL_newlib(L, tf_prof_functions);
  luaL_getmetatable(L, TF_PROFILE_TYPE);
  lua_getfield(L, -1, "__index");
  lua_setfield(L, -3, "methods");
  lua_pop(L, 1); /* the metatable */
  lua_setfield(L, -2, "_prof");
}
