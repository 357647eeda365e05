/* Devices, seeds, versions and the environment: what results files record;
 * and tf.mkdir, the one file-system change scripts need besides files. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "backend.h"
#include "backends.h"
#include "bind.h"
#include "hex.h"
#include "embedded.h"
#include "luahost.h"
#include "model_kernels.h"
#include "safe.h"

/* tf.device([device]): "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)". */
static int tf_l_device(lua_State *L) {
  tf_device d = tf_lua_checkdevice(L, 1);
  char name[32];
  tf_device_format(d, name, sizeof name);
  if (d.type == TF_DEV_CPU) {
    lua_pushstring(L, name);
    return 1;
  }
  tf_device_info info;
  TF_LUA_CHECK(L, tf_device_info_get(d, &info), "tf.device");
  lua_pushfstring(L, "%s (%s)", name, info.name);
  return 1;
}

/* tf.default_device(): the short name of the device tensors go to by default. */
static int tf_l_default_device(lua_State *L) {
  char name[32];
  tf_device_format(tf_default_device(), name, sizeof name);
  lua_pushstring(L, name);
  return 1;
}

static int tf_l_set_device(lua_State *L) {
  TF_LUA_CHECK(L, tf_set_default_device(tf_lua_checkdevice(L, 1)), "tf.set_device");
  return 0;
}

/* tf.device_info([device]) -> {name, type, index, total_memory, multiprocessors,
 * compute_capability, driver_version, runtime_version, blas_version}. */
static int tf_l_device_info(lua_State *L) {
  tf_device d = tf_lua_checkdevice(L, 1);
  tf_device_info info;
  TF_LUA_CHECK(L, tf_device_info_get(d, &info), "tf.device_info");
  char name[32];
  tf_device_format(d, name, sizeof name);
  lua_createtable(L, 0, 10);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "device");
  lua_pushstring(L, info.name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, d.type == TF_DEV_CPU ? "cpu" : "cuda");
  lua_setfield(L, -2, "type");
  TF_SET_INT(L, "index", d.index);
  TF_SET_INT(L, "total_memory", info.total_memory);
  TF_SET_INT(L, "multiprocessors", info.multiprocessors);
  if (d.type == TF_DEV_CUDA) {
    lua_pushfstring(L, "%d.%d", info.cc_major, info.cc_minor);
    lua_setfield(L, -2, "compute_capability");
    TF_SET_INT(L, "driver_version", info.driver_version);
    TF_SET_INT(L, "runtime_version", info.runtime_version);
    TF_SET_INT(L, "blas_version", info.blas_version);
  }
  return 1;
}

static int tf_l_cuda_available(lua_State *L) {
  lua_pushboolean(L, tf_cuda_device_count() > 0);
  return 1;
}

static int tf_l_cuda_device_count(lua_State *L) {
  lua_pushinteger(L, tf_cuda_device_count());
  return 1;
}

static int tf_l_cuda_compiled(lua_State *L) {
  lua_pushboolean(L, tf_cuda_compiled());
  return 1;
}

/* tf.cuda.gemm_tuning([device]): what the timed choice of GEMM algorithms
 * (the engine's products) did on a GPU so far, as a table. */
static int tf_l_cuda_gemm_tuning(lua_State *L) {
  const tf_device d = lua_isnoneornil(L, 1) ? (tf_device){TF_DEV_CUDA, 0} : tf_lua_checkdevice(L, 1);
  if (d.type != TF_DEV_CUDA) return luaL_error(L, "tf.cuda.gemm_tuning: %s is not a CUDA device", lua_tostring(L, 1));
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(d, &ctx), "tf.cuda.gemm_tuning");
  tf_gemm_tuning t = {0};
  if (ctx->backend->model && ctx->backend->model->gemm_tuning) ctx->backend->model->gemm_tuning(ctx, &t);
  lua_createtable(L, 0, 8);
  TF_SET_INT(L, "shapes", t.plans);
  TF_SET_INT(L, "changed", t.changed);
  TF_SET_INT(L, "candidates", t.candidates);
  TF_SET_INT(L, "refused", t.refused);
  TF_SET_INT(L, "other_bits", t.other_bits);
  lua_pushnumber(L, t.first_ms);
  lua_setfield(L, -2, "first_ms");
  lua_pushnumber(L, t.chosen_ms);
  lua_setfield(L, -2, "chosen_ms");
  TF_SET_BOOL(L, "enabled", t.enabled);
  return 1;
}

