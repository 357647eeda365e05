/* tf._rtc: kernels compiled at run time, for tf.cuda.compile (lua/tf/cuda.lua). That module reads
 * options, keeps the cache and reads the kernels' declarations; this file compiles (NVRTC), loads
 * a compiled image on a device (tf.CudaLibrary) and launches its kernels (tf.CudaKernel) after
 * checking every argument against the declared parameter list and the device's limits. The launch
 * is all C: a script launching a small kernel in a loop pays for the checks and one driver
 * launch (kernels/cuda/rtc.cu). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bind.h"
#include "clock.h"
#include "model_kernels.h"
#include "prof.h"
#include "rtc.h"
#include "safe.h"

/* tf_lua_error with printf's conversions (%zu, %llu, %u: this file's messages use them), which
 * lua_pushfstring lacks. */
static int tf_l_error(lua_State *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int tf_l_error(lua_State *L, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tf_lua_error(L, "%s", msg);
}

#define TF_LIBRARY_TYPE "tf.CudaLibrary"
#define TF_KERNEL_TYPE "tf.CudaKernel"
#define TF_TENSOR_MAP_TYPE "tf.CudaTensorMap"

/* The run-time compiler, or a Lua error naming fname when the build has none. Under --safe without
 * --allow-kernels, compiling and loading are refused (guarded); reading versions is not. */
static const tf_rtc_api *tf_l_rtc_api_of(lua_State *L, const char *fname, bool guarded) {
  if (guarded && !tf_safe_kernels_allowed(L))
    tf_l_error(L, "--safe: %s is not available (a kernel can read and write any GPU memory of the process; "
                    "tfhost --safe --allow-kernels allows it)",
                 fname);
  const tf_rtc_api *api = tf_rtc();
  if (!api)
    tf_l_error(L, "%s: this tfhost was built without the CUDA backend (no CUDA Toolkit at build time), so it "
                    "cannot compile kernels",
                 fname);
  return api;
}

static const tf_rtc_api *tf_l_rtc_api(lua_State *L, const char *fname) { return tf_l_rtc_api_of(L, fname, true); }

/* tf._rtc.version() -> major, minor of NVRTC */
static int tf_l_rtc_version(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api_of(L, "tf.cuda.nvrtc_version", false);
  int major = 0, minor = 0;
  TF_LUA_CHECK(L, api->version(&major, &minor), "tf.cuda.nvrtc_version");
  lua_pushinteger(L, major);
  lua_pushinteger(L, minor);
  return 2;
}

/* tf._rtc.targets() -> {75, 80, ..., 90, ...}: the real targets NVRTC compiles for */
static int tf_l_rtc_targets(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api_of(L, "tf.cuda.targets", false);
  int t[128], n = 0;
  TF_LUA_CHECK(L, api->targets(t, 128, &n), "tf.cuda.targets");
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, t[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* The strings of the list at idx (NULL-free), into a Lua-owned array on the stack. */
static const char **tf_l_strings(lua_State *L, int idx, int *n) {
  *n = (int)luaL_len(L, idx);
  const char **s = lua_newuserdatauv(L, sizeof *s * (size_t)(*n + 1), 0);
  for (int i = 0; i < *n; i++) {
    lua_rawgeti(L, idx, i + 1);
    s[i] = lua_tostring(L, -1); /* the list keeps the string alive */
    lua_pop(L, 1);
    if (!s[i]) luaL_error(L, "tf._rtc.compile: entry %d of argument %d is not a string", i + 1, idx);
  }
  return s;
}

static void tf_l_free_result(void *p) {
  tf_rtc_result *r = p;
  tf_rtc()->result_free(r);
  free(r);
}

/* tf._rtc.compile(text, name, options, header_names, headers, expressions)
 *   -> {ok = bool, log = string, code = string, cubin = bool, lowered = {...}, ms = compile time} */
static int tf_l_rtc_compile(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api(L, "tf.cuda.compile");
  tf_rtc_source src = {0};
  src.text = luaL_checkstring(L, 1);
  src.name = luaL_checkstring(L, 2);
  for (int i = 3; i <= 6; i++) luaL_checktype(L, i, LUA_TTABLE);
  src.options = tf_l_strings(L, 3, &src.noptions);
  src.header_names = tf_l_strings(L, 4, &src.nheaders);
  int nh;
  src.headers = tf_l_strings(L, 5, &nh);
  if (nh != src.nheaders) return luaL_error(L, "tf._rtc.compile: %d header names for %d headers", src.nheaders, nh);
  src.expressions = tf_l_strings(L, 6, &src.nexpressions);
  void **slot = tf_lua_push_owner(L, tf_l_free_result);
  tf_rtc_result *r = calloc(1, sizeof *r);
  if (!r) return luaL_error(L, "tf.cuda.compile: out of memory");
  *slot = r;
  int64_t t0 = tf_clock_ns();
  TF_LUA_CHECK(L, api->compile(&src, r), "tf.cuda.compile");
  double ms = (double)(tf_clock_ns() - t0) / 1e6;
  lua_createtable(L, 0, 6);
  TF_SET_BOOL(L, "ok", r->ok);
  TF_SET_STR(L, "log", r->log ? r->log : "");
  lua_pushnumber(L, ms);
  lua_setfield(L, -2, "ms");
  if (r->ok) {
    lua_pushlstring(L, r->code, r->is_cubin ? r->size : strlen(r->code));
    lua_setfield(L, -2, "code");
    TF_SET_BOOL(L, "cubin", r->is_cubin);
    lua_createtable(L, r->nlowered, 0);
    for (int i = 0; i < r->nlowered; i++) {
      lua_pushstring(L, r->lowered[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "lowered");
  }
  return 1;
}

/* ---- tf.CudaLibrary: a compiled image loaded on one device ------------------------------------ */

typedef struct tf_l_library {
  void *lib; /* NULL once unloaded */
  tf_device device;
} tf_l_library;

static tf_l_library *tf_l_checklibrary(lua_State *L, int idx) {
  tf_l_library *l = luaL_checkudata(L, idx, TF_LIBRARY_TYPE);
  if (!l->lib) luaL_argerror(L, idx, "the library was unloaded");
  return l;
}

/* tf._rtc.load(code, device) -> library */
static int tf_l_rtc_load(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api(L, "tf.cuda.compile");
  size_t n;
  const char *code = luaL_checklstring(L, 1, &n);
  tf_device d = tf_lua_checkdevice(L, 2);
  if (d.type != TF_DEV_CUDA) return tf_l_error(L, "tf.cuda.compile: kernels are loaded on a CUDA device, not the CPU");
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(d, &ctx), "tf.cuda.compile");
  tf_l_library *l = lua_newuserdatauv(L, sizeof *l, 0);
  *l = (tf_l_library){NULL, d};
  luaL_setmetatable(L, TF_LIBRARY_TYPE);
  (void)n;
  TF_LUA_CHECK(L, api->load(ctx, code, &l->lib), "tf.cuda.compile");
  return 1;
}

static int tf_l_library_gc(lua_State *L) {
  tf_l_library *l = luaL_checkudata(L, 1, TF_LIBRARY_TYPE);
  if (l->lib && tf_rtc()) tf_rtc()->unload(l->lib);
  l->lib = NULL;
  return 0;
}

/* ---- tf.CudaKernel: one kernel, its parameter list and its device's limits --------------------- */

typedef enum { TF_P_POINTER, TF_P_VIEW, TF_P_INT, TF_P_UINT, TF_P_FLOAT, TF_P_BOOL, TF_P_TENSOR_MAP } tf_param_kind;

typedef struct tf_l_param {
  tf_param_kind kind;
  int bytes;       /* of a number: 1, 2, 4, 8 */
  int dtype;       /* of a pointer or view: a tf_dtype, or -1 for any (void *) */
  int ndim;        /* of a view */
  char name[48];   /* as declared, for messages */
} tf_l_param;

typedef struct tf_l_kernel {
  void *kernel;
  tf_device_ctx *ctx;
  tf_rtc_kernel_info info;
  tf_rtc_limits limits;
  size_t shared_allowed;
  void *function; /* what the backend launches, found on the first launch */
  int nparams;
  tf_l_param params[TF_RTC_MAX_PARAMS];
  char name[160]; /* as the script names it: "row_softmax<256, float>" */
} tf_l_kernel;

static const char *const tf_l_kind_names[] = {"pointer", "view", "int", "uint", "float", "bool", "tensor_map", NULL};

/* The parameter list from Lua: {{name =, kind =, bytes =, dtype =, ndim =}, ...} */
static void tf_l_read_params(lua_State *L, int idx, tf_l_kernel *k) {
  int n = (int)luaL_len(L, idx);
  if (n > TF_RTC_MAX_PARAMS) luaL_error(L, "kernel %s: more than %d parameters", k->name, TF_RTC_MAX_PARAMS);
  for (int i = 0; i < n; i++) {
    tf_l_param *p = &k->params[i];
    lua_rawgeti(L, idx, i + 1);
    lua_getfield(L, -1, "kind");
    p->kind = (tf_param_kind)luaL_checkoption(L, -1, NULL, tf_l_kind_names);
    lua_getfield(L, -2, "bytes");
    p->bytes = (int)luaL_optinteger(L, -1, 8);
    lua_getfield(L, -3, "dtype");
    p->dtype = -1;
    if (!lua_isnil(L, -1)) {
      tf_dtype dt;
      if (tf_dtype_parse(luaL_checkstring(L, -1), &dt) != TF_OK)
        luaL_error(L, "kernel %s: parameter %d has an unknown dtype %s", k->name, i + 1, lua_tostring(L, -1));
      p->dtype = (int)dt;
    }
    lua_getfield(L, -4, "ndim");
    p->ndim = (int)luaL_optinteger(L, -1, 0);
    lua_getfield(L, -5, "name");
    snprintf(p->name, sizeof p->name, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
    lua_pop(L, 6);
    if (p->kind == TF_P_VIEW && (p->ndim < 1 || p->ndim > TF_MAX_DIMS))
      luaL_error(L, "kernel %s: parameter %s is a tf::view of %d dimensions (1 to %d)", k->name, p->name, p->ndim,
                 TF_MAX_DIMS);
  }
  k->nparams = n;
}

/* The bytes a parameter takes in the kernel's parameter buffer. */
static size_t tf_l_param_bytes(const tf_l_param *p) {
  switch (p->kind) {
  case TF_P_POINTER: return sizeof(void *);
  case TF_P_VIEW: return sizeof(void *) + 16 * (size_t)p->ndim;
  case TF_P_TENSOR_MAP: return TF_RTC_TENSOR_MAP_BYTES;
  default: return (size_t)p->bytes;
  }
}

/* lib:kernel(lowered, name, params, probe_more) -> kernel: checks the declared list against the
 * driver's (probe_more: a list the script declared, which may be short, so one more is asked for). */
static int tf_l_library_kernel(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api(L, "tf.cuda.compile");
  tf_l_library *lib = tf_l_checklibrary(L, 1);
  const char *lowered = luaL_checkstring(L, 2);
  const char *name = luaL_checkstring(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  tf_l_kernel *k = lua_newuserdatauv(L, sizeof *k, 1);
  memset(k, 0, sizeof *k);
  luaL_setmetatable(L, TF_KERNEL_TYPE);
  lua_pushvalue(L, 1); /* the kernel keeps its library loaded */
  lua_setiuservalue(L, -2, 1);
  snprintf(k->name, sizeof k->name, "%s", name);
  TF_LUA_CHECK(L, tf_device_ctx_get(lib->device, &k->ctx), "mod:kernel");
  tf_l_read_params(L, 4, k);
  TF_LUA_CHECK(L, api->kernel(lib->lib, lowered, k->nparams, lua_toboolean(L, 5), &k->kernel, &k->info), "mod:kernel");
  TF_LUA_CHECK(L, api->limits(k->ctx, &k->limits), "mod:kernel");
  if (k->nparams != k->info.nparams)
    return tf_l_error(L, "mod:kernel: kernel %s is declared with %d parameters but its compiled code has %d", name,
                        k->nparams, k->info.nparams);
  for (int i = 0; i < k->nparams; i++)
    if (tf_l_param_bytes(&k->params[i]) != k->info.param_size[i])
      return tf_l_error(L, "mod:kernel: kernel %s: parameter %d (%s) is read as %zu bytes but the compiled code "
                             "takes %zu",
                          name, i + 1, k->params[i].name, tf_l_param_bytes(&k->params[i]), k->info.param_size[i]);
  return 1;
}

static tf_l_kernel *tf_l_checkkernel(lua_State *L, int idx) { return luaL_checkudata(L, idx, TF_KERNEL_TYPE); }

/* {x [, y [, z]]} or a number, on top of the stack (the launch's `field`), each >= 1 and within max. */
static void tf_l_dims(lua_State *L, const char *field, const tf_l_kernel *k, const unsigned max[3], unsigned out[3]) {
  out[0] = out[1] = out[2] = 1;
  int t = lua_type(L, -1);
  int n = t == LUA_TTABLE ? (int)luaL_len(L, -1) : 1;
  if (t != LUA_TTABLE && t != LUA_TNUMBER)
    tf_l_error(L, "kernel %s: %s must be a number or {x, y, z}, not a %s", k->name, field, luaL_typename(L, -1));
  if (n < 1 || n > 3) tf_l_error(L, "kernel %s: %s has %d sizes (1 to 3)", k->name, field, n);
  static const char axis[] = "xyz";
  for (int i = 0; i < n; i++) {
    if (t == LUA_TTABLE) lua_rawgeti(L, -1, i + 1);
    int isint;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint) tf_l_error(L, "kernel %s: %s.%c must be an integer", k->name, field, axis[i]);
    if (v < 1 || (lua_Unsigned)v > max[i])
      tf_l_error(L, "kernel %s: %s.%c = %lld is outside 1..%u, the device's limit", k->name, field, axis[i],
                   (long long)v, max[i]);
    out[i] = (unsigned)v;
    if (t == LUA_TTABLE) lua_pop(L, 1);
  }
}

/* What a launch checks on every call, found without the registry's lookup by name: the kernels' and
 * the tensors' metatables are the launch's upvalues. */
enum { TF_L_KERNEL_MT = 1, TF_L_TENSOR_MT = 2 };

static bool tf_l_is(lua_State *L, int idx, int upvalue) {
  if (!lua_getmetatable(L, idx)) return false;
  bool same = lua_rawequal(L, -1, lua_upvalueindex(upvalue));
  lua_pop(L, 1);
  return same;
}

/* A Lua error naming the parameter where `what` (a tensor, a map's tensor) is on another device than the
 * kernel. */
static void tf_l_check_device(lua_State *L, const tf_l_kernel *k, int i, tf_device d, const char *what) {
  if (d.type == k->ctx->device.type && d.index == k->ctx->device.index) return;
  char have[32], want[32];
  tf_device_format(d, have, sizeof have);
  tf_device_format(k->ctx->device, want, sizeof want);
  tf_l_error(L, "kernel %s: parameter %d (%s): %s is on %s, the kernel on %s", k->name, i + 1, k->params[i].name, what,
             have, want);
}

/* ---- tensor maps ---- */

/* A CUtensorMap of a tensor, its 128 bytes 64-byte aligned inside raw; the tensor it maps is its
 * user value (kept alive, and checked at each launch for having been freed). */
typedef struct tf_l_tensor_map {
  unsigned char raw[TF_RTC_TENSOR_MAP_BYTES + 64];
  tf_device device;
  void *address;
  char text[200];
} tf_l_tensor_map;

static unsigned char *tf_l_map_bytes(tf_l_tensor_map *m) {
  return (unsigned char *)(((uintptr_t)m->raw + 63) & ~(uintptr_t)63);
}

static uint64_t tf_l_field_u64(lua_State *L, int t, const char *field, int i) {
  lua_getfield(L, t, field);
  lua_rawgeti(L, -1, i + 1);
  int ok = 0;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  if (!ok || v < 0) luaL_error(L, "tf.cuda.tensor_map: %s[%d] is not a count", field, i + 1);
  lua_pop(L, 2);
  return (uint64_t)v;
}

/* tf._rtc.tensor_map(tensor, spec) -> map. spec (lua/tf/cuda.lua's plan, innermost first): rank,
 * dims, strides (bytes, rank - 1 of them), box, element_strides, swizzle and l2_promotion (bytes),
 * oob_nan, text (what __tostring says). */
static int tf_l_rtc_tensor_map(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api(L, "tf.cuda.tensor_map");
  tf_lua_tensor *u = luaL_checkudata(L, 1, TF_TENSOR_TYPE);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (!u->t) return tf_l_error(L, "tf.cuda.tensor_map: the tensor has been freed");
  const tf_tensor *t = u->t;
  if (t->device.type != TF_DEV_CUDA) return tf_l_error(L, "tf.cuda.tensor_map: the tensor must be on a GPU");
  tf_rtc_tensor_map_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.dtype = t->dtype;
  lua_getfield(L, 2, "rank");
  spec.rank = (int)luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  if (spec.rank < 1 || spec.rank > TF_RTC_TENSOR_MAP_MAX_RANK)
    return tf_l_error(L, "tf.cuda.tensor_map: rank %d (1 to %d)", spec.rank, TF_RTC_TENSOR_MAP_MAX_RANK);
  for (int i = 0; i < spec.rank; i++) {
    spec.dims[i] = tf_l_field_u64(L, 2, "dims", i);
    spec.box[i] = (uint32_t)tf_l_field_u64(L, 2, "box", i);
    spec.element_strides[i] = (uint32_t)tf_l_field_u64(L, 2, "element_strides", i);
    if (i + 1 < spec.rank) spec.strides[i] = tf_l_field_u64(L, 2, "strides", i);
  }
  lua_getfield(L, 2, "swizzle");
  spec.swizzle = (int)luaL_optinteger(L, -1, 0);
  lua_getfield(L, 2, "l2_promotion");
  spec.l2_promotion = (int)luaL_optinteger(L, -1, 0);
  lua_getfield(L, 2, "oob_nan");
  spec.oob_nan = lua_toboolean(L, -1);
  lua_getfield(L, 2, "text");
  const char *text = luaL_optstring(L, -1, "");
  spec.address = tf_tensor_data(t);
  if ((uintptr_t)spec.address % 16)
    return tf_l_error(L, "tf.cuda.tensor_map: the tensor's data is not 16-byte aligned (a view at an offset of "
                         "%zu bytes: map a contiguous copy)",
                      (size_t)((uintptr_t)spec.address % 16));
  tf_l_tensor_map *m = lua_newuserdatauv(L, sizeof *m, 1);
  memset(m, 0, sizeof *m);
  luaL_setmetatable(L, TF_TENSOR_MAP_TYPE);
  m->device = t->device;
  m->address = spec.address;
  snprintf(m->text, sizeof m->text, "%s", text);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  TF_LUA_CHECK(L, api->tensor_map(&spec, tf_l_map_bytes(m)), "tf.cuda.tensor_map");
  return 1;
}

static int tf_l_tensor_map_tostring(lua_State *L) {
  tf_l_tensor_map *m = luaL_checkudata(L, 1, TF_TENSOR_MAP_TYPE);
  lua_pushfstring(L, "tf.CudaTensorMap(%s)", m->text);
  return 1;
}

/* A tensor map argument into its slot: the map's bytes, once its tensor is known to be alive. */
static void tf_l_pack_map(lua_State *L, int idx, const tf_l_kernel *k, int i, unsigned char *slot) {
  const tf_l_param *p = &k->params[i];
  tf_l_tensor_map *m = luaL_testudata(L, idx, TF_TENSOR_MAP_TYPE);
  if (!m) {
    const char *what = luaL_getmetafield(L, idx, "__name") == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, idx);
    tf_l_error(L, "kernel %s: parameter %d (%s) takes a tensor map (tf.cuda.tensor_map), got %s", k->name, i + 1,
               p->name, what);
  }
  lua_getiuservalue(L, idx, 1);
  tf_lua_tensor *u = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!u || !u->t || tf_tensor_data(u->t) != m->address)
    tf_l_error(L, "kernel %s: parameter %d (%s): the tensor of the map has been freed", k->name, i + 1, p->name);
  tf_l_check_device(L, k, i, m->device, "the map's tensor");
  memcpy(slot, tf_l_map_bytes(m), TF_RTC_TENSOR_MAP_BYTES);
}

/* One argument into its slot of the parameter buffer; a Lua error naming the parameter when it does not fit. */
static void tf_l_pack(lua_State *L, int idx, const tf_l_kernel *k, int i, unsigned char *slot) {
  const tf_l_param *p = &k->params[i];
  if (p->kind == TF_P_TENSOR_MAP) {
    tf_l_pack_map(L, idx, k, i, slot);
    return;
  }
  if (p->kind == TF_P_POINTER || p->kind == TF_P_VIEW) {
    tf_lua_tensor *u = tf_l_is(L, idx, TF_L_TENSOR_MT) ? lua_touserdata(L, idx) : NULL;
    if (!u)
      tf_l_error(L, "kernel %s: parameter %d (%s) takes a tensor, got %s", k->name, i + 1, p->name, luaL_typename(L, idx));
    const tf_tensor *t = u->t;
    if (!t) tf_l_error(L, "kernel %s: parameter %d (%s): the tensor has been freed", k->name, i + 1, p->name);
    tf_l_check_device(L, k, i, t->device, "the tensor");
    if (p->dtype >= 0 && (int)t->dtype != p->dtype)
      tf_l_error(L, "kernel %s: parameter %d (%s) is declared %s, the tensor is %s", k->name, i + 1, p->name,
                   tf_dtype_name((tf_dtype)p->dtype), tf_dtype_name(t->dtype));
    void *data = tf_tensor_data(t);
    memcpy(slot, &data, sizeof data);
    if (p->kind == TF_P_POINTER) {
      if (!tf_tensor_is_contiguous(t))
        tf_l_error(L, "kernel %s: parameter %d (%s) is a pointer, so the tensor must be contiguous (call "
                        ":contiguous(), or declare the parameter tf::view<T, N> to pass its strides)",
                     k->name, i + 1, p->name);
      return;
    }
    if (t->ndim != p->ndim)
      tf_l_error(L, "kernel %s: parameter %d (%s) is a view of %d dimensions, the tensor has %d", k->name, i + 1,
                   p->name, p->ndim, t->ndim);
    int64_t dims[2 * TF_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) dims[d] = t->shape[d], dims[t->ndim + d] = t->strides[d];
    memcpy(slot + sizeof data, dims, 16 * (size_t)t->ndim);
    return;
  }
  if (p->kind == TF_P_BOOL) {
    if (!lua_isboolean(L, idx))
      tf_l_error(L, "kernel %s: parameter %d (%s) takes a boolean, got %s", k->name, i + 1, p->name, luaL_typename(L, idx));
    *slot = (unsigned char)lua_toboolean(L, idx);
    return;
  }
  if (lua_type(L, idx) != LUA_TNUMBER)
    tf_l_error(L, "kernel %s: parameter %d (%s) takes a number, got %s", k->name, i + 1, p->name, luaL_typename(L, idx));
  if (p->kind == TF_P_FLOAT) {
    double v = lua_tonumber(L, idx);
    if (p->bytes == 4) {
      float f = (float)v;
      memcpy(slot, &f, 4);
    } else {
      memcpy(slot, &v, 8);
    }
    return;
  }
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint)
    tf_l_error(L, "kernel %s: parameter %d (%s) takes an integer, got %s", k->name, i + 1, p->name,
                 lua_tostring(L, idx));
  int bits = 8 * p->bytes;
  bool fits = p->kind == TF_P_UINT ? v >= 0 && (bits == 64 || (uint64_t)v < ((uint64_t)1 << bits))
                                   : bits == 64 || (v >= -((int64_t)1 << (bits - 1)) && v < ((int64_t)1 << (bits - 1)));
  if (!fits)
    tf_l_error(L, "kernel %s: parameter %d (%s) is a %d-bit %s integer: %lld does not fit", k->name, i + 1, p->name,
                 bits, p->kind == TF_P_UINT ? "unsigned" : "signed", (long long)v);
  memcpy(slot, &v, (size_t)p->bytes); /* little-endian: the low bytes */
}

/* kernel:launch({grid = ..., block = ..., shared = bytes}, args...) */
static int tf_l_kernel_launch(lua_State *L) {
  tf_l_kernel *k = tf_l_is(L, 1, TF_L_KERNEL_MT) ? lua_touserdata(L, 1) : tf_l_checkkernel(L, 1);
  if (!lua_istable(L, 2))
    return tf_l_error(L, "kernel %s: launch takes {grid = ..., block = ... [, shared = bytes]} and then the "
                           "arguments",
                        k->name);
  int nargs = lua_gettop(L) - 2;
  if (nargs != k->nparams)
    return tf_l_error(L, "kernel %s takes %d arguments, got %d", k->name, k->nparams, nargs);
  tf_rtc_launch l = {0};
  /* the configuration in one pass over its keys */
  bool grid = false, block = false;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "";
    if (strcmp(key, "grid") == 0) {
      tf_l_dims(L, "grid", k, k->limits.max_grid, l.grid);
      grid = true;
    } else if (strcmp(key, "block") == 0) {
      tf_l_dims(L, "block", k, k->limits.max_block, l.block);
      block = true;
    } else if (strcmp(key, "shared") == 0) {
      int isint;
      lua_Integer bytes = lua_tointegerx(L, -1, &isint);
      if (!isint || bytes < 0) return tf_l_error(L, "kernel %s: shared must be a number of bytes >= 0", k->name);
      l.shared = (size_t)bytes;
    } else {
      static const char *const keys[] = {"grid", "block", "shared", NULL};
      lua_pop(L, 2);
      tf_lua_checkkeys(L, 2, "kernel:launch", keys); /* the unknown key's message */
    }
    lua_pop(L, 1);
  }
  if (!grid || !block)
    return tf_l_error(L, "kernel %s: the launch needs %s = n or {x, y, z}", k->name, grid ? "block" : "grid");
  unsigned long long threads = (unsigned long long)l.block[0] * l.block[1] * l.block[2];
  if (threads > (unsigned long long)k->info.max_threads)
    return tf_l_error(L, "kernel %s: a block of %llu threads is over the kernel's limit of %d (%d registers a "
                           "thread)",
                        k->name, threads, k->info.max_threads, k->info.registers);
  size_t limit = (size_t)k->limits.max_shared_optin > k->info.static_shared
                     ? (size_t)k->limits.max_shared_optin - k->info.static_shared
                     : 0;
  if (l.shared > limit)
    return tf_l_error(L, "kernel %s: %zu bytes of dynamic shared memory is over the device's limit of %zu a block "
                           "(%d bytes with the opt-in, less %zu static)",
                        k->name, l.shared, limit, k->limits.max_shared_optin, k->info.static_shared);
  unsigned char buf[TF_RTC_MAX_PARAMS * 16 + 64 * 16] __attribute__((aligned(64)));
  void *args[TF_RTC_MAX_PARAMS];
  for (int i = 0; i < k->nparams; i++) {
    unsigned char *slot = buf + k->info.param_offset[i];
    if (k->info.param_offset[i] + k->info.param_size[i] > sizeof buf)
      return tf_l_error(L, "kernel %s: its parameters take more than %zu bytes", k->name, sizeof buf);
    tf_l_pack(L, 3 + i, k, i, slot);
    args[i] = slot;
  }
  l.args = args;
  l.shared_allowed = &k->shared_allowed;
  l.function = &k->function;
  l.name = k->name;
  lua_Debug ar;
  if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sl", &ar)) {
    /* the chunk's name as Lua keeps it ("@path"): a pointer that stays the same launch after launch */
    l.site_file = ar.source[0] == '@' || ar.source[0] == '=' ? ar.source + 1 : "(a chunk of Lua source)";
    l.site_line = ar.currentline;
  }
  TF_LUA_CHECK(L, tf_rtc()->launch(k->ctx, k->kernel, &l), k->name);
  return 0;
}

