-- escape: create a file outside through a link to a missing file
-- exit: 1
-- stderr: --safe: io.open: cannot write 'dangling': it is a link to a missing file
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open("dangling", "w"):write("pwned")
print("ESCAPED")
