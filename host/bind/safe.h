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

#include "device_id.h"

/* What the command line asked for; zeros: nothing. A limit given as
 * "none" is TF_SAFE_NO_LIMIT; under --safe a limit not given takes
 * --safe's default (tf_safe_cli_finish fills the wall clock's in). */
typedef struct tf_safe_settings {
  bool safe;               /* --safe */
  bool repl;               /* the REPL follows: --safe sets no default wall clock */
  const char *allow_write; /* --allow-write DIR (NULL: the current folder) */
  bool allow_kernels;      /* --allow-kernels: tf.cuda.compile under --safe */
  double timeout;          /* --timeout SECONDS (0: not given) */
  double memory_gib;       /* --memory-limit GiB (0: not given) */
  bool timeout_default;    /* timeout is --safe's default, not --timeout's */
} tf_safe_settings;

#define TF_SAFE_NO_LIMIT (-1.0)

/* --safe's defaults (docs/safe.md): the wall clock in seconds
 * (TFHOST_SAFE_TIMEOUT sets another), and the share of each device's
 * memory its tensors may take: the host's (the CPU's tensors) and a GPU's. */
#define TF_SAFE_TIMEOUT_S 600.0
#define TF_SAFE_HOST_SHARE 0.5
#define TF_SAFE_GPU_SHARE 0.9

/* The Lua heap's cap under --safe when TFHOST_LUA_MEMORY does not set one. */
#define TF_SAFE_LUA_HEAP ((size_t)1 << 30)

/* Starts the wall clock and sets the device memory caps (on every device,
 * as each is first used); under --safe prints the limits on stderr, one
 * line. Call before the runtime opens. Raises on a bad setting. */
void tf_safe_limits_start(lua_State *L, const tf_safe_settings *s);

/* The memory cap the command line (or --safe's default) set on a device
 * (tf.mem.set_limit may lower it, never raise it), or 0 when none; origin
 * says where it came from ("--memory-limit", "--safe's default"). */
size_t tf_safe_mem_ceiling(tf_device d, const char **origin);

/* Enters the sandbox (after the runtime is open, before any user code):
 * script is the script's path (NULL for stdin or none); its folder and the
 * current one are readable, the current one (or allow_write) writable.
 * Raises on failure. */
void tf_safe_enter(lua_State *L, const tf_safe_settings *s, const char *script);

/* Whether L runs under --safe. */
bool tf_safe_active(lua_State *L);
/* Whether L may compile and launch its own CUDA kernels: not under --safe without --allow-kernels. */
bool tf_safe_kernels_allowed(lua_State *L);

/* The one check of every file a script names (io.open, loadfile, require,
 * tf.results.write, tf.mem.dump, p:trace, plots, safetensors): under --safe
 * raises "--safe: who: cannot write 'path': ..." when the path, with its
 * links followed, is outside the allowed folders; otherwise does nothing.
 * write: the file is created, changed or removed. */
void tf_safe_check_path(lua_State *L, const char *path, bool write, const char *who);

#endif
