-- escape: load libc's system() as a Lua function
-- exit: 1
-- stderr: --safe: package.loadlib is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.loadlib("libc.so.6", "system")
print("ESCAPED")
