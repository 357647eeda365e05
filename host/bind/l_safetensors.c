/* tf.safetensors: load, save and inspect safetensors files.
 *
 * The reading, checking and writing live in host/io/safetensors.c; this
 * file turns Lua tables into name and tensor lists and back. Files are
 * written with tensors in sorted name order, so saving the same tensors
 * always gives the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "safe.h"
#include "safetensors.h"

static void tf_st_free(void *file) { tf_safetensors_free(file); }

/* A file read by the core, owned by a userdata so that a Lua error part way
 * through building the result still frees it. */

/* The file's metadata as a table of strings, less tfhost's checksums
 * (read_header gives each tensor's; save writes new ones). */
static void tf_st_push_metadata(lua_State *L, const tf_safetensors_file *f) {
  lua_createtable(L, 0, f->nmeta);
  for (int i = 0; i < f->nmeta; i++) {
    if (strcmp(f->meta_keys[i], "tfhost.xxh64") == 0) continue;
    lua_pushstring(L, f->meta_values[i]);
    lua_setfield(L, -2, f->meta_keys[i]);
  }
}

/* The options of load: {device = "cpu" | "cuda:N" | ...}. */
static tf_device tf_st_checkopts(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return tf_default_device();
  static const char *const keys[] = {"device", NULL};
  tf_lua_checkkeys(L, idx, NULL, keys);
  lua_getfield(L, idx, "device");
  tf_device d = tf_default_device();
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, idx, "option device must be a string");
    if (tf_device_parse(lua_tostring(L, -1), &d) != TF_OK) luaL_argerror(L, idx, tf_last_error());
  }
  lua_pop(L, 1);
  return d;
}

/* tf.safetensors.load(path [, {device = ...}]) -> {name = tensor}, metadata */
static int tf_l_st_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tf_safe_check_path(L, path, false, "tf.safetensors.load");
  tf_device device = tf_st_checkopts(L, 2);
  void **owned = tf_lua_push_owner(L, tf_st_free);
  tf_safetensors_file *f = NULL;
  TF_LUA_CHECK(L, tf_safetensors_read(path, device, &f), "tf.safetensors.load");
  *owned = f;
  lua_createtable(L, 0, f->ntensors);
  for (int i = 0; i < f->ntensors; i++) {
    tf_lua_pushtensor(L, f->tensors[i].tensor);
    f->tensors[i].tensor = NULL; /* the userdata owns the reference now */
    lua_setfield(L, -2, f->tensors[i].name);
  }
  tf_st_push_metadata(L, f);
  return 2;
}

/* tf.safetensors.read_header(path) -> {name = {dtype =, shape =, offsets =}}, metadata */
static int tf_l_st_read_header(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tf_safe_check_path(L, path, false, "tf.safetensors.read_header");
  void **owned = tf_lua_push_owner(L, tf_st_free);
  tf_safetensors_file *f = NULL;
  TF_LUA_CHECK(L, tf_safetensors_read_header(path, &f), "tf.safetensors.read_header");
  *owned = f;
  lua_createtable(L, 0, f->ntensors);
  for (int i = 0; i < f->ntensors; i++) {
    const tf_safetensors_entry *e = &f->tensors[i];
    lua_createtable(L, 0, 3);
    lua_pushstring(L, e->file_dtype);
    lua_setfield(L, -2, "dtype");
    lua_createtable(L, e->shape.ndim, 0);
    for (int d = 0; d < e->shape.ndim; d++) {
      lua_pushinteger(L, (lua_Integer)e->shape.dims[d]);
      lua_rawseti(L, -2, d + 1);
    }
    luaL_setmetatable(L, "tf.Shape");
    lua_setfield(L, -2, "shape");
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, (lua_Integer)e->begin);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, (lua_Integer)e->end);
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "offsets");
    if (e->has_checksum) {
      char hex[17];
      snprintf(hex, sizeof hex, "%016llx", (unsigned long long)e->checksum);
      lua_pushstring(L, hex);
      lua_setfield(L, -2, "xxh64");
    }
    lua_setfield(L, -2, e->name);
  }
  tf_st_push_metadata(L, f);
  return 2;
}

typedef struct tf_st_named {
  const char *name;
  tf_tensor *tensor;
  const char *value; /* metadata */
} tf_st_named;

static int tf_st_cmp_named(const void *a, const void *b) {
  return strcmp(((const tf_st_named *)a)->name, ((const tf_st_named *)b)->name);
}

/* The string key at -2 of a lua_next walk, refusing embedded NUL bytes. */
static const char *tf_st_key(lua_State *L, const char *path, const char *what) {
  if (lua_type(L, -2) != LUA_TSTRING)
    tf_lua_error(L, "tf.safetensors.save: %s: %s must be strings, not %s", path, what, luaL_typename(L, -2));
  size_t len;
  const char *key = lua_tolstring(L, -2, &len);
  if (strlen(key) != len) tf_lua_error(L, "tf.safetensors.save: %s: %s must not contain NUL bytes", path, what);
  return key;
}

