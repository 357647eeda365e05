/* --timeout and --memory-limit. The wall clock is a thread that sets a flag
 * at the deadline; a count hook, which every coroutine inherits, turns the
 * flag into a tf.exit(124) request at the next Lua instruction. Code that
 * does not return to Lua (a long C op, an endless __gc finalizer, which Lua
 * runs with hooks off) is ended by the same thread a grace period later. */
#include <errno.h>
#include <lauxlib.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bind.h"
#include "device.h"
#include "luahost.h"
#include "safe.h"

/* How long code outside Lua may run past the deadline before the process ends. */
#define TF_TIMEOUT_GRACE_S 3.0
/* Lua instructions between two looks at the clock's flag. */
#define TF_TIMEOUT_HOOK_COUNT 1000

static atomic_int tf_timeout_expired;
static double tf_timeout_seconds;
static char tf_timeout_message[160];

/* Sleeps until t seconds after start on the monotonic clock. */
static void tf_sleep_until(const struct timespec *start, double t) {
  struct timespec at = *start;
  double whole = floor(t);
  at.tv_sec += (time_t)whole;
  at.tv_nsec += (long)((t - whole) * 1e9);
  if (at.tv_nsec >= 1000000000L) {
    at.tv_sec++;
    at.tv_nsec -= 1000000000L;
  }
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {
  }
}

static void *tf_timeout_thread(void *arg) {
  (void)arg;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  tf_sleep_until(&start, tf_timeout_seconds);
  atomic_store(&tf_timeout_expired, 1);
  tf_sleep_until(&start, tf_timeout_seconds + TF_TIMEOUT_GRACE_S);
  /* Lua did not get control back: end here, with what can be said safely. */
  char line[256];
  int n = snprintf(line, sizeof line, "%s (it did not return to Lua within %g s more; ended at once)\n",
                   tf_timeout_message, TF_TIMEOUT_GRACE_S);
  if (n > 0 && write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) n = 0;
  _exit(TF_EXIT_TIMEOUT);
}

/* Past the deadline the hook runs at every instruction of the thread and
 * raises the stop each time, so a script that catches it with pcall gets it
 * back at its next instruction, and so on out to the top. */
static void tf_timeout_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  if (!atomic_load(&tf_timeout_expired)) return;
  lua_sethook(L, tf_timeout_hook, LUA_MASKCOUNT, 1);
  tf_lua_exit_error(L, TF_EXIT_TIMEOUT, tf_timeout_message);
}

static void tf_timeout_start(lua_State *L, double seconds) {
  if (!(seconds > 0 && seconds <= 1e9)) tf_lua_error(L, "--timeout needs seconds in (0, 1e9], not %f", seconds);
  tf_timeout_seconds = seconds;
  snprintf(tf_timeout_message, sizeof tf_timeout_message,
           "tfhost: --timeout: the script was stopped after %g s of wall-clock time", seconds);
  lua_sethook(L, tf_timeout_hook, LUA_MASKCOUNT, TF_TIMEOUT_HOOK_COUNT);
  pthread_t thread;
  int err = pthread_create(&thread, NULL, tf_timeout_thread, NULL);
  if (err != 0) tf_lua_error(L, "--timeout: cannot start its clock: %s", strerror(err));
  pthread_detach(thread);
}

void tf_safe_limits_start(lua_State *L, const tf_safe_settings *s) {
  if (s->timeout != 0) tf_timeout_start(L, s->timeout);
  if (s->memory_gib != 0) {
    double bytes = s->memory_gib * 1073741824.0;
    if (!(bytes >= 1 && bytes < 1e18)) tf_lua_error(L, "--memory-limit needs GiB in (0, 1e9), not %f", s->memory_gib);
    tf_lua_mem_cap(L, (size_t)bytes);
  }
}
