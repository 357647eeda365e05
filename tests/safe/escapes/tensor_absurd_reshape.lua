-- escape: view a small tensor as a huge one
-- exit: 1
-- stderr: reshape
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.zeros(4):reshape(1 << 31, 1 << 31)
print("ESCAPED")
