-- escape: move a file out of the sandbox
-- exit: 1
-- stderr: --safe: os.rename: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local f = assert(io.open("mine.txt", "w")) f:write("x") f:close()
os.rename("mine.txt", OUT .. "/planted.txt")
print("ESCAPED")
