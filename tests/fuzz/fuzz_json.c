/* libFuzzer harness: tf.json.decode on any bytes. It must return a value or
 * raise "tf.json.decode: invalid JSON ..."; a value must encode (NaN policy
 * "null") to text that decodes again. Anything else is a finding. */
#include <string.h>

#include "fuzz_runtime.h"

static int tf_fuzz_json_round_trip(lua_State *L) {
  lua_getglobal(L, "tf");
  lua_getfield(L, -1, "json");
  lua_getfield(L, -1, "decode");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  int decoded = lua_gettop(L);
  lua_getfield(L, -3, "encode");
  lua_pushvalue(L, decoded);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "null");
  lua_setfield(L, -2, "nan");
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) return 0; /* a value JSON cannot hold (e.g. a sparse array): refused */
  lua_getfield(L, decoded - 1, "decode");
  lua_insert(L, -2);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) tf_fuzz_fail("encoded text does not decode", lua_tostring(L, -1));
  return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  lua_State *L = tf_fuzz_state();
  lua_settop(L, 0);
  lua_pushcfunction(L, tf_fuzz_json_round_trip);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    if (!msg || !strstr(msg, "tf.json.decode: invalid JSON")) tf_fuzz_fail("unexpected error", msg);
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
