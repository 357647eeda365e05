-- escape: run forever from a __gc finalizer, where hooks are off, after the script ends
-- flags: --timeout 0.5
-- exit: 124
-- stderr: --timeout: the script was stopped after 0.5 s
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
setmetatable({}, { __gc = function() while true do end end })
print("ended; the finalizer runs at close")
