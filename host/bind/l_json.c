/* tf.json: JSON through cJSON.
 *
 * Encoding: Lua integers stay integers (written exactly), floats are
 * written so they read back bit-identical and always look like floats
 * ("1.0"), object keys are sorted so the same table always gives the same
 * text, and NaN / infinity are handled by an explicit policy. Decoding: JSON
 * null becomes tf.json.null (so arrays keep their length); numbers that are
 * integral and within 2^53 become Lua integers. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bind.h"

enum { TF_JSON_MAX_DEPTH = 200 };

/* The JSON null sentinel: a unique light userdata. */
static const char tf_json_null_tag = 0;
#define TF_JSON_NULL ((void *)&tf_json_null_tag)

typedef enum { TF_NAN_NULL, TF_NAN_STRING, TF_NAN_ERROR } tf_nan_policy;

static void tf_json_delete(void *root) { cJSON_Delete(root); }

/* A cJSON tree owned by a userdata, so a Lua error mid-way frees it. */
static void **tf_json_push_holder(lua_State *L) { return tf_lua_push_owner(L, tf_json_delete); }

/* ---- encode ------------------------------------------------------------ */

typedef struct tf_json_enc {
  tf_nan_policy nan;
  bool sort_keys;
} tf_json_enc;

static cJSON *tf_json_number(lua_State *L, int idx, const tf_json_enc *enc) {
  char buf[64];
  if (lua_isinteger(L, idx)) {
    snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(L, idx));
    return cJSON_CreateRaw(buf);
  }
  double v = lua_tonumber(L, idx);
  if (!isfinite(v)) {
    if (enc->nan == TF_NAN_ERROR)
      tf_lua_error(L, "tf.json.encode: %s cannot be written as JSON (option nan = \"null\" or \"string\")",
                 isnan(v) ? "NaN" : "infinity");
    if (enc->nan == TF_NAN_NULL) return cJSON_CreateNull();
    return cJSON_CreateString(isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
  }
  snprintf(buf, sizeof buf, "%.15g", v);
  if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
  if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
  return cJSON_CreateRaw(buf);
}

/* How a table is written: a marker in its metatable (__jsontype = "array" |
 * "object") wins; otherwise a non-empty sequence is an array. */
static bool tf_json_is_array(lua_State *L, int idx) {
  if (luaL_getmetafield(L, idx, "__jsontype") != LUA_TNIL) {
    bool arr = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "array") == 0;
    lua_pop(L, 1);
    return arr;
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx), count = 0;
  if (n == 0) return false;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    count++;
  }
  return count == n;
}

static cJSON *tf_json_value(lua_State *L, int idx, const tf_json_enc *enc, int depth);

static int tf_json_key_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static cJSON *tf_json_object(lua_State *L, int idx, const tf_json_enc *enc, int depth) {
  /* Collect keys (as strings) into a Lua table at the top, then sort. */
  int nkeys = 0;
  lua_newtable(L);
  int keys = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) {
      lua_pushvalue(L, -1);
    } else if (lua_isinteger(L, -1)) {
      lua_pushfstring(L, "%I", lua_tointeger(L, -1));
    } else {
      tf_lua_error(L, "tf.json.encode: object keys must be strings or integers, not %s", luaL_typename(L, -1));
    }
    lua_rawseti(L, keys, ++nkeys);
  }
  const char **names = lua_newuserdatauv(L, sizeof(char *) * (size_t)(nkeys ? nkeys : 1), 0);
  for (int i = 0; i < nkeys; i++) {
    lua_rawgeti(L, keys, i + 1);
    names[i] = lua_tostring(L, -1); /* anchored in `keys` */
    lua_pop(L, 1);
  }
  if (enc->sort_keys) qsort(names, (size_t)nkeys, sizeof *names, tf_json_key_cmp);
  cJSON *obj = cJSON_CreateObject();
  void **h = tf_json_push_holder(L);
  *h = obj;
  for (int i = 0; i < nkeys; i++) {
    lua_getfield(L, idx, names[i]);
    if (lua_isnil(L, -1)) { /* an integer key */
      lua_pop(L, 1);
      lua_pushinteger(L, strtoll(names[i], NULL, 10));
      lua_rawget(L, idx);
    }
    cJSON_AddItemToObject(obj, names[i], tf_json_value(L, lua_gettop(L), enc, depth + 1));
    lua_pop(L, 1);
  }
  *h = NULL;
  lua_settop(L, keys - 1);
  return obj;
}

