-- escape: encode a table that contains itself
-- exit: 1
-- stderr: tf.json.encode
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local t = {}
t.t = t
tf.json.encode(t)
print("ESCAPED")
