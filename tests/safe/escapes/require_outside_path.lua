-- escape: require a module from a folder outside
-- exit: 1
-- stderr: --safe: require: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.path = OUT .. "/?.lua"
require "evil"
print("ESCAPED")
