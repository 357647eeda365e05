-- escape: reach os.execute through a fresh _ENV from load
-- exit: 1
-- stderr: --safe: os.execute is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local f = load("return os.execute", "x", "t", { os = _G.os })
f()("touch " .. OUT .. "/pwned")
print("ESCAPED")
