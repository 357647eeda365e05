-- escape: allocate past --memory-limit
-- flags: --memory-limit 0.125
-- exit: 1
-- stderr: out of memory
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local t = tf.zeros({ 8192, 8192 })
print("ESCAPED")
