-- escape: delete a file outside the writable folder
-- exit: 1
-- stderr: --safe: os.remove: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
os.remove(OUT .. "/canary.txt")
print("ESCAPED")
