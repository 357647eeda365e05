#include "safe_cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "exit_codes.h"

const char tf_safe_cli_usage[] =
    "  --safe         run the script sandboxed: no processes, no native code, files only in\n"
    "                 the allowed folders, and limits by default: tensor memory <= 50 % of the\n"
    "                 host's and 90 % of each GPU's, wall clock <= 600 s (TFHOST_SAFE_TIMEOUT sets\n"
    "                 another default; docs/safe.md)\n"
    "  --allow-write DIR  under --safe, the folder scripts may write in (default: the current one)\n"
    "  --allow-kernels    under --safe, let scripts compile and launch CUDA kernels (tf.cuda.compile):\n"
    "                 a kernel can read and write any GPU memory of the process\n"
    "  --timeout S    stop the script after S seconds of wall-clock time (exit code " TF_EXIT_STR(TF_EXIT_TIMEOUT) ");\n"
    "                 none: no limit (the default without --safe)\n"
    "  --memory-limit G   cap every device's memory (the allocator's) at G GiB; none: no cap\n";

static const char *const tf_safe_valued[] = {"--allow-write", "--timeout", "--memory-limit"};
enum { TF_SAFE_NVALUED = sizeof tf_safe_valued / sizeof tf_safe_valued[0] };

/* The value of a limit: a number in (0, 1e9] or "none" (TF_SAFE_NO_LIMIT);
 * false when malformed. */
static bool tf_safe_limit_value(const char *text, double *out) {
  if (strcmp(text, "none") == 0) {
    *out = TF_SAFE_NO_LIMIT;
    return true;
  }
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (*text == '\0' || *end != '\0' || errno == ERANGE || !isfinite(v) || !(v > 0) || v > 1e9) return false;
  *out = v;
  return true;
}

int tf_safe_cli_option(int argc, char **argv, int *i, tf_safe_settings *s, char *err, size_t err_size) {
  const char *a = argv[*i];
  if (strcmp(a, "--safe") == 0) {
    s->safe = true;
    return 1;
  }
  if (strcmp(a, "--allow-kernels") == 0) {
    s->allow_kernels = true;
    return 1;
  }
  for (int k = 0; k < TF_SAFE_NVALUED; k++) {
    const char *name = tf_safe_valued[k];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
    const char *value = a[n] == '=' ? a + n + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!value) {
      snprintf(err, err_size, "option '%s' needs an argument", name);
      return -1;
    }
    if (k == 0) {
      s->allow_write = value;
      return 1;
    }
    if (!tf_safe_limit_value(value, k == 1 ? &s->timeout : &s->memory_gib)) {
      snprintf(err, err_size, "%s needs a positive number of %s up to 1e9, or none for no limit, not '%s'", name,
               k == 1 ? "seconds" : "GiB", value);
      return -1;
    }
    return 1;
  }
  return 0;
}

int tf_safe_cli_finish(tf_safe_settings *s, char *err, size_t err_size) {
  if (s->allow_kernels && !s->safe) {
    snprintf(err, err_size, "--allow-kernels needs --safe (without it, kernels are allowed)");
    return -1;
  }
  if (s->allow_write) {
    if (!s->safe) {
      snprintf(err, err_size, "--allow-write needs --safe");
      return -1;
    }
    struct stat st;
    bool exists = stat(s->allow_write, &st) == 0;
    if (!exists || !S_ISDIR(st.st_mode)) {
      snprintf(err, err_size, "--allow-write needs a folder that exists: '%s': %s", s->allow_write,
               exists ? "it is not a folder" : strerror(errno));
      return -1;
    }
  }
  if (!s->safe || s->timeout != 0 || s->repl) return 0;
  const char *env = getenv("TFHOST_SAFE_TIMEOUT");
  s->timeout = TF_SAFE_TIMEOUT_S;
  s->timeout_default = true;
  if (env && !tf_safe_limit_value(env, &s->timeout)) {
    snprintf(err, err_size,
             "TFHOST_SAFE_TIMEOUT (--safe's default wall clock) needs a positive number of seconds up to 1e9, or "
             "none, not '%s'", env);
    return -1;
  }
  return 0;
}

bool tf_safe_cli_takes_value(const char *arg) {
  for (int k = 0; k < TF_SAFE_NVALUED; k++)
    if (strcmp(arg, tf_safe_valued[k]) == 0) return true;
  return false;
}
