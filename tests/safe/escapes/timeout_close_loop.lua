-- escape: run forever from a to-be-closed variable while the stop unwinds
-- flags: --timeout 0.5
-- exit: 124
-- stderr: --timeout: the script was stopped after 0.5 s
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local _ <close> = setmetatable({}, { __close = function() while true do end end })
while true do end
print("ESCAPED")
