/* Running Lua code from C the way lua.c does: every call goes through one
 * protected-call helper with a traceback message handler and a Ctrl-C hook,
 * and errors are reported as "file:line: message" plus a traceback. */
#ifndef TF_LUAHOST_H
#define TF_LUAHOST_H

#include <lua.h>
#include <stdbool.h>
#include <stddef.h>

#include "exit_codes.h"

/* A new state with a counting allocator capped at `heap_limit` bytes (0 for
 * none) and the standard libraries open. NULL when even that fails. */
lua_State *tf_lua_newstate(size_t heap_limit);
/* lua_close, and frees the allocator's bookkeeping. */
void tf_lua_close(lua_State *L);
/* The cap in bytes and the bytes now in use. */
size_t tf_lua_heap_limit(lua_State *L);
size_t tf_lua_heap_used(lua_State *L);

/* Calls the function below narg arguments on the stack, protected, with a
 * traceback handler; Ctrl-C interrupts it. Returns a lua_pcall status. */
int tf_lua_docall(lua_State *L, int narg, int nres);

/* Prints the error on top of the stack (if status is an error) to stderr,
 * prefixed by the program name, and pops it. Returns status. */
int tf_lua_report(lua_State *L, int status);

/* When a kernel fault made the CUDA context unusable: says so on stderr, with what is known of the
 * kernel, and ends the process with exit code 1 (TF_EXIT_SCRIPT) at once. tf_lua_report calls it
 * after every error it prints; main calls it when a script ends. */
void tf_lua_exit_if_context_lost(void);

/* The error value on top of the stack is a tf.Exit request (tf.exit or a
 * usage error from tf.options): its code, after printing its message. */
bool tf_lua_exit_request(lua_State *L, int *code);

/* Raises a tf.Exit request: the process ends with code after printing msg
 * (NULL: nothing), unwinding Lua first. Never returns. */
int tf_lua_exit_error(lua_State *L, int code, const char *msg);

#endif
