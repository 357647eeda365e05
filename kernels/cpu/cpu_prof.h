/* Host-timed op records for the profiler (host/observe/prof.h). */
#ifndef TF_CPU_PROF_H
#define TF_CPU_PROF_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A backend table of plain's shape whose every op (and every kernel of its
 * model table) forwards to plain and, only while a collector records host
 * ops, records one op record with the op's host begin and end times and
 * the range open at its start. Members plain lacks stay NULL; the rest
 * (memory, events, init) are plain's own. The same table for the same
 * plain on every call; tf_cpu_backend() returns the CPU's. */
const tf_backend *tf_cpu_prof_backend(const tf_backend *plain);
/* Whether b is a table made by tf_cpu_prof_backend. */
bool tf_prof_backend_is_wrapped(const tf_backend *b);

#ifdef __cplusplus
}
#endif
#endif
