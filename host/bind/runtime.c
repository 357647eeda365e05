#include "runtime.h"

#include <lauxlib.h>
#include <lualib.h>
#include <string.h>

#include "bind.h"
#include "embedded.h"
#include "luahost.h"

/* Every embedded module is compiled now and its chunk placed in
 * package.preload, where require finds and runs it. */
void tf_runtime_open(lua_State *L) {
  luaL_openlibs(L);
  tf_lua_replace_error(L); /* errors point at the user's line, past tfhost's own frames */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (int i = 0; tf_embedded_modules[i].name; i++) {
    const tf_embedded_module *m = &tf_embedded_modules[i];
    if (luaL_loadbuffer(L, (const char *)m->source, m->size, m->chunkname) != LUA_OK) lua_error(L);
    lua_setfield(L, -2, m->name);
  }
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
