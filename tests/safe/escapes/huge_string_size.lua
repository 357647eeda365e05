-- escape: make a string longer than Lua can index
-- exit: 1
-- stderr: resulting string too large
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local s = string.rep("x", 1 << 62, "yy")
print("ESCAPED")