/* kernel:attributes() -> {registers, max_threads, static_shared, local_bytes, max_dynamic_shared, params} */
static int tf_l_kernel_attributes(lua_State *L) {
  tf_l_kernel *k = tf_l_checkkernel(L, 1);
  lua_createtable(L, 0, 8);
  TF_SET_STR(L, "name", k->name);
  TF_SET_INT(L, "registers", k->info.registers);
  TF_SET_INT(L, "max_threads", k->info.max_threads);
  TF_SET_INT(L, "static_shared", k->info.static_shared);
  TF_SET_INT(L, "local_bytes", k->info.local_bytes);
  size_t limit = (size_t)k->limits.max_shared_optin > k->info.static_shared
                     ? (size_t)k->limits.max_shared_optin - k->info.static_shared
                     : 0;
  TF_SET_INT(L, "max_dynamic_shared", limit);
  TF_SET_INT(L, "params", k->nparams);
  TF_SET_INT(L, "binary_version", k->info.binary_version);
  return 1;
}

static int tf_l_kernel_tostring(lua_State *L) {
  tf_l_kernel *k = tf_l_checkkernel(L, 1);
  char dev[32];
  tf_device_format(k->ctx->device, dev, sizeof dev);
  lua_pushfstring(L, "tf.CudaKernel(%s, %s, %d registers)", k->name, dev, k->info.registers);
  return 1;
}

