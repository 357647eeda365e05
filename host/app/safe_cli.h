/* The command-line options of the sandbox and the limits: --safe,
 * --allow-write DIR, --timeout SECONDS|none, --memory-limit GiB|none. */
#ifndef TF_SAFE_CLI_H
#define TF_SAFE_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "safe.h"

/* Reads the option at argv[*i] (with its value, as "--opt v" or "--opt=v")
 * into s: 1 when it was one of these, 0 when not, -1 when its value is
 * missing or malformed (err says why). */
int tf_safe_cli_option(int argc, char **argv, int *i, tf_safe_settings *s, char *err, size_t err_size);

/* Checks the options together once all are read (--allow-write needs
 * --safe and a folder that exists) and fills in --safe's default wall clock
 * (TF_SAFE_TIMEOUT_S, or TFHOST_SAFE_TIMEOUT) unless --timeout was given or
 * s->repl is set: 0, or -1 with err saying what is wrong. */
int tf_safe_cli_finish(tf_safe_settings *s, char *err, size_t err_size);

/* Whether arg is one of these options given without "=value", so the next
 * argument is its value. */
bool tf_safe_cli_takes_value(const char *arg);

/* The lines of tfhost --help for these options. */
extern const char tf_safe_cli_usage[];

#endif