/* tf.cuda.traffic's two halves; lua/tf/init.lua calls fn between them with
 * the count as a to-be-closed value, so that an error in fn goes on up with
 * its own traceback (no protected call here). _cuda_traffic_start([device])
 * turns on the traffic count of the engine's memory-bound kernels
 * (model_kernels.h) and returns the count, whose closing turns it off;
 * _cuda_traffic_counted(count) returns what it counted, { [kernel name] =
 * { calls = n, bytes = b } }. Not nested (one count a process). */
#define TF_TRAFFIC_TYPE "tf.TrafficCount"

typedef struct tf_l_traffic {
  tf_device_ctx *ctx;
  bool on;
  tf_traffic counted; /* what the count held when it was turned off */
} tf_l_traffic;

static bool tf_l_traffic_counting = false;

static int tf_l_traffic_off(lua_State *L) {
  tf_l_traffic *c = luaL_checkudata(L, 1, TF_TRAFFIC_TYPE);
  if (c->on) {
    c->ctx->backend->model->traffic(c->ctx, false, &c->counted);
    c->on = false;
    tf_l_traffic_counting = false;
  }
  return 0;
}

static int tf_l_cuda_traffic_start(lua_State *L) {
  tf_device d = {TF_DEV_CUDA, 0};
  if (!lua_isnoneornil(L, 1) && tf_device_parse(luaL_tolstring(L, 1, NULL), &d) != TF_OK)
    return tf_lua_error(L, "tf.cuda.traffic: %s", tf_last_error());
  if (d.type != TF_DEV_CUDA) return tf_lua_error(L, "tf.cuda.traffic: %s is not a CUDA device", lua_tostring(L, 1));
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(d, &ctx), "tf.cuda.traffic");
  const tf_model_kernels *k = ctx->backend->model;
  if (!k || !k->traffic) return tf_lua_error(L, "tf.cuda.traffic: this build's CUDA backend does not count traffic");
  if (tf_l_traffic_counting) return tf_lua_error(L, "tf.cuda.traffic: already counting (calls do not nest)");
  tf_l_traffic *c = lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  c->ctx = ctx;
  luaL_setmetatable(L, TF_TRAFFIC_TYPE);
  tf_l_traffic_counting = true;
  c->on = true;
  k->traffic(ctx, true, NULL);
  return 1;
}

static int tf_l_cuda_traffic_counted(lua_State *L) {
  tf_l_traffic *c = luaL_checkudata(L, 1, TF_TRAFFIC_TYPE);
  lua_settop(L, 1);
  tf_l_traffic_off(L); /* already off when closed: then nothing */
  lua_createtable(L, 0, c->counted.n);
  for (int i = 0; i < c->counted.n; i++) {
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)c->counted.kernels[i].calls);
    lua_setfield(L, -2, "calls");
    lua_pushnumber(L, c->counted.kernels[i].bytes);
    lua_setfield(L, -2, "bytes");
    lua_setfield(L, -2, c->counted.kernels[i].kernel);
  }
  return 1;
}

/* tf.seed(n): reseeds every device's generator. */
static int tf_l_seed(lua_State *L) {
  lua_Integer seed = luaL_checkinteger(L, 1);
  tf_seed_all((uint64_t)seed);
  return 0;
}

static int tf_l_initial_seed(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)tf_current_seed());
  return 1;
}

/* tf.rng_state([device]) -> {generator = "philox4x32", seed = hex, offset = hex}:
 * where the device's generator stands (hex strings: 64-bit values, safe in JSON). */
static int tf_l_rng_state(lua_State *L) {
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_lua_checkdevice(L, 1), &ctx), "tf.rng_state");
  char hex[17];
  lua_createtable(L, 0, 3);
  lua_pushstring(L, "philox4x32");
  lua_setfield(L, -2, "generator");
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ctx->rng_seed);
  lua_pushstring(L, hex);
  lua_setfield(L, -2, "seed");
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ctx->rng_offset);
  lua_pushstring(L, hex);
  lua_setfield(L, -2, "offset");
  return 1;
}