/* tf._rtc.context_lost() -> why, or nil while the CUDA context works */
static int tf_l_rtc_context_lost(lua_State *L) {
  char why[1024];
  if (tf_rtc() && tf_rtc()->context_lost(why, sizeof why))
    lua_pushstring(L, why);
  else
    lua_pushnil(L);
  return 1;
}

/* ---- tf.CudaGraph: a function's GPU work, captured once and replayed -------------------------- */

#define TF_GRAPH_TYPE "tf.CudaGraph"

typedef struct tf_l_graph {
  tf_graph *g; /* NULL once freed */
  tf_device_ctx *ctx;
} tf_l_graph;

static void tf_l_graph_free(tf_l_graph *u) {
  if (u->g) u->ctx->backend->model->graph_destroy(u->ctx, u->g);
  u->g = NULL;
}

/* tf._rtc.capture(fn, device) -> graph: fn's launches on the device's stream, not run but captured
 * (the backend's thread-local capture: an allocation from the device, a copy to the host or a wait
 * inside fn fails and spoils it). A tensor made inside fn from the allocator's cache would let the
 * replays write into memory handed to others later: that is refused too. */
static int tf_l_rtc_capture(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  tf_device d = tf_lua_checkdevice(L, 2);
  if (d.type != TF_DEV_CUDA) return tf_l_error(L, "tf.cuda.graph: graphs are CUDA's: the device must be a GPU");
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(d, &ctx), "tf.cuda.graph");
  const tf_model_kernels *mk = ctx->backend->model;
  if (!mk || !mk->capture_begin) return tf_l_error(L, "tf.cuda.graph: this device's backend has no CUDA graphs");
  tf_l_graph *u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = (tf_l_graph){NULL, ctx};
  luaL_setmetatable(L, TF_GRAPH_TYPE);
  uint64_t allocs = ctx->alloc.stats.num_allocs;
  TF_LUA_CHECK(L, mk->capture_begin(ctx), "tf.cuda.graph");
  lua_pushvalue(L, 1);
  int st = lua_pcall(L, 0, 0, 0);
  tf_status ended = mk->capture_end(ctx, &u->g);
  if (st != LUA_OK) {
    tf_l_graph_free(u);
    if (ended == TF_OK) return lua_error(L); /* the function's own error, the capture aside */
    (void)tf_last_error();
    return tf_l_error(L, "tf.cuda.graph: the function's GPU work could not be captured: inside a capture, no tensor "
                         "may be made, copied to the host or read (item, tolist), and nothing may wait; the function "
                         "stopped with: %s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(an error object)");
  }
  if (ended != TF_OK) {
    const char *why = tf_last_error();
    return tf_l_error(L, "tf.cuda.graph: the function's GPU work could not be captured (%s): inside a capture, "
                           "no tensor may be made, copied to the host or read (item, tolist), and nothing may wait",
                        why);
  }
  if (ctx->alloc.stats.num_allocs != allocs) {
    tf_l_graph_free(u);
    return tf_l_error(L, "tf.cuda.graph: the function made %llu tensor(s) while it was captured: a graph's replays "
                           "write into the memory they had, which goes to other tensors afterwards; make the "
                           "tensors before tf.cuda.graph and only launch into them inside",
                        (unsigned long long)(ctx->alloc.stats.num_allocs - allocs));
  }
  lua_settop(L, 3);
  return 1;
}

