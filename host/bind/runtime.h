/* Setting up a Lua state as tfhost's runtime: the embedded lua/tf modules,
 * the C core as "tf.core", the global tf, and module search next to the
 * script. */
#ifndef TF_RUNTIME_H
#define TF_RUNTIME_H

#include <lua.h>

/* Opens the standard libraries and tf; sets the global tf. Runs inside a
 * protected call (it may raise). */
void tf_runtime_open(lua_State *L);

/* Lets require find modules in the directory of script (NULL: none). */
void tf_runtime_add_script_dir(lua_State *L, const char *script);

#endif
