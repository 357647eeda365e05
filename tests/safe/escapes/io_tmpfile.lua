-- escape: create an anonymous file in /tmp
-- exit: 1
-- stderr: --safe: io.tmpfile is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.tmpfile()
print("ESCAPED")
