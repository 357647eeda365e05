-- An error's position is the user's line, not a line of tfhost's own Lua
-- modules (lua/tf/*.lua) that the call went through; those frames stay in
-- the traceback.
local T = require "harness"

local here = debug.getinfo(1, "S").short_src

-- The message of fn's error, and the line fn was defined on.
local function failure(fn)
  local ok, err = pcall(fn)
  T.ok(not ok, "expected an error")
  return tostring(err), debug.getinfo(fn, "S").linedefined
end

local function at_line(err, line, what)
  T.ok(err:sub(1, #here + 1) == here .. ":", what .. ": the position is not this file's: " .. err)
  T.eq(tonumber(err:match("^[^:]+:(%d+):")), line, what .. ": " .. err)
  T.ok(not err:find("lua/tf/", 1, true), what .. ": a module's position leaks: " .. err)
end

T.test("errors raised in C through a module point at the caller's line", function()
  local a, b = tf.ones(2, 3), tf.ones(2, 3)
  local err, line = failure(function() tf.range("x", tf.matmul, a, b) end)
  at_line(err, line, "tf.range around tf.matmul")
  T.ok(err:find("tf.matmul: shapes (2, 3) and (2, 3) do not fit", 1, true), err)
end)

T.test("errors raised by a module's own checks point at the caller's line", function()
  local m = tf.model.new{ preset = "tiny", context_length = 8, device = "cpu" }
  local err, line = failure(function() m:forward(tf.tensor({ { 1, 99999 } }, { device = "cpu" })) end)
  at_line(err, line, "model:forward with a bad token id")
  T.ok(err:find("token id 99999", 1, true), err)
  err, line = failure(function() tf.model.new{ preset = "huge" } end)
  at_line(err, line, "tf.model.new with an unknown preset")
  err, line = failure(function() tf.report.table(42) end)
  at_line(err, line, "tf.report.table with a number")
end)

T.test("the user's own errors keep their position and levels", function()
  local err, line = failure(function() error("mine") end)
  at_line(err, line, "error()")
  local function check(x) if not x then error("bad x", 2) end end
  err, line = failure(function() check(false) end)
  at_line(err, line, "error(msg, 2)")
  local ok, tab = pcall(error, { code = 7 })
  T.ok(not ok and type(tab) == "table" and tab.code == 7, "a table error is passed through as it is")
end)

T.test("tfhost's frames stay in the traceback", function()
  local a, b = tf.ones(2, 3), tf.ones(2, 3)
  local ok, trace = xpcall(function() tf.range("x", tf.matmul, a, b) end, debug.traceback)
  T.ok(not ok)
  T.ok(trace:find("lua/tf/prof.lua", 1, true), "the module's frame is in the traceback:\n" .. trace)
end)

T.run()
