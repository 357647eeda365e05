/* The backends of this build, made known to the layers below them. */
#ifndef TF_BACKENDS_H
#define TF_BACKENDS_H

#include "cpu_threads.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the CPU backend, and in CUDA builds the CUDA backend and its
 * CUPTI collector, with the device layer and the profiler. Call once
 * before using any device (tfhost's runtime does; so does every C test);
 * calling again is harmless. */
void tf_backends_init(void);

#ifdef __cplusplus
}
#endif
#endif
