#include "luahost.h"

#include "exit_codes.h"
#include "rtc.h"

#include <lauxlib.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bind.h"

#define TF_EXIT_TYPE "tf.Exit"

/* A thread's hook, kept while another one stands in for it (the full
 * heap's, Ctrl-C's) and put back after. */
typedef struct tf_lua_hookstate {
  lua_Hook hook;
  int mask, count;
} tf_lua_hookstate;

static tf_lua_hookstate tf_lua_hook_save(lua_State *L) {
  return (tf_lua_hookstate){lua_gethook(L), lua_gethookmask(L), lua_gethookcount(L)};
}

static void tf_lua_hook_restore(lua_State *L, tf_lua_hookstate s) { lua_sethook(L, s.hook, s.mask, s.count); }

typedef struct tf_lua_heap {
  size_t used, limit;
  lua_State *L; /* the main thread: its hook reports a full heap */
  bool armed;   /* the hook below is set and will look at the heap */
  tf_lua_hookstate saved;
} tf_lua_heap;

/* Past the limit an allocation may still take this much more, so that the
 * error can be raised at the next instruction as an ordinary error with the
 * script's position and a traceback (Lua's own out-of-memory error has
 * neither, and pcall's message handler never sees it). */
static size_t tf_lua_heap_reserve(size_t limit) { return limit / 8 > 262144 ? limit / 8 : 262144; }

static void tf_lua_heap_hook(lua_State *L, lua_Debug *ar);

/* Puts back the hook the arming replaced, unless another one (Ctrl-C's) has
 * replaced ours since. */
static void tf_lua_heap_disarm(tf_lua_heap *h) {
  if (h->armed && lua_gethook(h->L) == tf_lua_heap_hook) tf_lua_hook_restore(h->L, h->saved);
  h->armed = false;
}

/* At the instruction after an allocation past the limit: a full collection,
 * and the error only if the heap is still over the limit. */
static void tf_lua_heap_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  void *ud;
  lua_getallocf(L, &ud);
  tf_lua_heap *h = ud;
  lua_gc(L, LUA_GCCOLLECT);
  if (h->used <= h->limit) {
    tf_lua_heap_disarm(h);
    return;
  }
  /* made while still armed: the message's own allocations must not arm the hook again */
  tf_lua_where(L, 0);
  lua_pushfstring(L, "not enough memory (Lua heap: %d MiB in use, limit %d MiB; set TFHOST_LUA_MEMORY to change it)",
                  (int)(h->used >> 20), (int)(h->limit >> 20));
  lua_concat(L, 2);
  tf_lua_heap_disarm(h);
  lua_error(L);
}

/* Whether a request that takes the heap to total, past the limit, may use
 * the reserve; if so the hook is armed (lua_sethook only sets the thread's
 * fields: safe inside an allocation). Past the reserve Lua's own error
 * follows, and a pending hook would fire later, elsewhere: disarmed. */
static bool tf_lua_heap_soft(tf_lua_heap *h, size_t total) {
  if (!h->L || total > h->limit + tf_lua_heap_reserve(h->limit)) {
    if (h->L) tf_lua_heap_disarm(h);
    return false;
  }
  if (!h->armed || lua_gethook(h->L) != tf_lua_heap_hook) { /* ours runs first, then the one it replaced */
    h->saved = tf_lua_hook_save(h->L);
    h->armed = true;
    lua_sethook(h->L, tf_lua_heap_hook, LUA_MASKCOUNT, 1);
  }
  return true;
}

/* Lua's allocator with accounting: a runaway script gets a "not enough
 * memory" error at its line instead of exhausting the machine. */
static void *tf_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  tf_lua_heap *h = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    h->used -= old;
    return NULL;
  }
  if (h->limit && nsize > old && h->used - old + nsize > h->limit && !tf_lua_heap_soft(h, h->used - old + nsize))
    return NULL;
  void *p = realloc(ptr, nsize);
  if (!p) return NULL;
  h->used = h->used - old + nsize;
  return p;
}

