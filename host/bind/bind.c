/* Shared binding helpers: errors, tensor userdata, shapes and options. */
#include "bind.h"

#include <stdarg.h>
#include <string.h>

#define TF_OWNER_TYPE "tf.Owner"

int tf_lua_newclass(lua_State *L, const char *name, const luaL_Reg *metamethods, const luaL_Reg *methods) {
  if (!luaL_newmetatable(L, name)) {
    lua_pop(L, 1);
    return 0;
  }
  if (metamethods) luaL_setfuncs(L, metamethods, 0);
  if (methods) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  return 1;
}

typedef struct tf_lua_owner {
  void *ptr;
  void (*release)(void *);
} tf_lua_owner;

static int tf_lua_owner_gc(lua_State *L) {
  tf_lua_owner *o = luaL_checkudata(L, 1, TF_OWNER_TYPE);
  if (o->ptr) o->release(o->ptr);
  o->ptr = NULL;
  return 0;
}

void **tf_lua_push_owner(lua_State *L, void (*release)(void *)) {
  static const luaL_Reg meta[] = {{"__gc", tf_lua_owner_gc}, {NULL, NULL}};
  tf_lua_owner *o = lua_newuserdatauv(L, sizeof *o, 0);
  *o = (tf_lua_owner){NULL, release};
  tf_lua_newclass(L, TF_OWNER_TYPE, meta, NULL);
  luaL_setmetatable(L, TF_OWNER_TYPE);
  return &o->ptr;
}

/* Whether the words of a and b (split at spaces, '.', ':' and '_') are the
 * same, b's being the last words of a's: "tf.matmul" ends with "matmul",
 * "model:forward" with "model forward". */
static bool tf_lua_words_end(const char *a, size_t na, const char *b, size_t nb) {
  char x[128], y[128];
  size_t nx = 0, ny = 0;
  for (size_t i = 0; i < na && nx + 1 < sizeof x; i++) x[nx++] = strchr(" .:_", a[i]) ? ' ' : a[i];
  for (size_t i = 0; i < nb && ny + 1 < sizeof y; i++) y[ny++] = strchr(" .:_", b[i]) ? ' ' : b[i];
  if (ny == 0 || ny > nx || memcmp(x + nx - ny, y, ny) != 0) return false;
  return nx == ny || x[nx - ny - 1] == ' ';
}

/* The message without a leading "<op>: " that repeats what fname already
 * says ("tf.matmul: matmul: shapes ..." reads "tf.matmul: shapes ..."). */
static const char *tf_lua_unprefixed(const char *fname, const char *msg) {
  const char *colon = strstr(msg, ": ");
  if (!colon || colon - msg > 48) return msg;
  return tf_lua_words_end(fname, strlen(fname), msg, (size_t)(colon - msg)) ? colon + 2 : msg;
}

/* Whether stack level `level` is C or one of tfhost's own Lua modules
 * (chunk names "@lua/tf/..."), not the user's code. */
static bool tf_lua_level_is_tfhost(lua_State *L, int level) {
  lua_Debug ar;
  if (!lua_getstack(L, level, &ar) || !lua_getinfo(L, "S", &ar)) return false;
  return strcmp(ar.what, "C") == 0 || strncmp(ar.source, "@lua/tf/", 8) == 0;
}

void tf_lua_where(lua_State *L, int level) {
  int at = level;
  while (tf_lua_level_is_tfhost(L, at)) at++;
  lua_Debug ar;
  luaL_where(L, lua_getstack(L, at, &ar) ? at : level);
}

int tf_lua_error(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tf_lua_where(L, 1);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

/* error(message [, level]) as Lua's, the position being that of the
 * first function at `level` or above that is the user's, not tfhost's. */
static int tf_lua_error_fn(lua_State *L) {
  const int level = (int)luaL_optinteger(L, 2, 1);
  lua_settop(L, 1);
  if (lua_type(L, 1) == LUA_TSTRING && level > 0) {
    tf_lua_where(L, level);
    lua_pushvalue(L, 1);
    lua_concat(L, 2);
  }
  return lua_error(L);
}

void tf_lua_replace_error(lua_State *L) {
  lua_pushcfunction(L, tf_lua_error_fn);
  lua_setglobal(L, "error");
}

int tf_lua_raise(lua_State *L, tf_status st, const char *fname) {
  const char *msg = tf_lua_unprefixed(fname, tf_last_error());
  /* Out of memory reads "file:line: out of memory: ... (in fname)": the
   * words scripts test come first after the position. */
  if (st == TF_ERR_OOM) return tf_lua_error(L, "%s (in %s)", msg, fname);
  return tf_lua_error(L, "%s: %s", fname, msg);
}

tf_tensor *tf_lua_totensor(lua_State *L, int idx) {
  tf_lua_tensor *u = luaL_testudata(L, idx, TF_TENSOR_TYPE);
  return u ? u->t : NULL;
}

tf_tensor *tf_lua_checktensor(lua_State *L, int idx) {
  tf_lua_tensor *u = luaL_checkudata(L, idx, TF_TENSOR_TYPE);
  if (!u->t) luaL_argerror(L, idx, "tensor has been freed");
  return u->t;
}

/* Device bytes the Lua GC cannot see: after this many new bytes of tensors,
 * a full collection returns the storage of unreachable tensors. */
static size_t tf_gc_debt;
enum { TF_GC_DEBT_MIN = 256 << 20 };

void tf_lua_pushtensor(lua_State *L, tf_tensor *t) {
  tf_lua_tensor *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->t = t;
  luaL_setmetatable(L, TF_TENSOR_TYPE);
  if (t->storage->refcount == 1) {
    tf_gc_debt += t->storage->nbytes;
    tf_device_ctx *ctx;
    if (tf_gc_debt > TF_GC_DEBT_MIN && tf_device_ctx_get(t->device, &ctx) == TF_OK &&
        tf_gc_debt > ctx->alloc.stats.allocated / 2) {
      tf_gc_debt = 0;
      lua_gc(L, LUA_GCCOLLECT);
    }
  }
}

int tf_lua_checkshape(lua_State *L, int idx, tf_shape *shape, int allow_infer) {
  shape->ndim = 0;
  int next = idx;
  if (lua_istable(L, idx) && !luaL_testudata(L, idx, TF_TENSOR_TYPE)) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    if (n > TF_MAX_DIMS) luaL_argerror(L, idx, "a shape has at most 8 dimensions");
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, idx, i);
      int ok;
      lua_Integer d = lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok) luaL_argerror(L, idx, lua_pushfstring(L, "the size of dimension %d is not an integer", (int)i - 1));
      shape->dims[shape->ndim++] = d;
    }
    next = idx + 1;
  } else {
    while (lua_isinteger(L, next) || (lua_type(L, next) == LUA_TNUMBER)) {
      int ok;
      lua_Integer d = lua_tointegerx(L, next, &ok);
      if (!ok) luaL_argerror(L, next, lua_pushfstring(L, "the size of dimension %d is not an integer", shape->ndim));
      if (shape->ndim == TF_MAX_DIMS) luaL_argerror(L, next, "a shape has at most 8 dimensions");
      shape->dims[shape->ndim++] = d;
      next++;
    }
  }
  for (int i = 0; i < shape->ndim; i++)
    if (shape->dims[i] < 0 && !(allow_infer && shape->dims[i] == -1))
      luaL_argerror(L, idx, lua_pushfstring(L, "negative size %I for dimension %d", (lua_Integer)shape->dims[i], i));
  return next;
}

