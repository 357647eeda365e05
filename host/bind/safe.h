/* tfhost --safe: running a script one was sent without trusting it, and
 * the limits (--timeout, --memory-limit) that also work without --safe.
 *
 * The sandbox's policy (which functions are replaced, refused or checked)
 * is lua/tf/safe.lua; this is its mechanism: the one check every file
 * access goes through, the wall-clock stop, the device memory cap and the
 * child process of tf.safe_run. docs/safe.md has the whole rule table. */
#ifndef TF_SAFE_H
#define TF_SAFE_H

#include <lua.h>
#include <stdbool.h>
#include <stddef.h>

/* What the command line asked for; zeros: nothing. */
typedef struct tf_safe_settings {
  bool safe;               /* --safe */
  const char *allow_write; /* --allow-write DIR (NULL: the current folder) */
  double timeout;          /* --timeout SECONDS (0: none) */
  double memory_gib;       /* --memory-limit GiB (0: none) */
} tf_safe_settings;

/* The Lua heap's cap under --safe when TFHOST_LUA_MEMORY does not set one. */
#define TF_SAFE_LUA_HEAP ((size_t)1 << 30)

/* Starts the wall clock and sets the device memory cap; call before the
 * runtime opens. Raises on a bad setting. */
void tf_safe_limits_start(lua_State *L, const tf_safe_settings *s);

/* Enters the sandbox (after the runtime is open, before any user code):
 * script is the script's path (NULL for stdin or none); its folder and the
 * current one are readable, the current one (or allow_write) writable.
 * Raises on failure. */
void tf_safe_enter(lua_State *L, const tf_safe_settings *s, const char *script);

/* Whether L runs under --safe. */
bool tf_safe_active(lua_State *L);

/* The one check of every file a script names (io.open, loadfile, require,
 * tf.results.write, tf.mem.dump, p:trace, plots, safetensors): under --safe
 * raises "--safe: who: cannot write 'path': ..." when the path, with its
 * links followed, is outside the allowed folders; otherwise does nothing.
 * write: the file is created, changed or removed. */
void tf_safe_check_path(lua_State *L, const char *path, bool write, const char *who);

#endif
