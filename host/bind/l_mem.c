/* tf.mem: the caching allocator's statistics and controls. */
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "device.h"
#include "safe.h"

static tf_device_ctx *tf_l_mem_ctx(lua_State *L, int idx, const char *fname) {
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_lua_checkdevice(L, idx), &ctx), fname);
  return ctx;
}

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
  if (ctx->alloc.limit) TF_SET_INT(L, "limit", ctx->alloc.limit); /* nil: no cap, as set_limit(nil) sets */
  return 1;
}

static int tf_l_mem_reset_peak(lua_State *L) {
  tf_alloc_reset_peak(&tf_l_mem_ctx(L, 1, "tf.mem.reset_peak")->alloc);
  return 0;
}

/* Collects garbage tensors first: their blocks can only be released once
 * the Lua GC has finalised them. Twice: what only finalised objects still
 * referenced becomes garbage in the second cycle. */
static int tf_l_mem_empty_cache(lua_State *L) {
  tf_device_ctx *ctx = tf_l_mem_ctx(L, 1, "tf.mem.empty_cache");
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  tf_alloc_empty_cache(&ctx->alloc);
  return 0;
}

/* tf.mem.set_limit(bytes | nil [, device]): caps reserved memory; under
 * --memory-limit or --safe's default cap only at or below that cap. */
static int tf_l_mem_set_limit(lua_State *L) {
  lua_Integer limit = luaL_opt(L, luaL_checkinteger, 1, 0);
  if (limit < 0) return luaL_argerror(L, 1, "the limit must be >= 0 (or nil for none)");
  tf_device_ctx *ctx = tf_l_mem_ctx(L, 2, "tf.mem.set_limit");
  const char *origin;
  size_t cap = tf_safe_mem_ceiling(ctx->device, &origin);
  if (cap && (limit == 0 || (size_t)limit > cap))
    return tf_lua_error(L, "tf.mem.set_limit: refused: the limit cannot be raised past %s (%I bytes on %s)", origin,
                        (lua_Integer)cap, ctx->alloc.device_name);
  tf_alloc_set_limit(&ctx->alloc, (size_t)limit);
  return 0;
}

/* tf.mem.record{max_entries = N [, device]} | tf.mem.record(true | false [, device]):
 * starts (afresh) or stops the device's allocation history. */
static int tf_l_mem_record(lua_State *L) {
  lua_Integer max_entries = 1 << 20;
  bool on = true;
  int devidx = 2;
  if (lua_istable(L, 1)) {
    static const char *const keys[] = {"max_entries", "enabled", "device", NULL};
    lua_settop(L, 1);
    tf_lua_checkkeys(L, 1, "tf.mem.record", keys);
    lua_getfield(L, 1, "max_entries");
    if (!lua_isnil(L, -1)) {
      if (!lua_isinteger(L, -1)) return tf_lua_error(L, "tf.mem.record: max_entries must be an integer");
      max_entries = lua_tointeger(L, -1);
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "enabled");
    if (!lua_isnil(L, -1)) on = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 1, "device"); /* index 2, where the device argument goes */
  } else if (lua_isboolean(L, 1)) {
    on = lua_toboolean(L, 1);
  } else if (!lua_isnoneornil(L, 1)) {
    return luaL_argerror(L, 1, "expected a table of options or a boolean");
  }
  if (max_entries < 1) return tf_lua_error(L, "tf.mem.record: max_entries must be at least 1");
  tf_device_ctx *ctx = tf_l_mem_ctx(L, devidx, "tf.mem.record");
  TF_LUA_CHECK(L, tf_alloc_record(&ctx->alloc, on, (size_t)max_entries), "tf.mem.record");
  return 0;
}

/* ---- snapshots --------------------------------------------------------------------------- */

/* Caches decoded strings of one snapshot (frames and range lists shared
 * between the entries that have the same ones). */
typedef struct tf_snap {
  lua_State *L;
  int cache;  /* index of a table: "f<id>"/"r<id>" -> decoded table */
  int segs;   /* index of the segments array */
  const void *segment;
  int nsegs, nblocks;
  lua_Integer allocated, requested;
} tf_snap;