int tf_lua_checkdim(lua_State *L, int idx) {
  lua_Integer d = luaL_checkinteger(L, idx);
  if (d < -TF_MAX_DIMS - 1 || d > TF_MAX_DIMS)
    luaL_argerror(L, idx, lua_pushfstring(L, "dimension %I out of range (dimensions count from 0, or from -1 at the "
                                             "end; a tensor has at most %d)", d, TF_MAX_DIMS));
  return (int)d;
}

tf_dtype tf_lua_checkdtype(lua_State *L, int idx) {
  tf_dtype d;
  if (tf_dtype_parse(luaL_checkstring(L, idx), &d) != TF_OK) luaL_argerror(L, idx, tf_last_error());
  return d;
}

tf_device tf_lua_checkdevice(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return tf_default_device();
  tf_device d;
  if (tf_device_parse(luaL_checkstring(L, idx), &d) != TF_OK) luaL_argerror(L, idx, tf_last_error());
  return d;
}

/* a and b alike but for case and underscores ("dmodel", "D_Model" and "d_model"). */
static bool tf_lua_near_name(const char *a, const char *b) {
  for (;;) {
    while (*a == '_') a++;
    while (*b == '_') b++;
    if (!*a || !*b) return !*a && !*b;
    char x = *a++, y = *b++;
    if (x >= 'A' && x <= 'Z') x = (char)(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = (char)(y - 'A' + 'a');
    if (x != y) return false;
  }
}

void tf_lua_checkkeys(lua_State *L, int idx, const char *fname, const char *const keys[]) {
  if (lua_isnoneornil(L, idx)) return;
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) {
    const char *msg = lua_pushfstring(L, "options must be a table, not %s", luaL_typename(L, idx));
    if (!fname) luaL_argerror(L, idx, msg);
    tf_lua_error(L, "%s: %s", fname, msg);
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *key = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    bool known = false;
    for (int i = 0; key && keys[i] && !known; i++) known = strcmp(key, keys[i]) == 0;
    if (known) continue;
    const char *near = NULL;
    for (int i = 0; key && keys[i] && !near; i++)
      if (tf_lua_near_name(key, keys[i])) near = keys[i];
    const char *name = luaL_tolstring(L, -1, NULL);
    lua_pushfstring(L, "unknown option '%s'%s%s%s; accepted: ", name, near ? " (did you mean " : "", near ? near : "",
                    near ? "?)" : "");
    int parts = 1;
    for (int i = 0; keys[i]; i++, parts += 2) {
      lua_pushstring(L, i ? ", " : "");
      lua_pushstring(L, keys[i]);
    }
    lua_concat(L, parts);
    if (!fname) luaL_argerror(L, idx, lua_tostring(L, -1));
    tf_lua_error(L, "%s: %s", fname, lua_tostring(L, -1));
  }
}

void tf_lua_checkopts(lua_State *L, int idx, tf_dtype *dtype, tf_device *device, tf_dtype default_dtype) {
  static const char *const keys[] = {"dtype", "device", NULL};
  *dtype = default_dtype;
  *device = tf_default_device();
  if (lua_isnoneornil(L, idx)) return;
  tf_lua_checkkeys(L, idx, NULL, keys);
  int top = lua_gettop(L);
  if (lua_getfield(L, idx, "dtype") != LUA_TNIL && tf_dtype_parse(luaL_tolstring(L, -1, NULL), dtype) != TF_OK)
    luaL_argerror(L, idx, tf_last_error());
  lua_settop(L, top);
  if (lua_getfield(L, idx, "device") != LUA_TNIL && tf_device_parse(luaL_tolstring(L, -1, NULL), device) != TF_OK)
    luaL_argerror(L, idx, tf_last_error());
  lua_settop(L, top);
}
