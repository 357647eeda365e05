-- escape: read a system file
-- exit: 1
-- stderr: --safe: io.open: cannot read '/etc/passwd'
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open("/etc/passwd"):read("a")
print("ESCAPED")
