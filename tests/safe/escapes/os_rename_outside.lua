-- escape: move a file from outside into the sandbox
-- exit: 1
-- stderr: --safe: os.rename: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
os.rename(OUT .. "/canary.txt", "stolen.txt")
print("ESCAPED")
