-- escape: fill a table until memory runs out
-- env: TFHOST_LUA_MEMORY=64M
-- exit: 1
-- stderr: not enough memory
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
collectgarbage("stop")
local t = {}
for i = 1, math.maxinteger do t[i] = { i } end
print("ESCAPED")
