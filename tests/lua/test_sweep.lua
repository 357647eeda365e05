-- The pieces every experiment shares: tf.report.sweep (progress with an
-- estimate, rows in the results file as they finish), tf.units.bytes,
-- tf.report.noise, tf.options' CPU defaults, and the argument errors of
-- tf.results, tf.report and tf.plot, which name the caller's line.
local T = require "harness"

local here = debug.getinfo(1, "S").short_src

-- fn (written on one line) raises an error with text, positioned at fn's line in this file.
local function at_caller(fn, text)
  local err = T.raises(fn, text)
  T.eq(err:match("^(.-):%d+:"), here, "the position is this file's: " .. err)
  T.eq(tonumber(err:match("^[^:]+:(%d+):")), debug.getinfo(fn, "S").linedefined, err)
end

-- A file handle that keeps what is written to it.
local function capture()
  local out = { text = "" }
  function out:write(...) self.text = self.text .. table.concat({ ... }) end
  function out:flush() end
  return out
end

T.test("tf.units.bytes shows every size in a unit that shows it", function()
  T.eq(tf.units.bytes(0), "0 B")
  T.eq(tf.units.bytes(512), "512 B")
  T.eq(tf.units.bytes(32 * 1024), "32.0 KiB") -- memory_profile's (d) said "0.0 MiB" for this
  T.eq(tf.units.bytes(1536), "1.50 KiB")
  T.eq(tf.units.bytes(520 * 1024), "520 KiB")
  T.eq(tf.units.bytes(1.5 * 2 ^ 30), "1.50 GiB")
  T.eq(tf.units.bytes(-2048), "-2.00 KiB")
  at_caller(function() tf.units.bytes("12") end, "tf.units.bytes: expects a number of bytes, got string")
end)

T.test("tf.report.noise calls a difference inside the spreads noise, and says by how much", function()
  local ratio, text = tf.report.noise(10.5, 10, 0.5, 0.5)
  T.near(ratio, 1.05, 1e-12)
  T.eq(text, "within noise (±10 %)")
  ratio, text = tf.report.noise(30, 10, 0.3, 0.1)
  T.eq(ratio, 3.0)
  T.eq(text, nil)
  ratio, text = tf.report.noise(2, 1) -- no spreads: any difference counts
  T.eq(text, nil)
  at_caller(function() tf.report.noise("a", 1) end, "tf.report.noise: expects two measured values")
end)

T.test("a sweep says what is left and writes the rows done so far, incomplete until finish", function()
  local path = os.tmpname()
  local rows, out = {}, capture()
  local sweep = tf.report.sweep{ total = 3, json = path, results = rows, costs = { 1, 1, 2 }, out = out,
    extra = { key = { "n" } } }
  sweep:start("n %d", 1)
  rows[#rows + 1] = { n = 1 }
  sweep:done()
  T.ok(out.text:find("^%[1/3%] n 1 %.%.%. done %([%d.]+ s; about [%d.]+ s left%)\n"), out.text)
  local doc = tf.json.read(path)
  T.eq(doc.complete, false)
  T.eq(doc.progress.done, 1)
  T.eq(doc.progress.total, 3)
  T.eq(#doc.results, 1)
  T.eq(doc.key[1], "n")
  T.ok(doc.env.tfhost.version == tf.version, "the environment comes with every write")
  sweep:start("n %d", 2)
  rows[#rows + 1] = { n = 2 }
  sweep:done("OOM")
  T.ok(out.text:find("[2/3] n 2 ... OOM (", 1, true), out.text)
  T.eq(#tf.json.read(path).results, 2)
  sweep:start("n %d", 3)
  rows[#rows + 1] = { n = 3 }
  sweep:done()
  T.ok(not out.text:match("%[3/3%][^\n]*left"), "nothing is left after the last: " .. out.text)
  local final = sweep:finish{ summary = "ok" }
  doc = tf.json.read(path)
  T.eq(doc.complete, true)
  T.eq(doc.summary, "ok")
  T.eq(doc.progress.done, 3)
  T.eq(final.summary, "ok")
  T.ok(out.text:find("3 of 3 done in ", 1, true), out.text)
  local part = io.open(path .. ".part")
  T.ok(part == nil, "no temporary file is left")
  os.remove(path)
end)

T.test("the estimate follows the costs", function()
  local out = capture()
  local sweep = tf.report.sweep{ total = 2, costs = { 1, 1000 }, out = out }
  sweep.started_ms = tf.now() - 1000 -- as if the first took 1 s
  sweep:start("a")
  sweep:done()
  local left = out.text:match("about (.-) left")
  T.ok(left and (left:find("min") or left:find(" h ")), "1000 times the first's cost is minutes: " .. out.text)
end)

T.test("a sweep's bad options name the caller's line", function()
  at_caller(function() tf.report.sweep() end, "tf.report.sweep: expects a table of options, got nothing")
  at_caller(function() tf.report.sweep{ total = "3" } end, "opts.total must be the number of configurations")
  at_caller(function() tf.report.sweep{ total = 2, costs = { 1 } } end, "opts.costs must list one cost per")
  at_caller(function() tf.report.sweep{ total = 1, json = 5 } end, "opts.json must be a file path")
end)

T.test("tf.results.write's argument errors name the caller's line and the argument", function()
  at_caller(function() tf.results.write("r.json", 42) end,
    "tf.results.write: the second argument is the results, a list of rows (tables) or a table of named parts; " ..
    "got number")
  at_caller(function() tf.results.write(42, {}) end, "the first argument is the file to write, a path; got number")
  at_caller(function() tf.results.write("r.json", { 1, 2 }) end, "results[1] is a number, not a row")
  at_caller(function() tf.results.write("r.json", {}, "x") end, "the third argument is a table of extra fields")
end)

T.test("tf.report and tf.plot argument errors name the caller's line", function()
  at_caller(function() tf.report.table({ 1 }) end, "tf.report.table: rows[1] is a number, not a row")
  at_caller(function() tf.report.table({}, "csv") end, "the second argument is a table of options")
  at_caller(function() tf.report.progress(5) end, "tf.report.progress: expects a format string, got number")
  at_caller(function() tf.plot.sweep("p.svg", {}) end, "tf.plot.sweep: the third argument is a table")
  at_caller(function() tf.plot.chart({}, { x = "seq" }) end, "got string and nothing")
end)

T.test("an option's cpu default is its default where the device is the CPU; ranges are declared", function()
  local opt = tf.options({ { "n", "count", default = 8, cpu = 2, min = 1 }, { "w", "width", default = 4 } }, {})
  T.eq(opt.n, tf.default_device() == "cpu" and 2 or 8)
  T.eq(opt.w, 4)
  opt = tf.options({ { "n", "count", default = 8, cpu = 2, min = 1 } }, { "--n", "5" })
  T.eq(opt.n, 5)
  at_caller(function() tf.options({ { "n", "count", default = 1, min = "1" } }, {}) end, "min must be a number")
end)

T.run()
