-- escape: recurse without end through __index
-- exit: 1
-- stderr: stack overflow
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local t
t = setmetatable({}, { __index = function(_, k) return t[k .. "x"] end })
print(t.a)
print("ESCAPED")
