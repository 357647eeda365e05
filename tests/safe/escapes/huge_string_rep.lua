-- escape: make a 1 GiB string (past the Lua heap cap of --safe)
-- exit: 1
-- stderr: not enough memory
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local s = string.rep("x", 1 << 30)
print("ESCAPED")
