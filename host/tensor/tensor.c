#include "tensor.h"

#include <stdio.h>
#include <stdlib.h>

#include "backend.h"

tf_status tf_shape_check(const tf_shape *s) {
  if (s->ndim < 0 || s->ndim > TF_MAX_DIMS)
    return tf_fail(TF_ERR_ARG, "a tensor has 0 to %d dimensions, not %d", TF_MAX_DIMS, s->ndim);
  int64_t numel = 1;
  for (int i = 0; i < s->ndim; i++) {
    if (s->dims[i] < 0) return tf_fail(TF_ERR_ARG, "negative size %lld for dimension %d", (long long)s->dims[i], i);
    if (s->dims[i] > 0 && numel > INT64_MAX / 16 / s->dims[i])
      return tf_fail(TF_ERR_ARG, "shape has too many elements");
    numel *= s->dims[i];
  }
  return TF_OK;
}

int64_t tf_shape_numel(const tf_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->dims[i];
  return n;
}

const char *tf_shape_format(const tf_shape *s, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < s->ndim && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)s->dims[i]);
  if (used < n) snprintf(buf + used, n - used, s->ndim == 1 ? ",)" : ")");
  return buf;
}

void tf_contiguous_strides(const tf_shape *s, int64_t *strides) {
  int64_t st = 1;
  for (int i = s->ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= s->dims[i] > 0 ? s->dims[i] : 1;
  }
}

static tf_tensor *tf_tensor_alloc_header(const tf_shape *shape, tf_dtype dtype, tf_device device) {
  tf_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->refcount = 1;
  t->dtype = dtype;
  t->device = device;
  t->ndim = shape->ndim;
  for (int i = 0; i < shape->ndim; i++) t->shape[i] = shape->dims[i];
  return t;
}

tf_status tf_tensor_empty(const tf_shape *shape, tf_dtype dtype, tf_device device, tf_tensor **out) {
  TF_TRY(tf_shape_check(shape));
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(device, &ctx));
  size_t nbytes = (size_t)tf_shape_numel(shape) * tf_dtype_size(dtype);
  tf_storage *st = calloc(1, sizeof *st);
  tf_tensor *t = tf_tensor_alloc_header(shape, dtype, device);
  if (!st || !t) {
    free(st);
    free(t);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a tensor header");
  }
  if (nbytes > 0) {
    tf_status s = tf_alloc(&ctx->alloc, nbytes, &st->block);
    if (s != TF_OK) {
      free(st);
      free(t);
      return s;
    }
    st->data = st->block->ptr;
  }
  st->refcount = 1;
  st->device = device;
  st->nbytes = nbytes;
  t->storage = st;
  tf_contiguous_strides(shape, t->strides);
  *out = t;
  return TF_OK;
}

tf_status tf_tensor_view(const tf_tensor *t, const tf_shape *shape, const int64_t *strides, int64_t offset,
                         tf_tensor **out) {
  TF_TRY(tf_shape_check(shape));
  tf_tensor *v = tf_tensor_alloc_header(shape, t->dtype, t->device);
  if (!v) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a tensor header");
  for (int i = 0; i < shape->ndim; i++) v->strides[i] = strides[i];
  v->offset = offset;
  v->storage = t->storage;
  v->storage->refcount++;
  *out = v;
  return TF_OK;
}

tf_tensor *tf_tensor_retain(tf_tensor *t) {
  t->refcount++;
  return t;
}

static void tf_storage_release(tf_storage *st) {
  if (--st->refcount > 0) return;
  if (st->block) {
    tf_device_ctx *ctx;
    if (tf_device_ctx_get(st->device, &ctx) == TF_OK) tf_alloc_free(&ctx->alloc, st->block);
  }
  free(st);
}

/* Set by autograd before it makes its first node: the tensor layer knows
 * nodes only through this (a tensor has a grad_fn only if autograd set one). */
static void (*tf_node_release_hook)(tf_node *);

void tf_tensor_set_node_release(void (*release)(tf_node *)) { tf_node_release_hook = release; }

void tf_tensor_release(tf_tensor *t) {
  if (!t || --t->refcount > 0) return;
  tf_storage_release(t->storage);
  tf_tensor_release(t->grad);
  if (t->grad_fn) tf_node_release_hook(t->grad_fn);
  free(t);
}

int64_t tf_tensor_numel(const tf_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

tf_shape tf_tensor_shape(const tf_tensor *t) {
  tf_shape s = {.ndim = t->ndim};
  for (int i = 0; i < t->ndim; i++) s.dims[i] = t->shape[i];
  return s;
}

bool tf_tensor_is_contiguous(const tf_tensor *t) {
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if (t->shape[i] == 0) return true;
    if (t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

size_t tf_tensor_nbytes(const tf_tensor *t) { return (size_t)tf_tensor_numel(t) * tf_dtype_size(t->dtype); }

void *tf_tensor_data(const tf_tensor *t) {
  if (!t->storage->data) return NULL;
  return (char *)t->storage->data + t->offset * (int64_t)tf_dtype_size(t->dtype);
}

static tf_status tf_tensor_host_copy(const tf_tensor *t, void *dst, const void *src, size_t nbytes, tf_copy_dir dir) {
  if (!tf_tensor_is_contiguous(t)) return tf_fail(TF_ERR_ARG, "tensor is not contiguous");
  if (nbytes != tf_tensor_nbytes(t))
    return tf_fail(TF_ERR_ARG, "byte count %zu does not match the tensor's %zu", nbytes, tf_tensor_nbytes(t));
  if (nbytes == 0) return TF_OK;
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(t->device, &ctx));
  return ctx->backend->copy(ctx, dst, src, nbytes, dir);
}

tf_status tf_tensor_write(tf_tensor *t, const void *src, size_t nbytes) {
  return tf_tensor_host_copy(t, tf_tensor_data(t), src, nbytes, TF_COPY_H2D);
}

tf_status tf_tensor_read(const tf_tensor *t, void *dst, size_t nbytes) {
  return tf_tensor_host_copy(t, dst, tf_tensor_data(t), nbytes, TF_COPY_D2H);
}
