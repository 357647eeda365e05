#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "status.h"

static int tf_checks, tf_failures;

bool tf_check_at(bool ok, const char *what, const char *file, int line) {
  tf_checks++;
  if (!ok) {
    tf_failures++;
    fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", file, line, what, tf_last_error());
  }
  return ok;
}

bool tf_check_int_at(long long a, long long b, const char *what, const char *file, int line) {
  bool ok = a == b;
  if (!ok) fprintf(stderr, "%s:%d: %lld != %lld\n", file, line, a, b);
  return tf_check_at(ok, what, file, line);
}

bool tf_check_near_at(double a, double b, double tol, const char *what, const char *file, int line) {
  bool ok = fabs(a - b) <= tol || (isnan(a) && isnan(b));
  if (!ok) fprintf(stderr, "%s:%d: %.17g vs %.17g (tolerance %g)\n", file, line, a, b, tol);
  return tf_check_at(ok, what, file, line);
}

int tf_check_done(void) {
  printf("%d checks, %d failed\n", tf_checks, tf_failures);
  return tf_failures ? 1 : tf_checks ? 0 : 1;
}

void tf_check_skip(const char *why) {
  printf("SKIP: %s\n", why);
  exit(77);
}
