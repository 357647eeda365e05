-- escape: make a tensor of 10^18 elements
-- exit: 1
-- stderr: tf.zeros
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.zeros({ 1000000000, 1000000000 })
print("ESCAPED")
