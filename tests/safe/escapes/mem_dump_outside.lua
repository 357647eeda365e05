-- escape: write a memory snapshot outside
-- exit: 1
-- stderr: --safe: tf.mem.dump: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.mem.dump(OUT .. "/planted.pickle")
print("ESCAPED")
