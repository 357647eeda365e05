#include "repl.h"

#include <lauxlib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "luahost.h"
#include "repl_input.h"

#ifdef TF_WITH_EDITLINE
#include <editline/readline.h>
#endif

static int tf_use_editor;

/* Ctrl-C at the prompt: the handler only notes it. Installed without
 * SA_RESTART, so the read waiting for the line returns (EINTR), and the line
 * being typed is dropped instead of the process ending. While a chunk runs,
 * tf_lua_docall's own handler interrupts the chunk instead. A Ctrl-C in the
 * microseconds between the prompt's output and the read is only noted (the
 * next one drops the line); it never ends tfhost. */
static volatile sig_atomic_t tf_prompt_interrupted;

static void tf_prompt_sigint(int sig) {
  (void)sig;
  tf_prompt_interrupted = 1;
}

/* Installed before every read: tf_lua_docall puts this handler back after a
 * chunk, but with signal()'s SA_RESTART, under which the read would go on. */
static void tf_prompt_catch_sigint(struct sigaction *previous) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = tf_prompt_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, previous);
}

#ifdef TF_WITH_EDITLINE
/* Tab completion: tf.help's complete(text) lists the names a partial name
 * may become (globals, a table's fields after ".", a value's methods after
 * ":"); readline asks for them one by one. */
static lua_State *tf_complete_L;
static char **tf_complete_list;
static int tf_complete_n, tf_complete_at;

static void tf_complete_reset(void) {
  for (int i = tf_complete_at; i < tf_complete_n; i++) free(tf_complete_list[i]);
  free(tf_complete_list);
  tf_complete_list = NULL;
  tf_complete_n = tf_complete_at = 0;
}

/* Fills the list for text (empty when anything fails: completion never raises). */
static void tf_complete_fill(const char *text) {
  lua_State *L = tf_complete_L;
  const int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "tf.help");
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
    lua_getfield(L, -1, "complete");
    lua_pushstring(L, text);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
      const int n = (int)luaL_len(L, -1);
      tf_complete_list = calloc((size_t)(n > 0 ? n : 1), sizeof *tf_complete_list);
      for (int i = 1; tf_complete_list && i <= n; i++) {
        lua_rawgeti(L, -1, i);
        const char *c = lua_tostring(L, -1);
        if (c && (tf_complete_list[tf_complete_n] = strdup(c))) tf_complete_n++;
        lua_pop(L, 1);
      }
    }
  }
  lua_settop(L, top);
}

static char *tf_complete_next(const char *text, int state) {
  if (state == 0) {
    tf_complete_reset();
    tf_complete_fill(text);
  }
  return tf_complete_at < tf_complete_n ? tf_complete_list[tf_complete_at++] : NULL; /* readline frees it */
}

static char **tf_complete(const char *text, int start, int end) {
  (void)start, (void)end;
  rl_attempted_completion_over = 1; /* names only, never file names */
  return rl_completion_matches(text, tf_complete_next);
}
#endif

/* Reads one line with the line editor or from stdin as it is; 1, 0 at end
 * of input. */
static int tf_read_line(lua_State *L, const char *prompt) {
#ifdef TF_WITH_EDITLINE
  if (tf_use_editor) {
    char *line = readline(prompt);
    if (!line) return 0;
    lua_pushstring(L, line);
    free(line);
    return 1;
  }
#endif
  fputs(prompt, stdout);
  fflush(stdout);
  /* A line of any length, read in pieces: a fixed buffer would split a
   * long pasted line into two chunks. */
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  int got = 0, ended = 0;
  for (;;) {
    char *piece = luaL_prepbuffer(&b);
    if (!fgets(piece, LUAL_BUFFERSIZE, stdin)) break;
    got = 1;
    size_t n = strlen(piece);
    ended = n > 0 && piece[n - 1] == '\n';
    luaL_addsize(&b, ended ? n - 1 : n);
    if (ended) break;
  }
  luaL_pushresult(&b);
  if (!got || (tf_prompt_interrupted && !ended)) {
    lua_pop(L, 1);
    return 0;
  }
  return 1;
}

