-- escape: double a string until memory runs out
-- env: TFHOST_LUA_MEMORY=256M
-- exit: 1
-- stderr: not enough memory
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local s = "x"
for _ = 1, 64 do s = s .. s end
print("ESCAPED")