static tf_l_graph *tf_l_checkgraph(lua_State *L, int idx) {
  tf_l_graph *u = luaL_checkudata(L, idx, TF_GRAPH_TYPE);
  if (!u->g) luaL_argerror(L, idx, "the graph was freed");
  return u;
}

/* graph:replay(): queues the captured work again on the device's stream.
 * Refused while tf.prof counts hardware counters: those are counted per
 * launched kernel, and a graph's kernels come in one launch. */
static int tf_l_graph_replay(lua_State *L) {
  tf_l_graph *u = tf_l_checkgraph(L, 1);
  if (tf_prof_counting())
    return tf_lua_error(L, "graph:replay: CUDA graphs cannot be replayed while tf.prof counts hardware counters "
                           "(tf.prof.start{metrics = ...}); run the work eagerly inside the profile");
  TF_LUA_CHECK(L, u->ctx->backend->model->graph_launch(u->ctx, u->g), "graph:replay");
  return 0;
}

static int tf_l_graph_gc(lua_State *L) {
  tf_l_graph_free(luaL_checkudata(L, 1, TF_GRAPH_TYPE));
  return 0;
}

/* tf._rtc.device(device) -> compute capability major, minor, driver version: what a compile's target
 * and cache key need, from the device's attributes (tf.device_info's full property query costs
 * milliseconds on a GPU, more than a compile the cache answers). */