/* "file\tline\tname" lines -> {{filename=, line=, name=}, ...} */
static void tf_snap_push_frames(tf_snap *sn, uint32_t id) {
  lua_State *L = sn->L;
  lua_rawgeti(L, sn->cache, (lua_Integer)id * 2);
  if (!lua_isnil(L, -1)) return;
  lua_pop(L, 1);
  lua_newtable(L);
  const char *p = tf_intern_string(id);
  int n = 0;
  while (*p) {
    const char *end = strchr(p, '\n');
    if (!end) end = p + strlen(p);
    const char *t1 = memchr(p, '\t', (size_t)(end - p));
    const char *t2 = t1 ? memchr(t1 + 1, '\t', (size_t)(end - t1 - 1)) : NULL;
    lua_createtable(L, 0, 3);
    lua_pushlstring(L, p, (size_t)((t1 ? t1 : end) - p));
    lua_setfield(L, -2, "filename");
    lua_pushinteger(L, t1 ? strtoll(t1 + 1, NULL, 10) : 0);
    lua_setfield(L, -2, "line");
    if (t2)
      lua_pushlstring(L, t2 + 1, (size_t)(end - t2 - 1));
    else
      lua_pushliteral(L, "?");
    lua_setfield(L, -2, "name");
    lua_rawseti(L, -2, ++n);
    p = *end ? end + 1 : end;
  }
  lua_pushvalue(L, -1);
  lua_rawseti(L, sn->cache, (lua_Integer)id * 2);
}

/* "a/b/c" -> {"a", "b", "c"} */
static void tf_snap_push_ranges(tf_snap *sn, uint32_t id) {
  lua_State *L = sn->L;
  lua_rawgeti(L, sn->cache, (lua_Integer)id * 2 + 1);
  if (!lua_isnil(L, -1)) return;
  lua_pop(L, 1);
  lua_newtable(L);
  const char *p = tf_intern_string(id);
  for (int n = 1; *p; n++) {
    const char *end = strchr(p, '/');
    if (!end) end = p + strlen(p);
    lua_pushlstring(L, p, (size_t)(end - p));
    lua_rawseti(L, -2, n);
    p = *end ? end + 1 : end;
  }
  lua_pushvalue(L, -1);
  lua_rawseti(L, sn->cache, (lua_Integer)id * 2 + 1);
}

/* tag, what, source, ranges, frames of an origin into the table on top. */
static void tf_snap_set_origin(tf_snap *sn, const tf_mem_origin *o) {
  lua_State *L = sn->L;
  lua_pushstring(L, tf_mem_tag_name(o->tag));
  lua_setfield(L, -2, "tag");
  if (o->what) {
    lua_pushstring(L, tf_intern_string(o->what));
    lua_setfield(L, -2, "what");
  }
  if (o->source) {
    lua_pushstring(L, tf_intern_string(o->source));
    lua_setfield(L, -2, "source");
  }
  tf_snap_push_ranges(sn, o->ranges);
  lua_setfield(L, -2, "ranges");
  tf_snap_push_frames(sn, o->frames);
  lua_setfield(L, -2, "frames");
}

/* Closes the segment table on top of the stack (its sizes) into segs. */
static void tf_snap_end_segment(tf_snap *sn) {
  lua_State *L = sn->L;
  if (!sn->segment) return;
  lua_setfield(L, -2, "blocks");
  TF_SET_INT(L, "allocated_size", sn->allocated);
  TF_SET_INT(L, "active_size", sn->allocated);
  TF_SET_INT(L, "requested_size", sn->requested);
  lua_rawseti(L, sn->segs, ++sn->nsegs);
  sn->segment = NULL;
}

static void tf_snap_visit(void *ud, const tf_alloc_visit *v) {
  tf_snap *sn = ud;
  lua_State *L = sn->L;
  luaL_checkstack(L, 8, "snapshot");
  if (v->segment != sn->segment) {
    tf_snap_end_segment(sn);
    sn->segment = v->segment;
    sn->nblocks = 0;
    sn->allocated = sn->requested = 0;
    lua_createtable(L, 0, 10);
    TF_SET_INT(L, "address", (uintptr_t)v->segment);
    TF_SET_INT(L, "total_size", v->segment_size);
    TF_SET_INT(L, "stream", 0);
    lua_pushstring(L, v->small ? "small" : "large");
    lua_setfield(L, -2, "segment_type");
    lua_newtable(L); /* blocks, kept on top until the segment ends */
  }
  lua_createtable(L, 0, 9);
  TF_SET_INT(L, "address", (uintptr_t)v->ptr);
  TF_SET_INT(L, "size", v->size);
  TF_SET_INT(L, "requested_size", v->allocated ? v->requested : 0);
  lua_pushstring(L, v->allocated ? "active_allocated" : "inactive");
  lua_setfield(L, -2, "state");
  if (v->allocated) {
    tf_snap_set_origin(sn, &v->origin);
    sn->allocated += (lua_Integer)v->size;
    sn->requested += (lua_Integer)v->requested;
  }
  lua_rawseti(L, -2, ++sn->nblocks);
}

