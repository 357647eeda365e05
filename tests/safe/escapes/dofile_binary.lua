-- escape: dofile a precompiled chunk
-- exit: 1
-- stderr: --safe: loading a binary (precompiled) chunk is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local f = assert(io.open("chunk2.luac", "wb")) f:write("\27LuaT\0") f:close()
dofile("chunk2.luac")
print("ESCAPED")
