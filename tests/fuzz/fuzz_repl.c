/* libFuzzer harness: the REPL's chunk handling (host/app/repl_input.c). The
 * input's lines are typed at the prompt; each chunk must compile or fail
 * with a message (a syntax error, or "C stack overflow" for nesting past
 * the parser's limit), leaving exactly one value on the stack, and every
 * line must be consumed. Chunks are compiled, never run. */
#include <string.h>

#include "fuzz_runtime.h"
#include "repl_input.h"

typedef struct tf_fuzz_lines {
  const unsigned char *data;
  size_t size, at;
} tf_fuzz_lines;

static int tf_fuzz_read(lua_State *L, const char *prompt, void *ud) {
  (void)prompt;
  tf_fuzz_lines *in = ud;
  if (in->at > in->size || (in->at == in->size && in->size > 0)) return 0;
  size_t end = in->at;
  while (end < in->size && in->data[end] != '\n') end++;
  lua_pushlstring(L, (const char *)in->data + in->at, end - in->at);
  in->at = end + 1;
  return 1;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  lua_State *L = tf_fuzz_state();
  tf_fuzz_lines lines = {data, size, 0};
  const tf_repl_input input = {tf_fuzz_read, NULL, &lines};
  int status;
  while ((status = tf_repl_load(L, &input)) != -1) {
    if (lua_gettop(L) != 1) tf_fuzz_fail("stack", "a chunk left other than one value");
    if (status == LUA_OK ? !lua_isfunction(L, 1) : !lua_isstring(L, 1))
      tf_fuzz_fail("result", "neither a function nor a message");
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
