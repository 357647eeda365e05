-- escape: reach io.popen through _ENV
-- exit: 1
-- stderr: --safe: io.popen is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
_ENV.io.popen("touch " .. OUT .. "/pwned")
print("ESCAPED")
