-- escape: read a file outside through a link
-- exit: 1
-- stderr: --safe: io.open: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
print(io.open("canary_link"):read("a"))
print("ESCAPED")
