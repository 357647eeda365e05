-- escape: end tfhost from inside, skipping cleanup
-- exit: 1
-- stderr: --safe: os.exit is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
os.exit(0)
print("ESCAPED")
