/* The CPU backend: plain C, always built, the correctness oracle for the
 * CUDA backend. Memory goes through the same caching allocator as on a GPU,
 * so memory accounting behaves (and is tested) the same. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_prof.h"
#include "cpu_nn.h"

struct tf_event {
  int64_t at_ns; /* the process's clock */
};

static tf_status tf_cpu_init(tf_device_ctx *ctx) {
  (void)ctx;
  return TF_OK;
}

static void tf_cpu_shutdown(tf_device_ctx *ctx) { (void)ctx; }

static void tf_cpu_model_name(char *buf, size_t n) {
  snprintf(buf, n, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    char *colon = strchr(line, ':');
    if (!colon) break;
    colon++;
    while (*colon == ' ' || *colon == '\t') colon++;
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(buf, n, "%s", colon);
    break;
  }
  fclose(f);
}

/* The machine's physical memory in bytes (0 when unknown), read once. */
static size_t tf_cpu_host_memory(void) {
  static size_t bytes = (size_t)-1;
  if (bytes == (size_t)-1) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
  }
  return bytes;
}

static tf_status tf_cpu_info(tf_device_ctx *ctx, tf_device_info *info) {
  (void)ctx;
  tf_cpu_model_name(info->name, sizeof info->name);
  info->total_memory = tf_cpu_host_memory();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  info->multiprocessors = cores > 0 ? (int)cores : 1;
  return TF_OK;
}

static tf_status tf_cpu_raw_alloc(void *ctx, size_t bytes, void **ptr) {
  (void)ctx;
  /* a request beyond physical memory fails here: where the kernel overcommits,
   * malloc would succeed and the first write would bring the OOM killer */
  const size_t memory = tf_cpu_host_memory();
  if (memory > 0 && bytes > memory) {
    *ptr = NULL;
    return tf_fail(TF_ERR_OOM, "out of memory: host allocation of %zu bytes is more than the machine's memory", bytes);
  }
  *ptr = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!*ptr) return tf_fail(TF_ERR_OOM, "out of memory: host allocation of %zu bytes failed", bytes);
  return TF_OK;
}

static void tf_cpu_raw_free(void *ctx, void *ptr) {
  (void)ctx;
  free(ptr);
}

static tf_status tf_cpu_copy(tf_device_ctx *ctx, void *dst, const void *src, size_t bytes, tf_copy_dir dir) {
  (void)ctx, (void)dir;
  memmove(dst, src, bytes);
  return TF_OK;
}

static tf_status tf_cpu_synchronize(tf_device_ctx *ctx) {
  (void)ctx;
  return TF_OK;
}

static tf_status tf_cpu_event_record(tf_device_ctx *ctx, tf_event **ev) {
  (void)ctx;
  *ev = malloc(sizeof **ev);
  if (!*ev) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a timer event");
  (*ev)->at_ns = tf_clock_ns();
  return TF_OK;
}

static tf_status tf_cpu_event_elapsed(tf_device_ctx *ctx, tf_event *start, tf_event *end, double *ms) {
  (void)ctx;
  *ms = (double)(end->at_ns - start->at_ns) * 1e-6;
  return TF_OK;
}

static void tf_cpu_event_destroy(tf_device_ctx *ctx, tf_event *ev) {
  (void)ctx;
  free(ev);
}

static int tf_cpu_device_count(void) { return 1; }

static const tf_backend tf_cpu_backend_table = {
    .name = "cpu",
    .device_count = tf_cpu_device_count,
    .init = tf_cpu_init,
    .shutdown = tf_cpu_shutdown,
    .info = tf_cpu_info,
    .raw_alloc = tf_cpu_raw_alloc,
    .raw_free = tf_cpu_raw_free,
    .copy = tf_cpu_copy,
    .synchronize = tf_cpu_synchronize,
    .event_record = tf_cpu_event_record,
    .event_elapsed_ms = tf_cpu_event_elapsed,
    .event_destroy = tf_cpu_event_destroy,
    .fill = tf_cpu_fill,
    .arange = tf_cpu_arange,
    .random = tf_cpu_random,
    .convert = tf_cpu_convert,
    .convert_saturate = tf_cpu_convert_saturate,
    .unary = tf_cpu_unary,
    .binary = tf_cpu_binary,
    .reduce = tf_cpu_reduce,
    .matmul = tf_cpu_matmul,
    .softmax = tf_cpu_softmax,
    .norm = tf_cpu_norm,
    .cross_entropy = tf_cpu_cross_entropy,
    .rope = tf_cpu_rope,
    .embedding = tf_cpu_embedding,
    .masked_fill = tf_cpu_masked_fill,
    .adamw = tf_cpu_adamw,
    .flash_attention = tf_cpu_flash_attention,
    .flash_workspace = tf_cpu_flash_workspace,
    .model = &tf_cpu_model_kernels,
};

/* Wrapped so that a running tf.prof collector times each op on the host
 * (the CPU's "kernels"); the wrapper costs a flag test otherwise. */
const tf_backend *tf_cpu_backend(void) { return tf_cpu_prof_backend(&tf_cpu_backend_table); }
