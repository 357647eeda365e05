-- tf.core (host/bind/open.c): every type is one class made once. Opening the
-- core again, as the REPL's Tab completion does (tf.help requires "tf.core"
-- after tf let go of it), gives the same classes and leaves them as they
-- were: methods Lua added and tf's own __tostring stay.
local T = require "harness"
local H = require "tf.help"

T.test("opening tf.core again keeps the classes as they are", function()
  local x = tf.zeros(2)
  local printed = tostring(x)
  local mt = getmetatable(x)
  tf.Tensor.test_core_open_twice = function(t) return t:sum():item() * 2 end
  local timer = tf.timer()
  local timer_mt = getmetatable(timer)
  local again = require "tf.core"
  T.ok(again ~= nil and again.Tensor == tf.Tensor, "the same tensor methods table")
  T.ok(getmetatable(x) == mt and getmetatable(tf.ones(1)) == mt, "one tensor metatable")
  T.eq(x:test_core_open_twice(), 0.0, "a method Lua added is still there")
  T.eq(tf.ones(3):test_core_open_twice(), 6.0)
  T.eq(tostring(x), printed, "tf's __tostring is still there")
  T.ok(getmetatable(tf.timer()) == timer_mt, "one tf.Timer metatable")
  T.eq(timer_mt.__name, "tf.Timer")
  T.ok(type(timer_mt.__index.ms) == "function", "its methods in __index")
  tf.Tensor.test_core_open_twice = nil
end)

T.test("Tab completion after the core opened again", function()
  local x = tf.zeros(2) -- luacheck: ignore (completion looks the name up)
  _G.test_core_open_x = x
  T.eq(H.complete("test_core_open_x:su"), { "test_core_open_x:sub", "test_core_open_x:sum" })
  T.eq(H.complete("test_core_open_x:su"), { "test_core_open_x:sub", "test_core_open_x:sum" }, "twice")
  _G.test_core_open_x = nil
end)

T.test("the profiler's Lua methods stay after the core opened again", function()
  local p <close> = tf.prof.start()
  T.ok(type(p.kernels) == "function", "lua/tf/prof.lua's p:kernels")
  local again = require "tf.core"
  T.ok(again._prof ~= nil)
  T.ok(type(p.kernels) == "function", "p:kernels after the core opened again")
  p:stop()
  local q <close> = tf.prof.start()
  T.ok(type(q.kernels) == "function" and type(q.stop) == "function", "a new profile has both halves")
  T.eq(getmetatable(q).__name, "tf.Profile")
end)

T.run()
