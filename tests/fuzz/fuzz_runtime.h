/* The tfhost runtime a fuzzing harness drives: one Lua state with tf open,
 * made once per process (opening it per input would measure start-up, not
 * the parser). A harness that finds the state changed is itself broken. */
#ifndef TF_FUZZ_RUNTIME_H
#define TF_FUZZ_RUNTIME_H

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends.h"
#include "luahost.h"
#include "runtime.h"

static int tf_fuzz_open(lua_State *L) {
  tf_runtime_open(L);
  return 0;
}

/* The shared state; aborts when the runtime cannot open (a broken build). */
static lua_State *tf_fuzz_state(void) {
  static lua_State *L;
  if (L) return L;
  tf_backends_init();
  L = tf_lua_newstate((size_t)1 << 30);
  lua_pushcfunction(L, tf_fuzz_open);
  if (!L || lua_pcall(L, 0, 0, 0) != LUA_OK) {
    fprintf(stderr, "fuzz: cannot open the tf runtime: %s\n", L ? lua_tostring(L, -1) : "no memory");
    abort();
  }
  return L;
}

/* A finding: prints why and aborts, which libFuzzer reports with the input. */
static void tf_fuzz_fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz: %s: %s\n", what, detail ? detail : "(no message)");
  abort();
}

#endif
