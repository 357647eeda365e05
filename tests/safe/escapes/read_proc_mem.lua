-- escape: open the process's own memory for writing
-- exit: 1
-- stderr: --safe: io.open: cannot write '/proc/self/mem'
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open("/proc/self/mem", "r+")
print("ESCAPED")
