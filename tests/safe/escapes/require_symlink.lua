-- escape: require a module through a link that points outside
-- exit: 1
-- stderr: --safe: require: cannot read
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.path = "./?.lua"
require "evil_link"
print("ESCAPED")
