-- escape: load a precompiled chunk through a reader function
-- exit: 1
-- stderr: --safe: loading a binary (precompiled) chunk is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local parts = { "\27", "LuaT\0" }
local i = 0
load(function() i = i + 1 return parts[i] end, "x", "b")
print("ESCAPED")
