#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "prof.h"

/* Slot 0 is the CPU, slot 1 + i is cuda:i. */
enum { TF_DEVICE_SLOTS = 1 + TF_MAX_CUDA_DEVICES };

static tf_device_ctx tf_ctx_slots[TF_DEVICE_SLOTS];
static char tf_ctx_names[TF_DEVICE_SLOTS][16];
static uint64_t tf_seed_value = 0;
static bool tf_default_set = false;
static tf_device tf_default_dev;

/* By device type: what tf_device_register_backend was given. */
static const tf_backend *tf_backends[2];

void tf_device_register_backend(tf_device_type type, const tf_backend *be) {
  if (type == TF_DEV_CPU || type == TF_DEV_CUDA) tf_backends[type] = be;
}

bool tf_cuda_compiled(void) { return tf_backends[TF_DEV_CUDA] != NULL; }

bool tf_env_is(const char *name, const char *value) {
  const char *env = getenv(name);
  return env && strcmp(env, value) == 0;
}

int tf_cuda_device_count(void) { return tf_cuda_compiled() ? tf_backends[TF_DEV_CUDA]->device_count() : 0; }

tf_status tf_device_parse(const char *s, tf_device *out) {
  if (strcmp(s, "cpu") == 0) {
    *out = tf_cpu();
    return TF_OK;
  }
  if (strcmp(s, "cuda") == 0 || strcmp(s, "gpu") == 0) {
    *out = (tf_device){TF_DEV_CUDA, 0};
    return TF_OK;
  }
  if (strncmp(s, "cuda:", 5) == 0 && s[5]) {
    char *end;
    long idx = strtol(s + 5, &end, 10);
    if (*end == '\0' && idx >= 0 && idx < TF_MAX_CUDA_DEVICES) {
      *out = (tf_device){TF_DEV_CUDA, (int)idx};
      return TF_OK;
    }
  }
  return tf_fail(TF_ERR_ARG, "unknown device '%s' (expected cpu, cuda or cuda:N)", s);
}

void tf_device_format(tf_device d, char *buf, size_t n) {
  if (d.type == TF_DEV_CPU)
    snprintf(buf, n, "cpu");
  else
    snprintf(buf, n, "cuda:%d", d.index);
}

static int tf_device_slot(tf_device d) { return d.type == TF_DEV_CPU ? 0 : 1 + d.index; }

static tf_status tf_device_check(tf_device d) {
  if (d.type == TF_DEV_CPU)
    return tf_backends[TF_DEV_CPU] ? TF_OK
                                   : tf_fail(TF_ERR_STATE, "no backend is registered for the CPU (call "
                                                           "tf_backends_init() before using a device)");
  if (!tf_cuda_compiled())
    return tf_fail(TF_ERR_DEVICE, "no CUDA device: this tfhost was built without CUDA (asked for cuda:%d)", d.index);
  int count = tf_cuda_device_count();
  if (count == 0) return tf_fail(TF_ERR_DEVICE, "no CUDA device is available (asked for cuda:%d)", d.index);
  if (d.index < 0 || d.index >= count)
    return tf_fail(TF_ERR_DEVICE, "device index out of range: cuda:%d (this machine has %d GPU%s)", d.index, count,
                   count == 1 ? "" : "s");
  return TF_OK;
}

static void (*tf_ready_hook)(tf_device_ctx *ctx);

void tf_device_set_ready_hook(void (*hook)(tf_device_ctx *ctx)) {
  tf_ready_hook = hook;
  for (int slot = 0; hook && slot < TF_DEVICE_SLOTS; slot++)
    if (tf_ctx_slots[slot].ready) hook(&tf_ctx_slots[slot]);
}

tf_status tf_device_ctx_get(tf_device d, tf_device_ctx **out) {
  bool in_range = d.type == TF_DEV_CPU || (d.type == TF_DEV_CUDA && d.index >= 0 && d.index < TF_MAX_CUDA_DEVICES);
  if (in_range && tf_ctx_slots[tf_device_slot(d)].ready) {
    *out = &tf_ctx_slots[tf_device_slot(d)];
    return TF_OK;
  }
  TF_TRY(tf_device_check(d));
  int slot = tf_device_slot(d);
  tf_device_ctx *ctx = &tf_ctx_slots[slot];
  const tf_backend *be = tf_backends[d.type];
  *ctx = (tf_device_ctx){0};
  ctx->device = d;
  ctx->backend = be;
  ctx->rng_seed = tf_seed_value;
  tf_device_format(d, tf_ctx_names[slot], sizeof tf_ctx_names[slot]);
  TF_TRY(be->init(ctx));
  tf_alloc_init(&ctx->alloc, tf_ctx_names[slot], (tf_alloc_backend){be->raw_alloc, be->raw_free, ctx});
  ctx->ready = true;
  if (tf_ready_hook) tf_ready_hook(ctx);
  tf_prof_set_device_sync(tf_devices_sync_all);
  *out = ctx;
  return TF_OK;
}

tf_device tf_default_device(void) {
  if (!tf_default_set) {
    tf_default_dev = tf_cuda_device_count() > 0 ? (tf_device){TF_DEV_CUDA, 0} : tf_cpu();
    tf_default_set = true;
  }
  return tf_default_dev;
}

tf_status tf_set_default_device(tf_device d) {
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(d, &ctx));
  tf_default_dev = d;
  tf_default_set = true;
  return TF_OK;
}

tf_status tf_device_info_get(tf_device d, tf_device_info *info) {
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(d, &ctx));
  *info = (tf_device_info){0};
  return ctx->backend->info(ctx, info);
}

tf_status tf_devices_sync_all(void) {
  tf_status first = TF_OK;
  for (int slot = 0; slot < TF_DEVICE_SLOTS; slot++) {
    tf_device_ctx *ctx = &tf_ctx_slots[slot];
    if (!ctx->ready) continue;
    tf_status st = ctx->backend->synchronize(ctx);
    if (st != TF_OK && first == TF_OK) first = st;
  }
  return first;
}

tf_status tf_device_host_alloc(tf_device d, size_t bytes, void **out) {
  *out = NULL;
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(d, &ctx));
  if (ctx->backend->host_alloc) return ctx->backend->host_alloc(ctx, bytes, out);
  if (!(*out = malloc(bytes ? bytes : 1))) return tf_fail(TF_ERR_OOM, "out of memory: no %zu-byte host buffer", bytes);
  return TF_OK;
}

void tf_device_host_free(tf_device d, void *p) {
  if (!p) return;
  tf_device_ctx *ctx;
  if (tf_device_ctx_get(d, &ctx) == TF_OK && ctx->backend->host_free)
    ctx->backend->host_free(ctx, p);
  else
    free(p);
}

tf_status tf_device_sync(tf_device d) {
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(d, &ctx));
  return ctx->backend->synchronize(ctx);
}

void tf_seed_all(uint64_t seed) {
  tf_seed_value = seed;
  for (int slot = 0; slot < TF_DEVICE_SLOTS; slot++) {
    tf_ctx_slots[slot].rng_seed = seed;
    tf_ctx_slots[slot].rng_offset = 0;
  }
}

uint64_t tf_current_seed(void) { return tf_seed_value; }

void tf_devices_shutdown(void) {
  for (int slot = 0; slot < TF_DEVICE_SLOTS; slot++) {
    tf_device_ctx *ctx = &tf_ctx_slots[slot];
    if (!ctx->ready) continue;
    ctx->backend->synchronize(ctx);
    tf_alloc_destroy(&ctx->alloc);
    ctx->backend->shutdown(ctx);
    ctx->ready = false;
  }
}
