/* tfhost: the command line, shaped like Lua's own lua.c.
 *
 *   tfhost [options] [script [args]]
 *
 * main() parses tfhost's own options, then runs everything else inside one
 * protected call (tf_pmain): the runtime, -e/-l in order, the script with
 * its arguments, and the REPL. Exit codes: 0 success, 1 script error,
 * 2 usage error. */
#include <lauxlib.h>
#include <lualib.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "bind.h"
#include "dist.h"
#include "embedded.h"
#include "exit_codes.h"
#include "launch.h"
#include "luahost.h"
#include "repl.h"
#include "runtime.h"
#include "safe_cli.h"

typedef struct tf_cli {
  int argc;
  char **argv;
  int script;          /* index of the script in argv; argc when none */
  bool stdin_script;   /* the script is "-" */
  bool interactive;    /* -i */
  bool version;        /* -v */
  bool warnings;       /* -W */
  bool has_exec;       /* some -e */
  bool help;           /* -h, --help */
  const char *device;  /* --device */
  const char *seed;    /* --seed */
  const char *threads; /* --threads */
  const char *nproc;   /* --nproc: run as that many ranks */
  int nproc_at, nproc_args; /* where --nproc is in argv, and its 1 or 2 arguments */
  tf_safe_settings safe; /* --safe, --allow-write, --timeout, --memory-limit */
  int exit_code;
} tf_cli;

static void tf_print_usage(FILE *to) {
  fputs("usage: tfhost [options] [script [args]]\n"
        "       tfhost compare [options] A.json B.json [C.json ...]\n"
        "Runs a Lua script, or the interactive REPL, with the tf engine loaded;\n"
        "compare puts results files side by side (tfhost compare --help).\n"
        "\n"
        "Options:\n"
        "  -e stat        execute string 'stat'\n"
        "  -l mod         require module 'mod' into global 'mod' (-l g=mod: into global 'g')\n"
        "  -i             enter interactive mode after running the script\n"
        "  -v             show version information\n"
        "  -W             turn Lua warnings on\n"
        "  --device DEV   default device: cpu, cuda or cuda:N (default: cuda:0 when a GPU is present)\n"
        "  --seed N       seed of the random number generators (default 0)\n"
        "  --threads N    CPU threads for OpenMP and the BLAS (default: TF_NUM_THREADS, else every core)\n"
        "  --nproc N      run the script as N ranks on this machine, one per GPU (or N CPU processes\n"
        "                 with --device cpu or without GPUs); tf.dist connects them\n"
        "  -h, --help     show this help\n"
        "  --             stop handling options\n"
        "  -              run the script read from stdin\n",
        to);
  fputs(tf_safe_cli_usage, to);
  fputs("\n"
        "A script's own options are listed by: tfhost script.lua --help\n"
        "Environment: TFHOST_LUA_MEMORY caps the Lua heap (for example 512M or 8G).\n",
        to);
}

