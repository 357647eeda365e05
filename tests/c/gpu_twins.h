/* Shared by the C tests that compare CUDA kernels with their CPU twins:
 * the start of main (skip without a GPU, the seed, TF_TEST_SMALL, the
 * device line) and flat buffers holding the same values on both devices. */
#ifndef TF_TEST_GPU_TWINS_H
#define TF_TEST_GPU_TWINS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nnref.h"

static const tf_device GPU = {TF_DEV_CUDA, 0};

/* Skips (exit 77) without a GPU, seeds, prints the device; returns whether
 * TF_TEST_SMALL asks for the small run (compute-sanitizer). */
static inline bool gpu_test_begin(void) {
  if (tf_cuda_device_count() == 0) tf_check_skip("no CUDA device (or a build without CUDA)");
  test_seed();
  tf_device_info info;
  if (CHECK_OK(tf_device_info_get(GPU, &info))) printf("device: %s\n", info.name);
  return getenv("TF_TEST_SMALL") != NULL;
}

/* n values of dtype d on the CPU (c) and on the GPU (g), used from element
 * off of a flat tensor: off 1 leaves the data 2 or 4 bytes past a 16-byte
 * boundary, which misaligns vector loads. */
typedef struct {
  tf_tensor *c, *g;
  int64_t off, n;
  tf_dtype d;
} flat_pair;

static inline flat_pair flat_pair_of(const double *v, int64_t n, tf_dtype d, int64_t off) {
  double *all = values_alloc(n + off);
  memcpy(all + off, v, sizeof(double) * (size_t)n);
  flat_pair p = {tensor_from(all, SHAPE(n + off), d), NULL, off, n, d};
  free(all);
  if (!CHECK_OK(tf_to(p.c, d, GPU, &p.g))) exit(1);
  return p;
}

static inline flat_pair flat_pair_randn(int64_t n, tf_dtype d, double scale, int64_t off) {
  double *v = random_values(n, d, scale);
  flat_pair p = flat_pair_of(v, n, d, off);
  free(v);
  return p;
}

/* The data of each side, from element off. */
static inline void *CP(flat_pair p) { return (char *)tf_tensor_data(p.c) + p.off * (int64_t)tf_dtype_size(p.d); }
static inline void *GP(flat_pair p) { return (char *)tf_tensor_data(p.g) + p.off * (int64_t)tf_dtype_size(p.d); }

static inline void flat_pair_free(flat_pair *p) {
  tf_tensor_release(p->c);
  tf_tensor_release(p->g);
  p->c = p->g = NULL;
}

#endif
