-- escape: run forever
-- flags: --timeout 0.5
-- exit: 124
-- stderr: --timeout: the script was stopped after 0.5 s
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
while true do end
print("ESCAPED")
