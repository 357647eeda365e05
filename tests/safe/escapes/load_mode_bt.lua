-- escape: load a precompiled chunk with mode "bt"
-- exit: 1
-- stderr: --safe: loading a binary (precompiled) chunk is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
load("\27Lua", "x", "bt")
print("ESCAPED")
