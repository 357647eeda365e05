-- escape: require through a path that climbs out with ..
-- exit: 1
-- stderr: --safe: require: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.path = "./../outside/?.lua"
require "evil"
print("ESCAPED")
