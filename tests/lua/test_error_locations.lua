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

T.test("out of memory names the caller's line, then the words scripts test", function()
  local MiB = 1 << 20
  collectgarbage()
  tf.mem.empty_cache("cpu")
  tf.mem.set_limit(tf.mem.stats("cpu").reserved + 16 * MiB, "cpu")
  local err, line = failure(function() return tf.zeros(64 * MiB, { device = "cpu" }) end)
  tf.mem.set_limit(nil, "cpu")
  at_line(err, line, "tf.zeros past the limit")
  T.ok(err:find("^[^:]+:%d+: out of memory: "), "'out of memory' comes right after the position: " .. err)
  T.ok(err:find("(in tf.zeros)", 1, true), "the function is named: " .. err)
  T.ok(tf.mem.is_oom(err), "tf.mem.is_oom knows it")
  T.ok(tf.mem.is_oom("out of memory: a message without a position"), "and one without a position")
  T.ok(not tf.mem.is_oom("x.lua:3: tf.model.new: cannot say out of memory here"), "the words elsewhere do not count")
  T.ok(not tf.mem.is_oom(nil) and not tf.mem.is_oom({}), "nor do values that are not messages")
end)

-- Every function of the API (tfhost's own modules; the ones that change the
-- process or write files left out) is called with arguments it refuses:
-- each error must name this file's line, never a line of lua/tf/.
T.test("no refused call reports a position inside tfhost's modules", function()
  local skip = { exit = true, options = true, set_device = true, seed = true, allow_tf32 = true, help = true,
    safe_run = true, mkdir = true, threads = true, range = true, sha256_file = true, write = true, dump = true,
    plot = true, save = true, set_limit = true, record = true, traffic = true }
  local function argsets()
    local a = tf.ones({ 2, 3 })
    return { { a, tf.ones({ 4 }) }, { 42 }, { a, "junk" }, { a, 99 }, { {} }, { a, { bogus = 1 } }, { true }, {} }
  end
  local fns = {}
  local function add(prefix, t)
    for name, f in pairs(t) do
      if type(name) == "string" and type(f) == "function" and not skip[name] and not name:match("^_") then
        fns[#fns + 1] = { prefix .. name, f }
      end
    end
  end
  add("tf.", tf)
  for _, m in ipairs({ "mem", "json", "model", "optim", "amp", "safetensors" }) do add("tf." .. m .. ".", tf[m]) end
  add("tf.bench.", tf.bench)
  fns[#fns + 1] = { "tf.bench", function(...) return tf.bench(...) end }
  add("tf.nn.init.", tf.nn.init)
  for _, name in ipairs({ "Linear", "LayerNorm", "RMSNorm", "Embedding", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid",
    "Sequential" }) do
    fns[#fns + 1] = { "tf.nn." .. name, tf.nn[name] }
  end
  local lin, emb = tf.nn.Linear(3, 2), tf.nn.Embedding(4, 2)
  fns[#fns + 1] = { "Linear:forward", function(...) return lin(...) end }
  fns[#fns + 1] = { "Embedding:forward", function(...) return emb(...) end }
  fns[#fns + 1] = { "GELU:forward", function(...) return tf.nn.GELU()(...) end }
  table.sort(fns, function(x, y) return x[1] < y[1] end)
  local refused, wrong = 0, {}
  for _, entry in ipairs(fns) do
    local name, f = entry[1], entry[2]
    for _, args in ipairs(argsets()) do
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, err = pcall(function() return f(table.unpack(args)) end)
      if not ok and type(err) == "string" then
        refused = refused + 1
        if err:sub(1, #here + 1) ~= here .. ":" or tonumber(err:match("^[^:]+:(%d+):")) ~= line
            or err:find("lua/tf/", 1, true) then
          wrong[#wrong + 1] = name .. ": " .. err:match("^[^\n]*")
        end
      end
    end
  end
  print(string.format("%d functions, %d refused calls checked", #fns, refused))
  T.eq(#wrong, 0, "errors not at the caller's line:\n" .. table.concat(wrong, "\n") .. "\n")
  T.ok(refused > 150, "enough calls were refused to say something")
end)

T.test("tfhost's frames stay in the traceback", function()
  local a, b = tf.ones(2, 3), tf.ones(2, 3)
  local ok, trace = xpcall(function() tf.range("x", tf.matmul, a, b) end, debug.traceback)
  T.ok(not ok)
  T.ok(trace:find("lua/tf/prof.lua", 1, true), "the module's frame is in the traceback:\n" .. trace)
end)

T.run()
