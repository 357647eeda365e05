-- escape: run os.execute from a __gc finalizer at close
-- flags: -W
-- exit: 0
-- stderr: --safe: os.execute is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
setmetatable({}, { __gc = function() os.execute("touch " .. OUT .. "/pwned") end })
print("ESCAPE-CHECK: the finalizer runs at close")
