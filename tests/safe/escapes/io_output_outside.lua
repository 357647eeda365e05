-- escape: redirect io.write to a file outside
-- exit: 1
-- stderr: --safe: io.output: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.output(OUT .. "/planted.txt")
io.write("pwned")
print("ESCAPED")
