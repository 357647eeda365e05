-- escape: write through a link to a folder outside
-- exit: 1
-- stderr: --safe: io.open: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.open("link_out/planted.txt", "w")
print("ESCAPED")
