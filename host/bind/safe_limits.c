/* --timeout and --memory-limit, and --safe's defaults of both. The wall
 * clock is a thread that sets a flag at the deadline; a count hook, which
 * every coroutine inherits, turns the flag into a tf.exit(124) request at
 * the next Lua instruction. Code that does not return to Lua (a long C op,
 * an endless __gc finalizer, which Lua runs with hooks off) is ended by the
 * same thread a grace period later. The memory caps are set on each device
 * as it is first used (a hook of the device layer), so that naming a limit
 * does not start every GPU. */
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
#include "dist.h"
#include "luahost.h"
#include "safe.h"

/* How long code outside Lua may run past the deadline before the process ends. */
#define TF_TIMEOUT_GRACE_S 3.0
/* Lua instructions between two looks at the clock's flag. */
#define TF_TIMEOUT_HOOK_COUNT 1000

static atomic_int tf_timeout_expired;
static double tf_timeout_seconds;
static char tf_timeout_message[256];

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
  char line[384];
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

static void tf_timeout_start(lua_State *L, const tf_safe_settings *s) {
  double seconds = s->timeout;
  if (!(seconds > 0 && seconds <= 1e9)) tf_lua_error(L, "--timeout needs seconds in (0, 1e9], not %f", seconds);
  tf_timeout_seconds = seconds;
  snprintf(tf_timeout_message, sizeof tf_timeout_message,
           "tfhost: --timeout: the script was stopped after %g s of wall-clock time%s (--timeout S sets another "
           "limit, --timeout none removes it)",
           seconds, s->timeout_default ? ", --safe's default limit" : "");
  lua_sethook(L, tf_timeout_hook, LUA_MASKCOUNT, TF_TIMEOUT_HOOK_COUNT);
  pthread_t thread;
  int err = pthread_create(&thread, NULL, tf_timeout_thread, NULL);
  if (err != 0) tf_lua_error(L, "--timeout: cannot start its clock: %s", strerror(err));
  pthread_detach(thread);
}

/* The device memory caps: --memory-limit's on every device, else under
 * --safe a share of each device's memory. */
static size_t tf_cap_bytes;
static bool tf_cap_shares;

/* The host memory this process may have: the machine's, or less where a
 * control group caps it (a container); cgroup v2's file, then v1's. */
static size_t tf_host_memory(size_t machine) {
  static const char *const files[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  size_t bytes = machine;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    FILE *f = fopen(files[i], "r");
    unsigned long long v;
    if (f && fscanf(f, "%llu", &v) == 1 && v > 0 && v < bytes) bytes = (size_t)v;
    if (f) fclose(f);
  }
  return bytes;
}

size_t tf_safe_mem_ceiling(tf_device d, const char **origin) {
  if (origin) *origin = tf_cap_bytes ? "--memory-limit" : "--safe's default cap";
  if (tf_cap_bytes) return tf_cap_bytes;
  tf_device_info info;
  if (!tf_cap_shares || tf_device_info_get(d, &info) != TF_OK || info.total_memory == 0) return 0;
  if (d.type == TF_DEV_CPU) return (size_t)(TF_SAFE_HOST_SHARE * (double)tf_host_memory(info.total_memory));
  return (size_t)(TF_SAFE_GPU_SHARE * (double)info.total_memory);
}

static void tf_mem_cap_hook(tf_device_ctx *ctx) {
  size_t cap = tf_safe_mem_ceiling(ctx->device, NULL);
  if (cap) tf_alloc_set_limit(&ctx->alloc, cap);
}

/* --safe's one line on stderr at start: every limit and how to change it
 * (only rank 0 of several says it). */
static void tf_safe_print_limits(lua_State *L, const tf_safe_settings *s) {
  tf_dist_env env;
  if (tf_dist_env_read(&env) == TF_OK && env.rank != 0) return;
  char memory[200], a[32], b[32];
  if (tf_cap_bytes) {
    snprintf(memory, sizeof memory, "<= %s on every device (--memory-limit)", tf_format_bytes(tf_cap_bytes, a, sizeof a));
  } else if (!tf_cap_shares) {
    snprintf(memory, sizeof memory, "not limited (--memory-limit none)");
  } else {
    int n = snprintf(memory, sizeof memory, "<= %s on the CPU (%g %% of host memory)",
                     tf_format_bytes(tf_safe_mem_ceiling(tf_cpu(), NULL), a, sizeof a), 100 * TF_SAFE_HOST_SHARE);
    tf_device gpu = tf_default_device();
    if (tf_cuda_device_count() > 0 && n > 0 && (size_t)n < sizeof memory) {
      if (gpu.type == TF_DEV_CUDA)
        snprintf(b, sizeof b, " (%s on cuda:%d)", tf_format_bytes(tf_safe_mem_ceiling(gpu, NULL), a, sizeof a),
                 gpu.index);
      else
        b[0] = '\0';
      snprintf(memory + n, sizeof memory - (size_t)n, " and <= %g %% of each GPU's%s", 100 * TF_SAFE_GPU_SHARE, b);
    }
  }
  char clock[64];
  if (s->timeout > 0)
    snprintf(clock, sizeof clock, "wall clock <= %g s", s->timeout);
  else
    snprintf(clock, sizeof clock, "wall clock not limited%s", s->repl && s->timeout == 0 ? " in the REPL" : "");
  fprintf(stderr, "tfhost: safe mode: tensor memory %s, Lua heap <= %s, %s; --memory-limit GiB, --timeout S "
                  "change them (none: no limit)\n",
          memory, tf_format_bytes(tf_lua_heap_limit(L), a, sizeof a), clock);
  fflush(stderr);
}

void tf_safe_limits_start(lua_State *L, const tf_safe_settings *s) {
  if (s->timeout > 0) tf_timeout_start(L, s);
  if (s->memory_gib > 0) {
    double bytes = s->memory_gib * 1073741824.0;
    if (!(bytes >= 1 && bytes < 1e18)) tf_lua_error(L, "--memory-limit needs GiB in (0, 1e9), not %f", s->memory_gib);
    tf_cap_bytes = (size_t)bytes;
  }
  tf_cap_shares = s->safe && s->memory_gib == 0;
  if (tf_cap_bytes || tf_cap_shares) tf_device_set_ready_hook(tf_mem_cap_hook);
  if (s->safe) tf_safe_print_limits(L, s);
}
