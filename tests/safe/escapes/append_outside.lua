-- escape: append to a file outside
-- exit: 1
-- stderr: --safe: io.open: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open(OUT .. "/canary.txt", "a"):write("pwned")
print("ESCAPED")
