/* tf.Tensor: creation functions, ops, methods and metamethods.
 *
 * Ops are exposed by walking the core's op registry: each entry becomes a
 * function tf.<name> and a method x:<name>(...), one generic C function per
 * op family with the op's code as an upvalue. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "autograd.h"
#include "elemio.h"
#include "grad_ops.h"

/* ---- from Lua tables ----------------------------------------------------- */

enum { TF_LEAF_BOOL = 1, TF_LEAF_INT = 2, TF_LEAF_FLOAT = 4 };

/* Finds the shape of nested tables by following first elements. */
static void tf_table_shape(lua_State *L, int idx, tf_shape *s) {
  lua_pushvalue(L, idx);
  s->ndim = 0;
  while (lua_istable(L, -1)) {
    if (s->ndim == TF_MAX_DIMS) tf_lua_error(L, "tf.tensor: nested tables are deeper than 8 dimensions");
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    s->dims[s->ndim++] = n;
    if (n == 0) break;
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

/* Checks every nested table against the shape and collects leaf kinds. */
static int tf_table_leaves(lua_State *L, const tf_shape *s, int depth, char *path, size_t pathlen) {
  int kinds = 0;
  if (depth == s->ndim) {
    if (lua_isboolean(L, -1)) return TF_LEAF_BOOL;
    if (lua_isinteger(L, -1)) return TF_LEAF_INT;
    if (lua_type(L, -1) == LUA_TNUMBER) return TF_LEAF_FLOAT;
    return tf_lua_error(L, "tf.tensor: element%s is a %s, not a number or boolean", path, luaL_typename(L, -1));
  }
  if (!lua_istable(L, -1) || (lua_Integer)lua_rawlen(L, -1) != s->dims[depth])
    return tf_lua_error(L, "tf.tensor: ragged nested tables: element%s should be a table of %d values", path,
                      (int)s->dims[depth]);
  for (lua_Integer i = 1; i <= s->dims[depth]; i++) {
    size_t used = strlen(path);
    snprintf(path + used, pathlen - used, "[%lld]", (long long)i);
    lua_rawgeti(L, -1, i);
    kinds |= tf_table_leaves(L, s, depth + 1, path, pathlen);
    lua_pop(L, 1);
    path[used] = '\0';
  }
  return kinds;
}

static void tf_table_fill(lua_State *L, const tf_shape *s, int depth, void *buf, tf_dtype d, int64_t *at) {
  if (depth == s->ndim) {
    if (lua_isboolean(L, -1))
      tf_elem_set(buf, d, (*at)++, lua_toboolean(L, -1));
    else if (lua_isinteger(L, -1) && !tf_dtype_is_float(d))
      tf_elem_set_int(buf, d, (*at)++, lua_tointeger(L, -1));
    else
      tf_elem_set(buf, d, (*at)++, lua_tonumber(L, -1));
    return;
  }
  for (lua_Integer i = 1; i <= s->dims[depth]; i++) {
    lua_rawgeti(L, -1, i);
    tf_table_fill(L, s, depth + 1, buf, d, at);
    lua_pop(L, 1);
  }
}

/* tf.tensor(data [, {dtype=, device=}]): data is a number, boolean or nested tables. */
static int tf_l_tensor(lua_State *L) {
  luaL_checkany(L, 1);
  tf_shape s;
  tf_table_shape(L, 1, &s);
  char path[128] = "";
  lua_pushvalue(L, 1);
  int kinds = tf_table_leaves(L, &s, 0, path, sizeof path);
  lua_pop(L, 1);
  if ((kinds & TF_LEAF_BOOL) && (kinds & ~TF_LEAF_BOOL))
    return tf_lua_error(L, "tf.tensor: cannot mix booleans and numbers");
  tf_dtype inferred = kinds & TF_LEAF_FLOAT ? TF_F32 : kinds & TF_LEAF_INT ? TF_I64 : kinds ? TF_BOOL : TF_F32;
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, 2, &dtype, &dev, inferred);
  size_t nbytes = (size_t)tf_shape_numel(&s) * tf_dtype_size(dtype);
  void *buf = malloc(nbytes ? nbytes : 1);
  if (!buf) return tf_lua_error(L, "tf.tensor: out of host memory");
  int64_t at = 0;
  lua_pushvalue(L, 1);
  tf_table_fill(L, &s, 0, buf, dtype, &at);
  lua_pop(L, 1);
  tf_tensor *t = NULL;
  /* Errors below must not leak buf: do the device part in a protected way. */
  tf_status st = tf_tensor_empty(&s, dtype, tf_cpu(), &t);
  if (st == TF_OK && nbytes) memcpy(tf_tensor_data(t), buf, nbytes);
  free(buf);
  TF_LUA_CHECK(L, st, "tf.tensor");
  if (dev.type != TF_DEV_CPU) {
    tf_tensor *moved;
    st = tf_to(t, dtype, dev, &moved);
    tf_tensor_release(t);
    TF_LUA_CHECK(L, st, "tf.tensor");
    t = moved;
  }
  tf_lua_pushtensor(L, t);
  return 1;
}

/* ---- creation ------------------------------------------------------------ */

/* tf.zeros / ones / empty (shape... [, opts]); upvalue: fill value or nil. */
static int tf_l_filled(lua_State *L) {
  tf_shape s;
  int next = tf_lua_checkshape(L, 1, &s, 0);
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, next, &dtype, &dev, TF_F32);
  tf_tensor *t;
  if (lua_isnil(L, lua_upvalueindex(1)))
    TF_LUA_CHECK(L, tf_tensor_empty(&s, dtype, dev, &t), "tf.empty");
  else
    TF_LUA_CHECK(L, tf_full(&s, lua_tonumber(L, lua_upvalueindex(1)), dtype, dev, &t), "tf.zeros");
  tf_lua_pushtensor(L, t);
  return 1;
}

