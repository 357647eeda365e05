-- escape: raise the --memory-limit cap from inside
-- flags: --memory-limit 0.25
-- exit: 1
-- stderr: tf.mem.set_limit: refused: the limit cannot be raised past --memory-limit
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.mem.set_limit(1 << 40)
print("ESCAPED")
