/* The one string interner of the process: equal strings get one id and one
 * copy that stays valid for the life of the process, so records can keep
 * ids (memory events) or pointers (range and kernel names) instead of
 * strings. Thread-safe: CUPTI's thread interns kernel names. */
#ifndef TF_INTERN_H
#define TF_INTERN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The id of s; id 0 is the empty string, and is also the answer for NULL
 * or when there is no host memory left for a new string. */
uint32_t tf_intern_id(const char *s);
/* The string of an id ("" for 0 or an id never given out). */
const char *tf_intern_string(uint32_t id);
/* The interned copy of s; NULL only when out of host memory. */
const char *tf_intern(const char *s);

#ifdef __cplusplus
}
#endif
#endif
