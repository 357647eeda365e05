-- escape: remove the --timeout hook
-- exit: 1
-- stderr: --safe: debug.sethook is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
debug.sethook()
print("ESCAPED")
