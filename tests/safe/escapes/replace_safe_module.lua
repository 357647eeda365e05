-- escape: replace tf.safe's path check and the global require, then write outside through tf's writers
-- exit: 1
-- stderr: --safe: tf.report.table: cannot write
local OUT = assert(arg[1], 'the test passes the outside folder as arg[1]')
local safe = require "tf.safe"
safe.writable = function() end
safe.bind({ _safe_check = function() end, _safe_spawn = function() return 0 end })
safe.enter()
local fake = { writable = function() end }
require = function(name) if name == "tf.safe" then return fake end return package.loaded[name] end
pcall(tf.results.write, OUT .. "/planted.json", {})
pcall(tf.json.write, OUT .. "/planted2.json", {})
tf.report.table({ { a = 1 } }, { out = OUT .. "/planted.md" })
print("ESCAPED")