static int tf_usage_error(const char *fmt, const char *arg) {
  fputs("tfhost: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs("\n(run tfhost --help for usage)\n", stderr);
  return TF_EXIT_USAGE;
}

/* Takes the value of an option given as "--opt value" or "--opt=value". */
static const char *tf_option_value(tf_cli *cli, int *i, const char *name) {
  const char *a = cli->argv[*i];
  size_t n = strlen(name);
  if (a[n] == '=') return a + n + 1;
  if (*i + 1 >= cli->argc) return NULL;
  return cli->argv[++*i];
}

/* Scans tfhost's own options up to the script; 0 or an exit code. */
static int tf_cli_parse(tf_cli *cli) {
  cli->script = cli->argc;
  for (int i = 1; i < cli->argc; i++) {
    const char *a = cli->argv[i];
    char err[160];
    int safe_option = tf_safe_cli_option(cli->argc, cli->argv, &i, &cli->safe, err, sizeof err);
    if (safe_option < 0) return tf_usage_error("%s", err);
    if (safe_option > 0) continue;
    if (a[0] != '-' || strcmp(a, "-") == 0) {
      cli->script = i;
      cli->stdin_script = strcmp(a, "-") == 0;
      return 0;
    }
    if (strcmp(a, "--") == 0) {
      if (i + 1 < cli->argc) cli->script = i + 1;
      return 0;
    }
    if (strcmp(a, "-i") == 0) {
      cli->interactive = true;
    } else if (strcmp(a, "-v") == 0) {
      cli->version = true;
    } else if (strcmp(a, "-W") == 0) {
      cli->warnings = true;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      cli->help = true;
    } else if (strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0) {
      if (i + 1 >= cli->argc) return tf_usage_error("option '%s' needs an argument", a);
      cli->has_exec = cli->has_exec || a[1] == 'e';
      i++;
    } else if (strncmp(a, "-e", 2) == 0 || strncmp(a, "-l", 2) == 0) {
      cli->has_exec = cli->has_exec || a[1] == 'e'; /* -estat, -lmod */
    } else if (strncmp(a, "--device", 8) == 0 && (a[8] == '\0' || a[8] == '=')) {
      if (!(cli->device = tf_option_value(cli, &i, "--device")))
        return tf_usage_error("option '%s' needs an argument", "--device");
    } else if (strncmp(a, "--seed", 6) == 0 && (a[6] == '\0' || a[6] == '=')) {
      if (!(cli->seed = tf_option_value(cli, &i, "--seed")))
        return tf_usage_error("option '%s' needs an argument", "--seed");
    } else if (strncmp(a, "--nproc", 7) == 0 && (a[7] == '\0' || a[7] == '=')) {
      cli->nproc_at = i;
      if (!(cli->nproc = tf_option_value(cli, &i, "--nproc")))
        return tf_usage_error("option '%s' needs an argument", "--nproc");
      cli->nproc_args = i - cli->nproc_at + 1;
    } else if (strncmp(a, "--threads", 9) == 0 && (a[9] == '\0' || a[9] == '=')) {
      if (!(cli->threads = tf_option_value(cli, &i, "--threads")))
        return tf_usage_error("option '%s' needs an argument", "--threads");
    } else {
      return tf_usage_error("unrecognized option '%s'", a);
    }
  }
  return 0;
}

/* Whether tfhost ends in the REPL (-i, or nothing to run and a terminal). */
static bool tf_cli_repl(const tf_cli *cli) {
  return cli->interactive || (cli->script == cli->argc && !cli->has_exec && !cli->version && isatty(STDIN_FILENO));
}

/* arg = {[0] = script, script args at 1..n, tfhost's own args negative}. */
static void tf_create_arg_table(lua_State *L, const tf_cli *cli) {
  int script = cli->script;
  lua_createtable(L, cli->argc - script, script + 1);
  for (int i = 0; i < cli->argc; i++) {
    lua_pushstring(L, cli->argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

/* What the banner says of the backends: a CUDA build on a machine without a
 * GPU runs on the CPU, and says so. */
static const char *tf_backends_banner(void) {
  if (!tf_cuda_compiled()) return "CPU backend only (built without CUDA)";
  return tf_cuda_device_count() > 0 ? "CUDA backend" : "CUDA backend built, no GPU found";
}

static void tf_print_version(void) {
  printf("tfhost %s (commit %s), %s, %s\n", tf_version, tf_commit, LUA_RELEASE, tf_backends_banner());
  fflush(stdout);
}

/* Reports a failed call: a tf.exit request sets its code, anything else
 * prints the error and means exit code 1. Returns whether to go on. */
static bool tf_handle_status(lua_State *L, tf_cli *cli, int status) {
  if (status == LUA_OK) return true;
  int code;
  if (tf_lua_exit_request(L, &code)) {
    cli->exit_code = code;
    return false;
  }
  tf_lua_report(L, status);
  cli->exit_code = TF_EXIT_SCRIPT;
  return false;
}

static int tf_dochunk(lua_State *L, int status) {
  if (status == LUA_OK) status = tf_lua_docall(L, 0, 0);
  return status;
}

/* -l mod or -l g=mod */
static int tf_dolibrary(lua_State *L, const char *spec) {
  const char *eq = strchr(spec, '=');
  const char *mod = eq ? eq + 1 : spec;
  lua_getglobal(L, "require");
  lua_pushstring(L, mod);
  int status = tf_lua_docall(L, 1, 1);
  if (status == LUA_OK) {
    if (eq)
      lua_pushlstring(L, spec, (size_t)(eq - spec));
    else
      lua_pushstring(L, mod);
    lua_insert(L, -2);
    lua_setglobal(L, lua_tostring(L, -2));
    lua_pop(L, 1);
  }
  return status;
}

/* Under --safe the script, -e and stdin are text only (a binary chunk can
 * break Lua's memory safety); otherwise as lua, text or binary. */
static const char *tf_chunk_mode(const tf_cli *cli) { return cli->safe.safe ? "t" : NULL; }

/* Runs the -e and -l options in the order given. */
static bool tf_run_args(lua_State *L, tf_cli *cli) {
  for (int i = 1; i < cli->script; i++) {
    const char *a = cli->argv[i];
    if (a[0] != '-' || (a[1] != 'e' && a[1] != 'l')) {
      if (strcmp(a, "--device") == 0 || strcmp(a, "--seed") == 0 || strcmp(a, "--threads") == 0 ||
          strcmp(a, "--nproc") == 0 ||
          tf_safe_cli_takes_value(a))
        i++;
      continue;
    }
    const char *value = a[2] ? a + 2 : cli->argv[++i];
    int status = a[1] == 'e' ? tf_dochunk(L, luaL_loadbufferx(L, value, strlen(value), "=(command line)",
                                                              tf_chunk_mode(cli)))
                             : tf_dolibrary(L, value);
    if (!tf_handle_status(L, cli, status)) return false;
  }
  return true;
}

/* Loads stdin as one script, as lua does. A syntax error says so: a bare
 * expression line (which the REPL would print) is not a statement. */
static int tf_load_stdin(lua_State *L, const tf_cli *cli) {
  int status = luaL_loadfilex(L, NULL, tf_chunk_mode(cli));
  if (status == LUA_ERRSYNTAX) {
    lua_pushfstring(L, "%s\n(stdin is read as one script, as lua reads it: a line must be a statement; "
                       "tfhost -i reads it line by line as the REPL does, printing the values of expressions)",
                    lua_tostring(L, -1));
    lua_remove(L, -2);
  }
  return status;
}

/* Built-in commands run an embedded module in the script's place (their
 * arguments come as the script's would): `tfhost compare A.json B.json`.
 * A script file of that name runs as ./compare. */
static bool tf_is_command(const char *name) { return name && strcmp(name, "compare") == 0; }

static bool tf_run_script(lua_State *L, tf_cli *cli) {
  const char *fname = cli->stdin_script ? NULL : cli->argv[cli->script];
  int status;
  if (tf_is_command(fname)) {
    const char *chunk = "return require('tf.compare').main(...)";
    status = luaL_loadbuffer(L, chunk, strlen(chunk), "=tfhost compare");
  } else {
    tf_runtime_add_script_dir(L, fname);
    status = fname ? luaL_loadfilex(L, fname, tf_chunk_mode(cli)) : tf_load_stdin(L, cli);
  }
  if (status != LUA_OK) return tf_handle_status(L, cli, status);
  int nargs = cli->argc - cli->script - 1;
  luaL_checkstack(L, nargs + 3, "too many arguments to script");
  for (int i = cli->script + 1; i < cli->argc; i++) lua_pushstring(L, cli->argv[i]);
  return tf_handle_status(L, cli, tf_lua_docall(L, nargs, 0));
}

/* A rank of several (its launcher's environment says so) joins the others
 * before the script runs, and takes the GPU of its local rank unless
 * --device chose. */
static bool tf_join_world(tf_cli *cli) {
  tf_dist_env env;
  if (tf_dist_env_read(&env) == TF_OK && env.world_size == 1) return true;
  if (tf_dist_init() != TF_OK) {
    fprintf(stderr, "tfhost: %s\n", tf_last_error());
    cli->exit_code = TF_EXIT_SCRIPT;
    return false;
  }
  int gpus = tf_cuda_device_count();
  if (cli->device || gpus == 0) return true;
  if (env.local_rank >= gpus) {
    fprintf(stderr, "tfhost: rank %d is local rank %d, and this machine has %d GPU(s) (one per rank; --device cpu "
                    "runs CPU ranks)\n", env.rank, env.local_rank, gpus);
    cli->exit_code = TF_EXIT_USAGE;
    return false;
  }
  if (tf_set_default_device((tf_device){TF_DEV_CUDA, env.local_rank}) != TF_OK) {
    fprintf(stderr, "tfhost: %s\n", tf_last_error());
    cli->exit_code = TF_EXIT_SCRIPT;
    return false;
  }
  return true;
}

static bool tf_apply_cli_settings(lua_State *L, tf_cli *cli) {
  (void)L;
  if (tf_cpu_threads_from_env() != TF_OK) {
    cli->exit_code = tf_usage_error("%s", tf_last_error());
    return false;
  }
  int threads;
  if (cli->threads && (!tf_cpu_threads_parse(cli->threads, &threads) || tf_cpu_set_threads(threads) != TF_OK)) {
    cli->exit_code = tf_usage_error("--threads needs a count in 1..4096, not '%s'", cli->threads);
    return false;
  }
  if (cli->seed) {
    char *end;
    errno = 0;
    long long seed = strtoll(cli->seed, &end, 10);
    if (*cli->seed == '\0' || *end != '\0' || errno == ERANGE) {
      cli->exit_code = tf_usage_error("--seed needs an integer, not '%s'", cli->seed);
      return false;
    }
    tf_seed_all((uint64_t)seed);
  }
  if (cli->device) {
    tf_device d;
    if (tf_device_parse(cli->device, &d) != TF_OK || tf_set_default_device(d) != TF_OK) {
      cli->exit_code = tf_usage_error("--device: %s", tf_last_error());
      return false;
    }
  }
  return tf_join_world(cli);
}

static int tf_pmain(lua_State *L) {
  tf_cli *cli = lua_touserdata(L, 1);
  lua_settop(L, 0);
  luaL_checkversion(L);
  if (cli->warnings) lua_warning(L, "@on", 0);
  if (!tf_apply_cli_settings(L, cli)) return 0;
  tf_safe_limits_start(L, &cli->safe);
  tf_runtime_open(L);
  if (cli->safe.safe)
    tf_safe_enter(L, &cli->safe, cli->script < cli->argc && !cli->stdin_script ? cli->argv[cli->script] : NULL);
  tf_create_arg_table(L, cli);
  if (cli->version) tf_print_version();
  if (!tf_run_args(L, cli)) return 0;
  bool has_script = cli->script < cli->argc;
  if (has_script && !tf_run_script(L, cli)) return 0;
  if (cli->interactive) {
    cli->exit_code = tf_repl(L);
  } else if (!has_script && !cli->has_exec && !cli->version) {
    if (isatty(STDIN_FILENO)) {
      tf_print_version();
      cli->exit_code = tf_repl(L);
    } else {
      tf_handle_status(L, cli, tf_dochunk(L, tf_load_stdin(L, cli)));
    }
  }
  return 0;
}

/* "512M", "8G", "1048576" -> bytes; 0 when unset or malformed. */
static size_t tf_parse_bytes(const char *s) {
  if (!s || !*s) return 0;
  char *end;
  double v = strtod(s, &end);
  if (!(v > 0)) return 0;
  switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; break;
    case '\0': break;
    default: return 0;
  }
  /* NaN, inf and values past size_t would make the cast undefined. */
  if (!(v >= 1.0 && v < (double)SIZE_MAX)) return 0;
  return (size_t)v;
}

/* The Lua heap cap: TFHOST_LUA_MEMORY, else half of physical memory (under
 * --safe at most TF_SAFE_LUA_HEAP). */
static size_t tf_lua_heap_cap(bool safe) {
  size_t from_env = tf_parse_bytes(getenv("TFHOST_LUA_MEMORY"));
  if (from_env) return from_env;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t half = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 2 : 0;
  return safe && (half == 0 || half > TF_SAFE_LUA_HEAP) ? TF_SAFE_LUA_HEAP : half;
}

/* Settings the CPU libraries read when they load, before main: tfhost starts
 * again with them set (once: the second start finds them set); if that
 * fails, it goes on as it is.
 * - A BLAS on generic kernels where the CPU has far better ones: the better
 *   ones (OPENBLAS_CORETYPE).
 * - OpenMP's threads sleep when they wait (OMP_WAIT_POLICY=passive) unless
 *   the environment chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT set): spinning
 *   saves microseconds a parallel loop on an idle machine, but where the
 *   cores are shared (a test suite, a login node) each loop waits for a
 *   descheduled thread, and small ops took 100 to 1000 times as long. */
static void tf_cpu_libs_restart(char **argv) {
  bool again = false;
  const char *core = tf_cpu_blas_better_core();
  if (core && setenv("OPENBLAS_CORETYPE", core, 1) == 0) again = true;
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
    again = true;
  if (again) execv("/proc/self/exe", argv);
}

/* tfhost --nproc N ...: the same command line, less --nproc, as N ranks. */
static int tf_launch_ranks(tf_cli *cli) {
  char *end;
  long n = strtol(cli->nproc, &end, 10);
  if (*cli->nproc == '\0' || *end != '\0' || n < 1 || n > 256)
    return tf_usage_error("--nproc needs a count in 1..256, not '%s'", cli->nproc);
  char **argv = calloc((size_t)cli->argc + 1, sizeof(char *));
  if (!argv) return TF_EXIT_SCRIPT;
  int argc = 0;
  for (int i = 0; i < cli->argc; i++) {
    if (i >= cli->nproc_at && i < cli->nproc_at + cli->nproc_args) continue;
    argv[argc++] = cli->argv[i];
  }
  if (cli->device) setenv("TFHOST_DEVICE_OPTION", cli->device, 1);
  int code = tf_launch((int)n, argc, argv);
  free(argv);
  return code;
}

int main(int argc, char **argv) {
  tf_cpu_libs_restart(argv);
  tf_backends_init();
  tf_cli cli = {.argc = argc, .argv = argv};
  int code = tf_cli_parse(&cli);
  if (code != 0) return code;
  if (cli.help) {
    tf_print_usage(stdout);
    return TF_EXIT_OK;
  }
  char err[320];
  cli.safe.repl = tf_cli_repl(&cli);
  if (tf_safe_cli_finish(&cli.safe, err, sizeof err) < 0) return tf_usage_error("%s", err);
  if (cli.nproc) return tf_launch_ranks(&cli);
  lua_State *L = tf_lua_newstate(tf_lua_heap_cap(cli.safe.safe));
  if (!L) {
    fputs("tfhost: cannot create the Lua state: not enough memory\n", stderr);
    return TF_EXIT_SCRIPT;
  }
  lua_pushcfunction(L, tf_pmain);
  lua_pushlightuserdata(L, &cli);
  int status = lua_pcall(L, 1, 0, 0);
  if (status != LUA_OK) {
    tf_lua_report(L, status);
    cli.exit_code = TF_EXIT_SCRIPT;
  }
  fflush(stdout);
  tf_lua_exit_if_context_lost(); /* a script that caught the fault's errors still ends with exit 1 */
  tf_lua_close(L);
  tf_dist_shutdown(cli.exit_code != TF_EXIT_OK);
  tf_devices_shutdown();
  return cli.exit_code;
}
