/* tf.core, the C half of the tf module (require "tf.core", preloaded by
 * runtime.c): one table that every binding file adds its part to, in the
 * order of this list. As Lua's linit.c lists the standard libraries, this
 * lists tfhost's: a new binding is one line here and its declaration in
 * bind.h. */
#include "bind.h"

static const struct tf_opener {
  const char *part; /* what it adds, for the reader */
  void (*open)(lua_State *L);
} tf_openers[] = {
    {"tensors, tf.Tensor's methods (the parts below add to them)", tf_open_tensor},
    {"tf.mem", tf_open_mem},
    {"tf.timer, tf.sync, tf.now", tf_open_timer},
    {"tf.json", tf_open_json},
    {"tf.safetensors", tf_open_safetensors},
    {"tf._data: token files, folders", tf_open_data},
    {"devices, seeds, versions, tf.mkdir", tf_open_sys},
    {"tf.sha256, tf.sha256_file, tf.executable", tf_open_hash},
    {"autograd and autocast", tf_open_autograd},
    {"the NN ops", tf_open_nn},
    {"tf._model", tf_open_model},
    {"tf.Model's generation methods", tf_open_generate},
    {"tf._dist", tf_open_dist},
    {"tf._prof", tf_open_prof},
    {"tf._rtc", tf_open_rtc},
    {"tf._function", tf_open_function},
    {"tf.exit", tf_lua_open_exit},
    {"the sandbox's functions", tf_open_safe},
};

int luaopen_tf_core(lua_State *L) {
  lua_newtable(L);
  for (size_t i = 0; i < sizeof tf_openers / sizeof tf_openers[0]; i++) tf_openers[i].open(L);
  return 1;
}
