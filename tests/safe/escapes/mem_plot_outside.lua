-- escape: write a memory plot outside
-- exit: 1
-- stderr: --safe: tf.mem.plot: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.mem.plot(OUT .. "/planted.html")
print("ESCAPED")
