-- escape: save tensors outside
-- exit: 1
-- stderr: --safe: tf.safetensors.save: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.safetensors.save(OUT .. "/planted.safetensors", { w = tf.zeros(2) })
print("ESCAPED")
