-- escape: narrow past the end of a tensor
-- exit: 1
-- stderr: narrow
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.zeros(4):narrow(0, 2, 1 << 40)
print("ESCAPED")
