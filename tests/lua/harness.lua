--- A small test harness for tfhost's Lua tests.
--
--   local T = require "harness"
--   T.test("adds", function() T.eq((tf.ones(2) + 1):tolist(), {2, 2}) end)
--   T.run()
--
-- Every test must make at least one assertion; a test that asserts nothing
-- fails. T.run() exits 1 if any test failed, 0 otherwise; T.skip(why)
-- exits 77 (ctest's "skipped") after printing why.
local T = {}
local tests, assertions = {}, 0

function T.test(name, fn)
  tests[#tests + 1] = { name = name, fn = fn }
end

local function fail(msg, level)
  error(msg, (level or 1) + 2)
end

local function show(v)
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do
      if i > 8 then parts[#parts + 1] = "..." break end
      parts[#parts + 1] = show(x)
    end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  if type(v) == "string" then return string.format("%q", v) end
  return tostring(v)
end

local function deep_eq(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then
    if type(a) == "number" and a ~= a and b ~= b then return true end
    return a == b and math.type(a) == math.type(b)
  end
  for k, v in pairs(a) do if not deep_eq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

--- Deep equality (numbers must also agree in integer/float subtype).
function T.eq(actual, expected, msg)
  assertions = assertions + 1
  if not deep_eq(actual, expected) then
    fail((msg and msg .. ": " or "") .. "expected " .. show(expected) .. ", got " .. show(actual))
  end
end

function T.ok(v, msg)
  assertions = assertions + 1
  if not v then fail(msg or "expected a true value") end
end

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for _, x in ipairs(v) do flatten(x, out) end
  else
    out[#out + 1] = v
  end
  return out
end

--- |actual - expected| <= atol + rtol * |expected| elementwise; actual and
-- expected are numbers, nested tables or tensors (copied to the CPU).
function T.near(actual, expected, rtol, atol, msg)
  assertions = assertions + 1
  rtol, atol = rtol or 1e-6, atol or 0
  if tf.is_tensor(actual) then actual = actual:to("cpu"):tolist() end
  if tf.is_tensor(expected) then expected = expected:to("cpu"):tolist() end
  local a, e = flatten(actual), flatten(expected)
  if #a ~= #e then fail((msg or "near") .. ": " .. #a .. " values vs " .. #e) end
  for i = 1, #a do
    local x, y = a[i], e[i]
    local bad
    if y ~= y then
      bad = x == x
    elseif y == math.huge or y == -math.huge then
      bad = x ~= y
    else
      bad = not (math.abs(x - y) <= atol + rtol * math.abs(y))
    end
    if bad then
      fail(string.format("%s: element %d: got %.9g, expected %.9g (rtol %g, atol %g)", msg or "near", i, x, y, rtol, atol))
    end
  end
end

--- Relative error ||a - b|| / ||b|| of two tensors, computed in f64 on the CPU.
function T.relerr(a, b)
  local x, y = a:to("cpu"):to("f64"), b:to("cpu"):to("f64")
  local num = ((x - y) * (x - y)):sum():item()
  local den = (y * y):sum():item()
  return math.sqrt(num) / math.max(math.sqrt(den), 1e-300)
end

--- fn must raise an error whose message contains `pattern` (plain text).
function T.raises(fn, pattern, msg)
  assertions = assertions + 1
  local ok, err = pcall(fn)
  if ok then fail((msg or "expected an error") .. " matching '" .. pattern .. "', but the call succeeded") end
  err = tostring(err)
  if not err:find(pattern, 1, true) then
    fail((msg or "wrong error") .. ": expected '" .. pattern .. "' in: " .. err)
  end
  return err
end

--- Checks the gradients autograd gives for fn(inputs...) against central
-- finite differences in f64 (tf.autograd.gradcheck): every floating input
-- tensor is checked, others (integer targets, numbers) pass through;
-- |autograd - finite| <= tol * (1 + |finite|).
function T.gradcheck(fn, inputs, opts)
  opts = opts or {}
  assertions = assertions + 1
  local tol = opts.tol or 1e-6
  local ok, err = tf.autograd.gradcheck(fn, inputs, { eps = opts.eps, atol = tol, rtol = tol, name = opts.name,
    raise = false })
  if not ok then fail(err) end
end

--- The whole content of a file (binary).
function T.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function T.skip(why)
  print("SKIP: " .. why)
  tf.exit(77)
end

function T.require_cuda()
  if not tf.cuda.is_available() then
    T.skip(tf.cuda.compiled() and "no GPU is present" or "this tfhost was built without CUDA")
  end
end

--- A seed that differs run to run (fresh inputs), printed so a failure can be replayed.
function T.fresh_seed()
  local seed = tonumber(os.getenv("TF_TEST_SEED")) or (os.time() % 100000)
  print("seed " .. seed .. " (set TF_TEST_SEED to replay)")
  return math.tointeger(seed)
end

--- Skips the running test (not counted as passed), saying why: for a
-- test that needs what this machine lacks, in a file whose other tests run.
local skip_marker = {}
function T.skip_test(why)
  error({ [skip_marker] = tostring(why) }, 0)
end

function T.run()
  local failed, skipped = 0, 0
  for _, t in ipairs(tests) do
    local before = assertions
    local ok, err = xpcall(t.fn, function(e)
      if type(e) == "table" and e[skip_marker] then return e end
      return debug.traceback(e, 2)
    end)
    if not ok and type(err) == "table" and err[skip_marker] then
      skipped = skipped + 1
      print("skip " .. t.name .. ": " .. err[skip_marker])
    else
      if ok and assertions == before then ok, err = false, "the test made no assertion" end
      if ok then
        print("ok   " .. t.name)
      else
        failed = failed + 1
        print("FAIL " .. t.name .. "\n" .. tostring(err))
      end
    end
  end
  print(string.format("%d tests, %d failed, %d skipped, %d assertions", #tests, failed, skipped, assertions))
  tf.exit(failed > 0 and 1 or 0)
end

return T
