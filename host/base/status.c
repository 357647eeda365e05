#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { TF_ERRBUF = 1024 };
static _Thread_local char tf_errbuf[TF_ERRBUF];

tf_status tf_fail(tf_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tf_errbuf, sizeof tf_errbuf, fmt, ap);
  va_end(ap);
  return code;
}

void tf_fail_context(const char *fmt, ...) {
  char prefix[256], old[TF_ERRBUF];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, tf_errbuf, sizeof old);
  size_t used = strlen(prefix);
  if (used + 2 >= sizeof tf_errbuf) used = sizeof tf_errbuf - 3;
  memcpy(tf_errbuf, prefix, used);
  memcpy(tf_errbuf + used, ": ", 2);
  size_t rest = sizeof tf_errbuf - used - 3;
  size_t oldlen = strnlen(old, rest);
  memcpy(tf_errbuf + used + 2, old, oldlen);
  tf_errbuf[used + 2 + oldlen] = '\0';
}

const char *tf_last_error(void) { return tf_errbuf[0] ? tf_errbuf : "unknown error"; }
