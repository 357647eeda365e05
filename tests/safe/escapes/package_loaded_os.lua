-- escape: reach os.execute through package.loaded
-- exit: 1
-- stderr: --safe: os.execute is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.loaded["os"].execute("touch " .. OUT .. "/pwned")
print("ESCAPED")
