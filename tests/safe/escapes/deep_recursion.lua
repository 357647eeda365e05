-- escape: recurse without end
-- exit: 1
-- stderr: stack overflow
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local function f(n) return 1 + f(n + 1) end
f(1)
print("ESCAPED")