/* tf.mem.snapshot([device]) -> {device, device_index, segments, trace, peak}:
 * the allocator's segments and blocks now, and the recorded history. */
static int tf_l_mem_snapshot(lua_State *L) {
  tf_device_ctx *ctx = tf_l_mem_ctx(L, 1, "tf.mem.snapshot");
  lua_settop(L, 1);
  lua_newtable(L); /* 2: cache */
  lua_createtable(L, 0, 6); /* 3: the snapshot */
  char name[32];
  tf_device_format(ctx->device, name, sizeof name);
  lua_pushstring(L, name);
  lua_setfield(L, 3, "device");
  TF_SET_INT(L, "device_index", ctx->device.index);
  lua_newtable(L); /* 4: segments */
  tf_snap sn = {.L = L, .cache = 2, .segs = 4};
  tf_alloc_walk(&ctx->alloc, tf_snap_visit, &sn);
  tf_snap_end_segment(&sn);
  lua_setfield(L, 3, "segments");
  const tf_mem_recorder *h = &ctx->alloc.history;
  lua_createtable(L, (int)(h->count < 1u << 24 ? h->count : 0), 0);
  for (size_t i = 0; i < h->count; i++) {
    const tf_mem_event *e = tf_mem_event_at(h, i);
    lua_createtable(L, 0, 12);
    lua_pushstring(L, tf_mem_action_name(e->action));
    lua_setfield(L, -2, "action");
    TF_SET_INT(L, "addr", e->addr);
    TF_SET_INT(L, "size", e->size);
    TF_SET_INT(L, "requested_size", e->requested);
    TF_SET_INT(L, "stream", 0);
    TF_SET_INT(L, "time_us", e->time_us);
    TF_SET_INT(L, "index", e->seq);
    if (e->action == TF_MEM_OOM) TF_SET_INT(L, "device_free", e->device_free);
    tf_snap_set_origin(&sn, &e->origin);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, 3, "trace");
  if (h->events) {
    lua_createtable(L, 0, 3);
    TF_SET_INT(L, "allocated", h->peak);
    TF_SET_INT(L, "time_us", h->peak_time_us);
    TF_SET_INT(L, "index", h->peak_seq);
    lua_setfield(L, 3, "peak");
    lua_pushboolean(L, h->on);
    lua_setfield(L, 3, "recording");
    TF_SET_INT(L, "dropped", h->seq - h->count);
  }
  return 1;
}

/* ---- scopes ------------------------------------------------------------------------------ */

#define TF_MEM_SCOPE_TYPE "tf.MemScope"

typedef struct tf_l_scope {
  tf_mem_scope previous;
  bool open;
} tf_l_scope;

static int tf_l_scope_close(lua_State *L) {
  tf_l_scope *s = luaL_checkudata(L, 1, TF_MEM_SCOPE_TYPE);
  if (s->open) {
    tf_mem_scope_leave(s->previous);
    s->open = false;
  }
  return 0;
}

/* tf.mem.scope(tag [, what]) -> a to-be-closed value (lua/tf/init.lua adds
 * the form that runs a function inside). what names the op or component
 * (kept in the registry so it lives as long as the process). */
static int tf_l_mem_scope(lua_State *L) {
  const char *tagname = luaL_checkstring(L, 1);
  int tag = tf_mem_tag_parse(tagname);
  if (tag < 0)
    return tf_lua_error(L, "tf.mem.scope: unknown tag '%s' (parameter, gradient, optimizer state, activation, "
                      "workspace, temporary or auto)", tagname);
  const char *what = NULL;
  if (!lua_isnoneornil(L, 2)) what = tf_intern_string(tf_intern_id(luaL_checkstring(L, 2)));
  tf_l_scope *s = lua_newuserdatauv(L, sizeof *s, 0);
  luaL_setmetatable(L, TF_MEM_SCOPE_TYPE);
  s->previous = tf_mem_scope_enter(tag, what);
  s->open = true;
  return 1;
}

