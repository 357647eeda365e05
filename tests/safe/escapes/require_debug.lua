-- escape: get the debug library back with require
-- exit: 1
-- stderr: --safe: debug.getupvalue is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
require("debug").getupvalue(io.open, 1)
print("ESCAPED")
