-- escape: start a shell command
-- exit: 1
-- stderr: --safe: os.execute is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
os.execute("touch " .. OUT .. "/pwned")
print("ESCAPED")
