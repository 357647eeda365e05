-- escape: write outside through a relative path with ..
-- exit: 1
-- stderr: --safe: io.open: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open("../outside/planted.txt", "w")
print("ESCAPED")
