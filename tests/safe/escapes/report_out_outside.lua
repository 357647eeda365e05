-- escape: write a report table outside
-- exit: 1
-- stderr: --safe: tf.report.table: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
tf.report.table({ { a = 1 } }, { out = OUT .. "/planted.md" })
print("ESCAPED")