static int tf_lua_panic(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "tfhost: unprotected error: %s\n", msg ? msg : "(not a string)");
  return 0; /* Lua aborts after this; every call is protected, so this is a bug */
}


/* Lua's warning protocol ("@on", "@off", pieces continued with tocont). */
static int tf_warn_on = 0, tf_warn_cont = 0;
static void tf_lua_warn(void *ud, const char *msg, int tocont) {
  (void)ud;
  if (!tf_warn_cont && !tocont && msg[0] == '@') {
    if (strcmp(msg, "@on") == 0) tf_warn_on = 1;
    if (strcmp(msg, "@off") == 0) tf_warn_on = 0;
    return;
  }
  if (tf_warn_on) {
    if (!tf_warn_cont) fputs("tfhost: warning: ", stderr);
    fputs(msg, stderr);
    if (!tocont) fputc('\n', stderr);
  }
  tf_warn_cont = tocont;
}

lua_State *tf_lua_newstate(size_t heap_limit) {
  tf_lua_heap *heap = calloc(1, sizeof *heap);
  if (!heap) return NULL;
  heap->limit = heap_limit;
  lua_State *L = lua_newstate(tf_lua_alloc, heap);
  if (!L) {
    free(heap);
    return NULL;
  }
  heap->L = L;
  lua_atpanic(L, tf_lua_panic);
  lua_setwarnf(L, tf_lua_warn, NULL);
  return L;
}

static tf_lua_heap *tf_lua_heap_of(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

void tf_lua_close(lua_State *L) {
  tf_lua_heap *heap = tf_lua_heap_of(L);
  lua_close(L);
  free(heap);
}

size_t tf_lua_heap_limit(lua_State *L) { return tf_lua_heap_of(L)->limit; }
size_t tf_lua_heap_used(lua_State *L) { return tf_lua_heap_of(L)->used; }

/* ---- Ctrl-C, as lua.c: the signal handler only sets a hook; the hook
 * raises "interrupted!" at the next Lua instruction. ---- */

static lua_State *tf_running_L;
/* The hook Ctrl-C's replaced (--timeout's count, or none), put back when the
 * chunk stops, so that the next chunk is still timed. */
static tf_lua_hookstate tf_sigint_saved;

static void tf_lua_stop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  tf_lua_hook_restore(L, tf_sigint_saved);
  luaL_error(L, "interrupted!");
}

