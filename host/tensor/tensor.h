/* Tensors: a shape, strides and dtype over a reference-counted storage.
 *
 * Storage is one block of a device's caching allocator. Views (reshape of a
 * contiguous tensor, transpose, slicing) share the storage and hold a
 * reference to it, so memory returns to the allocator when the last tensor
 * using it is released. Tensors themselves are reference counted too: the
 * Lua binding holds one reference, and later the autograd graph may hold
 * others. */
#ifndef TF_TENSOR_H
#define TF_TENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { TF_MAX_DIMS = 8 };

typedef struct tf_storage {
  int refcount;
  tf_device device;
  tf_block *block; /* NULL for an empty (0-element) tensor */
  void *data;
  size_t nbytes;
  uint64_t version; /* bumped by every in-place write: autograd checks saved tensors */
} tf_storage;

typedef struct tf_node tf_node; /* autograd.h */

typedef struct tf_tensor {
  int refcount;
  tf_dtype dtype;
  tf_device device;
  int ndim;
  int64_t shape[TF_MAX_DIMS];
  int64_t strides[TF_MAX_DIMS]; /* in elements */
  int64_t offset;               /* in elements, into storage */
  tf_storage *storage;
  /* autograd: a leaf that requires grad accumulates into grad; a tensor
   * computed from such tensors has grad_fn, the op that made it. */
  bool requires_grad;
  struct tf_tensor *grad;
  tf_node *grad_fn;
} tf_tensor;

/* How a tensor drops its grad_fn when released: registered by autograd
 * (autograd.c) before it makes its first node, so that the tensor layer
 * calls nothing above it. */
void tf_tensor_set_node_release(void (*release)(tf_node *));

/* A shape as it travels through the API. */
typedef struct tf_shape {
  int ndim;
  int64_t dims[TF_MAX_DIMS];
} tf_shape;

/* Checks 0..8 dims, each >= 0, and that the element count fits. */
tf_status tf_shape_check(const tf_shape *s);
int64_t tf_shape_numel(const tf_shape *s);
/* "(4, 128, 768)" */
const char *tf_shape_format(const tf_shape *s, char *buf, size_t n);

/* New contiguous tensor with uninitialised contents. */
tf_status tf_tensor_empty(const tf_shape *shape, tf_dtype dtype, tf_device device, tf_tensor **out);

/* A view sharing t's storage with the given shape, strides and offset. */
tf_status tf_tensor_view(const tf_tensor *t, const tf_shape *shape, const int64_t *strides, int64_t offset,
                         tf_tensor **out);

tf_tensor *tf_tensor_retain(tf_tensor *t);
/* Drops a reference; frees the tensor (and its storage, if last) at zero. */
void tf_tensor_release(tf_tensor *t);

int64_t tf_tensor_numel(const tf_tensor *t);
tf_shape tf_tensor_shape(const tf_tensor *t);
bool tf_tensor_is_contiguous(const tf_tensor *t);
size_t tf_tensor_nbytes(const tf_tensor *t); /* numel * element size */
/* Address of element 0 of the view. */
void *tf_tensor_data(const tf_tensor *t);
void tf_contiguous_strides(const tf_shape *s, int64_t *strides);

/* Host <-> tensor copies of a contiguous tensor's bytes. */
tf_status tf_tensor_write(tf_tensor *t, const void *src, size_t nbytes);
tf_status tf_tensor_read(const tf_tensor *t, void *dst, size_t nbytes);

#ifdef __cplusplus
}
#endif
#endif
