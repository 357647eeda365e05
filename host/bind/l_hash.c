/* Fingerprints for results files: SHA-256 of a string or a file, and the
 * path of the running tfhost binary. */
#include <limits.h>
#include <unistd.h>

#include "bind.h"
#include "sha256.h"

/* tf.sha256(text) -> 64 hex digits. */
static int tf_l_sha256(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  tf_sha256 h;
  tf_sha256_init(&h);
  tf_sha256_update(&h, s, n);
  char hex[65];
  tf_sha256_hex(&h, hex);
  lua_pushstring(L, hex);
  return 1;
}

/* tf.sha256_file(path) -> 64 hex digits; a file that cannot be read is an error. */
static int tf_l_sha256_file(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  char hex[65];
  TF_LUA_CHECK(L, tf_sha256_file(path, hex), "tf.sha256_file");
  lua_pushstring(L, hex);
  return 1;
}

/* tf.executable() -> the absolute path of the tfhost binary, or nil where the system does not say. */
static int tf_l_executable(lua_State *L) {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushlstring(L, path, (size_t)n);
  return 1;
}

static const luaL_Reg tf_hash_functions[] = {
    {"sha256", tf_l_sha256},
    {"sha256_file", tf_l_sha256_file},
    {"executable", tf_l_executable},
    {NULL, NULL},
};

void tf_open_hash(lua_State *L) { luaL_setfuncs(L, tf_hash_functions, 0); }
