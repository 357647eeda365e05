-- escape: multiply matrices too big for the memory limit
-- flags: --memory-limit 0.25
-- exit: 1
-- stderr: out of memory
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local a = tf.zeros({ 1 << 16, 1 << 16 })
print("ESCAPED")
