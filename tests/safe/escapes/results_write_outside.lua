-- escape: write a results file outside
-- exit: 1
-- stderr: --safe: tf.results.write: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.results.write(OUT .. "/planted.json", { { x = 1 } })
print("ESCAPED")
