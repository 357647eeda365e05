-- escape: take host memory until the machine has none, under --safe alone (its default cap)
-- exit: 1
-- stderr: the memory limit is reached
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local t = {}
-- tf.empty: the cap (half the host's memory) is reached without touching the pages
while true do t[#t + 1] = tf.empty(1024, 1024, 256, { device = "cpu" }) end
print("ESCAPED")
