-- escape: put a function into the debug table
-- exit: 1
-- stderr: --safe: changing the debug library is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
debug.getinfo = print
print("ESCAPED")
