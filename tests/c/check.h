/* A minimal checking library for the C unit tests: every failed check is
 * printed with its location; tf_check_done() gives the exit code. */
#ifndef TF_CHECK_H
#define TF_CHECK_H

#include <stdbool.h>
#include <stdint.h>

bool tf_check_at(bool ok, const char *what, const char *file, int line);
bool tf_check_int_at(long long a, long long b, const char *what, const char *file, int line);
bool tf_check_near_at(double a, double b, double tol, const char *what, const char *file, int line);
int tf_check_done(void);
/* Exits with 77 (skipped) after printing why. */
void tf_check_skip(const char *why);

#define CHECK(cond) tf_check_at((cond), #cond, __FILE__, __LINE__)
#define CHECK_INT(a, b) tf_check_int_at((long long)(a), (long long)(b), #a " == " #b, __FILE__, __LINE__)
#define CHECK_NEAR(a, b, tol) tf_check_near_at((a), (b), (tol), #a " ~ " #b, __FILE__, __LINE__)
#define CHECK_OK(expr) tf_check_at((expr) == TF_OK, #expr " == TF_OK", __FILE__, __LINE__)

#endif
