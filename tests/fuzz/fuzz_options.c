/* libFuzzer harness: tf.options parsing a script's arguments. The input's
 * lines are the arguments, parsed against a declaration of every option
 * type. The parse must give values or a usage error (a tf.exit request with
 * code 2, or 0 for --help); any other error is a finding. */
#include <string.h>

#include "fuzz_runtime.h"

static const char tf_fuzz_declare[] =
    "local argv = ...\n"
    "return tf.options({ description = 'fuzz',\n"
    "  {'name', 'a string', default = 'x'},\n"
    "  {'steps', 'an int', default = 3, type = 'int'},\n"
    "  {'rate', 'a number', default = 0.5, type = 'number'},\n"
    "  {'verbose', 'a flag', type = 'bool'},\n"
    "  {'sizes', 'a list', default = 'a,b', type = 'list'},\n"
    "  {'ctx', 'ints', default = '1,2', type = 'list:int'},\n"
    "  {'scales', 'numbers', default = '1.5', type = 'list:number'},\n"
    "  {'precision', 'a choice', default = 'f32', choices = {'f32', 'bf16'}},\n"
    "}, argv)\n";

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  static int ref = LUA_NOREF;
  lua_State *L = tf_fuzz_state();
  lua_settop(L, 0);
  if (ref == LUA_NOREF) {
    if (luaL_loadstring(L, tf_fuzz_declare) != LUA_OK) tf_fuzz_fail("harness chunk", lua_tostring(L, -1));
    ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  lua_newtable(L);
  size_t start = 0;
  lua_Integer n = 0;
  for (size_t i = 0; i <= size; i++) {
    if (i == size || data[i] == '\n') {
      lua_pushlstring(L, (const char *)data + start, i - start);
      lua_rawseti(L, -2, ++n);
      start = i + 1;
    }
  }
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    int code = -1;
    lua_getglobal(L, "tostring");
    lua_pushvalue(L, -2);
    lua_call(L, 1, 1);
    const char *text = lua_tostring(L, -1);
    if (!text || sscanf(text, "tf.exit(%d)", &code) != 1 || (code != 0 && code != 2))
      tf_fuzz_fail("not a usage error", text);
  } else if (!lua_istable(L, -1)) {
    tf_fuzz_fail("options", "tf.options returned no table");
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
