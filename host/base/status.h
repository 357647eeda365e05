/* Status codes and the error message that goes with them.
 *
 * The core never raises Lua errors and never exits: every fallible function
 * returns a tf_status and, on failure, leaves a message in a thread-local
 * buffer that the caller (usually a Lua binding) turns into an error. */
#ifndef TF_STATUS_H
#define TF_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_status {
  TF_OK = 0,
  TF_ERR_ARG,      /* bad argument: shape, dtype, value out of range */
  TF_ERR_DEVICE,   /* device missing, wrong device, device mismatch */
  TF_ERR_OOM,      /* out of memory (message starts with "out of memory") */
  TF_ERR_BACKEND,  /* a CUDA / cuBLAS / system call failed */
  TF_ERR_STATE,    /* use after free, wrong order of calls */
  TF_ERR_IO        /* file could not be read or written */
} tf_status;

/* Records a formatted message for the current thread and returns code. */
tf_status tf_fail(tf_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the current message (used to add context). */
void tf_fail_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The message recorded by the last tf_fail on this thread. */
const char *tf_last_error(void);

#define TF_TRY(expr)                 \
  do {                               \
    tf_status tf_try_s_ = (expr);    \
    if (tf_try_s_ != TF_OK) return tf_try_s_; \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
