/* Helpers shared by the Lua bindings (host/bind/l_*.c): argument checking and
 * turning core status codes into Lua errors. Bindings stay thin: check
 * arguments, call the core, push results. */
#ifndef TF_BIND_H
#define TF_BIND_H

#include <lauxlib.h>
#include <lua.h>

#include "ops.h"
#include "tensor.h"

#define TF_TENSOR_TYPE "tf.Tensor"

/* The userdata of a tf.Tensor: one reference to a core tensor, NULL once
 * released by free(), <close> or __gc (all three share one path). */
typedef struct tf_lua_tensor {
  tf_tensor *t;
} tf_lua_tensor;

/* Errors that point at the user's line: the position pushed by
 * tf_lua_where is that of the first function at `level` or above that is
 * neither C nor one of tfhost's Lua modules (luaL_where's, past tfhost's
 * own frames); tf_lua_error is luaL_error with that position;
 * tf_lua_replace_error makes the global error() do the same. tfhost's
 * frames stay in the traceback. */
void tf_lua_where(lua_State *L, int level);
int tf_lua_error(lua_State *L, const char *fmt, ...);
void tf_lua_replace_error(lua_State *L);
/* Raises the core's last error as a Lua error from function fname, at the
 * user's line: "file:line: fname: message". Out of memory errors read
 * "file:line: out of memory: ... (in fname)", so scripts recognise them by
 * the words after the position (tf.mem.is_oom). Never returns. */
int tf_lua_raise(lua_State *L, tf_status st, const char *fname);
#define TF_LUA_CHECK(L, expr, fname)                        \
  do {                                                      \
    tf_status tf_lua_st_ = (expr);                          \
    if (tf_lua_st_ != TF_OK) tf_lua_raise(L, tf_lua_st_, fname); \
  } while (0)

/* The live tensor at idx; a Lua error if it is not a tensor or was freed. */
tf_tensor *tf_lua_checktensor(lua_State *L, int idx);
/* The live fused model (tf.Model) at idx (l_model.c). */
struct tf_model *tf_lua_checkmodel(lua_State *L, int idx);
tf_tensor *tf_lua_totensor(lua_State *L, int idx); /* NULL if not a live tensor */
/* Pushes a new tf.Tensor owning the reference t (released by __gc/free). */
void tf_lua_pushtensor(lua_State *L, tf_tensor *t);

/* A shape given either as a table {2, 3} at idx, or as integers from idx on.
 * Returns the index of the first argument after the shape. allow_infer
 * lets one dimension be -1 (reshape). */
int tf_lua_checkshape(lua_State *L, int idx, tf_shape *shape, int allow_infer);

/* Refuses every key of the options table at idx that is not one of keys
 * (NULL-ended), naming it, a near spelling ("dmodel": d_model) and the
 * accepted keys: "fname: unknown option 'x'; accepted: a, b" (fname NULL:
 * an argument error, "bad argument #idx to ..."). nil or none at idx passes. */
void tf_lua_checkkeys(lua_State *L, int idx, const char *fname, const char *const keys[]);

/* dtype / device from an options table at idx (nil or absent: defaults). */
void tf_lua_checkopts(lua_State *L, int idx, tf_dtype *dtype, tf_device *device, tf_dtype default_dtype);
tf_device tf_lua_checkdevice(lua_State *L, int idx);  /* string, or nil: default device */
tf_dtype tf_lua_checkdtype(lua_State *L, int idx);
/* A dimension argument (from 0, negative from the end): an integer small
 * enough that tf_wrap_dim reports it as given, never truncated. */
int tf_lua_checkdim(lua_State *L, int idx);

/* The class `name` (a metatable in the registry, as luaL_newmetatable):
 * its metamethods, and its methods (NULL: none) in a table that is its
 * __index. Every tfhost type is made this way, so each has one metatable
 * with its methods apart from its metamethods. Leaves the stack as it was;
 * returns 1 when it made the class, 0 when it was there already (then it
 * changes nothing), so a type may be made on first use. */
int tf_lua_newclass(lua_State *L, const char *name, const luaL_Reg *metamethods, const luaL_Reg *methods);

/* A userdata that owns a C object and frees it with `release` when
 * collected, so a Lua error part way through building a result leaks
 * nothing. Returns the slot to store the object in (NULL at first); set it
 * back to NULL to keep the object. */
void **tf_lua_push_owner(lua_State *L, void (*release)(void *));

/* t[field] = value for the table on top of the stack (results tables). */
#define TF_SET_INT(L, field, value) (lua_pushinteger(L, (lua_Integer)(value)), lua_setfield(L, -2, field))
#define TF_SET_STR(L, field, value) (lua_pushstring(L, (value)), lua_setfield(L, -2, field))
#define TF_SET_BOOL(L, field, value) (lua_pushboolean(L, (value)), lua_setfield(L, -2, field))
#define TF_SET_NUM(L, field, value) (lua_pushnumber(L, (lua_Number)(value)), lua_setfield(L, -2, field))

/* The openers of tf.core (luaopen_tf_core, host/bind/open.c calls them in
 * its table's order): each adds its functions, types and fields to the
 * table on top of the stack. */
void tf_open_tensor(lua_State *L);    /* tensors, tf.Tensor (methods), tf.Shape; first: others extend tf.Tensor */
void tf_open_mem(lua_State *L);       /* tf.mem */
void tf_open_timer(lua_State *L);     /* tf.timer, tf.sync, tf.now */
void tf_open_json(lua_State *L);      /* tf.json */
void tf_open_safetensors(lua_State *L); /* tf.safetensors */
void tf_open_data(lua_State *L);      /* tf._data: token files and folders, for tf.data */
void tf_open_sys(lua_State *L);       /* devices, seeds, versions, tf.mkdir */
void tf_open_hash(lua_State *L);      /* tf.sha256, tf.sha256_file, tf.executable */
void tf_open_autograd(lua_State *L);  /* grad scopes, autocast, x:backward() */
void tf_open_nn(lua_State *L);        /* the NN ops, as functions and methods */
void tf_open_model(lua_State *L);     /* tf._model: the fused Transformer engine */
void tf_open_generate(lua_State *L);  /* tf.Model's generation methods (after tf_open_model) */
void tf_open_dist(lua_State *L);      /* tf._dist: ranks and collectives, for tf.dist */
void tf_open_prof(lua_State *L);      /* tf._prof: ranges and the profiler */
void tf_open_rtc(lua_State *L);       /* tf._rtc: kernels compiled at run time, for tf.cuda */
void tf_open_function(lua_State *L);  /* tf._function: autograd functions written in Lua, for tf.autograd */
void tf_lua_open_exit(lua_State *L);  /* tf.exit (luahost.c) */
void tf_open_safe(lua_State *L);      /* the sandbox's functions (safe.c) */
int luaopen_tf_core(lua_State *L);

/* The Lua state whose x:backward() is running (NULL outside one): the
 * backward of a function written in Lua runs on it. Returns the previous. */
lua_State *tf_lua_set_backward_state(lua_State *L);

/* The running Lua state's main thread, for the allocator's reclaim hook. */
void tf_lua_install_reclaim(lua_State *L);

#endif
