-- escape: load a precompiled chunk given as a string
-- exit: 1
-- stderr: --safe: loading a binary (precompiled) chunk is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
load("\27LuaT\0\25\147\13\10\26\10\4\8\8", "x", "b")
print("ESCAPED")
