-- escape: write JSON outside
-- exit: 1
-- stderr: --safe: tf.json.write: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.json.write(OUT .. "/planted.json", { 1 })
print("ESCAPED")
