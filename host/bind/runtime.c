#include "runtime.h"

#include <lauxlib.h>
#include <lualib.h>
#include <string.h>

#include "bind.h"
#include "embedded.h"
#include "luahost.h"

/* package.preload's __index: the embedded module named by the key, compiled
 * when require first asks for it, so that the modules a run never loads
 * take no room on its Lua heap (TFHOST_LUA_MEMORY); nil for other names. */
static int tf_runtime_embedded(lua_State *L) {
  const char *name = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  for (int i = 0; name && tf_embedded_modules[i].name; i++) {
    const tf_embedded_module *m = &tf_embedded_modules[i];
    if (strcmp(m->name, name) != 0) continue;
    if (luaL_loadbuffer(L, (const char *)m->source, m->size, m->chunkname) != LUA_OK) return lua_error(L);
    return 1;
  }
  lua_pushnil(L);
  return 1;
}

/* The embedded modules are found through package.preload, where require
 * looks first; tf.core is the one entry of its own. */
void tf_runtime_open(lua_State *L) {
  luaL_openlibs(L);
  tf_lua_replace_error(L); /* errors point at the user's line, past tfhost's own frames */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_newtable(L);
  lua_pushcfunction(L, tf_runtime_embedded);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  lua_pushcfunction(L, luaopen_tf_core);
  lua_setfield(L, -2, "tf.core");
  lua_pop(L, 1);
  tf_lua_install_reclaim(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "tf");
  if (tf_lua_docall(L, 1, 1) != LUA_OK) lua_error(L);
  lua_setglobal(L, "tf");
}

void tf_runtime_add_script_dir(lua_State *L, const char *script) {
  if (!script) return;
  const char *slash = strrchr(script, '/');
  lua_getglobal(L, "package");
  if (slash)
    lua_pushlstring(L, script, (size_t)(slash - script) + (slash == script));
  else
    lua_pushliteral(L, ".");
  const char *dir = lua_tostring(L, -1);
  lua_getfield(L, -2, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -4, "path");
  lua_pop(L, 3);
}
