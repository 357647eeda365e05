-- escape: reach string.dump through the string metatable
-- exit: 1
-- stderr: --safe: string.dump is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
getmetatable("").__index.dump(print)
print("ESCAPED")
