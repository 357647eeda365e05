/* The Lua modules of lua/, compiled into the binary (see cmake/embed_lua.cmake),
 * and the build's identity (cmake/version.cmake). */
#ifndef TF_EMBEDDED_H
#define TF_EMBEDDED_H

#include <stddef.h>

typedef struct tf_embedded_module {
  const char *name;      /* "tf", "tf.report", ... */
  const char *chunkname; /* "@lua/tf/report.lua", shown in tracebacks */
  const unsigned char *source;
  size_t size;
} tf_embedded_module;

/* Terminated by an entry with a NULL name. */
extern const tf_embedded_module tf_embedded_modules[];

extern const char *const tf_version;
extern const char *const tf_commit;
extern const char *const tf_build_options;

#endif
