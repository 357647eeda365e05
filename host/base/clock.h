/* The one clock of the process: the host's monotonic clock. Every host
 * time tfhost reports (ranges, kernel records mapped from CUPTI, memory
 * events, timers on the CPU, tf.now) is a reading of it, so times from
 * different parts can be compared and subtracted. */
#ifndef TF_CLOCK_H
#define TF_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds of CLOCK_MONOTONIC. */
int64_t tf_clock_ns(void);

#ifdef __cplusplus
}
#endif
#endif
