/* Reductions on the CPU over a contiguous (outer, r, inner) view. As the
 * correctness oracle, float sums accumulate in double; integer sums in
 * int64. max/min propagate NaN, as PyTorch does. Outputs are spread over
 * the cores, one a thread; a single long sum adds fixed chunks in order. */
#include <math.h>

#include "elemio.h"
#include "cpu.h"

static double tf_cpu_reduce_float(tf_reduce_op op, const void *data, tf_dtype d, int64_t base, int64_t r,
                                  int64_t inner) {
  double acc = tf_elem_get(data, d, base);
  if (op == TF_REDUCE_SUM || op == TF_REDUCE_MEAN) {
    for (int64_t k = 1; k < r; k++) acc += tf_elem_get(data, d, base + k * inner);
    return op == TF_REDUCE_MEAN ? acc / (double)r : acc;
  }
  for (int64_t k = 1; k < r && acc == acc; k++) {
    double v = tf_elem_get(data, d, base + k * inner);
    if (v != v || (op == TF_REDUCE_MAX ? v > acc : v < acc)) acc = v;
  }
  return acc;
}

static int64_t tf_cpu_reduce_int(tf_reduce_op op, const void *data, tf_dtype d, int64_t base, int64_t r,
                                 int64_t inner) {
  const int32_t *i32 = data;
  const int64_t *i64 = data;
  int64_t acc = d == TF_I32 ? i32[base] : i64[base];
  for (int64_t k = 1; k < r; k++) {
    int64_t v = d == TF_I32 ? i32[base + k * inner] : i64[base + k * inner];
    if (op == TF_REDUCE_SUM)
      acc = (int64_t)((uint64_t)acc + (uint64_t)v);
    else if (op == TF_REDUCE_MAX ? v > acc : v < acc)
      acc = v;
  }
  return acc;
}

/* Sums or means of one long run (a single output): fixed chunks summed in
 * parallel, each in order, then the chunks' sums in order, so the result
 * is the same whatever the thread count. */
enum { TF_REDUCE_CHUNK = 1 << 14 };

static double tf_cpu_reduce_long_sum(tf_reduce_op op, const void *data, tf_dtype d, int64_t r) {
  const int64_t chunks = (r + TF_REDUCE_CHUNK - 1) / TF_REDUCE_CHUNK;
  double part[64];
  double total = 0.0;
  for (int64_t c0 = 0; c0 < chunks; c0 += 64) { /* 64 chunks at a time (no allocation) */
    const int64_t nc = chunks - c0 < 64 ? chunks - c0 : 64;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nc; c++) {
      const int64_t k0 = (c0 + c) * TF_REDUCE_CHUNK, k1 = k0 + TF_REDUCE_CHUNK < r ? k0 + TF_REDUCE_CHUNK : r;
      part[c] = tf_cpu_reduce_float(TF_REDUCE_SUM, data, d, k0, k1 - k0, 1);
    }
    for (int64_t c = 0; c < nc; c++) total += part[c];
  }
  return op == TF_REDUCE_MEAN ? total / (double)r : total;
}

tf_status tf_cpu_reduce(tf_device_ctx *ctx, tf_reduce_op op, const tf_tensor *a, int64_t outer, int64_t r,
                        int64_t inner, tf_tensor *out) {
  (void)ctx;
  const void *src = tf_tensor_data(a);
  void *dst = tf_tensor_data(out);
  const bool is_float = tf_dtype_is_float(a->dtype);
  if (is_float && outer * inner == 1 && r > TF_CPU_PARALLEL_MIN && (op == TF_REDUCE_SUM || op == TF_REDUCE_MEAN)) {
    tf_elem_set(dst, out->dtype, 0, tf_cpu_reduce_long_sum(op, src, a->dtype, r));
    return TF_OK;
  }
  /* each output by one thread */
#pragma omp parallel for schedule(static) if (outer * inner * r > TF_CPU_PARALLEL_MIN && outer * inner > 1)
  for (int64_t at = 0; at < outer * inner; at++) {
    const int64_t o = at / inner, i = at % inner, base = o * r * inner + i;
    if (is_float)
      tf_elem_set(dst, out->dtype, at, tf_cpu_reduce_float(op, src, a->dtype, base, r, inner));
    else if (out->dtype == TF_I64)
      ((int64_t *)dst)[at] = tf_cpu_reduce_int(op, src, a->dtype, base, r, inner);
    else
      ((int32_t *)dst)[at] = (int32_t)tf_cpu_reduce_int(op, src, a->dtype, base, r, inner);
  }
  return TF_OK;
}
