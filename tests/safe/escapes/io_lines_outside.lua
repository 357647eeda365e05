-- escape: read a file outside with io.lines
-- exit: 1
-- stderr: --safe: io.lines: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
for l in io.lines(OUT .. "/canary.txt") do print(l) end
print("ESCAPED")