static int tf_l_rtc_device(lua_State *L) {
  const tf_rtc_api *api = tf_l_rtc_api_of(L, "tf.cuda.compile", false);
  tf_device_ctx *ctx;
  TF_LUA_CHECK(L, tf_device_ctx_get(tf_lua_checkdevice(L, 1), &ctx), "tf.cuda.compile");
  tf_rtc_limits lim;
  TF_LUA_CHECK(L, api->limits(ctx, &lim), "tf.cuda.compile");
  lua_pushinteger(L, lim.cc_major);
  lua_pushinteger(L, lim.cc_minor);
  lua_pushinteger(L, lim.driver_version);
  return 3;
}

/* tf._rtc.allowed(fname): nothing, or --safe's refusal naming fname (a compile the cache answers
 * is refused as one NVRTC makes: what is refused is running a script's kernel at all). */
static int tf_l_rtc_allowed(lua_State *L) {
  tf_l_rtc_api(L, luaL_checkstring(L, 1));
  return 0;
}

void tf_open_rtc(lua_State *L) {
  static const luaL_Reg functions[] = {
      {"allowed", tf_l_rtc_allowed},       {"device", tf_l_rtc_device},
      {"version", tf_l_rtc_version}, {"targets", tf_l_rtc_targets}, {"compile", tf_l_rtc_compile},
      {"load", tf_l_rtc_load},       {"context_lost", tf_l_rtc_context_lost}, {"capture", tf_l_rtc_capture},
      {"tensor_map", tf_l_rtc_tensor_map}, {NULL, NULL},
  };
  lua_newtable(L);
  luaL_setfuncs(L, functions, 0);
  lua_pushboolean(L, tf_rtc() != NULL);
  lua_setfield(L, -2, "built");
  if (tf_rtc()) {
    lua_pushstring(L, tf_rtc()->cuda_include);
    lua_setfield(L, -2, "cuda_include");
  }
  lua_setfield(L, -2, "_rtc");
  static const luaL_Reg lib_meta[] = {{"__gc", tf_l_library_gc}, {NULL, NULL}};
  static const luaL_Reg lib_methods[] = {{"kernel", tf_l_library_kernel}, {"unload", tf_l_library_gc}, {NULL, NULL}};
  tf_lua_newclass(L, TF_LIBRARY_TYPE, lib_meta, lib_methods);
  static const luaL_Reg kernel_meta[] = {{"__tostring", tf_l_kernel_tostring}, {NULL, NULL}};
  static const luaL_Reg kernel_methods[] = {{"attributes", tf_l_kernel_attributes}, {NULL, NULL}};
  tf_lua_newclass(L, TF_KERNEL_TYPE, kernel_meta, kernel_methods);
  /* launch: a closure over the two metatables it checks (tf_l_is) */
  luaL_getmetatable(L, TF_KERNEL_TYPE);
  lua_getfield(L, -1, "__index");
  luaL_getmetatable(L, TF_KERNEL_TYPE);
  luaL_getmetatable(L, TF_TENSOR_TYPE);
  lua_pushcclosure(L, tf_l_kernel_launch, 2);
  lua_setfield(L, -2, "launch");
  lua_pop(L, 2);
  static const luaL_Reg graph_meta[] = {{"__gc", tf_l_graph_gc}, {"__close", tf_l_graph_gc}, {NULL, NULL}};
  static const luaL_Reg graph_methods[] = {{"replay", tf_l_graph_replay}, {"free", tf_l_graph_gc}, {NULL, NULL}};
  tf_lua_newclass(L, TF_GRAPH_TYPE, graph_meta, graph_methods);
  static const luaL_Reg map_meta[] = {{"__tostring", tf_l_tensor_map_tostring}, {NULL, NULL}};
  static const luaL_Reg map_methods[] = {{NULL, NULL}};
  tf_lua_newclass(L, TF_TENSOR_MAP_TYPE, map_meta, map_methods);
}
