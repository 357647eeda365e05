-- escape: change the whole process's locale
-- exit: 1
-- stderr: --safe: os.setlocale with a locale is not available
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
os.setlocale("C")
print("ESCAPED")
