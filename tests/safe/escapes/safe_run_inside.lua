-- escape: start a second tfhost from inside
-- exit: 1
-- stderr: --safe: tf.safe_run is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.safe_run("print(1)\n")
print("ESCAPED")
