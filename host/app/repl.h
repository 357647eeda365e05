/* The interactive REPL, as lua.c's: expressions print their values, input
 * that ends too early continues on a second prompt, history and line editing
 * when a line editor was found at build time, Ctrl-C interrupts the running
 * chunk. Returns the process exit code (0, or tf.exit's code). */
#ifndef TF_REPL_H
#define TF_REPL_H

#include <lua.h>

int tf_repl(lua_State *L);

#endif
