-- escape: run one tensor op (an 8192^3 matrix product on one thread) far past --timeout, never returning to Lua
-- flags: --timeout 0.5 --threads 1
-- exit: 124
-- stderr: --timeout: the script was stopped after 0.5 s
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local a = tf.ones({ 8192, 8192 }, { device = "cpu" })
print(tf.matmul(a, a):sum():item())
print("ESCAPED")