static void tf_lua_sigint(int sig) {
  signal(sig, SIG_DFL); /* a second Ctrl-C terminates */
  if (lua_gethook(tf_running_L) != tf_lua_stop) tf_sigint_saved = tf_lua_hook_save(tf_running_L);
  lua_sethook(tf_running_L, tf_lua_stop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static int tf_lua_msghandler(lua_State *L) {
  if (luaL_testudata(L, 1, TF_EXIT_TYPE)) return 1; /* exit requests pass through */
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      msg = lua_tostring(L, -1);
    else
      msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int tf_lua_docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, tf_lua_msghandler);
  lua_insert(L, base);
  lua_State *outer = tf_running_L;
  tf_running_L = L;
  void (*previous)(int) = signal(SIGINT, tf_lua_sigint);
  int status = lua_pcall(L, narg, nres, base);
  signal(SIGINT, previous);
  tf_running_L = outer;
  lua_remove(L, base);
  return status;
}

int tf_lua_report(lua_State *L, int status) {
  if (status == LUA_OK) return status;
  const char *msg = lua_tostring(L, -1);
  if (!msg) msg = "(error object is not a string)";
  if (status == LUA_ERRMEM)
    fprintf(stderr, "tfhost: %s (Lua heap: %zu MiB in use, limit %zu MiB; set TFHOST_LUA_MEMORY to change it)\n",
            msg, tf_lua_heap_used(L) >> 20, tf_lua_heap_limit(L) >> 20);
  else
    fprintf(stderr, "tfhost: %s\n", msg);
  fflush(stderr);
  lua_pop(L, 1);
  tf_lua_exit_if_context_lost();
  return status;
}

void tf_lua_exit_if_context_lost(void) {
  char why[1024];
  if (!tf_rtc() || !tf_rtc()->context_lost(why, sizeof why)) return;
  fprintf(stderr,
          "tfhost: a kernel faulted and the CUDA context is now unusable (%s). Nothing more can run on the GPU in "
          "this process: tfhost stops here (exit %d). CUDA_LAUNCH_BLOCKING=1 stops at the faulting launch; "
          "compute-sanitizer tfhost ... names the faulting line.\n",
          why, TF_EXIT_SCRIPT);
  fflush(stdout);
  fflush(stderr);
  /* not exit(): freeing memory and flushing the profiler on a context in this state can block */
  _exit(TF_EXIT_SCRIPT);
}

/* ---- tf.exit: a clean, deliberate exit that unwinds (closing <close>
 * variables) instead of calling exit() from inside Lua. ---- */

typedef struct tf_exit_request {
  int code;
} tf_exit_request;

bool tf_lua_exit_request(lua_State *L, int *code) {
  tf_exit_request *req = luaL_testudata(L, -1, TF_EXIT_TYPE);
  if (!req) return false;
  *code = req->code;
  lua_getiuservalue(L, -1, 1);
  if (lua_isstring(L, -1)) {
    FILE *to = req->code == 0 ? stdout : stderr;
    size_t len = 0;
    const char *msg = lua_tolstring(L, -1, &len);
    fputs(msg, to);
    if (len > 0 && msg[len - 1] != '\n') fputc('\n', to); /* a line, as print writes it */
    fflush(to);
  }
  lua_pop(L, 2);
  return true;
}

/* tf.exit([code [, message]]): code is 0..255 (a wider one would be cut to
 * 8 bits by the OS, 256 reading as success) or a boolean as in os.exit;
 * message goes to stdout for code 0, else stderr. */
static int tf_lua_exit(lua_State *L) {
  int code;
  if (lua_isboolean(L, 1)) {
    code = lua_toboolean(L, 1) ? TF_EXIT_OK : TF_EXIT_SCRIPT;
  } else {
    lua_Integer requested = luaL_optinteger(L, 1, TF_EXIT_OK);
    luaL_argcheck(L, requested >= 0 && requested <= 255, 1, "exit code must be in 0..255");
    code = (int)requested;
  }
  return tf_lua_exit_error(L, code, luaL_optstring(L, 2, NULL));
}

static int tf_exit_tostring(lua_State *L);

/* The tf.Exit metatable, made on first use (a stop may come before tf opens). */
static void tf_exit_type(lua_State *L) {
  static const luaL_Reg meta[] = {{"__tostring", tf_exit_tostring}, {NULL, NULL}};
  tf_lua_newclass(L, TF_EXIT_TYPE, meta, NULL);
}

int tf_lua_exit_error(lua_State *L, int code, const char *msg) {
  tf_exit_type(L);
  tf_exit_request *req = lua_newuserdatauv(L, sizeof *req, 1);
  req->code = code;
  if (msg) {
    lua_pushstring(L, msg);
    lua_setiuservalue(L, -2, 1);
  }
  luaL_setmetatable(L, TF_EXIT_TYPE);
  return lua_error(L);
}

static int tf_exit_tostring(lua_State *L) {
  tf_exit_request *req = luaL_checkudata(L, 1, TF_EXIT_TYPE);
  lua_pushfstring(L, "tf.exit(%d)", req->code);
  return 1;
}

void tf_lua_open_exit(lua_State *L) {
  tf_exit_type(L);
  lua_pushcfunction(L, tf_lua_exit);
  lua_setfield(L, -2, "exit");
}