/* The 16-hex-digit field key of the state table at idx. */
static uint64_t tf_l_rng_field(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  const char *v = lua_tostring(L, -1);
  uint64_t x = 0;
  const bool ok = lua_type(L, -1) == LUA_TSTRING && strlen(v) == 16 && tf_hex16_parse(v, &x);
  if (!ok) tf_lua_error(L, "tf.set_rng_state: %s must be 16 lowercase hex digits (as tf.rng_state gives it)", key);
  lua_pop(L, 1);
  return x;
}

/* tf.set_rng_state(state [, device]): the device's generator back where tf.rng_state found it. */
static int tf_l_set_rng_state(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "generator");
  if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "philox4x32") != 0)
    tf_lua_error(L, "tf.set_rng_state: generator must be \"philox4x32\" (a table tf.rng_state made)");
  lua_pop(L, 1);
  uint64_t seed = tf_l_rng_field(L, 1, "seed"), offset = tf_l_rng_field(L, 1, "offset");
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_lua_checkdevice(L, 2), &ctx), "tf.set_rng_state");
  ctx->rng_seed = seed;
  ctx->rng_offset = offset;
  return 0;
}

/* Ctrl-C as a flag a script polls (tf.catch_interrupt): the first SIGINT
 * sets it and gives the signal back its default action, so a second one
 * stops the process at once. */
static volatile sig_atomic_t tf_interrupt_seen;
static bool tf_interrupt_caught;
static struct sigaction tf_interrupt_before;

static void tf_on_interrupt(int sig) {
  tf_interrupt_seen = 1;
  signal(sig, SIG_DFL);
}

/* tf.catch_interrupt([on = true]) -> whether it was on: Ctrl-C (SIGINT) sets
 * tf.interrupted() instead of stopping the script; off puts back what was there. */
static int tf_l_catch_interrupt(lua_State *L) {
  bool on = lua_isnone(L, 1) || lua_toboolean(L, 1);
  bool was = tf_interrupt_caught;
  if (on && !was) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tf_on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &tf_interrupt_before);
    tf_interrupt_seen = 0;
  } else if (!on && was) {
    sigaction(SIGINT, &tf_interrupt_before, NULL);
  }
  tf_interrupt_caught = on;
  lua_pushboolean(L, was);
  return 1;
}

/* tf.interrupted() -> whether Ctrl-C came since tf.catch_interrupt(). */
static int tf_l_interrupted(lua_State *L) {
  lua_pushboolean(L, tf_interrupt_seen != 0);
  return 1;
}

/* tf.allow_tf32(on [, device]) -> previous setting: f32 matmuls may use TF32. */
static int tf_l_allow_tf32(lua_State *L) {
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_lua_checkdevice(L, 2), &ctx), "tf.allow_tf32");
  bool previous = ctx->allow_tf32;
  if (!lua_isnone(L, 1)) ctx->allow_tf32 = lua_toboolean(L, 1);
  lua_pushboolean(L, previous);
  return 1;
}

/* tf.threads([n]) -> the CPU thread count (OpenMP and the BLAS), before n is set */
static int tf_l_threads(lua_State *L) {
  const int previous = tf_cpu_threads();
  if (!lua_isnoneornil(L, 1)) {
    lua_Integer n = luaL_checkinteger(L, 1);
    if (n < 1 || n > TF_CPU_MAX_THREADS)
      return tf_lua_error(L, "tf.threads: need a count in 1..%d, not %I", TF_CPU_MAX_THREADS, n);
    TF_LUA_CHECK(L, tf_cpu_set_threads((int)n), "tf.threads");
  }
  lua_pushinteger(L, previous);
  return 1;
}

/* tf.sysinfo() -> {hostname, os, kernel, machine, lua, cpu, cpu_cores, threads, blas, lua_heap_used,
 * lua_heap_limit} */
