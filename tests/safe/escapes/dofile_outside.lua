-- escape: run a file from outside the readable folders
-- exit: 1
-- stderr: --safe: dofile: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
dofile(OUT .. "/evil.lua")
print("ESCAPED")
