/* The REPL's chunk handling, apart from where its lines come from (a
 * terminal, a pipe, or a fuzzing harness): a line is first tried as
 * `return <line>` so expressions print; input that ends too early (a syntax
 * error at <eof>) takes more lines until it is complete or wrong. Lines are
 * Lua text: a binary chunk is refused (it can break Lua's memory safety). */
#ifndef TF_REPL_INPUT_H
#define TF_REPL_INPUT_H

#include <lua.h>

typedef struct tf_repl_input {
  /* Pushes the next line (without its newline) and returns 1; 0 at end of
   * input; TF_REPL_READ_INTERRUPTED, pushing nothing, when Ctrl-C dropped
   * the line being typed. */
  int (*read)(lua_State *L, const char *prompt, void *ud);
  /* Told the text of each chunk that compiled (for the history); may be NULL. */
  void (*accepted)(const char *text, void *ud);
  void *ud;
} tf_repl_input;

#define TF_REPL_READ_INTERRUPTED (-1)

/* tf_repl_load's results besides a load status. */
#define TF_REPL_END (-1)       /* end of input */
#define TF_REPL_DISCARDED (-2) /* Ctrl-C dropped the input, pending lines too; nothing to run */

#define TF_PROMPT "tf> "
#define TF_PROMPT2 "... "

/* Clears the stack and leaves the next compiled chunk (or an error message)
 * on it. Returns a luaL_loadbuffer status, TF_REPL_END at end of input, or
 * TF_REPL_DISCARDED with an empty stack. */
int tf_repl_load(lua_State *L, const tf_repl_input *in);

#endif