static cJSON *tf_json_value(lua_State *L, int idx, const tf_json_enc *enc, int depth) {
  if (depth > TF_JSON_MAX_DEPTH) tf_lua_error(L, "tf.json.encode: nested too deeply (is there a cycle?)");
  luaL_checkstack(L, 8, "tf.json.encode: nested too deeply");
  switch (lua_type(L, idx)) {
    case LUA_TNIL: return cJSON_CreateNull();
    case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
    case LUA_TNUMBER: return tf_json_number(L, idx, enc);
    case LUA_TSTRING: return cJSON_CreateString(lua_tostring(L, idx));
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) == TF_JSON_NULL) return cJSON_CreateNull();
      break;
    case LUA_TTABLE: {
      if (!tf_json_is_array(L, idx)) return tf_json_object(L, idx, enc, depth);
      cJSON *arr = cJSON_CreateArray();
      void **h = tf_json_push_holder(L);
      *h = arr;
      lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
      for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        cJSON_AddItemToArray(arr, tf_json_value(L, lua_gettop(L), enc, depth + 1));
        lua_pop(L, 1);
      }
      *h = NULL;
      lua_pop(L, 1);
      return arr;
    }
    default: break;
  }
  tf_lua_error(L, "tf.json.encode: cannot encode a %s", luaL_typename(L, idx));
  return NULL;
}

/* tf.json.encode(value [, {indent = bool, sort_keys = bool, nan = "null"|"string"|"error"}]) */
static int tf_l_json_encode(lua_State *L) {
  luaL_checkany(L, 1);
  tf_json_enc enc = {TF_NAN_NULL, true};
  bool indent = false;
  if (!lua_isnoneornil(L, 2)) {
    static const char *const keys[] = {"indent", "sort_keys", "nan", NULL};
    luaL_checktype(L, 2, LUA_TTABLE);
    tf_lua_checkkeys(L, 2, "tf.json.encode", keys);
    lua_getfield(L, 2, "indent");
    indent = lua_toboolean(L, -1);
    lua_getfield(L, 2, "sort_keys");
    if (!lua_isnil(L, -1)) enc.sort_keys = lua_toboolean(L, -1);
    lua_getfield(L, 2, "nan");
    if (!lua_isnil(L, -1)) {
      static const char *const policies[] = {"null", "string", "error", NULL};
      enc.nan = (tf_nan_policy)luaL_checkoption(L, -1, NULL, policies);
    }
    lua_pop(L, 3);
  }
  lua_settop(L, 1);
  void **h = tf_json_push_holder(L);
  *h = tf_json_value(L, 1, &enc, 0);
  char *text = indent ? cJSON_Print(*h) : cJSON_PrintUnformatted(*h);
  if (!text) return tf_lua_error(L, "out of memory: no host memory for the text (in tf.json.encode)");
  lua_pushstring(L, text);
  cJSON_free(text);
  return 1;
}

/* ---- decode ------------------------------------------------------------ */

static void tf_json_push(lua_State *L, const cJSON *item, int depth) {
  luaL_checkstack(L, 4, "tf.json.decode: nested too deeply");
  if (cJSON_IsNull(item)) {
    lua_pushlightuserdata(L, TF_JSON_NULL);
  } else if (cJSON_IsBool(item)) {
    lua_pushboolean(L, cJSON_IsTrue(item));
  } else if (cJSON_IsNumber(item)) {
    double v = item->valuedouble;
    if (v == floor(v) && fabs(v) <= 9007199254740992.0)
      lua_pushinteger(L, (lua_Integer)v);
    else
      lua_pushnumber(L, v);
  } else if (cJSON_IsString(item)) {
    lua_pushstring(L, item->valuestring);
  } else if (cJSON_IsArray(item)) {
    lua_createtable(L, cJSON_GetArraySize(item), 0);
    lua_Integer i = 1;
    for (const cJSON *c = item->child; c; c = c->next) {
      tf_json_push(L, c, depth + 1);
      lua_rawseti(L, -2, i++);
    }
  } else if (cJSON_IsObject(item)) {
    lua_newtable(L);
    for (const cJSON *c = item->child; c; c = c->next) {
      tf_json_push(L, c, depth + 1);
      lua_setfield(L, -2, c->string);
    }
  } else {
    lua_pushnil(L);
  }
}

/* tf.json.decode(text) -> value */
static int tf_l_json_decode(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  void **h = tf_json_push_holder(L);
  const char *end = NULL;
  *h = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  const char *bad = NULL;
  if (!*h) {
    bad = cJSON_GetErrorPtr();
  } else {
    while (end && (size_t)(end - text) < len && strchr(" \t\r\n", *end)) end++;
    if (end && (size_t)(end - text) < len) bad = end;
  }
  if (bad) {
    size_t at = bad >= text && (size_t)(bad - text) <= len ? (size_t)(bad - text) : len;
    return tf_lua_error(L, "tf.json.decode: invalid JSON at byte %d near '%s'", (int)at + 1,
                      lua_pushlstring(L, text + at, len - at < 20 ? len - at : 20) ? lua_tostring(L, -1) : "");
  }
  tf_json_push(L, *h, 0);
  return 1;
}

static const luaL_Reg tf_json_functions[] = {
    {"encode", tf_l_json_encode},
    {"decode", tf_l_json_decode},
    {NULL, NULL},
};

void tf_open_json(lua_State *L) {
  luaL_newlib(L, tf_json_functions);
  lua_pushlightuserdata(L, TF_JSON_NULL);
  lua_setfield(L, -2, "null");
  lua_setfield(L, -2, "json");
}
