-- escape: make a tensor of negative size
-- exit: 1
-- stderr: tf.zeros
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.zeros({ -1, 5 })
print("ESCAPED")
