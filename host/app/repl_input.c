#include "repl_input.h"

#include <lauxlib.h>
#include <string.h>

#define TF_EOFMARK "<eof>"

static void tf_accept(const tf_repl_input *in, const char *text) {
  if (in->accepted) in->accepted(text, in->ud);
}

/* Whether a syntax error only says that input ended too early. */
static int tf_incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  size_t mark = sizeof(TF_EOFMARK) - 1;
  if (len >= mark && strcmp(msg + len - mark, TF_EOFMARK) == 0) {
    lua_pop(L, 1);
    return 1;
  }
  return 0;
}

/* Tries "return <line>" so that expressions print their value. */
static int tf_try_return(lua_State *L, const tf_repl_input *in) {
  size_t len;
  const char *line = lua_tolstring(L, -1, &len);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "return ");
  luaL_addlstring(&b, line, len); /* the whole line: it may hold NUL bytes */
  luaL_addchar(&b, ';');
  luaL_pushresult(&b);
  size_t rlen;
  const char *retline = lua_tolstring(L, -1, &rlen);
  int status = luaL_loadbufferx(L, retline, rlen, "=stdin", "t");
  if (status == LUA_OK) {
    lua_remove(L, -2); /* the "return" text */
    tf_accept(in, line);
  } else {
    lua_pop(L, 2); /* error and the "return" text */
  }
  return status;
}

/* Reads lines until they form a complete chunk (or a real syntax error). */
static int tf_multiline(lua_State *L, const tf_repl_input *in) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbufferx(L, line, len, "=stdin", "t");
    if (!tf_incomplete(L, status)) {
      tf_accept(in, line);
      return status;
    }
    int got = in->read(L, TF_PROMPT2, in->ud);
    if (got == TF_REPL_READ_INTERRUPTED) return TF_REPL_DISCARDED;
    if (!got) {
      lua_pushliteral(L, "stdin: incomplete statement at the end of input");
      return LUA_ERRSYNTAX;
    }
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3);
  }
}

int tf_repl_load(lua_State *L, const tf_repl_input *in) {
  lua_settop(L, 0);
  int got = in->read(L, TF_PROMPT, in->ud);
  if (got == TF_REPL_READ_INTERRUPTED) return TF_REPL_DISCARDED;
  if (!got) return TF_REPL_END;
  int status = tf_try_return(L, in);
  if (status != LUA_OK) status = tf_multiline(L, in);
  if (status == TF_REPL_DISCARDED)
    lua_settop(L, 0); /* the lines typed so far */
  else
    lua_remove(L, 1); /* the line text */
  return status;
}
