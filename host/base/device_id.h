/* Which device: the CPU or the N-th CUDA GPU. A plain value that every
 * layer may name (records of the profiler and the memory recorder carry
 * one); the per-device state lives in the tensor layer (device.h). */
#ifndef TF_DEVICE_ID_H
#define TF_DEVICE_ID_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_device_type { TF_DEV_CPU = 0, TF_DEV_CUDA = 1 } tf_device_type;

typedef struct tf_device {
  int type;  /* tf_device_type */
  int index; /* 0 for the CPU */
} tf_device;

enum { TF_MAX_CUDA_DEVICES = 16 };

static inline tf_device tf_cpu(void) { return (tf_device){TF_DEV_CPU, 0}; }
static inline bool tf_device_eq(tf_device a, tf_device b) { return a.type == b.type && a.index == b.index; }

#ifdef __cplusplus
}
#endif
#endif