/* tf.safetensors.save(path, {name = tensor} [, {key = string} [, {checksums = false}]]) */
static int tf_l_st_save(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tf_safe_check_path(L, path, true, "tf.safetensors.save");
  luaL_checktype(L, 2, LUA_TTABLE);
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  bool checksums = false;
  if (!lua_isnoneornil(L, 4)) {
    static const char *const keys[] = {"checksums", NULL};
    tf_lua_checkkeys(L, 4, NULL, keys);
    lua_getfield(L, 4, "checksums");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1)) luaL_argerror(L, 4, "option checksums must be true or false");
    checksums = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_settop(L, 3);

  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    lua_pop(L, 1);
    n++;
  }
  tf_st_named *tensors = lua_newuserdatauv(L, sizeof *tensors * (size_t)(n ? n : 1), 0);
  int i = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    const char *name = tf_st_key(L, path, "tensor names");
    tf_tensor *t = tf_lua_totensor(L, -1);
    if (!t)
      tf_lua_error(L, "tf.safetensors.save: %s: '%s' is %s", path, name,
                 luaL_testudata(L, -1, TF_TENSOR_TYPE) ? "a freed tensor" : luaL_typename(L, -1));
    tensors[i++] = (tf_st_named){name, t, NULL}; /* the name stays anchored in the table */
    lua_pop(L, 1);
  }
  qsort(tensors, (size_t)n, sizeof *tensors, tf_st_cmp_named);

  /* Metadata values as strings, anchored in a table of their own. */
  int nmeta = 0;
  lua_newtable(L);
  int strings = lua_gettop(L);
  if (!lua_isnil(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      const char *key = tf_st_key(L, path, "metadata keys");
      int type = lua_type(L, -1);
      if (type != LUA_TSTRING && type != LUA_TNUMBER)
        tf_lua_error(L, "tf.safetensors.save: %s: metadata value of '%s' must be a string or a number, not %s", path,
                   key, luaL_typename(L, -1));
      size_t len;
      const char *value = luaL_tolstring(L, -1, &len);
      if (strlen(value) != len)
        tf_lua_error(L, "tf.safetensors.save: %s: metadata value of '%s' must not contain NUL bytes", path, key);
      lua_setfield(L, strings, key);
      lua_pop(L, 1);
      nmeta++;
    }
  }
  tf_st_named *meta = lua_newuserdatauv(L, sizeof *meta * (size_t)(nmeta ? nmeta : 1), 0);
  i = 0;
  lua_pushnil(L);
  while (lua_next(L, strings)) {
    meta[i++] = (tf_st_named){lua_tostring(L, -2), NULL, lua_tostring(L, -1)};
    lua_pop(L, 1);
  }
  qsort(meta, (size_t)nmeta, sizeof *meta, tf_st_cmp_named);

  /* The core takes parallel arrays. */
  int total = n + nmeta;
  const char **lists = lua_newuserdatauv(L, sizeof *lists * (size_t)(2 * total + 1), 0);
  tf_tensor **list_tensors = lua_newuserdatauv(L, sizeof *list_tensors * (size_t)(n ? n : 1), 0);
  const char **names = lists, **keys = lists + n, **values = lists + n + nmeta;
  for (i = 0; i < n; i++) {
    names[i] = tensors[i].name;
    list_tensors[i] = tensors[i].tensor;
  }
  for (i = 0; i < nmeta; i++) {
    keys[i] = meta[i].name;
    values[i] = meta[i].value;
  }
  TF_LUA_CHECK(L, tf_safetensors_write(path, names, list_tensors, n, keys, values, nmeta, checksums),
               "tf.safetensors.save");
  return 0;
}

/* tf.safetensors.load_into(path, {name = tensor}) -> metadata: the named
 * tensors of the file read into the given ones (same dtype and shape). */
static int tf_l_st_load_into(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tf_safe_check_path(L, path, false, "tf.safetensors.load_into");
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    lua_pop(L, 1);
    n++;
  }
  const char **names = lua_newuserdatauv(L, sizeof *names * (size_t)(n ? n : 1), 0);
  tf_tensor **dsts = lua_newuserdatauv(L, sizeof *dsts * (size_t)(n ? n : 1), 0);
  int i = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      tf_lua_error(L, "tf.safetensors.load_into: %s: tensor names must be strings, not %s", path, luaL_typename(L, -2));
    names[i] = lua_tostring(L, -2);
    dsts[i] = tf_lua_totensor(L, -1);
    if (!dsts[i])
      tf_lua_error(L, "tf.safetensors.load_into: %s: '%s' is %s", path, names[i],
                   luaL_testudata(L, -1, TF_TENSOR_TYPE) ? "a freed tensor" : luaL_typename(L, -1));
    i++;
    lua_pop(L, 1);
  }
  void **owned = tf_lua_push_owner(L, tf_st_free);
  tf_safetensors_file *f = NULL;
  TF_LUA_CHECK(L, tf_safetensors_read_into(path, names, dsts, n, &f), "tf.safetensors.load_into");
  *owned = f;
  tf_st_push_metadata(L, f);
  return 1;
}

static const luaL_Reg tf_safetensors_functions[] = {
    {"load_into", tf_l_st_load_into},
    {"load", tf_l_st_load},
    {"save", tf_l_st_save},
    {"read_header", tf_l_st_read_header},
    {NULL, NULL},
};

void tf_open_safetensors(lua_State *L) {
  luaL_newlib(L, tf_safetensors_functions);
  lua_setfield(L, -2, "safetensors");
}
