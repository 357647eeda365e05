-- escape: expand a tensor to 2^62 elements and sum it
-- flags: --memory-limit 0.25
-- exit: 1
-- stderr: expand: shape has too many elements
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.zeros(1):expand(1 << 31, 1 << 31):sum()
print("ESCAPED")