static int tf_l_sysinfo(lua_State *L) {
  lua_createtable(L, 0, 10);
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) == 0) {
    lua_pushstring(L, host);
    lua_setfield(L, -2, "hostname");
  }
  struct utsname u;
  if (uname(&u) == 0) {
    lua_pushstring(L, u.sysname);
    lua_setfield(L, -2, "os");
    lua_pushstring(L, u.release);
    lua_setfield(L, -2, "kernel");
    lua_pushstring(L, u.machine);
    lua_setfield(L, -2, "machine");
  }
  lua_pushstring(L, LUA_RELEASE);
  lua_setfield(L, -2, "lua");
  tf_device_info info;
  if (tf_device_info_get(tf_cpu(), &info) == TF_OK) {
    lua_pushstring(L, info.name);
    lua_setfield(L, -2, "cpu");
    TF_SET_INT(L, "cpu_cores", info.multiprocessors);
    TF_SET_INT(L, "host_memory", info.total_memory);
  }
  TF_SET_INT(L, "threads", tf_cpu_threads());
  lua_pushstring(L, tf_cpu_blas_name());
  lua_setfield(L, -2, "blas");
  TF_SET_INT(L, "lua_heap_used", tf_lua_heap_used(L));
  TF_SET_INT(L, "lua_heap_limit", tf_lua_heap_limit(L));
  return 1;
}

/* tf.mkdir(path) -> path: makes the folder and any missing parents (as
 * mkdir -p; an existing folder is fine). Each folder is checked against
 * --safe's write rule just before it is made, so experiments need no shell. */
static int tf_l_mkdir(lua_State *L) {
  size_t len;
  const char *path = luaL_checklstring(L, 1, &len);
  if (len == 0 || strlen(path) != len) return tf_lua_error(L, "tf.mkdir: expected a folder name without NUL bytes");
  luaL_Buffer b;
  char *copy = luaL_buffinitsize(L, &b, len + 1);
  memcpy(copy, path, len + 1);
  for (size_t i = 1; i <= len; i++) {
    if (copy[i] != '/' && copy[i] != '\0') continue;
    char saved = copy[i];
    copy[i] = '\0';
    struct stat st;
    if (stat(copy, &st) != 0) {
      tf_safe_check_path(L, copy, true, "tf.mkdir");
      if (mkdir(copy, 0777) != 0 && errno != EEXIST)
        return tf_lua_error(L, "tf.mkdir: %s: %s", copy, strerror(errno));
    } else if (!S_ISDIR(st.st_mode) && saved == '\0') {
      return tf_lua_error(L, "tf.mkdir: %s exists and is not a folder", copy);
    }
    copy[i] = saved;
  }
  lua_settop(L, 1);
  return 1;
}

static const luaL_Reg tf_sys_functions[] = {
    {"mkdir", tf_l_mkdir},
    {"device", tf_l_device},
    {"default_device", tf_l_default_device},
    {"set_device", tf_l_set_device},
    {"device_info", tf_l_device_info},
    {"cuda_available", tf_l_cuda_available},
    {"cuda_device_count", tf_l_cuda_device_count},
    {"cuda_compiled", tf_l_cuda_compiled},
    {"cuda_gemm_tuning", tf_l_cuda_gemm_tuning},
    {"_cuda_traffic_start", tf_l_cuda_traffic_start},
    {"_cuda_traffic_counted", tf_l_cuda_traffic_counted},
    {"seed", tf_l_seed},
    {"initial_seed", tf_l_initial_seed},
    {"rng_state", tf_l_rng_state},
    {"catch_interrupt", tf_l_catch_interrupt},
    {"interrupted", tf_l_interrupted},
    {"set_rng_state", tf_l_set_rng_state},
    {"allow_tf32", tf_l_allow_tf32},
    {"sysinfo", tf_l_sysinfo},
    {"threads", tf_l_threads},
    {NULL, NULL},
};

void tf_open_sys(lua_State *L) {
  static const luaL_Reg traffic_meta[] = {{"__close", tf_l_traffic_off}, {NULL, NULL}};
  tf_lua_newclass(L, TF_TRAFFIC_TYPE, traffic_meta, NULL);
  luaL_setfuncs(L, tf_sys_functions, 0);
  lua_pushstring(L, tf_version);
  lua_setfield(L, -2, "version");
  lua_pushstring(L, tf_commit);
  lua_setfield(L, -2, "commit");
  lua_pushstring(L, tf_build_options);
  lua_setfield(L, -2, "build_options");
}
