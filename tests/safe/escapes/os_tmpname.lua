-- escape: create a file in /tmp
-- exit: 1
-- stderr: --safe: os.tmpname is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
os.tmpname()
print("ESCAPED")
