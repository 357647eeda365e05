-- escape: overwrite a file outside through a link to it
-- exit: 1
-- stderr: --safe: io.open: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open("canary_link", "w"):write("pwned")
print("ESCAPED")
