/* The sandbox's mechanism: allowed folders, the path check, and the child
 * process of tf.safe_run. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "safe.h"

#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bind.h"
#include "luahost.h"

extern char **environ;

/* Registry key of the sandbox's folders: {read = {dir, ...}, write = dir}. */
static const char tf_safe_key = 0;

bool tf_safe_active(lua_State *L) {
  bool active = lua_rawgetp(L, LUA_REGISTRYINDEX, &tf_safe_key) == LUA_TTABLE;
  lua_pop(L, 1);
  return active;
}

bool tf_safe_kernels_allowed(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &tf_safe_key) != LUA_TTABLE) {
    lua_pop(L, 1);
    return true;
  }
  lua_getfield(L, -1, "kernels");
  bool allowed = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return allowed;
}

/* The absolute, link-free form of path in out[PATH_MAX]. A file that does
 * not exist yet resolves through its folder, so a new file can be checked
 * before it is created; a link to a missing file is refused (it could name
 * anything). False with errno set when the path cannot be resolved. */
static bool tf_safe_resolve(const char *path, char *out) {
  if (realpath(path, out)) return true;
  if (errno != ENOENT) return false;
  struct stat st;
  if (lstat(path, &st) == 0) {
    errno = ELOOP;
    return false;
  }
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
    errno = ENOENT;
    return false;
  }
  char dir[PATH_MAX] = ".";
  if (slash) {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir) {
      errno = ENAMETOOLONG;
      return false;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  if (!realpath(dir, out)) return false;
  size_t len = strlen(out);
  if (len + 1 + strlen(base) >= PATH_MAX) {
    errno = ENAMETOOLONG;
    return false;
  }
  if (len > 1) out[len++] = '/';
  strcpy(out + len, base);
  return true;
}

/* Whether the resolved path is root or inside it. */
static bool tf_safe_under(const char *path, const char *root) {
  size_t n = strlen(root);
  if (strncmp(path, root, n) != 0) return false;
  return path[n] == '\0' || path[n] == '/' || (n > 0 && root[n - 1] == '/');
}

/* Whether resolved lies in one of the folders of the list at index list. */
static bool tf_safe_in_list(lua_State *L, int list, const char *resolved) {
  for (lua_Integer i = 1;; i++) {
    bool folder = lua_rawgeti(L, list, i) == LUA_TSTRING;
    bool ok = folder && tf_safe_under(resolved, lua_tostring(L, -1));
    lua_pop(L, 1);
    if (ok || !folder) return ok;
  }
}

/* Whether resolved lies in one of the folders of the rules table's field. */
static bool tf_safe_allowed(lua_State *L, int rules, const char *field, const char *resolved) {
  lua_getfield(L, rules, field);
  bool ok = tf_safe_in_list(L, lua_gettop(L), resolved);
  lua_pop(L, 1);
  return ok;
}

/* The folders of a rule, for messages: "/a" or "/a, /b". */
static const char *tf_safe_folders(lua_State *L, int rules, const char *field) {
  lua_getfield(L, rules, field);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (lua_Integer i = 1; lua_rawgeti(L, -2, i) == LUA_TSTRING; i++) {
    if (i > 1) luaL_addstring(&b, ", ");
    luaL_addvalue(&b);
  }
  lua_pop(L, 1);
  luaL_pushresult(&b);
  lua_remove(L, -2);
  return lua_tostring(L, -1);
}

void tf_safe_check_path(lua_State *L, const char *path, bool write, const char *who) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &tf_safe_key) != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  int rules = lua_gettop(L);
  const char *verb = write ? "write" : "read";
  char resolved[PATH_MAX];
  if (!tf_safe_resolve(path, resolved))
    tf_lua_error(L, "--safe: %s: cannot %s '%s': %s", who, verb, path,
                 errno == ELOOP ? "it is a link to a missing file, or a loop of links" : strerror(errno));
  const char *field = write ? "write" : "read";
  if (!tf_safe_allowed(L, rules, field, resolved))
    tf_lua_error(L, "--safe: %s: cannot %s '%s' (%s): it is outside the %s folders (%s)%s", who, verb, path, resolved,
                 write ? "writable" : "readable", tf_safe_folders(L, rules, field),
                 write ? "; --allow-write DIR names another" : "");
  lua_pop(L, 1);
}

/* Pushes the link-free form of dir; raises when it is not a folder. */
static void tf_safe_push_folder(lua_State *L, const char *dir, const char *what) {
  char resolved[PATH_MAX];
  struct stat st;
  if (!realpath(dir, resolved) || stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode))
    tf_lua_error(L, "--safe: %s '%s' is not a folder that exists", what, dir);
  lua_pushstring(L, resolved);
}

