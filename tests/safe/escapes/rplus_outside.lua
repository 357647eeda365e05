-- escape: change a file outside through mode r+
-- exit: 1
-- stderr: --safe: io.open: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open(OUT .. "/canary.txt", "r+"):write("pwned")
print("ESCAPED")
