-- escape: redirect io.read to a file outside
-- exit: 1
-- stderr: --safe: io.input: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.input(OUT .. "/canary.txt")
print(io.read("a"))
print("ESCAPED")
