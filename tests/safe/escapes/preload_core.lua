-- escape: make a fresh C core through package.preload
-- exit: 1
-- stderr: attempt to call a nil value
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
package.preload["tf.core"]()
print("ESCAPED")
