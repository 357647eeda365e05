/* Tensors made along the way inside a core function (conversions, views,
 * intermediate results), released together at the end. */
#ifndef TF_TEMPS_H
#define TF_TEMPS_H

#include "tensor.h"

enum { TF_TEMPS_MAX = 16 };

typedef struct tf_temps {
  tf_tensor *t[TF_TEMPS_MAX];
  int n;
} tf_temps;

static inline tf_tensor *tf_temps_keep(tf_temps *tt, tf_tensor *t) {
  tt->t[tt->n++] = t;
  return t;
}

static inline void tf_temps_drop(tf_temps *tt) {
  for (int i = 0; i < tt->n; i++) tf_tensor_release(tt->t[i]);
  tt->n = 0;
}

#endif
