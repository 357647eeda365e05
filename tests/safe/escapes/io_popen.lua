-- escape: start a process and read its output
-- exit: 1
-- stderr: --safe: io.popen is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.popen("touch " .. OUT .. "/pwned"):read("a")
print("ESCAPED")
