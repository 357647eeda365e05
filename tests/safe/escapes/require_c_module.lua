-- escape: load a C module through package.cpath
-- exit: 1
-- stderr: C modules are not searched
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.cpath = "/usr/lib/x86_64-linux-gnu/lua/5.4/?.so;/usr/local/lib/lua/5.4/?.so"
require "lpeg_or_any_c_module"
print("ESCAPED")