/* tf.mem.collect(): a full Lua GC, so unreachable tensors give back memory. */
static int tf_l_mem_collect(lua_State *L) {
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}

static const luaL_Reg tf_mem_functions[] = {
    {"stats", tf_l_mem_stats},       {"reset_peak", tf_l_mem_reset_peak}, {"empty_cache", tf_l_mem_empty_cache},
    {"set_limit", tf_l_mem_set_limit}, {"collect", tf_l_mem_collect},     {"record", tf_l_mem_record},
    {"snapshot", tf_l_mem_snapshot},   {"scope", tf_l_mem_scope},         {NULL, NULL},
};

static void tf_reclaim_lua(void *ud) { lua_gc((lua_State *)ud, LUA_GCCOLLECT); }

/* Where the running script is: the C function being called (what), the
 * first line outside tfhost's own Lua modules (source) and up to 12 Lua
 * frames. Formatting them costs microseconds, so answers are cached by a
 * hash of the calling function and each frame's chunk and line (direct
 * mapped; a colliding entry is replaced). */
enum { TF_SITE_FRAMES = 12, TF_SITE_CACHE = 4096 };

typedef struct tf_site_entry {
  uint64_t key;
  uint32_t source, frames, what;
} tf_site_entry;

static uint64_t tf_site_mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }

/* Formats and interns the site (a cache miss). */
static void tf_site_format(lua_State *L, tf_site_entry *e) {
  char source[192] = "", frames[1024] = "", what[64] = "";
  lua_Debug ar;
  size_t at = 0;
  int n = 0;
  bool in_library = false;
  for (int level = 0; n < TF_SITE_FRAMES && lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "nSl", &ar)) break;
    if (ar.what[0] == 'C') {
      if (level == 0 && ar.name) snprintf(what, sizeof what, "%s", ar.name);
      continue;
    }
    if (ar.currentline <= 0) continue;
    /* the script's statement, not a line of tfhost's own Lua modules */
    bool library = strncmp(ar.source, "@lua/tf/", 8) == 0;
    if (!source[0] || (in_library && !library)) {
      snprintf(source, sizeof source, "%s:%d", ar.short_src, ar.currentline);
      in_library = library;
    }
    int w = snprintf(frames + at, sizeof frames - at, "%s%s\t%d\t%s", n ? "\n" : "", ar.short_src, ar.currentline,
                     ar.name ? ar.name : (ar.what[0] == 'm' ? "<main>" : "?"));
    if (w < 0 || (size_t)w >= sizeof frames - at) break;
    at += (size_t)w;
    n++;
  }
  e->source = tf_intern_id(source);
  e->frames = tf_intern_id(frames);
  e->what = tf_intern_id(what);
}

static void tf_site_lua(void *ud, tf_mem_origin *o) {
  static tf_site_entry cache[TF_SITE_CACHE];
  lua_State *L = ud;
  lua_Debug ar;
  uint64_t key = 0xcbf29ce484222325ull;
  if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "f", &ar)) {
    key = tf_site_mix(key, (uintptr_t)lua_topointer(L, -1));
    lua_pop(L, 1);
  }
  for (int level = 1, n = 0; n < TF_SITE_FRAMES && lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
    key = tf_site_mix(tf_site_mix(key, (uintptr_t)ar.source), (uint64_t)ar.currentline);
    n++;
  }
  key |= 1; /* never 0, the empty entry's key */
  tf_site_entry *e = &cache[key % TF_SITE_CACHE];
  if (e->key != key) {
    tf_site_format(L, e);
    e->key = key;
  }
  o->source = e->source;
  o->frames = e->frames;
  o->what = e->what;
}

void tf_lua_install_reclaim(lua_State *L) {
  tf_alloc_set_reclaim_hook(tf_reclaim_lua, L);
  tf_mem_set_site_hook(tf_site_lua, L);
}

void tf_open_mem(lua_State *L) {
  static const luaL_Reg scope_meta[] = {{"__close", tf_l_scope_close}, {NULL, NULL}};
  tf_lua_newclass(L, TF_MEM_SCOPE_TYPE, scope_meta, NULL);
  luaL_newlib(L, tf_mem_functions);
  lua_setfield(L, -2, "mem");
}