void tf_safe_enter(lua_State *L, const tf_safe_settings *s, const char *script) {
  lua_createtable(L, 0, 2);
  lua_createtable(L, 3, 0); /* read: the current folder, the script's, the writable one */
  tf_safe_push_folder(L, ".", "the current folder");
  lua_rawseti(L, -2, 1);
  int n = 1;
  if (script) {
    const char *slash = strrchr(script, '/');
    lua_pushlstring(L, script, slash ? (size_t)(slash - script) + (slash == script) : 0);
    const char *dir = lua_rawlen(L, -1) ? lua_tostring(L, -1) : ".";
    tf_safe_push_folder(L, dir, "the script's folder");
    lua_rawseti(L, -3, ++n);
    lua_pop(L, 1);
  }
  lua_createtable(L, 1, 0); /* write */
  tf_safe_push_folder(L, s->allow_write ? s->allow_write : ".", s->allow_write ? "--allow-write" : "the current folder");
  if (!tf_safe_in_list(L, lua_gettop(L) - 2, lua_tostring(L, -1))) {
    lua_pushvalue(L, -1);
    lua_rawseti(L, -4, ++n);
  }
  lua_rawseti(L, -2, 1);
  lua_setfield(L, -3, "write");
  lua_setfield(L, -2, "read");
  lua_pushboolean(L, s->allow_kernels);
  lua_setfield(L, -2, "kernels");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tf_safe_key);
  /* the policy: lua/tf/safe.lua replaces, refuses and wraps the libraries */
  lua_getglobal(L, "require");
  lua_pushliteral(L, "tf.safe");
  if (tf_lua_docall(L, 1, 1) != LUA_OK) lua_error(L);
  lua_getfield(L, -1, "enter");
  if (tf_lua_docall(L, 0, 0) != LUA_OK) lua_error(L);
  lua_pop(L, 1);
}

/* tf._safe_check(path, mode, who) -> path: tf_safe_check_path for Lua; mode
 * is io.open's ("r", "w", "a+", ...): any of w, a, + means a write. */
static int tf_l_safe_check(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  const char *mode = luaL_optstring(L, 2, "r");
  const char *who = luaL_optstring(L, 3, "open");
  tf_safe_check_path(L, path, strpbrk(mode, "wa+") != NULL, who);
  lua_settop(L, 1);
  return 1;
}

static int tf_l_safe_active(lua_State *L) {
  lua_pushboolean(L, tf_safe_active(L));
  return 1;
}

/* tf._safe_spawn({args...} [, stdin_text]) -> exit code: runs this tfhost
 * binary with args (tf.safe_run builds them, --safe first) and waits; a
 * child killed by a signal gives 128 + the signal. Refused under --safe. */
static int tf_l_safe_spawn(lua_State *L) {
  if (tf_safe_active(L)) return tf_lua_error(L, "--safe: tf.safe_run is not available (it starts a process)");
  luaL_checktype(L, 1, LUA_TTABLE);
  size_t text_len = 0;
  const char *text = luaL_optlstring(L, 2, NULL, &text_len);
  lua_Integer n = luaL_len(L, 1);
  luaL_argcheck(L, n >= 1 && n < 4096, 1, "needs 1..4095 arguments");
  const char **argv = lua_newuserdatauv(L, sizeof *argv * (size_t)(n + 2), 0);
  argv[0] = "tfhost";
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_rawgeti(L, 1, i) != LUA_TSTRING) return luaL_argerror(L, 1, "arguments must be strings");
    argv[i] = lua_tostring(L, -1);
    lua_pop(L, 1); /* still referenced by the table */
  }
  argv[n + 1] = NULL;
  int pipe_fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (text) {
    if (pipe(pipe_fds) != 0) return tf_lua_error(L, "tf.safe_run: pipe: %s", strerror(errno));
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[0], STDIN_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid;
  int err = posix_spawn(&pid, "/proc/self/exe", &actions, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (text) close(pipe_fds[0]);
  if (err != 0) {
    if (text) close(pipe_fds[1]);
    return tf_lua_error(L, "tf.safe_run: cannot start tfhost: %s", strerror(err));
  }
  if (text) {
    void (*previous)(int) = signal(SIGPIPE, SIG_IGN); /* a child that stops reading early */
    for (size_t done = 0; done < text_len;) {
      ssize_t w = write(pipe_fds[1], text + done, text_len - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += (size_t)w;
    }
    close(pipe_fds[1]);
    signal(SIGPIPE, previous);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return tf_lua_error(L, "tf.safe_run: waitpid: %s", strerror(errno));
  }
  lua_pushinteger(L, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return 1;
}

static const luaL_Reg tf_safe_functions[] = {
    {"_safe_check", tf_l_safe_check},
    {"_safe_active", tf_l_safe_active},
    {"_safe_spawn", tf_l_safe_spawn},
    {NULL, NULL},
};

void tf_open_safe(lua_State *L) { luaL_setfuncs(L, tf_safe_functions, 0); }
