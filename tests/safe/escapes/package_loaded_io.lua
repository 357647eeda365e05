-- escape: reach io.popen through package.loaded
-- exit: 1
-- stderr: --safe: io.popen is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.loaded.io.popen("touch " .. OUT .. "/pwned")
print("ESCAPED")
