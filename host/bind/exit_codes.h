/* The exit codes of the tfhost process, one list for every place that ends
 * it or reports how a rank ended: main.c, launch.c (tfhost --nproc),
 * safe_cli.c's help, tf.exit and --timeout (luahost.c, safe_limits.c).
 * Macros rather than an enum so that help texts can print them
 * (TF_EXIT_STR). */
#ifndef TF_EXIT_CODES_H
#define TF_EXIT_CODES_H

#define TF_EXIT_OK 0        /* the script ran to its end, or tf.exit(0) */
#define TF_EXIT_SCRIPT 1    /* an error: the script's, or tfhost's own (out of memory, a failed start) */
#define TF_EXIT_USAGE 2     /* a bad command line (tfhost's options or the script's) */
#define TF_EXIT_TIMEOUT 124 /* --timeout ran out (as timeout(1)) */
#define TF_EXIT_NOEXEC 127  /* a rank's program could not be run (as a shell's "not found") */
#define TF_EXIT_SIGNAL 128  /* plus the signal's number: a rank killed by one, or tfhost interrupted */

/* The code as a string literal, for help texts: TF_EXIT_STR(TF_EXIT_TIMEOUT) is "124". */
#define TF_EXIT_STR(code) TF_EXIT_STR_(code)
#define TF_EXIT_STR_(code) #code

#endif
