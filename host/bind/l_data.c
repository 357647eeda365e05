/* tf._data, the C half of tf.data (lua/tf/data.lua is built on it): token
 * files mapped read-only (host/io/tokens.c) as tf.TokenFile, the gather of
 * windows into batch tensors, and a folder's listing (host/io/folders.c)
 * for the scripts that make datasets. Options, the generator of offsets
 * and the iterators are the Lua half's. */
#include <stdlib.h>

#include "bind.h"
#include "folders.h"
#include "safe.h"
#include "tokens.h"

#define TF_TOKEN_FILE_TYPE "tf.TokenFile"

typedef struct tf_lua_token_file {
  tf_token_file *f; /* NULL once closed */
} tf_lua_token_file;

static tf_token_file *tf_l_checktokens(lua_State *L) {
  tf_lua_token_file *u = luaL_checkudata(L, 1, TF_TOKEN_FILE_TYPE);
  if (!u->f) tf_lua_error(L, "tf.data: the token file has been closed");
  return u->f;
}

/* tf._data.open(path, npy, dtype) -> tf.TokenFile; dtype names the raw type (unused for .npy). */
static int tf_l_data_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  bool npy = lua_toboolean(L, 2);
  const char *dtype = luaL_optstring(L, 3, "u16");
  tf_safe_check_path(L, path, false, "tf.data.tokens");
  tf_token_type type = TF_TOK_U16;
  TF_LUA_CHECK(L, tf_token_type_parse(dtype, &type), "tf.data.tokens");
  tf_lua_token_file *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->f = NULL;
  luaL_setmetatable(L, TF_TOKEN_FILE_TYPE);
  TF_LUA_CHECK(L, tf_token_file_open(path, npy, type, &u->f), "tf.data.tokens");
  return 1;
}

/* file:info() -> count, dtype, path */
static int tf_l_tokens_info(lua_State *L) {
  tf_token_file *f = tf_l_checktokens(L);
  lua_pushinteger(L, (lua_Integer)f->count);
  lua_pushstring(L, tf_token_type_name(f->type));
  lua_pushstring(L, f->path);
  return 3;
}

/* file:windows(starts, length, vocab_size, device, who) -> inputs, targets:
 * starts is a list of token positions (from 0), vocab_size 0 checks only
 * for negative tokens, device a string or nil (the default device). */
static int tf_l_tokens_windows(lua_State *L) {
  tf_token_file *f = tf_l_checktokens(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_Integer length = luaL_checkinteger(L, 3);
  lua_Integer vocab = luaL_optinteger(L, 4, 0);
  tf_device device = tf_lua_checkdevice(L, 5);
  const char *who = luaL_optstring(L, 6, "tf.data");
  lua_Integer rows = luaL_len(L, 2);
  if (rows < 1 || rows > (1 << 30)) return tf_lua_error(L, "%s: expected 1 or more window starts", who);
  int64_t *starts = lua_newuserdatauv(L, sizeof *starts * (size_t)rows, 0);
  for (lua_Integer r = 0; r < rows; r++) {
    lua_rawgeti(L, 2, r + 1);
    int ok;
    starts[r] = (int64_t)lua_tointegerx(L, -1, &ok);
    if (!ok) return tf_lua_error(L, "%s: window start %d is not an integer", who, (int)(r + 1));
    lua_pop(L, 1);
  }
  tf_tensor *inputs, *targets;
  TF_LUA_CHECK(L, tf_token_file_windows(f, starts, (int64_t)rows, (int64_t)length, (int64_t)vocab, device, &inputs,
                                        &targets), who);
  tf_lua_pushtensor(L, inputs);
  tf_lua_pushtensor(L, targets);
  return 2;
}

/* file:check(vocab_size) -> nil, or the position of the first bad token and its message */
static int tf_l_tokens_check(lua_State *L) {
  tf_token_file *f = tf_l_checktokens(L);
  lua_Integer vocab = luaL_optinteger(L, 2, 0);
  int64_t bad;
  TF_LUA_CHECK(L, tf_token_file_check(f, (int64_t)vocab, &bad), "ds:check");
  if (bad < 0) return 0;
  lua_pushinteger(L, (lua_Integer)bad);
  tf_token_file_bad_token(f, bad, (int64_t)vocab);
  lua_pushstring(L, tf_last_error());
  return 2;
}


/* close(), <close> and __gc: the mapping goes; harmless the second time. */
static int tf_l_tokens_release(lua_State *L) {
  tf_lua_token_file *u = luaL_checkudata(L, 1, TF_TOKEN_FILE_TYPE);
  tf_token_file_close(u->f);
  u->f = NULL;
  return 0;
}

static int tf_l_tokens_tostring(lua_State *L) {
  tf_lua_token_file *u = luaL_checkudata(L, 1, TF_TOKEN_FILE_TYPE);
  if (!u->f) lua_pushstring(L, "tf.TokenFile(closed)");
  else lua_pushfstring(L, "tf.TokenFile(%s, %s, %I tokens)", u->f->path, tf_token_type_name(u->f->type),
                       (lua_Integer)u->f->count);
  return 1;
}

static void tf_folder_owner_free(void *f) { tf_folder_free(f); }

/* tf._data.list(path) -> {{name =, folder = bool}, ...}, in the system's order */
static int tf_l_data_list(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tf_safe_check_path(L, path, false, "tf.data");
  void **owned = tf_lua_push_owner(L, tf_folder_owner_free);
  tf_folder *folder;
  TF_LUA_CHECK(L, tf_folder_read(path, &folder), "tf.data");
  *owned = folder;
  lua_createtable(L, folder->n, 0);
  for (int i = 0; i < folder->n; i++) {
    lua_createtable(L, 0, 2);
    TF_SET_STR(L, "name", folder->entries[i].name);
    TF_SET_BOOL(L, "folder", folder->entries[i].is_folder);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

void tf_open_data(lua_State *L) {
  static const luaL_Reg meta[] = {
      {"__gc", tf_l_tokens_release},
      {"__close", tf_l_tokens_release},
      {"__tostring", tf_l_tokens_tostring},
      {NULL, NULL},
  };
  static const luaL_Reg methods[] = {
      {"info", tf_l_tokens_info},   {"windows", tf_l_tokens_windows}, {"check", tf_l_tokens_check},
      {"close", tf_l_tokens_release}, {NULL, NULL},
  };
  static const luaL_Reg functions[] = {{"open", tf_l_data_open}, {"list", tf_l_data_list}, {NULL, NULL}};
  tf_lua_newclass(L, TF_TOKEN_FILE_TYPE, meta, methods);
  luaL_newlib(L, functions);
  lua_setfield(L, -2, "_data");
}