/* tf.full(shape, value [, opts]) */
static int tf_l_full(lua_State *L) {
  tf_shape s;
  luaL_checktype(L, 1, LUA_TTABLE);
  tf_lua_checkshape(L, 1, &s, 0);
  double value = lua_isboolean(L, 2) ? lua_toboolean(L, 2) : luaL_checknumber(L, 2);
  tf_dtype inferred = lua_isboolean(L, 2) ? TF_BOOL : lua_isinteger(L, 2) ? TF_I64 : TF_F32;
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, 3, &dtype, &dev, inferred);
  tf_tensor *t;
  TF_LUA_CHECK(L, tf_full(&s, value, dtype, dev, &t), "tf.full");
  tf_lua_pushtensor(L, t);
  return 1;
}

/* tf.arange(stop) / tf.arange(start, stop [, step]) [, opts]: integers give i64, as in PyTorch. */
static int tf_l_arange(lua_State *L) {
  int nnum = 0;
  bool all_int = true;
  while (nnum < 3 && lua_type(L, nnum + 1) == LUA_TNUMBER) {
    all_int = all_int && lua_isinteger(L, nnum + 1);
    nnum++;
  }
  if (nnum == 0) return luaL_argerror(L, 1, "number expected");
  double start = 0, stop, step = 1;
  if (nnum == 1) {
    stop = lua_tonumber(L, 1);
  } else {
    start = lua_tonumber(L, 1);
    stop = lua_tonumber(L, 2);
    if (nnum == 3) step = lua_tonumber(L, 3);
  }
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, nnum + 1, &dtype, &dev, all_int ? TF_I64 : TF_F32);
  tf_tensor *t;
  TF_LUA_CHECK(L, tf_arange(start, stop, step, dtype, dev, &t), "tf.arange");
  tf_lua_pushtensor(L, t);
  return 1;
}

/* tf.rand / tf.randn (shape... [, opts]); upvalue: the random kind. */
static int tf_l_random(lua_State *L) {
  tf_random_kind kind = (tf_random_kind)lua_tointeger(L, lua_upvalueindex(1));
  tf_shape s;
  int next = tf_lua_checkshape(L, 1, &s, 0);
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, next, &dtype, &dev, TF_F32);
  tf_tensor *t;
  TF_LUA_CHECK(L, tf_random(kind, &s, 0.0, 1.0, dtype, dev, &t), kind == TF_RANDOM_NORMAL ? "tf.randn" : "tf.rand");
  tf_lua_pushtensor(L, t);
  return 1;
}

/* tf.trunc_normal(shape, std [, cut = 3 [, opts]]): normal(0, std) cut at cut standard deviations. */
static int tf_l_trunc_normal(lua_State *L) {
  tf_shape s;
  luaL_checktype(L, 1, LUA_TTABLE);
  tf_lua_checkshape(L, 1, &s, 0);
  double std = luaL_checknumber(L, 2), cut = luaL_optnumber(L, 3, 3.0);
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, 4, &dtype, &dev, TF_F32);
  tf_tensor *t;
  TF_LUA_CHECK(L, tf_random(TF_RANDOM_TRUNC_NORMAL, &s, std, cut, dtype, dev, &t), "tf.trunc_normal");
  tf_lua_pushtensor(L, t);
  return 1;
}

/* tf.randint(low, high, shape [, opts]): integers in [low, high), i64 by default. */
static int tf_l_randint(lua_State *L) {
  lua_Integer low = luaL_checkinteger(L, 1), high = luaL_checkinteger(L, 2);
  tf_shape s;
  luaL_checktype(L, 3, LUA_TTABLE);
  tf_lua_checkshape(L, 3, &s, 0);
  tf_dtype dtype;
  tf_device dev;
  tf_lua_checkopts(L, 4, &dtype, &dev, TF_I64);
  tf_tensor *t;
  TF_LUA_CHECK(L, tf_random(TF_RANDOM_INT, &s, (double)low, (double)high, dtype, dev, &t), "tf.randint");
  tf_lua_pushtensor(L, t);
  return 1;
}