/* Reads one line without its newline into a new Lua string on the stack:
 * 1, 0 at end of input, TF_REPL_READ_INTERRUPTED after Ctrl-C. */
static int tf_readline(lua_State *L, const char *prompt, void *ud) {
  (void)ud;
  tf_prompt_interrupted = 0;
  tf_prompt_catch_sigint(NULL);
  if (tf_read_line(L, prompt)) return 1;
  if (!tf_prompt_interrupted) return 0;
  clearerr(stdin); /* the interrupted read left its error flag */
  fputc('\n', stdout);
  fflush(stdout);
  return TF_REPL_READ_INTERRUPTED;
}

static void tf_add_history(const char *line, void *ud) {
  (void)ud;
#ifdef TF_WITH_EDITLINE
  if (tf_use_editor && line[0]) add_history(line);
#else
  (void)line;
#endif
}

/* The printer of results: tf.show's, which renders tables as Lua tables and
 * prints through the global print; a registry reference, LUA_NOREF when
 * it could not be loaded (then the global print itself). */
static int tf_printer = LUA_NOREF;

static void tf_load_printer(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "tf.show");
  if (tf_lua_docall(L, 1, 1) == LUA_OK && lua_istable(L, -1)) {
    lua_getfield(L, -1, "print");
    lua_remove(L, -2);
    if (lua_isfunction(L, -1)) {
      tf_printer = luaL_ref(L, LUA_REGISTRYINDEX);
      return;
    }
  }
  lua_pop(L, 1); /* the error or what came instead */
}

/* Prints the values a chunk returned. */
static int tf_print_results(lua_State *L) {
  int n = lua_gettop(L);
  if (n == 0) return LUA_OK;
  luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
  if (tf_printer != LUA_NOREF)
    lua_rawgeti(L, LUA_REGISTRYINDEX, tf_printer);
  else
    lua_getglobal(L, "print");
  lua_insert(L, 1);
  return tf_lua_docall(L, n, 0);
}

static char *tf_history_path(void) {
  const char *home = getenv("HOME");
  if (!home || !*home) return NULL;
  size_t n = strlen(home) + sizeof "/.tfhost_history";
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/.tfhost_history", home);
  return p;
}

/* TFHOST_NO_EDITLINE=1 reads plain lines on a terminal too. */
static int tf_editor_wanted(void) {
  const char *off = getenv("TFHOST_NO_EDITLINE");
  return isatty(STDIN_FILENO) && !(off && *off && strcmp(off, "0") != 0);
}

int tf_repl(lua_State *L) {
  tf_use_editor = tf_editor_wanted();
  struct sigaction outside; /* SIGINT's handling before the REPL, put back after */
  tf_prompt_catch_sigint(&outside);
  char *history = NULL;
#ifdef TF_WITH_EDITLINE
  if (tf_use_editor && (history = tf_history_path())) read_history(history);
  if (tf_use_editor) {
    tf_complete_L = L;
    rl_attempted_completion_function = tf_complete;
    rl_completer_word_break_characters = " \t\n\"\\'`@$><=;|&{}(),+-*/%^~[]#";
    rl_completion_append_character = '\0';
  }
#endif
  tf_load_printer(L);
  const tf_repl_input input = {tf_readline, tf_add_history, NULL};
  int status, code = TF_EXIT_OK;
  while ((status = tf_repl_load(L, &input)) != TF_REPL_END) {
    if (status == TF_REPL_DISCARDED) continue;
    if (status == LUA_OK) status = tf_lua_docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) status = tf_print_results(L);
    if (status != LUA_OK) {
      if (tf_lua_exit_request(L, &code)) break;
      tf_lua_report(L, status);
    }
  }
  sigaction(SIGINT, &outside, NULL);
  lua_settop(L, 0);
  luaL_unref(L, LUA_REGISTRYINDEX, tf_printer);
  tf_printer = LUA_NOREF;
  if (status == TF_REPL_END) fputc('\n', stdout);
  fflush(stdout);
#ifdef TF_WITH_EDITLINE
  if (history) write_history(history);
  tf_complete_reset();
#endif
  free(history);
  return code;
}
