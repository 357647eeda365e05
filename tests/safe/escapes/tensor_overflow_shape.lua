-- escape: make a tensor whose size overflows 64 bits
-- exit: 1
-- stderr: tf.ones
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.ones({ 1 << 40, 1 << 40, 1 << 40 })
print("ESCAPED")
