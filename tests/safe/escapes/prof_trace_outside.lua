-- escape: write a profiler trace outside
-- exit: 1
-- stderr: --safe: profile:trace: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local p = tf.prof.start()
tf.zeros(4):add(1)
p:stop()
p:trace(OUT .. "/planted.json")
print("ESCAPED")
