/* Dtype conversion and strided copies, fill and arange on the CPU (element
 * conversion rules: host/base/elemio.h). Random numbers: random.c. */
#include <math.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"

typedef struct {
  const char *src;
  char *dst;
  tf_dtype sd, dd;
  bool saturate;
} tf_cpu_convert_job;

/* One row: operand 0 is the source, operand 1 the (possibly strided) destination. */
static void tf_cpu_convert_rows(void *ud, int64_t oo, int64_t o0, int64_t o1, int64_t n, int64_t s0, int64_t s1) {
  (void)oo;
  tf_cpu_convert_job *j = ud;
  size_t ss = tf_dtype_size(j->sd), ds = tf_dtype_size(j->dd);
  const char *src = j->src + o0 * (int64_t)ss;
  char *dst = j->dst + o1 * (int64_t)ds;
  if (j->saturate) {
    for (int64_t i = 0; i < n; i++) tf_elem_convert_saturated(dst, j->dd, i * s1, src, j->sd, i * s0);
    return;
  }
  if (j->sd == j->dd) {
    if (s0 == 1 && s1 == 1)
      memcpy(dst, src, (size_t)n * ss);
    else
      for (int64_t i = 0; i < n; i++) memcpy(dst + i * s1 * (int64_t)ss, src + i * s0 * (int64_t)ss, ss);
    return;
  }
  for (int64_t i = 0; i < n; i++) tf_elem_convert(dst, j->dd, i * s1, src, j->sd, i * s0);
}

tf_status tf_cpu_convert(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst) {
  (void)ctx;
  tf_cpu_convert_job job = {src->storage->data, dst->storage->data, src->dtype, dst->dtype, false};
  tf_cpu_for_rows(dst, src, dst, tf_cpu_convert_rows, &job);
  return TF_OK;
}

tf_status tf_cpu_convert_saturate(tf_device_ctx *ctx, const tf_tensor *src, tf_tensor *dst) {
  (void)ctx;
  tf_cpu_convert_job job = {src->storage->data, dst->storage->data, src->dtype, dst->dtype, true};
  tf_cpu_for_rows(dst, src, dst, tf_cpu_convert_rows, &job);
  return TF_OK;
}

enum { TF_CPU_FILL_BLOCK = 4096 }; /* elements: 16 KiB of f32, in L1 while copied */

tf_status tf_cpu_fill(tf_device_ctx *ctx, tf_tensor *out, double value) {
  (void)ctx;
  int64_t n = tf_tensor_numel(out);
  void *data = tf_tensor_data(out);
  size_t es = tf_dtype_size(out->dtype);
  if (n == 0) return TF_OK;
  tf_elem_set(data, out->dtype, 0, value);
  /* the first block by doubling (k elements copied onto the next k), then
   * the block onto the rest on every core: on one core alone a model's
   * zero_grad was slow */
  const int64_t block = n < TF_CPU_FILL_BLOCK ? n : TF_CPU_FILL_BLOCK;
  for (int64_t k = 1; k < block; k *= 2)
    memcpy((char *)data + k * (int64_t)es, data, (size_t)((k < block - k ? k : block - k) * (int64_t)es));
#pragma omp parallel for schedule(static) if (n > TF_CPU_PARALLEL_MIN)
  for (int64_t at = block; at < n; at += block)
    memcpy((char *)data + at * (int64_t)es, data, (size_t)((block < n - at ? block : n - at) * (int64_t)es));
  return TF_OK;
}

tf_status tf_cpu_arange(tf_device_ctx *ctx, tf_tensor *out, double start, double step) {
  (void)ctx;
  int64_t n = tf_tensor_numel(out);
  void *data = tf_tensor_data(out);
  for (int64_t i = 0; i < n; i++) tf_elem_set(data, out->dtype, i, start + (double)i * step);
  return TF_OK;
}
