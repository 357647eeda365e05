-- escape: name a file by a number (Lua takes 123 as "123") to write where --allow-write does not allow
-- flags: --allow-write allowed
-- exit: 1
-- stderr: --safe: io.output: cannot write '123'
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
io.output(123)
io.write("pwned")
print("ESCAPED")