/* ---- ops from the registry --------------------------------------------- */

static const tf_op_info *tf_l_opinfo(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

static char tf_l_opname_buf[64];
static const char *tf_l_opname(const tf_op_info *info) {
  snprintf(tf_l_opname_buf, sizeof tf_l_opname_buf, "tf.%s", info->name);
  return tf_l_opname_buf;
}

static int tf_l_unary(lua_State *L) {
  const tf_op_info *info = tf_l_opinfo(L);
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  TF_LUA_CHECK(L, tf_ag_unary((tf_unary_op)info->code, a, &out), tf_l_opname(info));
  tf_lua_pushtensor(L, out);
  return 1;
}

/* A Lua number (or boolean, as 0/1) as an operand. */
static tf_scalar tf_l_scalar(lua_State *L, int idx) {
  if (lua_isboolean(L, idx)) return (tf_scalar){lua_toboolean(L, idx) ? 1.0 : 0.0, false};
  tf_scalar s = {lua_tonumber(L, idx), !lua_isinteger(L, idx)};
  return s;
}

static bool tf_l_is_scalar(lua_State *L, int idx) {
  return lua_type(L, idx) == LUA_TNUMBER || lua_isboolean(L, idx);
}

/* A binary op with a tensor or a number on either side. */
static int tf_l_binary_code(lua_State *L, tf_binary_op op, const char *fname) {
  tf_tensor *a = tf_lua_totensor(L, 1), *b = tf_lua_totensor(L, 2), *out;
  if (a && b) {
    TF_LUA_CHECK(L, tf_ag_binary(op, a, b, &out), fname);
  } else if (a && tf_l_is_scalar(L, 2)) {
    TF_LUA_CHECK(L, tf_ag_binary_scalar(op, a, tf_l_scalar(L, 2), TF_SCALAR_RIGHT, &out), fname);
  } else if (b && tf_l_is_scalar(L, 1)) {
    TF_LUA_CHECK(L, tf_ag_binary_scalar(op, b, tf_l_scalar(L, 1), TF_SCALAR_LEFT, &out), fname);
  } else {
    int bad = (a || tf_l_is_scalar(L, 1)) ? 2 : 1;
    if (luaL_testudata(L, bad, TF_TENSOR_TYPE)) tf_lua_checktensor(L, bad); /* freed: its own message */
    return tf_lua_error(L, "%s: operand %d must be a tensor or a number, not %s%s", fname, bad,
                      luaL_typename(L, bad), (a || b) ? "" : " (one operand must be a tensor)");
  }
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_binary(lua_State *L) {
  const tf_op_info *info = tf_l_opinfo(L);
  return tf_l_binary_code(L, (tf_binary_op)info->code, tf_l_opname(info));
}

/* x:sum() / x:sum(dim [, keepdim]) */
static int tf_l_reduce(lua_State *L) {
  const tf_op_info *info = tf_l_opinfo(L);
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  bool all = lua_isnoneornil(L, 2);
  int dim = all ? 0 : tf_lua_checkdim(L, 2);
  bool keepdim = lua_toboolean(L, 3);
  TF_LUA_CHECK(L, tf_ag_reduce((tf_reduce_op)info->code, a, dim, all, keepdim, &out), tf_l_opname(info));
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_matmul(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *b = tf_lua_checktensor(L, 2), *out;
  TF_LUA_CHECK(L, tf_ag_matmul(a, b, &out), "tf.matmul");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* Registers every registry op as tf.<name> in the table at -2 and as a
 * method in the table at -1. */
static void tf_register_ops(lua_State *L) {
  int count;
  const tf_op_info *ops = tf_op_registry(&count);
  for (int i = 0; i < count; i++) {
    lua_CFunction fn = ops[i].family == TF_FAMILY_UNARY    ? tf_l_unary
                       : ops[i].family == TF_FAMILY_BINARY ? tf_l_binary
                       : ops[i].family == TF_FAMILY_REDUCE ? tf_l_reduce
                                                           : NULL;
    if (ops[i].family == TF_FAMILY_MATMUL) {
      lua_pushcfunction(L, tf_l_matmul);
    } else if (fn) {
      lua_pushlightuserdata(L, (void *)&ops[i]);
      lua_pushcclosure(L, fn, 1);
    } else {
      continue;
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, ops[i].name);
    lua_setfield(L, -3, ops[i].name);
  }
}

/* ---- conversion and views ------------------------------------------------ */

/* x:to(dtype) / x:to(device) / x:to{dtype=, device=} / x:to(device, dtype) */
static int tf_l_to(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  tf_dtype dtype = a->dtype;
  tf_device dev = a->device;
  if (lua_istable(L, 2)) {
    tf_lua_checkopts(L, 2, &dtype, &dev, a->dtype);
    lua_getfield(L, 2, "device");
    if (lua_isnil(L, -1)) dev = a->device;
    lua_pop(L, 1);
  } else {
    for (int i = 2; i <= 3 && !lua_isnoneornil(L, i); i++) {
      const char *s = luaL_checkstring(L, i);
      if (tf_dtype_parse(s, &dtype) != TF_OK && tf_device_parse(s, &dev) != TF_OK)
        return luaL_argerror(L, i, lua_pushfstring(L, "'%s' is neither a dtype nor a device", s));
    }
  }
  if (dtype == a->dtype && tf_device_eq(dev, a->device)) {
    lua_settop(L, 1);
    return 1;
  }
  TF_LUA_CHECK(L, tf_ag_to(a, dtype, dev, &out), "to");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* tf.cast(x, dtype [, {saturate = true}]): x:to(dtype), or into an 8-bit
 * float saturating (beyond the largest finite value gives it; NaN stays). */
static int tf_l_cast(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  tf_dtype dtype = tf_lua_checkdtype(L, 2);
  static const char *const keys[] = {"saturate", NULL};
  tf_lua_checkkeys(L, 3, "tf.cast", keys);
  bool saturate = false;
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "saturate");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
      return tf_lua_error(L, "tf.cast: saturate must be a boolean, not a %s", luaL_typename(L, -1));
    saturate = lua_toboolean(L, -1);
    lua_pop(L, 1);
  } else if (!lua_isnoneornil(L, 3)) {
    return luaL_typeerror(L, 3, "options table");
  }
  if (saturate) {
    TF_LUA_CHECK(L, tf_to_saturated(a, dtype, &out), "tf.cast");
  } else {
    if (dtype == a->dtype) {
      lua_settop(L, 1);
      return 1;
    }
    TF_LUA_CHECK(L, tf_ag_to(a, dtype, a->device, &out), "tf.cast");
  }
  tf_lua_pushtensor(L, out);
  return 1;
}

/* tf.finfo(dtype or tensor): what a float dtype holds, as torch.finfo. */
static int tf_l_finfo(lua_State *L) {
  tf_tensor *t = tf_lua_totensor(L, 1);
  tf_dtype d = t ? t->dtype : tf_lua_checkdtype(L, 1);
  tf_finfo fi;
  TF_LUA_CHECK(L, tf_dtype_finfo(d, &fi), "tf.finfo");
  lua_createtable(L, 0, 12);
  TF_SET_STR(L, "dtype", tf_dtype_name(d));
  TF_SET_INT(L, "bits", fi.bits);
  TF_SET_INT(L, "mantissa_bits", fi.mantissa_bits);
  TF_SET_INT(L, "exponent_bits", fi.exponent_bits);
  TF_SET_NUM(L, "max", fi.max);
  TF_SET_NUM(L, "min", -fi.max);
  TF_SET_NUM(L, "smallest_normal", fi.smallest_normal);
  TF_SET_NUM(L, "tiny", fi.smallest_normal);
  TF_SET_NUM(L, "smallest_subnormal", fi.smallest_subnormal);
  TF_SET_NUM(L, "eps", fi.eps);
  TF_SET_BOOL(L, "has_inf", fi.has_inf);
  return 1;
}

/* Returns x itself when it is already on dev, else a copy there. */
static int tf_l_move(lua_State *L, tf_device dev, const char *fname) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  if (tf_device_eq(dev, a->device)) {
    lua_settop(L, 1);
    return 1;
  }
  TF_LUA_CHECK(L, tf_ag_to(a, a->dtype, dev, &out), fname);
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_cpu(lua_State *L) { return tf_l_move(L, tf_cpu(), "cpu"); }

static int tf_l_cuda(lua_State *L) {
  return tf_l_move(L, (tf_device){TF_DEV_CUDA, (int)luaL_optinteger(L, 2, 0)}, "cuda");
}

static int tf_l_contiguous(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  if (tf_tensor_is_contiguous(a)) {
    lua_settop(L, 1);
    return 1;
  }
  TF_LUA_CHECK(L, tf_ag_contiguous(a, &out), "contiguous");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_clone(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  TF_LUA_CHECK(L, tf_ag_to(a, a->dtype, a->device, &out), "clone");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_reshape(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  tf_shape s;
  tf_lua_checkshape(L, 2, &s, 1);
  TF_LUA_CHECK(L, tf_ag_reshape(a, &s, &out), "reshape");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* view never copies: it needs a contiguous tensor. */
static int tf_l_view(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1);
  if (!tf_tensor_is_contiguous(a))
    return tf_lua_error(L, "view: the tensor is not contiguous (use reshape, which copies when needed)");
  return tf_l_reshape(L);
}

static int tf_l_transpose(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  int d0 = tf_lua_checkdim(L, 2), d1 = tf_lua_checkdim(L, 3);
  TF_LUA_CHECK(L, tf_ag_transpose(a, d0, d1, &out), "transpose");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* x:t(): transpose of a matrix (a 0-D or 1-D tensor is returned as is). */
static int tf_l_t(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  if (a->ndim > 2) return tf_lua_error(L, "t: expects a tensor of at most 2 dimensions (use transpose)");
  if (a->ndim < 2) {
    lua_settop(L, 1);
    return 1;
  }
  TF_LUA_CHECK(L, tf_ag_transpose(a, 0, 1, &out), "t");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_expand(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  tf_shape s;
  tf_lua_checkshape(L, 2, &s, 1);
  int lead = s.ndim - a->ndim;
  for (int i = lead; i < s.ndim && i >= 0; i++)
    if (s.dims[i] == -1) s.dims[i] = a->shape[i - lead];
  TF_LUA_CHECK(L, tf_ag_expand(a, &s, &out), "expand");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_narrow(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  TF_LUA_CHECK(L, tf_ag_narrow(a, tf_lua_checkdim(L, 2), luaL_checkinteger(L, 3), luaL_checkinteger(L, 4), &out),
               "narrow");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_select(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  TF_LUA_CHECK(L, tf_ag_select(a, tf_lua_checkdim(L, 2), luaL_checkinteger(L, 3), &out), "select");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_unsqueeze(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  int dim;
  TF_LUA_CHECK(L, tf_wrap_dim(tf_lua_checkdim(L, 2), a->ndim + 1, &dim), "unsqueeze");
  tf_shape s = {.ndim = a->ndim + 1};
  if (s.ndim > TF_MAX_DIMS) return tf_lua_error(L, "unsqueeze: a tensor has at most 8 dimensions");
  int64_t strides[TF_MAX_DIMS];
  for (int i = 0, j = 0; i < s.ndim; i++) {
    if (i == dim) {
      s.dims[i] = 1;
      strides[i] = j < a->ndim ? a->strides[j] * a->shape[j] : 1;
      continue;
    }
    s.dims[i] = a->shape[j];
    strides[i] = a->strides[j++];
  }
  TF_LUA_CHECK(L, tf_ag_alias(a, &s, strides, &out), "unsqueeze");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* x:squeeze() drops every size-1 dim; x:squeeze(dim) only that one (if 1). */
static int tf_l_squeeze(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  int only = -1;
  if (!lua_isnoneornil(L, 2)) TF_LUA_CHECK(L, tf_wrap_dim(tf_lua_checkdim(L, 2), a->ndim, &only), "squeeze");
  tf_shape s = {0};
  int64_t strides[TF_MAX_DIMS];
  for (int i = 0; i < a->ndim; i++) {
    if (a->shape[i] == 1 && (only < 0 || only == i)) continue;
    s.dims[s.ndim] = a->shape[i];
    strides[s.ndim++] = a->strides[i];
  }
  TF_LUA_CHECK(L, tf_ag_alias(a, &s, strides, &out), "squeeze");
  tf_lua_pushtensor(L, out);
  return 1;
}

/* In-place writes cannot be differentiated: refused on tensors that need
 * grad while grad mode is on (an optimizer updates them under tf.no_grad). */
static void tf_l_check_inplace(lua_State *L, tf_tensor *dst, const char *fname) {
  if (tf_grad_enabled() && tf_tensor_needs_grad(dst))
    tf_lua_error(L, "%s: in-place write to a tensor that requires grad (do it inside tf.no_grad)", fname);
}

/* x:copy_(src): copies src's values (any dtype, same device, same shape) into x. */
static int tf_l_copy_(lua_State *L) {
  tf_tensor *dst = tf_lua_checktensor(L, 1), *src = tf_lua_checktensor(L, 2);
  tf_l_check_inplace(L, dst, "copy_");
  TF_LUA_CHECK(L, tf_copy_into(dst, src), "copy_");
  tf_tensor_bump_version(dst);
  lua_settop(L, 1);
  return 1;
}

/* x:fill_(value) */
static int tf_l_fill_(lua_State *L) {
  tf_tensor *dst = tf_lua_checktensor(L, 1), *tmp;
  double v = lua_isboolean(L, 2) ? lua_toboolean(L, 2) : luaL_checknumber(L, 2);
  tf_l_check_inplace(L, dst, "fill_");
  tf_shape s = tf_tensor_shape(dst);
  TF_LUA_CHECK(L, tf_full(&s, v, dst->dtype, dst->device, &tmp), "fill_");
  tf_status st = tf_copy_into(dst, tmp);
  tf_tensor_release(tmp);
  TF_LUA_CHECK(L, st, "fill_");
  tf_tensor_bump_version(dst);
  lua_settop(L, 1);
  return 1;
}

/* ---- reading values back ---------------------------------------------------- */

/* A contiguous CPU copy of t (t itself, retained, when it already is one). */
static tf_tensor *tf_l_host_copy(lua_State *L, tf_tensor *t, const char *fname) {
  tf_tensor *c;
  if (t->device.type == TF_DEV_CPU && tf_tensor_is_contiguous(t))
    c = tf_tensor_retain(t);
  else
    TF_LUA_CHECK(L, tf_to(t, t->dtype, tf_cpu(), &c), fname);
  return c;
}

static void tf_l_push_elem(lua_State *L, const void *data, tf_dtype d, int64_t i) {
  if (d == TF_BOOL)
    lua_pushboolean(L, ((const uint8_t *)data)[i] != 0);
  else if (tf_dtype_is_float(d))
    lua_pushnumber(L, tf_elem_get(data, d, i));
  else
    lua_pushinteger(L, tf_elem_get_int(data, d, i));
}

static void tf_l_build_list(lua_State *L, const tf_tensor *t, const void *data, int depth, int64_t *at) {
  if (depth == t->ndim) {
    tf_l_push_elem(L, data, t->dtype, (*at)++);
    return;
  }
  luaL_checkstack(L, 4, "tolist: nesting too deep");
  lua_createtable(L, (int)t->shape[depth], 0);
  for (int64_t i = 0; i < t->shape[depth]; i++) {
    tf_l_build_list(L, t, data, depth + 1, at);
    lua_rawseti(L, -2, i + 1);
  }
}

static int tf_l_tolist(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  tf_tensor *c = tf_l_host_copy(L, t, "tolist");
  int64_t at = 0;
  tf_l_build_list(L, c, tf_tensor_data(c), 0, &at);
  tf_tensor_release(c);
  return 1;
}

static int tf_l_item(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  if (tf_tensor_numel(t) != 1)
    return tf_lua_error(L, "item: the tensor has %d elements, not exactly one", (int)tf_tensor_numel(t));
  tf_tensor *c = tf_l_host_copy(L, t, "item");
  tf_l_push_elem(L, tf_tensor_data(c), c->dtype, 0);
  tf_tensor_release(c);
  return 1;
}

/* ---- shape queries ------------------------------------------------------------ */

static void tf_l_push_shape(lua_State *L, const int64_t *dims, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, dims[i]);
    lua_rawseti(L, -2, i + 1);
  }
  luaL_setmetatable(L, "tf.Shape");
}

/* x:size() / x:stride(): the table of sizes or strides, or with a dim (from
 * 0, negative from the end) that one entry. */
static int tf_l_dims_query(lua_State *L, bool strides, const char *fname) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  const int64_t *dims = strides ? t->strides : t->shape;
  if (lua_isnoneornil(L, 2)) {
    tf_l_push_shape(L, dims, t->ndim);
    return 1;
  }
  int d;
  TF_LUA_CHECK(L, tf_wrap_dim(tf_lua_checkdim(L, 2), t->ndim, &d), fname);
  lua_pushinteger(L, t->ndim ? dims[d] : 1);
  return 1;
}

static int tf_l_size(lua_State *L) { return tf_l_dims_query(L, false, "size"); }
static int tf_l_stride(lua_State *L) { return tf_l_dims_query(L, true, "stride"); }

static int tf_l_numel(lua_State *L) {
  lua_pushinteger(L, tf_tensor_numel(tf_lua_checktensor(L, 1)));
  return 1;
}

/* t:data_ptr() -> the address of the first element, as memory snapshots
 * show it (0 for an empty tensor). */
static int tf_l_data_ptr(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  lua_pushinteger(L, t->storage->data ? (lua_Integer)(uintptr_t)tf_tensor_data(t) : 0);
  return 1;
}

static int tf_l_dim(lua_State *L) {
  lua_pushinteger(L, tf_lua_checktensor(L, 1)->ndim);
  return 1;
}

static int tf_l_element_size(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)tf_dtype_size(tf_lua_checktensor(L, 1)->dtype));
  return 1;
}

/* ---- lifetime ------------------------------------------------------------------- */

/* free(), __close and __gc: drops this tensor's reference; harmless twice. */
static int tf_l_release(lua_State *L) {
  tf_lua_tensor *u = luaL_checkudata(L, 1, TF_TENSOR_TYPE);
  if (u->t) {
    tf_tensor_release(u->t);
    u->t = NULL;
  }
  return 0;
}

static int tf_l_is_freed(lua_State *L) {
  tf_lua_tensor *u = luaL_checkudata(L, 1, TF_TENSOR_TYPE);
  lua_pushboolean(L, u->t == NULL);
  return 1;
}

/* ---- metamethods -------------------------------------------------------------- */

/* x[i] and x.unknown are errors, not a silent nil: indexing with [] is not
 * how a tensor gives its elements. (grad and grad_fn are nil when absent:
 * scripts test them.) */
static int tf_l_index(lua_State *L) {
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(1)); /* methods first */
  if (!lua_isnil(L, -1)) return 1;
  if (lua_type(L, 2) != LUA_TSTRING) {
    const char *k = luaL_tolstring(L, 2, NULL);
    return tf_lua_error(L, "tf.Tensor: x[%s]: a tensor is not indexed with []: use x:select(dim, index) for a slice "
                           "(dimensions and indices count from 0), x:item() for the value of a one-element tensor, "
                           "or x:tolist() for a Lua table", k);
  }
  const char *key = lua_tostring(L, 2);
  tf_tensor *t = tf_lua_checktensor(L, 1);
  char buf[32];
  if (strcmp(key, "shape") == 0)
    tf_l_push_shape(L, t->shape, t->ndim);
  else if (strcmp(key, "dtype") == 0)
    lua_pushstring(L, tf_dtype_name(t->dtype));
  else if (strcmp(key, "device") == 0)
    tf_device_format(t->device, buf, sizeof buf), lua_pushstring(L, buf);
  else if (strcmp(key, "ndim") == 0)
    lua_pushinteger(L, t->ndim);
  else if (strcmp(key, "nbytes") == 0)
    lua_pushinteger(L, (lua_Integer)tf_tensor_nbytes(t));
  else if (strcmp(key, "is_contiguous") == 0)
    lua_pushboolean(L, tf_tensor_is_contiguous(t));
  else if (strcmp(key, "grad") == 0 && t->grad)
    tf_lua_pushtensor(L, tf_tensor_retain(t->grad));
  else if (strcmp(key, "is_leaf") == 0)
    lua_pushboolean(L, t->grad_fn == NULL);
  else if (strcmp(key, "grad_fn") == 0 && t->grad_fn)
    lua_pushstring(L, t->grad_fn->name);
  else if (strcmp(key, "grad") == 0 || strcmp(key, "grad_fn") == 0)
    lua_pushnil(L);
  else
    return tf_lua_error(L, "tf.Tensor has no field '%s' (fields: shape, dtype, device, ndim, nbytes, is_contiguous, "
                           "grad, is_leaf, grad_fn; help(x) lists the methods)", key);
  return 1;
}

/* Only grad can be assigned: nil, or a tensor of the same shape and device. */
static int tf_l_newindex(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  if (!key || strcmp(key, "grad") != 0)
    return tf_lua_error(L, "tf.Tensor: field '%s' cannot be assigned", luaL_tolstring(L, 2, NULL));
  tf_tensor *g = lua_isnil(L, 3) ? NULL : tf_lua_checktensor(L, 3);
  if (g) {
    tf_shape a = tf_tensor_shape(t), b = tf_tensor_shape(g);
    if (a.ndim != b.ndim || memcmp(a.dims, b.dims, sizeof(int64_t) * (size_t)a.ndim) != 0 ||
        !tf_device_eq(t->device, g->device))
      return tf_lua_error(L, "grad: the gradient must have the tensor's shape and device");
    tf_tensor_retain(g);
  }
  tf_tensor_release(t->grad);
  t->grad = g;
  return 0;
}

/* The plain rendering; lua/tf/init.lua replaces it with one that shows values. */
static int tf_l_tostring(lua_State *L) {
  tf_lua_tensor *u = luaL_checkudata(L, 1, TF_TENSOR_TYPE);
  if (!u->t) {
    lua_pushliteral(L, "tensor(freed)");
    return 1;
  }
  char shape[128], dev[32];
  tf_shape s = tf_tensor_shape(u->t);
  tf_device_format(u->t->device, dev, sizeof dev);
  lua_pushfstring(L, "tensor(shape=%s, dtype=%s, device=%s)", tf_shape_format(&s, shape, sizeof shape),
                  tf_dtype_name(u->t->dtype), dev);
  return 1;
}

static int tf_l_len(lua_State *L) {
  tf_tensor *t = tf_lua_checktensor(L, 1);
  if (t->ndim == 0) return tf_lua_error(L, "len() of a 0-dimensional tensor");
  lua_pushinteger(L, t->shape[0]);
  return 1;
}

#define TF_L_ARITH(name, op)                                   \
  static int tf_l_##name(lua_State *L) { return tf_l_binary_code(L, op, "tf." #name); }
TF_L_ARITH(add, TF_OP_ADD)
TF_L_ARITH(sub, TF_OP_SUB)
TF_L_ARITH(mul, TF_OP_MUL)
TF_L_ARITH(div, TF_OP_DIV)
TF_L_ARITH(pow, TF_OP_POW)

static int tf_l_unm(lua_State *L) {
  tf_tensor *a = tf_lua_checktensor(L, 1), *out;
  TF_LUA_CHECK(L, tf_ag_unary(TF_OP_NEG, a, &out), "tf.neg");
  tf_lua_pushtensor(L, out);
  return 1;
}

static int tf_l_shape_tostring(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  luaL_addchar(&b, '(');
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    lua_pushfstring(L, "%s%I", i > 1 ? ", " : "", lua_tointeger(L, -1));
    lua_remove(L, -2);
    luaL_addvalue(&b);
  }
  if (n == 1) luaL_addchar(&b, ',');
  luaL_addchar(&b, ')');
  luaL_pushresult(&b);
  return 1;
}

static int tf_l_is_tensor(lua_State *L) {
  lua_pushboolean(L, luaL_testudata(L, 1, TF_TENSOR_TYPE) != NULL);
  return 1;
}

/* tf._op_table(): {name, family} for every op of the registry, so tests can
 * go over all of them (the error-message tests, for one). */
static int tf_l_op_table(lua_State *L) {
  static const char *const families[] = {"unary", "binary", "reduce", "matmul", "other"};
  int count;
  const tf_op_info *ops = tf_op_registry(&count);
  lua_createtable(L, count, 0);
  for (int i = 0; i < count; i++) {
    lua_createtable(L, 0, 2);
    TF_SET_STR(L, "name", ops[i].name);
    TF_SET_STR(L, "family", families[ops[i].family]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static const luaL_Reg tf_tensor_methods[] = {
    {"to", tf_l_to},
    {"cpu", tf_l_cpu},
    {"cuda", tf_l_cuda},
    {"contiguous", tf_l_contiguous},
    {"clone", tf_l_clone},
    {"reshape", tf_l_reshape},
    {"view", tf_l_view},
    {"transpose", tf_l_transpose},
    {"t", tf_l_t},
    {"expand", tf_l_expand},
    {"narrow", tf_l_narrow},
    {"select", tf_l_select},
    {"unsqueeze", tf_l_unsqueeze},
    {"squeeze", tf_l_squeeze},
    {"copy_", tf_l_copy_},
    {"fill_", tf_l_fill_},
    {"tolist", tf_l_tolist},
    {"item", tf_l_item},
    {"size", tf_l_size},
    {"stride", tf_l_stride},
    {"numel", tf_l_numel},
    {"data_ptr", tf_l_data_ptr},
    {"dim", tf_l_dim},
    {"element_size", tf_l_element_size},
    {"free", tf_l_release},
    {"is_freed", tf_l_is_freed},
    {NULL, NULL},
};

static const luaL_Reg tf_tensor_metamethods[] = {
    {"__gc", tf_l_release},     {"__close", tf_l_release}, {"__tostring", tf_l_tostring},
    {"__len", tf_l_len},        {"__add", tf_l_add},       {"__sub", tf_l_sub},
    {"__mul", tf_l_mul},        {"__div", tf_l_div},       {"__pow", tf_l_pow},
    {"__unm", tf_l_unm},        {"__newindex", tf_l_newindex}, {NULL, NULL},
};

static const luaL_Reg tf_tensor_functions[] = {
    {"tensor", tf_l_tensor},
    {"full", tf_l_full},
    {"arange", tf_l_arange},
    {"randint", tf_l_randint},
    {"trunc_normal", tf_l_trunc_normal},
    {"is_tensor", tf_l_is_tensor},
    {"cast", tf_l_cast},
    {"finfo", tf_l_finfo},
    {"_op_table", tf_l_op_table},
    {NULL, NULL},
};

void tf_open_tensor(lua_State *L) {
  /* core table is at -1 */
  luaL_setfuncs(L, tf_tensor_functions, 0);
  static const struct {
    const char *name;
    int has_value;
    double value;
  } filled[] = {{"zeros", 1, 0.0}, {"ones", 1, 1.0}, {"empty", 0, 0.0}};
  for (size_t i = 0; i < sizeof filled / sizeof filled[0]; i++) {
    if (filled[i].has_value)
      lua_pushnumber(L, filled[i].value);
    else
      lua_pushnil(L);
    lua_pushcclosure(L, tf_l_filled, 1);
    lua_setfield(L, -2, filled[i].name);
  }
  lua_pushinteger(L, TF_RANDOM_UNIFORM);
  lua_pushcclosure(L, tf_l_random, 1);
  lua_setfield(L, -2, "rand");
  lua_pushinteger(L, TF_RANDOM_NORMAL);
  lua_pushcclosure(L, tf_l_random, 1);
  lua_setfield(L, -2, "randn");

  static const luaL_Reg shape_meta[] = {{"__tostring", tf_l_shape_tostring}, {NULL, NULL}};
  tf_lua_newclass(L, "tf.Shape", shape_meta, NULL);

  /* Opened again (require "tf.core" after tf dropped it, as tf.help does):
   * the class stays as it is, with the methods Lua added, and the new core
   * table gets the same methods table, the upvalue of __index. */
  const int made = tf_lua_newclass(L, TF_TENSOR_TYPE, tf_tensor_metamethods, tf_tensor_methods);
  luaL_getmetatable(L, TF_TENSOR_TYPE);
  lua_getfield(L, -1, "__index");
  if (!made) {
    lua_getupvalue(L, -1, 1);
    lua_remove(L, -2);
  }
  /* stack: core, metatable, methods */
  lua_pushvalue(L, -3);
  lua_pushvalue(L, -2);
  /* stack: core, mt, methods, core, methods: register ops into both */
  tf_register_ops(L);
  lua_pop(L, 2);
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "Tensor"); /* core.Tensor = methods, so Lua can add methods */
  if (made) {
    lua_pushcclosure(L, tf_l_index, 1);
    lua_setfield(L, -2, "__index");
  } else {
    lua_pop(L, 1);
  }
  lua_setfield(L, -2, "_tensor_metatable"); /* for lua/tf/init.lua's __tostring */
}
