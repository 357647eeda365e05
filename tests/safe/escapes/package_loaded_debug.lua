-- escape: reach the full debug library through package.loaded
-- exit: 1
-- stderr: --safe: debug.getregistry is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.loaded.debug.getregistry()
print("ESCAPED")
