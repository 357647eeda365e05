-- escape: loadfile a precompiled chunk written inside the sandbox
-- exit: 1
-- stderr: --safe: loading a binary (precompiled) chunk is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local f = assert(io.open("chunk.luac", "wb")) f:write("\27LuaT\0\25\147") f:close()
loadfile("chunk.luac", "b")
print("ESCAPED")
