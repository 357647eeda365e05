-- escape: load tensors from outside
-- exit: 1
-- stderr: --safe: tf.safetensors.load: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.safetensors.load(OUT .. "/w.safetensors")
print("ESCAPED")
